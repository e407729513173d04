// Score-tile passes: the variant's score transform, its element mask and dropout applied to an
// accumulator seen as (rows, cols), with `coord` giving each value's (row, col) in the tile; the
// forward's on S, the backward's element mask on S^T (mask_scores_t).
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

// The visible keys [lo, hi) of each of a thread's rows (absolute key indices): the variant's range,
// narrowed by the row's run of sorted document ids where `runs` is given (FwdTile::runs; nullptr:
// none), which then stands in for the ids' element test. A function of the rows alone, so a kernel
// whose rows stay for many key tiles takes it once.
template <int kR>
struct RowRanges {
  int lo[kR], hi[kR];
  bool runs;  // the ids' test is in the ranges
};

template <class S, class C>
__device__ __forceinline__ auto row_ranges(const S& s, const C& coord, const Variant& v, int row0,
                                           const int* runs = nullptr) {
  constexpr int kR = decltype(size<0>(s))::value;
  RowRanges<kR> r;
  r.runs = runs != nullptr;
  CUTE_UNROLL
  for (int i = 0; i < kR; ++i) {
    const int row = row0 + get<0>(coord(i, 0));
    r.lo[i] = v.key_begin(row);
    r.hi[i] = v.key_end(row);
    if (runs != nullptr && row < v.mask.seqlen_q) {
      r.lo[i] = max(r.lo[i], runs[2 * row]);
      r.hi[i] = min(r.hi[i], runs[2 * row + 1]);
    }
  }
  return r;
}

// The variant's element mask: each row's key range (`r`, from row_ranges), then, with document ids
// (unless the ranges hold them) or a dense mask, the per-element tests (reading ids and the mask
// only on the sequence's rows and keys).
template <class S, class C, int kR>
__device__ __forceinline__ void apply_mask(S& s, const C& coord, const Variant& v, int row0, int col0,
                                           const RowRanges<kR>& r) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    // The row's bounds relative to this thread's first column of it: the other columns' offsets
    // from that one are compile-time constants, so an element costs a compare with an immediate
    // and a select (a column in a register and two compares otherwise). A row whose first visible
    // key lies left of the thread's columns (causal; a window wider than the tile) has one bound.
    const int c0 = get<1>(coord(i, 0));
    const int lo = r.lo[i] - col0 - c0, hi = r.hi[i] - col0 - c0;
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
  if (v.document_tests() && !r.runs) {
    // Each key's id read once for all of the thread's rows (keys outside a row's range are masked
    // already); rows past the sequence have no id and keep their range alone.
    int doc[kR];
    bool real[kR];
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      const int row = row0 + get<0>(coord(i, 0));
      real[i] = row < v.mask.seqlen_q;
      doc[i] = real[i] ? v.doc_q[row * v.doc_q_stride] : 0;
    }
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j) {
      const int key = col0 + get<1>(coord(0, j));
      if (key >= v.mask.seqlen_k) continue;
      const int dk = v.doc_k[key * v.doc_k_stride];
      CUTE_UNROLL
      for (int i = 0; i < kR; ++i)
        if (real[i] && dk != doc[i]) s(i, j) = -INFINITY;
    }
  }
  if (!v.dense_mask()) return;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    const int row = row0 + get<0>(coord(i, 0));
    if (row >= v.mask.seqlen_q) continue;
    const int lo = r.lo[i] - col0, hi = r.hi[i] - col0;
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j) {
      const int c = get<1>(coord(i, j));
      if (c >= lo && c < hi && !v.dense_visible(row, col0 + c)) s(i, j) = -INFINITY;
    }
  }
}

// The same, with the rows' ranges taken for this tile alone.
template <class S, class C>
__device__ __forceinline__ void apply_mask(S& s, const C& coord, const Variant& v, int row0, int col0) {
  apply_mask(s, coord, v, row0, col0, row_ranges(s, coord, v, row0));
}

// The element mask on an S^T tile (keys x queries, as (rows, cols)) whose first key is n0 and first
// query m0. A bare Mask's test is a few instructions an element; a Variant's (chunks, a prefix,
// document ids, a dense mask) is many, so it takes each key's rows once, [query_begin,
// query_end), and each query's document id once per column, leaving a compare or two an element.
// A Variant's ids exist only for the sequence's rows and keys (a tile may run past them).
template <class S, class C>
__device__ __forceinline__ void mask_scores_t(const Mask& m, int n0, int m0, S& s, const C& c) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(s); ++i) {
    const int key = n0 + get<0>(c(i, 0));
    CUTE_UNROLL
    for (int j = 0; j < size<1>(s); ++j)
      if (!m.visible(m0 + get<1>(c(i, j)), key)) s(i, j) = -INFINITY;
  }
}
template <class S, class C>
__device__ __forceinline__ void mask_scores_t(const Variant& v, int n0, int m0, S& s, const C& c) {
  constexpr int kR = decltype(size<0>(s))::value, kC = decltype(size<1>(s))::value;
  // Columns relative to the thread's first: compile-time offsets once unrolled.
  const int q0 = m0 + get<1>(c(0, 0));
  CUTE_UNROLL
  for (int i = 0; i < kR; ++i) {
    const int key = n0 + get<0>(c(i, 0));
    const bool real = key < v.mask.seqlen_k;
    const int lo = (real ? v.query_begin(key) : 0) - q0, hi = (real ? v.query_end(key) : 0) - q0;
    CUTE_UNROLL
    for (int j = 0; j < kC; ++j) {
      const int dc = m0 + get<1>(c(i, j)) - q0;
      if (dc < lo || dc >= hi) s(i, j) = -INFINITY;
    }
  }
  if (!v.element_tests()) return;
  // Ids and the dense mask are read only on the sequence's rows and keys (the rest is masked above).
  if (v.document_tests()) {
    int doc_k[kR];
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      const int key = n0 + get<0>(c(i, 0));
      doc_k[i] = key < v.mask.seqlen_k ? v.doc_k[key * v.doc_k_stride] : 0;
    }
    CUTE_UNROLL
    for (int j = 0; j < kC; ++j) {
      const int q = m0 + get<1>(c(0, j));
      if (q >= v.mask.seqlen_q) continue;
      const int doc = v.doc_q[q * v.doc_q_stride];
      CUTE_UNROLL
      for (int i = 0; i < kR; ++i)
        if (doc_k[i] != doc) s(i, j) = -INFINITY;
    }
  }
  if (v.dense_mask()) {
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      const int key = n0 + get<0>(c(i, 0));
      if (key >= v.mask.seqlen_k) continue;
      CUTE_UNROLL
      for (int j = 0; j < kC; ++j) {
        const int q = m0 + get<1>(c(i, j));
        if (q < v.mask.seqlen_q && !v.dense_visible(q, key)) s(i, j) = -INFINITY;
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
