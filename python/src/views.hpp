// DLPack arrays (NumPy, PyTorch, CuPy, JAX, ...) as tileattn::TensorView.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "tileattn/tensor.hpp"

namespace tileattn::python {

namespace nb = nanobind;

// An array argument as a DLTensor. A type that publishes DLPack's C exchange API
// (`__dlpack_c_exchange_api__`, torch.Tensor from PyTorch 2.11) is read through it, with no
// __dlpack__() call and no capsule: several microseconds per array, which a decode call pays seven
// times. Anything else goes through nanobind's DLPack import, whose reference (keep) holds the
// capsule for the call. Either way the DLTensor is valid only while the call's arguments live.
template <class ND>
struct Array {
  nb::dlpack::dltensor t;
  ND keep;
};
using Input = Array<nb::ndarray<nb::ro>>;  // read-only inputs: immutable JAX arrays pass too
using Output = Array<nb::ndarray<>>;       // written by the call

// A KV cache: written only when a call appends to it, so a read-only array passes and says so.
struct Cache : Output {
  bool read_only = false;
};

// obj read through its type's exchange API into t; false (no error set) where the type has none
// or the producer declines, and the caller falls back to the DLPack import.
bool read_by_exchange_api(PyObject* obj, nb::dlpack::dltensor& t);

std::size_t nbytes(const nb::dlpack::dltensor& t);

// fn and name label the error when the array has a dtype, device or rank no TensorView can hold;
// everything else (shapes, strides, dtype agreement) is left to the core's validation.
TensorView to_view(const char* fn, const char* name, const Input& a);
TensorView to_view(const char* fn, const char* name, const Output& a);
TensorView to_view(const char* fn, const char* name, const std::optional<Input>& a);
TensorView to_view(const char* fn, const char* name, const std::optional<Output>& a);
TensorView to_view(const char* fn, const char* name, const Cache& a);

}  // namespace tileattn::python

namespace nanobind::detail {

template <class ND>
struct type_caster<tileattn::python::Array<ND>> {
  NB_TYPE_CASTER(tileattn::python::Array<ND>, make_caster<ND>::Name)

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    if (tileattn::python::read_by_exchange_api(src.ptr(), value.t)) return true;
    make_caster<ND> import;
    if (!import.from_python(src, flags, cleanup)) return false;
    value.keep = std::move(import.value);
    const ND& a = value.keep;
    value.t.data = const_cast<void*>(static_cast<const void*>(a.data()));  // byte offset included
    value.t.device = {static_cast<int32_t>(a.device_type()), static_cast<int32_t>(a.device_id())};
    value.t.ndim = static_cast<int32_t>(a.ndim());
    value.t.dtype = a.dtype();
    value.t.shape = const_cast<int64_t*>(a.shape_ptr());
    value.t.strides = const_cast<int64_t*>(a.stride_ptr());
    value.t.byte_offset = 0;
    return true;
  }

  // Arrays are only ever arguments.
  static handle from_cpp(const tileattn::python::Array<ND>&, rv_policy, cleanup_list*) noexcept { return handle(); }
};

template <>
struct type_caster<tileattn::python::Cache> {
  NB_TYPE_CASTER(tileattn::python::Cache, make_caster<tileattn::python::Output>::Name)

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    make_caster<tileattn::python::Output> writable;
    if (writable.from_python(src, flags, cleanup)) {
      static_cast<tileattn::python::Output&>(value) = std::move(writable.value);
      value.read_only = false;
      return true;
    }
    make_caster<tileattn::python::Input> readable;
    if (!readable.from_python(src, flags, cleanup)) return false;
    value.t = readable.value.t;
    value.keep = nanobind::ndarray<>(readable.value.keep);  // the same capsule, held for the call
    value.read_only = true;
    return true;
  }

  static handle from_cpp(const tileattn::python::Cache&, rv_policy, cleanup_list*) noexcept { return handle(); }
};

}  // namespace nanobind::detail
