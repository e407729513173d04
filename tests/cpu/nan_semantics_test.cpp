// NaN and Inf inputs propagate to the outputs they reach, as in PyTorch, on the flash backend as on
// the fp64 reference: a query row's NaN makes that row NaN, a key's NaN every row that sees the
// key; rows that see no key stay O = 0, LSE = -inf; rows the NaN cannot reach are untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention_case.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// One head, batched, causal bottom-right: q [1, sq, 2, d] on k, v [1, sk, 1, d] (a group of two).
Case causal_case(DType dtype, Backend backend, int sq, int sk) {
  Case c;
  c.dtype = dtype;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.hdim = c.hdim_v = 32;
  c.options.backend = backend;
  c.options.causal = true;
  return c;
}

// Element offsets of [0, i, h, c] in a row-major [1, s, heads, d] tensor.
std::int64_t at(const Case& c, int i, int h, int col, int heads, int d) {
  (void)c;
  return (static_cast<std::int64_t>(i) * heads + h) * d + col;
}

struct Result {
  std::vector<double> out, lse;
};

Result forward_run(const Case& c, CaseTensors& t) {
  t.out.poison();
  t.lse.poison();
  forward(t.forward(c));
  return {t.out.to_f64(), t.lse.to_f64()};
}

bool row_all_nan(const Case& c, const Result& r, int i, int h) {
  for (int col = 0; col < c.hdim_v; ++col)
    if (!std::isnan(r.out[at(c, i, h, col, c.heads_q, c.hdim_v)])) return false;
  return std::isnan(r.lse[static_cast<std::int64_t>(h) * c.seqlen_q + i]);
}

bool row_equal(const Case& c, const Result& a, const Result& b, int i, int h) {
  for (int col = 0; col < c.hdim_v; ++col) {
    const std::int64_t e = at(c, i, h, col, c.heads_q, c.hdim_v);
    if (!(a.out[e] == b.out[e])) return false;
  }
  const std::int64_t l = static_cast<std::int64_t>(h) * c.seqlen_q + i;
  return a.lse[l] == b.lse[l];
}

class NanSemantics : public ::testing::TestWithParam<std::tuple<DType, Backend>> {};

TEST_P(NanSemantics, QueryRowNaNOrInfStaysInItsRow) {
  const auto [dtype, backend] = GetParam();
  std::mt19937_64 rng(fresh_seed());
  for (double bad : {kNaN, kInf, -kInf}) {
    const Case c = causal_case(dtype, backend, 150, 150);
    CaseTensors t(c, rng);
    const Result clean = forward_run(c, t);
    const int i0 = 70, h0 = 1;
    t.q.set(at(c, i0, h0, 3, c.heads_q, c.hdim), bad);
    const Result r = forward_run(c, t);
    SCOPED_TRACE(bad);
    EXPECT_TRUE(row_all_nan(c, r, i0, h0));
    for (int i = 0; i < c.seqlen_q; ++i)
      for (int h = 0; h < c.heads_q; ++h)
        if (i != i0 || h != h0) ASSERT_TRUE(row_equal(c, r, clean, i, h)) << "row " << i << " head " << h;
  }
}

TEST_P(NanSemantics, KeyNaNReachesEveryRowThatSeesIt) {
  const auto [dtype, backend] = GetParam();
  std::mt19937_64 rng(fresh_seed());
  const Case c = causal_case(dtype, backend, 150, 150);
  CaseTensors t(c, rng);
  const Result clean = forward_run(c, t);
  const int j0 = 100;
  t.k.set(at(c, j0, 0, 5, 1, c.hdim), kNaN);
  const Result r = forward_run(c, t);
  for (int i = 0; i < c.seqlen_q; ++i)
    for (int h = 0; h < c.heads_q; ++h) {
      if (i >= j0)
        ASSERT_TRUE(row_all_nan(c, r, i, h)) << "row " << i << " sees key " << j0;
      else
        ASSERT_TRUE(row_equal(c, r, clean, i, h)) << "row " << i << " does not see key " << j0;
    }
}

// A value's NaN reaches its column of every row that sees the key. Rows that do not see it but
// share its key tile may get it too (0 * NaN in the tile product, as in PyTorch's flash kernels);
// rows of query tiles that never meet the key are untouched.
TEST_P(NanSemantics, ValueNaNReachesItsColumn) {
  const auto [dtype, backend] = GetParam();
  std::mt19937_64 rng(fresh_seed());
  const Case c = causal_case(dtype, backend, 150, 150);
  CaseTensors t(c, rng);
  const Result clean = forward_run(c, t);
  const int j0 = 130, c0 = 7;
  t.v.set(at(c, j0, 0, c0, 1, c.hdim_v), kNaN);
  const Result r = forward_run(c, t);
  for (int h = 0; h < c.heads_q; ++h) {
    for (int i = j0; i < c.seqlen_q; ++i) ASSERT_TRUE(std::isnan(r.out[at(c, i, h, c0, c.heads_q, c.hdim_v)])) << i;
    for (int i = 0; i < 64; ++i) ASSERT_TRUE(row_equal(c, r, clean, i, h)) << "row " << i;
  }
}

TEST_P(NanSemantics, RowsThatSeeNoKeyStayEmpty) {
  const auto [dtype, backend] = GetParam();
  std::mt19937_64 rng(fresh_seed());
  // Bottom-right causal with 100 query rows on 40 keys: rows 0..59 see no key.
  const Case c = causal_case(dtype, backend, 100, 40);
  CaseTensors t(c, rng);
  for (int i = 0; i < 60; ++i) t.q.set(at(c, i, 0, 0, c.heads_q, c.hdim), kNaN);
  t.k.set(at(c, 0, 0, 0, 1, c.hdim), kNaN);  // seen by rows 60.. only
  const Result r = forward_run(c, t);
  for (int i = 0; i < 60; ++i)
    for (int h = 0; h < c.heads_q; ++h) {
      for (int col = 0; col < c.hdim_v; ++col) ASSERT_EQ(r.out[at(c, i, h, col, c.heads_q, c.hdim_v)], 0.0);
      ASSERT_EQ(r.lse[static_cast<std::int64_t>(h) * c.seqlen_q + i], -kInf);
    }
  for (int i = 60; i < 100; ++i) ASSERT_TRUE(row_all_nan(c, r, i, 0)) << i;
}

TEST_P(NanSemantics, BackwardNaNQueryRowGivesNaNGradient) {
  const auto [dtype, backend] = GetParam();
  std::mt19937_64 rng(fresh_seed());
  const Case c = causal_case(dtype, backend, 90, 90);
  CaseTensors t(c, rng);
  const int i0 = 50;
  t.q.set(at(c, i0, 0, 0, c.heads_q, c.hdim), kNaN);
  forward(t.forward(c));
  t.dq.poison();
  backward(t.backward(c));
  const std::vector<double> dq = t.dq.to_f64();
  for (int col = 0; col < c.hdim; ++col) ASSERT_TRUE(std::isnan(dq[at(c, i0, 0, col, c.heads_q, c.hdim)])) << col;
  for (int col = 0; col < c.hdim; ++col) ASSERT_TRUE(std::isfinite(dq[at(c, 10, 1, col, c.heads_q, c.hdim)])) << col;
}

INSTANTIATE_TEST_SUITE_P(Backends, NanSemantics,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(Backend::cpu_flash, Backend::cpu_reference)));

// Split-KV decoding: a NaN key in one split makes its sequence's rows NaN through the merge, even
// where every other split is empty; another sequence stays finite.
TEST(NanSemanticsDecode, NaNKeyThroughTheSplitMerge) {
  for (Backend backend : {Backend::cpu_flash, Backend::cpu_reference}) {
    std::mt19937_64 rng(fresh_seed());
    HostTensor q(DType::f32, {2, 1, 4, 16}), kc(DType::f32, {2, 512, 2, 16}), vc(DType::f32, {2, 512, 2, 16});
    HostTensor out(DType::f32, {2, 1, 4, 16}), lse(DType::f32, {2, 4, 1});
    HostTensor lens = int_tensor({300, 70});
    for (HostTensor* x : {&q, &kc, &vc}) x->fill_normal(rng);
    kc.set(((0 * 512 + 250) * 2 + 1) * 16 + 3, kNaN);  // sequence 0, KV head 1, key 250
    kc.set(((1 * 512 + 65) * 2 + 0) * 16 + 3, kNaN);  // sequence 1, key 65: past its split's first tile
    DecodeArgs a;
    a.q = q.view(), a.k_cache = kc.view(), a.v_cache = vc.view(), a.cache_seqlens = lens.view();
    a.out = out.view(), a.lse = lse.view();
    a.options.backend = backend;
    a.options.num_splits = 4;
    decode(a);
    const std::vector<double> o = out.to_f64(), l = lse.to_f64();
    for (int h = 0; h < 4; ++h) {
      const bool reached = h >= 2;  // query heads 2, 3 read KV head 1 in sequence 0
      EXPECT_EQ(std::isnan(o[(0 * 4 + h) * 16]), reached) << "sequence 0 head " << h;
      EXPECT_EQ(std::isnan(l[0 * 4 + h]), reached);
      EXPECT_EQ(std::isnan(o[(1 * 4 + h) * 16]), h < 2) << "sequence 1 head " << h;
    }
  }
}

TEST(NanSemanticsCombine, NaNPartialReachesTheRow) {
  HostTensor op(DType::f32, {3, 1, 1, 2, 8}), lp(DType::f32, {3, 1, 2, 1});
  HostTensor out(DType::f32, {1, 1, 2, 8}), lse(DType::f32, {1, 2, 1});
  op.fill(1.0);
  // Head 0: split 1 NaN, the others empty. Head 1: two finite splits and an empty one.
  const double l[6] = {-kInf, -kInf, kNaN, 0.5, -kInf, 0.25};
  for (int s = 0; s < 3; ++s)
    for (int h = 0; h < 2; ++h) lp.set(s * 2 + h, l[h == 0 ? s : 3 + s]);
  CombineArgs a;
  a.out_partial = op.view(), a.lse_partial = lp.view(), a.out = out.view(), a.lse = lse.view();
  combine(a);
  EXPECT_TRUE(std::isnan(out.get(0)));
  EXPECT_TRUE(std::isnan(lse.get(0)));
  EXPECT_FLOAT_EQ(out.get(8), 1.0);
  EXPECT_TRUE(std::isfinite(lse.get(1)));
}

}  // namespace
}  // namespace tileattn::test
