// Flash-decoding on tensor cores: the query rows of a KV head (GQA heads x query rows, up to 16)
// form one 16-row tile and both products run as mma.sync m16n8k16, so the per-key arithmetic that
// a CUDA-core kernel repeats for every row shrinks to a few instructions per warp; padding rows
// cost nothing that matters next to the cache reads. Each warp takes
// every WARPS-th block of 16 keys of the split and streams them through a private cp.async ring
// (swizzled so the ldmatrix reads are conflict-free); warps merge their states at the end, and
// with splits the last block of a KV head to finish merges the splits (split_merge.cuh).
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

template <int D, int WARPS>
struct GqaMmaShape {
  static constexpr int kRows = 16;   // query rows of a block: one mma tile
  static constexpr int kKeys = kTileKeys;
  // Double buffering. Head dim 128: one 8 KB tile in flight per warp (64 KB per SM); on the H100
  // a third stage (128 KB in flight) streamed the cache 1-2.5% slower on every single-wave row,
  // and so did 80-168 KB from other warp and stage counts. Head dim 64 (two blocks per SM, bound
  // by registers): two stages (64 KB in flight per SM) against three (128 KB) were 1.7-2.8%
  // faster on every grid row (bench/notes/decode.md).
  static constexpr int kStages = 2;
  static constexpr int kRampTiles = 4;
  static constexpr std::size_t kStageBytes = 2ull * kKeys * D * 2;  // K and V
  static constexpr std::size_t kRingBytes = WARPS * kStages * kStageBytes;
  static constexpr std::size_t kMergeBytes =
      (WARPS * kRows * D + WARPS * kRows * 2) * sizeof(float) + kOwnPartialBytes<kRows, D>;
  static constexpr std::size_t kSmemBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
};

template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(const void* smem, unsigned (&r)[4]) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  }
}

template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
}

// Element offset of 16-byte chunk c of key row n in a [16][D] tile, XOR-swizzled over 8 rows.
template <int D>
__device__ __forceinline__ int swz(int n, int c) {
  return n * D + ((c ^ (n & 7)) << 3);
}

// PER_KEY: a tile of 16 keys may span pages (a paged cache whose page size is not a multiple of
// 16): every key is located on its own. Otherwise the cache is contiguous or its tiles each lie
// on one page (tile starts are multiples of 16: see lo below, Params::keys_per_split).
template <class T, int D, int WARPS, bool PER_KEY>
__global__ void __launch_bounds__(WARPS * 32) gqa_mma_kernel(const Params p) {
  using Shape = GqaMmaShape<D, WARPS>;
  constexpr int ROWS = Shape::kRows, KEYS = Shape::kKeys, STAGES = Shape::kStages;
  constexpr int CH = D / 8;                   // 16-byte chunks per key row
  constexpr int LOADS = KEYS * CH / 32;       // chunks each lane copies per tile (K and V each)
  const float kNegInf = -CUDART_INF_F;

  const int group = p.heads_q / p.heads_kv;
  const int rows_total = p.seqlen_q * group;
  const BlockAt blk = block_at(p, (rows_total + ROWS - 1) / ROWS);
  const int b = blk.b, chunk = blk.chunk, g = blk.g, split = blk.split;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int gi = lane / 4, ti = lane % 4;  // mma fragment coordinates
  // With splits a dependent launch (decode.cu): nothing is read before the work ahead of it (the
  // counters' clearing, and through it the append kernel and the caller's kernels) has ended. The
  // next call's clearing kernel may start at once and wait likewise.
  allow_dependent_launch();
  wait_for_primary();

  const int sk = seq_keys(p, b);
  const Variant var = decode_variant(p, sk);
  const int kbeg = split * p.keys_per_split;
  const int kend = max(kbeg, min(sk, kbeg + p.keys_per_split));

  // This thread's two fragment rows, gi and gi + 8 of the block's 16.
  int row_i[2], key_lo[2], key_hi[2];  // each row's visible keys: [key_lo, key_hi)
  ScoreMod mod[2];
  int lo = kend, hi = kbeg;
  unsigned qa[D / 16][4];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = chunk * ROWS + gi + 8 * hr;
    const int rr = min(r, rows_total - 1);
    row_i[hr] = rr / group;
    const int h = g * group + rr % group;
    const float slope = p.alibi ? p.alibi[b * p.alibi_b + h * p.alibi_h] : 0.f;
    mod[hr] = ScoreMod{p.scale * kLog2e, p.softcap * kLog2e, slope * kLog2e};
    key_lo[hr] = var.key_begin(row_i[hr]);
    key_hi[hr] = var.key_end(row_i[hr]);
    lo = min(lo, max(kbeg, key_lo[hr]));
    hi = max(hi, min(kend, key_hi[hr]));
    const T* qp = static_cast<const T*>(p.q) + b * p.q_b + row_i[hr] * p.q_i + h * p.q_h;
    // A fragment: regs 0/1 hold rows gi/gi+8 at columns 2ti, 2ti+1; regs 2/3 the same 8 columns on.
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = ks * 16 + half * 8 + 2 * ti;
        qa[ks][hr + 2 * half] = (r < rows_total && col < p.hdim_qk) ? *reinterpret_cast<const unsigned*>(qp + col) : 0u;
      }
  }
#pragma unroll
  for (int off = 4; off < 32; off *= 2) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, off));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, off));
  }
  // Tiles start at multiples of 16 keys: the keys before lo down to it are masked for every row or
  // lie before kbeg (itself a multiple of 16).
  lo = max(kbeg, lo / KEYS * KEYS);
  hi = max(hi, lo);

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* ring = reinterpret_cast<T*>(smem_raw) + warp * STAGES * 2 * KEYS * D;
  const int blocks = (hi - lo + KEYS - 1) / KEYS;
  const int iters = blocks > warp ? (blocks - warp + WARPS - 1) / WARPS : 0;
  auto key0 = [&](int it) { return lo + (it * WARPS + warp) * KEYS; };

  // Where a tile's keys may lie on several pages (page sizes that are not a multiple of 16), lane
  // n < 16 reads the page-table entry of key n of a tile one issue ahead of its copy, and the lanes
  // copying that key's chunks take its location by shuffle when they issue the copy, so the read's
  // latency hides behind a whole iteration instead of stalling the warp. Otherwise (contiguous
  // caches, page sizes of 16 keys and up) a tile lies on one page: its entry is read one issue
  // ahead, and a lane copies the same chunk c0 of rows n0, n0 + RSTEP, ... of it, rows a fixed
  // stride apart, a pointer step each (the per-key lookups, shuffles and 64-bit products were
  // most of the main loop's instructions).
  int entry = 0;
  auto fetch = [&](int it) {
    if constexpr (PER_KEY) {
      const int j = key0(it) + lane % KEYS;
      entry = page_entry(p, b, j < hi ? j : lo);
    } else {
      entry = page_entry(p, b, key0(it));
    }
  };
  constexpr int RSTEP = 32 / CH;
  const int n0 = lane / CH, c0 = lane % CH;
  const T* k_lane = static_cast<const T*>(p.k) + g * p.k_h + n0 * p.k_s + c0 * 8;
  const T* v_lane = static_cast<const T*>(p.v) + g * p.v_h + n0 * p.v_s + c0 * 8;
  const bool k_col = c0 * 8 < p.hdim_qk, v_col = c0 * 8 < p.hdim_v;
  auto issue = [&](int it) {
    if (it < iters) {
      T* tile = ring + (it % STAGES) * 2 * KEYS * D;
      if constexpr (PER_KEY) {
        const int jm = key0(it) + lane % KEYS;
        const KeyLoc mine = locate(p, entry, jm < hi ? jm : lo);
        if (it + 1 < iters) fetch(it + 1);
#pragma unroll
        for (int t = 0; t < LOADS; ++t) {
          const int n = (lane + 32 * t) / CH, c = (lane + 32 * t) % CH;
          const bool in = key0(it) + n < hi;
          const KeyLoc at{__shfl_sync(0xffffffffu, mine.page, n), __shfl_sync(0xffffffffu, mine.row, n)};
          const T* kp = static_cast<const T*>(p.k) + at.page * p.k_b + at.row * p.k_s + g * p.k_h + c * 8;
          const T* vp = static_cast<const T*>(p.v) + at.page * p.v_b + at.row * p.v_s + g * p.v_h + c * 8;
          cp_async16(tile + swz<D>(n, c), kp, in && c * 8 < p.hdim_qk);
          cp_async16(tile + KEYS * D + swz<D>(n, c), vp, in && c * 8 < p.hdim_v);
        }
      } else {
        const KeyLoc at = locate(p, entry, key0(it));
        if (it + 1 < iters) fetch(it + 1);
        const int rows_left = hi - key0(it) - n0;
        const T* kp = k_lane + at.page * p.k_b + at.row * p.k_s;
        const T* vp = v_lane + at.page * p.v_b + at.row * p.v_s;
#pragma unroll
        for (int t = 0; t < LOADS; ++t) {
          const bool in = t * RSTEP < rows_left;
          cp_async16(tile + swz<D>(n0 + t * RSTEP, c0), kp + t * RSTEP * p.k_s, in && k_col);
          cp_async16(tile + KEYS * D + swz<D>(n0 + t * RSTEP, c0), vp + t * RSTEP * p.v_s, in && v_col);
        }
      }
    }
    cp_async_commit();
  };
  if (iters > 0) fetch(0);
#pragma unroll
  for (int it = 0; it < STAGES - 1; ++it) issue(it);

  float o[D / 8][4] = {};
  const bool upper_rows = chunk * ROWS + 8 < rows_total;  // GQA groups of up to 8 rows leave 8-15 empty
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
  for (int it = 0; it < iters; ++it) {
    // The stage of the tile computed last iteration is refilled before this tile is waited for
    // while the stream ramps up (a warp's first kRampTiles: two tiles in flight fill the empty
    // memory pipe sooner), and after it from then on (one in flight). On the H100 refilling first
    // throughout cost 16x8k 0.8%, waiting first throughout cost 1x32k 2% (bench/notes/decode.md).
    if (it < Shape::kRampTiles) {
      __syncwarp();  // every lane has finished reading the stage refilled next
      issue(it + STAGES - 1);
      cp_async_wait<STAGES - 1>();
      __syncwarp();  // every lane's chunks of this tile have landed
    } else {
      cp_async_wait<STAGES - 2>();
      __syncwarp();  // this tile has landed, and every lane has read the last one
      issue(it + STAGES - 1);
    }
    const T* kt = ring + (it % STAGES) * 2 * KEYS * D;
    const T* vt = kt + KEYS * D;

    // S = Q K^T for 16 keys: two n8 tiles. ldmatrix x4: matrices (keys 0-7 | 8-15) x (cols lo | hi).
    float sc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      unsigned kb[4];
      ldmatrix_x4<false>(kt + swz<D>((lane / 16) * 8 + lane % 8, ks * 2 + (lane / 8) % 2), kb);
      mma16816<T>(sc[0], qa[ks], kb[0], kb[1]);
      mma16816<T>(sc[1], qa[ks], kb[2], kb[3]);
    }

    // Scores, mask and the online softmax; fragment (nt, e): row gi + 8 (e / 2), key nt*8 + 2ti + e%2.
    const int j0 = key0(it);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      if (hr == 1 && !upper_rows) {  // rows 8-15 are padding (zero queries): P = 0 there
        sc[0][2] = sc[0][3] = sc[1][2] = sc[1][3] = 0.f;
        continue;
      }
      float mx = kNegInf;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * ti + e;
          float& x = sc[nt][2 * hr + e];
          x = (j < hi && j >= key_lo[hr] && j < key_hi[hr]) ? mod[hr](x, row_i[hr], j, var.mask.alibi_diag) : kNegInf;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m[hr], mx);
      const float base = mnew == kNegInf ? 0.f : mnew;
      const float alpha = exp2f(m[hr] - base);
      m[hr] = mnew;
      l[hr] *= alpha;
      if (__any_sync(0xffffffffu, alpha != 1.f)) {  // past the first tiles the row maxima rarely move
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
          o[nd][2 * hr] *= alpha;
          o[nd][2 * hr + 1] *= alpha;
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[nt][2 * hr + e];
          x = exp2f(x - base);
          l[hr] += x;
        }
    }

    // O += P V: P's accumulator fragments are exactly the A fragment of a k16 step over the keys.
    const unsigned pa[4] = {pack2<T>(sc[0][0], sc[0][1]), pack2<T>(sc[0][2], sc[0][3]),
                            pack2<T>(sc[1][0], sc[1][1]), pack2<T>(sc[1][2], sc[1][3])};
#pragma unroll
    for (int nd = 0; nd < D / 8; nd += 2) {
      unsigned vb[4];  // transposed: matrices (keys 0-7 | 8-15) x (cols nd | nd + 1)
      ldmatrix_x4<true>(vt + swz<D>(lane % 8 + ((lane / 8) % 2) * 8, nd + lane / 16), vb);
      mma16816<T>(o[nd], pa, vb[0], vb[1]);
      mma16816<T>(o[nd + 1], pa, vb[2], vb[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the rings become the merge scratch
  const unsigned long long arrival = count_arrival(p);

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
  }
  float* s_acc = reinterpret_cast<float*>(smem_raw);  // [WARPS][ROWS][D]
  float* s_ml = s_acc + WARPS * ROWS * D;              // [WARPS][ROWS][2]
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = gi + 8 * hr;
    if (ti == 0 && chunk * ROWS + r < rows_total) {  // padding rows: nothing reads them
      s_ml[(warp * ROWS + r) * 2] = m[hr];
      s_ml[(warp * ROWS + r) * 2 + 1] = l[hr];
    }
  }
  __syncthreads();  // every warp's row maxima and sums
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = gi + 8 * hr;
    if (chunk * ROWS + r >= rows_total) continue;
    const float f = warp_weight<ROWS, WARPS>(s_ml, warp, r);
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      *reinterpret_cast<float2*>(s_acc + (warp * ROWS + r) * D + nd * 8 + 2 * ti) =
          make_float2(o[nd][2 * hr] * f, o[nd][2 * hr + 1] * f);
  }
  finish_block<T, ROWS, WARPS, D, 16>(p, s_acc, s_ml, s_ml + WARPS * ROWS * 2, b, g, chunk, split, arrival);
}

}  // namespace tileattn::cuda::decoding
