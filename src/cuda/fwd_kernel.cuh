// The portable forward kernel (sm_80 and newer): one thread block per (query tile, sequence, head).
// Q stays in shared memory; K and V tiles stream through with cp.async, V's load overlapping
// S = Q K^T and the next K's load overlapping the softmax and O += P V. Each warp owns 16-row
// slices of the query tile, so the softmax needs no inter-warp reduction, and P goes from the
// S accumulators straight into the A operand registers of the P V product.
// Key tiles are visited from the last to the first; tiles the variant or the block mask leaves out
// are skipped and only tiles the mask cuts pay for masking (key_tiles.cuh).
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/variant.hpp"
#include "cuda/cute_utils.cuh"
#include "cuda/fwd_params.hpp"
#include "cuda/fwd_tile.cuh"
#include "cuda/key_tiles.cuh"
#include "cuda/online_softmax.cuh"
#include "cuda/score_tile.cuh"

namespace tileattn::cuda {

using namespace cute;

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  // Shared-memory rows are swizzled in 64- or 32-element (128 or 64 byte) chunks so that both the
  // 16-byte cp.async writes and the ldmatrix reads are free of bank conflicts.
  static constexpr int kChunk = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kChunk == 64 ? 3 : 2;

  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, SM80_16x8x16_F32F16F16F32_TN,
                                   SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma = TiledMMA<MMA_Atom<MmaOp>, Layout<Shape<Int<kWarps>, _1, _1>>, Tile<Int<16 * kWarps>, _16, _16>>;

  using SmemAtom = decltype(composition(Swizzle<kSwizzleBits, 3, 3>{},
                                        Layout<Shape<_8, Int<kChunk>>, Stride<Int<kChunk>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V read as V^T (the B operand of P V) through ldmatrix.trans.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtPlain = decltype(get_nonswizzle_portion(SmemLayoutVt{}));

  using LdsmAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using LdsmTransAtom = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using StoreOAtom = Copy_Atom<UniversalCopy<Element>, Element>;

  using GmemLoad = typename GmemCopies<Element, kThreads, kChunk>::Load;
  using GmemStore = typename GmemCopies<Element, kThreads, kChunk>::Store;

  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kHeadDim * int(sizeof(Element));
};

// kMods: the kernel with the variant's score transform (softcap, ALiBi) and dropout; without it
// scores stay raw and the softmax folds the scale into its exponent. kEvenK: both head dims equal
// the tile's, no column checks. kVariant: the kernel that takes chunks, document ids, prefixes and
// block masks (key_tiles.cuh).
template <class T, bool kMods, bool kEvenK, bool kVariant>
__global__ void __launch_bounds__(T::kThreads, 1) fwd_kernel(const __grid_constant__ FwdParams p) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim;
  extern __shared__ __align__(128) char smem[];

  // The longest causal tiles start first.
  FwdTile g = fwd_tile<kBlockM, kBlockN, kVariant>(p, int(gridDim.x) - 1 - int(blockIdx.x), blockIdx.y, blockIdx.z);
  if (!g.has_rows()) return;
  const int b = g.b, h = g.h, hk = g.hk, q_start = g.q_start, k_start = g.k_start, sq = g.sq, sk = g.sk;
  const int m_block = g.m_block, m0 = g.m0, rows = g.rows, n_min = g.n_min;
  const int tid = threadIdx.x;

  const Element* q = static_cast<const Element*>(p.q) + b * p.q_batch + std::int64_t(q_start) * p.q_row + h * p.q_head;
  const Element* k = static_cast<const Element*>(p.k) + b * p.k_batch + std::int64_t(k_start) * p.k_row + hk * p.k_head;
  const Element* v = static_cast<const Element*>(p.v) + b * p.v_batch + std::int64_t(k_start) * p.v_row + hk * p.v_head;
  Element* o = static_cast<Element*>(p.o) + b * p.o_batch + std::int64_t(q_start) * p.o_row + h * p.o_head;

  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  Tensor gQ = local_tile(make_tensor(make_gmem_ptr(q), make_shape(sq, Int<kHeadDim>{}), make_stride(p.q_row, _1{})),
                         TileQ{}, make_coord(m_block, 0));
  Tensor gO = local_tile(make_tensor(make_gmem_ptr(o), make_shape(sq, Int<kHeadDim>{}), make_stride(p.o_row, _1{})),
                         TileQ{}, make_coord(m_block, 0));
  Tensor gK = local_tile(make_tensor(make_gmem_ptr(k), make_shape(sk, Int<kHeadDim>{}), make_stride(p.k_row, _1{})),
                         TileKV{}, make_coord(_, 0));  // (N, D, n_blocks)
  Tensor gV = local_tile(make_tensor(make_gmem_ptr(v), make_shape(sk, Int<kHeadDim>{}), make_stride(p.v_row, _1{})),
                         TileKV{}, make_coord(_, 0));

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename T::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename T::SmemLayoutVt{});
  Tensor sVtPlain = make_tensor(sV.data(), typename T::SmemLayoutVtPlain{});

  typename T::GmemLoad gload;
  auto gl = gload.get_thread_slice(tid);
  Tensor tQg = gl.partition_S(gQ);
  Tensor tQs = gl.partition_D(sQ);
  Tensor tKg = gl.partition_S(gK);
  Tensor tKs = gl.partition_D(sK);
  Tensor tVg = gl.partition_S(gV);
  Tensor tVs = gl.partition_D(sV);
  Tensor tQc = gl.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKVc = gl.partition_S(make_identity_tensor(TileKV{}));

  typename T::TiledMma mma;
  auto tm = mma.get_thread_slice(tid);
  Tensor rQ = tm.partition_fragment_A(sQ);
  Tensor rK = tm.partition_fragment_B(sK);
  Tensor rVt = tm.partition_fragment_B(sVtPlain);
  Tensor acc_o = partition_fragment_C(mma, TileQ{});

  auto ldsm_q = make_tiled_copy_A(typename T::LdsmAtom{}, mma);
  auto ldsm_k = make_tiled_copy_B(typename T::LdsmAtom{}, mma);
  auto ldsm_v = make_tiled_copy_B(typename T::LdsmTransAtom{}, mma);
  Tensor sQ_ld = ldsm_q.get_thread_slice(tid).partition_S(sQ);
  Tensor sK_ld = ldsm_k.get_thread_slice(tid).partition_S(sK);
  Tensor sVt_ld = ldsm_v.get_thread_slice(tid).partition_S(sVt);

  // Accumulator coordinates within a tile, as (rows, cols) views.
  Tensor cS = tm.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cS_rc = make_tensor(cS.data(), rowcol(cS.layout()));
  Tensor cO = tm.partition_C(make_identity_tensor(TileQ{}));
  Tensor cO_rc = make_tensor(cO.data(), rowcol(cO.layout()));
  Tensor acc_o_rc = make_tensor(acc_o.data(), rowcol(acc_o.layout()));
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;

  auto store_tile = [&](float (&lse)[kRows]) {
    // O through shared memory (reusing Q's space) so the global stores are 16 bytes wide.
    Tensor rO = convert<Element>(acc_o);
    Tensor sO = make_tensor(sQ.data(), typename T::SmemLayoutQ{});
    auto st = make_tiled_copy_C(typename T::StoreOAtom{}, mma);
    auto st_thr = st.get_thread_slice(tid);
    __syncthreads();  // every warp is done reading Q
    copy(st, st_thr.retile_S(rO), st_thr.partition_D(sO));
    if (p.lse != nullptr && get<1>(cO_rc(0, 0)) == 0) {
      float* lse_out = p.lse + b * p.lse_batch + h * p.lse_head + std::int64_t(q_start) * p.lse_row;
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        const int r = get<0>(cO_rc(i, 0));
        if (r < rows) lse_out[std::int64_t(m0 + r) * p.lse_row] = lse[i];
      }
    }
    __syncthreads();
    typename T::GmemStore gstore;
    auto gs = gstore.get_thread_slice(tid);
    copy_tile<true, true, false>(gstore, gs.partition_S(sO), gs.partition_D(gO), gs.partition_S(make_identity_tensor(TileQ{})),
                     rows, p.d_v);
  };

  OnlineSoftmax<kRows> softmax;
  clear(acc_o);
  const Visit top = g.next<kBlockN, kVariant>(p, g.n_max);
  if (top.n < n_min) {  // no row of this tile sees a key
    float lse[kRows];
    softmax.finish(acc_o_rc, 1.f, 1.f, lse);
    store_tile(lse);
    return;
  }

  copy_tile<true, !kEvenK, true>(gload, tQg, tQs, tQc, rows, p.d_qk);
  copy_tile<true, !kEvenK, true>(gload, tKg(_, _, _, top.n), tKs, tKVc, sk - top.n * kBlockN, p.d_qk);
  cp_async_fence();

  const float scale_log2 = kMods ? 1.f : p.scale_log2;
  if constexpr (kMods) {
    if (p.alibi != nullptr) g.var.score.alibi = p.alibi[b * p.alibi_batch + h * p.alibi_head];
  }
  const Variant& var = g.var;
  const unsigned bh = unsigned(b * p.heads_q + h);

  // One key tile. kMasked: the mask cuts the tile (or it is the last, partial one), so scores are
  // masked and V's rows are checked; whole tiles run a body without either. K[next] lies below
  // K[n], so all its rows exist.
  auto key_tile = [&](auto masked, int n, int next, TileMask mode) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(masked)::value;
    const int col0 = n * kBlockN;
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    cp_async_wait<0>();
    __syncthreads();  // K[n] has landed; every warp is done with V[n + 1]
    copy_tile<kMasked, !kEvenK, true>(gload, tVg(_, _, _, n), tVs, tKVc, sk - col0, p.d_v);
    cp_async_fence();

    gemm_ss(acc_s, rQ, rK, sQ_ld, sK_ld, mma, ldsm_q, ldsm_k, tid);

    Tensor s = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
    if constexpr (kMods) apply_score_mod(s, cS_rc, var, m0, col0);

    cp_async_wait<0>();
    __syncthreads();  // V[n] has landed; every warp is done with K[n]
    if (next >= n_min) {
      copy_tile<false, !kEvenK, true>(gload, tKg(_, _, _, next), tKs, tKVc, 0, p.d_qk);
      cp_async_fence();
    }

    // Masked after the barrier: ahead of it the compiler hoists the compares above the product and
    // packs the predicates into bit masks.
    if constexpr (kMasked) {
      if (!kVariant || mode == TileMask::rules)
        apply_mask(s, cS_rc, var, m0, col0);
      else
        apply_key_limit(s, cS_rc, sk - col0);
    }
    softmax.update(s, acc_o_rc, scale_log2);
    if constexpr (kMods) {
      if (p.dropout) apply_dropout(s, cS_rc, var.drop, bh, m0, col0);
    }

    Tensor rP = convert<Element>(acc_s);
    Tensor rP_a = make_tensor(rP.data(), acc_as_a(rP.layout()));
    gemm_rs(acc_o, rP_a, rVt, sVt_ld, mma, ldsm_v, tid);
  };

  // Key tiles from the last visited to the first; only tiles the mask cuts pay for masking. The
  // modifiers' kernel keeps one body (masking every tile): two spilled twice as much there.
  for (Visit t = top; t.n >= n_min;) {
    const Visit next = g.next<kBlockN, kVariant>(p, t.n);
    if (!kMods && t.mode == TileMask::none)
      key_tile(false_type{}, t.n, next.n, t.mode);
    else
      key_tile(true_type{}, t.n, next.n, t.mode);
    t = next;
  }

  float lse[kRows];
  softmax.finish(acc_o_rc, scale_log2, kMods && var.dropout ? var.drop.keep_scale : 1.f, lse);
  store_tile(lse);
}

}  // namespace tileattn::cuda
