// The reference backward against central finite differences of the loss sum(dO * O), taken on the
// reference forward itself, for every element of q, k and v.
//
// Inputs are multiples of 2^-8 and the step is 2^-4, so every perturbed input is exact in fp32;
// the only noise is the fp32 rounding of O, about 1e-5 after the division by the step. The
// fourth-order stencil keeps the truncation error below that.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "support/host_tensor.hpp"
#include "support/seeded_test.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

struct Shape {
  int batch = 2, sq = 3, sk = 4, hq = 2, hkv = 2, d = 8, dv = 8;
  std::vector<std::int32_t> cu_q, cu_k;  // non-empty: varlen (batch from their length)
};

class GradCase {
 public:
  GradCase(std::mt19937_64& rng, const Shape& s, const Options& o, bool alibi_per_batch = false,
           bool alibi = false)
      : s_(s), o_(o) {
    const bool varlen = !s.cu_q.empty();
    auto dims = [&](std::int64_t tokens_or_seq, int heads, int dim) {
      return varlen ? std::vector<std::int64_t>{tokens_or_seq, heads, dim}
                    : std::vector<std::int64_t>{s.batch, tokens_or_seq, heads, dim};
    };
    const std::int64_t nq = varlen ? s.cu_q.back() : s.sq, nk = varlen ? s.cu_k.back() : s.sk;
    q_ = HostTensor(DType::f32, dims(nq, s.hq, s.d));
    k_ = HostTensor(DType::f32, dims(nk, s.hkv, s.d));
    v_ = HostTensor(DType::f32, dims(nk, s.hkv, s.dv));
    out_ = HostTensor(DType::f32, dims(nq, s.hq, s.dv));
    dout_ = HostTensor(DType::f32, dims(nq, s.hq, s.dv));
    lse_ = varlen ? HostTensor(DType::f32, {s.hq, nq}) : HostTensor(DType::f32, {s.batch, s.hq, s.sq});
    for (HostTensor* t : {&q_, &k_, &v_, &dout_}) grid_normal(rng, *t);
    if (varlen) {
      cuq_ = test::int_tensor(s.cu_q);
      cuk_ = test::int_tensor(s.cu_k);
    }
    if (alibi) {
      slopes_ = alibi_per_batch ? HostTensor(DType::f32, {s.batch, s.hq}) : HostTensor(DType::f32, {s.hq});
      std::uniform_real_distribution<double> u(0.1, 1.0);
      for (std::int64_t i = 0; i < slopes_->numel(); ++i) slopes_->set(i, u(rng));
    }
    o_.backend = Backend::cpu_reference;
  }

  // Analytic gradients against the stencil, for every input element.
  void check() {
    forward_into_out();
    HostTensor dq(DType::f32, q_.shape()), dk(DType::f32, k_.shape()), dv(DType::f32, v_.shape());
    dq.poison();
    dk.poison();
    dv.poison();
    BackwardArgs b;
    b.q = q_.view();
    b.k = k_.view();
    b.v = v_.view();
    b.out = out_.view();
    b.dout = dout_.view();
    b.lse = lse_.view();
    b.dq = dq.view();
    b.dk = dk.view();
    b.dv = dv.view();
    fill_common(b);
    backward(b);
    compare("dq", q_, dq);
    compare("dk", k_, dk);
    compare("dv", v_, dv);
  }

 private:
  static void grid_normal(std::mt19937_64& rng, HostTensor& t) {
    std::normal_distribution<double> n(0.0, 1.0);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, std::round(n(rng) * 256) / 256);
  }

  template <class Args>
  void fill_common(Args& a) const {
    if (cuq_.numel() > 0) {
      a.cu_seqlens_q = cuq_.view();
      a.cu_seqlens_k = cuk_.view();
      a.max_seqlen_q = a.max_seqlen_k = 0;
      for (std::size_t b = 0; b + 1 < s_.cu_q.size(); ++b) {
        a.max_seqlen_q = std::max(a.max_seqlen_q, s_.cu_q[b + 1] - s_.cu_q[b]);
        a.max_seqlen_k = std::max(a.max_seqlen_k, s_.cu_k[b + 1] - s_.cu_k[b]);
      }
    }
    if (slopes_) a.alibi_slopes = slopes_->view();
    a.options = o_;
  }

  void forward_into_out() {
    out_.fill(0);  // rows no sequence owns stay 0 and add nothing to the loss
    ForwardArgs a;
    a.q = q_.view();
    a.k = k_.view();
    a.v = v_.view();
    a.out = out_.view();
    a.lse = lse_.view();
    fill_common(a);
    forward(a);
  }

  double loss() {
    forward_into_out();
    double l = 0;
    for (std::int64_t i = 0; i < out_.numel(); ++i) l += dout_.get(i) * out_.get(i);
    return l;
  }

  void compare(const char* name, HostTensor& x, const HostTensor& grad) {
    constexpr double h = 1.0 / 16;
    const std::vector<double> g = grad.to_f64();
    for (std::int64_t e = 0; e < x.numel(); ++e) {
      const double x0 = x.get(e);
      auto at = [&](double step) {
        x.set(e, x0 + step);
        return loss();
      };
      const double fd = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
      x.set(e, x0);
      ASSERT_TRUE(std::isfinite(g[e])) << name << "[" << e << "] not written or not finite";
      EXPECT_NEAR(g[e], fd, 2e-4 + 2e-3 * std::abs(fd)) << name << "[" << e << "]";
    }
  }

  Shape s_;
  Options o_;
  HostTensor q_, k_, v_, out_, dout_, lse_, cuq_, cuk_;
  std::optional<HostTensor> slopes_;
};

class ReferenceBackward : public test::SeededTest {};

TEST_F(ReferenceBackward, Plain) {
  GradCase(rng_, Shape{}, Options{}).check();
}

TEST_F(ReferenceBackward, CausalBottomRightWithEmptyRow) {
  Shape s;
  s.sq = 4;
  s.sk = 3;  // row 0 sees no key
  Options o;
  o.causal = true;
  GradCase(rng_, s, o).check();
}

TEST_F(ReferenceBackward, CausalTopLeft) {
  Shape s;
  s.sq = 2;
  s.sk = 4;
  Options o;
  o.causal = true;
  o.align = MaskAlign::top_left;
  GradCase(rng_, s, o).check();
}

TEST_F(ReferenceBackward, SlidingWindow) {
  Shape s;
  s.sq = 4;
  s.sk = 5;
  Options o;
  o.window_left = 1;
  o.window_right = 1;
  GradCase(rng_, s, o).check();
}

TEST_F(ReferenceBackward, Softcap) {
  Options o;
  o.scale = 1.f;
  o.softcap = 1.5f;  // scores of a few units: deep in tanh's bend
  GradCase(rng_, Shape{}, o).check();
}

TEST_F(ReferenceBackward, AlibiCausal) {
  Options o;
  o.causal = true;
  GradCase(rng_, Shape{}, o, /*alibi_per_batch=*/false, /*alibi=*/true).check();
}

TEST_F(ReferenceBackward, GroupedQuerySumsKvGradientsOverTheGroup) {
  for (int hkv : {1, 2}) {
    Shape s;
    s.hq = 4;
    s.hkv = hkv;
    GradCase(rng_, s, Options{}).check();
  }
}

TEST_F(ReferenceBackward, VarlenWithEmptySequences) {
  Shape s;
  s.batch = 4;
  s.cu_q = {0, 2, 2, 5, 6};  // sequence 1 has no queries, sequence 3 no keys
  s.cu_k = {0, 3, 5, 8, 8};
  Options o;
  o.causal = true;
  GradCase(rng_, s, o).check();
}

TEST_F(ReferenceBackward, DropoutWithFixedSeed) {
  Options o;
  o.dropout_p = 0.3f;
  o.seed = 0x1234abcd5678ull;
  o.offset = 77;
  GradCase(rng_, Shape{}, o).check();
}

TEST_F(ReferenceBackward, HeadDimVDiffers) {
  Shape s;
  s.dv = 16;
  GradCase(rng_, s, Options{}).check();
  s.d = 16;
  s.dv = 8;
  GradCase(rng_, s, Options{}).check();
}

TEST_F(ReferenceBackward, EverythingAtOnceVarlen) {
  Shape s;
  s.batch = 3;
  s.hq = 4;
  s.hkv = 2;
  s.dv = 16;
  s.cu_q = {0, 3, 4, 6};
  s.cu_k = {0, 4, 4, 7};
  Options o;
  o.scale = 0.5f;
  o.softcap = 2.f;
  o.window_left = 2;
  o.causal = true;
  o.dropout_p = 0.2f;
  o.seed = 99;
  GradCase(rng_, s, o, /*alibi_per_batch=*/true, /*alibi=*/true).check();
}

}  // namespace
}  // namespace tileattn
