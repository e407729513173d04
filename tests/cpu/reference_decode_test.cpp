// The reference decode equals the reference forward on the gathered cache: the cache's first
// cache_seqlens[b] rows followed by the appended ones, query rows bottom-right aligned to them.
// Contiguous and paged caches (shuffled pages, sizes 1, 5, 16); cache slots past the live rows hold
// NaN, so reading one shows up in the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <vector>

#include "support/host_tensor.hpp"
#include "support/seeded_test.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

struct Decode {
  int batch, sq, hq, hkv, d, dv, cap, nnew;
  std::vector<std::int32_t> lens;
  HostTensor q, kl, vl, knew, vnew;  // kl, vl: the logical cache [batch, cap, hkv, dim]
  std::optional<HostTensor> slopes;

  Decode(std::mt19937_64& rng, std::vector<std::int32_t> lens_, int sq_, int nnew_, int cap_)
      : batch(static_cast<int>(lens_.size())), sq(sq_), hq(4), hkv(2), d(8), dv(16), cap(cap_), nnew(nnew_),
        lens(std::move(lens_)), q(DType::f32, {batch, sq, hq, d}), kl(DType::f32, {batch, cap, hkv, d}),
        vl(DType::f32, {batch, cap, hkv, dv}), knew(DType::f32, {batch, nnew, hkv, d}),
        vnew(DType::f32, {batch, nnew, hkv, dv}) {
    for (HostTensor* t : {&q, &kl, &vl, &knew, &vnew}) t->fill_normal(rng);
  }

  std::int64_t total_k() const {
    std::int64_t n = 0;
    for (int b = 0; b < batch; ++b) n += lens[b] + nnew;
    return n;
  }

  // Logical row (b, pos) of the grown cache: the old cache below lens[b], the appended rows above.
  double key(int b, int pos, int g, int c) const {
    return pos < lens[b] ? kl.get(((std::int64_t(b) * cap + pos) * hkv + g) * d + c)
                         : knew.get(((std::int64_t(b) * nnew + pos - lens[b]) * hkv + g) * d + c);
  }
  double value(int b, int pos, int g, int c) const {
    return pos < lens[b] ? vl.get(((std::int64_t(b) * cap + pos) * hkv + g) * dv + c)
                         : vnew.get(((std::int64_t(b) * nnew + pos - lens[b]) * hkv + g) * dv + c);
  }

  // The forward over packed sequences: the definition decode must match. out [b, sq, hq, dv], lse [b, hq, sq].
  void expected(const Options& o, std::vector<double>& out, std::vector<double>& lse) const {
    const std::int64_t tk = total_k();
    HostTensor pq(DType::f32, {std::int64_t(batch) * sq, hq, d}), pk(DType::f32, {tk, hkv, d}),
        pv(DType::f32, {tk, hkv, dv}), po(DType::f32, {std::int64_t(batch) * sq, hq, dv}),
        pl(DType::f32, {hq, std::int64_t(batch) * sq});
    pq.from_f64(q.to_f64());  // [b, sq, hq, d] is already packed row order
    std::vector<std::int32_t> cq{0}, ck{0};
    std::int64_t row = 0;
    for (int b = 0; b < batch; ++b) {
      for (int pos = 0; pos < lens[b] + nnew; ++pos, ++row)
        for (int g = 0; g < hkv; ++g) {
          for (int c = 0; c < d; ++c) pk.set((row * hkv + g) * d + c, key(b, pos, g, c));
          for (int c = 0; c < dv; ++c) pv.set((row * hkv + g) * dv + c, value(b, pos, g, c));
        }
      cq.push_back(cq.back() + sq);
      ck.push_back(static_cast<std::int32_t>(row));
    }
    HostTensor cuq = test::int_tensor(cq), cuk = test::int_tensor(ck);
    ForwardArgs a;
    a.q = pq.view();
    a.k = pk.view();
    a.v = pv.view();
    a.out = po.view();
    a.lse = pl.view();
    a.cu_seqlens_q = cuq.view();
    a.cu_seqlens_k = cuk.view();
    a.max_seqlen_q = sq;
    a.max_seqlen_k = cap;
    if (slopes) a.alibi_slopes = slopes->view();
    a.options = o;
    a.options.backend = Backend::cpu_reference;
    forward(a);
    out = po.to_f64();
    lse.assign(std::size_t(batch) * hq * sq, 0);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < hq; ++h)
        for (int i = 0; i < sq; ++i) lse[(b * hq + h) * sq + i] = pl.get(h * std::int64_t(batch) * sq + b * sq + i);
  }

  // Runs decode on the given cache views and compares with the forward.
  void check(const Options& o, DecodeArgs a) const {
    std::vector<double> want_o, want_l;
    expected(o, want_o, want_l);
    HostTensor out(DType::f32, {batch, sq, hq, dv}), lse(DType::f32, {batch, hq, sq});
    out.poison();
    lse.poison();
    HostTensor seqlens = test::int_tensor(lens);
    a.q = q.view();
    a.out = out.view();
    a.lse = lse.view();
    if (!a.cache_seqlens.present()) a.cache_seqlens = seqlens.view();
    if (nnew > 0) {
      a.k_new = knew.view();
      a.v_new = vnew.view();
    }
    if (slopes) a.alibi_slopes = slopes->view();
    a.options = o;
    a.options.backend = Backend::cpu_reference;
    decode(a);
    const auto got_o = out.to_f64(), got_l = lse.to_f64();
    EXPECT_LE(test::max_abs_error(got_o, want_o), 1e-6);
    EXPECT_LE(test::max_abs_error(got_l, want_l), 1e-5);
  }
};

// A physical cache: contiguous [batch, cap, ...] or paged with shuffled pages; NaN in every slot
// the live rows do not occupy.
struct Cache {
  HostTensor k, v, table;
  int page = 0;

  Cache(const Decode& t, int page_size, std::mt19937_64& rng, bool append_room = true) : page(page_size) {
    const int grown = append_room ? t.nnew : 0;
    if (page == 0) {
      k = HostTensor(DType::f32, {t.batch, t.cap, t.hkv, t.d});
      v = HostTensor(DType::f32, {t.batch, t.cap, t.hkv, t.dv});
    } else {
      const int per_seq = (t.cap + page - 1) / page, pages = t.batch * per_seq + 3;
      k = HostTensor(DType::f32, {pages, page, t.hkv, t.d});
      v = HostTensor(DType::f32, {pages, page, t.hkv, t.dv});
      std::vector<std::int32_t> perm(pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      table = HostTensor(DType::i32, {t.batch, per_seq});
      for (int b = 0; b < t.batch; ++b)
        for (int i = 0; i < per_seq; ++i) {
          // Entries past the live pages are never read: make them invalid page numbers.
          const bool live = i * page < t.lens[b] + grown;
          table.set(b * per_seq + i, live ? perm[b * per_seq + i] : -1);
        }
    }
    k.poison();
    v.poison();
    for (int b = 0; b < t.batch; ++b)
      for (int pos = 0; pos < t.lens[b]; ++pos)
        for (int g = 0; g < t.hkv; ++g) {
          for (int c = 0; c < t.d; ++c) k.set(slot(t, b, pos, g) * t.d + c, t.key(b, pos, g, c));
          for (int c = 0; c < t.dv; ++c) v.set(slot(t, b, pos, g) * t.dv + c, t.value(b, pos, g, c));
        }
  }

  // Logical row index (in units of one head's vector) of cache row pos of sequence b, KV head g.
  std::int64_t slot(const Decode& t, int b, int pos, int g) const {
    if (page == 0) return (std::int64_t(b) * t.cap + pos) * t.hkv + g;
    const std::int64_t pg = static_cast<std::int64_t>(table.get(b * table.shape()[1] + pos / page));
    return (pg * page + pos % page) * t.hkv + g;
  }

  DecodeArgs args() const {
    DecodeArgs a;
    a.k_cache = k.view();
    a.v_cache = v.view();
    if (page > 0) a.page_table = table.view();
    return a;
  }

  // After decode: the appended rows sit at lens[b].., everything else is as it was.
  void expect_appended(const Decode& t) const {
    std::vector<bool> live(k.numel() / t.d, false);
    for (int b = 0; b < t.batch; ++b)
      for (int pos = 0; pos < t.lens[b] + t.nnew; ++pos)
        for (int g = 0; g < t.hkv; ++g) {
          const std::int64_t s = slot(t, b, pos, g);
          live[s] = true;
          for (int c = 0; c < t.d; ++c) ASSERT_EQ(k.get(s * t.d + c), t.key(b, pos, g, c)) << "b " << b << " pos " << pos;
          for (int c = 0; c < t.dv; ++c) ASSERT_EQ(v.get(s * t.dv + c), t.value(b, pos, g, c)) << "b " << b << " pos " << pos;
        }
    for (std::int64_t s = 0; s < static_cast<std::int64_t>(live.size()); ++s)
      if (!live[s]) ASSERT_TRUE(std::isnan(k.get(s * t.d)) && std::isnan(v.get(s * t.dv))) << "slot " << s << " written";
  }
};

std::vector<Options> option_sets() {
  std::vector<Options> sets(4);
  sets[0].causal = true;
  sets[1].softcap = 2.f;  // with ALiBi (set by the caller), not causal
  sets[2].causal = true;
  sets[2].window_left = 3;
  sets[3].causal = true;
  sets[3].align = MaskAlign::top_left;
  return sets;
}

class ReferenceDecode : public test::SeededTest {
 protected:
  void run_all(int page_size) {
    for (int nnew : {0, 2}) {
      for (const Options& o : option_sets()) {
        Decode t(rng_, {0, 1, 7, 13}, 3, nnew, 17);
        if (o.softcap > 0) {
          t.slopes = HostTensor(DType::f32, {t.hq});
          t.slopes->fill_normal(rng_, 0.3);
        }
        SCOPED_TRACE(::testing::Message() << "page_size " << page_size << " appended " << nnew
                                          << " causal " << o.causal << " window " << o.window_left);
        Cache c(t, page_size, rng_);
        t.check(o, c.args());
        c.expect_appended(t);
      }
    }
  }
};

TEST_F(ReferenceDecode, ContiguousCacheMatchesForward) { run_all(0); }
TEST_F(ReferenceDecode, PagedCacheOfPageSize1) { run_all(1); }
TEST_F(ReferenceDecode, PagedCacheOfPageSize5) { run_all(5); }
TEST_F(ReferenceDecode, PagedCacheOfPageSize16) { run_all(16); }

// Without cache_seqlens a contiguous cache is full: every one of its rows is live.
TEST_F(ReferenceDecode, FullCacheWithoutSeqlens) {
  Decode t(rng_, {9, 9}, 2, 0, 9);
  Cache c(t, 0, rng_);
  DecodeArgs a = c.args();
  HostTensor out(DType::f32, {2, 2, t.hq, t.dv}), lse(DType::f32, {2, t.hq, 2});
  out.poison();
  lse.poison();
  a.q = t.q.view();
  a.out = out.view();
  a.lse = lse.view();
  a.options.causal = true;
  a.options.backend = Backend::cpu_reference;
  decode(a);
  std::vector<double> want_o, want_l;
  t.expected(a.options, want_o, want_l);
  EXPECT_LE(test::max_abs_error(out.to_f64(), want_o), 1e-6);
  EXPECT_LE(test::max_abs_error(lse.to_f64(), want_l), 1e-5);
}

// An empty cache with nothing appended: no row sees a key.
TEST_F(ReferenceDecode, EmptyCacheGivesZeroAndMinusInf) {
  Decode t(rng_, {0, 0}, 2, 0, 4);
  Cache c(t, 0, rng_);
  DecodeArgs a = c.args();
  HostTensor out(DType::f32, {2, 2, t.hq, t.dv}), lse(DType::f32, {2, t.hq, 2});
  out.poison();
  lse.poison();
  HostTensor seqlens = test::int_tensor(t.lens);
  a.q = t.q.view();
  a.out = out.view();
  a.lse = lse.view();
  a.cache_seqlens = seqlens.view();
  a.options.backend = Backend::cpu_reference;
  decode(a);
  for (double x : out.to_f64()) EXPECT_EQ(x, 0.0);
  for (double x : lse.to_f64()) EXPECT_EQ(x, -INFINITY);
}

}  // namespace
}  // namespace tileattn
