// The public combine: merges caller-provided split partials by their log-sum-exp, one block per
// output row (decode merges its own splits inside the split kernel: split_merge.cuh). Its cost is
// latency, not bandwidth (a few kilobytes per row), so every read is independent of the others:
// the splits' LSEs in parallel across the block, then each column's partials in an unrolled loop,
// rather than a chain of dependent loads per split.
#pragma once

#include <cstdint>

#include "cuda/decode/common.cuh"
#include "cuda/decode/vec.cuh"

namespace tileattn::cuda::decoding {

struct CombineParams {
  const float* out_partial;  // [splits, batch, seqlen_q, heads, hdim_v]
  std::int64_t op_s, op_b, op_i, op_h;
  const float* lse_partial;  // [splits, batch, heads, seqlen_q]
  std::int64_t lp_s, lp_b, lp_h, lp_i;
  void* out;                 // [batch, seqlen_q, heads, hdim_v]
  std::int64_t o_b, o_i, o_h;
  float* lse;                // optional [batch, heads, seqlen_q]
  std::int64_t l_b, l_h, l_i;
  int splits, seqlen_q, heads, hdim_v;
};

constexpr int kCombineThreads = 128;

// x reduced over the block with op, in a fixed order (the result never depends on timing).
template <class Op>
__device__ __forceinline__ float block_reduce(float x, Op op, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, off));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
#pragma unroll
  for (int w = 1; w < kCombineThreads / 32; ++w) x = op(x, scratch[w]);
  __syncthreads();  // scratch is free again
  return x;
}

template <class T>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const CombineParams p) {
  const float kNegInf = -CUDART_INF_F;
  __shared__ float scratch[kCombineThreads / 32];
  const int row = blockIdx.x;  // (b, i, h)
  const int h = row % p.heads, i = row / p.heads % p.seqlen_q, b = row / p.heads / p.seqlen_q;
  const float* lp = p.lse_partial + b * p.lp_b + h * p.lp_h + i * p.lp_i;
  const float* op = p.out_partial + b * p.op_b + i * p.op_i + h * p.op_h;

  float m = kNegInf;
  // NaN-propagating: a NaN partial LSE makes the row NaN (the sums below turn NaN with it).
  for (int s = threadIdx.x; s < p.splits; s += kCombineThreads) m = nan_max(m, lp[s * p.lp_s]);
  m = block_reduce(m, [](float x, float y) { return nan_max(x, y); }, scratch);
  float l = 0.f;
  if (m != kNegInf)
    for (int s = threadIdx.x; s < p.splits; s += kCombineThreads) l += __expf(lp[s * p.lp_s] - m);
  l = block_reduce(l, [](float x, float y) { return x + y; }, scratch);

  T* o = static_cast<T*>(p.out) + b * p.o_b + i * p.o_i + h * p.o_h;
  for (int c = threadIdx.x; c < p.hdim_v; c += kCombineThreads) {
    float acc = 0.f;
    if (l != 0.f) {
#pragma unroll 16
      for (int s = 0; s < p.splits; ++s) {
        const float w = __expf(lp[s * p.lp_s] - m), x = op[s * p.op_s + c];
        acc += w != 0.f ? w * x : 0.f;  // an empty split's garbage never enters
      }
    }
    o[c] = from_float<T>(l != 0.f ? acc / l : 0.f);
  }
  if (p.lse && threadIdx.x == 0) p.lse[b * p.l_b + h * p.l_h + i * p.l_i] = l != 0.f ? m + __logf(l) : kNegInf;
}

}  // namespace tileattn::cuda::decoding
