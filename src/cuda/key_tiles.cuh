// Which key tiles a tile of query rows visits and how each is masked, from the variant (dense
// ranges: causal, window, chunks, documents) and the block mask where there is one. Every kernel
// walks its key (or query) tiles from the last visited one down, through next_visited.
#pragma once

#include "common/variant.hpp"
#include "cuda/fwd_params.hpp"

namespace tileattn::cuda {

// How a visited tile is masked: skip (not visited), none (every element visible), limit (only the
// keys past the sequence's end: a fully visible block there), rules (the variant's element mask).
enum class TileMask : unsigned char { skip, none, limit, rules };

// Rows [m0, m1) (m1 > m0, within one block of the block mask) of sequence b, query head h, against
// keys [n0, n0 + kBlockN) (within one key block). sk: the sequence's keys.
template <int kBlockN>
__device__ __forceinline__ TileMask tile_mask(const FwdParams& p, const Variant& v, int b, int h, int m0, int m1,
                                              int n0, int sk) {
  if (p.blocks.state != nullptr) {
    const unsigned char cell = p.blocks.row(b, h, m0 / p.blocks.block_q)[n0 / p.blocks.block_k];
    if (cell == 0) return TileMask::skip;
    if (cell == 2) return n0 + kBlockN > sk ? TileMask::limit : TileMask::none;
  }
  switch (v.visit(m0, m1, n0, n0 + kBlockN)) {
    case BlockVisit::skip: return TileMask::skip;
    case BlockVisit::full: return TileMask::none;
    default: return TileMask::rules;
  }
}

// A visited tile and how it is masked.
struct Visit {
  int n;
  TileMask mode;
};

// The first tile below n (counting down to lo) that mode(tile) does not skip; n < lo if none.
template <class Mode>
__device__ __forceinline__ Visit next_visited(int n, int lo, const Mode& mode) {
  Visit t{n - 1, TileMask::skip};
  for (; t.n >= lo && (t.mode = mode(t.n)) == TileMask::skip; --t.n) {
  }
  return t;
}

}  // namespace tileattn::cuda
