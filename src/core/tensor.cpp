#include "tileattn/tensor.hpp"

#include "tileattn/error.hpp"

namespace tileattn {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8: return 1;
    default: return 4;
  }
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

TensorView view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                std::initializer_list<std::int64_t> strides, Device device) {
  if (shape.size() == 0 || shape.size() > static_cast<std::size_t>(kMaxDims))
    throw Error("tileattn::view: rank " + std::to_string(shape.size()) + " is outside [1, 5]");
  if (strides.size() != shape.size())
    throw Error("tileattn::view: " + std::to_string(strides.size()) + " strides for " +
                std::to_string(shape.size()) + " dimensions");
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (auto s : shape) t.shape[d++] = s;
  d = 0;
  for (auto s : strides) t.stride[d++] = s;
  return t;
}

TensorView view(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
  if (shape.size() == 0 || shape.size() > static_cast<std::size_t>(kMaxDims))
    throw Error("tileattn::view: rank " + std::to_string(shape.size()) + " is outside [1, 5]");
  TensorView t = view(data, dtype, shape, shape, device);
  std::int64_t s = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = s;
    s *= t.shape[d];
  }
  return t;
}

}  // namespace tileattn
