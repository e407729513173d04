// The portable backward kernels (sm_80 and newer), FlashAttention-2's algorithm with the score
// tiles computed transposed (keys as rows), so that P^T and dS^T come out of the accumulators in
// the layout the dV and dK products read:
//   bwd_dkdv_kernel, one block per (key tile, sequence, KV head): keeps K_j, V_j and the dK_j, dV_j
//     accumulators on chip while the query tiles of every head of the GQA group stream by (the
//     group's sum comes free). Per query tile: S^T = K Q^T, P^T = exp(S^T - LSE), dP^T = V dO^T,
//     dS^T = P^T * (dP^T - D); dV += P^T dO, dK += dS^T Q, and, in the atomic mode, dS K is added
//     into the fp32 dQ rows.
//   bwd_dq_kernel, the deterministic mode's dQ: one block per (query tile, sequence, head) walks
//     the key tiles, recomputes dS and keeps dQ in registers (2 more tile products per tile pair
//     than the atomic mode; no order-dependent sums anywhere).
// The variant (score transform with softcap's derivative and ALiBi, visibility, the forward's
// Philox keep bits, regenerated) and the block mask follow the forward kernel: tiles neither leaves
// in are skipped, and only tiles the mask cuts pay for masking (key_tiles.cuh).
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/mask.hpp"
#include "common/philox.hpp"
#include "common/score_mod.hpp"
#include "common/variant.hpp"
#include "cuda/bwd_params.hpp"
#include "cuda/cute_utils.cuh"
#include "cuda/key_tiles.cuh"
#include "cuda/score_tile.cuh"

namespace tileattn::cuda {

using namespace cute;

// A (rows x cols) shared-memory layout read as its (cols x rows) transpose.
template <class L, int kRows, int kCols>
using TransposedLayout = decltype(composition(L{}, make_layout(Shape<Int<kCols>, Int<kRows>>{}, GenRowMajor{})));

// kWarpsSdP: warps along the keys of the S^T / dP^T tiles (the rest along the queries);
// kWarpsKV: warps along the keys of dK / dV (the rest along the head dim); kWarpsQ: warps along the
// queries of dQ. kStages: 2 double-buffers the Q / dO tiles (and K / V in the dQ kernel).
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kWarpsSdP, int kWarpsKV,
          int kWarpsQ, int kStages_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_;
  static constexpr int kHeadDimV = kHeadDim;  // V padded to Q's and K's head dim
  static constexpr int kThreads = kWarps * 32, kStages = kStages_;
  static constexpr int kChunk = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kChunk == 64 ? 3 : 2;
  static_assert(kBlockM % 64 == 0, "P^T and dS^T rows are swizzled in 64-element chunks");

  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, SM80_16x8x16_F32F16F16F32_TN,
                                   SM80_16x8x16_F32BF16BF16F32_TN>;
  template <int kRowWarps>
  using Mma = TiledMMA<MMA_Atom<MmaOp>, Layout<Shape<Int<kRowWarps>, Int<kWarps / kRowWarps>, _1>>,
                       Tile<Int<16 * kRowWarps>, Int<16 * (kWarps / kRowWarps)>, _16>>;
  using MmaSdP = Mma<kWarpsSdP>;  // (N x M)
  using MmaKV = Mma<kWarpsKV>;    // (N x D)
  using MmaQ = Mma<kWarpsQ>;      // (M x D)

  using AtomD = decltype(composition(Swizzle<kSwizzleBits, 3, 3>{},
                                     Layout<Shape<_8, Int<kChunk>>, Stride<Int<kChunk>, _1>>{}));
  using AtomM = decltype(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(AtomD{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));   // Q, dO
  using SmemLayoutKV = decltype(tile_to_shape(AtomD{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));  // K, V
  using SmemLayoutPt = decltype(tile_to_shape(AtomM{}, Shape<Int<kBlockN>, Int<kBlockM>>{}));   // P^T, dS^T
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ, kBlockM, kHeadDim>;
  using SmemLayoutKt = TransposedLayout<SmemLayoutKV, kBlockN, kHeadDim>;
  using SmemLayoutdS = TransposedLayout<SmemLayoutPt, kBlockN, kBlockM>;
  using SmemLayoutQtPlain = decltype(get_nonswizzle_portion(SmemLayoutQt{}));
  using SmemLayoutKtPlain = decltype(get_nonswizzle_portion(SmemLayoutKt{}));
  using SmemLayoutdSPlain = decltype(get_nonswizzle_portion(SmemLayoutdS{}));

  using LdsmAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using LdsmTransAtom = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  // Accumulators to shared memory: stmatrix (four 8x8 tiles per instruction) where the
  // architecture has it, else 4-byte pairs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using StoreAtom = Copy_Atom<SM90_U32x4_STSM_N, Element>;
#else
  using StoreAtom = Copy_Atom<UniversalCopy<std::uint32_t>, Element>;
#endif

  using GmemLoad = typename GmemCopies<Element, kThreads, kChunk>::Load;
  using GmemStore = typename GmemCopies<Element, kThreads, kChunk>::Store;

  static constexpr int kTileQ = kBlockM * kHeadDim, kTileKV = kBlockN * kHeadDim, kTileP = kBlockN * kBlockM;
  static constexpr int kRowBytes = 2 * kBlockM * int(sizeof(float));  // LSE and D of a query tile
  // dK/dV kernel: K, V; kStages x (Q, dO); P^T, dS^T; kStages x (LSE, D).
  static constexpr int kSmemDkdv =
      (2 * kTileKV + kStages * 2 * kTileQ + 2 * kTileP) * int(sizeof(Element)) + kStages * kRowBytes;
  // dQ kernel: Q, dO; kStages x (K, V); dS^T; LSE, D.
  static constexpr int kSmemDq =
      (2 * kTileQ + kStages * 2 * kTileKV + kTileP) * int(sizeof(Element)) + kRowBytes;
};

__device__ __forceinline__ void cp_async_4(float* dst, const float* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}

// Adds (a, b) to the adjacent floats at[0], at[1] in global memory: one 8-byte reduction where the
// architecture has it.
__device__ __forceinline__ void add_pair(float* at, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(at), make_float2(a, b));
#else
  atomicAdd(at, a);
  atomicAdd(at + 1, b);
#endif
}

// Where one sequence's rows live and its variant (without ALiBi's slope: BwdHead has the head's
// score transform).
struct BwdSeq {
  int q_start, k_start, sq, sk;
  std::int64_t row_base;  // index of the sequence's first query row in the [heads][rows_total] scratch
  Variant var;

  __device__ BwdSeq(const BwdParams& p, int b) {
    const FwdParams& f = p.fwd;
    const SeqRows r = seq_rows(f, b);
    q_start = r.q_start, k_start = r.k_start, sq = r.sq, sk = r.sk;
    row_base = f.cu_q != nullptr ? q_start : std::int64_t(b) * f.seqlen_q;
    var = sequence_variant(f, b, q_start, k_start, sq, sk);
  }
};

struct BwdHead {
  ScoreMod mod;
  unsigned bh;
  __device__ BwdHead(const FwdParams& f, int b, int h) : mod{f.scale, f.softcap, 0.f}, bh(unsigned(b * f.heads_q + h)) {
    if (f.alibi != nullptr) mod.alibi = f.alibi[b * f.alibi_batch + h * f.alibi_head];
  }
};

// Loads (cp.async) the K and V tile of key block n0 (T::kHeadDim and T::kHeadDimV columns), rows
// past the sequence and columns past the head dims zeroed.
template <class T, class SK, class SV>
__device__ __forceinline__ void load_key_tile(const FwdParams& f, const BwdSeq& s, int b, int hk, int n0, SK&& sK,
                                              SV&& sV, int tid) {
  using Element = typename T::Element;
  using TileKV = Shape<Int<T::kBlockN>, Int<T::kHeadDim>>;
  using TileV = Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>;
  const std::int64_t k_row0 = s.k_start + n0;
  const Element* k = static_cast<const Element*>(f.k) + b * f.k_batch + k_row0 * f.k_row + hk * f.k_head;
  const Element* v = static_cast<const Element*>(f.v) + b * f.v_batch + k_row0 * f.v_row + hk * f.v_head;
  Tensor gK = make_tensor(make_gmem_ptr(k), TileKV{}, make_stride(f.k_row, _1{}));
  Tensor gV = make_tensor(make_gmem_ptr(v), TileV{}, make_stride(f.v_row, _1{}));
  typename T::GmemLoad gload;
  auto gl = gload.get_thread_slice(tid);
  copy_tile<true, true, true>(gload, gl.partition_S(gK), gl.partition_D(sK), gl.partition_S(make_identity_tensor(TileKV{})),
                              s.sk - n0, f.d_qk);
  copy_tile<true, true, true>(gload, gl.partition_S(gV), gl.partition_D(sV), gl.partition_S(make_identity_tensor(TileV{})),
                              s.sk - n0, f.d_v);
}

// Loads one query tile's Q, dO (cp.async, rows past the sequence zeroed), LSE and D. Rows past
// the sequence get LSE = -inf, so that their probabilities are 0.
template <class T, class SQ, class SdO>
__device__ __forceinline__ void load_query_tile(const BwdParams& p, const BwdSeq& s, int b, int h, int m0, SQ sQ,
                                                SdO sdO, float* sLse, float* sDsum, int tid) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kHeadDim = T::kHeadDim;
  const FwdParams& f = p.fwd;
  const int rows = s.sq - m0;
  const Element* q = static_cast<const Element*>(f.q) + b * f.q_batch + std::int64_t(s.q_start + m0) * f.q_row + h * f.q_head;
  const Element* dO = static_cast<const Element*>(p.dout) + b * p.do_batch + std::int64_t(s.q_start + m0) * p.do_row +
                      h * p.do_head;
  using Tile = Shape<Int<kBlockM>, Int<kHeadDim>>;
  Tensor gQ = make_tensor(make_gmem_ptr(q), Tile{}, make_stride(f.q_row, _1{}));
  Tensor gdO = make_tensor(make_gmem_ptr(dO), Tile{}, make_stride(p.do_row, _1{}));
  typename T::GmemLoad gload;
  auto gl = gload.get_thread_slice(tid);
  Tensor c = gl.partition_S(make_identity_tensor(Tile{}));
  if (rows >= kBlockM && f.d_qk == kHeadDim && f.d_v == kHeadDim) {  // whole tiles skip the checks
    copy_tile<false, false, false>(gload, gl.partition_S(gQ), gl.partition_D(sQ), c, rows, f.d_qk);
    copy_tile<false, false, false>(gload, gl.partition_S(gdO), gl.partition_D(sdO), c, rows, f.d_v);
  } else {
    copy_tile<true, true, true>(gload, gl.partition_S(gQ), gl.partition_D(sQ), c, rows, f.d_qk);
    copy_tile<true, true, true>(gload, gl.partition_S(gdO), gl.partition_D(sdO), c, rows, f.d_v);
  }
  for (int r = tid; r < kBlockM; r += T::kThreads) {
    if (r < rows) {
      cp_async_4(sLse + r, f.lse + b * f.lse_batch + h * f.lse_head + std::int64_t(s.q_start + m0 + r) * f.lse_row);
      cp_async_4(sDsum + r, p.dsum + h * p.rows_total + s.row_base + m0 + r);
    } else {
      sLse[r] = -INFINITY;
      sDsum[r] = 0.f;
    }
  }
}

// LSE (log2 units, +inf for rows past the sequence so that their probabilities are 0) and D of
// the query columns a thread holds in an S^T tile; c: the tile's (key, query) coordinates. Either
// half alone where registers are short: P^T needs only the LSE, dS^T only D.
template <int kC>
struct TileLse {
  float lse2[kC];
  template <class C>
  __device__ __forceinline__ TileLse(const C& c, const float* sLse) {
    CUTE_UNROLL
    for (int j = 0; j < kC; ++j) {
      const float l = sLse[get<1>(c(0, j))];
      lse2[j] = l == -INFINITY ? INFINITY : l * kLog2e;
    }
  }
};
template <int kC>
struct TileDsum {
  float dsum[kC];
  template <class C>
  __device__ __forceinline__ TileDsum(const C& c, const float* sDsum) {
    CUTE_UNROLL
    for (int j = 0; j < kC; ++j) dsum[j] = sDsum[get<1>(c(0, j))];
  }
};
template <int kC>
struct TileRows : TileLse<kC>, TileDsum<kC> {
  template <class C>
  __device__ __forceinline__ TileRows(const C& c, const float* sLse, const float* sDsum)
      : TileLse<kC>(c, sLse), TileDsum<kC>(c, sDsum) {}
};

// What scores_to_pt needs of a visibility rule, for a bare Mask and for a Variant.
__device__ __forceinline__ int alibi_diag_of(const Mask& m) { return m.alibi_diag; }
__device__ __forceinline__ int alibi_diag_of(const Variant& v) { return v.mask.alibi_diag; }
__device__ __forceinline__ int keys_of(const Mask& m) { return m.seqlen_k; }
__device__ __forceinline__ int keys_of(const Variant& v) { return v.mask.seqlen_k; }

// S^T (keys x queries, as (rows, cols)) to P^T in place: modifiers (with a softcap, dsc keeps
// d(score)/d(qk) per element for dS), the mask as `mode` says (vis's element rule, or only the
// keys past the sequence), exp2 against the rows' LSE. Scores in log2 units; the plain kernel
// folds the scale into the exponent. Vis: a Mask or a Variant.
template <bool kMods, class Vis, class S, class Dsc, class C, class Rows>
__device__ __forceinline__ void scores_to_pt(const FwdParams& f, const Vis& vis, const BwdHead& hd, TileMask mode,
                                             int n0, int m0, S& s, Dsc& dsc, const C& c, const Rows& cols) {
  constexpr int kR = decltype(size<0>(s))::value, kC = decltype(size<1>(s))::value;
  if constexpr (kMods) {
    const bool softcap = f.softcap > 0.f;
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      const int key = n0 + get<0>(c(i, 0));
      CUTE_UNROLL
      for (int j = 0; j < kC; ++j) {
        const float capped = hd.mod.capped(s(i, j));
        if (softcap) dsc(i, j) = hd.mod.dscore(capped);
        s(i, j) = (capped - hd.mod.alibi_bias(m0 + get<1>(c(i, j)), key, alibi_diag_of(vis))) * kLog2e;
      }
    }
  }
  if (mode == TileMask::rules) {
    mask_scores_t(vis, n0, m0, s, c);
  } else if (mode == TileMask::limit) {
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      if (n0 + get<0>(c(i, 0)) < keys_of(vis)) continue;
      CUTE_UNROLL
      for (int j = 0; j < kC; ++j) s(i, j) = -INFINITY;
    }
  }
  const float scale_log2 = kMods ? 1.f : f.scale_log2;
  CUTE_UNROLL
  for (int i = 0; i < kR; ++i) {
    CUTE_UNROLL
    for (int j = 0; j < kC; ++j) s(i, j) = exp2f(fmaf(s(i, j), scale_log2, -cols.lse2[j]));
  }
}

// The same with a Mask that cuts the tile where `masked`.
template <bool kMods, class S, class Dsc, class C, class Rows>
__device__ __forceinline__ void scores_to_pt(const FwdParams& f, const Mask& mask, const BwdHead& hd, bool masked,
                                             int n0, int m0, S& s, Dsc& dsc, const C& c, const Rows& cols) {
  scores_to_pt<kMods>(f, mask, hd, masked ? TileMask::rules : TileMask::none, n0, m0, s, dsc, c, cols);
}

// dP^T to dS^T = P^T * (dP^T - D) in place (times d(score)/d(qk) under a softcap), with dropout's
// zeros and 1 / (1 - p) on dP and P.
template <bool kMods, class S, class Dsc, class C, class Rows>
__device__ __forceinline__ void dpt_to_dst(const FwdParams& f, const BwdHead& hd, int n0, int m0, S& s, S& dp,
                                           const Dsc& dsc, const C& c, const Rows& cols) {
  constexpr int kR = decltype(size<0>(s))::value, kC = decltype(size<1>(s))::value;
  const bool softcap = kMods && f.softcap > 0.f;
  const bool dropout = kMods && f.dropout;
  CUTE_UNROLL
  for (int i = 0; i < kR; ++i) {
    const int key = n0 + get<0>(c(i, 0));
    CUTE_UNROLL
    for (int j = 0; j < kC; ++j) {
      float d = dp(i, j);
      const float p = s(i, j);
      if (dropout) {
        const bool keep = f.drop.keep(hd.bh, unsigned(m0 + get<1>(c(i, j))), unsigned(key));
        d = keep ? d * f.drop.keep_scale : 0.f;
        s(i, j) = keep ? p * f.drop.keep_scale : 0.f;
      }
      dp(i, j) = softcap ? p * (d - cols.dsum[j]) * dsc(i, j) : p * (d - cols.dsum[j]);
    }
  }
}

// P^T and dS^T of one (key tile n0, query tile m0) pair, written to sPt (with dropout applied and
// kept values scaled by 1 / (1 - p); skipped unless kWriteP) and sdSt, in the element type. dS^T
// leaves out the softmax scale when there is no softcap (the callers apply it once, to dK and dQ).
// sK, sV, sQ, sdO are the first stage's tiles; koff and qoff (elements) select the stage, added to
// partitions built once, as no stage offset touches the swizzled bits. `mode`: how the tile is cut by
// the mask or the sequence's last key.
template <class T, bool kMods, bool kWriteP, class SK, class SQ, class SPt>
__device__ __forceinline__ void tile_grads(const FwdParams& f, const Variant& var, const BwdHead& hd, TileMask mode,
                                           int n0, int m0, const SK& sK, const SK& sV, int koff, const SQ& sQ,
                                           const SQ& sdO, int qoff, const float* sLse, const float* sDsum, SPt& sPt,
                                           SPt& sdSt, int tid) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  using TileS = Shape<Int<kBlockN>, Int<kBlockM>>;
  typename T::MmaSdP mma;
  auto tm = mma.get_thread_slice(tid);
  auto ld_a = make_tiled_copy_A(typename T::LdsmAtom{}, mma);
  auto ld_b = make_tiled_copy_B(typename T::LdsmAtom{}, mma);
  auto ld_a_thr = ld_a.get_thread_slice(tid);
  auto ld_b_thr = ld_b.get_thread_slice(tid);
  auto at = [](auto t, int off) {
    t.data() = t.data() + off;
    return t;
  };

  Tensor acc_s = partition_fragment_C(mma, TileS{});
  clear(acc_s);
  {
    Tensor rK = tm.partition_fragment_A(sK);
    Tensor rQ = tm.partition_fragment_B(sQ);
    gemm_ss(acc_s, rK, rQ, at(ld_a_thr.partition_S(sK), koff), at(ld_b_thr.partition_S(sQ), qoff), mma, ld_a, ld_b,
            tid);
  }

  Tensor s = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  Tensor cS = tm.partition_C(make_identity_tensor(TileS{}));
  Tensor c = make_tensor(cS.data(), rowcol(cS.layout()));
  TileRows<decltype(size<1>(s))::value> cols(c, sLse, sDsum);
  Tensor dsc = make_tensor<float>(shape(s));
  scores_to_pt<kMods>(f, var, hd, mode, n0, m0, s, dsc, c, cols);

  Tensor acc_dp = partition_fragment_C(mma, TileS{});
  clear(acc_dp);
  {
    Tensor rV = tm.partition_fragment_A(sV);
    Tensor rdO = tm.partition_fragment_B(sdO);
    gemm_ss(acc_dp, rV, rdO, at(ld_a_thr.partition_S(sV), koff), at(ld_b_thr.partition_S(sdO), qoff), mma, ld_a,
            ld_b, tid);
  }
  Tensor dp = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));
  dpt_to_dst<kMods>(f, hd, n0, m0, s, dp, dsc, c, cols);

  auto st = make_tiled_copy_C(typename T::StoreAtom{}, mma);
  auto st_thr = st.get_thread_slice(tid);
  if constexpr (kWriteP) {
    Tensor rP = convert<Element>(acc_s);
    copy(st, st_thr.retile_S(rP), st_thr.partition_D(sPt));
  }
  Tensor rdS = convert<Element>(acc_dp);
  copy(st, st_thr.retile_S(rdS), st_thr.partition_D(sdSt));
}

// acc += dS K for one (query tile, key tile) pair: dS read as the transpose of sdSt, K as sK's.
template <class T, class Acc, class SdSt, class SK>
__device__ __forceinline__ void tile_dq(Acc& acc, const SdSt& sdSt, const SK& sK, int koff, int tid) {
  typename T::MmaQ mma;
  auto tm = mma.get_thread_slice(tid);
  Tensor sdS = make_tensor(sdSt.data(), typename T::SmemLayoutdS{});
  Tensor sKt = make_tensor(sK.data(), typename T::SmemLayoutKt{});
  Tensor rdS = tm.partition_fragment_A(make_tensor(sdSt.data(), typename T::SmemLayoutdSPlain{}));
  Tensor rKt = tm.partition_fragment_B(make_tensor(sK.data(), typename T::SmemLayoutKtPlain{}));
  auto ld_a = make_tiled_copy_A(typename T::LdsmTransAtom{}, mma);
  auto ld_b = make_tiled_copy_B(typename T::LdsmTransAtom{}, mma);
  Tensor sKt_ld = ld_b.get_thread_slice(tid).partition_S(sKt);
  sKt_ld.data() = sKt_ld.data() + koff;
  gemm_ss(acc, rdS, rKt, ld_a.get_thread_slice(tid).partition_S(sdS), sKt_ld, mma, ld_a, ld_b, tid);
}

// A shared tile written to global memory with T's stores, rows < max_rows and columns < max_cols.
template <class T, class Stage, class G>
__device__ __forceinline__ void store_stage(Stage& stage, G& g, int max_rows, int max_cols, int tid) {
  typename T::GmemStore gstore;
  auto gs = gstore.get_thread_slice(tid);
  copy_tile<true, true, false>(gstore, gs.partition_S(stage), gs.partition_D(g),
                               gs.partition_S(make_identity_tensor(make_shape(size<0>(stage), size<1>(stage)))), max_rows,
                               max_cols);
}

// Writes a (rows x D) fp32 accumulator of `Mma` to global memory as the element type, through the
// shared tile `stage` (free for the purpose), rows < max_rows and columns < max_cols only. sync()
// waits for every thread that writes the stage (the whole block by default).
struct SyncBlock {
  __device__ void operator()() const { __syncthreads(); }
};
template <class T, class Mma, class Acc, class Stage, class G, class Sync = SyncBlock>
__device__ __forceinline__ void store_acc(const Acc& acc, Stage& stage, G& g, int max_rows, int max_cols, int tid,
                                          Sync sync = {}) {
  using Element = typename T::Element;
  Tensor r = convert<Element>(acc);
  Mma mma;
  auto st = make_tiled_copy_C(typename T::StoreAtom{}, mma);
  auto st_thr = st.get_thread_slice(tid);
  copy(st, st_thr.retile_S(r), st_thr.partition_D(stage));
  sync();
  store_stage<T>(stage, g, max_rows, max_cols, tid);
}

// kMods, kVariant: as in the forward kernel (fwd_kernel.cuh, key_tiles.cuh).
template <class T, bool kMods, bool kAtomicDq, bool kVariant>
__global__ void __launch_bounds__(T::kThreads, 1) bwd_dkdv_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kStages = T::kStages;
  constexpr int kTileQ = T::kTileQ, kTileKV = T::kTileKV, kTileP = T::kTileP;
  extern __shared__ __align__(128) char smem[];
  const FwdParams& f = p.fwd;
  const int n_block = blockIdx.x, b = blockIdx.y, hk = blockIdx.z, tid = threadIdx.x;
  const BwdSeq s(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= s.sk) return;
  const int n1 = min(n0 + kBlockN, s.sk);
  // The dense mask, where there is one, is per query head: set to each head's in turn below.
  Variant var = restricted<kVariant>(s.var);
  if constexpr (kVariant) set_dense_mask(f, var, b, hk * f.group);
  // A block mask's fully visible blocks take no element mask: any row may see these keys.
  const bool blocks = kVariant && f.blocks.state != nullptr;
  const int row_lo = blocks ? 0 : var.row_begin(n0), row_hi = blocks ? s.sq : var.row_end(n1);
  const int m_lo = row_lo / kBlockM;
  const int tiles = row_hi > row_lo ? (row_hi + kBlockM - 1) / kBlockM - m_lo : 0;

  Element* base = reinterpret_cast<Element*>(smem);
  Tensor sK = make_tensor(make_smem_ptr(base), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + kTileKV, typename T::SmemLayoutKV{});
  Element* q_base = base + 2 * kTileKV;  // kStages x (Q, dO)
  Tensor sPt = make_tensor(make_smem_ptr(q_base + kStages * 2 * kTileQ), typename T::SmemLayoutPt{});
  Tensor sdSt = make_tensor(sPt.data() + kTileP, typename T::SmemLayoutPt{});
  float* rows_base = reinterpret_cast<float*>(q_base + kStages * 2 * kTileQ + 2 * kTileP);
  auto sQ = [&](int st) { return make_tensor(make_smem_ptr(q_base + st * 2 * kTileQ), typename T::SmemLayoutQ{}); };
  auto sdO = [&](int st) {
    return make_tensor(make_smem_ptr(q_base + st * 2 * kTileQ + kTileQ), typename T::SmemLayoutQ{});
  };
  auto sLse = [&](int st) { return rows_base + st * 2 * kBlockM; };
  auto sDsum = [&](int st) { return rows_base + st * 2 * kBlockM + kBlockM; };

  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  const std::int64_t k_row0 = s.k_start + n0;
  load_key_tile<T>(f, s, b, hk, n0, sK, sV, tid);
  auto load = [&](int h, int m0, int st) {
    auto q = sQ(st);
    auto d = sdO(st);
    load_query_tile<T>(p, s, b, h, m0, q, d, sLse(st), sDsum(st), tid);
  };
  // The (head, query tile) pairs visited, heads of the group in turn, each head's query tiles from
  // m_lo on; h == h_end: none left.
  const int h_end = (hk + 1) * f.group, m_end = (m_lo + tiles) * kBlockM;
  struct Pair {
    int h, m0;
    TileMask mode;
  };
  auto after = [&](Pair x) {  // the first visited pair after x (without kVariant, the next one)
    for (;;) {
      x.m0 += kBlockM;
      if (x.m0 >= m_end) x.m0 = m_lo * kBlockM, ++x.h;
      if (x.h >= h_end) return x;
      x.mode = tile_mask<kBlockN, kVariant>(f, var, b, x.h, x.m0, min(x.m0 + kBlockM, s.sq), n0, s.sk);
      if (!kVariant || x.mode != TileMask::skip) return x;
    }
  };
  Pair pair = tiles > 0 ? after({hk * f.group, (m_lo - 1) * kBlockM, TileMask::skip}) : Pair{h_end, 0, TileMask::skip};
  if (pair.h < h_end) load(pair.h, pair.m0, 0);
  cp_async_fence();

  typename T::MmaKV mma_kv;
  auto tk = mma_kv.get_thread_slice(tid);
  Tensor acc_dk = partition_fragment_C(mma_kv, TileKV{});
  Tensor acc_dv = partition_fragment_C(mma_kv, TileKV{});
  clear(acc_dk);
  clear(acc_dv);
  auto ld_kv_a = make_tiled_copy_A(typename T::LdsmAtom{}, mma_kv);
  auto ld_kv_b = make_tiled_copy_B(typename T::LdsmTransAtom{}, mma_kv);
  Tensor rPt = tk.partition_fragment_A(sPt);
  Tensor sPt_ld = ld_kv_a.get_thread_slice(tid).partition_S(sPt);
  Tensor sdSt_ld = ld_kv_a.get_thread_slice(tid).partition_S(sdSt);
  // Q^T and dO^T of the first stage; a stage's offset is added per tile.
  Tensor q0 = sQ(0), d0 = sdO(0);
  Tensor rQt = tk.partition_fragment_B(make_tensor(q0.data(), typename T::SmemLayoutQtPlain{}));
  Tensor sQt_ld = ld_kv_b.get_thread_slice(tid).partition_S(make_tensor(q0.data(), typename T::SmemLayoutQt{}));
  Tensor sdOt_ld = ld_kv_b.get_thread_slice(tid).partition_S(make_tensor(d0.data(), typename T::SmemLayoutQt{}));

  for (int t = 0; pair.h < h_end; ++t) {
    const int h = pair.h, m0 = pair.m0;
    const Pair next = after(pair);
    const int st = kStages == 2 ? t & 1 : 0;
    cp_async_wait<0>();
    __syncthreads();  // this tile's Q, dO, LSE, D have landed; every warp is done with the last tile
    if (kStages == 2 && next.h < h_end) {
      load(next.h, next.m0, st ^ 1);
      cp_async_fence();
    }
    const BwdHead hd(f, b, h);
    if constexpr (kVariant) set_dense_mask(f, var, b, h);
    const int qoff = st * 2 * kTileQ;
    tile_grads<T, kMods, true>(f, var, hd, pair.mode, n0, m0, sK, sV, 0, q0, d0, qoff, sLse(st), sDsum(st), sPt, sdSt,
                               tid);
    __syncthreads();  // P^T and dS^T are in shared memory

    {
      Tensor sdOt = sdOt_ld;
      sdOt.data() = sdOt.data() + qoff;
      gemm_ss(acc_dv, rPt, rQt, sPt_ld, sdOt, mma_kv, ld_kv_a, ld_kv_b, tid);
      Tensor sQt = sQt_ld;
      sQt.data() = sQt.data() + qoff;
      gemm_ss(acc_dk, rPt, rQt, sdSt_ld, sQt, mma_kv, ld_kv_a, ld_kv_b, tid);
    }
    if (kStages == 1) {
      __syncthreads();  // every warp is done with Q and dO
      if (next.h < h_end) {
        load(next.h, next.m0, 0);
        cp_async_fence();
      }
    }

    if constexpr (kAtomicDq) {
      typename T::MmaQ mma_q;
      using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
      Tensor acc_dq = partition_fragment_C(mma_q, TileQ{});
      clear(acc_dq);
      tile_dq<T>(acc_dq, sdSt, sK, 0, tid);
      const std::int64_t row0 = h * p.rows_total + s.row_base + m0;
      float* dq = p.dq_accum + row0 * kHeadDim;
      Tensor cQ = mma_q.get_thread_slice(tid).partition_C(make_identity_tensor(TileQ{}));
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 2) {
        const int row = get<0>(cQ(i)), col = get<1>(cQ(i));
        if (row < s.sq - m0) add_pair(dq + row * kHeadDim + dq_column(row0 + row, col), acc_dq(i), acc_dq(i + 1));
      }
    }
    pair = next;
  }

  // dK and dV through the K and V tiles' shared memory. A block whose keys no query row sees ran
  // no iteration: its K and V copies may still be in flight.
  cp_async_wait<0>();
  __syncthreads();
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch + k_row0 * p.dk_row + hk * p.dk_head;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch + k_row0 * p.dv_row + hk * p.dv_head;
  Tensor gdK = make_tensor(make_gmem_ptr(dk), TileKV{}, make_stride(p.dk_row, _1{}));
  Tensor gdV = make_tensor(make_gmem_ptr(dv), TileKV{}, make_stride(p.dv_row, _1{}));
  const float dk_scale = ds_scale(f);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= dk_scale;
  store_acc<T, typename T::MmaKV>(acc_dk, sK, gdK, s.sk - n0, f.d_qk, tid);
  store_acc<T, typename T::MmaKV>(acc_dv, sV, gdV, s.sk - n0, f.d_v, tid);
}

template <class T, bool kMods, bool kVariant>
__global__ void __launch_bounds__(T::kThreads, 1) bwd_dq_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kStages = T::kStages;
  constexpr int kTileQ = T::kTileQ, kTileKV = T::kTileKV, kTileP = T::kTileP;
  extern __shared__ __align__(128) char smem[];
  const FwdParams& f = p.fwd;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x), b = blockIdx.y, h = blockIdx.z, tid = threadIdx.x;
  const int hk = h / f.group;
  const BwdSeq s(p, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= s.sq) return;
  const int rows = min(kBlockM, s.sq - m0);
  Variant head_var = s.var;
  if constexpr (kVariant) set_dense_mask(f, head_var, b, h);
  const Variant var = restricted<kVariant>(head_var);
  const bool blocks = kVariant && f.blocks.state != nullptr;  // any key may be visible (see bwd_dkdv_kernel)
  const int key_lo = blocks ? 0 : max(var.key_begin(m0), 0);
  const int key_hi = blocks ? s.sk : min(var.key_end(m0 + rows - 1), s.sk);
  const int n_min = key_lo / kBlockN;
  const int n_max = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_min;
  auto mode = [&](int n) { return tile_mask<kBlockN, kVariant>(f, var, b, h, m0, m0 + rows, n * kBlockN, s.sk); };

  Element* base = reinterpret_cast<Element*>(smem);
  Tensor sQ = make_tensor(make_smem_ptr(base), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(sQ.data() + kTileQ, typename T::SmemLayoutQ{});
  Element* kv_base = base + 2 * kTileQ;  // kStages x (K, V)
  Tensor sdSt = make_tensor(make_smem_ptr(kv_base + kStages * 2 * kTileKV), typename T::SmemLayoutPt{});
  float* sLse = reinterpret_cast<float*>(kv_base + kStages * 2 * kTileKV + kTileP);
  float* sDsum = sLse + kBlockM;
  auto sK = [&](int st) { return make_tensor(make_smem_ptr(kv_base + st * 2 * kTileKV), typename T::SmemLayoutKV{}); };
  auto sV = [&](int st) {
    return make_tensor(make_smem_ptr(kv_base + st * 2 * kTileKV + kTileKV), typename T::SmemLayoutKV{});
  };

  auto load_kv = [&](int n, int st) { load_key_tile<T>(f, s, b, hk, n * kBlockN, sK(st), sV(st), tid); };

  load_query_tile<T>(p, s, b, h, m0, sQ, sdO, sLse, sDsum, tid);
  Visit t = next_visited<kVariant>(n_max, n_min, mode);
  if (t.n >= n_min) load_kv(t.n, 0);
  cp_async_fence();

  typename T::MmaQ mma_q;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  Tensor acc_dq = partition_fragment_C(mma_q, TileQ{});
  clear(acc_dq);
  const BwdHead hd(f, b, h);
  Tensor k0 = sK(0), v0 = sV(0);
  for (int i = 0; t.n >= n_min; ++i) {
    const Visit next = next_visited<kVariant>(t.n, n_min, mode);
    const int st = kStages == 2 ? i & 1 : 0;
    const int n0 = t.n * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // K[n], V[n] have landed; every warp is done with the last pair
    if (kStages == 2 && next.n >= n_min) {
      load_kv(next.n, st ^ 1);
      cp_async_fence();
    }
    const int koff = st * 2 * kTileKV;
    tile_grads<T, kMods, false>(f, var, hd, t.mode, n0, m0, k0, v0, koff, sQ, sdO, 0, sLse, sDsum, sdSt, sdSt, tid);
    __syncthreads();  // dS^T is in shared memory
    tile_dq<T>(acc_dq, sdSt, k0, koff, tid);
    if (kStages == 1 && next.n >= n_min) {
      __syncthreads();  // every warp is done with K and V
      load_kv(next.n, 0);
      cp_async_fence();
    }
    t = next;
  }

  cp_async_wait<0>();  // with no key tile to visit, Q and dO may still be in flight
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq) + b * p.dq_batch + std::int64_t(s.q_start + m0) * p.dq_row + h * p.dq_head;
  Tensor gdQ = make_tensor(make_gmem_ptr(dq), TileQ{}, make_stride(p.dq_row, _1{}));
  const float dq_scale = ds_scale(f);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); ++i) acc_dq(i) *= dq_scale;
  store_acc<T, typename T::MmaQ>(acc_dq, sQ, gdQ, rows, f.d_qk, tid);
}

}  // namespace tileattn::cuda
