#include "views.hpp"

#include <string>

#include "tileattn/error.hpp"

namespace tileattn::python {
namespace {

namespace dl = nb::dlpack;

std::string dlpack_dtype_name(dl::dtype t) {
  const char* kind = "code";
  switch (static_cast<dl::dtype_code>(t.code)) {
    case dl::dtype_code::Int: kind = "int"; break;
    case dl::dtype_code::UInt: kind = "uint"; break;
    case dl::dtype_code::Float: kind = "float"; break;
    case dl::dtype_code::Bfloat: kind = "bfloat"; break;
    case dl::dtype_code::Complex: kind = "complex"; break;
    case dl::dtype_code::Bool: kind = "bool"; break;
    default: break;
  }
  std::string s = kind + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

DType to_dtype(const char* fn, const char* name, dl::dtype t) {
  if (t.lanes == 1) {
    if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Float) && t.bits == 32) return DType::f32;
    if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Float) && t.bits == 16) return DType::f16;
    if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Bfloat) && t.bits == 16) return DType::bf16;
    if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Int) && t.bits == 32) return DType::i32;
  }
  throw Error(std::string("tileattn::") + fn + ": " + name + " has dtype " + dlpack_dtype_name(t) +
              ", tileattn takes f32, f16, bf16 (and i32 for index tensors)");
}

Device to_device(const char* fn, const char* name, int type, int id) {
  // Pinned host memory is host memory; managed memory is read by the kernels of its GPU.
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return {DeviceType::cpu, 0};
  if (type == nb::device::cuda::value || type == nb::device::cuda_managed::value)
    return {DeviceType::cuda, id};
  throw Error(std::string("tileattn::") + fn + ": " + name + " lives on DLPack device type " +
              std::to_string(type) + ", tileattn takes cpu and cuda arrays");
}

template <class Array>
TensorView convert(const char* fn, const char* name, const Array& a) {
  const int ndim = static_cast<int>(a.ndim());
  if (ndim < 1 || ndim > kMaxDims)
    throw Error(std::string("tileattn::") + fn + ": " + name + " has " + std::to_string(ndim) +
                " dimensions, tileattn takes 1 to " + std::to_string(kMaxDims));
  TensorView t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(fn, name, a.dtype());
  t.device = to_device(fn, name, a.device_type(), a.device_id());
  t.ndim = ndim;
  // DLPack lets a producer leave strides out (NULL) for a compact row-major array, as CuPy does.
  const std::int64_t* strides = a.stride_ptr();
  bool empty = false;
  for (int d = 0; d < ndim; ++d) {
    t.shape[d] = static_cast<std::int64_t>(a.shape(d));
    t.stride[d] = strides ? strides[d] : 0;
    empty = empty || t.shape[d] == 0;
  }
  // An empty array addresses no element, so its strides mean nothing and producers differ (NumPy
  // exports zeros); give it row-major ones rather than have the core reject a strided last dim.
  if (empty || !strides) {
    std::int64_t s = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      t.stride[d] = s;
      s *= t.shape[d] > 0 ? t.shape[d] : 1;
    }
  }
  return t;
}

}  // namespace

TensorView to_view(const char* fn, const char* name, const Input& a) { return convert(fn, name, a); }
TensorView to_view(const char* fn, const char* name, const Output& a) { return convert(fn, name, a); }

TensorView to_view(const char* fn, const char* name, const std::optional<Input>& a) {
  return a ? convert(fn, name, *a) : TensorView{};
}
TensorView to_view(const char* fn, const char* name, const std::optional<Output>& a) {
  return a ? convert(fn, name, *a) : TensorView{};
}

}  // namespace tileattn::python
