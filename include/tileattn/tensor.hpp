// Strided tensor views: the only way tensors cross the public API.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

namespace tileattn {

// u8: one byte per element, for boolean masks (non-zero = true; PyTorch's bool and uint8 alike).
enum class DType : std::uint8_t { f32, f16, bf16, i32, u8 };
enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
};

inline constexpr int kMaxDims = 5;

// A non-owning view: data pointer, dtype, device, shape and strides in elements.
// A view with ndim == 0 is "absent" (used for optional arguments).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> stride{};

  bool present() const { return ndim > 0; }
  std::int64_t size(int d) const { return shape[d]; }
  std::int64_t numel() const {
    // Bounded by kMaxDims so that a view with a bad rank never reads past shape; validation
    // rejects such views (and element counts that overflow) before anything relies on this.
    std::int64_t n = ndim > 0 ? 1 : 0;
    for (int d = 0; d < ndim && d < kMaxDims; ++d) n *= shape[d];
    return n;
  }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);

// A contiguous (row-major) view.
TensorView view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                Device device = {});
// A view with explicit strides (in elements).
TensorView view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                std::initializer_list<std::int64_t> strides, Device device = {});

}  // namespace tileattn
