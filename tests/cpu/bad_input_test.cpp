// The bad-input suite: each argument of forward, backward, decode (contiguous, paged, append) and
// combine broken in every generic way, each written buffer aliased with every other buffer of its
// call, and each option out of range. Every case must be rejected with an error that names the
// argument, leaving every byte of every buffer as it was; workspace_size rejects the same calls.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "bad_input_suite.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::BadCase;
using test::Field;
using test::HostTensor;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Option values out of range, for any argument struct with options (and alibi_slopes where set).
template <class Args>
void add_option_cases(std::vector<BadCase>& out, const std::string& fn, const std::function<Args()>& make,
                      const std::function<void(const Args&)>& call, bool attends) {
  auto add = [&](const std::string& what, const char* name, std::function<void(Args&)> mutate) {
    out.push_back({fn + " " + what, [make, call, mutate] {
                     Args a = make();
                     mutate(a);
                     call(a);
                   },
                   {name}});
  };
  add("backend 7", "options.backend", [](Args& a) { a.options.backend = static_cast<Backend>(7); });
  add("backend 200", "options.backend", [](Args& a) { a.options.backend = static_cast<Backend>(200); });
  add("backend cuda on cpu tensors", "options.backend", [](Args& a) { a.options.backend = Backend::cuda; });
  add("workspace null with bytes", "options.workspace", [](Args& a) { a.options.workspace_bytes = 100; });
  add("workspace wraps", "options.workspace_bytes", [](Args& a) {
    a.options.workspace = reinterpret_cast<void*>(std::numeric_limits<std::uintptr_t>::max() - 15);
    a.options.workspace_bytes = 64;
  });
  add("workspace 2^63 bytes", "options.workspace_bytes", [](Args& a) {
    static char byte;
    a.options.workspace = &byte;
    a.options.workspace_bytes = std::size_t{1} << 63;
  });
  if (!attends) return;
  add("align 9", "options.align", [](Args& a) { a.options.align = static_cast<MaskAlign>(9); });
  for (float s : {kNaN, kInf, -kInf, 3e38f, -3e38f, 2.4e38f})
    add("scale " + std::to_string(s), "options.scale", [s](Args& a) { a.options.scale = s; });
  for (float c : {-1.f, kNaN, kInf, -kInf, 1e-40f, 3e38f})
    add("softcap " + std::to_string(c), "options.softcap", [c](Args& a) { a.options.softcap = c; });
  add("window_left -2", "options.window_left", [](Args& a) { a.options.window_left = -2; });
  add("window_left INT_MIN", "options.window_left", [](Args& a) { a.options.window_left = std::numeric_limits<int>::min(); });
  add("window_right -7", "options.window_right", [](Args& a) { a.options.window_right = -7; });
  add("causal with window_right 3", "options.window_right", [](Args& a) {
    a.options.causal = true;
    a.options.window_right = 3;
  });
  add("num_splits -1", "options.num_splits", [](Args& a) { a.options.num_splits = -1; });
  add("prefix_len -1", "options.prefix_len", [](Args& a) {
    a.options.causal = true;
    a.options.prefix_len = -1;
  });
  add("prefix_len without causal", "options.prefix_len", [](Args& a) {
    a.options.causal = false;
    a.options.window_right = -1;
    a.options.prefix_len = 4;
  });
  add("prefix_len with window_left", "options.window_left", [](Args& a) {
    a.options.causal = true;
    a.options.window_left = 0;
    a.options.prefix_len = 4;
  });
  add("prefix_len with chunk_size", "options.chunk_size", [](Args& a) {
    a.options.causal = true;
    a.options.chunk_size = 2;
    a.options.prefix_len = 4;
  });
  for (float p : {-0.5f, 1.f, 2.f, kNaN, kInf})
    add("dropout_p " + std::to_string(p), "options.dropout_p", [p](Args& a) { a.options.dropout_p = p; });
}

// ALiBi slopes whose value would overflow the kernels' fp32 scores.
template <class Args>
void add_slope_cases(std::vector<BadCase>& out, const std::string& fn, const std::function<Args()>& make,
                     const std::function<void(const Args&)>& call, HostTensor& slopes) {
  for (float s : {kNaN, kInf, -kInf, 1e38f, -1e38f})
    out.push_back({fn + " alibi slope " + std::to_string(s), [make, call, &slopes, s] {
                     HostTensor bad(DType::f32, slopes.shape());
                     bad.fill(0.25);
                     bad.set(1, s);
                     Args a = make();
                     a.alibi_slopes = bad.view();
                     call(a);
                   },
                   {"alibi_slopes"}});
}

void expect_counts(const char* entry, const test::SuiteCounts& n, int at_least) {
  std::printf("[bad input] %-24s tried %d, rejected %d, accepted %d, other exceptions %d, unnamed %d, bytes changed %d\n",
              entry, n.tried, n.rejected, n.accepted, n.other_exception, n.unnamed, n.bytes_changed);
  EXPECT_GE(n.tried, at_least);
  EXPECT_EQ(n.rejected, n.tried);
  EXPECT_EQ(n.bytes_changed, 0);
}

// q [2, 3, 4, 8], k [2, 5, 2, 8], v [2, 5, 2, 16], out [2, 3, 4, 16], lse [2, 4, 3], slopes [4];
// for the backward dout, dq, dk, dv too.
struct Batched {
  HostTensor q{DType::f32, {2, 3, 4, 8}}, k{DType::f32, {2, 5, 2, 8}}, v{DType::f32, {2, 5, 2, 16}};
  HostTensor out{DType::f32, {2, 3, 4, 16}}, lse{DType::f32, {2, 4, 3}}, slopes{DType::f32, {4}};
  HostTensor dout{DType::f32, {2, 3, 4, 16}}, dq{DType::f32, {2, 3, 4, 8}}, dk{DType::f32, {2, 5, 2, 8}},
      dv{DType::f32, {2, 5, 2, 16}};
  std::vector<unsigned char> workspace = std::vector<unsigned char>(4096, 0x5a);
  Batched() {
    std::mt19937_64 rng(7);
    for (HostTensor* t : {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}) t->fill_normal(rng);
    slopes.fill(0.25);
  }
  std::vector<HostTensor*> buffers() { return {&q, &k, &v, &out, &lse, &slopes, &dout, &dq, &dk, &dv}; }
  ForwardArgs forward_args() const {
    ForwardArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
    a.alibi_slopes = slopes.view();
    return a;
  }
  BackwardArgs backward_args() const {
    BackwardArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
    a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
    a.alibi_slopes = slopes.view();
    return a;
  }
};

auto head_dim_4 = [](TensorView& t) { t.shape[t.ndim - 1] = 4; };

TEST(BadInput, Forward) {
  Batched t;
  const std::function<ForwardArgs()> make = [&] { return t.forward_args(); };
  const std::function<void(const ForwardArgs&)> call = [](const ForwardArgs& a) { forward(a); };
  const std::function<void(const ForwardArgs&)> size = [](const ForwardArgs& a) { (void)workspace_size(a); };
  forward(make());  // the unmodified call is valid
  using F = Field<ForwardArgs>;
  const std::vector<F> fields{{"q", &ForwardArgs::q, true, head_dim_4},
                              {"k", &ForwardArgs::k, true, test::grow_dim0},
                              {"v", &ForwardArgs::v, true, test::grow_dim0},
                              {"out", &ForwardArgs::out, true, test::grow_dim0},
                              {"lse", &ForwardArgs::lse, false, test::grow_dim0},
                              {"alibi_slopes", &ForwardArgs::alibi_slopes, false, test::grow_dim0}};
  std::vector<BadCase> cases;
  for (const auto& c : {call, size}) {
    for (const F& f : fields) test::add_view_cases(cases, "forward", make, c, f, f.name == std::string("q"));
    test::add_alias_cases(cases, "forward", make, c, {fields[3], fields[4]}, fields);
    add_option_cases(cases, "forward", make, c, true);
    add_slope_cases(cases, "forward", make, c, t.slopes);
  }
  expect_counts("forward", test::run_bad_cases(cases, t.buffers(), &t.workspace), 200);
}

// Packed q [6, 4, 8] (sequences of 2 and 4 rows), k [7, 2, 8] and v [7, 2, 16] (3 and 4 keys).
struct Varlen {
  HostTensor q{DType::f32, {6, 4, 8}}, k{DType::f32, {7, 2, 8}}, v{DType::f32, {7, 2, 16}};
  HostTensor out{DType::f32, {6, 4, 16}}, lse{DType::f32, {4, 6}};
  HostTensor dout{DType::f32, {6, 4, 16}}, dq{DType::f32, {6, 4, 8}}, dk{DType::f32, {7, 2, 8}}, dv{DType::f32, {7, 2, 16}};
  HostTensor cu_q = test::int_tensor({0, 2, 6}), cu_k = test::int_tensor({0, 3, 7});
  HostTensor cu_bad_start = test::int_tensor({1, 2, 6}), cu_decreasing = test::int_tensor({0, 5, 4}),
             cu_past_total = test::int_tensor({0, 2, 9}), cu_long = test::int_tensor({0, 1, 6});
  std::vector<unsigned char> workspace = std::vector<unsigned char>(4096, 0x5a);
  Varlen() {
    std::mt19937_64 rng(8);
    for (HostTensor* t : {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}) t->fill_normal(rng);
  }
  std::vector<HostTensor*> buffers() {
    return {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, &cu_q, &cu_k, &cu_bad_start, &cu_decreasing, &cu_past_total, &cu_long};
  }
  template <class Args>
  Args common() const {
    Args a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
    a.cu_seqlens_q = cu_q.view(), a.cu_seqlens_k = cu_k.view();
    a.max_seqlen_q = 4, a.max_seqlen_k = 4;
    return a;
  }
  BackwardArgs backward_args() const {
    BackwardArgs a = common<BackwardArgs>();
    a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
    return a;
  }
};

template <class Args>
void add_varlen_cases(std::vector<BadCase>& cases, const std::string& fn, const std::function<Args()>& make,
                      const std::function<void(const Args&)>& call, Varlen& t) {
  using F = Field<Args>;
  const std::vector<F> cu{{"cu_seqlens_q", &Args::cu_seqlens_q, false, test::grow_dim0},
                          {"cu_seqlens_k", &Args::cu_seqlens_k, false, test::grow_dim0}};
  for (const F& f : cu) test::add_view_cases(cases, fn, make, call, f, false);
  auto add = [&](const std::string& what, const char* name, std::function<void(Args&)> mutate) {
    cases.push_back({fn + " " + what, [make, call, mutate] {
                       Args a = make();
                       mutate(a);
                       call(a);
                     },
                     {name}});
  };
  add("cu_seqlens_k absent", "cu_seqlens_k", [](Args& a) { a.cu_seqlens_k = {}; });
  add("cu_seqlens_q absent", "cu_seqlens_q", [](Args& a) { a.cu_seqlens_q = {}; });
  add("max_seqlen_q -1", "max_seqlen_q", [](Args& a) { a.max_seqlen_q = -1; });
  add("max_seqlen_k INT_MIN", "max_seqlen_k", [](Args& a) { a.max_seqlen_k = std::numeric_limits<int>::min(); });
  add("max_seqlen_q below a length", "max_seqlen_q", [](Args& a) { a.max_seqlen_q = 3; });
  add("max_seqlen_k below a length", "max_seqlen_k", [](Args& a) { a.max_seqlen_k = 0; });
  for (const char* name : {"cu_seqlens_q", "cu_seqlens_k"}) {
    const bool isq = name[11] == 'q';
    auto set = [isq](Args& a, const HostTensor& h) { (isq ? a.cu_seqlens_q : a.cu_seqlens_k) = h.view(); };
    add(std::string(name) + "[0] = 1", name, [&t, set](Args& a) { set(a, t.cu_bad_start); });
    add(std::string(name) + " decreasing", name, [&t, set](Args& a) { set(a, t.cu_decreasing); });
    add(std::string(name) + " past the packed tokens", name, [&t, set](Args& a) { set(a, t.cu_past_total); });
  }
  add("lse batched shape", "lse", [](Args& a) { a.lse.ndim = 3, a.lse.shape[2] = 1, a.lse.stride[2] = 1; });
  add("q rank 4 in varlen", "q", [](Args& a) { a.q.ndim = 4, a.q.shape[3] = 8, a.q.stride[3] = 1; });
}

TEST(BadInput, ForwardVarlen) {
  Varlen t;
  const std::function<ForwardArgs()> make = [&] { return t.common<ForwardArgs>(); };
  const std::function<void(const ForwardArgs&)> call = [](const ForwardArgs& a) { forward(a); };
  forward(make());
  std::vector<BadCase> cases;
  add_varlen_cases(cases, "forward", make, call, t);
  using F = Field<ForwardArgs>;
  const std::vector<F> all{{"q", &ForwardArgs::q, true, nullptr}, {"k", &ForwardArgs::k, true, nullptr},
                           {"v", &ForwardArgs::v, true, nullptr}, {"out", &ForwardArgs::out, true, nullptr},
                           {"lse", &ForwardArgs::lse, false, nullptr},
                           {"cu_seqlens_q", &ForwardArgs::cu_seqlens_q, false, nullptr},
                           {"cu_seqlens_k", &ForwardArgs::cu_seqlens_k, false, nullptr}};
  test::add_alias_cases(cases, "forward", make, call, {all[3], all[4]}, all);
  expect_counts("forward (varlen)", test::run_bad_cases(cases, t.buffers(), &t.workspace), 60);
}

TEST(BadInput, Backward) {
  Batched t;
  const std::function<BackwardArgs()> make = [&] { return t.backward_args(); };
  const std::function<void(const BackwardArgs&)> call = [](const BackwardArgs& a) { backward(a); };
  const std::function<void(const BackwardArgs&)> size = [](const BackwardArgs& a) { (void)workspace_size(a); };
  backward(make());
  using F = Field<BackwardArgs>;
  const std::vector<F> fields{{"q", &BackwardArgs::q, true, head_dim_4},
                              {"k", &BackwardArgs::k, true, test::grow_dim0},
                              {"v", &BackwardArgs::v, true, test::grow_dim0},
                              {"out", &BackwardArgs::out, true, test::grow_dim0},
                              {"dout", &BackwardArgs::dout, true, test::grow_dim0},
                              {"lse", &BackwardArgs::lse, true, test::grow_dim0},
                              {"dq", &BackwardArgs::dq, true, test::grow_dim0},
                              {"dk", &BackwardArgs::dk, true, test::grow_dim0},
                              {"dv", &BackwardArgs::dv, true, test::grow_dim0},
                              {"alibi_slopes", &BackwardArgs::alibi_slopes, false, test::grow_dim0}};
  std::vector<BadCase> cases;
  for (const auto& c : {call, size}) {
    for (const F& f : fields) test::add_view_cases(cases, "backward", make, c, f, f.name == std::string("q"));
    test::add_alias_cases(cases, "backward", make, c, {fields[6], fields[7], fields[8]}, fields);
    add_option_cases(cases, "backward", make, c, true);
    add_slope_cases(cases, "backward", make, c, t.slopes);
  }
  expect_counts("backward", test::run_bad_cases(cases, t.buffers(), &t.workspace), 300);
}

TEST(BadInput, BackwardVarlen) {
  Varlen t;
  const std::function<BackwardArgs()> make = [&] { return t.backward_args(); };
  const std::function<void(const BackwardArgs&)> call = [](const BackwardArgs& a) { backward(a); };
  backward(make());
  std::vector<BadCase> cases;
  add_varlen_cases(cases, "backward", make, call, t);
  expect_counts("backward (varlen)", test::run_bad_cases(cases, t.buffers(), &t.workspace), 50);
}

// q [3, 2, 4, 8]; contiguous cache [3, 10, 2, 8|16] or paged [7, 4, 2, 8|16] with a [3, 3] table;
// cache_seqlens {0, 4, 8}; 2 rows appended (k_new, v_new [3, 2, 2, 8|16]); rotary tables [13, 4];
// causal, so each query row has its own rotary position.
struct Decode {
  HostTensor q{DType::f32, {3, 2, 4, 8}}, out{DType::f32, {3, 2, 4, 16}}, lse{DType::f32, {3, 4, 2}};
  HostTensor kc{DType::f32, {3, 10, 2, 8}}, vc{DType::f32, {3, 10, 2, 16}};
  HostTensor kp{DType::f32, {7, 4, 2, 8}}, vp{DType::f32, {7, 4, 2, 16}};
  HostTensor table{DType::i32, {3, 3}}, lens = test::int_tensor({0, 4, 8});
  HostTensor knew{DType::f32, {3, 2, 2, 8}}, vnew{DType::f32, {3, 2, 2, 16}};
  HostTensor cos{DType::f32, {13, 4}}, sin{DType::f32, {13, 4}}, slopes{DType::f32, {4}};
  HostTensor lens_negative = test::int_tensor({0, -1, 8}), lens_over = test::int_tensor({0, 4, 11}),
             lens_int_max = test::int_tensor({0, 4, std::numeric_limits<std::int32_t>::max()});
  HostTensor table_out{DType::i32, {3, 3}}, table_negative{DType::i32, {3, 3}}, table_shared{DType::i32, {3, 3}};
  std::vector<unsigned char> workspace = std::vector<unsigned char>(4096, 0x5a);
  Decode() {
    std::mt19937_64 rng(9);
    for (HostTensor* t : {&q, &out, &lse, &kc, &vc, &kp, &vp, &knew, &vnew, &cos, &sin}) t->fill_normal(rng);
    slopes.fill(0.25);
    const int pages[9] = {6, -3, -3, 2, 5, -3, 4, 0, 3};
    for (int i = 0; i < 9; ++i) {
      table.set(i, pages[i]);
      table_out.set(i, i == 4 ? 7 : pages[i]);
      table_negative.set(i, i == 6 ? -1 : pages[i]);
      table_shared.set(i, i == 4 ? 0 : pages[i]);  // sequence 1 appends into sequence 2's page 0
    }
  }
  std::vector<HostTensor*> buffers() {
    return {&q, &out, &lse, &kc, &vc, &kp, &vp, &table, &lens, &knew, &vnew, &cos, &sin, &slopes,
            &lens_negative, &lens_over, &lens_int_max, &table_out, &table_negative, &table_shared};
  }
  DecodeArgs contiguous() const {
    DecodeArgs a;
    a.q = q.view(), a.k_cache = kc.view(), a.v_cache = vc.view(), a.cache_seqlens = lens.view();
    a.k_new = knew.view(), a.v_new = vnew.view(), a.out = out.view(), a.lse = lse.view();
    a.rotary_cos = cos.view(), a.rotary_sin = sin.view(), a.alibi_slopes = slopes.view();
    a.options.causal = true;
    return a;
  }
  DecodeArgs paged() const {
    DecodeArgs a = contiguous();
    a.k_cache = kp.view(), a.v_cache = vp.view(), a.page_table = table.view();
    return a;
  }
};

using DF = Field<DecodeArgs>;
std::vector<DF> decode_fields() {
  return {{"q", &DecodeArgs::q, true, head_dim_4},
          {"k_cache", &DecodeArgs::k_cache, true, head_dim_4},
          {"v_cache", &DecodeArgs::v_cache, true, [](TensorView& t) { t.shape[1] -= 1; }},
          {"out", &DecodeArgs::out, true, test::grow_dim0},
          {"lse", &DecodeArgs::lse, false, test::grow_dim0},
          {"cache_seqlens", &DecodeArgs::cache_seqlens, false, test::grow_dim0},
          {"k_new", &DecodeArgs::k_new, false, test::grow_dim0},
          {"v_new", &DecodeArgs::v_new, false, test::grow_dim0},
          {"rotary_cos", &DecodeArgs::rotary_cos, false, [](TensorView& t) { t.shape[1] = 100; }},
          {"rotary_sin", &DecodeArgs::rotary_sin, false, test::grow_dim0},
          {"alibi_slopes", &DecodeArgs::alibi_slopes, false, test::grow_dim0}};
}

void decode_suite(bool paged, const char* label, int at_least) {
  Decode t;
  const std::function<DecodeArgs()> make = [&t, paged] { return paged ? t.paged() : t.contiguous(); };
  const std::function<void(const DecodeArgs&)> call = [](const DecodeArgs& a) { decode(a); };
  const std::function<void(const DecodeArgs&)> size = [](const DecodeArgs& a) { (void)workspace_size(a); };
  {
    // The unmodified call is valid; the fingerprints are taken after it (it appends).
    decode(make());
  }
  std::vector<DF> fields = decode_fields();
  if (paged) fields.push_back({"page_table", &DecodeArgs::page_table, false, test::grow_dim0});
  // Written: out, lse and, since the call appends, both caches.
  const std::vector<DF> written{fields[3], fields[4], fields[1], fields[2]};
  std::vector<BadCase> cases;
  auto add = [&](const std::string& what, const char* name, std::function<void(DecodeArgs&)> mutate,
                 const std::function<void(const DecodeArgs&)>& c) {
    cases.push_back({std::string("decode ") + what, [make, c, mutate] {
                       DecodeArgs a = make();
                       mutate(a);
                       c(a);
                     },
                     {name}});
  };
  for (const auto& c : {call, size}) {
    for (const DF& f : fields) test::add_view_cases(cases, "decode", make, c, f, f.name == std::string("q"));
    test::add_alias_cases(cases, "decode", make, c, written, fields);
    add_option_cases(cases, "decode", make, c, true);
    add_slope_cases(cases, "decode", make, c, t.slopes);
    add("dropout", "options.dropout_p", [](DecodeArgs& a) { a.options.dropout_p = 0.1f; }, c);
    add("k_new without v_new", "v_new", [](DecodeArgs& a) { a.v_new = {}; }, c);
    add("v_new without k_new", "k_new", [](DecodeArgs& a) { a.k_new = {}; }, c);
    add("append without cache_seqlens", "cache_seqlens", [](DecodeArgs& a) { a.cache_seqlens = {}; }, c);
    add("rotary_cos without rotary_sin", "rotary_sin", [](DecodeArgs& a) { a.rotary_sin = {}; }, c);
    add("rotary positions short", "rotary_cos", [](DecodeArgs& a) { a.rotary_cos.shape[0] = 5, a.rotary_sin.shape[0] = 5; }, c);
    add("cache_seqlens negative", "cache_seqlens", [&t](DecodeArgs& a) { a.cache_seqlens = t.lens_negative.view(); }, c);
    add("cache_seqlens over capacity", "cache_seqlens", [&t](DecodeArgs& a) { a.cache_seqlens = t.lens_over.view(); }, c);
    add("cache_seqlens INT_MAX", "cache_seqlens", [&t](DecodeArgs& a) { a.cache_seqlens = t.lens_int_max.view(); }, c);
    if (paged) {
      add("page out of range", "page_table", [&t](DecodeArgs& a) { a.page_table = t.table_out.view(); }, c);
      add("page negative", "page_table", [&t](DecodeArgs& a) { a.page_table = t.table_negative.view(); }, c);
      add("append into a shared page", "page_table", [&t](DecodeArgs& a) { a.page_table = t.table_shared.view(); }, c);
      add("page_size 2^33", "page_size", [](DecodeArgs& a) {
        a.k_cache.shape[1] = a.v_cache.shape[1] = std::int64_t{1} << 33;
        a.k_cache.stride[0] = a.v_cache.stride[0] = 0;
      }, c);
      add("capacity overflows", "page_table.shape[1]", [](DecodeArgs& a) {
        a.page_table.shape[1] = std::int64_t{1} << 40, a.page_table.stride[0] = 0;
        a.k_cache.shape[1] = a.v_cache.shape[1] = std::int64_t{1} << 30;
        a.k_cache.stride[0] = a.v_cache.stride[0] = 0;
      }, c);
      add("page_table without cache_seqlens", "cache_seqlens", [](DecodeArgs& a) {
        a.cache_seqlens = {}, a.k_new = {}, a.v_new = {};
      }, c);
    } else {
      add("batch differs from the cache's", "k_cache", [](DecodeArgs& a) { a.k_cache.shape[0] = a.v_cache.shape[0] = 2; }, c);
    }
  }
  expect_counts(label, test::run_bad_cases(cases, t.buffers(), &t.workspace), at_least);
}

TEST(BadInput, DecodeContiguousAppend) { decode_suite(false, "decode (contiguous)", 300); }
TEST(BadInput, DecodePagedAppend) { decode_suite(true, "decode (paged)", 300); }

TEST(BadInput, Combine) {
  // out_partial [3, 2, 2, 4, 16], lse_partial [3, 2, 4, 2], out [2, 2, 4, 16], lse [2, 4, 2]
  HostTensor op(DType::f32, {3, 2, 2, 4, 16}), lp(DType::f32, {3, 2, 4, 2});
  HostTensor out(DType::f32, {2, 2, 4, 16}), lse(DType::f32, {2, 4, 2});
  std::vector<unsigned char> workspace(4096, 0x5a);
  std::mt19937_64 rng(10);
  for (HostTensor* x : {&op, &lp, &out, &lse}) x->fill_normal(rng);
  const std::function<CombineArgs()> make = [&] {
    CombineArgs a;
    a.out_partial = op.view(), a.lse_partial = lp.view(), a.out = out.view(), a.lse = lse.view();
    return a;
  };
  const std::function<void(const CombineArgs&)> call = [](const CombineArgs& a) { combine(a); };
  combine(make());
  using F = Field<CombineArgs>;
  const std::vector<F> fields{{"out_partial", &CombineArgs::out_partial, true, [](TensorView& t) { t.shape[0] = 0; }},
                              {"lse_partial", &CombineArgs::lse_partial, true, test::grow_dim0},
                              {"out", &CombineArgs::out, true, test::grow_dim0},
                              {"lse", &CombineArgs::lse, false, test::grow_dim0}};
  std::vector<BadCase> cases;
  for (const F& f : fields)
    test::add_view_cases(cases, "combine", make, call, f, f.name == std::string("out_partial") || f.name == std::string("out"));
  test::add_alias_cases(cases, "combine", make, call, {fields[2], fields[3]}, fields);
  add_option_cases(cases, "combine", make, call, false);
  cases.push_back({"combine splits 2^33", [make, call] {
                     CombineArgs a = make();
                     a.out_partial.shape[0] = a.lse_partial.shape[0] = std::int64_t{1} << 33;
                     a.out_partial.stride[0] = a.lse_partial.stride[0] = 0;
                     call(a);
                   },
                   {"out_partial.shape[0]"}});
  expect_counts("combine", test::run_bad_cases(cases, {&op, &lp, &out, &lse}, &workspace), 100);
}

// The block mask's tensors and its dense element mask on Batched's problem (one 16 x 16 block of
// 3 query rows and 5 keys, partly visible): each broken in every generic way, each written buffer
// aliased with each of them, the caller's workspace over each.
struct BlockSparse {
  HostTensor num{DType::i32, {2, 4, 1}}, idx{DType::i32, {2, 4, 1, 1}}, full_num{DType::i32, {2, 4, 1}},
      full_idx{DType::i32, {2, 4, 1, 1}}, mask{DType::u8, {2, 1, 3, 5}};
  BlockSparse() {
    num.fill(1);
    idx.fill(0);
    full_num.fill(0);
    full_idx.fill(0);
    for (std::int64_t i = 0; i < mask.numel(); ++i) mask.set(i, i % 3 != 0);
  }
  std::vector<HostTensor*> buffers() { return {&num, &idx, &full_num, &full_idx, &mask}; }
  void set(BlockMask& m) const {
    m.kv_num_blocks = num.view(), m.kv_indices = idx.view();
    m.full_kv_num_blocks = full_num.view(), m.full_kv_indices = full_idx.view();
    m.mask = mask.view();
    m.block_q = m.block_k = 16;
  }
};

template <class Args>
std::vector<Field<Args>> block_mask_fields() {
  using F = Field<Args>;
  auto get = [](TensorView BlockMask::*m) {
    return std::function<TensorView&(Args&)>([m](Args& a) -> TensorView& { return a.block_mask.*m; });
  };
  return {F("block_mask.kv_num_blocks", get(&BlockMask::kv_num_blocks), true, test::grow_dim0, true),
          F("block_mask.kv_indices", get(&BlockMask::kv_indices), true, test::grow_dim0, true),
          F("block_mask.full_kv_num_blocks", get(&BlockMask::full_kv_num_blocks), true, test::grow_dim0, true),
          F("block_mask.full_kv_indices", get(&BlockMask::full_kv_indices), true, test::grow_dim0, true),
          F("block_mask.mask", get(&BlockMask::mask), false, test::grow_dim0, true)};
}

// A forward or a backward on Batched's problem, for the suites of its further inputs: the arguments,
// the call, the buffers it writes and the inputs those are aliased with.
template <class Args>
struct EntryCall {
  std::function<Args()> plain;
  std::function<void(const Args&)> call;
  std::vector<Field<Args>> written, others;
};

EntryCall<ForwardArgs> forward_call(Batched& t) {
  using F = Field<ForwardArgs>;
  const F out{"out", &ForwardArgs::out, true, nullptr}, lse{"lse", &ForwardArgs::lse, false, nullptr};
  return {[&t] { return t.forward_args(); }, [](const ForwardArgs& a) { forward(a); }, {out, lse},
          {F{"q", &ForwardArgs::q, true, nullptr}, out, lse}};
}

EntryCall<BackwardArgs> backward_call(Batched& t) {
  // A real lse for the backward: the plain forward's (finite, which is all validation reads, whatever
  // mask the suite's calls add).
  forward(t.forward_args());
  using F = Field<BackwardArgs>;
  const F dq{"dq", &BackwardArgs::dq, true, nullptr}, dk{"dk", &BackwardArgs::dk, true, nullptr},
      dv{"dv", &BackwardArgs::dv, true, nullptr};
  return {[&t] { return t.backward_args(); }, [](const BackwardArgs& a) { backward(a); }, {dq, dk, dv},
          {F{"q", &BackwardArgs::q, true, nullptr}, dq, dk, dv}};
}

// Runs a suite's cases over Batched's buffers and the suite's own, and checks the counts.
void run_suite(const char* fn, Batched& t, const std::vector<HostTensor*>& own, const std::vector<BadCase>& cases,
               int at_least) {
  std::vector<HostTensor*> buffers = t.buffers();
  buffers.insert(buffers.end(), own.begin(), own.end());
  expect_counts(fn, test::run_bad_cases(cases, buffers, &t.workspace), at_least);
}

template <class Args>
void block_sparse_suite(const char* fn, Batched& t, BlockSparse& bs, const EntryCall<Args>& e) {
  const auto& [plain, call, written, others] = e;
  const std::function<Args()> make = [plain, &bs] {
    Args a = plain();
    bs.set(a.block_mask);
    return a;
  };
  call(make());  // the unmodified call is valid
  const std::vector<Field<Args>> mask_fields = block_mask_fields<Args>();
  std::vector<BadCase> cases;
  for (const auto& f : mask_fields) test::add_view_cases(cases, fn, make, call, f, false);
  cases.push_back({std::string(fn) + " block_mask.mask without block lists", [make, call] {
                     Args a = make();
                     a.block_mask.kv_num_blocks = a.block_mask.kv_indices = {};
                     a.block_mask.full_kv_num_blocks = a.block_mask.full_kv_indices = {};
                     call(a);
                   },
                   {"block_mask.mask"}});
  std::vector<Field<Args>> all = others;
  all.insert(all.end(), mask_fields.begin(), mask_fields.end());
  test::add_alias_cases(cases, fn, make, call, written, all);
  run_suite(fn, t, bs.buffers(), cases, 150);
}

TEST(BadInput, BlockSparseForward) {
  Batched t;
  BlockSparse bs;
  block_sparse_suite("forward (block mask)", t, bs, forward_call(t));
}

TEST(BadInput, BlockSparseBackward) {
  Batched t;
  BlockSparse bs;
  block_sparse_suite("backward (block mask)", t, bs, backward_call(t));
}

// Document ids and per-sequence prefix lengths on Batched's problem: each broken in every generic
// way (strides whose byte extent passes 2^57 included), each written buffer aliased with each.
struct VariantInputs {
  HostTensor doc_q{DType::i32, {2, 3}}, doc_k{DType::i32, {2, 5}}, prefix{DType::i32, {2}};
  VariantInputs() {
    for (std::int64_t i = 0; i < doc_q.numel(); ++i) doc_q.set(i, double(i % 2));
    for (std::int64_t i = 0; i < doc_k.numel(); ++i) doc_k.set(i, double(i % 3 == 0));
    prefix.fill(2);
  }
  std::vector<HostTensor*> buffers() { return {&doc_q, &doc_k, &prefix}; }
};

template <class Args>
void variant_suite(const char* fn, Batched& t, VariantInputs& vi, const EntryCall<Args>& e) {
  const auto& [plain, call, written, others] = e;
  using F = Field<Args>;
  const std::function<Args()> with_docs = [plain, &vi] {
    Args a = plain();
    a.document_ids_q = vi.doc_q.view(), a.document_ids_k = vi.doc_k.view();
    return a;
  };
  const std::function<Args()> with_prefix = [plain, &vi] {
    Args a = plain();
    a.options.causal = true;
    a.prefix_lens = vi.prefix.view();
    return a;
  };
  call(with_docs());  // the unmodified calls are valid
  call(with_prefix());
  F doc_q{"document_ids_q", &Args::document_ids_q, true, test::grow_dim0},
      doc_k{"document_ids_k", &Args::document_ids_k, true, test::grow_dim0},
      prefix{"prefix_lens", &Args::prefix_lens, false, test::grow_dim0};
  doc_q.any_strides = doc_k.any_strides = prefix.any_strides = true;  // read element by element
  std::vector<BadCase> cases;
  for (const F& f : {doc_q, doc_k}) test::add_view_cases(cases, fn, with_docs, call, f, false);
  test::add_view_cases(cases, fn, with_prefix, call, prefix, false);
  std::vector<F> docs_all = others, prefix_all = others;
  docs_all.insert(docs_all.end(), {doc_q, doc_k});
  prefix_all.push_back(prefix);
  test::add_alias_cases(cases, fn, with_docs, call, written, docs_all);
  test::add_alias_cases(cases, fn, with_prefix, call, written, prefix_all);
  run_suite(fn, t, vi.buffers(), cases, 100);
}

TEST(BadInput, DocumentIdsAndPrefixLensForward) {
  Batched t;
  VariantInputs vi;
  variant_suite("forward (variant inputs)", t, vi, forward_call(t));
}

TEST(BadInput, DocumentIdsAndPrefixLensBackward) {
  Batched t;
  VariantInputs vi;
  variant_suite("backward (variant inputs)", t, vi, backward_call(t));
}

}  // namespace
}  // namespace tileattn
