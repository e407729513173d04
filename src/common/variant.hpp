// The attention variant of one sequence: everything that differs between attention flavours, in one
// host/device type built once per call (Problem::variant) and handed to the kernels' tile loops.
//   score:      scale, softcap and ALiBi (ScoreMod), and the derivative the backward needs;
//   visibility: causal or window in either alignment (Mask), chunked-local attention, prefix-LM
//               (the prompt's keys visible to every row), and document ids of packed sequences;
//   keep:       dropout's Philox bit (Dropout);
//   blocks:     which keys a block of query rows visits (fully, partly or not at all), and the
//               transpose for the backward (which query rows a block of keys meets).
// Every visibility rule here gives each query row one contiguous range of keys whose ends never
// decrease with the row, so a tile of rows needs only per-row bounds and block ranges stay dense;
// so do document ids where both sides' ids are sorted (packed sequences: each document one run of
// rows and one of keys, doc_keys). Unsorted document ids are an element test on top
// (same_document), and so is a block-sparse call's dense boolean mask (dense_visible).
// Block-sparse masks (an explicit list of key blocks per query block) sit on top of it: their
// partly visible blocks take this element mask.
#pragma once

#include "common/hd.hpp"
#include "common/mask.hpp"
#include "common/philox.hpp"
#include "common/score_mod.hpp"

namespace tileattn {

// How a block of query rows meets a block of keys.
enum class BlockVisit : unsigned char { skip, partial, full };

struct Variant {
  Mask mask;          // causal / window geometry of the sequence
  int chunk = 0;      // chunked-local attention: > 0 = a query sees only keys of its own chunk
  ScoreMod score;     // slope left 0: ALiBi's slope is per head (with_slope)
  bool alibi = false;
  bool dropout = false;
  Dropout drop;
  // Document ids of the sequence's query rows and keys (row i's at doc_q[i * doc_q_stride]); null:
  // none.
  const int* doc_q = nullptr;
  const int* doc_k = nullptr;
  long long doc_q_stride = 1, doc_k_stride = 1;
  // Where the sequence's ids are sorted on both sides: row i's document's keys are the run
  // [doc_keys[2i], doc_keys[2i + 1]) (empty where it has none), intersected with the row's range
  // instead of tested per element; both ends never decrease with the row. Null: none, or unsorted.
  // The CPU backend's (DocumentRuns builds them); read through runs().
  const int* doc_keys = nullptr;
  // A block mask's dense element mask as one query head of the sequence sees it (row i, key j at
  // dense[i * dense_row + j * dense_col], non-zero: visible); null: none. Per head, so the backends
  // set it where they pick the head; it reaches only partly visible blocks, which is all `visit`
  // ever reports under a block mask with one.
  const unsigned char* dense = nullptr;
  long long dense_row = 0, dense_col = 1;

  // floor(x / chunk) * chunk for any sign of x (a query's position may be negative when
  // seqlen_q > seqlen_k under bottom-right alignment).
  TA_HD int chunk_start(int x) const {
    const int q = x / chunk;
    return (q - (x % chunk != 0 && x < 0 ? 1 : 0)) * chunk;
  }
  // The position of query row i on the key axis (where its diagonal meets the keys).
  TA_HD int position(int i) const { return i + mask.diag_offset; }

  // Visible keys of row i: [key_begin(i), key_end(i)), possibly empty; both ends non-decreasing in i.
  TA_HD int key_begin(int i) const {
    int b = mask.key_begin(i);
    if (chunk > 0) {
      const int c = chunk_start(position(i));
      b = c > b ? c : b;
    }
    if (runs() != nullptr) {
      const int d = doc_begin(i);
      b = d > b ? d : b;
    }
    return b;
  }
  TA_HD int key_end(int i) const {
    int e = mask.key_end(i);
    if (chunk > 0) {
      const int c = chunk_start(position(i)) + chunk;
      e = c < e ? c : e;
    }
    e = prefix_end(e);
    if (runs() != nullptr) {
      const int d = doc_end(i);
      e = d < e ? d : e;
    }
    return e;
  }
  // The runs where there are: device code reads none here, and compiles as it would without them.
  // The Hopper forward takes its rows' runs apart (FwdTile::runs, from cuda/document_runs), so that
  // the other CUDA kernels' ranges stay as they were; they test the ids per element.
  TA_HD const int* runs() const {
#ifdef __CUDA_ARCH__
    return nullptr;
#else
    return doc_keys;
#endif
  }
  // Row i's run of keys in its document, taken as empty at the keys' end for a row past the
  // sequence (a tile's rows may run past it): the ends still never decrease.
  TA_HD int doc_begin(int i) const { return i < mask.seqlen_q ? runs()[2 * i] : mask.seqlen_k; }
  TA_HD int doc_end(int i) const { return i < mask.seqlen_q ? runs()[2 * i + 1] : mask.seqlen_k; }
  TA_HD bool documents() const { return doc_q != nullptr; }
  // Whether document ids need the per-element test (unsorted ids; sorted ones narrow the ranges).
  TA_HD bool document_tests() const { return doc_q != nullptr && runs() == nullptr; }
  TA_HD bool same_document(int i, int j) const { return doc_q[i * doc_q_stride] == doc_k[j * doc_k_stride]; }
  TA_HD bool dense_mask() const { return dense != nullptr; }
  // Whether visibility has a per-element test beyond the rows' key ranges.
  TA_HD bool element_tests() const { return document_tests() || dense_mask(); }
  TA_HD bool dense_visible(int i, int j) const { return dense[i * dense_row + j * dense_col] != 0; }
  TA_HD bool visible(int i, int j) const {
    return j >= key_begin(i) && j < key_end(i) && (!document_tests() || same_document(i, j)) &&
           (!dense_mask() || dense_visible(i, j));
  }

  // Rows that may see a key of [j0, j1) (j0 < j1): [row_begin(j0), row_end(j1)), a superset
  // where the rules combine, possibly empty. For the backward, which walks rows per key block.
  TA_HD int row_begin(int j0) const {
    int b = mask.block_row_begin(j0);
    if (chunk > 0) {
      const int c = chunk_start(j0) - mask.diag_offset;
      b = c > b ? c : b;
    }
    return prefix > j0 ? 0 : b;  // every row sees a prefix key
  }
  TA_HD int row_end(int j1) const {
    int e = mask.block_row_end(j1);
    if (chunk > 0) {
      const int c = chunk_start(j1 - 1) + chunk - mask.diag_offset;
      e = c < e ? c : e;
    }
    return e < 0 ? 0 : e;
  }
  // Rows of [0, seqlen_q) whose range holds key j (0 <= j < seqlen_k): [query_begin(j),
  // query_end(j)), possibly empty. Exact for one key (each rule's rows are an interval, and so is
  // their intersection) but for the element tests and the CPU's document runs; the backward's
  // per-key bound, as key_begin / key_end are the forward's per-row one.
  TA_HD int query_begin(int j) const { return row_begin(j); }
  TA_HD int query_end(int j) const {
    const int e = row_end(j + 1);
    return e < mask.seqlen_q ? e : mask.seqlen_q;
  }

  // Rows [i0, i1) (non-empty) against keys [j0, j1): from the end rows' ranges, since the ends
  // never decrease with the row. Exact for causal and window; under chunks or sorted document ids
  // a partial block may see nothing (rows of two chunks or documents around keys between them),
  // under unsorted document ids or a dense mask a block inside the ranges is partial.
  TA_HD BlockVisit visit(int i0, int i1, int j0, int j1) const {
    if (j0 >= key_end(i1 - 1) || j1 <= key_begin(i0)) return BlockVisit::skip;
    if (j0 >= key_begin(i1 - 1) && j1 <= key_end(i0) && !element_tests()) return BlockVisit::full;
    return BlockVisit::partial;
  }

  // The modified score of raw product qk at (i, j), natural-log units; its derivative in qk given
  // the value before ALiBi (capped).
  TA_HD float modified(float qk, int i, int j) const { return score(qk, i, j, mask.alibi_diag); }
  TA_HD float dscore(float capped) const { return score.dscore(capped); }
  // The same variant with head h's ALiBi slope.
  TA_HD Variant with_slope(float slope) const {
    Variant v = *this;
    v.score.alibi = slope;
    return v;
  }
  // Dropout: whether element (bh, i, j) is kept (always, without dropout).
  TA_HD bool keep(unsigned bh, int i, int j) const {
    return !dropout || drop.keep(bh, static_cast<unsigned>(i), static_cast<unsigned>(j));
  }

  // Prefix-LM: keys [0, prefix) are visible to every row besides its own range; 0 = off.
  // Validation allows it only where rows' ranges start at key 0 (no left window, no chunk), so the
  // union is one range again, [0, max(end, prefix)), and its end still never decreases with the row.
  int prefix = 0;
  TA_HD int prefix_end(int e) const {
    const int pe = prefix < mask.seqlen_k ? prefix : mask.seqlen_k;
    return pe > e ? pe : e;
  }
};

}  // namespace tileattn
