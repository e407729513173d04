// The cuda backend's varlen rows past cu_seqlens[batch] (a packed buffer of fixed size holding fewer
// tokens), as the CPU backends' (tests/cpu/varlen_tails_test.cpp): out = 0 and lse = -inf there,
// dq = 0, dk = dv = 0, whatever the buffers held before, and the sequences' rows as from the same
// call on tensors cut to cu_seqlens[batch].
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/device_tensor.hpp"
#include "support/host_tensor.hpp"
#include "support/varlen_cut.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

class GpuVarlenTails : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

// The elements of rows [from, to) of a [total, heads, d] tensor.
std::vector<double> rows(const HostTensor& t, std::int64_t from, std::int64_t to) {
  const std::vector<double> all = t.to_f64();
  const std::int64_t row = t.numel() / t.shape()[0];
  return {all.begin() + from * row, all.begin() + to * row};
}

HostTensor on_host(const DeviceTensor& d, DType dtype, const std::vector<std::int64_t>& shape) {
  HostTensor h(dtype, shape);
  d.to_host(h);
  return h;
}

struct Call {
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t total_q, total_k;
};

// The sequences' rows of a full call against the cut call's: bitwise in the forward, which does the
// same arithmetic on them; the backward's dQ sums (atomics in the default mode) may differ in order.
void expect_same(const std::vector<double>& got, const std::vector<double>& want, bool bitwise, const char* what) {
  if (bitwise)
    EXPECT_EQ(got, want) << what;
  else
    EXPECT_LE(rel_error(got, want), 1e-2) << what;
}

void check(std::mt19937_64& rng, DType dtype, int d, const Call& c, const Options& base) {
  const int hq = 4, hkv = 2;
  SCOPED_TRACE(testing::Message() << "dtype " << dtype_name(dtype) << " d " << d << " causal " << base.causal
                                  << " deterministic " << base.deterministic << " batch " << c.cu_q.size() - 1
                                  << " tokens " << c.cu_q.back() << "/" << c.total_q << ", keys " << c.cu_k.back()
                                  << "/" << c.total_k);
  const std::vector<std::int64_t> qs{c.total_q, hq, d}, ks{c.total_k, hkv, d}, ls{hq, c.total_q};
  HostTensor q(dtype, qs), k(dtype, ks), v(dtype, ks), dout(dtype, qs), poison_q(dtype, qs), poison_k(dtype, ks),
      poison_lse(DType::f32, ls);
  for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_normal(rng);
  for (HostTensor* t : {&poison_q, &poison_k, &poison_lse}) t->poison();
  const DeviceTensor dq_in(q), dk_in(k), dv_in(v), ddout(dout), cuq(int_tensor(c.cu_q)), cuk(int_tensor(c.cu_k));
  int max_q = 0, max_k = 0;
  for (std::size_t b = 1; b < c.cu_q.size(); ++b) {
    max_q = std::max(max_q, c.cu_q[b] - c.cu_q[b - 1]);
    max_k = std::max(max_k, c.cu_k[b] - c.cu_k[b - 1]);
  }
  Options o = base;
  o.backend = Backend::cuda;
  const std::int64_t end_q = c.cu_q.back(), end_k = c.cu_k.back();

  // The whole buffers, poisoned, and the same call on the rows the sequences hold.
  DeviceTensor out(poison_q), lse(poison_lse), out_cut(poison_q), lse_cut(poison_lse);
  ForwardArgs f{dq_in.view(), dk_in.view(), dv_in.view(), out.view(), lse.view(), cuq.view(), cuk.view(), max_q, max_k};
  f.options = o;
  forward(f);
  forward(cut_forward(f, end_q, end_k, out_cut.view(), lse_cut.view()));
  device_synchronize();

  const HostTensor ho = on_host(out, dtype, qs), hoc = on_host(out_cut, dtype, qs);
  const HostTensor hl = on_host(lse, DType::f32, ls), hlc = on_host(lse_cut, DType::f32, ls);
  expect_same(rows(ho, 0, end_q), rows(hoc, 0, end_q), true, "out");
  for (double x : rows(ho, end_q, c.total_q)) ASSERT_EQ(x, 0.0) << "out tail";
  for (int h = 0; h < hq; ++h)
    for (std::int64_t r = 0; r < c.total_q; ++r) {
      const double x = hl.get(h * c.total_q + r), y = hlc.get(h * c.total_q + r);
      if (r < end_q)
        ASSERT_TRUE(x == y || (std::isinf(x) && std::isinf(y))) << "lse row " << r << ": " << x << " vs " << y;
      else
        ASSERT_TRUE(std::isinf(x) && x < 0) << "lse row " << r << " = " << x;
    }

  DeviceTensor dq(poison_q), dk(poison_k), dv(poison_k), dq_cut(poison_q), dk_cut(poison_k), dv_cut(poison_k);
  BackwardArgs g{dq_in.view(), dk_in.view(), dv_in.view(), out.view(), ddout.view(), lse.view(), dq.view(), dk.view(),
                 dv.view(), cuq.view(), cuk.view(), max_q, max_k};
  g.options = o;
  backward(g);
  backward(cut_backward(g, end_q, end_k, dq_cut.view(), dk_cut.view(), dv_cut.view()));
  device_synchronize();
  const struct {
    const DeviceTensor &full, &cut;
    const std::vector<std::int64_t>& shape;
    std::int64_t end;
    const char* what;
  } grads[] = {{dq, dq_cut, qs, end_q, "dq"}, {dk, dk_cut, ks, end_k, "dk"}, {dv, dv_cut, ks, end_k, "dv"}};
  for (const auto& gr : grads) {
    const HostTensor full = on_host(gr.full, dtype, gr.shape), cut = on_host(gr.cut, dtype, gr.shape);
    expect_same(rows(full, 0, gr.end), rows(cut, 0, gr.end), false, gr.what);
    for (double x : rows(full, gr.end, gr.shape[0])) ASSERT_EQ(x, 0.0) << gr.what << " tail";
  }
}

TEST_F(GpuVarlenTails, RowsPastTheSequencesAreAnEmptySequences) {
  std::mt19937_64 rng(fresh_seed());
  const std::vector<Call> calls = {
      {{0, 150, 333}, {0, 200, 290}, 401, 517},  // tails on both sides, inside and past a tile
      {{0, 150, 333}, {0, 200, 290}, 333, 517},  // keys only
      {{0, 0, 70}, {0, 90, 90}, 300, 90},        // empty sequences, queries only
      {{0}, {0}, 130, 70},                       // no sequence at all: every row is a tail
  };
  for (DType dtype : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (const Call& c : calls)
        for (bool causal : {false, true})
          for (bool deterministic : {false, true}) {
            Options o;
            o.causal = causal;
            o.deterministic = deterministic;
            check(rng, dtype, d, c, o);
            if (HasFailure()) return;
          }
}

// cu_seqlens on the device are read where no check sees them: offsets out of order, negative or past
// the buffers make no kernel read or write outside the tensors. Each tensor is a view into the middle
// of a poisoned buffer whose rows on either side must come out as they went in.
TEST_F(GpuVarlenTails, HostileOffsetsStayInsideTheBuffers) {
  std::mt19937_64 rng(fresh_seed());
  const int hq = 4, hkv = 2, pad = 64;
  const std::int64_t total_q = 200, total_k = 150;
  for (int d : {64, 128})
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(testing::Message() << "d " << d << " deterministic " << deterministic);
      const std::vector<std::int64_t> qs{total_q + 2 * pad, hq, d}, ks{total_k + 2 * pad, hkv, d},
          ls{hq, total_q + 2 * pad};
      HostTensor q(DType::bf16, qs), k(DType::bf16, ks), poison_q(DType::bf16, qs), poison_k(DType::bf16, ks),
          poison_lse(DType::f32, ls);
      q.fill_normal(rng);
      k.fill_normal(rng);
      for (HostTensor* t : {&poison_q, &poison_k, &poison_lse}) t->poison();
      const DeviceTensor dq_in(q), dk_in(k), dv_in(k), ddout(q);
      DeviceTensor out(poison_q), lse(poison_lse), dq(poison_q), dk(poison_k), dv(poison_k);
      // [total, heads, d] in the middle of a [total + 2 pad, heads, d] buffer; lse [heads, total] in
      // the middle of each head's row.
      auto middle = [&](const DeviceTensor& t, std::int64_t total) {
        TensorView v = t.view();
        v.data = static_cast<char*>(v.data) + pad * v.stride[0] * dtype_size(v.dtype);
        v.shape[0] = total;
        return v;
      };
      TensorView lse_mid = lse.view();
      lse_mid.data = static_cast<float*>(lse_mid.data) + pad;
      lse_mid.shape[1] = total_q;
      const DeviceTensor cuq(int_tensor({0, 5000, -300, 120, 90})), cuk(int_tensor({-7, 100, 40, 100000, 3}));
      Options o;
      o.backend = Backend::cuda;
      o.causal = true;
      o.deterministic = deterministic;
      ForwardArgs f{middle(dq_in, total_q), middle(dk_in, total_k), middle(dv_in, total_k), middle(out, total_q),
                    lse_mid, cuq.view(), cuk.view(), 128, 128};
      f.options = o;
      forward(f);
      BackwardArgs g{f.q, f.k, f.v, f.out, middle(ddout, total_q), lse_mid, middle(dq, total_q), middle(dk, total_k),
                     middle(dv, total_k), cuq.view(), cuk.view(), 128, 128};
      g.options = o;
      backward(g);
      device_synchronize();
      auto pads_untouched = [&](const DeviceTensor& t, DType dtype, const std::vector<std::int64_t>& shape,
                                std::int64_t total, const char* what) {
        const HostTensor h = on_host(t, dtype, shape);
        const std::int64_t row = h.numel() / shape[0];
        for (std::int64_t i = 0; i < h.numel(); ++i)
          if (i < pad * row || i >= (pad + total) * row) ASSERT_TRUE(std::isnan(h.get(i))) << what << " element " << i;
      };
      pads_untouched(out, DType::bf16, qs, total_q, "out");
      pads_untouched(dq, DType::bf16, qs, total_q, "dq");
      pads_untouched(dk, DType::bf16, ks, total_k, "dk");
      pads_untouched(dv, DType::bf16, ks, total_k, "dv");
      const HostTensor hl = on_host(lse, DType::f32, ls);
      for (int h = 0; h < hq; ++h)
        for (std::int64_t r = 0; r < total_q + 2 * pad; ++r)
          if (r < pad || r >= pad + total_q) ASSERT_TRUE(std::isnan(hl.get(h * (total_q + 2 * pad) + r))) << "lse " << r;
    }
}

}  // namespace
}  // namespace tileattn::test
