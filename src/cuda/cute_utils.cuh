// Small CuTe helpers shared by the attention kernels: predicated tile copies, the two tile products
// (shared x shared, register x shared) with the next k-slice's fragments loaded ahead, and the
// views of an mma.sync accumulator as (rows, cols) and as the A operand of the next product.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace tileattn::cuda {

using namespace cute;

// Copies a (CPY, CPY_M, CPY_K) partition whose coordinates are `coord`. With kRows / kCols, rows
// at or past max_rows and columns at or past max_cols are skipped (tiles known to be whole skip the
// test); with kClear their destination is zeroed so that no stale shared memory (possibly NaN)
// reaches a tile product.
template <bool kRows, bool kCols, bool kClear, class TiledCopy, class TS, class TD, class TC>
__device__ __forceinline__ void copy_tile(const TiledCopy& tc, const TS& src, TD&& dst, const TC& coord,
                                          int max_rows, int max_cols) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (!kRows || get<0>(coord(0, m, 0)) < max_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        if (!kCols || get<1>(coord(0, m, k)) < max_cols) {
          copy(tc, src(_, m, k), dst(_, m, k));
        } else if constexpr (kClear) {
          clear(dst(_, m, k));
        }
      }
    } else if constexpr (kClear) {
      clear(dst(_, m, _));
    }
  }
}

// acc += A * B with both operands in shared memory (sA, sB: this thread's ldmatrix partitions);
// the k-slice k+1 is loaded while k multiplies.
template <class Acc, class RA, class RB, class SA, class SB, class Mma, class CA, class CB>
__device__ __forceinline__ void gemm_ss(Acc& acc, RA& rA, RB& rB, const SA& sA, const SB& sB, const Mma& mma,
                                        const CA& copy_a, const CB& copy_b, int tid) {
  auto rA_view = copy_a.get_thread_slice(tid).retile_D(rA);
  auto rB_view = copy_b.get_thread_slice(tid).retile_D(rB);
  copy(copy_a, sA(_, _, 0), rA_view(_, _, 0));
  copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) {
      copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A * B with A already in registers.
template <class Acc, class RA, class RB, class SB, class Mma, class CB>
__device__ __forceinline__ void gemm_rs(Acc& acc, const RA& rA, RB& rB, const SB& sB, const Mma& mma,
                                        const CB& copy_b, int tid) {
  auto rB_view = copy_b.get_thread_slice(tid).retile_D(rB);
  copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// An SM80 16x8 accumulator ((2 cols, 2 rows), MMA_M, MMA_N) seen as ((2, MMA_M) rows, (2, MMA_N) cols).
template <class L>
__device__ __forceinline__ constexpr auto rowcol(const L& acc) {
  auto l = logical_divide(acc, Shape<_2>{});
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// The same accumulator regrouped as the A operand of a 16x8x16 product: ((2,2,2), MMA_M, MMA_N / 2).
template <class L>
__device__ __forceinline__ constexpr auto acc_as_a(const L& acc) {
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// A register tensor of another element type with the same layout.
template <class To, class Engine, class Layout>
__device__ __forceinline__ auto convert(const Tensor<Engine, Layout>& t) {
  using From = typename Engine::value_type;
  constexpr int N = decltype(size(t))::value;
  Tensor out = make_tensor<To>(t.layout());
  cutlass::NumericArrayConverter<To, From, N> conv;
  *reinterpret_cast<cutlass::Array<To, N>*>(out.data()) =
      conv(*reinterpret_cast<const cutlass::Array<From, N>*>(t.data()));
  return out;
}

}  // namespace tileattn::cuda
