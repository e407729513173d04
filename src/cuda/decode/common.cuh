// What every decode kernel shares: the launch parameters, where a key lives in the (paged) cache,
// and the merge of per-warp partial states into the block's output.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/score_mod.hpp"
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
  int* arrivals;  // splits > 1: split blocks finished per blockIdx.x (the last one merges the partials),
                  // zeroed by the kernel launched just before the split kernel
  const float* alibi;
  std::int64_t alibi_b, alibi_h;  // alibi_b = 0 for per-head slopes
  int batch, seqlen_q, heads_q, heads_kv, hdim_qk, hdim_v;
  int splits, keys_per_split;  // keys_per_split: a multiple of kTileKeys, so splits start on tiles
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

// The end of every split-KV block: WARPS partial states per query row, in shared memory as
// s_acc [WARPS][ROWS][D] (unnormalized outputs) and s_ml [WARPS][ROWS][2] (max and sum, log2
// units), merged and written as the final output (one split) or as this split's partial.
template <class T, int ROWS, int WARPS, int D>
__device__ void merge_and_store(const Params& p, const float* s_acc, const float* s_ml, int b, int g, int chunk, int split) {
  const float kNegInf = -CUDART_INF_F;
  const int group = p.heads_q / p.heads_kv, rows_total = p.seqlen_q * group;
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
