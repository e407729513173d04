// The backward kernels' arguments: the forward's (fwd.o is the forward's output, fwd.lse its LSE,
// both read) plus the output gradient, the gradients and the fp32 scratch rows.
#pragma once

#include <cstdint>

#include "common/hd.hpp"
#include "cuda/fwd_params.hpp"

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
  float* dq_accum;  // [heads_q][rows_total][dq_cols]: dQ summed over key blocks (atomic mode)
  std::int64_t rows_total;
  int dq_cols;      // the kernel's head dim
  int batch;
};

// The kernels leave the softmax scale out of dS (unless a softcap's derivative carries it) and
// apply this factor once, to dK and dQ.
TA_HD float ds_scale(const FwdParams& f) { return f.softcap > 0.f ? 1.f : f.scale; }

}  // namespace tileattn::cuda
