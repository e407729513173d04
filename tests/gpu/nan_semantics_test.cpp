// NaN inputs on the GPU propagate as on the CPU backends (README, Semantics): a NaN query row
// makes its row NaN, a NaN key every row that sees it, through the split-KV merge and the combine
// too; rows that cannot see it stay finite, rows that see no key stay O = 0, LSE = -inf.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/device_tensor.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Forward, bf16, causal bottom-right: q [1, sq, 2, 64] on k, v [1, sk, 1, 64]. Returns out, lse.
struct Fwd {
  std::vector<double> out, lse;
};

Fwd gpu_forward(const HostTensor& q, const HostTensor& k, const HostTensor& v, int sq) {
  HostTensor out(DType::bf16, {1, sq, 2, 64}), lse(DType::f32, {1, 2, sq});
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  ForwardArgs a;
  a.q = dq.view(), a.k = dk.view(), a.v = dv.view(), a.out = dout.view(), a.lse = dlse.view();
  a.options.causal = true;
  forward(a);
  device_synchronize();
  dout.to_host(out);
  dlse.to_host(lse);
  return {out.to_f64(), lse.to_f64()};
}

TEST(GpuNanSemantics, ForwardQueryAndKey) {
  if (const std::string why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937_64 rng(fresh_seed());
  const int sq = 150, sk = 150, i0 = 70, j0 = 100;
  HostTensor q(DType::bf16, {1, sq, 2, 64}), k(DType::bf16, {1, sk, 1, 64}), v(DType::bf16, {1, sk, 1, 64});
  for (HostTensor* x : {&q, &k, &v}) x->fill_normal(rng);
  q.set((static_cast<std::int64_t>(i0) * 2 + 1) * 64 + 3, kNaN);  // row 70 of head 1
  k.set(static_cast<std::int64_t>(j0) * 64 + 5, kNaN);            // key 100
  const Fwd r = gpu_forward(q, k, v, sq);
  for (int i = 0; i < sq; ++i)
    for (int h = 0; h < 2; ++h) {
      const bool nan = i >= j0 || (i == i0 && h == 1);
      for (int c = 0; c < 64; ++c)
        ASSERT_EQ(std::isnan(r.out[(static_cast<std::int64_t>(i) * 2 + h) * 64 + c]), nan) << "row " << i << " head " << h;
      ASSERT_EQ(std::isnan(r.lse[static_cast<std::int64_t>(h) * sq + i]), nan) << "row " << i << " head " << h;
    }
}

TEST(GpuNanSemantics, DecodeSplitsAndCombine) {
  if (const std::string why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  for (int splits : {0, 1, 4, 64}) {
    SCOPED_TRACE(splits);
    std::mt19937_64 rng(fresh_seed());
    HostTensor q(DType::bf16, {2, 1, 4, 64}), kc(DType::bf16, {2, 512, 2, 64}), vc(DType::bf16, {2, 512, 2, 64});
    HostTensor out(DType::bf16, {2, 1, 4, 64}), lse(DType::f32, {2, 4, 1});
    HostTensor lens = int_tensor({300, 70});
    for (HostTensor* x : {&q, &kc, &vc}) x->fill_normal(rng);
    kc.set(((0 * 512 + 250) * 2 + 1) * 64 + 3, kNaN);  // sequence 0, KV head 1, key 250
    kc.set(((1 * 512 + 400) * 2 + 0) * 64 + 3, kNaN);  // sequence 1, key 400: past its length, unseen
    DeviceTensor dq(q), dkc(kc), dvc(vc), dout(out), dlse(lse), dlens(lens);
    DecodeArgs a;
    a.q = dq.view(), a.k_cache = dkc.view(), a.v_cache = dvc.view(), a.cache_seqlens = dlens.view();
    a.out = dout.view(), a.lse = dlse.view();
    a.options.num_splits = splits;
    decode(a);
    device_synchronize();
    dout.to_host(out);
    dlse.to_host(lse);
    const std::vector<double> o = out.to_f64(), l = lse.to_f64();
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 4; ++h) {
        const bool nan = b == 0 && h >= 2;  // query heads 2, 3 read KV head 1
        for (int c = 0; c < 64; ++c) ASSERT_EQ(std::isnan(o[(b * 4 + h) * 64 + c]), nan) << b << " " << h;
        ASSERT_EQ(std::isnan(l[b * 4 + h]), nan) << b << " " << h;
      }
  }
  // The combine: a NaN partial with every other split empty.
  HostTensor op(DType::f32, {3, 1, 1, 2, 64}), lp(DType::f32, {3, 1, 2, 1});
  HostTensor out(DType::bf16, {1, 1, 2, 64}), lse(DType::f32, {1, 2, 1});
  op.fill(1.0);
  const double inf = std::numeric_limits<double>::infinity();
  const double l[6] = {-inf, -inf, kNaN, 0.5, -inf, 0.25};  // head 0: NaN; head 1: finite
  for (int s = 0; s < 3; ++s)
    for (int h = 0; h < 2; ++h) lp.set(s * 2 + h, l[h == 0 ? s : 3 + s]);
  DeviceTensor dop(op), dlp(lp), dout(out), dlse(lse);
  CombineArgs c;
  c.out_partial = dop.view(), c.lse_partial = dlp.view(), c.out = dout.view(), c.lse = dlse.view();
  combine(c);
  device_synchronize();
  dout.to_host(out);
  dlse.to_host(lse);
  EXPECT_TRUE(std::isnan(out.get(0)));
  EXPECT_TRUE(std::isnan(lse.get(0)));
  EXPECT_DOUBLE_EQ(out.get(64), 1.0);
  EXPECT_TRUE(std::isfinite(lse.get(1)));
}

}  // namespace
}  // namespace tileattn::test
