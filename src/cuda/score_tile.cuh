// Score-tile passes shared by the forward kernels: score modifiers, the mask and dropout applied
// to an accumulator seen as (rows, cols), with `coord` giving each value's (row, col) in the tile.
// Both mma.sync and wgmma accumulators hold column pairs (2q, 2q + 1) of 8-column groups.
#pragma once

#include <cute/tensor.hpp>

#include "common/mask.hpp"
#include "common/philox.hpp"
#include "common/score_mod.hpp"

namespace tileattn::cuda {

using namespace cute;

// Applies the score modifiers (scale, softcap, ALiBi) in place, leaving scores in log2 units.
template <class S, class C>
__device__ __forceinline__ void apply_score_mod(S& s, const C& coord, const ScoreMod& mod, int row0, int col0,
                                                int diag_offset) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    const int row = row0 + get<0>(coord(i, 0));
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j) s(i, j) = mod(s(i, j), row, col0 + get<1>(coord(i, j)), diag_offset) * kLog2e;
  }
}

template <class S, class C>
__device__ __forceinline__ void apply_mask(S& s, const C& coord, const Mask& mask, int row0, int col0) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    const int row = row0 + get<0>(coord(i, 0));
    const int lo = mask.key_begin(row) - col0, hi = mask.key_end(row) - col0;
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j) {
      const int c = get<1>(coord(i, j));
      if (c < lo || c >= hi) s(i, j) = -INFINITY;
    }
  }
}

// Zeroes dropped probabilities. Each thread holds column pairs (2q, 2q + 1) of 8-column groups, so
// one Philox draw (four columns) serves one pair.
template <class S, class C>
__device__ __forceinline__ void apply_dropout(S& p, const C& coord, const Dropout& drop, unsigned bh, int row0,
                                              int col0) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(p); ++i) {
    const unsigned row = unsigned(row0 + get<0>(coord(i, 0)));
    CUTE_UNROLL
    for (int j = 0; j < size<1>(p); j += 2) {
      const unsigned col = unsigned(col0 + get<1>(coord(i, j)));
      const unsigned bits = drop.keep4(bh, row, col >> 2) >> (col & 3u);
      if (!(bits & 1u)) p(i, j) = 0.f;
      if (!(bits & 2u)) p(i, j + 1) = 0.f;
    }
  }
}

}  // namespace tileattn::cuda
