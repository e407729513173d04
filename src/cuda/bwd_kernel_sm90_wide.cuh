// The Hopper backward for wide query/key heads with a narrower V (192/128, as DeepSeek's attention
// has it), arranged as FlashAttention-3 arranges its wide heads: a block owns 96 keys, each consumer
// warpgroup 48 of them. S = Q K^T and dP = dO V^T keep the query rows as their M, and dK, dV
// accumulate transposed (dK^T += Q^T dS, dV^T += dO^T P), so a warpgroup's products read only its
// own columns of P and dS: the warpgroups meet once a tile, when dS is complete for dQ = dS K (each
// warpgroup half of dQ's head dim, staged in shared memory for the writer thread's bulk reduction,
// as in bwd_kernel_sm90.cuh). Against the split kernel of
// bwd_kernel_sm90.cuh (64 keys, both warpgroups on every key, P^T and dS^T exchanged), a query tile's
// loads and dQ additions serve 1.5x the keys and each product is at least 48 columns wide.
// The producer (loader warp, dQ writer), the walk and the barriers are bwd_kernel_sm90.cuh's. Plain
// calls only (no modifiers or variants), in the default and the deterministic mode.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/bwd_kernel_sm90.cuh"

namespace tileattn::cuda {

using namespace cute;

template <class Element_, int kHeadDim_ = 192, int kHeadDimV_ = 128>
struct BwdTraitsSm90Wide {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kHeadDimV = kHeadDimV_, kBlockM = 64, kBlockN = 96;
  static constexpr int kWarpGroups = 2;
  static constexpr int kConsumers = kWarpGroups * 128;
  static constexpr int kThreads = kConsumers + 128;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0 && kHeadDimV <= kHeadDim);

  using SplitCols = Layout<Shape<_1, Int<kWarpGroups>, _1>>;
  // (M x N) = Q K^T and dO V^T, each warpgroup its 48 keys.
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN / kWarpGroups>, Int<kHeadDim>>>(),
      SplitCols{}));
  // (D x N) += Q^T dS and (Dv x N) += dO^T P, both operands transposed views.
  template <int kD>
  using MmaKVOf = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kD>, Int<kBlockN / kWarpGroups>, Int<kBlockM>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      SplitCols{}));
  using MmaK = MmaKVOf<kHeadDim>;
  using MmaV = MmaKVOf<kHeadDimV>;
  // (M x D) = dS K, K through its transposed view; each warpgroup half the head dim.
  using MmaQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim / kWarpGroups>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      SplitCols{}));

  // 64-byte atoms (32 columns) at 192, 128-byte ones at 128; P and dS in 32-byte atoms (16 keys),
  // so that the second warpgroup's 48 keys start on an atom. P has one buffer (only its own
  // warpgroup's products read a warpgroup's keys of it, done before its next write), dS two (both
  // warpgroups' dQ products read all of it).
  template <int kD>
  using AtomOf = std::conditional_t<kD % 64 == 0 && kD != 192, GMMA::Layout_K_SW128_Atom<Element>,
                                    GMMA::Layout_K_SW64_Atom<Element>>;
  using AtomP = GMMA::Layout_K_SW32_Atom<Element>;
  template <int kD>
  using SmemLayoutRowsOf = decltype(tile_to_shape(AtomOf<kD>{}, Shape<Int<kBlockM>, Int<kD>, _2>{}));
  template <int kD>
  using SmemLayoutRowsT = decltype(composition(
      SmemLayoutRowsOf<kD>{}, make_ordered_layout(Shape<Int<kD>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  using SmemLayoutQ = SmemLayoutRowsOf<kHeadDim>;
  using SmemLayoutdO = SmemLayoutRowsOf<kHeadDimV>;
  using SmemLayoutQt = SmemLayoutRowsT<kHeadDim>;
  using SmemLayoutdOt = SmemLayoutRowsT<kHeadDimV>;
  using SmemLayoutKV = decltype(tile_to_shape(AtomOf<kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));  // K
  using SmemLayoutV = decltype(tile_to_shape(AtomOf<kHeadDimV>{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVt =
      decltype(composition(SmemLayoutV{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{}, GenRowMajor{})));
  // P and dS (queries x keys, kBufs buffers), and their (keys x queries) views.
  template <int kBufs>
  using SmemLayoutPOf = decltype(tile_to_shape(AtomP{}, Shape<Int<kBlockM>, Int<kBlockN>, Int<kBufs>>{}));
  template <int kBufs>
  using SmemLayoutPtOf = decltype(composition(
      SmemLayoutPOf<kBufs>{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kBufs>>{}, Step<_2, _1, _3>{})));

  static constexpr int kGmemChunk = 64;
  using GmemLoad = typename GmemCopies<Element, kConsumers, kGmemChunk>::Load;
  using GmemStore = typename GmemCopies<Element, kConsumers, kGmemChunk>::Store;
  using StoreAtom = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  using TmaQ = BwdTmaLoadSm90<Element, SmemLayoutQ>;
  using TmadO = BwdTmaLoadSm90<Element, SmemLayoutdO>;

  static constexpr int kTileQ = kBlockM * kHeadDim, kTiledO = kBlockM * kHeadDimV;
  static constexpr int kTileKV = kBlockN * kHeadDim, kTileV = kBlockN * kHeadDimV, kTileP = kBlockM * kBlockN;
  static constexpr int kOffsetQ = (kTileKV + kTileV) * int(sizeof(Element));
  static constexpr int kOffsetdO = kOffsetQ + 2 * kTileQ * int(sizeof(Element));
  static constexpr int kOffsetP = kOffsetdO + 2 * kTiledO * int(sizeof(Element));
  static constexpr int kOffsetdS = kOffsetP + kTileP * int(sizeof(Element));
  static constexpr int kOffsetRows = kOffsetdS + 2 * kTileP * int(sizeof(Element));
  static constexpr bool kDqInStage = false, kPassEarly = false;
  static constexpr int kDqTile = kBlockM * kHeadDim, kDqStages = 1;
  static constexpr int kOffsetDq = kOffsetRows + 2 * 2 * kBlockM * int(sizeof(float));
  static constexpr int kOffsetBarriers = kOffsetDq + kDqStages * kDqTile * int(sizeof(float));
  // K, V; 2 x (Q, dO); P; 2 x dS; 2 x (LSE, D); dQ (fp32).
  static constexpr int kSmemBytes = kOffsetBarriers + int(sizeof(BwdBarriersSm90));
  static_assert(kSmemBytes <= 227 * 1024);
  static_assert(kBlockM % kDqTurnRows == 0, "a query tile holds whole 64-row turns");
};

// A transposed (D x keys) fp32 accumulator of `Mma`, scaled, written to global memory as the element
// type through the (keys x D) shared tile `stage` (read through its transposed view `stage_t`), rows
// < max_rows and columns < max_cols only.
template <class T, class Mma, class Acc, class StageT, class Stage, class G, class Sync>
__device__ __forceinline__ void store_acc_t(const Acc& acc, StageT& stage_t, Stage& stage, G& g, int max_rows,
                                            int max_cols, int tid, Sync sync) {
  using Element = typename T::Element;
  Tensor r = convert<Element>(acc);
  Mma mma;
  Tensor dst = mma.get_thread_slice(tid).partition_C(stage_t);
  CUTE_UNROLL
  for (int i = 0; i < size(r); ++i) dst(i) = r(i);
  sync();
  store_stage<T>(stage, g, max_rows, max_cols, tid);
}

// Adds a transposed (D x keys) accumulator into fp32 rows (the GQA group's parts), one float a value.
template <int kCols, class Acc, class C>
__device__ __forceinline__ void add_acc_t(const Acc& acc, float* rows, std::int64_t row0, const C& coord, int rows_left) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) {
    const int col = get<0>(coord(i)), row = get<1>(coord(i));
    if (row < rows_left) atomicAdd(rows + row * kCols + dq_column(row0 + row, col), acc(i));
  }
}

// kDeterministic: the key blocks run last to first and the writer adds each query tile's dQ in
// that order, as bwd_kernel_sm90.cuh's deterministic instantiation does.
template <class T, bool kDeterministic>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_kernel_sm90_wide(const __grid_constant__ BwdParams p, const __grid_constant__ BwdTmaSm90<T> tma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename T::Element;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kConsumers = T::kConsumers;
  extern __shared__ __align__(1024) char smem_bwd_wide[];
  allow_dependent_launch();  // as bwd_kernel_sm90's
  const FwdParams& f = p.fwd;
  const BwdBlock blk = bwd_block<kDeterministic>(p);
  const int n_block = blk.n, b = blk.b, hk = blk.z / p.group_parts, tid = threadIdx.x;
  const BwdSeq s(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= s.sk) {
    wait_for_primary();  // as bwd_kernel_sm90's
    return;
  }
  const Variant var = restricted<false>(s.var);
  const auto w = bwd_walk<kBlockM, kBlockN, false, kDeterministic>(p, s, var, b, blk.z, n_block);

  auto smem = [&](int bytes) { return make_smem_ptr(reinterpret_cast<Element*>(smem_bwd_wide + bytes)); };
  Tensor sK = make_tensor(smem(0), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(smem(T::kTileKV * int(sizeof(Element))), typename T::SmemLayoutV{});
  Tensor sQ = make_tensor(smem(T::kOffsetQ), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(smem(T::kOffsetdO), typename T::SmemLayoutdO{});
  Tensor sP = make_tensor(smem(T::kOffsetP), typename T::template SmemLayoutPOf<1>{});
  Tensor sdS = make_tensor(smem(T::kOffsetdS), typename T::template SmemLayoutPOf<2>{});
  Tensor sQt = make_tensor(sQ.data(), typename T::SmemLayoutQt{});
  Tensor sdOt = make_tensor(sdO.data(), typename T::SmemLayoutdOt{});
  Tensor sKt = make_tensor(sK.data(), typename T::SmemLayoutKt{});
  Tensor sVt = make_tensor(sV.data(), typename T::SmemLayoutVt{});
  Tensor sPt = make_tensor(sP.data(), typename T::template SmemLayoutPtOf<1>{});
  Tensor sdSt = make_tensor(sdS.data(), typename T::template SmemLayoutPtOf<2>{});
  float* rows = reinterpret_cast<float*>(smem_bwd_wide + T::kOffsetRows);  // per stage: LSE, D
  auto& bars = *reinterpret_cast<BwdBarriersSm90*>(smem_bwd_wide + T::kOffsetBarriers);

  const int warp_group = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (warp_group > 0) {
    load_key_tile<T>(f, s, b, hk, n0, sK, sV, tid - 128);
    cp_async_fence();
  }
  if (tid == 0) bwd_sm90_init<T>(bars, tma);
  __syncthreads();

  if (warp_group == 0) {
    bwd_sm90_produce<T, kDeterministic, false>(p, tma, s, b, w, n_block, sQ, sdO, rows, smem_bwd_wide, bars, tid);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();
  const int tc = tid - 128, wg = tc / 128, tw = tc % 128;

  typename T::MmaS mma_s;
  typename T::MmaK mma_k;
  typename T::MmaV mma_v;
  typename T::MmaQ mma_q;
  auto ts = mma_s.get_thread_slice(tc);
  auto tk = mma_k.get_thread_slice(tc);
  auto tv = mma_v.get_thread_slice(tc);
  auto tq = mma_q.get_thread_slice(tc);
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;
  using TileK = Shape<Int<kHeadDim>, Int<kBlockN>>;
  using TileV = Shape<Int<T::kHeadDimV>, Int<kBlockN>>;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  Tensor dQ_a = ts.partition_fragment_A(sQ);     // (.., stages)
  Tensor ddO_a = ts.partition_fragment_A(sdO);
  Tensor dK_b = ts.partition_fragment_B(sK);
  Tensor dV_b = ts.partition_fragment_B(sV);
  Tensor dQt_a = tk.partition_fragment_A(sQt);   // (.., stages)
  Tensor ddSt_b = tk.partition_fragment_B(sdSt);  // (.., buffers)
  Tensor ddOt_a = tv.partition_fragment_A(sdOt);
  Tensor dPt_b = tv.partition_fragment_B(sPt);
  Tensor ddS_a = tq.partition_fragment_A(sdS);    // (.., buffers)
  Tensor dKt_b = tq.partition_fragment_B(sKt);

  Tensor acc_dk = partition_fragment_C(mma_k, TileK{});
  Tensor acc_dv = partition_fragment_C(mma_v, TileV{});
  clear(acc_dk);
  clear(acc_dv);
  Tensor acc_s = partition_fragment_C(mma_s, TileS{});
  Tensor acc_dp = partition_fragment_C(mma_s, TileS{});
  Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  Tensor dp_rc = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));
  Tensor cS = ts.partition_C(make_identity_tensor(TileS{}));
  Tensor c = make_tensor(cS.data(), rowcol(cS.layout()));
  auto st_p = make_tiled_copy_C(typename T::StoreAtom{}, mma_s);
  auto st_p_thr = st_p.get_thread_slice(tc);
  Tensor cdq = tq.partition_C(make_identity_tensor(TileQ{}));
  constexpr int kR = decltype(size<0>(s_rc))::value, kC = decltype(size<1>(s_rc))::value;

  cp_async_wait<0>();
  cutlass::arch::fence_view_async_shared();
  NamedBarrier::sync(kConsumers, kBwdBarrierConsumers);  // K and V have landed

  const float scale_log2 = f.scale_log2;
  BwdPair x = w.first();
  for (int t = 0;; ++t) {
    const int st = t & 1, buf = t & 1;
    if (!take_pair<false>(bars.full_q[st], bars.pair[st], w, x, t)) break;
    const int h = x.h, m0 = x.m0;
    const int phase = (t >> 1) & 1;
    if (f.cu_q != nullptr && m0 + kBlockM > s.sq) {
      bars.full_do[st].wait(phase);
      zero_rows<T>(sQ(_, _, st), sdO(_, _, st), s.sq - m0, tw, wg);
    }

    gemm_wg<true>(mma_s, dQ_a(_, _, _, st), dK_b, acc_s);
    bars.full_do[st].wait(phase);  // S's product is in flight
    gemm_wg<true>(mma_s, ddO_a(_, _, _, st), dV_b, acc_dp);
    const float* lse = rows + st * 2 * kBlockM;
    const bool masked = w.mode(h, m0) == TileMask::rules;
    warpgroup_wait<1>();  // S is done; dP runs on
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      const int row = get<0>(c(i, 0));
      const float l = lse[row], lse2 = l == -INFINITY ? INFINITY : l * kLog2e;
      CUTE_UNROLL
      for (int j = 0; j < kC; ++j) {
        const float sv = masked && !var.mask.visible(m0 + row, n0 + get<1>(c(i, j))) ? -INFINITY : s_rc(i, j);
        s_rc(i, j) = exp2f(fmaf(sv, scale_log2, -lse2));
      }
    }
    warpgroup_wait<0>();
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      const float d = lse[kBlockM + get<0>(c(i, 0))];
      CUTE_UNROLL
      for (int j = 0; j < kC; ++j) dp_rc(i, j) = s_rc(i, j) * (dp_rc(i, j) - d);
    }
    Tensor rP = convert<Element>(acc_s);
    Tensor rdS = convert<Element>(acc_dp);
    copy(st_p, st_p_thr.retile_S(rP), st_p_thr.partition_D(sP(_, _, 0)));
    copy(st_p, st_p_thr.retile_S(rdS), st_p_thr.partition_D(sdS(_, _, buf)));
    cutlass::arch::fence_view_async_shared();
    NamedBarrier::sync(128, kBwdBarrierWarpGroup + wg);  // this warpgroup's keys of P and dS are in
    gemm_wg<false>(mma_v, ddOt_a(_, _, _, st), dPt_b(_, _, _, 0), acc_dv);
    gemm_wg<false>(mma_k, dQt_a(_, _, _, st), ddSt_b(_, _, _, buf), acc_dk);
    NamedBarrier::sync(kConsumers, kBwdBarrierConsumers);  // dS is complete
    Tensor acc_dq = partition_fragment_C(mma_q, TileQ{});
    gemm_wg<true>(mma_q, ddS_a(_, _, _, buf), dKt_b, acc_dq);
    warpgroup_wait<0>();
    // Q, dO read; dS too (its buffer's next writer waits at the barrier above of the tile between).
    bars.empty_q[st].arrive();
    bars.empty_do[st].arrive();
    stage_dq<T>(acc_dq, cdq, smem_bwd_wide, h * p.rows_total + s.row_base + m0, t, bars);
    cutlass::arch::fence_view_async_shared();
    bars.dq_full[0].arrive();
    x = w.after(x);
  }

  // dK and dV through the K and V tiles' shared memory, once no product reads them.
  auto sync = [] { NamedBarrier::sync(kConsumers, kBwdBarrierConsumers); };
  sync();
  const float dk_scale = ds_scale(f);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= dk_scale;
  if (p.group_parts > 1) {  // the group's other blocks add to the same rows
    const std::int64_t key_base = f.cu_k != nullptr ? s.k_start : std::int64_t(b) * f.seqlen_k;
    const std::int64_t row0 = hk * p.rows_k_total + key_base + n0;
    add_dkv<kDeterministic>(p, hk, key_base, b, n0, blk.z % p.group_parts, [&] {
      add_acc_t<kHeadDim>(acc_dk, p.dk_accum + row0 * kHeadDim, row0, tk.partition_C(make_identity_tensor(TileK{})),
                          s.sk - n0);
      add_acc_t<kHeadDim>(acc_dv, p.dv_accum + row0 * kHeadDim, row0, tv.partition_C(make_identity_tensor(TileV{})),
                          s.sk - n0);
    }, sync);
    return;
  }
  const std::int64_t k_row0 = s.k_start + n0;
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch + k_row0 * p.dk_row + hk * p.dk_head;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch + k_row0 * p.dv_row + hk * p.dv_head;
  Tensor gdK = make_tensor(make_gmem_ptr(dk), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(p.dk_row, _1{}));
  Tensor gdV = make_tensor(make_gmem_ptr(dv), Shape<Int<kBlockN>, Int<T::kHeadDimV>>{}, make_stride(p.dv_row, _1{}));
  store_acc_t<T, typename T::MmaK>(acc_dk, sKt, sK, gdK, s.sk - n0, f.d_qk, tc, sync);
  store_acc_t<T, typename T::MmaV>(acc_dv, sVt, sV, gdV, s.sk - n0, f.d_v, tc, sync);
#endif
}

}  // namespace tileattn::cuda
