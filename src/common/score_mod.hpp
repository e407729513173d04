// Score modification between QK^T and the softmax: scale, softcap, ALiBi.
// One copy for every backend; the kernels stay generic over it.
#pragma once

#include <cmath>

#include "common/hd.hpp"

namespace tileattn {

inline constexpr float kLog2e = 1.4426950408889634f;

struct ScoreMod {
  float scale = 1.f;    // softmax scale
  float softcap = 0.f;  // 0 = off
  float alibi = 0.f;    // this head's slope; 0 = off

  // The scaled and softcapped score, before ALiBi.
  TA_HD float capped(float qk) const {
    float s = qk * scale;
    return softcap > 0.f ? softcap * tanhf(s / softcap) : s;
  }
  // ALiBi's bias for query row i and key j.
  TA_HD float alibi_bias(int i, int j, int diag_offset) const {
    int d = i + diag_offset - j;
    return alibi * static_cast<float>(d < 0 ? -d : d);
  }
  // Returns the modified score in natural-log units.
  TA_HD float operator()(float qk, int i, int j, int diag_offset) const {
    float s = capped(qk);
    if (alibi != 0.f) s -= alibi_bias(i, j, diag_offset);
    return s;
  }
  // d(modified score)/d(qk), for the backward pass, given the softcapped value.
  TA_HD float dscore(float modified_without_alibi) const {
    if (softcap <= 0.f) return scale;
    float t = modified_without_alibi / softcap;
    return scale * (1.f - t * t);
  }
};

}  // namespace tileattn
