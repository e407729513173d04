// The Hopper forward kernel's epilogue: one consumer warpgroup writes its 64 rows of O and their
// LSE, through shared memory (16-byte global stores) where O has a buffer of its own, else straight
// from the accumulators. Each warpgroup works alone, synchronized only with itself, so the other
// one's mainloop runs on meanwhile.
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/cute_utils.cuh"
#include "cuda/fwd_params.hpp"
#include "cuda/fwd_sm90_mainloop.cuh"
#include "cuda/fwd_tile.cuh"

namespace tileattn::cuda {

using namespace cute;

// Where this warpgroup's rows of the tile start in o and lse.
template <class T>
__device__ __forceinline__ typename T::Element* out_rows(const FwdParams& p, const FwdTile& g, int row0) {
  return static_cast<typename T::Element*>(p.o) + g.b * p.o_batch + g.h * p.o_head +
         std::int64_t(g.q_start + g.m0 + row0) * p.o_row;
}
__device__ __forceinline__ float* lse_rows(const FwdParams& p, const FwdTile& g, int row0) {
  return p.lse + g.b * p.lse_batch + g.h * p.lse_head + std::int64_t(g.q_start + g.m0 + row0) * p.lse_row;
}

// acc_o: normalized O of the consumer thread tc; lse: its rows' LSE. sO: the tile's O buffer.
template <class T, int kRows, class AccO, class SO>
__device__ __forceinline__ void fwd_sm90_store(const FwdParams& p, const FwdTile& g, const AccO& acc_o,
                                               const float (&lse)[kRows], SO& sO, int tc) {
  using Element = typename T::Element;
  constexpr int kHeadDim = T::kHeadDimV;  // O's columns
  const int wg = tc / 128, tw = tc % 128, row0 = 64 * wg;
  typename T::MmaO mma_o;
  Tensor cO = mma_o.get_thread_slice(tc).partition_C(make_identity_tensor(Shape<Int<T::kBlockM>, Int<kHeadDim>>{}));
  Tensor cO_rc = make_tensor(cO.data(), rowcol(cO.layout()));
  if (p.lse != nullptr && get<1>(cO_rc(0, 0)) == 0) {
    float* out = lse_rows(p, g, 0);
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const int r = get<0>(cO_rc(i, 0));
      if (r < g.rows) out[std::int64_t(r) * p.lse_row] = lse[i];
    }
  }

  Tensor rO = convert<Element>(acc_o);
  if constexpr (!T::kOwnO) {
    // Each thread holds column pairs: one 4-byte store each.
    Tensor gO = make_tensor(make_gmem_ptr(out_rows<T>(p, g, 0)), Shape<Int<T::kBlockM>, Int<kHeadDim>>{},
                            make_stride(p.o_row, _1{}));
    Tensor tOg = mma_o.get_thread_slice(tc).partition_C(gO);
    Tensor gO_rc = make_tensor(tOg.data(), rowcol(tOg.layout()));
    Tensor rO_rc = make_tensor(rO.data(), rowcol(rO.layout()));
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      if (get<0>(cO_rc(i, 0)) >= g.rows) continue;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(rO_rc); j += 2)
        if (get<1>(cO_rc(i, j)) < p.d_v)
          *reinterpret_cast<cutlass::Array<Element, 2>*>(&gO_rc(i, j)) =
              *reinterpret_cast<const cutlass::Array<Element, 2>*>(&rO_rc(i, j));
    }
    return;
  }
  auto st = make_tiled_copy_C(typename T::StoreOAtom{}, mma_o);
  auto st_thr = st.get_thread_slice(tc);
  cutlass::arch::NamedBarrier::sync(128, kBarrierWarpGroup + wg);  // this warpgroup's last reads of sO are done
  copy(st, st_thr.retile_S(rO), st_thr.partition_D(sO));
  cutlass::arch::NamedBarrier::sync(128, kBarrierWarpGroup + wg);

  using Rows = Shape<_64, Int<kHeadDim>>;
  Tensor sOw = local_tile(sO, Rows{}, make_coord(wg, _0{}));
  Tensor gO = make_tensor(make_gmem_ptr(out_rows<T>(p, g, row0)), Rows{}, make_stride(p.o_row, _1{}));
  typename T::GmemStore gstore;
  auto gs = gstore.get_thread_slice(tw);
  copy_tile<true, true, false>(gstore, gs.partition_S(sOw), gs.partition_D(gO), gs.partition_S(make_identity_tensor(Rows{})),
                               g.rows - row0, p.d_v);
}

// A tile none of whose rows sees a key: O = 0 and LSE = -inf, written straight from registers.
template <class T>
__device__ __forceinline__ void fwd_sm90_store_empty(const FwdParams& p, const FwdTile& g, int tc) {
  const int wg = tc / 128, tw = tc % 128, row0 = 64 * wg;
  const int rows = min(64, g.rows - row0), chunks = p.d_v / 8;
  typename T::Element* o = out_rows<T>(p, g, row0);
  for (int i = tw; i < rows * chunks; i += 128)
    *reinterpret_cast<uint128_t*>(o + (i / chunks) * p.o_row + (i % chunks) * 8) = uint128_t{0, 0};
  if (p.lse != nullptr) {
    float* out = lse_rows(p, g, row0);
    for (int r = tw; r < rows; r += 128) out[std::int64_t(r) * p.lse_row] = -INFINITY;
  }
}

}  // namespace tileattn::cuda
