#include "cpu/block_sparse.hpp"

namespace tileattn::cpu {

BlockMaskRows::BlockMaskRows(const BlockMask& m)
    : m_(&m), B_(m.kv_num_blocks.shape[0]), H_(m.kv_num_blocks.shape[1]) {}

TransposedBlockMask::TransposedBlockMask(const Problem& p, const BlockMask& m)
    : B_(m.kv_num_blocks.shape[0]), H_(m.kv_num_blocks.shape[1]), kblocks_((p.seqlen_k + p.block_k - 1) / p.block_k) {
  const BlockMaskRows rows(m);
  const int qblocks = (p.seqlen_q + p.block_q - 1) / p.block_q;
  start_.assign(static_cast<std::size_t>(B_ * H_ * kblocks_ + 1), 0);
  // Count per list, prefix-sum, then fill in query-block order (so each list comes out sorted).
  for (std::int64_t b = 0; b < B_; ++b)
    for (std::int64_t h = 0; h < H_; ++h)
      for (int qb = 0; qb < qblocks; ++qb)
        rows.for_each(static_cast<int>(b), static_cast<int>(h), qb, [&](int kb, bool) { ++start_[(b * H_ + h) * kblocks_ + kb + 1]; });
  for (std::size_t i = 1; i < start_.size(); ++i) start_[i] += start_[i - 1];
  entries_.resize(static_cast<std::size_t>(start_.back()));
  std::vector<std::int64_t> fill(start_.begin(), start_.end() - 1);
  for (std::int64_t b = 0; b < B_; ++b)
    for (std::int64_t h = 0; h < H_; ++h)
      for (int qb = 0; qb < qblocks; ++qb)
        rows.for_each(static_cast<int>(b), static_cast<int>(h), qb, [&](int kb, bool full) {
          entries_[fill[(b * H_ + h) * kblocks_ + kb]++] = qb << 1 | (full ? 1 : 0);
        });
}

}  // namespace tileattn::cpu
