// Where one forward work tile (a query tile of one sequence and head) lies: its rows, the
// sequence's bounds and variant, and the range of key tiles it may visit (key_tiles.cuh says which
// of them it does and how each is masked). Every forward kernel and
// every role inside one (the Hopper kernel's producer and consumers) derives it the same way.
#pragma once

#include <cute/tensor.hpp>

#include "common/variant.hpp"
#include "cuda/fwd_params.hpp"
#include "cuda/key_tiles.cuh"

namespace tileattn::cuda {

struct FwdTile {
  int m_block, b, h, hk;
  int q_start, k_start;  // the sequence's first row in q and in k, v (varlen; 0 otherwise)
  int sq, sk;            // the sequence's lengths
  int m0, rows;          // the tile's first query row and how many of its rows exist (<= 0: none)
  int n_min, n_max;      // key tiles [n_min, n_max) hold every key a row of the tile sees
  Variant var;           // without ALiBi's slope; restricted<kVariant>
  // The block mask's cells of the tile's query block, one per key block; nullptr: no block mask.
  const unsigned char* cells;
  // Where the sequence's document ids are sorted, its rows' runs of keys (FwdParams::doc_runs from
  // the sequence's first row); nullptr: none.
  const int* runs;

  __device__ bool has_rows() const { return rows > 0; }
  // How the tile meets key tile n.
  template <int kBlockN, bool kVariant>
  __device__ __forceinline__ TileMask mask(const FwdParams& p, int n) const {
    const unsigned char cell = cells != nullptr ? cells[n * kBlockN / p.blocks.block_k] : kNoBlockMask;
    return tile_mask_in<kBlockN, kVariant>(cell, var, m0, m0 + rows, n * kBlockN, sk);
  }
  // Whether the tile visits any key tile.
  template <int kBlockN, bool kVariant>
  __device__ __forceinline__ bool has_keys(const FwdParams& p) const {
    return next<kBlockN, kVariant>(p, n_max).n >= n_min;
  }
  // The highest key tile below n the tile visits; n < n_min: none. Under a block mask the row's
  // cells say where the next visited block is.
  template <int kBlockN, bool kVariant>
  __device__ __forceinline__ Visit next(const FwdParams& p, int n) const {
    if constexpr (kVariant) {
      if (cells != nullptr) {
        const int bk = p.blocks.block_k;
        for (int t = n - 1; t >= n_min; --t) {
          const int c0 = t * kBlockN / bk;
          if (cells[c0] == 0) {  // skip to the visited block below
            const int c = last_visited_cell(cells, c0);
            if (c < 0) break;
            t = (c + 1) * bk / kBlockN - 1;  // its last tile
          }
          const TileMask m = mask<kBlockN, kVariant>(p, t);
          if (m != TileMask::skip) return {t, m};
        }
        return {n_min - 1, TileMask::skip};
      }
    }
    return next_visited<kVariant>(n, n_min, [&](int t) { return mask<kBlockN, kVariant>(p, t); });
  }
};

// kVariant: as in key_tiles.cuh.
template <int kBlockM, int kBlockN, bool kVariant>
__device__ __forceinline__ FwdTile fwd_tile(const FwdParams& p, int m_block, int b, int h) {
  FwdTile t;
  t.m_block = m_block;
  t.b = b;
  t.h = h;
  t.hk = h / p.group;
  const SeqRows r = seq_rows(p, b);
  t.q_start = r.q_start, t.k_start = r.k_start, t.sq = r.sq, t.sk = r.sk;
  t.m0 = m_block * kBlockM;
  t.rows = min(kBlockM, t.sq - t.m0);
  Variant v = sequence_variant(p, b, t.q_start, t.k_start, t.sq, t.sk);
  if constexpr (kVariant) set_dense_mask(p, v, b, h);
  t.var = restricted<kVariant>(v);
  t.n_min = t.n_max = 0;
  t.cells = nullptr;
  t.runs = nullptr;
  if constexpr (kVariant) {
    if (p.doc_runs != nullptr && p.doc_sorted[b] != 0)
      t.runs = p.doc_runs + 2 * ((p.cu_q != nullptr ? 0 : std::int64_t(b) * p.seqlen_q) + t.q_start);
  }
  if (t.rows > 0) {
    // A block mask's fully visible blocks take no element mask: any key may be visible.
    const bool blocks = kVariant && p.blocks.state != nullptr;
    const int key_lo = blocks ? 0 : max(t.var.key_begin(t.m0), 0);
    const int key_hi = blocks ? t.sk : min(t.var.key_end(t.m0 + t.rows - 1), t.sk);
    t.n_min = key_lo / kBlockN;
    t.n_max = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : t.n_min;
    if (blocks) t.cells = p.blocks.row(b, h, t.m0 / p.blocks.block_q);
  }
  return t;
}

}  // namespace tileattn::cuda
