// The decode kernels of one (dtype, head dim) and the choice between them; included by the
// generated instance units only (decode_instance.cu.in).
#pragma once

#include <algorithm>

#include "cuda/decode/decode_kernel.hpp"
#include "cuda/decode/gqa_mma_kernel.cuh"
#include "cuda/decode/split_kv_kernel.cuh"
#include "cuda/element.cuh"
#include "cuda/runtime.hpp"

namespace tileattn::cuda::decoding {

// Once per kernel and process: its occupancy (the same on every device of one architecture).
inline Kernel configure(Kernel k) {
  raise_smem_limit(reinterpret_cast<const void*>(k.fn), static_cast<int>(k.smem),
                   "cudaFuncSetAttribute (decode shared memory)");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k.per_sm, k.fn, k.threads, k.smem), "decode occupancy");
  k.per_sm = std::max(k.per_sm, 1);
  return k;
}

// CUDA cores, all rows in every lane: head dims past 128, whose tensor-core state would not fit
// in registers.
template <class T, int D, int ROWS>
Kernel split_kv() {
  constexpr int kWarps = 4;
  static const Kernel k = configure({&split_kv_kernel<T, D, ROWS, kWarps>, kWarps * 32,
                                     SplitKvShape<D, ROWS, kWarps>::kSmemBytes, ROWS});
  return k;
}

// Tensor cores: head dims up to 128, any number of query rows per KV head.
template <class T, int D, bool kPerKey>
Kernel gqa_mma() {
  constexpr int kWarps = 8;
  using Shape = GqaMmaShape<D, kWarps>;
  static const Kernel k =
      configure({&gqa_mma_kernel<T, D, kWarps, kPerKey>, kWarps * 32, Shape::kSmemBytes, Shape::kRows});
  return k;
}

template <DType kDtype, int D>
Kernel pick_kernel(int rows, bool per_key) {
  using T = typename ElementOf<kDtype>::native;
  if constexpr (D <= 128) {
    return per_key ? gqa_mma<T, D, true>() : gqa_mma<T, D, false>();
  } else {
    switch (rows) {
      case 1: return split_kv<T, D, 1>();
      case 2: return split_kv<T, D, 2>();
      case 3:
      case 4: return split_kv<T, D, 4>();
      default: return split_kv<T, D, 8>();
    }
  }
}

}  // namespace tileattn::cuda::decoding
