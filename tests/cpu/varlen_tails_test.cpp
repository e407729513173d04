// Varlen rows past cu_seqlens[batch] (a packed buffer of fixed size holding fewer tokens) belong to
// no sequence: out = 0 and lse = -inf there, dq = 0, dk = dv = 0, whatever the buffers held, and
// the rows of the sequences come out exactly as from a call on tensors cut to cu_seqlens[batch].
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/host_tensor.hpp"
#include "support/seeded_test.hpp"
#include "support/varlen_cut.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::cut_backward;
using test::cut_forward;
using test::HostTensor;

class VarlenTails : public test::SeededTest {};

// Every element of rows [from, shape[0]) of a [total, heads, d] tensor.
std::vector<double> tail(const HostTensor& t, std::int64_t from) {
  const std::vector<double> all = t.to_f64();
  const std::int64_t row = t.numel() / t.shape()[0];
  return {all.begin() + from * row, all.end()};
}

std::vector<double> head(const HostTensor& t, std::int64_t to) {
  const std::vector<double> all = t.to_f64();
  return {all.begin(), all.begin() + to * (t.numel() / t.shape()[0])};
}

struct Call {
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t total_q, total_k;
};

void check(std::mt19937_64& rng, Backend backend, DType dtype, const Call& c, const Options& base) {
  const int hq = 4, hkv = 2, d = 16;
  SCOPED_TRACE(testing::Message() << "backend " << int(backend) << " dtype " << int(dtype) << " batch "
                                  << c.cu_q.size() - 1 << " tokens " << c.cu_q.back() << "/" << c.total_q);
  HostTensor q(dtype, {c.total_q, hq, d}), k(dtype, {c.total_k, hkv, d}), v(dtype, {c.total_k, hkv, d});
  HostTensor dout(dtype, {c.total_q, hq, d});
  for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_normal(rng);
  const HostTensor cuq = test::int_tensor(c.cu_q), cuk = test::int_tensor(c.cu_k);
  int max_q = 0, max_k = 0;
  for (std::size_t b = 1; b < c.cu_q.size(); ++b) {
    max_q = std::max(max_q, c.cu_q[b] - c.cu_q[b - 1]);
    max_k = std::max(max_k, c.cu_k[b] - c.cu_k[b - 1]);
  }
  Options o = base;
  o.backend = backend;
  const std::int64_t end_q = c.cu_q.back(), end_k = c.cu_k.back();

  // The whole buffers, poisoned, and the same call on the rows the sequences hold.
  HostTensor out(dtype, q.shape()), lse(DType::f32, {hq, c.total_q});
  HostTensor out_cut(dtype, q.shape()), lse_cut(DType::f32, {hq, c.total_q});
  for (HostTensor* t : {&out, &lse, &out_cut, &lse_cut}) t->poison();
  ForwardArgs f{q.view(), k.view(), v.view(), out.view(), lse.view(), cuq.view(), cuk.view(), max_q, max_k};
  f.options = o;
  forward(f);
  forward(cut_forward(f, end_q, end_k, out_cut.view(), lse_cut.view()));

  EXPECT_EQ(head(out, end_q), head(out_cut, end_q));
  for (double x : tail(out, end_q)) ASSERT_EQ(x, 0.0);
  for (int h = 0; h < hq; ++h)
    for (std::int64_t r = 0; r < c.total_q; ++r) {
      const double x = lse.get(h * c.total_q + r), y = lse_cut.get(h * c.total_q + r);
      if (r < end_q)
        ASSERT_TRUE(x == y || (std::isinf(x) && std::isinf(y))) << "lse row " << r;
      else
        ASSERT_TRUE(std::isinf(x) && x < 0) << "lse row " << r << " = " << x;
    }

  HostTensor dq(dtype, q.shape()), dk(dtype, k.shape()), dv(dtype, v.shape());
  HostTensor dq_cut(dtype, q.shape()), dk_cut(dtype, k.shape()), dv_cut(dtype, v.shape());
  for (HostTensor* t : {&dq, &dk, &dv, &dq_cut, &dk_cut, &dv_cut}) t->poison();
  BackwardArgs g{q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(), dv.view(),
                 cuq.view(), cuk.view(), max_q, max_k};
  g.options = o;
  backward(g);
  backward(cut_backward(g, end_q, end_k, dq_cut.view(), dk_cut.view(), dv_cut.view()));
  EXPECT_EQ(head(dq, end_q), head(dq_cut, end_q));
  EXPECT_EQ(head(dk, end_k), head(dk_cut, end_k));
  EXPECT_EQ(head(dv, end_k), head(dv_cut, end_k));
  for (double x : tail(dq, end_q)) ASSERT_EQ(x, 0.0);
  for (double x : tail(dk, end_k)) ASSERT_EQ(x, 0.0);
  for (double x : tail(dv, end_k)) ASSERT_EQ(x, 0.0);
}

TEST_F(VarlenTails, RowsPastTheSequencesAreAnEmptySequences) {
  Options causal;
  causal.causal = true;
  const std::vector<Call> calls = {
      {{0, 5, 12}, {0, 7, 9}, 19, 30},  // tails on both sides
      {{0, 5, 12}, {0, 7, 9}, 12, 30},  // keys only
      {{0, 0, 3}, {0, 4, 4}, 8, 4},     // empty sequences, queries only
      {{0}, {0}, 6, 5},                 // no sequence at all: every row is a tail
  };
  for (Backend backend : {Backend::cpu_flash, Backend::cpu_reference})
    for (DType dtype : {DType::f32, DType::bf16})
      for (const Call& c : calls)
        for (const Options& o : {Options{}, causal}) check(rng_, backend, dtype, c, o);
}

}  // namespace
}  // namespace tileattn
