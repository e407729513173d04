// The end of a split call, inside the split kernel: the last block of a (batch, row chunk, KV
// head) to finish merges every split's partial output by its LSE. A separate combine kernel cost
// a kernel boundary and a chain of dependent reads after the last split block (about 4.5 us on an
// H100); here only the arrival count and one round of reads remain. The merge runs in split
// order, so its result does not depend on which block arrives last.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/decode/common.cuh"
#include "cuda/decode/vec.cuh"

namespace tileattn::cuda::decoding {

// Columns c .. c + V - 1 of output row (b, i, h), merged over every split: the splits' LSEs and
// partials are read kBatch splits at a time, all loads of a batch independent of each other.
template <class T, int V, int kBatch>
__device__ void merge_columns(const Params& p, int b, int i, int h, int c) {
  const float kNegInf = -CUDART_INF_F;
  const std::int64_t bh_rows = static_cast<std::int64_t>(p.batch) * p.seqlen_q * p.heads_q;
  const std::int64_t row = (static_cast<std::int64_t>(b) * p.seqlen_q + i) * p.heads_q + h;
  const float* lp = p.lse_partial + (static_cast<std::int64_t>(b) * p.heads_q + h) * p.seqlen_q + i;
  const float* op = p.out_partial + row * p.hdim_v + c;
  float m = kNegInf, l = 0.f, acc[V] = {};
  for (int s0 = 0; s0 < p.splits; s0 += kBatch) {
    float ls[kBatch], xs[kBatch][V];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int s = s0 + k;
      const bool in = s < p.splits;
      // __ldcg: L2 only; an L1 line of this SM may still hold an earlier call's partials.
      ls[k] = in ? __ldcg(lp + s * bh_rows) : kNegInf;
      if constexpr (V == 2) {
        const float2 x = in ? __ldcg(reinterpret_cast<const float2*>(op + s * bh_rows * p.hdim_v)) : make_float2(0.f, 0.f);
        xs[k][0] = x.x, xs[k][1] = x.y;
      } else {
        xs[k][0] = in ? __ldcg(op + s * bh_rows * p.hdim_v) : 0.f;
      }
    }
    float mb = m;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) mb = fmaxf(mb, ls[k]);
    if (mb == kNegInf) continue;
    const float a = __expf(m - mb);  // 0 while m is still -inf
    l *= a;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] *= a;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float w = __expf(ls[k] - mb);
      if (w > 0.f) {  // an empty split (LSE -inf) adds nothing
        l += w;
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] += w * xs[k][v];
      }
    }
    m = mb;
  }
  T* o = static_cast<T*>(p.out) + b * p.o_b + i * p.o_i + h * p.o_h + c;
#pragma unroll
  for (int v = 0; v < V; ++v) o[v] = from_float<T>(l > 0.f ? acc[v] / l : 0.f);
  if (p.lse && c == 0) p.lse[b * p.l_b + h * p.l_h + i * p.l_i] = l > 0.f ? m + __logf(l) : kNegInf;
}

// Called by every thread of a split block after its partial is stored (merge_and_store). BATCH:
// splits read at once (one round of reads for the usual 16 splits; 8 where registers are short).
template <class T, int ROWS, int THREADS, int BATCH>
__device__ void merge_splits_if_last(const Params& p, int b, int g, int chunk) {
  __shared__ int s_last;
  // The block's partial stores precede thread 0's arrival through the barrier, and its arrival
  // is a release (cumulative over them) and an acquire of the earlier arrivals' releases: the
  // last block's reads after the second barrier see every split's partials, without the two
  // device-wide sequentially consistent fences this took before.
  __syncthreads();
  if (threadIdx.x == 0) {
    wait_for_primary();  // the counters' clearing has finished
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(p.arrivals + blockIdx.x) : "memory");
    s_last = before == p.splits - 1;
  }
  __syncthreads();
  if (!s_last) return;
  const int group = p.heads_q / p.heads_kv, rows_total = p.seqlen_q * group;
  const int rows = min(ROWS, rows_total - chunk * ROWS);
  // Thread e of a row's units takes V columns; rows of the chunk map to (query row, head) as in
  // merge_and_store.
  auto merge = [&](auto vec) {
    constexpr int V = decltype(vec)::value;
    const int units = p.hdim_v / V;
    for (int e = threadIdx.x; e < rows * units; e += THREADS) {
      const int rr = chunk * ROWS + e / units;
      merge_columns<T, V, BATCH>(p, b, rr / group, g * group + rr % group, V * (e % units));
    }
  };
  if (p.hdim_v % 2 == 0)
    merge(std::integral_constant<int, 2>{});
  else
    merge(std::integral_constant<int, 1>{});
}

}  // namespace tileattn::cuda::decoding
