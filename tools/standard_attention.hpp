// Standard attention for comparison: S = scale * Q K^T and P = softmax(S) materialized for every
// (batch, head) at once, as a framework's plain implementation does, with BLAS GEMMs. fp32,
// contiguous [batch, seqlen, heads, hdim] tensors, causal aligned bottom-right like tileattn.
#pragma once

#include <cstddef>
#include <vector>

namespace tileattn::tools {

struct StandardShape {
  int batch = 1, heads = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, hdim = 8;
  bool causal = false;
  float scale = 1.f;
};

// The S and P buffers it holds: its extra memory, quadratic in the length. Defined here so the
// tool can show it also where it was built without BLAS.
inline std::size_t standard_extra_bytes(const StandardShape& s) {
  return 2 * sizeof(float) * static_cast<std::size_t>(s.batch) * s.heads * s.seqlen_q * s.seqlen_k;
}

class StandardAttention {
 public:
  StandardAttention(const StandardShape& shape, int threads);

  void forward(const float* q, const float* k, const float* v, float* out);
  // Needs the P of the last forward on the same inputs; dk, dv are overwritten.
  void backward(const float* q, const float* k, const float* v, const float* out, const float* dout,
                float* dq, float* dk, float* dv);

 private:
  std::size_t plane() const;  // elements of one (batch, head) S or P
  StandardShape s_;
  int threads_;
  std::vector<float> S_, P_;  // [batch, heads, seqlen_q, seqlen_k]
};

}  // namespace tileattn::tools
