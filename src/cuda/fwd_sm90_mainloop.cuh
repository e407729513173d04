// The Hopper forward kernel's mainloop (sm_90a): its tile shapes and shared-memory plan, the
// producer's TMA loads and the consumers' products and online softmax for one work tile.
//
// One producer thread streams Q (once per tile) and the K and V tiles (through a pipeline of
// stages each, mbarriers counting the bytes that land) with the tensor-memory accelerator; rows
// past a tensor's extent arrive as zeros. Two (or three) consumer warpgroups own 64 query rows
// each and share every K and V stage. S = Q K^T reads both operands from shared memory, O += P V
// takes P from the S accumulators in registers and V as V^T through a transposing (MN-major) view.
// Within a warpgroup, S[n - 1] and P[n] V[n] are issued together and the softmax of S[n - 1] runs
// while O's product is in flight; between the warpgroups, named barriers let one issue its
// products while another runs its softmax (ping-pong; three take turns in a ring), so the tensor
// cores rarely wait.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/cute_utils.cuh"
#include "cuda/fwd_params.hpp"
#include "cuda/fwd_tile.cuh"
#include "cuda/key_tiles.cuh"
#include "cuda/online_softmax.cuh"
#include "cuda/score_tile.cuh"
#include "cuda/tma_view.cuh"

namespace tileattn::cuda {

using namespace cute;

template <int kStages>
struct FwdBarriersSm90 {
  typename cutlass::PipelineTmaAsync<kStages>::SharedStorage k, v;
  cutlass::arch::ClusterTransactionBarrier q_full;  // Q of the current tile has landed
  cutlass::arch::ClusterBarrier q_empty;            // every consumer is done with Q's buffer
  // The producer hands each tile index to the consumers through two slots.
  cutlass::arch::ClusterBarrier tile_full[2], tile_empty[2];
  int tile[2];
};

// Named barrier ids (past CUTLASS's reserved ones): one per consumer warpgroup for its turn at
// the tensor cores, then one per warpgroup for its own epilogue and shared-memory writes.
inline constexpr int kBarrierTurn = 0;
inline constexpr int kBarrierWarpGroup = 3;

// kHeadDim: Q's and K's head dim; kHeadDimV: V's and O's (narrower for 192/128, which would
// otherwise pay 192 columns in P V and O's registers).
template <class Element_, int kHeadDim_, int kBlockN_, int kBlockM_ = 128, int kStages_ = 2, int kHeadDimV_ = kHeadDim_>
struct FwdTraitsSm90 {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kHeadDimV = kHeadDimV_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarpGroups = kBlockM / 64;  // consumers: a warpgroup per 64 query rows
  static constexpr int kConsumers = kWarpGroups * 128;
  static constexpr int kThreads = kConsumers + 128;  // and the producer's warpgroup
  // Registers per thread after the split (64K per SM). The producer keeps few and spills: giving it
  // 40 (consumers 232) was 3-7% slower at head dims 64 and 256 and gained only at 128 with 16k keys.
  static constexpr int kProducerRegs = kWarpGroups == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kWarpGroups == 2 ? 240 : 160;
  static_assert((kWarpGroups == 2 || kWarpGroups == 3) && kBlockN % 16 == 0 && kHeadDim % 32 == 0 &&
                kHeadDimV % 32 == 0 && kHeadDimV <= kHeadDim);

  using WarpGroups = Layout<Shape<Int<kWarpGroups>, _1, _1>>;
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(), WarpGroups{}));
  using MmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      WarpGroups{}));

  template <int kD>  // 128-byte swizzle atoms where the head dim is a multiple of 64 columns
  using AtomOf =
      std::conditional_t<kD % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>, GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutQ = decltype(tile_to_shape(AtomOf<kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(AtomOf<kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(AtomOf<kHeadDimV>{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutO = decltype(tile_to_shape(AtomOf<kHeadDimV>{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
  using StoreOAtom = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  using GmemStore = typename GmemCopies<Element, 128, kHeadDimV % 64 == 0 ? 64 : 32>::Store;  // a warpgroup's rows

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  // Global tensors as (rows, head dim, heads, batch).
  using GmemShape = TmaGmemShape;
  using GmemLayout = Layout<GmemShape, Stride<std::int64_t, _1, std::int64_t, std::int64_t>>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutKV{})));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutV{})));

  static constexpr int kTileQBytes = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kTileKVBytes = kBlockN * kHeadDim * int(sizeof(Element));  // a K stage
  static constexpr int kTileVBytes = kBlockN * kHeadDimV * int(sizeof(Element));
  static constexpr int kTileOBytes = kBlockM * kHeadDimV * int(sizeof(Element));
  static constexpr int kOffsetK = kTileQBytes;
  static constexpr int kOffsetV = kOffsetK + kStages * kTileKVBytes;
  static constexpr int kOffsetO = kOffsetV + kStages * kTileVBytes;
  // O goes out through a buffer of its own where one fits (16-byte stores); otherwise straight from
  // the accumulators (4-byte stores, half of each 32-byte sector a warp writes): sharing Q's buffer
  // would hold the next tile's Q back until the epilogue ends, sharing V's would wait for both
  // warpgroups to be done with V.
  static constexpr bool kOwnO = kOffsetO + kTileOBytes + 1024 <= 227 * 1024;
  static constexpr int kOffsetBarriers = kOffsetO + (kOwnO ? kTileOBytes : 0);
  static constexpr int kSmemBytes = kOffsetBarriers + int(sizeof(FwdBarriersSm90<kStages>));
};

// The TMA descriptors of a call and the global shapes they were made for.
template <class T>
struct FwdTmaSm90 {
  typename T::TmaQ q;
  typename T::TmaKV k;
  typename T::TmaV v;
  typename T::GmemShape q_shape, k_shape, v_shape;
};

// Host side: descriptors for q, k and v.
template <class T>
FwdTmaSm90<T> make_fwd_tma(const FwdParams& p, int batch) {
  using Element = typename T::Element;
  const int entries = p.cu_q != nullptr ? 1 : batch;  // varlen: one packed sequence of all tokens
  const int heads_kv = p.heads_q / p.group;
  auto q = tma_gmem_view<Element>(p.q, p.q_rows, p.d_qk, p.heads_q, entries, p.q_row, p.q_head, p.q_batch);
  auto k = tma_gmem_view<Element>(p.k, p.k_rows, p.d_qk, heads_kv, entries, p.k_row, p.k_head, p.k_batch);
  auto v = tma_gmem_view<Element>(p.v, p.k_rows, p.d_v, heads_kv, entries, p.v_row, p.v_head, p.v_batch);
  return {make_tma_copy(SM90_TMA_LOAD{}, q, typename T::SmemLayoutQ{}),
          make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(typename T::SmemLayoutKV{})),
          make_tma_copy(SM90_TMA_LOAD{}, v, take<0, 2>(typename T::SmemLayoutV{})),
          q.shape(), k.shape(), v.shape()};
}

// The producer thread's loads for one tile with keys, in the order the consumers use them, over
// the key tiles the tile visits (from the top down): K[top], Q, then K[next] beside V[n], and the
// last visited V last. q_loads counts the Q loads before this one (the phase of Q's barriers).
template <class T, bool kVariant, class SQ, class SK, class SV>
__device__ __forceinline__ void fwd_sm90_load(const FwdParams& p, const FwdTmaSm90<T>& tma, const FwdTile& g, SQ& sQ,
                                              SK& sK, SV& sV,
                                              typename T::Pipeline& pk, typename T::Pipeline& pv,
                                              cutlass::PipelineState<T::kStages>& st,
                                              FwdBarriersSm90<T::kStages>& bars, int q_loads) {
  using TileQ = Shape<Int<T::kBlockM>, Int<T::kHeadDim>>;
  using TileKV = Shape<Int<T::kBlockN>, Int<T::kHeadDim>>;
  using TileV = Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>;
  const int b = get<3>(tma.q_shape) == 1 ? 0 : g.b;  // varlen: one packed batch entry
  Tensor mQ = tma.q.get_tma_tensor(tma.q_shape)(_, _, g.h, b);
  Tensor mK = tma.k.get_tma_tensor(tma.k_shape)(_, _, g.hk, b);
  Tensor mV = tma.v.get_tma_tensor(tma.v_shape)(_, _, g.hk, b);
  Tensor gQ = local_tile(domain_offset(make_coord(g.q_start, _0{}), mQ), TileQ{}, make_coord(g.m_block, _0{}));
  Tensor gK = local_tile(domain_offset(make_coord(g.k_start, _0{}), mK), TileKV{}, make_coord(_, _0{}));
  Tensor gV = local_tile(domain_offset(make_coord(g.k_start, _0{}), mV), TileV{}, make_coord(_, _0{}));
  auto cq = tma.q.get_slice(_0{});
  auto ck = tma.k.get_slice(_0{});
  auto cv = tma.v.get_slice(_0{});
  Tensor tQg = cq.partition_S(gQ);
  Tensor tQs = cq.partition_D(sQ);
  Tensor tKg = ck.partition_S(gK);  // (TMA, _1, _1, key tiles)
  Tensor tKs = ck.partition_D(sK);  // (TMA, _1, _1, stages)
  Tensor tVg = cv.partition_S(gV);
  Tensor tVs = cv.partition_D(sV);

  auto load_k = [&](int n) {
    pk.producer_acquire(st);
    copy(tma.k.with(*pk.producer_get_barrier(st), 0), tKg(_, _, _, n), tKs(_, _, _, st.index()));
  };
  auto load_v = [&](int n, const cutlass::PipelineState<T::kStages>& s) {
    pv.producer_acquire(s);
    copy(tma.v.with(*pv.producer_get_barrier(s), 0), tVg(_, _, _, n), tVs(_, _, _, s.index()));
  };

  Visit t = g.next<T::kBlockN, kVariant>(p, g.n_max);
  load_k(t.n);
  if (q_loads > 0) bars.q_empty.wait((q_loads - 1) & 1);
  bars.q_full.arrive_and_expect_tx(T::kTileQBytes);
  copy(tma.q.with(reinterpret_cast<std::uint64_t&>(bars.q_full), 0), tQg, tQs);
  for (Visit next = g.next<T::kBlockN, kVariant>(p, t.n); next.n >= g.n_min;
       t = next, next = g.next<T::kBlockN, kVariant>(p, t.n)) {
    const auto sv = st;
    ++st;
    load_k(next.n);
    load_v(t.n, sv);
  }
  load_v(t.n, st);
  ++st;
}

// Zeroes the rows of a V stage from `first` on. Varlen only: the tile past a sequence's last key
// holds the next sequence's rows, and P = 0 times a non-finite V would still make a NaN.
// Each warpgroup writes the same zeros before its own product reads the stage.
template <class T, class SV>
__device__ __forceinline__ void zero_v_rows(SV&& sV, int first, int tw, int wg) {
  constexpr int kChunks = T::kHeadDimV / 8;
  for (int i = tw; i < (T::kBlockN - first) * kChunks; i += 128) {
    const int r = first + i / kChunks, c = i % kChunks;
    *reinterpret_cast<uint128_t*>(&sV(r, c * 8)) = uint128_t{0, 0};
  }
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(128, kBarrierWarpGroup + wg);
}

// One consumer warpgroup's work on a tile with keys: O (unnormalized) in acc_o and the row
// statistics in softmax. Key tiles are visited from the last to the first (those the tile visits);
// only tiles the mask cuts pay for masking. st is the pipelines' read state; q_phase the phase of Q's barrier.
template <class T, bool kMods, bool kVariant, class SQ, class SK, class SV, class SVt, class AccO, class Softmax>
__device__ __forceinline__ void fwd_sm90_mma(const FwdParams& p, const FwdTile& g, SQ& sQ, SK& sK, SV& sV, SVt& sVt,
                                             typename T::Pipeline& pk, typename T::Pipeline& pv,
                                             cutlass::PipelineState<T::kStages>& st,
                                             FwdBarriersSm90<T::kStages>& bars, int q_phase, AccO& acc_o,
                                             Softmax& softmax, int tc) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  const int wg = tc / 128, tw = tc % 128;
  typename T::MmaS mma_s;
  typename T::MmaO mma_o;
  auto ts = mma_s.get_thread_slice(tc);
  auto to = mma_o.get_thread_slice(tc);
  Tensor dQ = ts.partition_fragment_A(sQ);  // descriptors
  Tensor dK = ts.partition_fragment_B(sK);
  Tensor dVt = to.partition_fragment_B(sVt);
  Tensor cS = ts.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cS_rc = make_tensor(cS.data(), rowcol(cS.layout()));
  Tensor acc_o_rc = make_tensor(acc_o.data(), rowcol(acc_o.layout()));

  const float scale_log2 = kMods ? 1.f : p.scale_log2;
  Variant scored = g.var;  // the score transform, with the head's ALiBi slope (kMods only)
  if constexpr (kMods) {
    if (p.alibi != nullptr) scored.score.alibi = p.alibi[g.b * p.alibi_batch + g.h * p.alibi_head];
  }
  const unsigned bh = unsigned(g.b * p.heads_q + g.h);

  // Scores of key tile n to probabilities: modifiers, the mask where it cuts the tile, the softmax
  // (returning whether O must be rescaled by corr), dropout.
  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor s = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  float corr[decltype(size<0>(s))::value];
  // A variant's row ranges (with document runs, two loads a row) hold for every key tile: taken
  // once. The plain kernels take their causal / window bounds per tile, as they always have.
  const auto ranges = row_ranges(s, cS_rc, g.var, g.m0, kVariant ? g.runs : nullptr);
  auto probabilities = [&](auto masked, const Visit& t) __attribute__((always_inline)) {
    const int col0 = t.n * kBlockN;
    if constexpr (kMods) apply_score_mod(s, cS_rc, scored, g.m0, col0);
    if constexpr (decltype(masked)::value) {
      if (!kVariant || t.mode == TileMask::rules) {
        if constexpr (kVariant)
          apply_mask(s, cS_rc, g.var, g.m0, col0, ranges);
        else
          apply_mask(s, cS_rc, g.var, g.m0, col0);
      } else {
        apply_key_limit(s, cS_rc, g.sk - col0);
      }
    }
    const bool grow = softmax.move_max(s, scale_log2, corr);
    softmax.exponentiate(s, scale_log2);
    if constexpr (kMods) {
      if (g.var.dropout) apply_dropout(s, cS_rc, g.var.drop, bh, g.m0, col0);
    }
    return grow;
  };
  auto scores_to_p = [&](const Visit& t) __attribute__((always_inline)) {
    // The modifiers' kernel keeps one body: two spilled twice as much in the portable kernel.
    if (!kMods && t.mode == TileMask::none) return probabilities(false_type{}, t);
    return probabilities(true_type{}, t);
  };

  Visit t = g.next<kBlockN, kVariant>(p, g.n_max);
  const int top = t.n;
  // Varlen: the last tile's rows past the sequence come from the next one (see zero_v_rows).
  const int v_past_end = p.cu_k != nullptr ? g.sk - top * kBlockN : kBlockN;
  bars.q_full.wait(q_phase);
  pk.consumer_wait(st);
  gemm_wg<true>(mma_s, dQ, dK(_, _, _, st.index()), acc_s);
  warpgroup_wait<0>();
  pk.consumer_release(st);
  scores_to_p(t);  // O is still zero: nothing to rescale
  Tensor rP = convert<Element>(acc_s);
  Tensor rP_a = make_tensor(rP.data(), acc_as_a(rP.layout()));

  for (Visit next = g.next<kBlockN, kVariant>(p, t.n); next.n >= g.n_min;
       t = next, next = g.next<kBlockN, kVariant>(p, t.n)) {
    const auto sv = st;  // V[t]'s stage; K[next] is in the next one
    ++st;
    pk.consumer_wait(st);
    cutlass::arch::NamedBarrier::sync(2 * 128, kBarrierTurn + wg);
    gemm_wg<true>(mma_s, dQ, dK(_, _, _, st.index()), acc_s);
    pv.consumer_wait(sv);
    if (t.n == top && v_past_end < kBlockN) zero_v_rows<T>(sV(_, _, sv.index()), v_past_end, tw, wg);
    gemm_wg<false>(mma_o, rP_a, dVt(_, _, _, sv.index()), acc_o);
    cutlass::arch::NamedBarrier::arrive(2 * 128, kBarrierTurn + (wg + 1) % T::kWarpGroups);
    warpgroup_wait<1>();  // S[next] is done; O's product runs on
    pk.consumer_release(st);
    const bool grow = scores_to_p(next);
    warpgroup_wait<0>();
    pv.consumer_release(sv);
    warpgroup_fence_operand(rP);  // P[t]'s registers are free only now
    if (grow) softmax.rescale(acc_o_rc, corr);
    convert_into(acc_s, rP);
  }
  bars.q_empty.arrive();  // the last S product has completed
  pv.consumer_wait(st);
  if (t.n == top && v_past_end < kBlockN) zero_v_rows<T>(sV(_, _, st.index()), v_past_end, tw, wg);
  gemm_wg<false>(mma_o, rP_a, dVt(_, _, _, st.index()), acc_o);
  warpgroup_wait<0>();
  pv.consumer_release(st);
  ++st;
}

}  // namespace tileattn::cuda
