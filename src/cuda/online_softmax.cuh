// The online softmax of a query tile: a running max m and sum l per row, held by the four threads
// of an mma.sync quad that share the row. Scores arrive as (rows, cols) register views; with
// scale_log2 folded into one fma per element, p = exp2(s * scale_log2 - m * scale_log2).
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

namespace tileattn::cuda {

using namespace cute;

template <int kRows>
struct OnlineSoftmax {
  float m[kRows];
  float l[kRows];

  __device__ __forceinline__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      m[i] = -INFINITY;
      l[i] = 0.f;
    }
  }

  static __device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  }
  static __device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
  }

  // Turns the scores s into unnormalized probabilities and rescales the output rows o.
  // A row whose keys are all masked so far keeps m = -inf; its exps use 0 as the max so that
  // -inf - -inf never makes a NaN. scale_log2 must be > 0 (the caller folds other scales into s).
  template <class S, class O>
  __device__ __forceinline__ void update(S& s, O& o, float scale_log2) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      float mx = m[i];
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) mx = fmaxf(mx, s(i, j));
      mx = quad_max(mx);
      const float base = (mx == -INFINITY ? 0.f : mx) * scale_log2;
      const float corr = exp2f(m[i] * scale_log2 - base);
      m[i] = mx;
      l[i] *= corr;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(o); ++j) o(i, j) *= corr;
      float sum = 0.f;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        s(i, j) = exp2f(s(i, j) * scale_log2 - base);
        sum += s(i, j);
      }
      l[i] += sum;  // this thread's columns only; the quad's sum is formed once at the end
    }
  }

  // Normalizes o (times out_scale, the dropout's 1 / (1 - p)) and returns each row's natural-log
  // LSE in lse[i]: -inf and o = 0 for a row that saw no key.
  template <class O>
  __device__ __forceinline__ void finish(O& o, float scale_log2, float out_scale, float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const float sum = quad_sum(l[i]);
      const bool empty = sum == 0.f;
      const float inv = empty ? 0.f : out_scale / sum;
      lse[i] = empty ? -INFINITY : m[i] * scale_log2 * 0.6931471805599453f + __logf(sum);
      CUTE_UNROLL
      for (int j = 0; j < size<1>(o); ++j) o(i, j) *= inv;
    }
  }
};

}  // namespace tileattn::cuda
