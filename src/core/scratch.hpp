// Host scratch memory a call allocates for itself, counted in tileattn::memory_stats() so tests can
// assert that the extra memory of a call is O(N).
#pragma once

#include <cstddef>

namespace tileattn {

class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(std::size_t bytes);  // 64-byte aligned, uninitialized
  ~Scratch();
  Scratch(Scratch&& o) noexcept;
  Scratch& operator=(Scratch&& o) noexcept;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace tileattn
