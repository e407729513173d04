// The CPU backend's one way to run work on several threads.
#pragma once

#include <cstdint>
#include <functional>

namespace tileattn::cpu {

// Calls body(begin, end) on disjoint chunks covering [0, n), on the library's persistent pool or
// the caller's (tileattn::set_parallel_for). Returns when all chunks are done; rethrows the first
// exception a chunk threw. Chunks are handed out dynamically, so uneven items (causal
// rows) balance; per-thread scratch belongs in thread_local storage.
void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body);

}  // namespace tileattn::cpu
