// The forward kernel's arguments: plain data resolved on the host from a validated problem.
#pragma once

#include <cstdint>

#include "common/hd.hpp"
#include "common/mask.hpp"
#include "common/philox.hpp"
#include "common/variant.hpp"

namespace tileattn::cuda {

// A block mask (ForwardArgs::block_mask) as the kernels read it: one byte per (mask batch, mask head,
// query block, key block) cell, 0 skipped, 1 partly visible (the variant's element mask applies),
// 2 fully visible (no element mask), scattered from the caller's lists before the kernels run
// (block_state.cu). Dims 0 and 1 of the mask may be 1 (shared by every sequence or head).
struct BlockState {
  // [batches][heads][qblocks][row_cells]: rows padded with zeros to 16-byte multiples, so that a
  // row is scanned 16 cells a load (last_visited_cell); nullptr: no block mask.
  const unsigned char* state;
  int batches, heads, qblocks, kblocks, block_q, block_k;

  TA_HD int row_cells() const { return (kblocks + 15) / 16 * 16; }
  // The cells of query block qb of (sequence b, query head h), one per key block.
  TA_HD const unsigned char* row(int b, int h, int qb) const {
    const std::int64_t mb = batches == 1 ? 0 : b, mh = heads == 1 ? 0 : h;
    return state + ((mb * heads + mh) * qblocks + qb) * std::int64_t(row_cells());
  }
};

struct FwdParams {
  const void *q, *k, *v;
  void* o;
  float* lse;  // nullptr: not requested
  // Element strides. Varlen: batch strides are 0 and rows start at cu_seqlens[b].
  std::int64_t q_batch, q_row, q_head;
  std::int64_t k_batch, k_row, k_head;
  std::int64_t v_batch, v_row, v_head;
  std::int64_t o_batch, o_row, o_head;
  std::int64_t lse_batch, lse_head, lse_row;
  const int *cu_q, *cu_k;  // nullptr unless varlen
  int heads_q, group;      // group = heads_q / heads_kv
  int seqlen_q, seqlen_k;  // batched: the lengths; varlen: unused bounds
  int q_rows, k_rows;      // rows of q and of k, v per batch entry: the lengths, or the packed totals (varlen)
  int d_qk, d_v;           // actual head dims (the kernel's tile may be wider)
  float scale, scale_log2, softcap;
  bool bottom_right;
  int window_left, window_right;
  bool alibi_diag_set;  // Options::alibi_diagonal given (alibi_diag), else the causal diagonal
  int alibi_diag;
  const float* alibi;  // nullptr: off
  std::int64_t alibi_batch, alibi_head;
  bool dropout;
  Dropout drop;
  int chunk;                        // chunked-local attention; 0 = off
  // Prefix-LM: every row also sees keys [0, prefix) of its sequence, prefix = prefix_lens[b *
  // prefix_stride] where given, else prefix_len (0 = off; a negative length counts as 0).
  int prefix_len;
  const int* prefix_lens;
  std::int64_t prefix_stride;
  const int *doc_q, *doc_k;         // document ids; nullptr: none
  std::int64_t doc_q_batch, doc_q_row, doc_k_batch, doc_k_row;
  // The forward's runs of sorted ids (document_runs.hpp): doc_sorted[b] non-zero where sequence b's
  // ids are sorted, and then its query row i's keys of its document are [doc_runs[2g], doc_runs[2g
  // + 1]) with g = b * seqlen_q + i (batched) or cu_q[b] + i (varlen); nullptr: none.
  const int *doc_sorted, *doc_runs;
  // The block mask's dense element mask (BlockMask::mask, u8); nullptr: none. Element strides, the
  // batch and head ones 0 where the mask broadcasts over that dim; rows and keys by their positions
  // in the sequence.
  const unsigned char* dense;
  std::int64_t dense_batch, dense_head, dense_row, dense_col;
  BlockState blocks;                // block-sparse: the mask's cells; blocks.state == nullptr: none
};

// Where sequence b lies: its first query row in q and first key row in k and v (0 unless varlen), and
// its sq query rows and sk keys.
struct SeqRows {
  int q_start, k_start, sq, sk;
};

// [lo, hi] bounds on x.
TA_HD int clamp_to(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Varlen: cu_seqlens are read on the device, where no check has seen them (the host never reads
// device memory), so a sequence is clamped to the packed buffers' rows (q_rows, k_rows): no value of
// the caller's makes a kernel read or write outside the tensors. Valid offsets pass unchanged.
TA_HD SeqRows seq_rows(const FwdParams& p, int b) {
  SeqRows r{0, 0, p.seqlen_q, p.seqlen_k};
  if (p.cu_q != nullptr) {
    r.q_start = clamp_to(p.cu_q[b], 0, p.q_rows);
    r.sq = clamp_to(p.cu_q[b + 1], r.q_start, p.q_rows) - r.q_start;
    r.k_start = clamp_to(p.cu_k[b], 0, p.k_rows);
    r.sk = clamp_to(p.cu_k[b + 1], r.k_start, p.k_rows) - r.k_start;
  }
  return r;
}

// The variant of sequence b (rows from q_start, keys from k_start; sq x sk), without ALiBi's slope
// (per head: Variant::with_slope). Built from the host-resolved fields above.
TA_HD Variant sequence_variant(const FwdParams& p, int b, int q_start, int k_start, int sq, int sk) {
  Variant v;
  v.mask = Mask(sq, sk, p.bottom_right, p.window_left, p.window_right).with_alibi_diag(p.alibi_diag_set, p.alibi_diag);
  v.chunk = p.chunk;
  v.prefix = p.prefix_lens != nullptr ? p.prefix_lens[b * p.prefix_stride] : p.prefix_len;
  v.score = ScoreMod{p.scale, p.softcap, 0.f};
  v.alibi = p.alibi != nullptr;
  v.dropout = p.dropout;
  v.drop = p.drop;
  if (p.doc_q != nullptr) {
    v.doc_q = p.doc_q + b * p.doc_q_batch + std::int64_t(q_start) * p.doc_q_row;
    v.doc_k = p.doc_k + b * p.doc_k_batch + std::int64_t(k_start) * p.doc_k_row;
    v.doc_q_stride = p.doc_q_row;
    v.doc_k_stride = p.doc_k_row;
  }
  return v;
}

// Query head h's view of the dense element mask into v, a variant of sequence b; none: unchanged.
TA_HD void set_dense_mask(const FwdParams& p, Variant& v, int b, int h) {
  if (p.dense == nullptr) return;
  v.dense = p.dense + b * p.dense_batch + h * p.dense_head;
  v.dense_row = p.dense_row;
  v.dense_col = p.dense_col;
}

}  // namespace tileattn::cuda
