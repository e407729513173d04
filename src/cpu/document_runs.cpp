#include "cpu/document_runs.hpp"

namespace tileattn::cpu {

DocumentRuns::DocumentRuns(const Problem& p, const TensorView& cu_q, const TensorView& cu_k, const TensorView& ids_q,
                           const TensorView& ids_k)
    : p_(p), ids_q_(ids_q), ids_k_(ids_k) {
  if (!p.documents) return;
  start_.assign(static_cast<std::size_t>(p.batch), -1);
  for (int b = 0; b < p.batch; ++b) {
    const Seq s = sequence(p, cu_q, cu_k, b);
    Variant v;
    set_ids(b, s, v);
    auto q = [&](int i) { return v.doc_q[i * v.doc_q_stride]; };
    auto k = [&](int j) { return v.doc_k[j * v.doc_k_stride]; };
    bool sorted = true;
    for (int i = 1; i < s.sq && sorted; ++i) sorted = q(i - 1) <= q(i);
    for (int j = 1; j < s.sk && sorted; ++j) sorted = k(j - 1) <= k(j);
    if (!sorted) continue;
    start_[b] = static_cast<std::int64_t>(runs_.size());
    runs_.resize(runs_.size() + 2 * static_cast<std::size_t>(s.sq));
    sweep_document_runs(q, k, s.sq, s.sk, runs_.data() + start_[b]);
  }
}

void DocumentRuns::set_ids(int b, const Seq& s, Variant& v) const {
  if (p_.varlen) {
    v.doc_q = ids_q_.ptr<const std::int32_t>() + s.q0 * ids_q_.stride[0];
    v.doc_k = ids_k_.ptr<const std::int32_t>() + s.k0 * ids_k_.stride[0];
    v.doc_q_stride = ids_q_.stride[0];
    v.doc_k_stride = ids_k_.stride[0];
  } else {
    v.doc_q = ids_q_.ptr<const std::int32_t>() + b * ids_q_.stride[0];
    v.doc_k = ids_k_.ptr<const std::int32_t>() + b * ids_k_.stride[0];
    v.doc_q_stride = ids_q_.stride[1];
    v.doc_k_stride = ids_k_.stride[1];
  }
}

void DocumentRuns::set(int b, const Seq& s, Variant& v) const {
  if (!p_.documents) return;
  set_ids(b, s, v);
  if (start_[b] >= 0) v.doc_keys = runs_.data() + start_[b];
}

}  // namespace tileattn::cpu
