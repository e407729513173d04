// Every way validation rejects a decode call: q/cache/out tensors, page table, cache lengths, the
// appended rows, options. Neither the outputs nor the cache are touched.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "support/expect_rejected.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;
constexpr Device kCuda{DeviceType::cuda, 0};

struct Case {
  const char* what;
  std::function<void(DecodeArgs&)> mutate;
  std::vector<std::string> fragments;
};

// q [3, 2, 4, 8]; contiguous cache [3, 10, 2, 8|16] or paged [7, 4, 2, 8|16] with a [3, 3] table;
// cache_seqlens {0, 4, 8}; k_new/v_new [3, 2, 2, 8|16].
struct Fixture {
  HostTensor q{DType::f32, {3, 2, 4, 8}}, out{DType::f32, {3, 2, 4, 16}}, lse{DType::f32, {3, 4, 2}};
  HostTensor kc{DType::f32, {3, 10, 2, 8}}, vc{DType::f32, {3, 10, 2, 16}};
  HostTensor kp{DType::f32, {7, 4, 2, 8}}, vp{DType::f32, {7, 4, 2, 16}};
  HostTensor table{DType::i32, {3, 3}}, lens = test::int_tensor({0, 4, 8});
  HostTensor knew{DType::f32, {3, 2, 2, 8}}, vnew{DType::f32, {3, 2, 2, 16}};
  HostTensor lens2 = test::int_tensor({0, 4}), lens_neg = test::int_tensor({0, -1, 8}),
             lens_full = test::int_tensor({0, 4, 9}), lens_paged_full = test::int_tensor({0, 4, 11}),
             lens_f32{DType::f32, {3}}, lens_2d{DType::i32, {3, 1}}, table_f32{DType::f32, {3, 3}},
             table_1d{DType::i32, {9}}, slopes{DType::f32, {3}};
  Fixture() {
    for (HostTensor* t : {&q, &kc, &vc, &kp, &vp, &knew, &vnew}) t->fill(0.5);
    // Live pages: sequence 0 one (0 + 2 rows), 1 two (4 + 2), 2 three (8 + 2); the rest are never read.
    const int pages[9] = {6, -3, -3, 2, 5, -3, 4, 0, 3};
    for (int i = 0; i < 9; ++i) table.set(i, pages[i]);
  }
  DecodeArgs contiguous() const {
    DecodeArgs a;
    a.q = q.view();
    a.k_cache = kc.view();
    a.v_cache = vc.view();
    a.cache_seqlens = lens.view();
    a.k_new = knew.view();
    a.v_new = vnew.view();
    a.out = out.view();
    a.lse = lse.view();
    a.options.backend = Backend::cpu_reference;
    return a;
  }
  DecodeArgs paged() const {
    DecodeArgs a = contiguous();
    a.k_cache = kp.view();
    a.v_cache = vp.view();
    a.page_table = table.view();
    return a;
  }
  void run(bool paged_cache, const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      out.poison();
      lse.poison();
      DecodeArgs a = paged_cache ? paged() : contiguous();
      c.mutate(a);
      auto fragments = c.fragments;
      fragments.push_back("tileattn::decode");
      test::expect_rejected([&] { decode(a); }, fragments, {&out, &lse, &kc, &vc, &kp, &vp});
      test::expect_rejected([&] { (void)workspace_size(a); }, fragments, {&out, &lse, &kc, &vc, &kp, &vp});
    }
  }
};

TEST(ValidateDecode, ValidCallsPass) {
  Fixture t;
  decode(t.contiguous());
  decode(t.paged());
}

TEST(ValidateDecode, Tensors) {
  Fixture t;
  t.run(false, {
      {"q absent", [](DecodeArgs& a) { a.q = {}; }, {"q is required but absent"}},
      {"k_cache rank", [](DecodeArgs& a) { a.k_cache.ndim = 3; }, {"k_cache must have 4 dimensions, got 3"}},
      {"v_cache negative", [](DecodeArgs& a) { a.v_cache.shape[2] = -1; }, {"v_cache.shape[2] = -1 is negative"}},
      {"out null", [](DecodeArgs& a) { a.out.data = nullptr; }, {"out has 384 elements but a null data pointer"}},
      {"q stride", [](DecodeArgs& a) { a.q.stride[3] = 3; }, {"q.stride[3] = 3"}},
      {"q dtype", [](DecodeArgs& a) { a.q.dtype = DType::i32; }, {"q has dtype i32, expected f32, f16 or bf16"}},
      {"k_cache dtype", [](DecodeArgs& a) { a.k_cache.dtype = DType::f16; }, {"k_cache has dtype f16, expected f32"}},
      {"v_cache dtype", [](DecodeArgs& a) { a.v_cache.dtype = DType::bf16; }, {"v_cache has dtype bf16, expected f32"}},
      {"out dtype", [](DecodeArgs& a) { a.out.dtype = DType::f16; }, {"out has dtype f16, expected f32"}},
      {"k_cache device", [](DecodeArgs& a) { a.k_cache.device = kCuda; }, {"k_cache is on cuda:0 but q is on cpu:0"}},
      {"v_cache device", [](DecodeArgs& a) { a.v_cache.device = kCuda; }, {"v_cache is on cuda:0"}},
      {"out device", [](DecodeArgs& a) { a.out.device = kCuda; }, {"out is on cuda:0"}},
      {"cuda backend", [](DecodeArgs& a) { a.options.backend = Backend::cuda; },
       {"options.backend = cuda but the tensors are on the cpu"}},
      {"q head dim", [](DecodeArgs& a) { a.q.shape[3] = 4; }, {"q.shape[3] (head_dim_qk) = 4"}},
      {"v head dim", [](DecodeArgs& a) { a.v_cache.shape[3] = 300; }, {"v_cache.shape[3] (head_dim_v) = 300"}},
      {"q heads", [](DecodeArgs& a) { a.q.shape[2] = 0; }, {"q has 0 heads"}},
      {"kv heads", [](DecodeArgs& a) { a.k_cache.shape[2] = 3; }, {"k_cache heads (heads_kv) = 3", "heads_q) = 4"}},
      {"k_cache dim", [](DecodeArgs& a) { a.k_cache.shape[3] = 16; },
       {"k_cache has shape [3, 10, 2, 16], expected [3, 10, 2, 8]"}},
      {"v_cache capacity", [](DecodeArgs& a) { a.v_cache.shape[1] = 9; },
       {"v_cache has shape [3, 9, 2, 16], expected [3, 10, 2, 16]"}},
      {"out shape", [](DecodeArgs& a) { a.out.shape[1] = 1; }, {"out has shape [3, 1, 4, 16], expected [3, 2, 4, 16]"}},
      {"lse dtype", [](DecodeArgs& a) { a.lse.dtype = DType::f16; }, {"lse has dtype f16, expected f32"}},
      {"lse device", [](DecodeArgs& a) { a.lse.device = kCuda; }, {"lse is on cuda:0"}},
      {"lse shape", [](DecodeArgs& a) { a.lse.shape[2] = 1; }, {"lse has shape [3, 4, 1], expected [3, 4, 2]"}},
      {"lse null", [](DecodeArgs& a) { a.lse.data = nullptr; }, {"lse has", "elements but a null data pointer"}},
      {"batch", [](DecodeArgs& a) { a.k_cache.shape[0] = 2; a.v_cache.shape[0] = 2; },
       {"k_cache.shape[0] = 2 must equal q.shape[0] (batch) = 3 for a contiguous cache"}},
  });
}

TEST(ValidateDecode, Rotary) {
  Fixture t;
  // Contiguous capacity 10, q has 2 rows: a causal call needs 10 + 1 positions, others 10.
  HostTensor cos10{DType::f32, {10, 4}}, sin10{DType::f32, {10, 4}}, cos11{DType::f32, {11, 4}}, sin11{DType::f32, {11, 4}};
  HostTensor cos_wide{DType::f32, {11, 5}}, sin_wide{DType::f32, {11, 5}}, sin_f16{DType::f16, {11, 4}}, cos_1d{DType::f32, {44}};
  for (HostTensor* x : {&cos10, &sin10, &cos11, &sin11, &cos_wide, &sin_wide}) x->fill(0.5);
  auto with = [](const HostTensor& c, const HostTensor& s) {
    return [&c, &s](DecodeArgs& a) {
      a.rotary_cos = c.view();
      a.rotary_sin = s.view();
    };
  };
  {
    DecodeArgs a = t.contiguous();
    with(cos10, sin10)(a);
    decode(a);  // not causal: 10 positions suffice
  }
  t.run(false, {
      {"sin absent", [&](DecodeArgs& a) { a.rotary_cos = cos11.view(); }, {"rotary_cos and rotary_sin must be given together (rotary_sin is absent)"}},
      {"cos rank", [&](DecodeArgs& a) { with(cos11, sin11)(a); a.rotary_cos = cos_1d.view(); }, {"rotary_cos must have 2 dimensions, got 1"}},
      {"sin dtype", [&](DecodeArgs& a) { with(cos11, sin_f16)(a); }, {"rotary_sin has dtype f16, expected f32"}},
      {"sin shape", [&](DecodeArgs& a) { with(cos11, sin10)(a); }, {"rotary_sin has shape [10, 4], expected [11, 4]"}},
      {"rotary dim", [&](DecodeArgs& a) { with(cos_wide, sin_wide)(a); },
       {"rotary_cos.shape[1] = 5 gives rotary_dim = 10, expected 2 <= rotary_dim <= head_dim_qk = 8"}},
      {"causal positions", [&](DecodeArgs& a) { with(cos10, sin10)(a); a.options.causal = true; },
       {"rotary_cos.shape[0] = 10 positions cannot cover the cache capacity of 10 plus the query rows beyond the first (11 needed)"}},
  });
}

TEST(ValidateDecode, CacheLengthsAndAppend) {
  Fixture t;
  t.run(false, {
      {"v_new absent", [](DecodeArgs& a) { a.v_new = {}; }, {"k_new and v_new must be given together (v_new is absent)"}},
      {"k_new absent", [](DecodeArgs& a) { a.k_new = {}; }, {"(k_new is absent)"}},
      {"k_new rank", [](DecodeArgs& a) { a.k_new.ndim = 3; }, {"k_new must have 4 dimensions, got 3"}},
      {"v_new dtype", [](DecodeArgs& a) { a.v_new.dtype = DType::f16; }, {"v_new has dtype f16, expected f32"}},
      {"k_new device", [](DecodeArgs& a) { a.k_new.device = kCuda; }, {"k_new is on cuda:0"}},
      {"k_new batch", [](DecodeArgs& a) { a.k_new.shape[0] = 2; }, {"k_new has shape [2, 2, 2, 8], expected [3, 2, 2, 8]"}},
      {"v_new rows", [](DecodeArgs& a) { a.v_new.shape[1] = 1; }, {"v_new has shape [3, 1, 2, 16], expected [3, 2, 2, 16]"}},
      {"append without lengths", [](DecodeArgs& a) { a.cache_seqlens = {}; },
       {"cache_seqlens is required with k_new/v_new"}},
      {"lengths rank", [&](DecodeArgs& a) { a.cache_seqlens = t.lens_2d.view(); }, {"cache_seqlens must have 1 dimensions, got 2"}},
      {"lengths dtype", [&](DecodeArgs& a) { a.cache_seqlens = t.lens_f32.view(); }, {"cache_seqlens has dtype f32, expected i32"}},
      {"lengths device", [](DecodeArgs& a) { a.cache_seqlens.device = kCuda; }, {"cache_seqlens is on cuda:0"}},
      {"lengths shape", [&](DecodeArgs& a) { a.cache_seqlens = t.lens2.view(); }, {"cache_seqlens has shape [2], expected [3]"}},
      {"negative length", [&](DecodeArgs& a) { a.cache_seqlens = t.lens_neg.view(); }, {"cache_seqlens[1] = -1 is negative"}},
      {"over capacity", [&](DecodeArgs& a) { a.cache_seqlens = t.lens_full.view(); },
       {"cache_seqlens[2] = 9 plus 2 appended rows exceeds the cache capacity of 10 (k_cache.shape[1])"}},
      {"dropout", [](DecodeArgs& a) { a.options.dropout_p = 0.1f; }, {"options.dropout_p = 0.1, decode does not support dropout"}},
      {"alibi diagonal", [](DecodeArgs& a) { a.options.alibi_diagonal = 3; },
       {"options.alibi_diagonal = 3, decode measures ALiBi from each sequence's cache end"}},
      {"window", [](DecodeArgs& a) { a.options.window_left = -2; }, {"options.window_left = -2"}},
      {"scale", [](DecodeArgs& a) { a.options.scale = std::numeric_limits<float>::quiet_NaN(); }, {"options.scale = nan"}},
      {"alibi", [&](DecodeArgs& a) { a.alibi_slopes = t.slopes.view(); }, {"alibi_slopes has shape [3], expected [4]"}},
  });
}

TEST(ValidateDecode, PageTable) {
  Fixture t;
  t.run(true, {
      {"rank", [&](DecodeArgs& a) { a.page_table = t.table_1d.view(); }, {"page_table must have 2 dimensions, got 1"}},
      {"dtype", [&](DecodeArgs& a) { a.page_table = t.table_f32.view(); }, {"page_table has dtype f32, expected i32"}},
      {"device", [](DecodeArgs& a) { a.page_table.device = kCuda; }, {"page_table is on cuda:0"}},
      {"rows", [](DecodeArgs& a) { a.page_table.shape[0] = 2; }, {"page_table has shape [2, 3], expected 3 rows (batch)"}},
      {"page size", [](DecodeArgs& a) { a.k_cache.shape[1] = 0; a.v_cache.shape[1] = 0; },
       {"k_cache.shape[1] (page_size) = 0, expected >= 1"}},
      {"lengths absent", [](DecodeArgs& a) { a.cache_seqlens = {}; a.k_new = {}; a.v_new = {}; },
       {"cache_seqlens is required with a page_table"}},
      {"capacity overflow", [](DecodeArgs& a) { a.page_table.shape[1] = 1LL << 30; },
       {"cache capacity (page_table.shape[1] * page_size) = 4294967296 exceeds the 2^30 - 1 rows"}},
      {"over capacity", [&](DecodeArgs& a) { a.cache_seqlens = t.lens_paged_full.view(); },
       {"cache_seqlens[2] = 11 plus 2 appended rows exceeds the cache capacity of 12 (page_table.shape[1] * page_size)"}},
  });
  // Pages in use must exist: sequence 1 (4 + 2 rows) uses entries [1, 0] and [1, 1].
  for (int bad : {7, -1}) {
    t.table.set(4, bad);
    const std::string frag = "page_table[1, 1] = " + std::to_string(bad) + " is outside [0, 7) (k_cache.shape[0] pages)";
    t.run(true, {{"page out of range", [](DecodeArgs&) {}, {frag}}});
  }
  t.table.set(4, 5);
  // Sequence 2 appends rows 8-9 into its page at [2, 2]; naming that page in sequence 1 would race.
  t.table.set(3, 3);
  t.run(true, {{"appended page shared", [](DecodeArgs&) {},
                {"page_table[1, 0] and page_table[2, 2] both name page 3, which the append writes"}}});
  t.table.set(3, 2);
}

TEST(ValidateDecode, SharedPagesThatNobodyWritesPass) {
  Fixture t;
  // A shared prefix: sequences 1 and 2 read page 5 (entry [1, 1] and [2, 0]) with no append into it.
  t.table.set(6, 5);
  DecodeArgs a = t.paged();
  a.k_new = TensorView{};
  a.v_new = TensorView{};
  decode(a);
}

}  // namespace
}  // namespace tileattn
