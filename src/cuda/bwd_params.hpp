// The backward kernels' arguments: the forward's (fwd.o is the forward's output, fwd.lse its LSE,
// both read) plus the output gradient, the gradients and the fp32 scratch rows.
#pragma once

#include <cstdint>

#include "common/hd.hpp"
#include "cuda/fwd_params.hpp"
#include "cuda/tail_rows.hpp"

namespace tileattn::cuda {

struct BwdParams {
  FwdParams fwd;
  const void* dout;
  void *dq, *dk, *dv;
  std::int64_t do_batch, do_row, do_head;
  std::int64_t dq_batch, dq_row, dq_head;
  std::int64_t dk_batch, dk_row, dk_head;
  std::int64_t dv_batch, dv_row, dv_head;
  // Scratch indexed by (query head, row of the whole batch): a row's index is b * seqlen_q + i
  // (batched) or cu_seqlens_q[b] + i (varlen), out of rows_total.
  float* dsum;      // [heads_q][rows_total]: D = rowsum(dO * O)
  float* dq_accum;  // [heads_q][rows_total][dq_cols]: dQ summed over key blocks, columns as dq_column
  // Hopper: per (head, 64-row query tile; dq_turn_index), zeroed by the D kernel (by a memset where
  // no query rows leave it to run), which counts the key blocks that have reached the tile (the
  // default mode's tickets, the deterministic mode's turns: each block adds after every block
  // before it) and leaves it nonzero once the tile's rows are written; the rows of a tile left at 0
  // are dQ = 0 (no zeroing pass). Null elsewhere: the portable kernels' rows are zeroed by the D
  // kernel.
  int* dq_turns;
  std::int64_t turn_slots;  // the ints from dq_turns on (the dK, dV turns follow) the D kernel zeroes
  std::int64_t rows_total;
  int dq_cols;      // the kernel's head dim
  int batch;
  // Grouped heads split over group_parts blocks per key tile (Hopper): each block walks
  // group / group_parts heads of its group and adds its dK, dV into fp32 rows indexed by (KV head,
  // key row of the whole batch), [heads_kv][rows_k_total][dq_cols], columns as dq_column; null
  // where group_parts is 1 (a block owns its dK, dV).
  float *dk_accum, *dv_accum;
  std::int64_t rows_k_total;
  int group_parts;
  // Deterministic mode with group_parts > 1: per (KV head, key tile), how many parts have added
  // their dK, dV (dkv_turn_index); part z % group_parts adds after the parts below it.
  int* dkv_turns;
  // Deterministic mode on Hopper: key blocks are launched det_chain at a time over every (sequence,
  // head), last to first within a head (bwd_block); >= the key blocks of a row, one head's at a time.
  int det_chain;
  // Default mode on Hopper: key blocks are launched key block by key block over groups of about
  // group_blocks blocks (that many over a row's key blocks (sequence, head part) pairs; bwd_block);
  // 0: each pair's key blocks in turn.
  int group_blocks;
  // Varlen: dk's and dv's rows past the sequences, and dq's where no conversion pass writes every
  // row of it, written by the D kernel (tail_rows.hpp); end == nullptr: none.
  TailRows key_tails, query_tails;
};

// The fp32 dQ rows keep each row's 4-column chunks permuted by the row's index (chunk ^ 2 * (row % 4)):
// a warp's accumulator pairs (8 rows x 4 lanes, adjacent columns) then fall in distinct shared-memory
// banks when the Hopper kernel stages a tile for one bulk reduction, and the whole tile keeps rows
// contiguous. Every writer and the conversion go through this one map; dq_cols >= 32.
TA_HD int dq_column(std::int64_t row, int col) { return (((col >> 2) ^ (int(row & 3) << 1)) << 2) | (col & 3); }

// The tiles the Hopper kernel orders its dQ copies by (and the deterministic mode its dK, dV
// additions): 64 rows of one sequence (query rows for dQ, key rows for dK and dV).
inline constexpr int kDqTurnRows = 64;
// Distinct for every (head, sequence, tile) even where sequences start mid-tile (varlen).
TA_HD std::int64_t turn_index(std::int64_t rows, int batch, int h, std::int64_t row_base, int b, int r0) {
  return std::int64_t(h) * (rows / kDqTurnRows + batch + 1) + (row_base + r0) / kDqTurnRows + b;
}
TA_HD std::int64_t turn_count(std::int64_t rows, int heads, int batch) {
  return std::int64_t(heads) * (rows / kDqTurnRows + batch + 1);
}
TA_HD std::int64_t dq_turn_index(const BwdParams& p, int h, std::int64_t row_base, int b, int m0) {
  return turn_index(p.rows_total, p.batch, h, row_base, b, m0);
}
TA_HD std::int64_t dkv_turn_index(const BwdParams& p, int hk, std::int64_t key_base, int b, int n0) {
  return turn_index(p.rows_k_total, p.batch, hk, key_base, b, n0);
}

// The kernels leave the softmax scale out of dS (unless a softcap's derivative carries it) and
// apply this factor once, to dK and dQ.
TA_HD float ds_scale(const FwdParams& f) { return f.softcap > 0.f ? 1.f : f.scale; }

}  // namespace tileattn::cuda
