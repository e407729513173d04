// Pins the fp64 reference forward to hand-derived expectations. Each case lists the keys a row sees
// literally and writes its logit formula out, then recomputes the row's softmax and weighted sum in
// plain double math: nothing here reuses the mask or score code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "support/host_tensor.hpp"
#include "support/seeded_test.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A batched problem [batch, seqlen, heads, dim] with fresh normal inputs (stored exactly in f32).
struct Attn {
  int batch, sq, sk, hq, hkv, d, dv;
  HostTensor q, k, v, out, lse;

  Attn(std::mt19937_64& rng, int batch_, int sq_, int sk_, int hq_, int hkv_, int d_, int dv_,
       double stddev = 1.0, std::vector<int> order = {})
      : batch(batch_), sq(sq_), sk(sk_), hq(hq_), hkv(hkv_), d(d_), dv(dv_),
        q(DType::f32, {batch_, sq_, hq_, d_}, order),
        k(DType::f32, {batch_, sk_, hkv_, d_}, order),
        v(DType::f32, {batch_, sk_, hkv_, dv_}, order),
        out(DType::f32, {batch_, sq_, hq_, dv_}, order),
        lse(DType::f32, {batch_, hq_, sq_}) {
    q.fill_normal(rng, stddev);
    k.fill_normal(rng, stddev);
    v.fill_normal(rng);
    out.poison();
    lse.poison();
  }

  double Q(int b, int i, int h, int c) const { return q.get(((std::int64_t(b) * sq + i) * hq + h) * d + c); }
  double K(int b, int j, int g, int c) const { return k.get(((std::int64_t(b) * sk + j) * hkv + g) * d + c); }
  double V(int b, int j, int g, int c) const { return v.get(((std::int64_t(b) * sk + j) * hkv + g) * dv + c); }
  double O(int b, int i, int h, int c) const { return out.get(((std::int64_t(b) * sq + i) * hq + h) * dv + c); }
  double L(int b, int h, int i) const { return lse.get((std::int64_t(b) * hq + h) * sq + i); }
  double qk(int b, int i, int h, int j, int g) const {
    double s = 0;
    for (int c = 0; c < d; ++c) s += Q(b, i, h, c) * K(b, j, g, c);
    return s;
  }

  void run(const Options& o, const TensorView& alibi = {}) {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.alibi_slopes = alibi;
    a.options = o;
    a.options.backend = Backend::cpu_reference;
    forward(a);
  }

  // Row (b, i, h) against KV head g: softmax of logit(j) over `keys`, then the weighted sum of V.
  void expect_row(int b, int i, int h, int g, const std::vector<int>& keys,
                  const std::function<double(int j)>& logit) const {
    SCOPED_TRACE(::testing::Message() << "b " << b << " row " << i << " head " << h);
    if (keys.empty()) {
      for (int c = 0; c < dv; ++c) EXPECT_EQ(O(b, i, h, c), 0.0) << "col " << c;
      EXPECT_EQ(L(b, h, i), -kInf);
      return;
    }
    double m = -kInf;
    for (int j : keys) m = std::max(m, logit(j));
    double l = 0;
    for (int j : keys) l += std::exp(logit(j) - m);
    for (int c = 0; c < dv; ++c) {
      double o = 0;
      for (int j : keys) o += std::exp(logit(j) - m) / l * V(b, j, g, c);
      EXPECT_NEAR(O(b, i, h, c), o, 2e-6 * std::max(1.0, std::abs(o))) << "col " << c;
    }
    const double want = m + std::log(l);
    EXPECT_NEAR(L(b, h, i), want, 2e-6 * std::max(1.0, std::abs(want)));
  }
};

std::vector<int> all_keys(int n) {
  std::vector<int> k(n);
  for (int j = 0; j < n; ++j) k[j] = j;
  return k;
}

class ReferenceForward : public test::SeededTest {};

TEST_F(ReferenceForward, PlainSoftmaxWithDefaultScaleAndBhsdStrides) {
  Attn t(rng_, 2, 3, 2, 2, 2, 8, 8, 1.0, {0, 2, 1, 3});  // BHSD storage: strides are honoured
  t.run({});
  const double scale = 1.0 / std::sqrt(8.0);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i)
        t.expect_row(b, i, h, h, {0, 1}, [&](int j) { return scale * t.qk(b, i, h, j, h); });
}

TEST_F(ReferenceForward, ExplicitScale) {
  Attn t(rng_, 1, 2, 3, 1, 1, 8, 16);
  Options o;
  o.scale = 0.7f;
  t.run(o);
  for (int i = 0; i < 2; ++i)
    t.expect_row(0, i, 0, 0, {0, 1, 2}, [&](int j) { return double(0.7f) * t.qk(0, i, 0, j, 0); });
}

// Row i sees key j iff j <= i + (sk - sq) (bottom-right) or j <= i (top-left); the key lists below
// are that rule written out by hand.
TEST_F(ReferenceForward, CausalAlignmentFewerQueriesThanKeys) {
  for (MaskAlign align : {MaskAlign::bottom_right, MaskAlign::top_left}) {
    Attn t(rng_, 1, 2, 3, 1, 1, 8, 8);
    Options o;
    o.causal = true;
    o.align = align;
    o.scale = 1.f;
    t.run(o);
    const bool br = align == MaskAlign::bottom_right;
    const std::vector<std::vector<int>> keys = br ? std::vector<std::vector<int>>{{0, 1}, {0, 1, 2}}
                                                  : std::vector<std::vector<int>>{{0}, {0, 1}};
    for (int i = 0; i < 2; ++i) t.expect_row(0, i, 0, 0, keys[i], [&](int j) { return t.qk(0, i, 0, j, 0); });
  }
}

TEST_F(ReferenceForward, CausalAlignmentMoreQueriesThanKeys) {
  for (MaskAlign align : {MaskAlign::bottom_right, MaskAlign::top_left}) {
    Attn t(rng_, 1, 3, 2, 1, 1, 8, 8);
    Options o;
    o.causal = true;
    o.align = align;
    o.scale = 1.f;
    t.run(o);
    const bool br = align == MaskAlign::bottom_right;
    // Bottom-right: row 0's diagonal sits left of key 0, so it sees nothing.
    const std::vector<std::vector<int>> keys = br ? std::vector<std::vector<int>>{{}, {0}, {0, 1}}
                                                  : std::vector<std::vector<int>>{{0}, {0, 1}, {0, 1}};
    for (int i = 0; i < 3; ++i) t.expect_row(0, i, 0, 0, keys[i], [&](int j) { return t.qk(0, i, 0, j, 0); });
  }
}

TEST_F(ReferenceForward, SlidingWindow) {
  {  // square, window (1, 1): row i sees i-1 .. i+1
    Attn t(rng_, 1, 4, 4, 1, 1, 8, 8);
    Options o;
    o.window_left = 1;
    o.window_right = 1;
    o.scale = 1.f;
    t.run(o);
    const std::vector<std::vector<int>> keys{{0, 1}, {0, 1, 2}, {1, 2, 3}, {2, 3}};
    for (int i = 0; i < 4; ++i) t.expect_row(0, i, 0, 0, keys[i], [&](int j) { return t.qk(0, i, 0, j, 0); });
  }
  {  // bottom-right, sq 2, sk 5, window (1, 0): diagonals at keys 3 and 4
    Attn t(rng_, 1, 2, 5, 1, 1, 8, 8);
    Options o;
    o.window_left = 1;
    o.window_right = 0;
    o.scale = 1.f;
    t.run(o);
    const std::vector<std::vector<int>> keys{{2, 3}, {3, 4}};
    for (int i = 0; i < 2; ++i) t.expect_row(0, i, 0, 0, keys[i], [&](int j) { return t.qk(0, i, 0, j, 0); });
  }
  {  // top-left, sq 3, sk 5, window (1, 2), causal off
    Attn t(rng_, 1, 3, 5, 1, 1, 8, 8);
    Options o;
    o.window_left = 1;
    o.window_right = 2;
    o.align = MaskAlign::top_left;
    o.scale = 1.f;
    t.run(o);
    const std::vector<std::vector<int>> keys{{0, 1, 2}, {0, 1, 2, 3}, {1, 2, 3, 4}};
    for (int i = 0; i < 3; ++i) t.expect_row(0, i, 0, 0, keys[i], [&](int j) { return t.qk(0, i, 0, j, 0); });
  }
  {  // causal with a left window only: window_right -1 plus causal means 0
    Attn t(rng_, 1, 3, 3, 1, 1, 8, 8);
    Options o;
    o.causal = true;
    o.window_left = 1;
    o.scale = 1.f;
    t.run(o);
    const std::vector<std::vector<int>> keys{{0}, {0, 1}, {1, 2}};
    for (int i = 0; i < 3; ++i) t.expect_row(0, i, 0, 0, keys[i], [&](int j) { return t.qk(0, i, 0, j, 0); });
  }
}

TEST_F(ReferenceForward, Softcap) {
  Attn t(rng_, 1, 3, 4, 2, 2, 8, 8, 1.5);  // large enough scores that tanh bends them
  Options o;
  o.scale = 0.8f;
  o.softcap = 2.f;
  t.run(o);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i)
      t.expect_row(0, i, h, h, {0, 1, 2, 3}, [&](int j) { return 2.0 * std::tanh(double(0.8f) * t.qk(0, i, h, j, h) / 2.0); });
}

TEST_F(ReferenceForward, SoftcapThenAlibiThenCausal) {
  Attn t(rng_, 1, 2, 3, 1, 1, 8, 8, 1.5);
  HostTensor slopes(DType::f32, {1});
  slopes.set(0, 0.5);
  Options o;
  o.scale = 1.f;
  o.softcap = 3.f;
  o.causal = true;
  t.run(o, slopes.view());
  // bottom-right: row i's diagonal at key i + 1
  const std::vector<std::vector<int>> keys{{0, 1}, {0, 1, 2}};
  for (int i = 0; i < 2; ++i)
    t.expect_row(0, i, 0, 0, keys[i], [&](int j) {
      return 3.0 * std::tanh(t.qk(0, i, 0, j, 0) / 3.0) - 0.5 * std::abs(i + 1 - j);
    });
}

TEST_F(ReferenceForward, AlibiPerHeadSlopes) {
  Attn t(rng_, 2, 2, 3, 2, 2, 8, 8);
  HostTensor slopes(DType::f32, {2});
  slopes.set(0, 0.25);
  slopes.set(1, 1.5);
  Options o;
  o.scale = 1.f;
  t.run(o, slopes.view());
  const double s[2] = {0.25, 1.5};
  // not causal: keys on both sides of the diagonal (at key i + 1) are penalized by distance
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 2; ++i)
        t.expect_row(b, i, h, h, {0, 1, 2}, [&](int j) { return t.qk(b, i, h, j, h) - s[h] * std::abs(i + 1 - j); });
}

TEST_F(ReferenceForward, AlibiPerBatchSlopesTopLeft) {
  Attn t(rng_, 2, 3, 2, 2, 1, 8, 8);
  HostTensor slopes(DType::f32, {2, 2});
  const double s[2][2] = {{0.125, 2.0}, {0.75, 0.0}};
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h) slopes.set(b * 2 + h, s[b][h]);
  Options o;
  o.scale = 1.f;
  o.align = MaskAlign::top_left;  // the diagonal of row i at key i
  t.run(o, slopes.view());
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i)
        t.expect_row(b, i, h, 0, {0, 1}, [&](int j) { return t.qk(b, i, h, j, 0) - s[b][h] * std::abs(i - j); });
}

TEST_F(ReferenceForward, GroupedQueryHeadsReadTheirKvHead) {
  for (int hkv : {1, 2, 3}) {
    Attn t(rng_, 2, 2, 3, 6, hkv, 8, 8);
    Options o;
    o.scale = 1.f;
    t.run(o);
    // heads_q 6: group size 6 / hkv, head h reads KV head h / group, listed out
    const std::vector<int> kv_of = hkv == 1 ? std::vector<int>{0, 0, 0, 0, 0, 0}
                                 : hkv == 2 ? std::vector<int>{0, 0, 0, 1, 1, 1}
                                            : std::vector<int>{0, 0, 1, 1, 2, 2};
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 6; ++h)
        for (int i = 0; i < 2; ++i)
          t.expect_row(b, i, h, kv_of[h], {0, 1, 2}, [&](int j) { return t.qk(b, i, h, j, kv_of[h]); });
  }
}

TEST_F(ReferenceForward, NoKeysGivesZeroAndMinusInf) {
  Attn t(rng_, 2, 3, 0, 2, 1, 8, 8);
  t.run({});
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i) t.expect_row(b, i, h, 0, {}, [](int) { return 0.0; });
}

// Logits of +-1e4: a naive exp would overflow; the result must be finite with an exact LSE.
TEST_F(ReferenceForward, HugeLogitsStayFinite) {
  Attn t(rng_, 1, 2, 3, 1, 1, 8, 8);
  t.q.fill(0);
  t.k.fill(0);
  t.q.set(0, 100);    // row 0: q = 100 e0
  t.q.set(8, -100);   // row 1: q = -100 e0
  t.k.set(0, 100);    // key 0: 100 e0
  t.k.set(8, -100);   // key 1: -100 e0
  t.k.set(16, 99.99); // key 2: 99.99 e0
  Options o;
  o.scale = 1.f;
  t.run(o);
  for (int i = 0; i < 2; ++i) {
    const double sgn = i == 0 ? 1 : -1;
    const double logits[3] = {sgn * 1e4, -sgn * 1e4, sgn * 100.0 * double(99.99f)};
    t.expect_row(0, i, 0, 0, {0, 1, 2}, [&](int j) { return logits[j]; });
  }
  // row 0: keys 0 and 2 dominate; lse = 1e4 + log(1 + exp(s2 - 1e4)), independent of the -1e4 key
  const double s2 = 100.0 * double(99.99f);
  EXPECT_NEAR(t.L(0, 0, 0), 1e4 + std::log1p(std::exp(s2 - 1e4)), 1e-3);
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < 8; ++c) EXPECT_TRUE(std::isfinite(t.O(0, i, 0, c)));
}

TEST_F(ReferenceForward, AllLogitsVeryNegative) {
  Attn t(rng_, 1, 1, 4, 1, 1, 8, 8);
  t.q.fill(0);
  t.k.fill(0);
  t.q.set(0, 100);
  for (int j = 0; j < 4; ++j) t.k.set(j * 8, -100);
  Options o;
  o.scale = 1.f;
  t.run(o);
  // four equal logits of -1e4: uniform weights, lse = -1e4 + log 4
  t.expect_row(0, 0, 0, 0, {0, 1, 2, 3}, [](int) { return -1e4; });
  EXPECT_NEAR(t.L(0, 0, 0), -1e4 + std::log(4.0), 1e-3);
}

// Varlen: sequence 0 (2 queries, 3 keys), 1 (no queries, 2 keys), 2 (2 queries, no keys), and one
// padding query row past cu_seqlens_q[batch], in no sequence: O = 0, lse = -inf. Causal per sequence.
TEST_F(ReferenceForward, VarlenWithEmptySequencesCausal) {
  const int hq = 2, hkv = 1, d = 8;
  const std::vector<std::int32_t> cq{0, 2, 2, 4}, ck{0, 3, 5, 5};
  HostTensor q(DType::f32, {5, hq, d}), k(DType::f32, {5, hkv, d}), v(DType::f32, {5, hkv, d});
  HostTensor out(DType::f32, {5, hq, d}), lse(DType::f32, {hq, 5});
  q.fill_normal(rng_);
  k.fill_normal(rng_);
  v.fill_normal(rng_);
  out.poison();
  lse.poison();
  HostTensor cuq = test::int_tensor(cq), cuk = test::int_tensor(ck);
  ForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.cu_seqlens_q = cuq.view();
  a.cu_seqlens_k = cuk.view();
  a.max_seqlen_q = 2;
  a.max_seqlen_k = 3;
  a.options.causal = true;
  a.options.scale = 1.f;
  a.options.backend = Backend::cpu_reference;
  forward(a);

  auto row = [&](int tok_q, int h, std::vector<int> keys /* packed key rows */) {
    SCOPED_TRACE(::testing::Message() << "token " << tok_q << " head " << h);
    if (keys.empty()) {
      for (int c = 0; c < d; ++c) EXPECT_EQ(out.get((tok_q * hq + h) * d + c), 0.0);
      EXPECT_EQ(lse.get(h * 5 + tok_q), -kInf);
      return;
    }
    std::vector<double> s;
    for (int j : keys) {
      double x = 0;
      for (int c = 0; c < d; ++c) x += q.get((tok_q * hq + h) * d + c) * k.get(j * d + c);
      s.push_back(x);
    }
    double m = -kInf, l = 0;
    for (double x : s) m = std::max(m, x);
    for (double x : s) l += std::exp(x - m);
    for (int c = 0; c < d; ++c) {
      double o = 0;
      for (std::size_t n = 0; n < keys.size(); ++n) o += std::exp(s[n] - m) / l * v.get(keys[n] * d + c);
      EXPECT_NEAR(out.get((tok_q * hq + h) * d + c), o, 2e-6);
    }
    EXPECT_NEAR(lse.get(h * 5 + tok_q), m + std::log(l), 2e-6 * std::max(1.0, std::abs(m)));
  };
  for (int h = 0; h < hq; ++h) {
    row(0, h, {0, 1});     // sequence 0 row 0: diagonal at key 1
    row(1, h, {0, 1, 2});  // sequence 0 row 1
    row(2, h, {});         // sequence 2 has no keys
    row(3, h, {});
    row(4, h, {});         // past cu_seqlens_q[3]: in no sequence, written as a row that sees no key
  }
}

}  // namespace
}  // namespace tileattn
