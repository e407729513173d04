// A block-sparse mask (ForwardArgs::block_mask) as the CPU kernels walk it: per query block its key
// blocks (the forward), and per key block its query blocks (the backward's transposed mask, built
// once per call). Validated by the core: counts and indices are in range, no key block twice a row.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/problem.hpp"

namespace tileattn::cpu {

// The rows of the mask as the caller gave them. Sequence b and query head h read row
// (b or 0, h or 0) where the mask's batch or head dimension is 1.
class BlockMaskRows {
 public:
  explicit BlockMaskRows(const BlockMask& m);
  // fn(key block, full) for each key block query block qb of (sequence b, query head h) visits:
  // the fully visible ones first, then the partly visible ones.
  template <class Fn>
  void for_each(int b, int h, int qb, Fn fn) const {
    const std::int64_t mb = B_ == 1 ? 0 : b, mh = H_ == 1 ? 0 : h;
    if (m_->full_kv_num_blocks.present()) walk(m_->full_kv_num_blocks, m_->full_kv_indices, mb, mh, qb, true, fn);
    walk(m_->kv_num_blocks, m_->kv_indices, mb, mh, qb, false, fn);
  }
  std::int64_t batches() const { return B_; }
  std::int64_t heads() const { return H_; }

 private:
  template <class Fn>
  static void walk(const TensorView& num, const TensorView& idx, std::int64_t b, std::int64_t h, int qb, bool full, Fn& fn) {
    const std::int32_t* n = num.ptr<const std::int32_t>() + b * num.stride[0] + h * num.stride[1] + qb * num.stride[2];
    const std::int32_t* i = idx.ptr<const std::int32_t>() + b * idx.stride[0] + h * idx.stride[1] + qb * idx.stride[2];
    for (std::int32_t e = 0; e < *n; ++e) fn(static_cast<int>(i[e * idx.stride[3]]), full);
  }
  const BlockMask* m_;
  std::int64_t B_, H_;
};

// The transpose: per (mask row's batch, head, key block) the query blocks that visit it, in
// increasing order, each flagged full or partial. O(visited blocks) memory.
class TransposedBlockMask {
 public:
  TransposedBlockMask(const Problem& p, const BlockMask& m);
  template <class Fn>
  void for_each(int b, int h, int kb, Fn fn) const {
    const std::int64_t mb = B_ == 1 ? 0 : b, mh = H_ == 1 ? 0 : h;
    const std::int64_t list = (mb * H_ + mh) * kblocks_ + kb;
    for (std::int64_t e = start_[list]; e < start_[list + 1]; ++e) fn(entries_[e] >> 1, (entries_[e] & 1) != 0);
  }

 private:
  std::int64_t B_, H_, kblocks_;
  std::vector<std::int64_t> start_;    // [B * H * kblocks + 1] offsets into entries_
  std::vector<std::int32_t> entries_;  // query block << 1 | full
};

// Tiles of at most `tile` rows (or keys) that never straddle a block of `block` (0: no blocks):
// tile t starts at start(t) and holds up to size(t) rows, inside block block_of(t).
struct BlockTiling {
  int tile = 0, block = 0, per_block = 1;

  BlockTiling(int tile_, int block_) : tile(tile_), block(block_), per_block(block_ > 0 ? (block_ + tile_ - 1) / tile_ : 1) {}
  std::int64_t tiles(int len) const {
    return block > 0 ? (static_cast<std::int64_t>(len) + block - 1) / block * per_block : (static_cast<std::int64_t>(len) + tile - 1) / tile;
  }
  int start(std::int64_t t) const {
    return block > 0 ? static_cast<int>(t / per_block) * block + static_cast<int>(t % per_block) * tile : static_cast<int>(t) * tile;
  }
  int size(std::int64_t t) const {
    return block > 0 ? std::min(tile, block - static_cast<int>(t % per_block) * tile) : tile;
  }
  int block_of(std::int64_t t) const { return block > 0 ? static_cast<int>(t / per_block) : 0; }
};

}  // namespace tileattn::cpu
