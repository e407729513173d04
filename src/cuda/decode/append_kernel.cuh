// Writes the new K/V rows into the cache (contiguous or paged) and applies the rotary embedding
// to them and, into a scratch copy, to q. One thread per 2 features of one row.
#pragma once

#include <cstdint>

#include "cuda/decode/vec.cuh"

namespace tileattn::cuda::decoding {

struct AppendParams {
  const void* k_new;
  const void* v_new;
  std::int64_t kn_b, kn_s, kn_h, vn_b, vn_s, vn_h;
  void* k;
  void* v;
  std::int64_t k_b, k_s, k_h, v_b, v_s, v_h;
  const int* page_table;
  std::int64_t pt_b, pt_p;
  int page_size, num_pages;
  const int* cache_seqlens;
  int capacity, seqlen_new, heads_kv, hdim_qk, hdim_v;
  const void* cos;  // [positions, rotary_dim / 2]
  const void* sin;
  std::int64_t cos_s, sin_s;
  int rotary_dim;
  bool interleaved;
  // q rotation into a contiguous scratch [batch, seqlen_q, heads_q, hdim_qk]
  const void* q;
  std::int64_t q_b, q_i, q_h;
  void* q_rot;
  int seqlen_q, heads_q;
  bool q_per_row;  // causal/windowed: query row i sits at cache_seqlens + i
};

__device__ __forceinline__ int cache_len(const AppendParams& p, int b) {
  if (!p.cache_seqlens) return p.capacity - p.seqlen_new;
  int n = p.cache_seqlens[b];
  return n < 0 ? 0 : (n > p.capacity - p.seqlen_new ? p.capacity - p.seqlen_new : n);
}

// Rotates features (c0, c1) of x at position pos; returns them through the references.
template <class T>
__device__ __forceinline__ void rotate_pair(const AppendParams& p, int pos, int pair, float& x0, float& x1) {
  const float cs = to_float(static_cast<const T*>(p.cos)[pos * p.cos_s + pair]);
  const float sn = to_float(static_cast<const T*>(p.sin)[pos * p.sin_s + pair]);
  const float a = x0, b = x1;
  x0 = a * cs - b * sn;
  x1 = b * cs + a * sn;
}

// Thread `pair` of a row: below rotary_dim / 2 it owns a rotated pair, (2c, 2c+1) interleaved or
// (c, c + rotary_dim/2) otherwise; from there on it copies features (2 pair, 2 pair + 1), which all
// lie past rotary_dim.
__device__ __forceinline__ void rotary_cols(const AppendParams& p, int pair, int& c0, int& c1) {
  const int half = p.rotary_dim / 2;
  c0 = p.interleaved ? 2 * pair : pair;
  c1 = p.interleaved ? 2 * pair + 1 : pair + half;
}

template <class T>
__global__ void append_kernel(const AppendParams p) {
  // x: (b, n, g) row; threads: feature pairs of max(hdim_qk, hdim_v).
  const int row = blockIdx.x, pair = threadIdx.x;
  const int g = row % p.heads_kv, n = row / p.heads_kv % p.seqlen_new, b = row / p.heads_kv / p.seqlen_new;
  const int pos = cache_len(p, b) + n;
  std::int64_t kd, vd;
  if (p.page_table) {
    int page = p.page_table[b * p.pt_b + (pos / p.page_size) * p.pt_p];
    page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
    kd = page * p.k_b + (pos % p.page_size) * p.k_s + g * p.k_h;
    vd = page * p.v_b + (pos % p.page_size) * p.v_s + g * p.v_h;
  } else {
    kd = b * p.k_b + pos * p.k_s + g * p.k_h;
    vd = b * p.v_b + pos * p.v_s + g * p.v_h;
  }
  const T* kn = static_cast<const T*>(p.k_new) + b * p.kn_b + n * p.kn_s + g * p.kn_h;
  const T* vn = static_cast<const T*>(p.v_new) + b * p.vn_b + n * p.vn_s + g * p.vn_h;
  T* k = static_cast<T*>(p.k) + kd;
  T* v = static_cast<T*>(p.v) + vd;
  if (pair < p.rotary_dim / 2) {
    int c0, c1;
    rotary_cols(p, pair, c0, c1);
    float x0 = to_float(kn[c0]), x1 = to_float(kn[c1]);
    rotate_pair<T>(p, pos, pair, x0, x1);
    k[c0] = from_float<T>(x0);
    k[c1] = from_float<T>(x1);
  } else if (2 * pair + 1 < p.hdim_qk) {
    k[2 * pair] = kn[2 * pair];
    k[2 * pair + 1] = kn[2 * pair + 1];
  }
  if (2 * pair + 1 < p.hdim_v) {
    v[2 * pair] = vn[2 * pair];
    v[2 * pair + 1] = vn[2 * pair + 1];
  }
}

template <class T>
__global__ void rotate_q_kernel(const AppendParams p) {
  const int row = blockIdx.x, pair = threadIdx.x;  // row: (b, i, h)
  const int h = row % p.heads_q, i = row / p.heads_q % p.seqlen_q, b = row / p.heads_q / p.seqlen_q;
  const int pos = cache_len(p, b) + (p.q_per_row ? i : 0);
  const T* q = static_cast<const T*>(p.q) + b * p.q_b + i * p.q_i + h * p.q_h;
  T* qr = static_cast<T*>(p.q_rot) + static_cast<std::int64_t>(row) * p.hdim_qk;
  if (pair < p.rotary_dim / 2) {
    int c0, c1;
    rotary_cols(p, pair, c0, c1);
    float x0 = to_float(q[c0]), x1 = to_float(q[c1]);
    rotate_pair<T>(p, pos, pair, x0, x1);
    qr[c0] = from_float<T>(x0);
    qr[c1] = from_float<T>(x1);
  } else if (2 * pair + 1 < p.hdim_qk) {
    qr[2 * pair] = q[2 * pair];
    qr[2 * pair + 1] = q[2 * pair + 1];
  }
}

}  // namespace tileattn::cuda::decoding
