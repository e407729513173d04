// Prefix-LM: every query row sees the prompt's keys [0, prefix) and, beyond them, what its causal
// mask lets it see. The oracle against attention computed row by row over exactly those keys (no
// mask at all), the variant's block and row ranges against its element rule, and the CPU decode
// against the oracle. The flash paths' sweeps are in flash_forward_test and flash_backward_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "attention_case.hpp"
#include "common/variant.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

// The keys row i of a prefix-LM sequence sees: [0, end(i)), the causal end (bottom-right or
// top-left diagonal, plus window_right) or the prefix, whichever reaches further.
int visible_end(int i, int sq, int sk, bool bottom_right, int right, int prefix) {
  const long diag = bottom_right ? static_cast<long>(i) + sk - sq : i;
  const long causal_end = std::clamp<long>(diag + right + 1, 0, sk);
  return static_cast<int>(std::max<long>(causal_end, std::min(prefix, sk)));
}

// The reference's prefix-LM forward (fp32, batched, GQA, sq != sk, per call or per sequence) equals,
// row by row, unmasked attention of that row over its visible keys.
TEST(PrefixLm, ReferenceIsAttentionOverThePrefixAndTheCausalKeys) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 12; ++it) {
    Case c;
    c.batch = uni(1, 3);
    c.heads_kv = uni(1, 2);
    c.heads_q = c.heads_kv * uni(1, 3);
    c.seqlen_q = uni(1, 37);
    c.seqlen_k = uni(1, 41);
    c.hdim = 8 * uni(1, 3);
    c.hdim_v = 8 * uni(1, 3);
    c.options.backend = Backend::cpu_reference;
    c.options.align = uni(0, 1) ? MaskAlign::bottom_right : MaskAlign::top_left;
    const int right = uni(0, 3) == 0 ? uni(1, 4) : 0;
    c.options.causal = right == 0;
    c.options.window_right = right == 0 ? -1 : right;
    if (uni(0, 1)) {
      c.options.prefix_len = uni(1, c.seqlen_k + 3);
    } else {
      for (int b = 0; b < c.batch; ++b) c.prefix_lens.push_back(uni(0, c.seqlen_k + 3));
    }
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + c.str());
    CaseTensors t(c, rng);
    ForwardArgs a = t.forward(c);
    forward(a);
    const std::vector<double> out = t.out.to_f64(), lse = t.lse.to_f64();
    const bool br = c.options.align == MaskAlign::bottom_right;
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < c.seqlen_q; ++i) {
        const int prefix = c.prefix_lens.empty() ? c.options.prefix_len : c.prefix_lens[b];
        const int end = visible_end(i, c.seqlen_q, c.seqlen_k, br, right, prefix);
        if (end == 0) {  // no key: out 0, lse -inf
          for (int h = 0; h < c.heads_q; ++h)
            ASSERT_EQ(lse[(static_cast<std::int64_t>(b) * c.heads_q + h) * c.seqlen_q + i], -INFINITY) << "row " << i;
          continue;
        }
        // Row i alone over keys [0, end), no mask.
        ForwardArgs row = a;
        row.q = view(static_cast<char*>(a.q.data) + (b * a.q.stride[0] + i * a.q.stride[1]) * 4, DType::f32,
                     {1, 1, c.heads_q, c.hdim}, {a.q.stride[0], a.q.stride[1], a.q.stride[2], 1});
        row.k = a.k, row.v = a.v;
        row.k.data = static_cast<char*>(a.k.data) + b * a.k.stride[0] * 4;
        row.v.data = static_cast<char*>(a.v.data) + b * a.v.stride[0] * 4;
        row.k.shape[0] = row.v.shape[0] = 1;
        row.k.shape[1] = row.v.shape[1] = end;
        HostTensor o(DType::f32, {1, 1, c.heads_q, c.hdim_v}), l(DType::f32, {1, c.heads_q, 1});
        row.out = o.view();
        row.lse = l.view();
        row.options.causal = false;
        row.options.window_right = -1;
        row.options.prefix_len = 0;
        row.prefix_lens = TensorView{};
        forward(row);
        for (int h = 0; h < c.heads_q; ++h) {
          ASSERT_NEAR(lse[(static_cast<std::int64_t>(b) * c.heads_q + h) * c.seqlen_q + i], l.get(h), 1e-6)
              << "b " << b << " row " << i << " head " << h << " keys " << end;
          for (int x = 0; x < c.hdim_v; ++x)
            ASSERT_NEAR(out[((static_cast<std::int64_t>(b) * c.seqlen_q + i) * c.heads_q + h) * c.hdim_v + x],
                        o.get(static_cast<std::int64_t>(h) * c.hdim_v + x), 1e-6)
                << "b " << b << " row " << i << " head " << h << " keys " << end;
        }
      }
  }
}

// Variant::visible is the prefix-LM rule; visit() and the backward's row ranges agree with it.
TEST(PrefixLm, VariantBlocksAndRowRangesAgreeWithElements) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 400; ++it) {
    const int sq = uni(1, 60), sk = uni(1, 60), right = uni(0, 2) ? 0 : uni(1, 20), prefix = uni(0, sk + 5);
    const bool br = uni(0, 1) == 1;
    Variant v;
    v.mask = Mask(sq, sk, br, -1, right);
    v.prefix = prefix;
    const int i0 = uni(0, sq - 1), i1 = uni(i0 + 1, sq), j0 = uni(0, sk - 1), j1 = uni(j0 + 1, sk);
    int seen = 0;
    for (int i = i0; i < i1; ++i)
      for (int j = j0; j < j1; ++j) {
        const bool want = j < visible_end(i, sq, sk, br, right, prefix);
        ASSERT_EQ(v.visible(i, j), want) << "seed " << seed << " row " << i << " key " << j;
        seen += want;
        if (want) {
          ASSERT_GE(i, v.row_begin(j0)) << "seed " << seed;
          ASSERT_LT(i, v.row_end(j1)) << "seed " << seed;
        }
      }
    const int all = (i1 - i0) * (j1 - j0);
    const BlockVisit want = seen == 0 ? BlockVisit::skip : seen == all ? BlockVisit::full : BlockVisit::partial;
    ASSERT_EQ(v.visit(i0, i1, j0, j1), want) << "seed " << seed << " sq=" << sq << " sk=" << sk << " right=" << right
                                             << " prefix=" << prefix << " rows [" << i0 << "," << i1 << ") keys ["
                                             << j0 << "," << j1 << ")";
  }
}

// Decode under options.prefix_len (rows of a chunked prefill still inside the prompt see all of
// it): the CPU flash decode, split or not, against the oracle.
TEST(PrefixLm, DecodeMatchesReference) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int batch = 3, sq = 5, cap = 150, hq = 4, hkv = 2, d = 24;
  HostTensor q(DType::f32, {batch, sq, hq, d}), kc(DType::f32, {batch, cap, hkv, d}), vc(DType::f32, {batch, cap, hkv, d});
  for (HostTensor* x : {&q, &kc, &vc}) x->fill_normal(rng);
  HostTensor lens = int_tensor({3, 7, 140});  // with 5 rows bottom-right, rows above the first key
  for (int prefix : {1, 9, 100, 200})
    for (int splits : {1, 3}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " prefix " + std::to_string(prefix) + " splits " +
                   std::to_string(splits));
      std::vector<std::vector<double>> got;
      for (Backend be : {Backend::cpu_flash, Backend::cpu_reference}) {
        HostTensor out(DType::f32, {batch, sq, hq, d}), lse(DType::f32, {batch, hq, sq});
        out.poison();
        lse.poison();
        DecodeArgs a;
        a.q = q.view(), a.k_cache = kc.view(), a.v_cache = vc.view(), a.cache_seqlens = lens.view();
        a.out = out.view(), a.lse = lse.view();
        a.options.backend = be;
        a.options.causal = true;
        a.options.prefix_len = prefix;
        a.options.num_splits = splits;
        decode(a);
        got.push_back(out.to_f64());
        got.push_back(lse.to_f64());
      }
      EXPECT_LE(f32_error(got[0], got[2]), 1e-5) << "out";
      EXPECT_LE(f32_error(got[1], got[3]), 1e-5) << "lse";
    }
}

}  // namespace
}  // namespace tileattn::test
