// Score-tile passes shared by the forward kernels: the variant's score transform, its element mask
// and dropout applied to an accumulator seen as (rows, cols), with `coord` giving each value's
// (row, col) in the tile.
// Both mma.sync and wgmma accumulators hold column pairs (2q, 2q + 1) of 8-column groups.
#pragma once

#include <cute/tensor.hpp>

#include "common/philox.hpp"
#include "common/variant.hpp"

namespace tileattn::cuda {

using namespace cute;

// Applies the variant's score transform (scale, softcap, ALiBi) in place, leaving scores in log2
// units.
template <class S, class C>
__device__ __forceinline__ void apply_score_mod(S& s, const C& coord, const Variant& v, int row0, int col0) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    const int row = row0 + get<0>(coord(i, 0));
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j) s(i, j) = v.modified(s(i, j), row, col0 + get<1>(coord(i, j))) * kLog2e;
  }
}

// The variant's element mask: each row's key range, then, with document ids or a dense mask, the
// per-element tests (only inside the range and on the sequence's rows, so that nothing is read past
// the sequence).
template <class S, class C>
__device__ __forceinline__ void apply_mask(S& s, const C& coord, const Variant& v, int row0, int col0) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    const int row = row0 + get<0>(coord(i, 0));
    // The row's bounds relative to this thread's first column of it: the other columns' offsets
    // from that one are compile-time constants, so an element costs a compare with an immediate
    // and a select (a column in a register and two compares otherwise). A row whose first visible
    // key lies left of the thread's columns (causal; a window wider than the tile) has one bound.
    const int c0 = get<1>(coord(i, 0));
    const int lo = v.key_begin(row) - col0 - c0, hi = v.key_end(row) - col0 - c0;
    int first = 0;  // the leftmost of the thread's columns, relative to c0 (a constant once unrolled)
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j) first = min(first, get<1>(coord(i, j)) - c0);
    if (lo <= first) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j)
        if (get<1>(coord(i, j)) - c0 >= hi) s(i, j) = -INFINITY;
    } else {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        const int dc = get<1>(coord(i, j)) - c0;
        if (dc < lo || dc >= hi) s(i, j) = -INFINITY;
      }
    }
  }
  if (!v.element_tests()) return;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    const int row = row0 + get<0>(coord(i, 0));
    if (row >= v.mask.seqlen_q) continue;
    const int lo = v.key_begin(row) - col0, hi = v.key_end(row) - col0;
    if (v.document_tests()) {
      const int doc = v.doc_q[row * v.doc_q_stride];
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        const int c = get<1>(coord(i, j));
        if (c >= lo && c < hi && v.doc_k[(col0 + c) * v.doc_k_stride] != doc) s(i, j) = -INFINITY;
      }
    }
    if (v.dense_mask()) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        const int c = get<1>(coord(i, j));
        if (c >= lo && c < hi && !v.dense_visible(row, col0 + c)) s(i, j) = -INFINITY;
      }
    }
  }
}

// Masks the keys from `limit` on (tile columns): a fully visible block at the sequence's end.
template <class S, class C>
__device__ __forceinline__ void apply_key_limit(S& s, const C& coord, int limit) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j)
      if (get<1>(coord(i, j)) >= limit) s(i, j) = -INFINITY;
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
