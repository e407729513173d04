// The online softmax of a query tile: a running max m and sum l per row, held by the four threads
// of an mma.sync quad that share the row. Scores arrive as (rows, cols) register views; with
// scale_log2 folded into one fma per element, p = exp2(s * scale_log2 - m * scale_log2), where m
// may trail the true row max by a bounded amount (update).
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
  // The running max only moves when some row of this thread's would grow by more than
  // kSlackLog2 (log2 units): below that the exps against the kept max stay under 2^kSlackLog2,
  // harmless in the fp32 sums and the 16-bit P, and the rescale of o (a multiply per accumulator)
  // is skipped; lse is formed from the same kept max, so the result is unchanged. The four
  // threads of a quad hold the same rows, so they always decide alike.
  // A row whose keys are all masked so far keeps m = -inf; its exps use 0 as the max so that
  // -inf - -inf never makes a NaN. scale_log2 must be > 0 (the caller folds other scales into s).
  static constexpr float kSlackLog2 = 8.f;

  template <class S, class O>
  __device__ __forceinline__ void update(S& s, O& o, float scale_log2) {
    float corr[kRows];
    if (move_max(s, scale_log2, corr)) rescale(o, corr);
    exponentiate(s, scale_log2);
  }

  // A row's max and sum over this thread's columns as kChains independent chains, merged at the
  // end: one chain of dependent max (or add) instructions per row made the softmax wait on their
  // latency, 32 in a row at 128 columns.
  static constexpr int kChains = 4;

  // The first half of update: moves the running max for the scores s (rescaling the sums) and
  // returns whether it moved, with the factor the outputs must take in corr. A kernel whose output
  // product is still in flight applies rescale once it lands.
  template <class S>
  __device__ __forceinline__ bool move_max(const S& s, float scale_log2, float (&corr)[kRows]) {
    constexpr int kCols = decltype(size<1>(s))::value;
    constexpr int kC = kCols % kChains == 0 ? kChains : 1;
    float mx[kRows];
    bool grow = false;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      float part[kC];
      CUTE_UNROLL
      for (int c = 0; c < kC; ++c) part[c] = s(i, c);
      CUTE_UNROLL
      for (int j = kC; j < kCols; ++j) part[j % kC] = fmaxf(part[j % kC], s(i, j));
      mx[i] = m[i];
      CUTE_UNROLL
      for (int c = 0; c < kC; ++c) mx[i] = fmaxf(mx[i], part[c]);
      mx[i] = quad_max(mx[i]);
      // No NaN: -inf > -inf + slack is false, finite > -inf is true.
      grow |= mx[i] * scale_log2 > m[i] * scale_log2 + kSlackLog2;
    }
    if (grow) {
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        corr[i] = exp2f(m[i] * scale_log2 - (mx[i] == -INFINITY ? 0.f : mx[i]) * scale_log2);
        m[i] = mx[i];
        l[i] *= corr[i];
      }
    }
    return grow;
  }

  template <class O>
  static __device__ __forceinline__ void rescale(O& o, const float (&corr)[kRows]) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(o); ++j) o(i, j) *= corr[i];
    }
  }

  // The second half: scores to unnormalized probabilities against the kept max.
  template <class S>
  __device__ __forceinline__ void exponentiate(S& s, float scale_log2) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      constexpr int kCols = decltype(size<1>(s))::value;
      constexpr int kC = kCols % kChains == 0 ? kChains : 1;
      const float base = (m[i] == -INFINITY ? 0.f : m[i]) * scale_log2;
      float part[kC] = {};
      CUTE_UNROLL
      for (int j = 0; j < kCols; ++j) {
        s(i, j) = exp2f(s(i, j) * scale_log2 - base);
        part[j % kC] += s(i, j);
      }
      CUTE_UNROLL
      for (int c = 0; c < kC; ++c) l[i] += part[c];  // this thread's columns; the quad's sum comes at the end
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
