// The LSE combine: attention over disjoint key sets, merged, equals attention over all keys; an
// empty set (lse -inf, whatever its partial output holds) contributes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/host_tensor.hpp"
#include "support/seeded_test.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

constexpr int B = 2, SQ = 3, H = 2, D = 8, DV = 16, SK = 11;

struct Full {
  HostTensor q{DType::f32, {B, SQ, H, D}}, k{DType::f32, {B, SK, H, D}}, v{DType::f32, {B, SK, H, DV}};
};

// Reference forward of q against the keys `keys` (the same for every sequence and head).
void attend(const Full& f, const std::vector<int>& keys, HostTensor& out, HostTensor& lse) {
  const int n = static_cast<int>(keys.size());
  HostTensor k(DType::f32, {B, n, H, D}), v(DType::f32, {B, n, H, DV});
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < n; ++j)
      for (int h = 0; h < H; ++h) {
        for (int c = 0; c < D; ++c) k.set(((b * n + j) * H + h) * D + c, f.k.get(((b * SK + keys[j]) * H + h) * D + c));
        for (int c = 0; c < DV; ++c) v.set(((b * n + j) * H + h) * DV + c, f.v.get(((b * SK + keys[j]) * H + h) * DV + c));
      }
  ForwardArgs a;
  a.q = f.q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.options.backend = Backend::cpu_reference;
  forward(a);
}

class Combine : public test::SeededTest {
 protected:
  // Splits the keys at random into `splits` sets (set `empty` gets none), combines, and compares
  // with attention over all keys.
  void split_and_combine(int splits, int empty, DType out_dtype) {
    Full f;
    f.q.fill_normal(rng_);
    f.k.fill_normal(rng_);
    f.v.fill_normal(rng_);
    std::vector<std::vector<int>> sets(splits);
    std::uniform_int_distribution<int> pick(0, splits - 1);
    for (int j = 0; j < SK; ++j) {
      int s = pick(rng_);
      if (s == empty) s = (s + 1) % splits;
      sets[s].push_back(j);
    }
    HostTensor op(DType::f32, {splits, B, SQ, H, DV}), lp(DType::f32, {splits, B, H, SQ});
    for (int s = 0; s < splits; ++s) {
      HostTensor o(DType::f32, {B, SQ, H, DV}), l(DType::f32, {B, H, SQ});
      attend(f, sets[s], o, l);
      const bool none = sets[s].empty();
      for (std::int64_t e = 0; e < o.numel(); ++e) op.set(s * o.numel() + e, none ? NAN : o.get(e));
      for (std::int64_t e = 0; e < l.numel(); ++e) lp.set(s * l.numel() + e, l.get(e));
    }
    std::vector<int> all(SK);
    for (int j = 0; j < SK; ++j) all[j] = j;
    HostTensor want_o(DType::f32, {B, SQ, H, DV}), want_l(DType::f32, {B, H, SQ});
    attend(f, all, want_o, want_l);

    HostTensor out(out_dtype, {B, SQ, H, DV}, {0, 2, 1, 3}), lse(DType::f32, {B, H, SQ});
    out.poison();
    lse.poison();
    CombineArgs a;
    a.out_partial = op.view();
    a.lse_partial = lp.view();
    a.out = out.view();
    a.lse = lse.view();
    combine(a);
    const double tol = out_dtype == DType::f32 ? 2e-6 : 1e-2;
    EXPECT_LE(test::max_abs_error(out.to_f64(), want_o.to_f64()), tol);
    EXPECT_LE(test::max_abs_error(lse.to_f64(), want_l.to_f64()), 2e-6);
  }
};

TEST_F(Combine, DisjointSplitsEqualAttentionOverAllKeys) {
  for (int splits : {1, 2, 3, 5}) split_and_combine(splits, -1, DType::f32);
}

TEST_F(Combine, EmptySplitIsIgnored) {
  split_and_combine(4, 0, DType::f32);
  split_and_combine(4, 3, DType::f32);
}

TEST_F(Combine, IntoBf16Output) { split_and_combine(3, 1, DType::bf16); }

// Per row: splits whose lse is -inf drop out of the merge; a row empty in every split gets 0, -inf.
TEST_F(Combine, RowsEmptyInSomeOrAllSplits) {
  const int S = 3;
  HostTensor op(DType::f32, {S, 1, 2, 1, 8}), lp(DType::f32, {S, 1, 1, 2});
  op.fill_normal(rng_);
  // row 0: split 1 empty (garbage output); row 1: every split empty
  const double l0[S] = {0.3, -INFINITY, -1.2};
  for (int s = 0; s < S; ++s) {
    lp.set(s * 2 + 0, l0[s]);
    lp.set(s * 2 + 1, -INFINITY);
    for (int c = 0; c < 8; ++c) {
      if (s == 1) op.set((s * 2 + 0) * 8 + c, NAN);
      op.set((s * 2 + 1) * 8 + c, c % 2 ? NAN : 1e30);
    }
  }
  HostTensor out(DType::f32, {1, 2, 1, 8}), lse(DType::f32, {1, 1, 2});
  out.poison();
  lse.poison();
  CombineArgs a;
  a.out_partial = op.view();
  a.lse_partial = lp.view();
  a.out = out.view();
  a.lse = lse.view();
  combine(a);
  const double total = std::log(std::exp(0.3) + std::exp(-1.2));
  EXPECT_NEAR(lse.get(0), total, 1e-6);
  for (int c = 0; c < 8; ++c) {
    const double want = std::exp(0.3 - total) * op.get(c) + std::exp(-1.2 - total) * op.get((2 * 2 + 0) * 8 + c);
    EXPECT_NEAR(out.get(c), want, 1e-6) << "col " << c;
    EXPECT_EQ(out.get(8 + c), 0.0) << "col " << c;
  }
  EXPECT_EQ(lse.get(1), -INFINITY);
}

// Large, far-apart lse values: the merge must not overflow.
TEST_F(Combine, HugeLseValues) {
  HostTensor op(DType::f32, {2, 1, 1, 1, 8}), lp(DType::f32, {2, 1, 1, 1});
  op.fill_normal(rng_);
  lp.set(0, 1e4);
  lp.set(1, 1e4 - 2.0);
  HostTensor out(DType::f32, {1, 1, 1, 8}), lse(DType::f32, {1, 1, 1});
  CombineArgs a;
  a.out_partial = op.view();
  a.lse_partial = lp.view();
  a.out = out.view();
  a.lse = lse.view();
  combine(a);
  const double w1 = 1 / (1 + std::exp(-2.0));
  EXPECT_NEAR(lse.get(0), 1e4 + std::log1p(std::exp(-2.0)), 1e-2);
  for (int c = 0; c < 8; ++c) EXPECT_NEAR(out.get(c), w1 * op.get(c) + (1 - w1) * op.get(8 + c), 1e-5);
}

}  // namespace
}  // namespace tileattn
