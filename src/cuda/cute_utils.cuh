// Small CuTe helpers shared by the attention kernels: the global-memory copy types, predicated tile
// copies, the two mma.sync tile products (shared x shared, register x shared) with the next
// k-slice's fragments loaded ahead, the wgmma product, and the views of an accumulator as
// (rows, cols) and as the A operand of the next product.
#pragma once

#include <type_traits>

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
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

// 16-byte global-memory copies of tiles whose swizzle chunk is kChunk elements wide: kChunk / 8
// threads to a chunk row, 8 elements each; loads by cp.async past L1, stores plain.
template <class Element, int kThreads, int kChunk>
struct GmemCopies {
  static constexpr int kThreadsPerRow = kChunk / 8;
  using Threads = Layout<Shape<Int<kThreads / kThreadsPerRow>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>;
  using Load = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, Threads{},
                                        Layout<Shape<_1, _8>>{}));
  using Store = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{}, Threads{},
                                         Layout<Shape<_1, _8>>{}));
};

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

// acc (+)= A * B on a warpgroup's tensor cores (wgmma), A from shared memory (descriptors) or from
// registers, B from shared memory. Issues the k-slices as one asynchronous batch and returns without
// waiting: the caller waits with warpgroup_wait<N>() before touching acc (or A's registers).
// kZero starts from zero instead of accumulating.
template <bool kZero, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_wg(Mma& mma, const TA& a, const TB& b, TC& acc) {
  constexpr bool kRegA = !std::is_same_v<std::decay_t<decltype(a.data())>, GMMA::DescriptorIterator>;
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = kZero ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<TA&>(a));
}

// An accumulator seen as (rows, cols). mma.sync 16x8: ((2 cols, 2 rows), MMA_M, MMA_N) ->
// ((2, MMA_M), (2, MMA_N)). wgmma 64xN: ((2 cols, 2 rows, N/8 col groups), MMA_M, MMA_N) ->
// ((2, MMA_M), (2, N/8, MMA_N)). Either way a row's values sit in the 4 lanes of a quad.
template <class L>
__device__ __forceinline__ constexpr auto rowcol(const L& acc) {
  if constexpr (decltype(rank<0>(acc))::value == 3) {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
  } else {
    auto l = logical_divide(acc, Shape<_2>{});
    return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
  }
}

// The same accumulator regrouped as the register A operand of the next product, whose k-slices are
// 16 wide. mma.sync: ((2,2,2), MMA_M, MMA_N / 2). wgmma: ((2,2,2), MMA_M, (N/16, MMA_N)).
template <class L>
__device__ __forceinline__ constexpr auto acc_as_a(const L& acc) {
  if constexpr (decltype(rank<0>(acc))::value == 3) {
    auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                       make_layout(get<2, 1>(l), get<2>(acc)));
  } else {
    auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
  }
}

// `from` converted into `to`, a register tensor of the same layout and another element type. The
// packed pairs the conversion makes land as whole 32-bit registers: where `to` must keep its
// registers (an operand of a product in flight), a copy of convert()'s result instead moved 16-bit
// elements one at a time, two integer ops each in the forward's softmax.
template <class FromEngine, class ToEngine, class Layout>
__device__ __forceinline__ void convert_into(const Tensor<FromEngine, Layout>& from, Tensor<ToEngine, Layout>& to) {
  using From = typename FromEngine::value_type;
  using To = typename ToEngine::value_type;
  constexpr int N = decltype(size(from))::value;
  cutlass::NumericArrayConverter<To, From, N> conv;
  *reinterpret_cast<cutlass::Array<To, N>*>(to.data()) = conv(*reinterpret_cast<const cutlass::Array<From, N>*>(from.data()));
}

// A register tensor of another element type with the same layout.
template <class To, class Engine, class Layout>
__device__ __forceinline__ auto convert(const Tensor<Engine, Layout>& t) {
  Tensor out = make_tensor<To>(t.layout());
  convert_into(t, out);
  return out;
}

}  // namespace tileattn::cuda
