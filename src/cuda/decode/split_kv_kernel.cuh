// Flash-decoding on CUDA cores, for head dims past 128 (gqa_mma_kernel.cuh serves the rest): one
// thread block per (KV split, KV head, batch, query-row chunk). Decoding is
// memory-bound, so the kernel is built around reading each K/V byte once and keeping many bytes in
// flight: every query row of a GQA group rides along in registers (the group shares one pass over
// the cache), a key row is spread over D/8 lanes that each copy 16 bytes, and each lane streams its
// keys through a private multi-stage cp.async ring in shared memory, so loads for later stages are
// in flight while it computes on the current one without holding registers. Scores and the online
// softmax run on CUDA cores; with at most 8 query rows per block the arithmetic hides under the loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "common/score_mod.hpp"
#include "common/variant.hpp"
#include "cuda/decode/common.cuh"
#include "cuda/decode/split_merge.cuh"
#include "cuda/decode/vec.cuh"

namespace tileattn::cuda::decoding {

// Shared memory of one block: the K/V ring, reused for the final merge.
template <int D, int ROWS, int WARPS>
struct SplitKvShape {
  static constexpr int kTpk = D / 8;                // lanes per key row, 16 bytes each
  static constexpr int kSlots = WARPS * 32 / kTpk;  // keys processed side by side
  static constexpr int kUnroll = 4;                 // keys per lane per stage
  static constexpr int kStageKeys = kSlots * kUnroll;
  static constexpr int kStages = 4;
  static constexpr std::size_t kRingBytes = 2ull * kStages * kStageKeys * D * 2;
  static constexpr std::size_t kMergeBytes =
      (WARPS * ROWS * D + WARPS * ROWS * 2) * sizeof(float) + kOwnPartialBytes<ROWS, D>;
  static constexpr std::size_t kSmemBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
};

// T: element type; D: padded head dim (64, 128, 256); ROWS: query rows per block.
template <class T, int D, int ROWS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) split_kv_kernel(const Params p) {
  using Shape = SplitKvShape<D, ROWS, WARPS>;
  constexpr int TPK = Shape::kTpk, SLOTS = Shape::kSlots, UNROLL = Shape::kUnroll;
  constexpr int KS = Shape::kStageKeys, STAGES = Shape::kStages;
  const float kNegInf = -CUDART_INF_F;

  const int group = p.heads_q / p.heads_kv;
  const int rows_total = p.seqlen_q * group;
  const BlockAt blk = block_at(p, (rows_total + ROWS - 1) / ROWS);
  const int b = blk.b, chunk = blk.chunk, g = blk.g, split = blk.split;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane % TPK;          // which 8 features this lane owns
  const int slot = threadIdx.x / TPK;  // which key of each group of SLOTS this lane works on
  const int c0 = sub * 8;
  // With splits a dependent launch (decode.cu): nothing is read before the work ahead of it (the
  // counters' clearing, and through it the append kernel and the caller's kernels) has ended. The
  // next call's clearing kernel may start at once and wait likewise.
  allow_dependent_launch();
  wait_for_primary();

  const int sk = seq_keys(p, b);
  const Variant var = decode_variant(p, sk);
  const int kbeg = split * p.keys_per_split;
  const int kend = max(kbeg, min(sk, kbeg + p.keys_per_split));  // empty past the sequence

  // This block's query rows: row r -> query index i = r / group, head h = g * group + r % group.
  int row_i[ROWS], key_lo[ROWS], key_hi[ROWS];  // each row's visible keys: [key_lo, key_hi)
  float q[ROWS][8], acc[ROWS][8], m[ROWS], l[ROWS];
  ScoreMod mod[ROWS];
  int lo = kend, hi = kbeg;  // keys any row of the block sees, within this split
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int rr = min(chunk * ROWS + r, rows_total - 1);
    row_i[r] = rr / group;
    const int h = g * group + rr % group;
    const float slope = p.alibi ? p.alibi[b * p.alibi_b + h * p.alibi_h] : 0.f;
    // Scores in log2 units: the ScoreMod carries log2(e) in its scale, cap and slope.
    mod[r] = ScoreMod{p.scale * kLog2e, p.softcap * kLog2e, slope * kLog2e};
    const T* qp = static_cast<const T*>(p.q) + b * p.q_b + row_i[r] * p.q_i + h * p.q_h;
    unpack8<T>(load16(qp + c0, c0 < p.hdim_qk), q[r]);
    m[r] = kNegInf;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[r][c] = 0.f;
    key_lo[r] = var.key_begin(row_i[r]);
    key_hi[r] = var.key_end(row_i[r]);
    lo = min(lo, max(kbeg, key_lo[r]));
    hi = max(hi, min(kend, key_hi[r]));
  }
  hi = max(hi, lo);

  // Each lane copies, and later reads back, only its own 16-byte pieces: the ring needs no barrier.
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* ring_k = reinterpret_cast<T*>(smem_raw);
  T* ring_v = ring_k + STAGES * KS * D;
  auto slot_at = [&](int stage, int u) { return (stage * KS + u * SLOTS + slot) * D + c0; };
  const int iters = (hi - lo + KS - 1) / KS;
  // Page-table entries of the next stage's keys, read one issue ahead and resolved when the copy
  // is issued, so that the read's latency is never on the path of the copies.
  int entry[UNROLL];
  auto fetch = [&](int it) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = lo + it * KS + u * SLOTS + slot;
      entry[u] = page_entry(p, b, j < hi ? j : lo);
    }
  };
  auto issue = [&](int it) {
    if (it < iters) {
      const int stage = it % STAGES;
      KeyLoc at[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int j = lo + it * KS + u * SLOTS + slot;
        at[u] = locate(p, entry[u], j < hi ? j : lo);
      }
      if (it + 1 < iters) fetch(it + 1);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const bool in = lo + it * KS + u * SLOTS + slot < hi;
        const T* kp = static_cast<const T*>(p.k) + at[u].page * p.k_b + at[u].row * p.k_s + g * p.k_h + c0;
        const T* vp = static_cast<const T*>(p.v) + at[u].page * p.v_b + at[u].row * p.v_s + g * p.v_h + c0;
        cp_async16(ring_k + slot_at(stage, u), kp, in && c0 < p.hdim_qk);
        cp_async16(ring_v + slot_at(stage, u), vp, in && c0 < p.hdim_v);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };
  if (iters > 0) fetch(0);
#pragma unroll
  for (int it = 0; it < STAGES - 1; ++it) issue(it);

  for (int it = 0; it < iters; ++it) {
    cp_async_wait<STAGES - 2>();  // stage it has landed
    issue(it + STAGES - 1);       // refills the stage computed in the previous iteration
    const int stage = it % STAGES, j0 = lo + it * KS;
    float s[ROWS][UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float kf[8];
      unpack8<T>(*reinterpret_cast<const uint4*>(ring_k + slot_at(stage, u)), kf);
      const int j = j0 + u * SLOTS + slot;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float d = 0.f;
#pragma unroll
        for (int c = 0; c < 8; ++c) d = fmaf(q[r][c], kf[c], d);
#pragma unroll
        for (int off = TPK / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
        s[r][u] = (j < hi && j >= key_lo[r] && j < key_hi[r]) ? mod[r](d, row_i[r], j, var.mask.alibi_diag) : kNegInf;
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float mnew = m[r];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) mnew = fmaxf(mnew, s[r][u]);
      // exp2(-inf - -inf) would be NaN: a row with nothing visible yet keeps m = -inf, l = 0.
      const float base = mnew == kNegInf ? 0.f : mnew;
      const float alpha = exp2f(m[r] - base);
      l[r] *= alpha;
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[r][c] *= alpha;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        s[r][u] = exp2f(s[r][u] - base);
        l[r] += s[r][u];
      }
      m[r] = mnew;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float vf[8];
      unpack8<T>(*reinterpret_cast<const uint4*>(ring_v + slot_at(stage, u)), vf);
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(s[r][u], vf[c], acc[r][c]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge scratch
  const unsigned long long arrival = count_arrival(p);

  // Merge the slots of a warp (lanes TPK apart), then the warps through shared memory.
#pragma unroll
  for (int off = TPK; off < 32; off *= 2) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[r], off);
      const float lo_ = __shfl_xor_sync(0xffffffffu, l[r], off);
      const float mn = fmaxf(m[r], mo);
      const float a = mn == kNegInf ? 0.f : exp2f(m[r] - mn), bo = mn == kNegInf ? 0.f : exp2f(mo - mn);
      l[r] = l[r] * a + lo_ * bo;
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[r][c] = acc[r][c] * a + __shfl_xor_sync(0xffffffffu, acc[r][c], off) * bo;
      m[r] = mn;
    }
  }
  float* s_acc = reinterpret_cast<float*>(smem_raw);  // [WARPS][ROWS][D]
  float* s_ml = s_acc + WARPS * ROWS * D;              // [WARPS][ROWS][2]
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      s_ml[(warp * ROWS + r) * 2] = m[r];
      s_ml[(warp * ROWS + r) * 2 + 1] = l[r];
    }
  }
  __syncthreads();  // every warp's row maxima and sums
  if (lane < TPK) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float f = warp_weight<ROWS, WARPS>(s_ml, warp, r);
#pragma unroll
      for (int c = 0; c < 8; ++c) s_acc[(warp * ROWS + r) * D + c0 + c] = acc[r][c] * f;
    }
  }
  finish_block<T, ROWS, WARPS, D, 8>(p, s_acc, s_ml, s_ml + WARPS * ROWS * 2, b, g, chunk, split, arrival);
}

}  // namespace tileattn::cuda::decoding
