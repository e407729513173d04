// Where a CUDA call's scratch starts in the caller's workspace, and the size it reports for it.
#pragma once

#include <cstddef>

#include "core/workspace.hpp"

namespace tileattn::cuda {

// A call's scratch starts on a 256-byte boundary, as cudaMalloc's do, wherever the caller's
// buffer does: the kernels access it in vectors and atomics, which fault on the device at
// addresses short of their alignment.
inline constexpr std::size_t kScratchAlign = 256;

// What workspace_size reports for a call whose scratch takes `bytes`: room to align any buffer.
inline std::size_t reported_bytes(std::size_t bytes) { return with_align_slack(bytes, kScratchAlign); }

}  // namespace tileattn::cuda
