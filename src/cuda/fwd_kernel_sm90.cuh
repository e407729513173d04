// The Hopper forward kernel (sm_90a): the portable kernel's algorithm on warpgroup tensor cores.
// One thread block per (query tile, sequence, head); each warpgroup (128 threads) owns 64 query rows.
// S = Q K^T reads both operands straight from shared memory (wgmma descriptors, no ldmatrix), and
// O += P V takes P from the S accumulators in registers. The products are asynchronous, so each
// iteration issues S[n - 1] = Q K[n - 1]^T and O += P[n] V[n] together and runs the softmax of
// S[n - 1] while O's product is still in flight (its rescale waits for it). K and V are double
// buffered and stream in with cp.async a whole iteration ahead.
// Shared memory uses wgmma's 128-byte (64-byte for head dim 96) swizzled layouts; V is read as V^T
// by the transposing (MN-major) B operand, without a copy.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "common/mask.hpp"
#include "cuda/cute_utils.cuh"
#include "cuda/fwd_params.hpp"
#include "cuda/online_softmax.cuh"
#include "cuda/score_tile.cuh"

namespace tileattn::cuda {

using namespace cute;

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_>
struct FwdTraitsSm90 {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarpGroups = kBlockM / 64;
  static constexpr int kThreads = kWarpGroups * 128;
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0 && kHeadDim % 32 == 0);

  using WarpGroups = Layout<Shape<Int<kWarpGroups>, _1, _1>>;
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(), WarpGroups{}));
  using MmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      WarpGroups{}));

  static constexpr int kChunk = kHeadDim % 64 == 0 ? 64 : 32;
  using SmemAtom =
      std::conditional_t<kChunk == 64, GMMA::Layout_K_SW128_Atom<Element>, GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, _2>{}));
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, _2>{}, Step<_2, _1, _3>{})));

  static constexpr int kThreadsPerRow = kChunk / 8;
  using GmemThreads = Layout<Shape<Int<kThreads / kThreadsPerRow>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>;
  using GmemLoad = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                            GmemThreads{}, Layout<Shape<_1, _8>>{}));
  using GmemStore = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{}, GmemThreads{},
                                             Layout<Shape<_1, _8>>{}));
  using StoreOAtom = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kHeadDim * int(sizeof(Element));
};

// cp.async writes go through the generic proxy and wgmma reads through the async proxy: each thread
// orders its landed writes before the barrier that publishes them.
__device__ __forceinline__ void cp_async_land() {
  cp_async_wait<0>();
  cutlass::arch::fence_view_async_shared();
  __syncthreads();
}

template <class T, bool kMods, bool kEvenK>
__global__ void __launch_bounds__(T::kThreads, T::kWarpGroups == 1 ? 2 : 1) fwd_kernel_sm90(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim;
  extern __shared__ __align__(1024) char smem_sm90[];

  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);  // the longest causal tiles start first
  const int b = blockIdx.y, h = blockIdx.z, hk = h / p.group;
  const int tid = threadIdx.x;

  int q_start = 0, k_start = 0, sq = p.seqlen_q, sk = p.seqlen_k;
  if (p.cu_q != nullptr) {
    q_start = p.cu_q[b];
    sq = p.cu_q[b + 1] - q_start;
    k_start = p.cu_k[b];
    sk = p.cu_k[b + 1] - k_start;
  }
  const int m0 = m_block * kBlockM;
  if (m0 >= sq) return;
  const int rows = min(kBlockM, sq - m0);
  const Mask mask(sq, sk, p.bottom_right, p.window_left, p.window_right);
  const int key_lo = max(mask.block_key_begin(m0), 0);
  const int key_hi = min(mask.block_key_end(m0 + rows), sk);
  const int n_min = key_lo / kBlockN;
  const int n_max = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_min;

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

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_sm90)), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + cosize(typename T::SmemLayoutQ{}), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + cosize(typename T::SmemLayoutKV{}), typename T::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename T::SmemLayoutVt{});

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

  typename T::MmaS mma_s;
  typename T::MmaO mma_o;
  auto ts = mma_s.get_thread_slice(tid);
  auto to = mma_o.get_thread_slice(tid);
  Tensor dQ = ts.partition_fragment_A(sQ);  // descriptors
  Tensor dK = ts.partition_fragment_B(sK);
  Tensor dVt = to.partition_fragment_B(sVt);
  Tensor acc_o = partition_fragment_C(mma_o, TileQ{});

  Tensor cS = ts.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cS_rc = make_tensor(cS.data(), rowcol(cS.layout()));
  Tensor cO = to.partition_C(make_identity_tensor(TileQ{}));
  Tensor cO_rc = make_tensor(cO.data(), rowcol(cO.layout()));
  Tensor acc_o_rc = make_tensor(acc_o.data(), rowcol(acc_o.layout()));
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;

  auto store_tile = [&](float (&lse)[kRows]) {
    // O through shared memory (reusing Q's space) so the global stores are 16 bytes wide.
    Tensor rO = convert<Element>(acc_o);
    Tensor sO = make_tensor(sQ.data(), typename T::SmemLayoutQ{});
    auto st = make_tiled_copy_C(typename T::StoreOAtom{}, mma_o);
    auto st_thr = st.get_thread_slice(tid);
    __syncthreads();  // every warpgroup is done reading Q
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
    copy_tile<true, true, false>(gstore, gs.partition_S(sO), gs.partition_D(gO),
                                 gs.partition_S(make_identity_tensor(TileQ{})), rows, p.d_v);
  };

  OnlineSoftmax<kRows> softmax;
  clear(acc_o);
  if (n_max <= n_min) {  // no row of this tile sees a key
    float lse[kRows];
    softmax.finish(acc_o_rc, 1.f, 1.f, lse);
    store_tile(lse);
    return;
  }

  const float scale_log2 = kMods ? 1.f : p.scale_log2;
  ScoreMod mod{p.scale, p.softcap, 0.f};
  if constexpr (kMods) {
    if (p.alibi != nullptr) mod.alibi = p.alibi[b * p.alibi_batch + h * p.alibi_head];
  }
  const unsigned bh = unsigned(b * p.heads_q + h);

  // Scores of key tile n to probabilities: modifiers, the mask where it cuts the tile, the softmax
  // (returning whether O must be rescaled by corr), dropout.
  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor s = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  float corr[kRows];
  auto probabilities = [&](auto masked, int n) __attribute__((always_inline)) {
    const int col0 = n * kBlockN;
    if constexpr (kMods) apply_score_mod(s, cS_rc, mod, m0, col0, mask.diag_offset);
    if constexpr (decltype(masked)::value) apply_mask(s, cS_rc, mask, m0, col0);
    const bool grow = softmax.move_max(s, scale_log2, corr);
    softmax.exponentiate(s, scale_log2);
    if constexpr (kMods) {
      if (p.dropout) apply_dropout(s, cS_rc, p.drop, bh, m0, col0);
    }
    return grow;
  };
  auto scores_to_p = [&](int n) __attribute__((always_inline)) {
    // The modifiers' kernel keeps one body: two spilled twice as much in the portable kernel.
    if (!kMods && mask.block_full(m0, m0 + rows, n * kBlockN, (n + 1) * kBlockN)) return probabilities(false_type{}, n);
    return probabilities(true_type{}, n);
  };

  // Loads: Q and K[top] first, then V[top] and K[top - 1]. The last key tile is the only partial one.
  const int top = n_max - 1;
  copy_tile<true, !kEvenK, true>(gload, tQg, tQs, tQc, rows, p.d_qk);
  copy_tile<true, !kEvenK, true>(gload, tKg(_, _, _, top), tKs(_, _, _, top & 1), tKVc, sk - top * kBlockN, p.d_qk);
  cp_async_fence();
  copy_tile<true, !kEvenK, true>(gload, tVg(_, _, _, top), tVs(_, _, _, top & 1), tKVc, sk - top * kBlockN, p.d_v);
  if (top > n_min) copy_tile<false, !kEvenK, true>(gload, tKg(_, _, _, top - 1), tKs(_, _, _, (top - 1) & 1), tKVc, 0, p.d_qk);
  cp_async_fence();
  cp_async_wait<1>();
  cutlass::arch::fence_view_async_shared();
  __syncthreads();

  gemm_wg<true>(mma_s, dQ, dK(_, _, _, top & 1), acc_s);
  warpgroup_wait<0>();
  scores_to_p(top);  // O is still zero: nothing to rescale
  Tensor rP = convert<Element>(acc_s);
  Tensor rP_a = make_tensor(rP.data(), acc_as_a(rP.layout()));

  for (int n = top; n > n_min; --n) {
    cp_async_land();  // K[n - 1] and V[n] have landed; every warpgroup is done with K[n] and V[n + 1]
    if (n - 1 > n_min) copy_tile<false, !kEvenK, true>(gload, tKg(_, _, _, n - 2), tKs(_, _, _, n & 1), tKVc, 0, p.d_qk);
    copy_tile<false, !kEvenK, true>(gload, tVg(_, _, _, n - 1), tVs(_, _, _, (n - 1) & 1), tKVc, 0, p.d_v);
    cp_async_fence();

    gemm_wg<true>(mma_s, dQ, dK(_, _, _, (n - 1) & 1), acc_s);
    gemm_wg<false>(mma_o, rP_a, dVt(_, _, _, n & 1), acc_o);
    warpgroup_wait<1>();  // S[n - 1] is done; O's product runs on
    const bool grow = scores_to_p(n - 1);
    warpgroup_wait<0>();
    warpgroup_fence_operand(rP);  // P[n]'s registers are free only now
    if (grow) softmax.rescale(acc_o_rc, corr);
    copy(convert<Element>(acc_s), rP);
  }
  cp_async_land();  // V[n_min]
  gemm_wg<false>(mma_o, rP_a, dVt(_, _, _, n_min & 1), acc_o);
  warpgroup_wait<0>();

  float lse[kRows];
  softmax.finish(acc_o_rc, scale_log2, kMods && p.dropout ? p.drop.keep_scale : 1.f, lse);
  store_tile(lse);
#endif
}

}  // namespace tileattn::cuda
