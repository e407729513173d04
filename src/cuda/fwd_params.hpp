// The forward kernel's arguments: plain data resolved on the host from a validated problem.
#pragma once

#include <cstdint>

#include "common/mask.hpp"
#include "common/philox.hpp"

namespace tileattn::cuda {

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
  const float* alibi;  // nullptr: off
  std::int64_t alibi_batch, alibi_head;
  bool dropout;
  Dropout drop;
};

}  // namespace tileattn::cuda
