// The Hopper backward dK/dV kernel (sm_90a): the portable kernel's algorithm (bwd_kernel.cuh) on
// warpgroup tensor cores, atomic dQ mode. One block per (key tile, sequence, KV head) keeps the
// tile's dK, dV accumulators in registers while the query tiles of every head of the GQA group
// stream by (Q, dO, LSE, D double buffered):
//   S^T = K Q^T and dP^T = V dO^T from shared memory (issued together; P^T is formed while dP^T
//   is still in flight), dV += P^T dO, dK += dS^T Q, and dQ += dS K with dS^T through shared
//   memory (the warpgroups split dQ's head dim), added into the fp32 dQ rows: staged in shared
//   memory and added by one bulk reduction per tile up to head dim 128, by 16-byte atomics beyond.
// The deterministic mode (up to head dim 128) orders each query tile's bulk additions by key block
// through a turnstile per (head, query tile), so the sums come out the same on every run.
// Up to head dim 128 each warpgroup owns 64 keys and multiplies P^T and dS^T straight from its
// registers. Beyond, 64 keys' dK and dV alone would take 256 registers a thread, so two warpgroups
// share 64 keys: they split S^T's query columns and dK's, dV's head dim, and exchange P^T and dS^T
// through shared memory.
// Shared memory uses wgmma's 128-byte swizzled layouts; the transposed operands (dO^T, Q^T, K^T,
// dS) are views read by the transposing (MN-major) operand modes, without copies.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/bulk_reduce.cuh"
#include "cuda/bwd_kernel.cuh"
#include "cuda/cute_utils.cuh"

namespace tileattn::cuda {

using namespace cute;

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_>
struct BwdTraitsSm90 {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr bool kSplitD = kHeadDim > 128;
  static constexpr int kWarpGroups = kSplitD ? 2 : kBlockN / 64;
  static constexpr int kThreads = kWarpGroups * 128;
  static_assert(kHeadDim % 32 == 0 && kBlockM % 64 == 0 && kBlockN % 64 == 0 && (!kSplitD || kBlockN == 64));

  using SplitRows = Layout<Shape<Int<kWarpGroups>, _1, _1>>;
  using SplitCols = Layout<Shape<_1, Int<kWarpGroups>, _1>>;
  // (N x M) = K Q^T and V dO^T.
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockN>, Int<kBlockM / (kSplitD ? kWarpGroups : 1)>, Int<kHeadDim>>>(),
      std::conditional_t<kSplitD, SplitCols, SplitRows>{}));
  // (N x D) += P^T dO and dS^T Q: A from registers, or from shared memory where split.
  using MmaKV = std::conditional_t<
      kSplitD,
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float,
                                                   Shape<Int<kBlockN>, Int<kHeadDim / kWarpGroups>, Int<kBlockM>>,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              SplitCols{})),
      decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float,
                                                   Shape<Int<kBlockN>, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                                                   GMMA::Major::MN>(),
                              SplitRows{}))>;
  // (M x D) = dS K, both operands transposed views.
  using MmaQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim / kWarpGroups>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      SplitCols{}));

  // Q, dO, K, V in 128-byte swizzle atoms (64 columns) at head dims 64, 128, 256. At 192 and 96 a
  // warpgroup's slice of the head dim (96, 48 columns: dK's and dV's where split, dQ's) starts on
  // an atom only with 64-byte atoms (32 columns) at 192 and 32-byte ones (16 columns) at 96.
  static constexpr int kAtomCols = kHeadDim == 96 ? 16 : kHeadDim == 192 ? 32 : 64;
  using Atom = std::conditional_t<
      kAtomCols == 64, GMMA::Layout_K_SW128_Atom<Element>,
      std::conditional_t<kAtomCols == 32, GMMA::Layout_K_SW64_Atom<Element>, GMMA::Layout_K_SW32_Atom<Element>>>;
  using AtomP = GMMA::Layout_K_SW128_Atom<Element>;  // P^T, dS^T: 64 query columns
  using SmemLayoutQ = decltype(tile_to_shape(Atom{}, Shape<Int<kBlockM>, Int<kHeadDim>, _2>{}));  // Q, dO
  using SmemLayoutKV = decltype(tile_to_shape(Atom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));     // K, V
  using SmemLayoutdSt = decltype(tile_to_shape(AtomP{}, Shape<Int<kBlockN>, Int<kBlockM>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutdS =
      decltype(composition(SmemLayoutdSt{}, make_layout(Shape<Int<kBlockM>, Int<kBlockN>>{}, GenRowMajor{})));

  static constexpr int kGmemChunk = kHeadDim % 64 == 0 ? 64 : 32;  // columns a row of threads copies
  using GmemLoad = typename GmemCopies<Element, kThreads, kGmemChunk>::Load;
  using GmemStore = typename GmemCopies<Element, kThreads, kGmemChunk>::Store;
  using StoreAtom = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  static constexpr int kTileQ = kBlockM * kHeadDim, kTileKV = kBlockN * kHeadDim, kTileP = kBlockN * kBlockM;
  static constexpr int kTilesP = kSplitD ? 2 : 1;
  // dQ staged for bulk reductions where two fp32 tiles fit beside the rest (up to head dim 128).
  static constexpr bool kBulkDq = !kSplitD;
  static constexpr int kRowsBytes = 2 * 2 * kBlockM * int(sizeof(float));
  static constexpr int kOffsetRows = (2 * kTileKV + 4 * kTileQ + kTilesP * kTileP) * int(sizeof(Element));
  static constexpr int kOffsetDq = kOffsetRows + kRowsBytes;
  static constexpr int kDqTile = kBlockM * kHeadDim;
  // K, V; 2 x (Q, dO); dS^T (and P^T where split); 2 x (LSE, D); 2 x dQ (fp32) where bulk.
  static constexpr int kSmemBytes = kOffsetDq + (kBulkDq ? 2 * kDqTile * int(sizeof(float)) : 0);
  static_assert(!kBulkDq || kBlockM == kDqTurnRows, "the deterministic turns count 64-row query tiles");
};

// Adds a wgmma accumulator tile (M x N, fp32) into the dQ rows from row0 on (dq: row0's first
// column; columns placed by dq_column) with 16-byte reductions, half as many as 8-byte ones: a
// thread holds column pairs (2q, 2q+1) of each 8-column group, so lanes q = 2j, 2j+1 trade pairs
// and each adds 4 adjacent columns, of the even group or the odd one. Rows at or past rows_left are
// skipped (every lane still takes part in the trades).
template <int kCols, class Acc, class C>
__device__ __forceinline__ void add_acc_quads(const Acc& acc, float* dq, std::int64_t row0, const C& coord,
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
            atomicAdd(reinterpret_cast<float4*>(dq + row * kCols + dq_column(row0 + row, col)), v);
        }
      }
    }
  }
}

template <class T, bool kMods, bool kDeterministic>
__global__ void __launch_bounds__(T::kThreads, 1) bwd_dkdv_kernel_sm90(const __grid_constant__ BwdParams p) {
  static_assert(!kDeterministic || T::kBulkDq);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim;
  extern __shared__ __align__(1024) char smem_bwd_sm90[];
  const FwdParams& f = p.fwd;
  // The deterministic mode runs key blocks last to first: each query tile's dQ is added in that
  // order, so a block only waits for blocks that started before it (no wait on one that has no SM
  // yet), and under a causal mask for blocks that reached the tile earlier (they start lower).
  const int n_block = kDeterministic ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int b = blockIdx.y, hk = blockIdx.z, tid = threadIdx.x;
  const BwdSeq s(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= s.sk) return;
  const Mask mask(s.sq, s.sk, f.bottom_right, f.window_left, f.window_right);
  const int n1 = min(n0 + kBlockN, s.sk);
  const int row_lo = mask.block_row_begin(n0), row_hi = mask.block_row_end(n1);
  const int m_lo = row_lo / kBlockM;
  const int tiles = row_hi > row_lo ? (row_hi + kBlockM - 1) / kBlockM - m_lo : 0;
  const int iters = tiles * f.group;

  Element* base = reinterpret_cast<Element*>(smem_bwd_sm90);
  Tensor sK = make_tensor(make_smem_ptr(base), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(base + T::kTileKV), typename T::SmemLayoutKV{});
  Tensor sQ = make_tensor(make_smem_ptr(base + 2 * T::kTileKV), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(base + 2 * T::kTileKV + 2 * T::kTileQ), typename T::SmemLayoutQ{});
  Tensor sdSt = make_tensor(make_smem_ptr(base + 2 * T::kTileKV + 4 * T::kTileQ), typename T::SmemLayoutdSt{});
  Tensor sPt = make_tensor(make_smem_ptr(base + 2 * T::kTileKV + 4 * T::kTileQ + T::kTileP),
                           typename T::SmemLayoutdSt{});  // where split
  Tensor sQt = make_tensor(sQ.data(), typename T::SmemLayoutQt{});
  Tensor sdOt = make_tensor(sdO.data(), typename T::SmemLayoutQt{});
  Tensor sKt = make_tensor(sK.data(), typename T::SmemLayoutKt{});
  Tensor sdS = make_tensor(sdSt.data(), typename T::SmemLayoutdS{});
  float* rows_base = reinterpret_cast<float*>(smem_bwd_sm90 + T::kOffsetRows);
  float* sdq_base = reinterpret_cast<float*>(smem_bwd_sm90 + T::kOffsetDq);  // where kBulkDq
  auto sLse = [&](int st) { return rows_base + st * 2 * kBlockM; };
  auto sDsum = [&](int st) { return rows_base + st * 2 * kBlockM + kBlockM; };

  const std::int64_t k_row0 = s.k_start + n0;
  load_key_tile<T>(f, s, b, hk, n0, sK, sV, tid);
  auto load = [&](int h, int m0, int st) {
    load_query_tile<T>(p, s, b, h, m0, sQ(_, _, st), sdO(_, _, st), sLse(st), sDsum(st), tid);
  };
  if (iters > 0) load(hk * f.group, m_lo * kBlockM, 0);
  cp_async_fence();

  typename T::MmaSdP mma_sdp;
  typename T::MmaKV mma_kv;
  typename T::MmaQ mma_q;
  auto tsdp = mma_sdp.get_thread_slice(tid);
  auto tkv = mma_kv.get_thread_slice(tid);
  auto tq = mma_q.get_thread_slice(tid);
  using TileS = Shape<Int<kBlockN>, Int<kBlockM>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  // Operand descriptors, per stage where the operand has two.
  Tensor dK_a = tsdp.partition_fragment_A(sK);
  Tensor dV_a = tsdp.partition_fragment_A(sV);
  Tensor dQ_b = tsdp.partition_fragment_B(sQ);
  Tensor ddO_b = tsdp.partition_fragment_B(sdO);
  Tensor ddOt_b = tkv.partition_fragment_B(sdOt);
  Tensor dQt_b = tkv.partition_fragment_B(sQt);
  Tensor ddS_a = tq.partition_fragment_A(sdS);
  Tensor dKt_b = tq.partition_fragment_B(sKt);

  Tensor acc_dk = partition_fragment_C(mma_kv, TileKV{});
  Tensor acc_dv = partition_fragment_C(mma_kv, TileKV{});
  clear(acc_dk);
  clear(acc_dv);
  Tensor acc_s = partition_fragment_C(mma_sdp, TileS{});
  Tensor acc_dp = partition_fragment_C(mma_sdp, TileS{});
  Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  Tensor dp_rc = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));
  Tensor cS = tsdp.partition_C(make_identity_tensor(TileS{}));
  Tensor c = make_tensor(cS.data(), rowcol(cS.layout()));
  auto st_ds = make_tiled_copy_C(typename T::StoreAtom{}, mma_sdp);
  auto st_ds_thr = st_ds.get_thread_slice(tid);
  Tensor sdSt_st = st_ds_thr.partition_D(sdSt);
  Tensor sPt_st = st_ds_thr.partition_D(sPt);

  const int m_end = (m_lo + tiles) * kBlockM;
  int* passing = nullptr;  // deterministic mode, thread 0: the turn whose bulk addition is in flight
  for (int t = 0, h = hk * f.group, m0 = m_lo * kBlockM; t < iters; ++t) {
    const int st = t & 1;
    const bool head_done = m0 + kBlockM == m_end;
    const int h_next = head_done ? h + 1 : h, m0_next = head_done ? m_lo * kBlockM : m0 + kBlockM;
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();
    __syncthreads();  // this tile's Q, dO, LSE, D have landed; every warpgroup is done with the last tile
    if (t + 1 < iters) {
      load(h_next, m0_next, st ^ 1);
      cp_async_fence();
    }
    const BwdHead hd(f, b, h);
    const bool masked = !mask.block_full(m0, min(m0 + kBlockM, s.sq), n0, n0 + kBlockN) || n0 + kBlockN > s.sk;

    gemm_wg<true>(mma_sdp, dK_a, dQ_b(_, _, _, st), acc_s);
    gemm_wg<true>(mma_sdp, dV_a, ddO_b(_, _, _, st), acc_dp);
    // The last tile's dQ turn passes here, while this tile's first products run: its bulk addition
    // has had time to land, and the next key block's wait for it stays short.
    if (kDeterministic && tid == 0 && passing != nullptr) turn_pass(passing);
    TileRows<decltype(size<1>(s_rc))::value> cols(c, sLse(st), sDsum(st));
    Tensor dsc = make_tensor<float>(shape(s_rc));
    warpgroup_wait<1>();  // S^T is done; dP^T runs on
    scores_to_pt<kMods>(f, mask, hd, masked, n0, m0, s_rc, dsc, c, cols);
    warpgroup_wait<0>();
    dpt_to_dst<kMods>(f, hd, n0, m0, s_rc, dp_rc, dsc, c, cols);

    Tensor rPt = convert<Element>(acc_s);
    Tensor rdSt = convert<Element>(acc_dp);
    if constexpr (T::kSplitD) {
      copy(st_ds, st_ds_thr.retile_S(rPt), sPt_st);
      copy(st_ds, st_ds_thr.retile_S(rdSt), sdSt_st);
      cutlass::arch::fence_view_async_shared();
      __syncthreads();  // both warpgroups' columns of P^T and dS^T are in shared memory
      gemm_wg<false>(mma_kv, tkv.partition_fragment_A(sPt), ddOt_b(_, _, _, st), acc_dv);
      gemm_wg<false>(mma_kv, tkv.partition_fragment_A(sdSt), dQt_b(_, _, _, st), acc_dk);
    } else {
      gemm_wg<false>(mma_kv, make_tensor(rPt.data(), acc_as_a(rPt.layout())), ddOt_b(_, _, _, st), acc_dv);
      gemm_wg<false>(mma_kv, make_tensor(rdSt.data(), acc_as_a(rdSt.layout())), dQt_b(_, _, _, st), acc_dk);
      copy(st_ds, st_ds_thr.retile_S(rdSt), sdSt_st);
      cutlass::arch::fence_view_async_shared();
      __syncthreads();  // dS^T is in shared memory
    }

    Tensor acc_dq = partition_fragment_C(mma_q, TileQ{});
    gemm_wg<true>(mma_q, ddS_a, dKt_b, acc_dq);
    warpgroup_wait<0>();
    warpgroup_fence_operand(rPt);  // the products reading P^T and dS^T from registers are done
    warpgroup_fence_operand(rdSt);

    const std::int64_t dq_row0 = h * p.rows_total + s.row_base + m0;
    float* dq = p.dq_accum + dq_row0 * kHeadDim;
    Tensor cdq = tq.partition_C(make_identity_tensor(TileQ{}));
    if constexpr (T::kBulkDq) {
      // Tiles alternate between two buffers: the one written here was last read by the bulk
      // reduction two tiles ago, which thread 0 waited for before this tile's first barrier.
      float* sdq = sdq_base + (t & 1) * T::kDqTile;
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 2) {
        const int row = get<0>(cdq(i)), col = get<1>(cdq(i));
        *reinterpret_cast<float2*>(sdq + row * kHeadDim + dq_column(dq_row0 + row, col)) =
            make_float2(acc_dq(i), acc_dq(i + 1));
      }
      cutlass::arch::fence_view_async_shared();
      __syncthreads();  // the tile's dQ is staged
      if (tid == 0) {
        const int bytes = min(kBlockM, s.sq - m0) * kHeadDim * int(sizeof(float));
        if constexpr (kDeterministic) {
          // Every later key block that sees this tile adds first: those up to the tile's last key.
          passing = p.dq_turns + dq_turn_index(p, h, s.row_base, b, m0);
          turn_wait(passing, (mask.key_end(min(m0 + kBlockM, s.sq) - 1) - 1) / kBlockN - n_block);
          bulk_reduce_add_f32(dq, sdq, bytes);
          bulk_commit();
        } else {
          bulk_reduce_add_f32(dq, sdq, bytes);
          bulk_commit();
          bulk_wait_read<1>();
        }
      }
    } else {
      add_acc_quads<kHeadDim>(acc_dq, dq, dq_row0, cdq, s.sq - m0);
    }
    h = h_next;
    m0 = m0_next;
  }

  // dK and dV through the K and V tiles' shared memory. A block whose keys no query row sees ran
  // no iteration: its K and V copies may still be in flight.
  cp_async_wait<0>();
  if (T::kBulkDq && tid == 0) {
    if (kDeterministic && passing != nullptr)
      turn_pass(passing);
    else
      bulk_wait_all();
  }
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
#endif
}

}  // namespace tileattn::cuda
