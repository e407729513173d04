// The Hopper backward kernel (sm_90a), warp-specialized: one block per (key tile, sequence, KV
// head) keeps the tile's K, V and its dK, dV accumulators on chip while the query tiles of every
// head of the GQA group stream by.
//   Producer warpgroup (after giving most of its registers away): a loader warp streams Q and dO
//   (TMA) with LSE and D (its lanes) through two stages, mbarriers counting what lands; a writer
//   thread moves each query tile's dQ, staged in shared memory, into the fp32 dQ rows by bulk
//   copies (the first key block's a store, the others' reductions), in key-block order in the
//   deterministic mode.
//   Two consumer warpgroups: S^T = K Q^T and dP^T = V dO^T from shared memory (issued together;
//   P^T is formed while dP^T is still in flight), dV += P^T dO, dK += dS^T Q, and dQ = dS K with
//   dS^T through shared memory (the warpgroups split dQ's head dim). The one point where the
//   consumers meet per tile is dS^T (and P^T where split) being complete; those buffers, the
//   stages and the dQ staging alternate between two, so no warpgroup waits for another to finish.
// Up to head dim 128 each consumer warpgroup owns 64 keys and multiplies P^T and dS^T straight
// from its registers. Beyond, 64 keys' dK and dV alone would take 256 registers a thread, so the
// warpgroups share 64 keys: they split S^T's query columns and dK's, dV's head dim, exchange P^T
// and dS^T through shared memory, and stage dQ in the tile's own Q and dO stage once it is read (two
// staging tiles of their own would not fit).
// Shared memory uses wgmma's swizzled layouts; the transposed operands (dO^T, Q^T, K^T, dS) are
// views read by the transposing (MN-major) operand modes, without copies.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/bulk_reduce.cuh"
#include "cuda/bwd_kernel.cuh"
#include "cuda/cute_utils.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/tma_view.cuh"

namespace tileattn::cuda {

using namespace cute;

// A (query head, query tile) pair a key block visits, and how the tile is masked.
struct BwdPair {
  int h, m0;
  TileMask mode;
};

// The block's mbarriers: a stage's Q with LSE, and its dO with D, have landed (TMA bytes and the
// loader warp's 32 arrivals; apart, so that S^T's product starts before dO is in) / are free again
// (every consumer thread is done with the stage, or where dQ is staged in it, the writer's
// reduction of that half has read it); a dQ staging buffer is written by every consumer thread /
// read by the bulk reduction. Beside them, the pair each stage holds, which the loader writes for
// the consumers (h < 0: the walk is over, on full_q), so that they do not walk it themselves.
struct BwdBarriersSm90 {
  cutlass::arch::ClusterTransactionBarrier full_q[2], full_do[2];
  cutlass::arch::ClusterBarrier empty_q[2], empty_do[2], dq_full[2], dq_empty[2];
  BwdPair pair[2];
  BwdPair dq_pair[2];  // the pair whose dQ a staging buffer holds, for the writer (h < 0: no more)
};

// The TMA load of a Q or dO stage (its first two modes) from a (rows, cols, head, batch) tensor, for
// the traits of every Hopper backward kernel.
template <class Element, class SmemLayout>
using BwdTmaLoadSm90 = decltype(make_tma_copy(
    SM90_TMA_LOAD{},
    make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)),
                Layout<TmaGmemShape, Stride<std::int64_t, _1, std::int64_t, std::int64_t>>{}),
    take<0, 2>(SmemLayout{})));

// kHeadDim: Q's and K's head dim; V and dO are padded to it (a narrower V at 192 takes the 96-key
// kernel, bwd_kernel_sm90_wide.cuh).
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_>
struct BwdTraitsSm90 {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kHeadDimV = kHeadDim, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr bool kSplitD = kHeadDim > 128;
  static constexpr int kWarpGroups = 2;  // consumers
  static constexpr int kConsumers = kWarpGroups * 128;
  static constexpr int kThreads = kConsumers + 128;  // and the producer's warpgroup
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kHeadDim % 32 == 0 && kBlockM % 64 == 0 &&
                kBlockN == (kSplitD ? 64 : 128));

  using SplitRows = Layout<Shape<Int<kWarpGroups>, _1, _1>>;
  using SplitCols = Layout<Shape<_1, Int<kWarpGroups>, _1>>;
  // (N x M) = K Q^T and V dO^T.
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockN>, Int<kBlockM / (kSplitD ? kWarpGroups : 1)>, Int<kHeadDim>>>(),
      std::conditional_t<kSplitD, SplitCols, SplitRows>{}));
  // (N x D) += dS^T Q and (N x Dv) += P^T dO: A from registers, or from shared memory where split.
  template <int kD>
  using MmaKVOf = std::conditional_t<
      kSplitD,
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float,
                                                   Shape<Int<kBlockN>, Int<kD / kWarpGroups>, Int<kBlockM>>,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              SplitCols{})),
      decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockN>, Int<kD>, Int<kBlockM>>,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              SplitRows{}))>;
  using MmaKV = MmaKVOf<kHeadDim>;
  using MmaV = MmaKVOf<kHeadDimV>;
  // (M x D) = dS K, both operands transposed views.
  using MmaQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim / kWarpGroups>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      SplitCols{}));

  // Q, dO, K, V in 128-byte swizzle atoms (64 columns) at head dims 64, 128, 256. At 192 and 96 a
  // warpgroup's slice of the head dim (96, 48 columns: dK's and dV's where split, dQ's) starts on
  // an atom only with 64-byte atoms (32 columns) at 192 and 32-byte ones (16 columns) at 96.
  template <int kD>
  using AtomOf = std::conditional_t<kD == 96, GMMA::Layout_K_SW32_Atom<Element>,
                                    std::conditional_t<kD == 192, GMMA::Layout_K_SW64_Atom<Element>,
                                                       GMMA::Layout_K_SW128_Atom<Element>>>;
  using AtomP = GMMA::Layout_K_SW128_Atom<Element>;  // P^T, dS^T: 64 query columns
  // Two stages of Q and of dO, two buffers of P^T and dS^T.
  template <int kD>
  using SmemLayoutRowsOf = decltype(tile_to_shape(AtomOf<kD>{}, Shape<Int<kBlockM>, Int<kD>, _2>{}));
  template <int kD>
  using SmemLayoutKeysOf = decltype(tile_to_shape(AtomOf<kD>{}, Shape<Int<kBlockN>, Int<kD>>{}));
  template <int kD>  // the stages read as (D x M) transposes
  using SmemLayoutRowsT = decltype(composition(
      SmemLayoutRowsOf<kD>{}, make_ordered_layout(Shape<Int<kD>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  using SmemLayoutQ = SmemLayoutRowsOf<kHeadDim>;
  using SmemLayoutdO = SmemLayoutRowsOf<kHeadDimV>;
  using SmemLayoutKV = SmemLayoutKeysOf<kHeadDim>;  // K
  using SmemLayoutV = SmemLayoutKeysOf<kHeadDimV>;
  using SmemLayoutdSt = decltype(tile_to_shape(AtomP{}, Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));
  using SmemLayoutQt = SmemLayoutRowsT<kHeadDim>;
  using SmemLayoutdOt = SmemLayoutRowsT<kHeadDimV>;
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutdSt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>, _2>{}, Step<_2, _1, _3>{})));

  static constexpr int kGmemChunk = kHeadDim % 64 == 0 ? 64 : 32;  // columns a row of threads copies
  using GmemLoad = typename GmemCopies<Element, kConsumers, kGmemChunk>::Load;
  using GmemStore = typename GmemCopies<Element, kConsumers, kGmemChunk>::Store;
  using StoreAtom = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  using TmaQ = BwdTmaLoadSm90<Element, SmemLayoutQ>;
  using TmadO = BwdTmaLoadSm90<Element, SmemLayoutdO>;

  static constexpr int kTileQ = kBlockM * kHeadDim, kTiledO = kBlockM * kHeadDimV;
  static constexpr int kTileKV = kBlockN * kHeadDim, kTileV = kBlockN * kHeadDimV, kTileP = kBlockN * kBlockM;
  static constexpr int kStageBytes = (kTileQ + kTiledO) * int(sizeof(Element));  // a stage's Q and dO
  // dQ is staged for the writer's bulk reductions, two tiles in turn. Up to head dim 128 in buffers
  // of its own; where split, no two fp32 tiles fit beside the rest, and a tile's dQ goes into its
  // own stage's Q and dO buffers (the same bytes: rows of dQ in fp32 against rows of Q and dO in 16
  // bits), which its products have finished reading; the writer frees the stage.
  static constexpr bool kDqInStage = kSplitD;
  // The deterministic writer passes a tile's turn before waiting for the next tile's, not once the
  // next tile's addition is issued: faster at head dim 64, whose tiles are short; slower at 128,
  // where the wait for the last 32 KB addition to land then holds up the next one.
  static constexpr bool kPassEarly = kHeadDim <= 64;
  static constexpr int kDqTile = kBlockM * kHeadDim, kDqStages = 2;
  static constexpr int kOffsetQ = (kTileKV + kTileV) * int(sizeof(Element));
  static constexpr int kOffsetdO = kOffsetQ + 2 * kTileQ * int(sizeof(Element));
  static_assert(!kDqInStage || kTileQ * int(sizeof(Element)) * 2 == kDqTile * int(sizeof(float)));
  static constexpr int kOffsetdSt = kOffsetQ + 2 * kStageBytes;
  static constexpr int kOffsetPt = kOffsetdSt + 2 * kTileP * int(sizeof(Element));  // where split
  static constexpr int kOffsetRows = kOffsetPt + (kSplitD ? 2 * kTileP * int(sizeof(Element)) : 0);
  static constexpr int kOffsetDq = kOffsetRows + 2 * 2 * kBlockM * int(sizeof(float));
  static constexpr int kOffsetBarriers = kOffsetDq + (kDqInStage ? 0 : kDqStages * kDqTile * int(sizeof(float)));
  // K, V; 2 x (Q, dO); 2 x dS^T (and P^T where split); 2 x (LSE, D); 2 x dQ (fp32) unless in the stages.
  static constexpr int kSmemBytes = kOffsetBarriers + int(sizeof(BwdBarriersSm90));
  static_assert(kSmemBytes <= 227 * 1024);
  static_assert(kBlockM % kDqTurnRows == 0, "a query tile holds whole 64-row turns");
};


// Named barrier ids: the consumers together, then each consumer warpgroup alone.
inline constexpr int kBwdBarrierConsumers = 0;
inline constexpr int kBwdBarrierWarpGroup = 1;

// The TMA descriptors for q and dO, and the global shapes they were made for.
template <class T>
struct BwdTmaSm90 {
  typename T::TmaQ q;
  typename T::TmadO dout;
  TmaGmemShape q_shape, do_shape;
};

template <class T>
BwdTmaSm90<T> make_bwd_tma(const BwdParams& p, int batch) {
  using Element = typename T::Element;
  const FwdParams& f = p.fwd;
  const int entries = f.cu_q != nullptr ? 1 : batch;  // varlen: one packed sequence of all tokens
  auto q = tma_gmem_view<Element>(f.q, f.q_rows, f.d_qk, f.heads_q, entries, f.q_row, f.q_head, f.q_batch);
  auto dout = tma_gmem_view<Element>(p.dout, f.q_rows, f.d_v, f.heads_q, entries, p.do_row, p.do_head, p.do_batch);
  return {make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename T::SmemLayoutQ{})),
          make_tma_copy(SM90_TMA_LOAD{}, dout, take<0, 2>(typename T::SmemLayoutdO{})), q.shape(), dout.shape()};
}

// The (head, query tile) pairs a key block visits, and how each is masked: the heads of its part of
// the GQA group in turn, each head's query tiles from m_lo on. Without kVariant every tile of the
// rows' range is visited (causal and window ranges have no gaps), a tile is cut where the mask does
// not cover it or it runs past the sequence's keys, and the loader warp, the consumers and the dQ
// writer each walk the pairs themselves (handed over instead, the pairs spilled more of the
// consumers' registers than the walk takes). With kVariant, tile_mask decides, skipping what chunks,
// document ids or a block mask leave out; the loader warp alone walks, its lanes testing 32 pairs at
// a time (one load latency per 32 skipped), and hands each pair to the consumers with its stage,
// and they to the writer with its dQ.
template <int kBlockM, int kBlockN, bool kVariant>
struct BwdWalk {
  const FwdParams& f;
  Variant var;  // a copy: behind a reference it would live in local memory
  int b, n0, sq, sk, m_lo, m_end, h0, h_end;
  int m_first;  // without kVariant, the row each head's walk starts at (wrapping to m_lo at m_end)

  __device__ TileMask mode(int h, int m0) const {
    const int m1 = min(m0 + kBlockM, sq);
    if constexpr (kVariant) return tile_mask<kBlockN, true>(f, var, b, h, m0, m1, n0, sk);
    const bool cut = !var.mask.block_full(m0, m1, n0, n0 + kBlockN) || n0 + kBlockN > sk;
    return cut ? TileMask::rules : TileMask::none;
  }
  // The pair k tiles after x (x.m0 may be one tile before m_lo), the heads in turn.
  __device__ BwdPair step(const BwdPair& x, int k) const {
    const int per = m_end / kBlockM - m_lo;  // query tiles per head, > 0 where there is a pair
    const int i = (x.h - h0) * per + x.m0 / kBlockM - m_lo + k;
    return {h0 + i / per, (m_lo + i % per) * kBlockM, TileMask::skip};
  }
  // The first visited pair after x. With kVariant, every lane of the calling warp must call it.
  __device__ BwdPair after(BwdPair x) const {
    if constexpr (kVariant) {
      if (h_end == h0) return {h_end, 0, TileMask::skip};
      for (const int lane = threadIdx.x % 32;; x = step(x, 32)) {
        BwdPair c = step(x, lane + 1);
        const bool end = c.h >= h_end;
        if (!end) c.mode = mode(c.h, c.m0);
        const unsigned hit = __ballot_sync(0xffffffffu, end || c.mode != TileMask::skip);
        if (hit != 0) {  // the first lane's pair: visited, or past the end
          const int l = __ffs(hit) - 1;
          return {__shfl_sync(0xffffffffu, c.h, l), __shfl_sync(0xffffffffu, c.m0, l),
                  static_cast<TileMask>(__shfl_sync(0xffffffffu, int(c.mode), l))};
        }
      }
    } else {  // its mode is found where it is used
      x.m0 += kBlockM;
      if (x.m0 >= m_end) x.m0 = m_lo * kBlockM;
      if (x.m0 == m_first) ++x.h;
      return x;
    }
  }
  __device__ BwdPair first() const {
    if constexpr (kVariant) return after({h0, (m_lo - 1) * kBlockM, TileMask::skip});
    return {h0, m_first, TileMask::skip};
  }
  __device__ bool done(const BwdPair& x) const { return x.h >= h_end; }
};

// Where key block n_block's walk starts in each head, from the tiles [m_lo, m_end / kBlockM). Where
// every key block walks every query tile (no mask, or one that leaves this block's keys to every
// row), each starts n_block tiles in, so that the blocks running together add their dQ to different
// tiles rather than all to the same one at once (their Q and dO tiles, a few MB, stay in L2 between
// readers). Not in the deterministic mode, whose turns need the key blocks to meet each tile in
// order.
template <int kBlockM, bool kDeterministic>
__device__ __forceinline__ int walk_first_row(int m_lo, int m_end, int row_lo, int row_hi, int sq, int n_block) {
  const int tiles = m_end / kBlockM - m_lo;
  const bool rotate = !kDeterministic && row_lo == 0 && row_hi >= sq && tiles > 0;
  return (m_lo + (rotate ? n_block % tiles : 0)) * kBlockM;
}

// Zeroes rows [first, kBlockM) of a Q or dO stage. Varlen only: a tile past a sequence's last row
// holds the next sequence's rows, and a zero probability times a non-finite value would still make
// a NaN. Each consumer warpgroup writes the same zeros before its own products read the stage.
template <int kCols, class S>
__device__ __forceinline__ void zero_stage_rows(S&& stage, int first, int tw, int rows) {
  constexpr int kChunks = kCols / 8;
  for (int i = tw; i < (rows - first) * kChunks; i += 128) {
    const int r = first + i / kChunks, c = i % kChunks;
    *reinterpret_cast<uint128_t*>(&stage(r, c * 8)) = uint128_t{0, 0};
  }
}
template <class T, class SQ, class SdO>
__device__ __forceinline__ void zero_rows(SQ&& sQ, SdO&& sdO, int first, int tw, int wg) {
  zero_stage_rows<T::kHeadDim>(sQ, first, tw, T::kBlockM);
  zero_stage_rows<T::kHeadDimV>(sdO, first, tw, T::kBlockM);
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(128, kBwdBarrierWarpGroup + wg);
}

// Adds a wgmma accumulator tile (M x N, fp32) into fp32 rows from row0 on (a GQA group's parts of
// dK or dV; dst: row0's first column; columns placed by dq_column) with 16-byte reductions, half as many as 8-byte ones: a
// thread holds column pairs (2q, 2q+1) of each 8-column group, so lanes q = 2j, 2j+1 trade pairs
// and each adds 4 adjacent columns, of the even group or the odd one. Rows at or past rows_left are
// skipped (every lane still takes part in the trades).
template <int kCols, class Acc, class C>
__device__ __forceinline__ void add_acc_quads(const Acc& acc, float* dst, std::int64_t row0, const C& coord,
                                              int rows_left) {
  const bool odd = threadIdx.x & 1;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(acc); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<2>(acc); ++n) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTE_UNROLL
        for (int grp = 0; grp < size<0, 2>(acc); grp += 2) {
          auto at = [&](int c, int gr) { return make_coord(make_coord(c, r, gr), m, n); };
          // Register indices stay compile-time constants (a lane-dependent index would move acc
          // to local memory): both groups are read, and the lane's parity selects.
          const float e0 = acc(at(0, grp)), e1 = acc(at(1, grp)), o0 = acc(at(0, grp + 1)), o1 = acc(at(1, grp + 1));
          const int mine = odd ? grp + 1 : grp;
          const float sx = __shfl_xor_sync(0xffffffffu, odd ? e0 : o0, 1);
          const float sy = __shfl_xor_sync(0xffffffffu, odd ? e1 : o1, 1);
          const float4 v = odd ? make_float4(sx, sy, o0, o1) : make_float4(e0, e1, sx, sy);
          const int row = get<0>(coord(at(0, mine))), col = get<1>(coord(at(0, mine))) - (odd ? 2 : 0);
          if (row < rows_left)
            atomicAdd(reinterpret_cast<float4*>(dst + row * kCols + dq_column(row0 + row, col)), v);
        }
      }
    }
  }
}

// A split group's dK, dV into the fp32 rows (add: the consumers' additions; sync: their barrier).
// The deterministic mode adds them part by part: each part waits for the parts below it (launched
// before it: bwd_block), so every sum is taken in one order; its additions complete before it
// passes the turn on.
template <bool kDeterministic, class Add, class Sync>
__device__ __forceinline__ void add_dkv(const BwdParams& p, int hk, std::int64_t key_base, int b, int n0, int part,
                                        Add add, Sync sync) {
  int* const turn = kDeterministic ? p.dkv_turns + dkv_turn_index(p, hk, key_base, b, n0) : nullptr;
  const bool first = threadIdx.x == cutlass::NumThreadsPerWarpGroup;  // the consumers' first thread
  if constexpr (kDeterministic) {
    if (first) {
      wait_for_primary();  // the D kernel zeroes the turns
      turn_wait(turn, part);
    }
    sync();
  }
  add();
  if constexpr (kDeterministic) {
    __threadfence();
    sync();
    if (first) turn_pass(turn);
  }
}

// The loader warp: per iteration it waits for the stage's Q half to be free, starts Q's TMA copy
// (lane 0) and stores the rows' LSE (every lane), then the same for dO and D, each half on barriers
// of its own. Rows past the sequence get LSE = -inf, D = 0, so their probabilities are 0; batched
// rows past the sequence arrive from TMA as zeros.
template <class T, class W, class SQ, class SdO>
__device__ __forceinline__ void bwd_sm90_load(const BwdParams& p, const BwdTmaSm90<T>& tma, const BwdSeq& s, int b,
                                              const W& w, SQ& sQ, SdO& sdO, float* rows, BwdBarriersSm90& bars,
                                              int lane) {
  constexpr int kBlockM = T::kBlockM;
  using TileQ = Shape<Int<kBlockM>, Int<T::kHeadDim>>;
  using TiledO = Shape<Int<kBlockM>, Int<T::kHeadDimV>>;
  const FwdParams& f = p.fwd;
  const int bt = get<3>(tma.q_shape) == 1 ? 0 : b;  // varlen: one packed batch entry
  auto cq = tma.q.get_slice(_0{});
  auto cdo = tma.dout.get_slice(_0{});
  Tensor tQs = cq.partition_D(sQ);  // (TMA, _1, _1, stages)
  Tensor tdOs = cdo.partition_D(sdO);
  constexpr int kRowsPerLane = kBlockM / 32;
  static_assert(kBlockM % 32 == 0);
  wait_for_primary();  // D's rows
  int t = 0;
  for (BwdPair x = w.first();; x = w.after(x), ++t) {
    const int st = t & 1, h = x.h, m0 = x.m0, ph = ((t >> 1) + 1) & 1;
    // The rows' LSE and D are read from global memory before the waits, which their latency hides.
    float l[kRowsPerLane], d[kRowsPerLane];
    if (!w.done(x)) {
      CUTE_UNROLL
      for (int i = 0; i < kRowsPerLane; ++i) {
        const int r = m0 + lane + 32 * i;
        l[i] = r < s.sq ? f.lse[b * f.lse_batch + h * f.lse_head + std::int64_t(s.q_start + r) * f.lse_row] : -INFINITY;
        d[i] = r < s.sq ? p.dsum[h * p.rows_total + s.row_base + r] : 0.f;
      }
    }
    if (t >= 2) bars.empty_q[st].wait(ph);
    if (w.done(x)) {  // the stage carries the end of the walk, and nothing else
      if (lane == 0) bars.pair[st].h = -1;
      asm volatile("" ::: "memory");  // the store stays ahead of the arrive (release)
      bars.full_q[st].arrive();
      return;
    }
    const auto tile = make_coord(m0 / kBlockM, _0{});
    if (lane == 0) {
      bars.pair[st] = x;
      Tensor mQ = tma.q.get_tma_tensor(tma.q_shape)(_, _, h, bt);
      Tensor gQ = local_tile(domain_offset(make_coord(s.q_start, _0{}), mQ), TileQ{}, tile);
      bars.full_q[st].expect_transaction(T::kTileQ * int(sizeof(typename T::Element)));
      copy(tma.q.with(reinterpret_cast<std::uint64_t&>(bars.full_q[st]), 0), cq.partition_S(gQ), tQs(_, _, _, st));
    }
    float* lse = rows + st * 2 * kBlockM;
    CUTE_UNROLL
    for (int i = 0; i < kRowsPerLane; ++i) lse[lane + 32 * i] = l[i];
    asm volatile("" ::: "memory");
    bars.full_q[st].arrive();
    if (t >= 2) bars.empty_do[st].wait(ph);
    if (lane == 0) {
      Tensor mdO = tma.dout.get_tma_tensor(tma.do_shape)(_, _, h, bt);
      Tensor gdO = local_tile(domain_offset(make_coord(s.q_start, _0{}), mdO), TiledO{}, tile);
      bars.full_do[st].expect_transaction(T::kTiledO * int(sizeof(typename T::Element)));
      copy(tma.dout.with(reinterpret_cast<std::uint64_t&>(bars.full_do[st]), 0), cdo.partition_S(gdO),
           tdOs(_, _, _, st));
    }
    CUTE_UNROLL
    for (int i = 0; i < kRowsPerLane; ++i) lse[kBlockM + lane + 32 * i] = d[i];
    asm volatile("" ::: "memory");
    bars.full_do[st].arrive();
  }
}

// Step t's pair, taken behind the wait on its stage's barrier `full` (one of kStages used in turn):
// the one published beside the barrier (kVariant: the loader alone walks the pairs; h < 0 ends the
// walk), or else x itself, the walk w that the caller follows. False once the walk has ended.
template <bool kVariant, int kStages = 2, class W>
__device__ __forceinline__ bool take_pair(cutlass::arch::ClusterBarrier& full, const BwdPair& published, const W& w,
                                          BwdPair& x, int t) {
  if constexpr (kVariant) {
    full.wait((t / kStages) & 1);
    asm volatile("" ::: "memory");  // the pair is read behind the wait (acquire)
    x = published;
    return x.h >= 0;
  } else {
    if (w.done(x)) return false;
    full.wait((t / kStages) & 1);
    return true;
  }
}

// dQ staging buffer buf (fp32, kHeadDim floats a row): its first kBlockM / 2 rows from lo, the rest
// from hi; in the stage's Q and dO buffers where kDqInStage, else in the buffers at kOffsetDq.
struct DqStage {
  float* lo;
  float* hi;
};
template <class T>
__device__ __forceinline__ DqStage dq_stage(char* smem, int buf) {
  constexpr int kE = int(sizeof(typename T::Element));
  if constexpr (T::kDqInStage) {
    return {reinterpret_cast<float*>(smem + T::kOffsetQ + buf * T::kTileQ * kE),
            reinterpret_cast<float*>(smem + T::kOffsetdO + buf * T::kTiledO * kE)};
  } else {
    float* d = reinterpret_cast<float*>(smem + T::kOffsetDq) + buf * T::kDqTile;
    return {d, d + T::kDqTile / 2};
  }
}

// A consumer thread's part of step t's dQ tile (fp32, columns placed by dq_column) into staging
// buffer t % kDqStages: in buffers of its own once the writer has read what the buffer last held;
// in the stage, once every consumer is done with it.
template <class T, class Acc, class C>
__device__ __forceinline__ void stage_dq(const Acc& acc_dq, const C& cdq, char* smem, std::int64_t dq_row0, int t,
                                         BwdBarriersSm90& bars) {
  const int buf = t % T::kDqStages;
  if constexpr (!T::kDqInStage) {
    if (t >= T::kDqStages) bars.dq_empty[buf].wait((t / T::kDqStages + 1) & 1);
  }
  const DqStage d = dq_stage<T>(smem, buf);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); i += 2) {
    const int row = get<0>(cdq(i)), col = get<1>(cdq(i));
    float* r = d.lo + row * T::kHeadDim;
    if constexpr (T::kDqInStage) r = row < T::kBlockM / 2 ? r : d.hi + (row - T::kBlockM / 2) * T::kHeadDim;
    *reinterpret_cast<float2*>(r + dq_column(dq_row0 + row, col)) = make_float2(acc_dq(i), acc_dq(i + 1));
  }
}

// The dQ writer thread: moves each staged query tile (its pair handed over by the consumers) into
// the fp32 dQ rows with one bulk copy (two in the stage: its halves) and frees the buffer, or the
// stage, once it is read. The rows start unwritten (no pass zeroes them): the first key block to
// reach a tile stores it and the others add to it, which the tile's turn counter (dq_turn_index)
// orders; a nonzero counter also tells the conversion that the tile was written (a 128-row tile
// marks its second 64 rows' counter too). The default mode takes a ticket from the counter: the
// first stores and passes kDqStored once the store has landed, the others wait for that, then
// add. The deterministic mode waits for the tile's turn (every later key block that sees the tile
// adds first: those up to the tile's last key; turn 0 stores) and passes it once its copy has
// landed: while the next tile's runs, or (T::kPassEarly) as soon as the next tile's dQ is handed
// over.
inline constexpr int kDqStored = 1 << 24;  // above any count of key blocks
template <class T, bool kDeterministic, bool kVariant, class W>
__device__ __forceinline__ void bwd_sm90_write_dq(const BwdParams& p, const BwdSeq& s, int b, const W& w,
                                                  int n_block, char* smem, BwdBarriersSm90& bars) {
  constexpr int kBlockM = T::kBlockM;
  wait_for_primary();  // the D kernel zeroes the turns
  int* passing = nullptr;
  BwdPair x = w.first();
  for (int t = 0;; ++t) {
    const int buf = t % T::kDqStages;
    if (!take_pair<kVariant, T::kDqStages>(bars.dq_full[buf], bars.dq_pair[buf], w, x, t)) break;
    const int h = x.h, m0 = x.m0;
    float* dq = p.dq_accum + (h * p.rows_total + s.row_base + m0) * T::kHeadDim;
    int* const turn = p.dq_turns + dq_turn_index(p, h, s.row_base, b, m0);
    const DqStage d = dq_stage<T>(smem, buf);
    const int rows = min(kBlockM, s.sq - m0);
    // In the stage, each half is a group of its own, so that the Q half is freed for the loader
    // as soon as it is read.
    constexpr int kRow = T::kHeadDim * int(sizeof(float)), kHalf = kBlockM / 2;
    const bool two = T::kDqInStage && rows > kHalf;
    auto move = [&](bool store) {
      auto part = [&](float* to, const float* from, int bytes) {
        if (store)
          bulk_store(to, from, bytes);
        else
          bulk_reduce_add_f32(to, from, bytes);
        bulk_commit();
      };
      part(dq, d.lo, (T::kDqInStage ? min(rows, kHalf) : rows) * kRow);
      if (two) part(dq + kHalf * T::kHeadDim, d.hi, (rows - kHalf) * kRow);
      if (store) {
        for (int r = kDqTurnRows; r < rows; r += kDqTurnRows) atomicAdd(turn + r / kDqTurnRows, 1);
      }
    };
    if constexpr (kDeterministic) {
      if (T::kPassEarly && passing != nullptr) {
        bulk_wait<0>();
        turn_pass(passing);
        passing = nullptr;
      }
      const int order = (w.var.key_end(min(m0 + kBlockM, s.sq) - 1) - 1) / T::kBlockN - n_block;
      turn_wait(turn, order);
      move(order == 0);
      if (passing != nullptr) {  // the previous tile's copies have landed
        if (two)
          bulk_wait<2>();
        else
          bulk_wait<1>();
        turn_pass(passing);
      }
      passing = turn;
    } else if (atomicAdd(turn, 1) == 0) {
      move(true);
      bulk_wait<0>();
      turn_pass(turn, kDqStored);
    } else {
      turn_wait(turn, kDqStored);
      move(false);
    }
    if constexpr (T::kDqInStage) {
      if (two)
        bulk_wait_read<1>();
      else
        bulk_wait_read<0>();
      bars.empty_q[buf].arrive();
      bulk_wait_read<0>();
      bars.empty_do[buf].arrive();
    } else {
      bulk_wait_read<0>();
      bars.dq_empty[buf].arrive();
    }
    if constexpr (!kVariant) x = w.after(x);
  }
  bulk_wait<0>();
  if (kDeterministic && passing != nullptr) turn_pass(passing);
}

// A block's key block, sequence and (KV head, group part). Key blocks are the fastest index but
// within a launch group of pairs (sequence, head part) sized by the host, where the pairs are the
// fastest: blocks running together share their Q and dO (and dQ rows) in L2, which the tiles'
// products need (making the key block the slowest index over every pair, to start every head's
// longest causal blocks first, halved causal speed at 2k tokens: bench/notes/backward.md), and a
// group starts its longest causal blocks first. The deterministic mode runs key blocks last to
// first: each query tile's dQ is added in that order, so a block only waits for blocks that started
// before it (no wait on one that has no SM yet), and under a causal mask for blocks that reached the
// tile earlier (they start lower). It takes them p.det_chain at a time over every (sequence, head),
// so that the blocks running together wait down chains of that many blocks, not down one head's
// whole row (the host's det_chain says when each pays).
struct BwdBlock {
  int n, b, z;
};
template <bool kDeterministic>
__device__ __forceinline__ BwdBlock bwd_block(const BwdParams& p) {
  if constexpr (!kDeterministic) {
    const int keys = gridDim.x, pairs = gridDim.y * gridDim.z;
    const int i = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);  // launch order
    const int group = max(1, min(p.group_blocks / keys, pairs));
    const int first = i / (group * keys) * group, size = min(group, pairs - first);  // the group's pairs
    const int r = i - first * keys, yz = first + r % size;
    return {r / size, yz % int(gridDim.y), yz / int(gridDim.y)};
  } else {
    const int keys = gridDim.x, pairs = gridDim.y * gridDim.z, chain = min(p.det_chain, keys);
    const int i = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);  // launch order
    const int whole = keys / chain * chain;  // key blocks in whole chunks
    int k, yz;
    if (i < whole * pairs) {
      const int r = i % (chain * pairs);
      k = i / (chain * pairs) * chain + r % chain;
      yz = r / chain;
    } else {
      const int rest = keys - whole, r = i - whole * pairs;
      k = whole + r % rest;
      yz = r / rest;
    }
    return {keys - 1 - k, yz % int(gridDim.y), yz / int(gridDim.y)};
  }
}

// Key block n_block's walk over the (head, query tile) pairs of its (KV head, group part) z: the
// query tiles whose rows see its keys, in each head of its part of the group.
template <int kBlockM, int kBlockN, bool kVariant, bool kDeterministic>
__device__ __forceinline__ BwdWalk<kBlockM, kBlockN, kVariant> bwd_walk(const BwdParams& p, const BwdSeq& s,
                                                                        const Variant& var, int b, int z, int n_block) {
  const FwdParams& f = p.fwd;
  const int n0 = n_block * kBlockN, n1 = min(n0 + kBlockN, s.sk);
  // A block mask's fully visible blocks take no element mask: any row may see these keys.
  const bool blocks = kVariant && f.blocks.state != nullptr;
  const int row_lo = blocks ? 0 : var.row_begin(n0), row_hi = blocks ? s.sq : var.row_end(n1);
  const int m_lo = row_lo / kBlockM;
  const int m_end = row_hi > row_lo ? (row_hi + kBlockM - 1) / kBlockM * kBlockM : m_lo * kBlockM;
  const int heads = f.group / p.group_parts;  // the group's heads this block walks
  const int h0 = z / p.group_parts * f.group + z % p.group_parts * heads;
  return {f, var, b, n0, s.sq, s.sk, m_lo, m_end, h0, m_end > m_lo * kBlockM ? h0 + heads : h0,
          walk_first_row<kBlockM, kDeterministic>(m_lo, m_end, row_lo, row_hi, s.sq, n_block)};
}

// Thread 0 readies the block's barriers and the TMA descriptors.
template <class T>
__device__ __forceinline__ void bwd_sm90_init(BwdBarriersSm90& bars, const BwdTmaSm90<T>& tma) {
  for (int i = 0; i < 2; ++i) {
    bars.full_q[i].init(32);
    bars.full_do[i].init(32);
    bars.empty_q[i].init(T::kDqInStage ? 1 : T::kConsumers);  // the writer frees a stage that held dQ
    bars.empty_do[i].init(T::kDqInStage ? 1 : T::kConsumers);
    bars.dq_full[i].init(T::kConsumers);
    bars.dq_empty[i].init(1);
  }
  cute::prefetch_tma_descriptor(tma.q.get_tma_descriptor());
  cute::prefetch_tma_descriptor(tma.dout.get_tma_descriptor());
}

// The producer warpgroup, its registers given to the consumers: the loader warp and the dQ writer.
template <class T, bool kDeterministic, bool kVariant, class W, class SQ, class SdO>
__device__ __forceinline__ void bwd_sm90_produce(const BwdParams& p, const BwdTmaSm90<T>& tma, const BwdSeq& s, int b,
                                                 const W& w, int n_block, SQ& sQ, SdO& sdO, float* rows, char* smem,
                                                 BwdBarriersSm90& bars, int tid) {
  cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
  if (tid < 32) bwd_sm90_load<T>(p, tma, s, b, w, sQ, sdO, rows, bars, tid);
  if (tid == 32) bwd_sm90_write_dq<T, kDeterministic, kVariant>(p, s, b, w, n_block, smem, bars);
}

// kMods, kVariant: as in the portable kernels (bwd_kernel.cuh, key_tiles.cuh). The variant's
// instantiation is not deterministic: a block mask's visited key blocks per query tile, which the
// turns count, are not a range. Launched as the D kernel's programmatic dependent (bwd_launch.cuh):
// K, V and the barriers are readied while that kernel ends, and what it writes (D, the turns) is
// read only behind wait_for_primary (the loader, the writer, add_dkv).
template <class T, bool kMods, bool kDeterministic, bool kVariant>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_kernel_sm90(const __grid_constant__ BwdParams p, const __grid_constant__ BwdTmaSm90<T> tma) {
  static_assert(!kDeterministic || !kVariant);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename T::Element;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kConsumers = T::kConsumers;
  extern __shared__ __align__(1024) char smem_bwd_sm90[];
  allow_dependent_launch();  // the dQ conversion waits for the whole kernel on the device
  const FwdParams& f = p.fwd;
  const BwdBlock blk = bwd_block<kDeterministic>(p);
  const int n_block = blk.n, b = blk.b, hk = blk.z / p.group_parts, tid = threadIdx.x;
  const BwdSeq s(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= s.sk) {
    wait_for_primary();  // so that the kernel ends after the D kernel, whatever its blocks do
    return;
  }
  Variant var = restricted<kVariant>(s.var);
  // The dense mask, where there is one, is per query head: the walk needs only whether there is
  // one (the group's first head's); the consumers set each tile's head below.
  if constexpr (kVariant) set_dense_mask(f, var, b, hk * f.group);
  const auto w = bwd_walk<kBlockM, kBlockN, kVariant, kDeterministic>(p, s, var, b, blk.z, n_block);

  auto smem = [&](int bytes) { return make_smem_ptr(reinterpret_cast<Element*>(smem_bwd_sm90 + bytes)); };
  constexpr int kE = int(sizeof(Element));
  Tensor sK = make_tensor(smem(0), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(smem(T::kTileKV * kE), typename T::SmemLayoutV{});
  Tensor sQ = make_tensor(smem(T::kOffsetQ), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(smem(T::kOffsetdO), typename T::SmemLayoutdO{});
  Tensor sdSt = make_tensor(smem(T::kOffsetdSt), typename T::SmemLayoutdSt{});
  Tensor sPt = make_tensor(smem(T::kOffsetPt), typename T::SmemLayoutdSt{});  // where split
  Tensor sQt = make_tensor(sQ.data(), typename T::SmemLayoutQt{});
  Tensor sdOt = make_tensor(sdO.data(), typename T::SmemLayoutdOt{});
  Tensor sKt = make_tensor(sK.data(), typename T::SmemLayoutKt{});
  Tensor sdS = make_tensor(sdSt.data(), typename T::SmemLayoutdS{});
  float* rows = reinterpret_cast<float*>(smem_bwd_sm90 + T::kOffsetRows);  // per stage: LSE, D
  auto& bars = *reinterpret_cast<BwdBarriersSm90*>(smem_bwd_sm90 + T::kOffsetBarriers);

  const int warp_group = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (warp_group > 0) {  // the consumers load K and V at once (rows past the sequence zeroed)
    load_key_tile<T>(f, s, b, hk, n0, sK, sV, tid - 128);
    cp_async_fence();
  }
  if (tid == 0) bwd_sm90_init<T>(bars, tma);
  __syncthreads();  // barriers initialized

  if (warp_group == 0) {
    bwd_sm90_produce<T, kDeterministic, kVariant>(p, tma, s, b, w, n_block, sQ, sdO, rows, smem_bwd_sm90, bars, tid);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();
  const int tc = tid - 128, wg = tc / 128, tw = tc % 128;

  typename T::MmaSdP mma_sdp;
  typename T::MmaKV mma_kv;
  typename T::MmaV mma_v;
  typename T::MmaQ mma_q;
  auto tsdp = mma_sdp.get_thread_slice(tc);
  auto tkv = mma_kv.get_thread_slice(tc);
  auto tv = mma_v.get_thread_slice(tc);
  auto tq = mma_q.get_thread_slice(tc);
  using TileS = Shape<Int<kBlockN>, Int<kBlockM>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileV = Shape<Int<kBlockN>, Int<T::kHeadDimV>>;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  // Operand descriptors, per stage or buffer where the operand has two.
  Tensor dK_a = tsdp.partition_fragment_A(sK);
  Tensor dV_a = tsdp.partition_fragment_A(sV);
  Tensor dQ_b = tsdp.partition_fragment_B(sQ);
  Tensor ddO_b = tsdp.partition_fragment_B(sdO);
  Tensor ddOt_b = tv.partition_fragment_B(sdOt);
  Tensor dQt_b = tkv.partition_fragment_B(sQt);
  Tensor ddS_a = tq.partition_fragment_A(sdS);
  Tensor dKt_b = tq.partition_fragment_B(sKt);

  Tensor acc_dk = partition_fragment_C(mma_kv, TileKV{});
  Tensor acc_dv = partition_fragment_C(mma_v, TileV{});
  clear(acc_dk);
  clear(acc_dv);
  Tensor acc_s = partition_fragment_C(mma_sdp, TileS{});
  Tensor acc_dp = partition_fragment_C(mma_sdp, TileS{});
  Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  Tensor dp_rc = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));
  Tensor cS = tsdp.partition_C(make_identity_tensor(TileS{}));
  Tensor c = make_tensor(cS.data(), rowcol(cS.layout()));
  auto st_ds = make_tiled_copy_C(typename T::StoreAtom{}, mma_sdp);
  auto st_ds_thr = st_ds.get_thread_slice(tc);
  Tensor cdq = tq.partition_C(make_identity_tensor(TileQ{}));

  cp_async_wait<0>();
  cutlass::arch::fence_view_async_shared();
  NamedBarrier::sync(kConsumers, kBwdBarrierConsumers);  // K and V have landed

  int t = 0;
  BwdPair x{};
  if constexpr (!kVariant) x = w.first();
  for (;; ++t) {
    const int st = t & 1, buf = t & 1;
    if (!take_pair<kVariant>(bars.full_q[st], bars.pair[st], w, x, t)) break;
    const int h = x.h, m0 = x.m0;
    const BwdHead hd(f, b, h);
    const int phase = (t >> 1) & 1;
    if (f.cu_q != nullptr && m0 + kBlockM > s.sq) {
      bars.full_do[st].wait(phase);
      zero_rows<T>(sQ(_, _, st), sdO(_, _, st), s.sq - m0, tw, wg);
    }

    gemm_wg<true>(mma_sdp, dK_a, dQ_b(_, _, _, st), acc_s);
    bars.full_do[st].wait(phase);  // S^T's product is in flight
    gemm_wg<true>(mma_sdp, dV_a, ddO_b(_, _, _, st), acc_dp);
    // The rows' LSE and D are read only where needed: held across the products, they would spill.
    constexpr int kCols = decltype(size<1>(s_rc))::value;
    const float* lse = rows + st * 2 * kBlockM;
    Tensor dsc = make_tensor<float>(shape(s_rc));
    warpgroup_wait<1>();  // S^T is done; dP^T runs on
    if constexpr (kVariant) {
      Variant head_var = var;
      set_dense_mask(f, head_var, b, h);
      scores_to_pt<kMods>(f, head_var, hd, x.mode, n0, m0, s_rc, dsc, c, TileLse<kCols>(c, lse));
    } else
      scores_to_pt<kMods>(f, var.mask, hd, w.mode(h, m0), n0, m0, s_rc, dsc, c, TileLse<kCols>(c, lse));
    warpgroup_wait<0>();
    dpt_to_dst<kMods>(f, hd, n0, m0, s_rc, dp_rc, dsc, c, TileDsum<kCols>(c, lse + kBlockM));

    Tensor rPt = convert<Element>(acc_s);
    Tensor rdSt = convert<Element>(acc_dp);
    if constexpr (T::kSplitD) {
      copy(st_ds, st_ds_thr.retile_S(rPt), st_ds_thr.partition_D(sPt(_, _, buf)));
      copy(st_ds, st_ds_thr.retile_S(rdSt), st_ds_thr.partition_D(sdSt(_, _, buf)));
      cutlass::arch::fence_view_async_shared();
      NamedBarrier::sync(kConsumers, kBwdBarrierConsumers);  // both warpgroups' columns of P^T, dS^T are in
      gemm_wg<false>(mma_v, tv.partition_fragment_A(sPt(_, _, buf)), ddOt_b(_, _, _, st), acc_dv);
      gemm_wg<false>(mma_kv, tkv.partition_fragment_A(sdSt(_, _, buf)), dQt_b(_, _, _, st), acc_dk);
    } else {
      gemm_wg<false>(mma_v, make_tensor(rPt.data(), acc_as_a(rPt.layout())), ddOt_b(_, _, _, st), acc_dv);
      gemm_wg<false>(mma_kv, make_tensor(rdSt.data(), acc_as_a(rdSt.layout())), dQt_b(_, _, _, st), acc_dk);
      copy(st_ds, st_ds_thr.retile_S(rdSt), st_ds_thr.partition_D(sdSt(_, _, buf)));
      cutlass::arch::fence_view_async_shared();
      NamedBarrier::sync(kConsumers, kBwdBarrierConsumers);  // dS^T is complete
    }
    Tensor acc_dq = partition_fragment_C(mma_q, TileQ{});
    gemm_wg<true>(mma_q, ddS_a(_, _, _, buf), dKt_b, acc_dq);
    warpgroup_wait<0>();
    warpgroup_fence_operand(rPt);  // the products reading P^T and dS^T from registers are done
    warpgroup_fence_operand(rdSt);
    if constexpr (T::kDqInStage)
      NamedBarrier::sync(kConsumers, kBwdBarrierConsumers);  // and those reading Q, dO: dQ goes there
    else {
      bars.empty_q[st].arrive();  // and those reading Q, dO
      bars.empty_do[st].arrive();
    }

    stage_dq<T>(acc_dq, cdq, smem_bwd_sm90, h * p.rows_total + s.row_base + m0, t, bars);
    if (kVariant && tc == 0) bars.dq_pair[t % T::kDqStages] = x;
    cutlass::arch::fence_view_async_shared();
    bars.dq_full[buf].arrive();
    if constexpr (!kVariant) x = w.after(x);
  }
  if constexpr (kVariant) {  // the writer's end of the walk
    const int buf = t % T::kDqStages;
    // In the stage, the writer is done with the buffer's pair: the loader waited for it to free
    // the stage before ending the walk there.
    if (!T::kDqInStage && t >= T::kDqStages) bars.dq_empty[buf].wait((t / T::kDqStages + 1) & 1);
    if (tc == 0) bars.dq_pair[buf].h = -1;
    asm volatile("" ::: "memory");  // the store stays ahead of the arrive (release)
    bars.dq_full[buf].arrive();
  }

  // dK and dV through the K and V tiles' shared memory, once no product reads them.
  auto sync = [] { NamedBarrier::sync(kConsumers, kBwdBarrierConsumers); };
  sync();
  const std::int64_t k_row0 = s.k_start + n0;
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch + k_row0 * p.dk_row + hk * p.dk_head;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch + k_row0 * p.dv_row + hk * p.dv_head;
  Tensor gdK = make_tensor(make_gmem_ptr(dk), TileKV{}, make_stride(p.dk_row, _1{}));
  Tensor gdV = make_tensor(make_gmem_ptr(dv), TileV{}, make_stride(p.dv_row, _1{}));
  const float dk_scale = ds_scale(f);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= dk_scale;
  if (p.group_parts > 1) {  // the group's other blocks add to the same rows
    const std::int64_t key_base = f.cu_k != nullptr ? s.k_start : std::int64_t(b) * f.seqlen_k;
    const std::int64_t row0 = hk * p.rows_k_total + key_base + n0;
    add_dkv<kDeterministic>(p, hk, key_base, b, n0, blk.z % p.group_parts, [&] {
      Tensor ckv = tkv.partition_C(make_identity_tensor(TileKV{}));
      add_acc_quads<kHeadDim>(acc_dk, p.dk_accum + row0 * kHeadDim, row0, ckv, s.sk - n0);
      add_acc_quads<kHeadDim>(acc_dv, p.dv_accum + row0 * kHeadDim, row0, tv.partition_C(make_identity_tensor(TileV{})),
                              s.sk - n0);
    }, sync);
    return;
  }
  store_acc<T, typename T::MmaKV>(acc_dk, sK, gdK, s.sk - n0, f.d_qk, tc, sync);
  store_acc<T, typename T::MmaV>(acc_dv, sV, gdV, s.sk - n0, f.d_v, tc, sync);
#endif
}

}  // namespace tileattn::cuda
