// A varlen call on tensors cut to the rows its sequences hold (cu_seqlens[batch] of them): the
// varlen-tails tests (CPU and GPU) compare a call on whole packed buffers with it.
#pragma once

#include <cstdint>

#include "tileattn/tileattn.hpp"

namespace tileattn::test {

// The first `rows` rows of a packed tensor (dimension 0; lse's dimension 1).
inline TensorView first_rows(TensorView v, std::int64_t rows, int dim = 0) {
  v.shape[dim] = rows;
  return v;
}

// f on its first end_q query rows and end_k key rows, writing into the first rows of out and lse.
inline ForwardArgs cut_forward(ForwardArgs f, std::int64_t end_q, std::int64_t end_k, TensorView out, TensorView lse) {
  f.q = first_rows(f.q, end_q);
  f.k = first_rows(f.k, end_k);
  f.v = first_rows(f.v, end_k);
  f.out = first_rows(out, end_q);
  f.lse = first_rows(lse, end_q, 1);
  return f;
}

// g on the same rows, writing into the first rows of dq, dk and dv.
inline BackwardArgs cut_backward(BackwardArgs g, std::int64_t end_q, std::int64_t end_k, TensorView dq, TensorView dk,
                                 TensorView dv) {
  g.q = first_rows(g.q, end_q);
  g.k = first_rows(g.k, end_k);
  g.v = first_rows(g.v, end_k);
  g.out = first_rows(g.out, end_q);
  g.dout = first_rows(g.dout, end_q);
  g.lse = first_rows(g.lse, end_q, 1);
  g.dq = first_rows(dq, end_q);
  g.dk = first_rows(dk, end_k);
  g.dv = first_rows(dv, end_k);
  return g;
}

}  // namespace tileattn::test
