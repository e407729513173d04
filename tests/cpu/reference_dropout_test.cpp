// Dropout in the reference forward: which elements it drops (the Philox bit of (b*heads_q + h, i, j)
// within each sequence), that it is unbiased, and that it depends on (seed, offset) and nothing else.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/philox.hpp"
#include "support/host_tensor.hpp"
#include "support/seeded_test.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

struct Batched {
  int batch, sq, sk, hq, hkv, d;
  HostTensor q, k, v, out, lse;
  Batched(std::mt19937_64& rng, int b, int sq_, int sk_, int hq_, int hkv_, int d_)
      : batch(b), sq(sq_), sk(sk_), hq(hq_), hkv(hkv_), d(d_), q(DType::f32, {b, sq_, hq_, d_}),
        k(DType::f32, {b, sk_, hkv_, d_}), v(DType::f32, {b, sk_, hkv_, d_}),
        out(DType::f32, {b, sq_, hq_, d_}), lse(DType::f32, {b, hq_, sq_}) {
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
  }
  std::vector<double> run(float p, std::uint64_t seed, std::uint64_t offset) {
    out.poison();
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.options.dropout_p = p;
    a.options.seed = seed;
    a.options.offset = offset;
    a.options.backend = Backend::cpu_reference;
    forward(a);
    return out.to_f64();
  }
};

class ReferenceDropout : public test::SeededTest {};

// Varlen with GQA: each sequence's rows and columns restart at 0 and bh = b * heads_q + h.
TEST_F(ReferenceDropout, DropsExactlyThePhiloxMask) {
  const int hq = 4, hkv = 2, d = 8;
  const float p = 0.35f;
  const std::uint64_t seed = rng_(), offset = rng_();
  const std::vector<std::int32_t> cq{0, 3, 8, 9}, ck{0, 7, 13, 22};
  const int tq = cq.back(), tk = ck.back();
  HostTensor q(DType::f32, {tq, hq, d}), k(DType::f32, {tk, hkv, d}), v(DType::f32, {tk, hkv, d});
  HostTensor out(DType::f32, {tq, hq, d}), lse(DType::f32, {hq, tq});
  q.fill_normal(rng_);
  k.fill_normal(rng_);
  v.fill_normal(rng_);
  HostTensor cuq = test::int_tensor(cq), cuk = test::int_tensor(ck);
  ForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.cu_seqlens_q = cuq.view();
  a.cu_seqlens_k = cuk.view();
  a.max_seqlen_q = 5;
  a.max_seqlen_k = 9;
  a.options.dropout_p = p;
  a.options.seed = seed;
  a.options.offset = offset;
  a.options.backend = Backend::cpu_reference;
  forward(a);

  const Dropout gen(p, seed, offset);
  const double scale = 1.0 / std::sqrt(double(d));
  int dropped = 0, total = 0;
  for (int b = 0; b < 3; ++b)
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      for (int i = 0; i < cq[b + 1] - cq[b]; ++i) {
        const int tok = cq[b] + i;
        const int nk = ck[b + 1] - ck[b];
        std::vector<double> s(nk);
        double m = -INFINITY, l = 0;
        for (int j = 0; j < nk; ++j) {
          s[j] = 0;
          for (int c = 0; c < d; ++c) s[j] += q.get((tok * hq + h) * d + c) * k.get(((ck[b] + j) * hkv + g) * d + c);
          s[j] *= scale;
          m = std::max(m, s[j]);
        }
        for (int j = 0; j < nk; ++j) l += std::exp(s[j] - m);
        // The LSE is that of the softmax before dropout.
        EXPECT_NEAR(lse.get(h * tq + tok), m + std::log(l), 2e-6 * std::max(1.0, std::abs(m)));
        for (int c = 0; c < d; ++c) {
          double o = 0;
          for (int j = 0; j < nk; ++j) {
            const bool keep = gen.keep(static_cast<std::uint32_t>(b * hq + h), i, j);
            if (c == 0) {
              dropped += !keep;
              ++total;
            }
            if (keep) o += std::exp(s[j] - m) / l / (1.0 - double(p)) * v.get(((ck[b] + j) * hkv + g) * d + c);
          }
          EXPECT_NEAR(out.get((tok * hq + h) * d + c), o, 4e-6 * std::max(1.0, std::abs(o)))
              << "b " << b << " h " << h << " i " << i << " c " << c;
        }
      }
    }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, total);
}

TEST_F(ReferenceDropout, DependsOnSeedAndOffsetOnly) {
  Batched t(rng_, 2, 5, 7, 2, 1, 8);
  const std::uint64_t seed = rng_(), offset = rng_();
  const auto a = t.run(0.5f, seed, offset), again = t.run(0.5f, seed, offset);
  EXPECT_EQ(0, std::memcmp(a.data(), again.data(), a.size() * sizeof(double))) << "not reproducible";
  EXPECT_NE(a, t.run(0.5f, seed, offset + 1)) << "offset ignored";
  EXPECT_NE(a, t.run(0.5f, seed ^ 1, offset)) << "seed ignored";
  EXPECT_NE(a, t.run(0.5f, seed, offset + (1ull << 32))) << "high offset bits ignored";
  EXPECT_NE(a, t.run(0.f, seed, offset)) << "dropout had no effect";
}

// Dropout scales kept values by 1/(1-p), so O averaged over many seeds approaches the undropped O.
// Per element, the mean must sit within 5 standard errors of it.
TEST_F(ReferenceDropout, UnbiasedOverManySeeds) {
  Batched t(rng_, 1, 2, 6, 2, 2, 8);
  const auto exact = t.run(0.f, 0, 0);
  const int n = 3000;
  std::vector<double> sum(exact.size(), 0.0), sum2(exact.size(), 0.0);
  const std::uint64_t base = rng_();
  for (int s = 0; s < n; ++s) {
    const auto o = t.run(0.4f, base + s, 0);
    for (std::size_t e = 0; e < o.size(); ++e) {
      sum[e] += o[e];
      sum2[e] += o[e] * o[e];
    }
  }
  for (std::size_t e = 0; e < exact.size(); ++e) {
    const double mean = sum[e] / n, var = sum2[e] / n - mean * mean;
    const double se = std::sqrt(std::max(var, 0.0) / n);
    EXPECT_NEAR(mean, exact[e], 5 * se + 1e-9) << "element " << e;
  }
}

}  // namespace
}  // namespace tileattn
