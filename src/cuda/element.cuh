// The CUTLASS element type of each 16-bit dtype the CUDA kernels take.
#pragma once

#include <cutlass/numeric_types.h>

#include "tileattn/tensor.hpp"

namespace tileattn::cuda {

template <DType> struct ElementOf;
template <> struct ElementOf<DType::f16> { using type = cutlass::half_t; };
template <> struct ElementOf<DType::bf16> { using type = cutlass::bfloat16_t; };

}  // namespace tileattn::cuda
