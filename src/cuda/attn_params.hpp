// Kernel arguments shared by the forward and the backward, resolved on the host from a validated
// problem: data pointers, element strides and the variant's plain data (the block mask's cells come
// from block_state.hpp).
#pragma once

#include "core/problem.hpp"
#include "cuda/fwd_params.hpp"

namespace tileattn::cuda {

// The tensors of an attention call whose layout the kernels read through FwdParams.
struct AttnTensors {
  const TensorView &q, &k, &v, &out, &lse, &cu_seqlens_q, &cu_seqlens_k, &alibi_slopes, &document_ids_q,
      &document_ids_k, &prefix_lens, &dense_mask;
  const Options& options;
};

FwdParams attn_params(const Problem& pr, const AttnTensors& t);

// Whether a call's visibility goes beyond the causal or window mask (chunks, document ids, a block
// mask, a prefix): the kernels' variant instantiation takes it.
inline bool takes_variant(const Problem& pr) { return pr.chunk > 0 || pr.documents || pr.block_sparse() || pr.prefix_lm(); }

// The batch, row and head element strides of t: batched tensors are [b, s, h, d], varlen ones
// [total, h, d] (batch stride 0) whose rows start at cu_seqlens[b].
void row_strides(const Problem& pr, const TensorView& t, std::int64_t& batch, std::int64_t& row, std::int64_t& head);

}  // namespace tileattn::cuda
