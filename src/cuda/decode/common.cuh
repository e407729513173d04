// What every decode kernel shares: the launch parameters, where a key lives in the (paged) cache,
// and the merge of per-warp partial states into the block's output.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/score_mod.hpp"
#include "common/variant.hpp"
#include "cuda/dependent_launch.cuh"
#include "cuda/decode/vec.cuh"

namespace tileattn::cuda::decoding {

// Keys a warp of the tensor-core kernel takes per step. Splits start on multiples of it, and a
// paged cache whose page size is a multiple of it holds every tile on one page.
constexpr int kTileKeys = 16;

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
  unsigned long long* group_state;  // splits > 1: a word per blockIdx.x (split_merge.cuh), zeroed by
                                    // the kernel launched just before the split kernel
  const float* alibi;
  std::int64_t alibi_b, alibi_h;  // alibi_b = 0 for per-head slopes
  int batch, seqlen_q, heads_q, heads_kv, hdim_qk, hdim_v;
  int splits, keys_per_split;  // keys_per_split: a multiple of kTileKeys, so splits start on tiles
  float scale, softcap;
  int window_left, window_right;
  bool bottom_right;
  int chunk;  // chunked-local attention; 0 = off
  int prefix;  // prefix-LM: keys [0, prefix) visible to every row; 0 = off
};

// Keys of sequence b, from untrusted device metadata: clamped so no read leaves the cache.
__device__ __forceinline__ int seq_keys(const Params& p, int b) {
  if (!p.cache_seqlens) return p.capacity;
  int n = p.cache_seqlens[b];
  n = n < 0 ? 0 : (n > p.capacity - p.seqlen_new ? p.capacity - p.seqlen_new : n);
  return n + p.seqlen_new;
}

// The visibility of sequence b's rows over its sk keys (the score transform stays per row, in log2
// units, with each kernel).
__device__ __forceinline__ Variant decode_variant(const Params& p, int sk) {
  Variant v;
  v.mask = Mask(p.seqlen_q, sk, p.bottom_right, p.window_left, p.window_right);
  v.chunk = p.chunk;
  v.prefix = p.prefix;
  return v;
}

// Where key j of sequence b lives: its page (the sequence itself for a contiguous cache) and its
// row within the page. The page-table read (entry) and its use (locate) are separate steps so a
// kernel can read the entry one pipeline step before it needs it, off the path of the copies.
struct KeyLoc {
  int page, row;
};

__device__ __forceinline__ int page_entry(const Params& p, int b, int j) {
  return p.page_table ? p.page_table[b * p.pt_b + (j / p.page_size) * p.pt_p] : b;
}

// entry: page_entry(p, b, j), untrusted device metadata, clamped so no read leaves the cache.
__device__ __forceinline__ KeyLoc locate(const Params& p, int entry, int j) {
  if (!p.page_table) return {entry, j};
  return {entry < 0 ? 0 : (entry >= p.num_pages ? p.num_pages - 1 : entry), j % p.page_size};
}

// Block coordinates of a split-KV grid: x = (batch, row chunk, KV head) with the KV head fastest,
// so the blocks that run side by side read neighbouring heads of the same cache rows; z = split.
struct BlockAt {
  int b, chunk, g, split;
};

__device__ __forceinline__ BlockAt block_at(const Params& p, int chunks) {
  const int g = blockIdx.x % p.heads_kv, bc = blockIdx.x / p.heads_kv;
  return {bc / chunks, bc % chunks, g, static_cast<int>(blockIdx.z)};
}

// The end of every split-KV block merges its warps' partial states through shared memory in two
// steps. Each warp leaves its rows' max and sum (log2 units) in s_ml [WARPS][ROWS][2]; after a
// barrier each lane scales its accumulators by its warp's weight in the row (warp_weight) and
// leaves them in s_acc [WARPS][ROWS][D], so the block's output is a plain sum over the warps
// (sum_warps): one exponential per row and lane instead of one per row, column and warp. On the
// H100 a block's merge now ends 0.9 us after its last warp instead of 1.4 (timeline probe, 1x32k).
// fmaxf drops a NaN operand; a merge of partial results must not (a NaN input that reached one
// part must reach the output, as PyTorch propagates it).
__device__ __forceinline__ float nan_max(float a, float b) { return a != a || b != b ? a + b : fmaxf(a, b); }

struct RowTotal {
  float m, l;  // a row's max and sum over the block's warps
};

template <int ROWS, int WARPS>
__device__ __forceinline__ RowTotal row_total(const float* s_ml, int r) {
  RowTotal t{-CUDART_INF_F, 0.f};
#pragma unroll
  for (int w = 0; w < WARPS; ++w) t.m = fmaxf(t.m, s_ml[(w * ROWS + r) * 2]);
  // Against 0 while every warp's max is -inf: each then weighs 0 * its sum, which is 0 for a row
  // that saw no key and NaN where NaN scores (whose max stays -inf) made the sum NaN.
  const float base = t.m == -CUDART_INF_F ? 0.f : t.m;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) t.l += exp2f(s_ml[(w * ROWS + r) * 2] - base) * s_ml[(w * ROWS + r) * 2 + 1];
  return t;
}

// 2^(m_w - m) / l: warp w's weight in row r of the block's normalized output (0 for a row that
// sees no key, NaN where a NaN reached the row).
template <int ROWS, int WARPS>
__device__ __forceinline__ float warp_weight(const float* s_ml, int w, int r) {
  const RowTotal t = row_total<ROWS, WARPS>(s_ml, r);
  return t.l != 0.f ? exp2f(s_ml[(w * ROWS + r) * 2] - t.m) / t.l : 0.f;
}

// Where sum_warps leaves the block's result: the final output (one split), this split's partial
// in the workspace, or the same in shared memory, s_own: [ROWS][D] outputs, then [ROWS]
// natural-log LSEs (the split group's last block, split_merge.cuh).
enum class Sink { output, partial, own };

// The bytes of s_own, which the kernels' shared memory holds past s_ml.
template <int ROWS, int D>
constexpr std::size_t kOwnPartialBytes = (ROWS * D + ROWS) * sizeof(float);

template <class T, int ROWS, int WARPS, int D>
__device__ void sum_warps(const Params& p, const float* s_acc, const float* s_ml, int b, int g, int chunk, int split,
                          Sink sink, float* s_own) {
  const int group = p.heads_q / p.heads_kv, rows = min(ROWS, p.seqlen_q * group - chunk * ROWS);
  const std::int64_t bh_rows = static_cast<std::int64_t>(p.batch) * p.seqlen_q * p.heads_q;
  for (int e = threadIdx.x; e < rows * (D / 4); e += WARPS * 32) {
    const int r = e / (D / 4), c = 4 * (e % (D / 4));
    if (c >= p.hdim_v) continue;  // hdim_v is a multiple of 8
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(s_acc + (w * ROWS + r) * D + c);
      o.x += x.x, o.y += x.y, o.z += x.z, o.w += x.w;
    }
    float lse = 0.f;
    if (c == 0) {
      const RowTotal t = row_total<ROWS, WARPS>(s_ml, r);
      lse = t.l != 0.f ? (t.m + log2f(t.l)) / kLog2e : -CUDART_INF_F;
    }
    const int i = (chunk * ROWS + r) / group, h = g * group + (chunk * ROWS + r) % group;
    if (sink == Sink::output) {
      T* op = static_cast<T*>(p.out) + b * p.o_b + i * p.o_i + h * p.o_h + c;
      op[0] = from_float<T>(o.x), op[1] = from_float<T>(o.y), op[2] = from_float<T>(o.z), op[3] = from_float<T>(o.w);
      if (p.lse && c == 0) p.lse[b * p.l_b + h * p.l_h + i * p.l_i] = lse;
    } else if (sink == Sink::partial) {
      const std::int64_t row = (static_cast<std::int64_t>(b) * p.seqlen_q + i) * p.heads_q + h;
      *reinterpret_cast<float4*>(p.out_partial + (split * bh_rows + row) * p.hdim_v + c) = o;
      if (c == 0) p.lse_partial[split * bh_rows + (static_cast<std::int64_t>(b) * p.heads_q + h) * p.seqlen_q + i] = lse;
    } else {
      *reinterpret_cast<float4*>(s_own + r * D + c) = o;
      if (c == 0) s_own[ROWS * D + r] = lse;
    }
  }
}

}  // namespace tileattn::cuda::decoding
