// The end of a split call, inside the split kernel: the last block of a (batch, row chunk, KV
// head) to finish merges every split's partial output by its LSE. A separate combine kernel cost
// a kernel boundary and a chain of dependent reads after the last split block (about 4.5 us on an
// H100). Here a block counts its arrival as soon as its keys are done, so the last one learns it
// is last while its warps merge; it keeps its own partial in shared memory instead of writing it
// out behind a fence, and waits only until the other splits have published theirs (one state word
// per split group holds both counts). The merge runs in split order, so its result does not
// depend on which block arrives last.
#pragma once

#include <cstdint>

#include "cuda/decode/common.cuh"
#include "cuda/decode/vec.cuh"

namespace tileattn::cuda::decoding {

// Columns c and c + 1 of output row (b, i, h) (head dims are multiples of 8), merged over every
// split: the splits' LSEs and partials are read kBatch splits at a time, all loads of a batch
// independent of each other; split `own`'s (this block's) come from shared memory.
template <class T, int kBatch>
__device__ void merge_columns(const Params& p, int b, int i, int h, int c, int own, float2 own_x, float own_lse) {
  const float kNegInf = -CUDART_INF_F;
  const std::int64_t bh_rows = static_cast<std::int64_t>(p.batch) * p.seqlen_q * p.heads_q;
  const std::int64_t row = (static_cast<std::int64_t>(b) * p.seqlen_q + i) * p.heads_q + h;
  const float* lp = p.lse_partial + (static_cast<std::int64_t>(b) * p.heads_q + h) * p.seqlen_q + i;
  const float* op = p.out_partial + row * p.hdim_v + c;
  float m = kNegInf, l = 0.f;
  float2 acc = make_float2(0.f, 0.f);
  for (int s0 = 0; s0 < p.splits; s0 += kBatch) {
    float ls[kBatch];
    float2 xs[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int s = s0 + k;
      const bool in = s < p.splits && s != own;
      // __ldcg: L2 only; an L1 line of this SM may still hold an earlier call's partials.
      ls[k] = in ? __ldcg(lp + s * bh_rows) : s == own ? own_lse : kNegInf;
      xs[k] = in ? __ldcg(reinterpret_cast<const float2*>(op + s * bh_rows * p.hdim_v))
                 : s == own ? own_x : make_float2(0.f, 0.f);
    }
    float mb = m;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) mb = nan_max(mb, ls[k]);
    if (mb == kNegInf) continue;
    const float a = __expf(m - mb);  // 0 while m is still -inf
    l *= a;
    acc.x *= a, acc.y *= a;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float w = __expf(ls[k] - mb);
      if (w != 0.f) {  // an empty split (LSE -inf) adds nothing; a NaN one makes all NaN
        l += w;
        acc.x += w * xs[k].x, acc.y += w * xs[k].y;
      }
    }
    m = mb;
  }
  T* o = static_cast<T*>(p.out) + b * p.o_b + i * p.o_i + h * p.o_h + c;
  o[0] = from_float<T>(l != 0.f ? acc.x / l : 0.f);
  o[1] = from_float<T>(l != 0.f ? acc.y / l : 0.f);
  if (p.lse && c == 0) p.lse[b * p.l_b + h * p.l_h + i * p.l_i] = l != 0.f ? m + __logf(l) : kNegInf;
}

// The split group's state, one 64-bit word per blockIdx.x in p.group_state: blocks arrived in the
// high half, partials published in the low half. One word, so the last block's arrival also
// tells it whether every other split has published yet.
constexpr unsigned long long kArrival = 1ull << 32;

__device__ __forceinline__ unsigned long long* state_word(const Params& p) { return p.group_state + blockIdx.x; }

// Thread 0 of a split block, as soon as the block's keys are done: counts its arrival. The
// result is first used in finish_block, so its round trip overlaps the warps' merge. An acquire:
// the publications it counts (releases by the other blocks) are visible after it.
__device__ __forceinline__ unsigned long long count_arrival(const Params& p) {
  if (!p.group_state || threadIdx.x != 0) return 0;
  unsigned long long before;
  asm volatile("atom.acquire.gpu.global.add.u64 %0, [%1], %2;\n"
               : "=l"(before) : "l"(state_word(p)), "l"(kArrival) : "memory");
  return before;
}

// The end of every split-KV block, once its warps' weighted states are in s_acc (common.cuh) and
// thread 0 holds count_arrival's result. One split: the output. Otherwise every block but the
// last to arrive writes its partial and publishes it; the last keeps its own in shared memory,
// waits until every other split has published, and merges. BATCH: splits read at once (one
// round of reads for the usual 16 splits; 8 where registers are short).
template <class T, int ROWS, int WARPS, int D, int BATCH>
__device__ void finish_block(const Params& p, const float* s_acc, const float* s_ml, float* s_own, int b, int g,
                             int chunk, int split, unsigned long long arrival) {
  constexpr int THREADS = WARPS * 32;
  __shared__ int s_wait;  // the last block: publications it has yet to see; -1 for the others
  if (threadIdx.x == 0)
    s_wait = p.group_state && (arrival >> 32) == static_cast<unsigned>(p.splits - 1)
                 ? static_cast<int>(p.splits - 1 - (arrival & 0xffffffffu))
                 : -1;
  __syncthreads();  // s_acc and s_wait are written
  if (p.splits == 1) return sum_warps<T, ROWS, WARPS, D>(p, s_acc, s_ml, b, g, chunk, split, Sink::output, s_own);
  const int wait = s_wait;
  if (wait < 0) {
    sum_warps<T, ROWS, WARPS, D>(p, s_acc, s_ml, b, g, chunk, split, Sink::partial, s_own);
    __syncthreads();
    // The block's partial stores precede thread 0's publication through the barrier, and the
    // publication is a release, cumulative over them.
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u64 [%0], 1;\n" ::"l"(state_word(p)) : "memory");
    return;
  }
  sum_warps<T, ROWS, WARPS, D>(p, s_acc, s_ml, b, g, chunk, split, Sink::own, s_own);
  if (wait > 0 && threadIdx.x == 0) {
    unsigned long long now;  // the other blocks have all arrived: each is resident and publishes soon
    do asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(now) : "l"(state_word(p)) : "memory");
    while ((now & 0xffffffffu) != static_cast<unsigned>(p.splits - 1));
  }
  // Thread 0's acquire (the arrival or the wait) and this barrier make every other split's
  // partial visible to all threads of the block; s_own is written.
  __syncthreads();
  const int group = p.heads_q / p.heads_kv, rows_total = p.seqlen_q * group;
  const int rows = min(ROWS, rows_total - chunk * ROWS);
  // Thread e takes two columns of a row; rows of the chunk map to (query row, head) as in sum_warps.
  const int pairs = p.hdim_v / 2;
  for (int e = threadIdx.x; e < rows * pairs; e += THREADS) {
    const int r = e / pairs, c = 2 * (e % pairs), rr = chunk * ROWS + r;
    merge_columns<T, BATCH>(p, b, rr / group, g * group + rr % group, c, split,
                            *reinterpret_cast<const float2*>(s_own + r * D + c), s_own[ROWS * D + r]);
  }
}

}  // namespace tileattn::cuda::decoding
