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
    const bool byte = t.code == static_cast<std::uint8_t>(dl::dtype_code::Bool) ||
                      t.code == static_cast<std::uint8_t>(dl::dtype_code::UInt);
    if (byte && t.bits == 8) return DType::u8;  // masks: bool or uint8
  }
  throw Error(std::string("tileattn::") + fn + ": " + name + " has dtype " + dlpack_dtype_name(t) +
              ", tileattn takes f32, f16, bf16 (and i32 for index tensors, bool or uint8 for masks)");
}

Device to_device(const char* fn, const char* name, int type, int id) {
  // Pinned host memory is host memory; managed memory is read by the kernels of its GPU.
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return {DeviceType::cpu, 0};
  if (type == nb::device::cuda::value || type == nb::device::cuda_managed::value)
    return {DeviceType::cuda, id};
  throw Error(std::string("tileattn::") + fn + ": " + name + " lives on DLPack device type " +
              std::to_string(type) + ", tileattn takes cpu and cuda arrays");
}

// DLPack's DLPackExchangeAPI (dlpack.h, version 1.x), as far as it is read here: a table of
// function pointers the producer keeps for the life of the process.
struct ExchangeApi {
  struct {
    std::uint32_t major, minor;
  } version;
  const void* prev_api;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);  // may be null
};

// The exchange API of a type, looked up once per type in a row (a call's arrays are mostly of one
// library); argument conversion runs under the GIL.
const ExchangeApi* exchange_api(PyTypeObject* type) {
  static PyTypeObject* last_type = nullptr;
  static const ExchangeApi* last_api = nullptr;
  if (type == last_type) return last_api;
  const ExchangeApi* api = nullptr;
  if (PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__")) {
    if (PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
      const auto* a = static_cast<const ExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
      if (a && a->version.major == 1 && a->dltensor_from_py_object_no_sync) api = a;
    }
    Py_DECREF(capsule);
  }
  PyErr_Clear();
  // The cache holds the type, so its address cannot be reused by another. (Casts: under the
  // limited API of a stable-ABI build these take PyObject* only.)
  Py_INCREF(reinterpret_cast<PyObject*>(type));
  Py_XDECREF(reinterpret_cast<PyObject*>(last_type));
  last_type = type;
  last_api = api;
  return api;
}

TensorView convert(const char* fn, const char* name, const nb::dlpack::dltensor& a) {
  const int ndim = a.ndim;
  if (ndim < 1 || ndim > kMaxDims)
    throw Error(std::string("tileattn::") + fn + ": " + name + " has " + std::to_string(ndim) +
                " dimensions, tileattn takes 1 to " + std::to_string(kMaxDims));
  TensorView t;
  t.data = static_cast<char*>(a.data) + a.byte_offset;
  t.dtype = to_dtype(fn, name, a.dtype);
  t.device = to_device(fn, name, a.device.device_type, a.device.device_id);
  t.ndim = ndim;
  // DLPack lets a producer leave strides out (NULL) for a compact row-major array, as CuPy does.
  const std::int64_t* strides = a.strides;
  bool empty = false;
  for (int d = 0; d < ndim; ++d) {
    t.shape[d] = a.shape[d];
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

bool read_by_exchange_api(PyObject* obj, nb::dlpack::dltensor& t) {
  const ExchangeApi* api = exchange_api(Py_TYPE(obj));
  if (!api) return false;
  if (api->dltensor_from_py_object_no_sync(obj, &t) == 0) return true;
  PyErr_Clear();  // e.g. a tensor DLPack cannot describe: the import reports it
  return false;
}

std::size_t nbytes(const nb::dlpack::dltensor& t) {
  std::size_t n = (t.dtype.bits * t.dtype.lanes + 7) / 8;
  for (int d = 0; d < t.ndim; ++d) n *= static_cast<std::size_t>(t.shape[d]);
  return n;
}

TensorView to_view(const char* fn, const char* name, const Input& a) { return convert(fn, name, a.t); }
TensorView to_view(const char* fn, const char* name, const Output& a) { return convert(fn, name, a.t); }

TensorView to_view(const char* fn, const char* name, const Cache& a) { return convert(fn, name, a.t); }

TensorView to_view(const char* fn, const char* name, const std::optional<Input>& a) {
  return a ? convert(fn, name, a->t) : TensorView{};
}
TensorView to_view(const char* fn, const char* name, const std::optional<Output>& a) {
  return a ? convert(fn, name, a->t) : TensorView{};
}

}  // namespace tileattn::python
