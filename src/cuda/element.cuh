// The element types of each 16-bit dtype the CUDA kernels take: CUTLASS's (the CuTe kernels) and
// CUDA's own (the decode kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cutlass/numeric_types.h>

#include "tileattn/tensor.hpp"

namespace tileattn::cuda {

template <DType> struct ElementOf;
template <> struct ElementOf<DType::f16> { using type = cutlass::half_t; using native = __half; };
template <> struct ElementOf<DType::bf16> { using type = cutlass::bfloat16_t; using native = __nv_bfloat16; };

}  // namespace tileattn::cuda
