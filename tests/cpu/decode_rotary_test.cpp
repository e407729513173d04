// Decode with append and rotary embedding, against plain tensor operations: rotate q and the new
// keys by hand, concatenate them onto the cache, and run an ordinary forward over the result.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

struct RotaryCase {
  bool interleaved;
  bool causal;
  int rotary_dim;
};

class DecodeRotary : public ::testing::TestWithParam<RotaryCase> {};

// x[c0], x[c1] rotated by angle theta, on a row of a [rows, d] matrix held as doubles.
void rotate_pair(std::vector<double>& x, std::int64_t base, int c0, int c1, double cs, double sn) {
  const double a = x[base + c0], b = x[base + c1];
  x[base + c0] = a * cs - b * sn;
  x[base + c1] = b * cs + a * sn;
}

TEST_P(DecodeRotary, MatchesPlainOps) {
  const RotaryCase rc = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int batch = 2, sq = 3, hq = 4, hkv = 2, d = 16, cap = 12, snew = 3;
  const std::vector<std::int32_t> lens = {5, 0};
  HostTensor q(DType::f32, {batch, sq, hq, d}), kc(DType::f32, {batch, cap, hkv, d}), vc(DType::f32, {batch, cap, hkv, d});
  HostTensor kn(DType::f32, {batch, snew, hkv, d}), vn(DType::f32, {batch, snew, hkv, d});
  const int positions = cap + sq;  // causal calls place query row i at cache length + i
  HostTensor cosv(DType::f32, {positions, rc.rotary_dim / 2}), sinv(DType::f32, {positions, rc.rotary_dim / 2});
  for (HostTensor* t : {&q, &kc, &vc, &kn, &vn}) t->fill_normal(rng);
  std::uniform_real_distribution<double> angle(-3.0, 3.0);
  std::vector<double> theta(positions * rc.rotary_dim / 2);
  for (std::size_t i = 0; i < theta.size(); ++i) {
    theta[i] = angle(rng);
    cosv.set(static_cast<std::int64_t>(i), std::cos(theta[i]));
    sinv.set(static_cast<std::int64_t>(i), std::sin(theta[i]));
  }
  HostTensor seqlens = int_tensor(lens);

  // Plain ops: the rotated new keys and queries.
  const int half = rc.rotary_dim / 2;
  auto cols = [&](int c, int& c0, int& c1) {
    c0 = rc.interleaved ? 2 * c : c;
    c1 = rc.interleaved ? 2 * c + 1 : c + half;
  };
  std::vector<double> knr = kn.to_f64(), qr = q.to_f64();
  for (int b = 0; b < batch; ++b) {
    for (int n = 0; n < snew; ++n)
      for (int g = 0; g < hkv; ++g)
        for (int c = 0; c < half; ++c) {
          int c0, c1;
          cols(c, c0, c1);
          const int pos = lens[b] + n;
          const std::int64_t th = static_cast<std::int64_t>(pos) * half + c;
          rotate_pair(knr, ((static_cast<std::int64_t>(b) * snew + n) * hkv + g) * d, c0, c1, cosv.get(th), sinv.get(th));
        }
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < hq; ++h)
        for (int c = 0; c < half; ++c) {
          int c0, c1;
          cols(c, c0, c1);
          const int pos = lens[b] + (rc.causal ? i : 0);
          const std::int64_t th = static_cast<std::int64_t>(pos) * half + c;
          rotate_pair(qr, ((static_cast<std::int64_t>(b) * sq + i) * hq + h) * d, c0, c1, cosv.get(th), sinv.get(th));
        }
  }

  // The call under test.
  HostTensor kc2 = kc, vc2 = vc, out(DType::f32, {batch, sq, hq, d}), lse(DType::f32, {batch, hq, sq});
  out.poison();
  DecodeArgs a;
  a.q = q.view();
  a.k_cache = kc2.view();
  a.v_cache = vc2.view();
  a.cache_seqlens = seqlens.view();
  a.k_new = kn.view();
  a.v_new = vn.view();
  a.rotary_cos = cosv.view();
  a.rotary_sin = sinv.view();
  a.rotary_interleaved = rc.interleaved;
  a.out = out.view();
  a.lse = lse.view();
  a.options.causal = rc.causal;
  a.options.backend = Backend::cpu_reference;
  decode(a);

  // The cache now holds the rotated keys and the new values at lens[b]..
  for (int b = 0; b < batch; ++b)
    for (int n = 0; n < snew; ++n)
      for (int g = 0; g < hkv; ++g)
        for (int c = 0; c < d; ++c) {
          const std::int64_t src = ((static_cast<std::int64_t>(b) * snew + n) * hkv + g) * d + c;
          const std::int64_t dst = ((static_cast<std::int64_t>(b) * cap + lens[b] + n) * hkv + g) * d + c;
          EXPECT_NEAR(kc2.get(dst), knr[src], 1e-6) << "k_cache b" << b << " row " << lens[b] + n << " col " << c;
          EXPECT_EQ(vc2.get(dst), vn.get(src));
        }

  // Forward over the concatenation, one sequence at a time, with the rotated q.
  for (int b = 0; b < batch; ++b) {
    const int sk = lens[b] + snew;
    HostTensor qb(DType::f32, {1, sq, hq, d}), kb(DType::f32, {1, sk, hkv, d}), vb(DType::f32, {1, sk, hkv, d});
    HostTensor ob(DType::f32, {1, sq, hq, d}), lb(DType::f32, {1, hq, sq});
    for (std::int64_t i = 0; i < qb.numel(); ++i) qb.set(i, qr[b * qb.numel() + i]);
    for (int j = 0; j < sk; ++j)
      for (int g = 0; g < hkv; ++g)
        for (int c = 0; c < d; ++c) {
          const std::int64_t to = (static_cast<std::int64_t>(j) * hkv + g) * d + c;
          if (j < lens[b]) {
            const std::int64_t from = ((static_cast<std::int64_t>(b) * cap + j) * hkv + g) * d + c;
            kb.set(to, kc.get(from));
            vb.set(to, vc.get(from));
          } else {
            const std::int64_t from = ((static_cast<std::int64_t>(b) * snew + j - lens[b]) * hkv + g) * d + c;
            kb.set(to, knr[from]);
            vb.set(to, vn.get(from));
          }
        }
    ForwardArgs f;
    f.q = qb.view();
    f.k = kb.view();
    f.v = vb.view();
    f.out = ob.view();
    f.lse = lb.view();
    f.options.causal = rc.causal;
    f.options.backend = Backend::cpu_reference;
    forward(f);
    for (std::int64_t i = 0; i < ob.numel(); ++i)
      EXPECT_NEAR(out.get(b * ob.numel() + i), ob.get(i), 1e-5) << "out b" << b << " element " << i;
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < sq; ++i) EXPECT_NEAR(lse.get((b * hq + h) * sq + i), lb.get(h * sq + i), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, DecodeRotary,
                         ::testing::Values(RotaryCase{false, false, 16}, RotaryCase{true, false, 16},
                                           RotaryCase{false, true, 8}, RotaryCase{true, true, 8}));

}  // namespace
}  // namespace tileattn::test
