// A caller's workspace may start at any address: each backend begins its scratch at the buffer's
// first boundary of the alignment its kernels need, and the sizes it reports include the bytes
// that can cost.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tileattn {

// Bytes from p to its next multiple of align (a power of two).
inline std::size_t align_skip(const void* p, std::size_t align) {
  return -reinterpret_cast<std::uintptr_t>(p) & (align - 1);
}

// A workspace size that leaves room for aligning any buffer: 0 stays 0.
inline std::size_t with_align_slack(std::size_t bytes, std::size_t align) {
  return bytes == 0 ? 0 : bytes + align - 1;
}

}  // namespace tileattn
