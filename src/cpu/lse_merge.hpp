// The LSE merge of partial attention results over disjoint key sets, shared by the combine call
// and the split-KV decode: out = sum_s w_s * out_s with w_s = exp(lse_s - lse),
// lse = log(sum_s exp(lse_s)).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace tileattn::cpu {

// w holds the n partial lse values on entry and their weights on return (exactly 0 for an empty
// part, whose output may hold garbage and must never reach the sum). Returns the merged lse:
// -inf when every part is empty. A NaN lse (a NaN input reached that part) makes every weight and
// the merged lse NaN, so the NaN reaches the output.
inline float lse_merge_weights(float* w, int n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m = kNegInf;
  for (int s = 0; s < n; ++s) {
    if (std::isnan(w[s])) {
      std::fill(w, w + n, w[s]);
      return w[s];
    }
    m = std::max(m, w[s]);
  }
  if (m == kNegInf) {
    std::fill(w, w + n, 0.f);
    return kNegInf;
  }
  float l = 0;
  for (int s = 0; s < n; ++s) l += (w[s] = std::exp(w[s] - m));
  for (int s = 0; s < n; ++s) w[s] /= l;
  return m + std::log(l);
}

}  // namespace tileattn::cpu
