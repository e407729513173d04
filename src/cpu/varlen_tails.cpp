#include "cpu/varlen_tails.hpp"

#include <cmath>
#include <cstring>

#include "cpu/tensor_io.hpp"

namespace tileattn::cpu {
namespace {

// Zeroes rows [from, total) of a packed [total, heads, d] tensor (d contiguous).
void zero_rows(const TensorView& t, std::int64_t from) {
  if (!t.present()) return;
  const std::size_t es = dtype_size(t.dtype), bytes = static_cast<std::size_t>(t.shape[2]) * es;
  for (std::int64_t r = from; r < t.shape[0]; ++r)
    for (int h = 0; h < t.shape[1]; ++h) std::memset(static_cast<char*>(t.data) + elem(t, true, 0, r, h) * es, 0, bytes);
}

}  // namespace

void write_varlen_tails(const Problem& p, const ForwardArgs& a) {
  if (!p.varlen) return;
  const std::int64_t end = load_i32(a.cu_seqlens_q, p.batch);
  zero_rows(a.out, end);
  if (!a.lse.present()) return;
  for (int h = 0; h < a.lse.shape[0]; ++h)
    for (std::int64_t r = end; r < a.lse.shape[1]; ++r) a.lse.ptr<float>()[lse_elem(a.lse, true, 0, r, h)] = -INFINITY;
}

void write_varlen_tails(const Problem& p, const BackwardArgs& a) {
  if (!p.varlen) return;
  zero_rows(a.dq, load_i32(a.cu_seqlens_q, p.batch));
  const std::int64_t keys = load_i32(a.cu_seqlens_k, p.batch);
  zero_rows(a.dk, keys);
  zero_rows(a.dv, keys);
}

}  // namespace tileattn::cpu
