// Sorted document ids as per-row runs of keys (Variant::doc_keys), built once per call. Packed
// sequences number their documents in order, so a row's document is one run of keys and visibility
// stays a per-row range: key tiles outside a row tile's documents are skipped, and no element is
// tested against the ids. A sequence whose ids are not sorted on both sides keeps the per-element
// test.
#pragma once

#include <cstdint>
#include <vector>

#include "common/variant.hpp"
#include "core/problem.hpp"
#include "cpu/tensor_io.hpp"

namespace tileattn::cpu {

// The runs for ids sorted on both sides (q(i) for i < sq, k(j) for j < sk): row i's keys with its
// id are [runs[2i], runs[2i + 1]), empty where there are none. The rows' ids never decrease, so the
// runs' ends only move right: one sweep over the keys.
template <class Q, class K>
void sweep_document_runs(Q q, K k, int sq, int sk, int* runs) {
  for (int i = 0, lo = 0, hi = 0; i < sq; ++i) {
    const int d = q(i);
    while (lo < sk && k(lo) < d) ++lo;
    if (hi < lo) hi = lo;
    while (hi < sk && k(hi) <= d) ++hi;
    runs[2 * i] = lo;
    runs[2 * i + 1] = hi;
  }
}

class DocumentRuns {
 public:
  DocumentRuns(const Problem& p, const TensorView& cu_q, const TensorView& cu_k, const TensorView& ids_q,
               const TensorView& ids_k);
  // Sequence b's document ids (rows from s.q0 and s.k0) into its variant, where the call has them,
  // with their runs where sorted.
  void set(int b, const Seq& s, Variant& v) const;

 private:
  const Problem& p_;
  const TensorView &ids_q_, &ids_k_;
  std::vector<int> runs_;            // 2 per query row of every sorted sequence
  std::vector<std::int64_t> start_;  // per sequence: its first row's runs in runs_, or -1 (unsorted)
  void set_ids(int b, const Seq& s, Variant& v) const;
};

}  // namespace tileattn::cpu
