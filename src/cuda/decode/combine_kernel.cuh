// Merges split partials by their log-sum-exp: one block per output row.
#pragma once

#include <cstdint>

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

template <class T>
__global__ void combine_kernel(const CombineParams p) {
  const float kNegInf = -CUDART_INF_F;
  const int row = blockIdx.x;  // (b, i, h)
  const int h = row % p.heads, i = row / p.heads % p.seqlen_q, b = row / p.heads / p.seqlen_q;
  const float* lp = p.lse_partial + b * p.lp_b + h * p.lp_h + i * p.lp_i;
  float m = kNegInf;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, lp[s * p.lp_s]);
  float l = 0.f;
  if (m != kNegInf)
    for (int s = 0; s < p.splits; ++s) l += __expf(lp[s * p.lp_s] - m);
  const float* op = p.out_partial + b * p.op_b + i * p.op_i + h * p.op_h;
  T* o = static_cast<T*>(p.out) + b * p.o_b + i * p.o_i + h * p.o_h;
  for (int c = threadIdx.x; c < p.hdim_v; c += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < p.splits && l > 0.f; ++s) {
      const float w = __expf(lp[s * p.lp_s] - m);
      if (w > 0.f) acc += w * op[s * p.op_s + c];  // an empty split's garbage never enters
    }
    o[c] = from_float<T>(l > 0.f ? acc / l : 0.f);
  }
  if (p.lse && threadIdx.x == 0) p.lse[b * p.l_b + h * p.l_h + i * p.l_i] = l > 0.f ? m + __logf(l) : kNegInf;
}

}  // namespace tileattn::cuda::decoding
