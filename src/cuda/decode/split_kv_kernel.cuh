// Flash-decoding: one thread block per (KV split, KV head, batch, query-row chunk). Decoding is
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

#include "common/mask.hpp"
#include "common/score_mod.hpp"
#include "cuda/decode/vec.cuh"

namespace tileattn::cuda::decoding {

// Everything a block needs; plain data passed by value.
struct Params {
  const void* q;  // [batch, seqlen_q, heads_q, hdim_qk] (possibly rotated copy)
  std::int64_t q_b, q_i, q_h;
  const void* k;  // cache: contiguous [batch, capacity, heads_kv, d] or paged [pages, page_size, ...]
  const void* v;
  std::int64_t k_b, k_s, k_h, v_b, v_s, v_h;
  const int* page_table;  // null: contiguous
  std::int64_t pt_b, pt_p;
  int page_size, num_pages;
  const int* cache_seqlens;  // null: every sequence holds `capacity` keys
  int capacity, seqlen_new;
  void* out;  // final output when splits == 1: [batch, seqlen_q, heads_q, hdim_v]
  std::int64_t o_b, o_i, o_h;
  float* lse;  // optional final lse [batch, heads_q, seqlen_q]
  std::int64_t l_b, l_h, l_i;
  float* out_partial;  // splits > 1: fp32 [splits, batch, seqlen_q, heads_q, hdim_v], contiguous
  float* lse_partial;  // splits > 1: fp32 [splits, batch, heads_q, seqlen_q], contiguous
  const float* alibi;
  std::int64_t alibi_b, alibi_h;  // alibi_b = 0 for per-head slopes
  int batch, seqlen_q, heads_q, heads_kv, hdim_qk, hdim_v;
  int splits, keys_per_split;
  float scale, softcap;
  int window_left, window_right;
  bool bottom_right;
};

// Keys of sequence b, from untrusted device metadata: clamped so no read leaves the cache.
__device__ __forceinline__ int seq_keys(const Params& p, int b) {
  if (!p.cache_seqlens) return p.capacity;
  int n = p.cache_seqlens[b];
  n = n < 0 ? 0 : (n > p.capacity - p.seqlen_new ? p.capacity - p.seqlen_new : n);
  return n + p.seqlen_new;
}

template <class T>
__device__ __forceinline__ const T* key_row(const Params& p, const void* base, std::int64_t sb,
                                            std::int64_t ss, std::int64_t sh, int b, int g, int j) {
  std::int64_t off;
  if (p.page_table) {
    int page = p.page_table[b * p.pt_b + (j / p.page_size) * p.pt_p];
    page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
    off = page * sb + (j % p.page_size) * ss + g * sh;
  } else {
    off = b * sb + j * ss + g * sh;
  }
  return static_cast<const T*>(base) + off;
}

// Shared memory of one block: the K/V ring, reused for the final merge.
template <int D, int ROWS, int WARPS>
struct SplitKvShape {
  static constexpr int kTpk = D / 8;                // lanes per key row, 16 bytes each
  static constexpr int kSlots = WARPS * 32 / kTpk;  // keys processed side by side
  static constexpr int kUnroll = 4;                 // keys per lane per stage
  static constexpr int kStageKeys = kSlots * kUnroll;
  static constexpr int kStages = 4;
  static constexpr std::size_t kRingBytes = 2ull * kStages * kStageKeys * D * 2;
  static constexpr std::size_t kMergeBytes = (WARPS * ROWS * D + WARPS * ROWS * 2) * sizeof(float);
  static constexpr std::size_t kSmemBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
};

// T: element type; D: padded head dim (64, 128, 256); ROWS: query rows per block.
template <class T, int D, int ROWS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) split_kv_kernel(const Params p) {
  using Shape = SplitKvShape<D, ROWS, WARPS>;
  constexpr int TPK = Shape::kTpk, SLOTS = Shape::kSlots, UNROLL = Shape::kUnroll;
  constexpr int KS = Shape::kStageKeys, STAGES = Shape::kStages;
  const float kNegInf = -CUDART_INF_F;

  // Grid: x = (batch, row chunk), y = KV head, z = split.
  const int group = p.heads_q / p.heads_kv;
  const int rows_total = p.seqlen_q * group;
  const int chunks = (rows_total + ROWS - 1) / ROWS;
  const int b = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int g = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane % TPK;          // which 8 features this lane owns
  const int slot = threadIdx.x / TPK;  // which key of each group of SLOTS this lane works on
  const int c0 = sub * 8;

  const int sk = seq_keys(p, b);
  const Mask mask(p.seqlen_q, sk, p.bottom_right, p.window_left, p.window_right);
  const int kbeg = split * p.keys_per_split;
  const int kend = max(kbeg, min(sk, kbeg + p.keys_per_split));  // empty past the sequence

  // This block's query rows: row r -> query index i = r / group, head h = g * group + r % group.
  int row_i[ROWS];
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
    lo = min(lo, max(kbeg, mask.key_begin(row_i[r])));
    hi = max(hi, min(kend, mask.key_end(row_i[r])));
  }
  hi = max(hi, lo);

  // Each lane copies, and later reads back, only its own 16-byte pieces: the ring needs no barrier.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* ring_k = reinterpret_cast<T*>(smem_raw);
  T* ring_v = ring_k + STAGES * KS * D;
  auto slot_at = [&](int stage, int u) { return (stage * KS + u * SLOTS + slot) * D + c0; };
  const int iters = (hi - lo + KS - 1) / KS;
  auto issue = [&](int it) {
    if (it < iters) {
      const int stage = it % STAGES;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int j = lo + it * KS + u * SLOTS + slot;
        const bool in = j < hi;
        const int jj = in ? j : lo;
        cp_async16(ring_k + slot_at(stage, u), key_row<T>(p, p.k, p.k_b, p.k_s, p.k_h, b, g, jj) + c0, in && c0 < p.hdim_qk);
        cp_async16(ring_v + slot_at(stage, u), key_row<T>(p, p.v, p.v_b, p.v_s, p.v_h, b, g, jj) + c0, in && c0 < p.hdim_v);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };
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
        s[r][u] = (j < hi && mask.visible(row_i[r], j)) ? mod[r](d, row_i[r], j, mask.diag_offset) : kNegInf;
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
  if (lane < TPK) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int c = 0; c < 8; ++c) s_acc[(warp * ROWS + r) * D + c0 + c] = acc[r][c];
      if (lane == 0) {
        s_ml[(warp * ROWS + r) * 2] = m[r];
        s_ml[(warp * ROWS + r) * 2 + 1] = l[r];
      }
    }
  }
  __syncthreads();

  // Final merge: thread t handles feature column t % D of row t / D (looping as needed).
  const std::int64_t bh_rows = static_cast<std::int64_t>(p.batch) * p.seqlen_q * p.heads_q;
  for (int e = threadIdx.x; e < ROWS * D; e += WARPS * 32) {
    const int r = e / D, c = e % D;
    if (chunk * ROWS + r >= rows_total || c >= p.hdim_v) continue;
    float mm = kNegInf;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, s_ml[(w * ROWS + r) * 2]);
    float ll = 0.f, o = 0.f;
    if (mm != kNegInf) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float a = exp2f(s_ml[(w * ROWS + r) * 2] - mm);
        ll += a * s_ml[(w * ROWS + r) * 2 + 1];
        o += a * s_acc[(w * ROWS + r) * D + c];
      }
    }
    const float out = ll > 0.f ? o / ll : 0.f;
    // Natural-log LSE: m and l are in log2 units.
    const float lse = ll > 0.f ? (mm + log2f(ll)) / kLog2e : kNegInf;
    const int i = (chunk * ROWS + r) / group, h = g * group + (chunk * ROWS + r) % group;
    if (p.splits == 1) {
      T* op = static_cast<T*>(p.out) + b * p.o_b + i * p.o_i + h * p.o_h;
      op[c] = from_float<T>(out);
      if (p.lse && c == 0) p.lse[b * p.l_b + h * p.l_h + i * p.l_i] = lse;
    } else {
      const std::int64_t row = (static_cast<std::int64_t>(b) * p.seqlen_q + i) * p.heads_q + h;
      p.out_partial[(split * bh_rows + row) * p.hdim_v + c] = out;
      if (c == 0)
        p.lse_partial[split * bh_rows + (static_cast<std::int64_t>(b) * p.heads_q + h) * p.seqlen_q + i] = lse;
    }
  }
}

}  // namespace tileattn::cuda::decoding
