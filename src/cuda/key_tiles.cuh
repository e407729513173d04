// Which key tiles a tile of query rows visits and how each is masked, from the variant (dense
// ranges: causal, window, chunks, documents) and the block mask where there is one. Every kernel
// walks its key (or query) tiles from the last visited one down, through next_visited.
//
// kVariant: the kernel instantiation that takes chunks, document ids, prefixes and block masks (with
// their dense element masks; takes_variant). Without it
// they are compile-time absent (restricted()), so a causal or windowed call runs the code it ran
// before the variant existed: more live state in the tile loops made the portable kernels spill.
#pragma once

#include "common/variant.hpp"
#include "cuda/fwd_params.hpp"

namespace tileattn::cuda {

// The variant as an instantiation sees it: without kVariant, no chunks, no document ids, no prefix
// and no dense mask, as constants the compiler folds away.
template <bool kVariant>
__device__ __forceinline__ Variant restricted(Variant v) {
  if constexpr (!kVariant) {
    v.chunk = 0;
    v.prefix = 0;
    v.doc_q = v.doc_k = nullptr;
    v.dense = nullptr;
  }
  return v;
}

// How a visited tile is masked: skip (not visited), none (every element visible), limit (only the
// keys past the sequence's end: a fully visible block there), rules (the variant's element mask).
enum class TileMask : unsigned char { skip, none, limit, rules };

// A block mask's cell (BlockState: 0 skipped, 1 partly visible, 2 fully visible), or this where
// the call has no block mask.
inline constexpr unsigned char kNoBlockMask = 3;

// Rows [m0, m1) (m1 > m0, within one block of the block mask) of a sequence against keys
// [n0, n0 + kBlockN) (within one key block), whose cell is `cell`. sk: the sequence's keys.
template <int kBlockN, bool kVariant>
__device__ __forceinline__ TileMask tile_mask_in(unsigned char cell, const Variant& v, int m0, int m1, int n0, int sk) {
  if constexpr (kVariant) {
    if (cell == 0) return TileMask::skip;
    if (cell == 2) return n0 + kBlockN > sk ? TileMask::limit : TileMask::none;
  }
  switch (v.visit(m0, m1, n0, n0 + kBlockN)) {
    case BlockVisit::skip: return TileMask::skip;
    case BlockVisit::full: return TileMask::none;
    default: return TileMask::rules;
  }
}

// The same for query head h of sequence b, its cell read from the block mask.
template <int kBlockN, bool kVariant>
__device__ __forceinline__ TileMask tile_mask(const FwdParams& p, const Variant& v, int b, int h, int m0, int m1,
                                              int n0, int sk) {
  unsigned char cell = kNoBlockMask;
  if constexpr (kVariant) {
    if (p.blocks.state != nullptr) cell = p.blocks.row(b, h, m0 / p.blocks.block_q)[n0 / p.blocks.block_k];
  }
  return tile_mask_in<kBlockN, kVariant>(cell, v, m0, m1, n0, sk);
}

// The highest cell at or below c of a block-mask row (16-byte aligned, padded: BlockState) that
// is visited (non-zero), or -1: 16 cells a load, so that a sparse row's skipped blocks cost little.
__device__ __forceinline__ int last_visited_cell(const unsigned char* cells, int c) {
  for (int base = c & ~15, k = c - base; base >= 0; base -= 16, k = 15) {
    const uint4 w = *reinterpret_cast<const uint4*>(cells + base);
    unsigned long long lo = (static_cast<unsigned long long>(w.y) << 32) | w.x;  // cells base .. base + 7
    unsigned long long hi = (static_cast<unsigned long long>(w.w) << 32) | w.z;
    if (k < 8) {  // only cells base .. base + k count
      hi = 0;
      if (k < 7) lo &= (1ull << (8 * (k + 1))) - 1;
    } else if (k < 15) {
      hi &= (1ull << (8 * (k - 7))) - 1;
    }
    if (hi != 0) return base + 8 + (63 - __clzll(hi)) / 8;
    if (lo != 0) return base + (63 - __clzll(lo)) / 8;
  }
  return -1;
}

// A visited tile and how it is masked.
struct Visit {
  int n;
  TileMask mode;
};

// The first tile below n (counting down to lo) that mode(tile) does not skip; n < lo if none.
// Without kVariant every tile of the range is visited: causal and window ranges have no gaps.
template <bool kVariant, class Mode>
__device__ __forceinline__ Visit next_visited(int n, int lo, const Mode& mode) {
  Visit t{n - 1, TileMask::skip};
  if constexpr (kVariant) {
    for (; t.n >= lo && (t.mode = mode(t.n)) == TileMask::skip; --t.n) {
    }
  } else if (t.n >= lo) {
    t.mode = mode(t.n);
  }
  return t;
}

}  // namespace tileattn::cuda
