// DLPack arrays (NumPy, PyTorch, CuPy, JAX, ...) as tileattn::TensorView.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "tileattn/tensor.hpp"

namespace tileattn::python {

namespace nb = nanobind;

using Input = nb::ndarray<nb::ro>;  // read-only inputs: immutable JAX arrays pass too
using Output = nb::ndarray<>;       // written by the call

// fn and name label the error when the array has a dtype, device or rank no TensorView can hold;
// everything else (shapes, strides, dtype agreement) is left to the core's validation.
TensorView to_view(const char* fn, const char* name, const Input& a);
TensorView to_view(const char* fn, const char* name, const Output& a);
TensorView to_view(const char* fn, const char* name, const std::optional<Input>& a);
TensorView to_view(const char* fn, const char* name, const std::optional<Output>& a);

}  // namespace tileattn::python
