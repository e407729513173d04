#include "cuda/attn_params.hpp"

#include "common/score_mod.hpp"

namespace tileattn::cuda {

void row_strides(const Problem& pr, const TensorView& t, std::int64_t& batch, std::int64_t& row, std::int64_t& head) {
  const int r = pr.varlen ? 0 : 1;
  batch = pr.varlen ? 0 : t.stride[0];
  row = t.stride[r];
  head = t.stride[r + 1];
}

FwdParams attn_params(const Problem& pr, const AttnTensors& t) {
  FwdParams p{};
  p.q = t.q.data;
  p.k = t.k.data;
  p.v = t.v.data;
  p.o = t.out.data;
  p.lse = t.lse.present() ? static_cast<float*>(t.lse.data) : nullptr;
  row_strides(pr, t.q, p.q_batch, p.q_row, p.q_head);
  row_strides(pr, t.k, p.k_batch, p.k_row, p.k_head);
  row_strides(pr, t.v, p.v_batch, p.v_row, p.v_head);
  row_strides(pr, t.out, p.o_batch, p.o_row, p.o_head);
  if (p.lse) {
    p.lse_batch = pr.varlen ? 0 : t.lse.stride[0];
    p.lse_head = t.lse.stride[pr.varlen ? 0 : 1];
    p.lse_row = t.lse.stride[pr.varlen ? 1 : 2];
  }
  p.cu_q = pr.varlen ? t.cu_seqlens_q.ptr<const int>() : nullptr;
  p.cu_k = pr.varlen ? t.cu_seqlens_k.ptr<const int>() : nullptr;
  p.heads_q = pr.heads_q;
  p.group = pr.group();
  p.seqlen_q = pr.seqlen_q;
  p.seqlen_k = pr.seqlen_k;
  p.q_rows = static_cast<int>(t.q.shape[pr.varlen ? 0 : 1]);
  p.k_rows = static_cast<int>(t.k.shape[pr.varlen ? 0 : 1]);
  p.d_qk = pr.hdim_qk;
  p.d_v = pr.hdim_v;
  p.scale = pr.scale;
  p.scale_log2 = pr.scale * kLog2e;
  p.softcap = pr.softcap;
  p.bottom_right = pr.bottom_right;
  p.alibi_diag_set = pr.alibi_diag_set;
  p.alibi_diag = pr.alibi_diag;
  p.window_left = pr.window_left;
  p.window_right = pr.window_right;
  if (pr.has_alibi) {
    p.alibi = t.alibi_slopes.ptr<const float>();
    p.alibi_batch = pr.alibi_per_batch ? t.alibi_slopes.stride[0] : 0;
    p.alibi_head = t.alibi_slopes.stride[pr.alibi_per_batch ? 1 : 0];
  }
  p.dropout = pr.dropout_p > 0.f;
  p.drop = pr.dropout(t.options);
  p.chunk = pr.chunk;
  p.prefix_len = pr.prefix_len;
  if (pr.prefix_per_seq) {
    p.prefix_lens = t.prefix_lens.ptr<const int>();
    p.prefix_stride = t.prefix_lens.stride[0];
  }
  if (pr.documents) {
    // Batched [batch, seqlen], varlen [total] (batch stride 0, rows from cu_seqlens).
    auto ids = [&](const TensorView& d, const int*& ptr, std::int64_t& batch, std::int64_t& row) {
      ptr = d.ptr<const int>();
      batch = pr.varlen ? 0 : d.stride[0];
      row = d.stride[pr.varlen ? 0 : 1];
    };
    ids(t.document_ids_q, p.doc_q, p.doc_q_batch, p.doc_q_row);
    ids(t.document_ids_k, p.doc_k, p.doc_k_batch, p.doc_k_row);
  }
  if (pr.dense_mask) {
    const TensorView& m = t.dense_mask;
    p.dense = m.ptr<const unsigned char>();
    p.dense_batch = m.shape[0] == 1 ? 0 : m.stride[0];
    p.dense_head = m.shape[1] == 1 ? 0 : m.stride[1];
    p.dense_row = m.stride[2];
    p.dense_col = m.stride[3];
  }
  return p;
}

}  // namespace tileattn::cuda
