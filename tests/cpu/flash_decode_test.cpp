// The CPU split-KV decode against the fp64 reference: contiguous and paged caches, ragged cache
// lengths (0 and 1 included), appended keys, GQA, several query rows, every score option.
#include <gtest/gtest.h>

#include <numeric>

#include "attention_case.hpp"
#include "core/problem.hpp"
#include "cpu/reference.hpp"

namespace tileattn::test {
namespace {

struct DecodeCase {
  DType dtype = DType::f32;
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, hdim = 8, hdim_v = 8, seqlen_new = 0;
  int capacity = 1, page_size = 0;  // page_size 0: contiguous cache
  int rotary_dim = 0;
  bool interleaved = false, alibi = false;
  std::vector<int> lens;
  Options options;

  std::string str() const {
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << " batch=" << batch << " heads=" << heads_q << "/" << heads_kv
       << " seqlen_q=" << seqlen_q << " hdim=" << hdim << "/" << hdim_v << " new=" << seqlen_new
       << " capacity=" << capacity << " page_size=" << page_size << " rotary=" << rotary_dim
       << (interleaved ? "i" : "") << (alibi ? " alibi" : "") << (options.causal ? " causal" : "")
       << " window=(" << options.window_left << "," << options.window_right << ") softcap=" << options.softcap
       << " chunk=" << options.chunk_size << " splits=" << options.num_splits << " lens=";
    for (int l : lens) os << l << ",";
    return os.str();
  }
};

DecodeCase random_decode_case(std::mt19937_64& rng) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  DecodeCase c;
  c.dtype = std::vector<DType>{DType::f32, DType::f16, DType::bf16}[uni(0, 2)];
  c.batch = uni(1, 3);
  c.heads_kv = uni(1, 3);
  c.heads_q = c.heads_kv * std::vector<int>{1, 2, 4, 8}[uni(0, 3)];
  c.seqlen_q = coin(0.6) ? 1 : uni(2, 5);
  c.hdim = 8 * uni(1, 16);
  c.hdim_v = coin(0.7) ? c.hdim : 8 * uni(1, 16);
  c.seqlen_new = coin(0.5) ? 0 : uni(1, 4);
  const int max_len = coin(0.3) ? 600 : 150;
  for (int b = 0; b < c.batch; ++b) {
    const int k = uni(0, 9);
    c.lens.push_back(k == 0 ? 0 : k == 1 ? 1 : uni(0, max_len));
  }
  c.capacity = *std::max_element(c.lens.begin(), c.lens.end()) + c.seqlen_new + uni(0, 20);
  if (c.capacity == 0) c.capacity = 1;
  if (coin(0.5)) c.page_size = std::vector<int>{1, 3, 16, 64}[uni(0, 3)];
  if (coin(0.25)) {
    c.rotary_dim = 2 * uni(1, c.hdim / 2);
    c.interleaved = coin(0.5);
  }
  c.alibi = coin(0.2);
  Options& o = c.options;
  o.backend = Backend::cpu_flash;
  o.causal = coin(0.4);
  if (coin(0.2)) o.window_left = uni(0, 200);
  if (coin(0.15)) o.softcap = 10.f;
  if (coin(0.15)) o.chunk_size = uni(1, 300);
  o.num_splits = std::vector<int>{0, 0, 1, 2, 3, 7}[uni(0, 5)];
  return c;
}

struct DecodeTensors {
  HostTensor q, k_cache, v_cache, page_table, cache_seqlens, k_new, v_new, cos, sin, out, lse, slopes;

  DecodeTensors(const DecodeCase& c, std::mt19937_64& rng) {
    const DType t = c.dtype;
    q = HostTensor(t, {c.batch, c.seqlen_q, c.heads_q, c.hdim});
    if (c.page_size > 0) {
      const int per_seq = (c.capacity + c.page_size - 1) / c.page_size;
      const int pages = c.batch * per_seq + 2;
      k_cache = HostTensor(t, {pages, c.page_size, c.heads_kv, c.hdim});
      v_cache = HostTensor(t, {pages, c.page_size, c.heads_kv, c.hdim_v});
      std::vector<std::int32_t> perm(pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      page_table = HostTensor(DType::i32, {c.batch, per_seq});
      for (int i = 0; i < c.batch * per_seq; ++i) page_table.set(i, perm[i]);
    } else {
      k_cache = HostTensor(t, {c.batch, c.capacity, c.heads_kv, c.hdim});
      v_cache = HostTensor(t, {c.batch, c.capacity, c.heads_kv, c.hdim_v});
    }
    cache_seqlens = int_tensor(std::vector<std::int32_t>(c.lens.begin(), c.lens.end()));
    if (c.seqlen_new > 0) {
      k_new = HostTensor(t, {c.batch, c.seqlen_new, c.heads_kv, c.hdim});
      v_new = HostTensor(t, {c.batch, c.seqlen_new, c.heads_kv, c.hdim_v});
      k_new.fill_normal(rng);
      v_new.fill_normal(rng);
    }
    if (c.rotary_dim > 0) {
      // Query rows rotate at cache_seqlens[b] + i, which may pass the capacity when there are more
      // query rows than appended ones.
      const int positions =
          (c.page_size > 0 ? static_cast<int>(page_table.shape()[1]) * c.page_size : c.capacity) + c.seqlen_q;
      cos = HostTensor(t, {positions, c.rotary_dim / 2});
      sin = HostTensor(t, {positions, c.rotary_dim / 2});
      for (int pos = 0; pos < positions; ++pos)
        for (int f = 0; f < c.rotary_dim / 2; ++f) {
          const double theta = pos * std::pow(10000.0, -2.0 * f / c.rotary_dim);
          cos.set(pos * (c.rotary_dim / 2) + f, std::cos(theta));
          sin.set(pos * (c.rotary_dim / 2) + f, std::sin(theta));
        }
    }
    if (c.alibi) {
      slopes = HostTensor(DType::f32, {c.heads_q});
      for (int h = 0; h < c.heads_q; ++h) slopes.set(h, 0.3 / (h + 1));
    }
    out = HostTensor(t, {c.batch, c.seqlen_q, c.heads_q, c.hdim_v});
    lse = HostTensor(DType::f32, {c.batch, c.heads_q, c.seqlen_q});
    q.fill_normal(rng);
    k_cache.fill_normal(rng);
    v_cache.fill_normal(rng);
  }

  DecodeArgs args(const DecodeCase& c) const {
    DecodeArgs a;
    a.q = q.view();
    a.k_cache = k_cache.view();
    a.v_cache = v_cache.view();
    if (c.page_size > 0) a.page_table = page_table.view();
    a.cache_seqlens = cache_seqlens.view();
    if (c.seqlen_new > 0) {
      a.k_new = k_new.view();
      a.v_new = v_new.view();
    }
    if (c.rotary_dim > 0) {
      a.rotary_cos = cos.view();
      a.rotary_sin = sin.view();
      a.rotary_interleaved = c.interleaved;
    }
    if (c.alibi) a.alibi_slopes = slopes.view();
    a.out = out.view();
    a.lse = lse.view();
    a.options = c.options;
    return a;
  }
};

struct DecodeResult {
  std::vector<double> out, lse, k_cache, v_cache;
};

// Runs one backend on fresh copies of the caches (decode appends into them).
DecodeResult run(const DecodeCase& c, const DecodeTensors& t0, Backend backend, bool input_dtype = false) {
  DecodeTensors t = t0;
  t.out.poison();
  t.lse.poison();
  DecodeArgs a = t.args(c);
  a.options.backend = backend;
  if (input_dtype) {
    cpu::reference_decode(validate(a), a, cpu::RefPrecision::input_dtype);
  } else {
    decode(a);
  }
  return {t.out.to_f64(), t.lse.to_f64(), t.k_cache.to_f64(), t.v_cache.to_f64()};
}

TEST(FlashDecode, RandomSweepMatchesReference) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 200; ++it) {
    const DecodeCase c = random_decode_case(rng);
    const DecodeTensors t(c, rng);
    const std::string ctx = "seed " + std::to_string(seed) + " case " + std::to_string(it) + ": " + c.str();
    const DecodeResult got = run(c, t, Backend::cpu_flash);
    const DecodeResult ref = run(c, t, Backend::cpu_reference);
    DecodeResult base;
    bool have_base = false;
    auto baseline = [&]() -> const DecodeResult& {
      if (!have_base) base = run(c, t, Backend::cpu_reference, true);
      have_base = true;
      return base;
    };
    EXPECT_TRUE(close_to_oracle(c.dtype, got.out, ref.out, [&] { return baseline().out; })) << "out, " << ctx;
    EXPECT_TRUE(close_to_oracle(c.dtype, got.lse, ref.lse, [&] { return baseline().lse; })) << "lse, " << ctx;
    // The append: values bitwise (a rotated key may differ by the last rounding).
    EXPECT_EQ(got.v_cache, ref.v_cache) << ctx;
    if (c.rotary_dim == 0) {
      EXPECT_EQ(got.k_cache, ref.k_cache) << ctx;
    } else {
      EXPECT_LE(max_abs_error(got.k_cache, ref.k_cache), 8 * unit_roundoff(c.dtype) * max_abs(ref.k_cache)) << ctx;
    }
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace tileattn::test
