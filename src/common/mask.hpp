// The mask: which keys a query row sees. One copy for every backend.
#pragma once

#include "common/hd.hpp"

namespace tileattn {

// Per-sequence mask geometry. diag = where row i's diagonal meets the keys:
// i + seqlen_k - seqlen_q for bottom-right alignment, i for top-left.
struct Mask {
  int seqlen_q = 0, seqlen_k = 0;
  int diag_offset = 0;  // seqlen_k - seqlen_q (bottom_right) or 0 (top_left)
  int left = -1;        // window left; -1 = unbounded
  int right = -1;       // window right (causal => 0); -1 = unbounded
  int alibi_diag = 0;   // ALiBi's distance is |i + alibi_diag - j|: diag_offset unless the call sets it

  Mask() = default;
  TA_HD Mask(int sq, int sk, bool bottom_right, int wl, int wr)
      : seqlen_q(sq), seqlen_k(sk), diag_offset(bottom_right ? sk - sq : 0), left(wl), right(wr),
        alibi_diag(diag_offset) {}
  // The same with ALiBi's diagonal given (Options::alibi_diagonal); unset keeps diag_offset.
  TA_HD Mask with_alibi_diag(bool set, int diag) const {
    Mask m = *this;
    if (set) m.alibi_diag = diag;
    return m;
  }

  // First and one-past-last visible key of row i (may give an empty range).
  TA_HD int key_begin(int i) const {
    int b = left < 0 ? 0 : i + diag_offset - left;
    return b < 0 ? 0 : b;
  }
  TA_HD int key_end(int i) const {
    int e = right < 0 ? seqlen_k : i + diag_offset + right + 1;
    return e > seqlen_k ? seqlen_k : e;
  }
  TA_HD bool visible(int i, int j) const { return j >= key_begin(i) && j < key_end(i); }
  // Keys any row of [i0, i1) sees: for block skipping.
  TA_HD int block_key_begin(int i0) const { return key_begin(i0); }
  TA_HD int block_key_end(int i1) const { return key_end(i1 - 1); }
  // Rows that see any key of [j0, j1) (j0 < j1 <= seqlen_k): [block_row_begin(j0), block_row_end(j1)),
  // possibly empty. For the backward, which walks query blocks per key block.
  TA_HD int block_row_begin(int j0) const {
    int b = right < 0 ? 0 : j0 - diag_offset - right;
    return b < 0 ? 0 : b;
  }
  TA_HD int block_row_end(int j1) const {
    int e = left < 0 ? seqlen_q : j1 - diag_offset + left;
    return e > seqlen_q ? seqlen_q : e;
  }
  // True if every (i, j) in the block is visible: no per-element masking needed.
  TA_HD bool block_full(int i0, int i1, int j0, int j1) const {
    return j0 >= key_begin(i1 - 1) && j1 <= key_end(i0);
  }
};

}  // namespace tileattn
