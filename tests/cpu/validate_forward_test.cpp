// Every way validation rejects a forward call (batched and varlen), plus tileattn::view's errors and
// the backend/device checks: a tileattn::Error naming the argument and value, outputs untouched.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/backends.hpp"
#include "support/expect_rejected.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

struct Case {
  const char* what;
  std::function<void(ForwardArgs&)> mutate;
  std::vector<std::string> fragments;
};

constexpr Device kCuda{DeviceType::cuda, 0};
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// q [2, 3, 4, 8], k [2, 5, 2, 8], v [2, 5, 2, 16], out [2, 3, 4, 16], lse [2, 4, 3]
struct Batched {
  HostTensor q{DType::f32, {2, 3, 4, 8}}, k{DType::f32, {2, 5, 2, 8}}, v{DType::f32, {2, 5, 2, 16}};
  HostTensor out{DType::f32, {2, 3, 4, 16}}, lse{DType::f32, {2, 4, 3}};
  HostTensor slopes{DType::f32, {4}}, slopes_f16{DType::f16, {4}}, slopes3{DType::f32, {3}},
      slopes_b{DType::f32, {2, 3}}, slopes_3d{DType::f32, {1, 2, 4}};
  Batched() {
    q.fill(0.5);
    k.fill(0.25);
    v.fill(1);
    out.poison();
    lse.poison();
  }
  ForwardArgs args() const {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.options.backend = Backend::cpu_reference;
    return a;
  }
  void run(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      ForwardArgs a = args();
      c.mutate(a);
      auto fragments = c.fragments;
      fragments.push_back("tileattn::forward");
      test::expect_rejected([&] { forward(a); }, fragments, {&out, &lse});
      test::expect_rejected([&] { (void)workspace_size(a); }, fragments, {&out, &lse});
    }
  }
};

TEST(ValidateForward, Tensors) {
  Batched t;
  t.run({
      {"q absent", [](ForwardArgs& a) { a.q = {}; }, {"q is required but absent"}},
      {"k rank", [](ForwardArgs& a) { a.k.ndim = 3; }, {"k must have 4 dimensions, got 3", "[2, 5, 2]"}},
      {"v negative", [](ForwardArgs& a) { a.v.shape[1] = -1; }, {"v.shape[1] = -1 is negative"}},
      {"out null", [](ForwardArgs& a) { a.out.data = nullptr; }, {"out has 384 elements but a null data pointer"}},
      {"q stride", [](ForwardArgs& a) { a.q.stride[3] = 2; }, {"q.stride[3] = 2", "contiguous"}},
      {"q dtype", [](ForwardArgs& a) { a.q.dtype = DType::i32; }, {"q has dtype i32, expected f32, f16 or bf16"}},
      {"k dtype", [](ForwardArgs& a) { a.k.dtype = DType::f16; }, {"k has dtype f16, expected f32"}},
      {"v dtype", [](ForwardArgs& a) { a.v.dtype = DType::bf16; }, {"v has dtype bf16, expected f32"}},
      {"out dtype", [](ForwardArgs& a) { a.out.dtype = DType::f16; }, {"out has dtype f16, expected f32"}},
      {"k device", [](ForwardArgs& a) { a.k.device = kCuda; }, {"k is on cuda:0 but q is on cpu:0"}},
      {"v device", [](ForwardArgs& a) { a.v.device = kCuda; }, {"v is on cuda:0 but q is on cpu:0"}},
      {"out device", [](ForwardArgs& a) { a.out.device = kCuda; }, {"out is on cuda:0 but q is on cpu:0"}},
      {"q heads overflow", [](ForwardArgs& a) { a.q.shape[2] = 3000000000LL; }, {"q heads = 3000000000 exceeds 2^31 - 1"}},
      {"q head dim odd", [](ForwardArgs& a) { a.q.shape[3] = 12; }, {"q.shape[-1] (head_dim_qk) = 12", "multiple of 8"}},
      {"q head dim big", [](ForwardArgs& a) { a.q.shape[3] = 264; }, {"q.shape[-1] (head_dim_qk) = 264"}},
      {"q head dim 0", [](ForwardArgs& a) { a.q.shape[3] = 0; }, {"q.shape[-1] (head_dim_qk) = 0"}},
      {"v head dim", [](ForwardArgs& a) { a.v.shape[3] = 20; }, {"v.shape[-1] (head_dim_v) = 20"}},
      {"q no heads", [](ForwardArgs& a) { a.q.shape[2] = 0; }, {"q has 0 heads, expected >= 1"}},
      {"kv heads", [](ForwardArgs& a) { a.k.shape[2] = 3; }, {"k heads (heads_kv) = 3", "heads_q) = 4"}},
      {"kv heads 0", [](ForwardArgs& a) { a.k.shape[2] = 0; }, {"k heads (heads_kv) = 0"}},
      {"k batch", [](ForwardArgs& a) { a.k.shape[0] = 1; }, {"k has shape [1, 5, 2, 8], expected [2, 5, 2, 8]"}},
      {"v seqlen", [](ForwardArgs& a) { a.v.shape[1] = 4; }, {"v has shape [2, 4, 2, 16], expected [2, 5, 2, 16]"}},
      {"v heads", [](ForwardArgs& a) { a.v.shape[2] = 1; }, {"v has shape [2, 5, 1, 16], expected [2, 5, 2, 16]"}},
      {"out shape", [](ForwardArgs& a) { a.out.shape[3] = 8; }, {"out has shape [2, 3, 4, 8], expected [2, 3, 4, 16]"}},
      {"lse dtype", [](ForwardArgs& a) { a.lse.dtype = DType::f16; }, {"lse has dtype f16, expected f32"}},
      {"lse device", [](ForwardArgs& a) { a.lse.device = kCuda; }, {"lse is on cuda:0"}},
      {"lse shape", [](ForwardArgs& a) { a.lse.shape[2] = 2; }, {"lse has shape [2, 4, 2], expected [2, 4, 3]"}},
      {"lse rank", [](ForwardArgs& a) { a.lse.ndim = 2; }, {"lse has shape [2, 4], expected [2, 4, 3]"}},
      {"lse null", [](ForwardArgs& a) { a.lse.data = nullptr; }, {"lse has", "elements but a null data pointer"}},
  });
}

TEST(ValidateForward, Options) {
  Batched t;
  t.run({
      {"scale nan", [](ForwardArgs& a) { a.options.scale = kNaN; }, {"options.scale = nan is not finite"}},
      {"scale inf", [](ForwardArgs& a) { a.options.scale = kInf; }, {"options.scale = inf is not finite"}},
      {"window_left", [](ForwardArgs& a) { a.options.window_left = -2; }, {"options.window_left = -2"}},
      {"window_right", [](ForwardArgs& a) { a.options.window_right = -3; }, {"options.window_right = -3"}},
      {"causal vs window", [](ForwardArgs& a) { a.options.causal = true; a.options.window_right = 2; },
       {"options.causal = true conflicts with options.window_right = 2"}},
      {"softcap negative", [](ForwardArgs& a) { a.options.softcap = -1.f; }, {"options.softcap = -1"}},
      {"softcap nan", [](ForwardArgs& a) { a.options.softcap = kNaN; }, {"options.softcap = nan"}},
      {"softcap inf", [](ForwardArgs& a) { a.options.softcap = kInf; }, {"options.softcap = inf"}},
      {"dropout negative", [](ForwardArgs& a) { a.options.dropout_p = -0.5f; }, {"options.dropout_p = -0.5"}},
      {"dropout one", [](ForwardArgs& a) { a.options.dropout_p = 1.f; }, {"options.dropout_p = 1,", "p < 1"}},
      {"dropout nan", [](ForwardArgs& a) { a.options.dropout_p = kNaN; }, {"options.dropout_p = nan"}},
      {"num_splits", [](ForwardArgs& a) { a.options.num_splits = -1; }, {"options.num_splits = -1"}},
      {"sm_margin", [](ForwardArgs& a) { a.options.sm_margin = -2; }, {"options.sm_margin = -2, expected >= 0"}},
      {"workspace", [](ForwardArgs& a) { a.options.workspace_bytes = 64; },
       {"options.workspace is null but options.workspace_bytes = 64"}},
  });
}

TEST(ValidateForward, PrefixLm) {
  Batched t;
  HostTensor lens = test::int_tensor({3, 0}), neg = test::int_tensor({3, -1}), three = test::int_tensor({1, 2, 3});
  HostTensor lens_f32(DType::f32, {2}), lens_2d(DType::i32, {2, 1});
  auto causal = [](ForwardArgs& a, int prefix) {
    a.options.causal = true;
    a.options.prefix_len = prefix;
  };
  t.run({
      {"negative", [&](ForwardArgs& a) { causal(a, -2); }, {"options.prefix_len = -2, expected >= 0"}},
      {"no causal", [](ForwardArgs& a) { a.options.prefix_len = 2; },
       {"prefix-LM (options.prefix_len = 2) needs a mask beyond the prefix", "causal = false, window_right = -1"}},
      {"window_left", [&](ForwardArgs& a) { causal(a, 2); a.options.window_left = 1; },
       {"prefix-LM (options.prefix_len = 2) cannot be combined with options.window_left = 1"}},
      {"chunk", [&](ForwardArgs& a) { causal(a, 2); a.options.chunk_size = 2; },
       {"prefix-LM (options.prefix_len = 2) cannot be combined with options.chunk_size = 2"}},
      {"both", [&](ForwardArgs& a) { causal(a, 2); a.prefix_lens = lens.view(); },
       {"options.prefix_len = 2 and prefix_lens are both given"}},
      {"per sequence, no causal", [&](ForwardArgs& a) { a.prefix_lens = lens.view(); },
       {"prefix-LM (prefix_lens) needs a mask beyond the prefix"}},
      {"per sequence, negative", [&](ForwardArgs& a) { causal(a, 0); a.prefix_lens = neg.view(); },
       {"prefix_lens[1] = -1 is negative"}},
      {"per sequence, batch", [&](ForwardArgs& a) { causal(a, 0); a.prefix_lens = three.view(); },
       {"prefix_lens has shape [3], expected [2] (batch)"}},
      {"per sequence, rank", [&](ForwardArgs& a) { causal(a, 0); a.prefix_lens = lens_2d.view(); },
       {"prefix_lens has shape [2, 1], expected [2] (batch)"}},
      {"per sequence, dtype", [&](ForwardArgs& a) { causal(a, 0); a.prefix_lens = lens_f32.view(); },
       {"prefix_lens has dtype f32, expected i32"}},
      {"per sequence, device", [&](ForwardArgs& a) { causal(a, 0); a.prefix_lens = lens.view(); a.prefix_lens.device = kCuda; },
       {"prefix_lens is on cuda:0 but q is on cpu"}},
      {"per sequence, null", [&](ForwardArgs& a) { causal(a, 0); a.prefix_lens = lens.view(); a.prefix_lens.data = nullptr; },
       {"prefix_lens has 2 elements but a null data pointer"}},
      {"out over prefix_lens", [&](ForwardArgs& a) { causal(a, 0); a.prefix_lens = lens.view(); a.prefix_lens.data = a.lse.data; },
       {"output lse overlaps input prefix_lens"}},
  });
}

TEST(ValidateForward, AlibiSlopes) {
  Batched t;
  t.run({
      {"dtype", [&](ForwardArgs& a) { a.alibi_slopes = t.slopes_f16.view(); }, {"alibi_slopes has dtype f16, expected f32"}},
      {"device", [&](ForwardArgs& a) { a.alibi_slopes = t.slopes.view(); a.alibi_slopes.device = kCuda; },
       {"alibi_slopes is on cuda:0"}},
      {"heads", [&](ForwardArgs& a) { a.alibi_slopes = t.slopes3.view(); }, {"alibi_slopes has shape [3], expected [4]"}},
      {"per batch", [&](ForwardArgs& a) { a.alibi_slopes = t.slopes_b.view(); },
       {"alibi_slopes has shape [2, 3], expected [2, 4]"}},
      {"rank", [&](ForwardArgs& a) { a.alibi_slopes = t.slopes_3d.view(); },
       {"alibi_slopes must be [heads_q] or [batch, heads_q], got shape [1, 2, 4]"}},
      {"null", [&](ForwardArgs& a) { a.alibi_slopes = t.slopes.view(); a.alibi_slopes.data = nullptr; },
       {"alibi_slopes has", "elements but a null data pointer"}},
      {"diagonal past int", [&](ForwardArgs& a) { a.options.alibi_diagonal = INT_MAX - 3; },
       {"options.alibi_diagonal = 2147483644", "must fit a 32-bit int"}},
  });
}

// A cuda backend needs cuda tensors; cuda tensors need a library built with CUDA and never go to a
// cpu backend. (No device memory is touched: validation fails first.)
TEST(ValidateForward, BackendAndDevice) {
  Batched t;
  auto all_on = [](ForwardArgs& a, Device d) {
    for (TensorView* v : {&a.q, &a.k, &a.v, &a.out, &a.lse}) v->device = d;
  };
  std::vector<Case> cases{
      {"cuda backend, cpu tensors", [](ForwardArgs& a) { a.options.backend = Backend::cuda; },
       {"options.backend = cuda but the tensors are on the cpu"}},
      {"cpu backend, cuda tensors", [&](ForwardArgs& a) { all_on(a, Device{DeviceType::cuda, 1}); },
       {"options.backend is a cpu backend but the tensors are on cuda:1"}},
      {"flash backend, cuda tensors",
       [&](ForwardArgs& a) { all_on(a, kCuda); a.options.backend = Backend::cpu_flash; },
       {"options.backend is a cpu backend but the tensors are on cuda:0"}},
  };
  if (!cuda_available()) {
    cases.push_back({"automatic, cuda tensors, no CUDA build",
                     [&](ForwardArgs& a) { all_on(a, kCuda); a.options.backend = Backend::automatic; },
                     {"the tensors are on cuda but tileattn was built without CUDA support"}});
    cases.push_back({"cuda backend, no CUDA build",
                     [&](ForwardArgs& a) { all_on(a, kCuda); a.options.backend = Backend::cuda; },
                     {"built without CUDA support"}});
  }
  t.run(cases);
}

// Varlen: q [7, 4, 8], k [9, 2, 8], v [9, 2, 16], out [7, 4, 16], lse [4, 7];
// sequences of (3, 4), (0, 2), (4, 3) query/key rows.
struct Varlen {
  HostTensor q{DType::f32, {7, 4, 8}}, k{DType::f32, {9, 2, 8}}, v{DType::f32, {9, 2, 16}};
  HostTensor out{DType::f32, {7, 4, 16}}, lse{DType::f32, {4, 7}};
  HostTensor cu_q = test::int_tensor({0, 3, 3, 7}), cu_k = test::int_tensor({0, 4, 6, 9});
  HostTensor cu_5 = test::int_tensor({0, 4, 6, 9, 9}), cu_start1 = test::int_tensor({1, 3, 3, 7}),
             cu_decreasing = test::int_tensor({0, 4, 3, 9}), cu_past_end = test::int_tensor({0, 3, 3, 8}),
             cu_f32{DType::f32, {4}}, cu_2d{DType::i32, {4, 1}}, cu_empty{DType::i32, {0}};
  Varlen() {
    q.fill(0.5);
    k.fill(0.25);
    v.fill(1);
    out.poison();
    lse.poison();
  }
  ForwardArgs args() const {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.cu_seqlens_q = cu_q.view();
    a.cu_seqlens_k = cu_k.view();
    a.max_seqlen_q = 4;
    a.max_seqlen_k = 4;
    a.options.backend = Backend::cpu_reference;
    return a;
  }
  void run(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      ForwardArgs a = args();
      c.mutate(a);
      auto fragments = c.fragments;
      fragments.push_back("tileattn::forward");
      test::expect_rejected([&] { forward(a); }, fragments, {&out, &lse});
    }
  }
};

TEST(ValidateForward, Varlen) {
  Varlen t;
  // The valid call works (so the rejections below are about the one change each makes).
  ForwardArgs ok = t.args();
  forward(ok);
  t.out.poison();
  t.lse.poison();
  t.run({
      {"cu_k absent", [](ForwardArgs& a) { a.cu_seqlens_k = {}; },
       {"cu_seqlens_q and cu_seqlens_k must be given together (cu_seqlens_k is absent)"}},
      {"cu_q absent", [](ForwardArgs& a) { a.cu_seqlens_q = {}; }, {"(cu_seqlens_q is absent)"}},
      {"q rank", [](ForwardArgs& a) { a.q.ndim = 4; a.q.shape[3] = 1; a.q.stride[3] = 1; },
       {"q must have 3 dimensions, got 4"}},
      {"cu_q empty", [&](ForwardArgs& a) { a.cu_seqlens_q = t.cu_empty.view(); },
       {"cu_seqlens_q must hold batch + 1 >= 1 entries, got shape [0]"}},
      {"max_seqlen negative", [](ForwardArgs& a) { a.max_seqlen_q = -1; }, {"max_seqlen_q = -1, max_seqlen_k = 4"}},
      {"k heads vs v", [](ForwardArgs& a) { a.v.shape[0] = 8; }, {"v has shape [8, 2, 16], expected [9, 2, 16]"}},
      {"k dim", [](ForwardArgs& a) { a.k.shape[2] = 16; a.k.stride[1] = 16; a.k.stride[0] = 32; },
       {"k has shape [9, 2, 16], expected [9, 2, 8]"}},
      {"out tokens", [](ForwardArgs& a) { a.out.shape[0] = 6; }, {"out has shape [6, 4, 16], expected [7, 4, 16]"}},
      {"cu_k rank", [&](ForwardArgs& a) { a.cu_seqlens_k = t.cu_2d.view(); }, {"cu_seqlens_k must have 1 dimensions, got 2"}},
      {"cu_q dtype", [&](ForwardArgs& a) { a.cu_seqlens_q = t.cu_f32.view(); }, {"cu_seqlens_q has dtype f32, expected i32"}},
      {"cu_q device", [](ForwardArgs& a) { a.cu_seqlens_q.device = kCuda; }, {"cu_seqlens_q is on cuda:0 but q is on cpu:0"}},
      {"cu_k length", [&](ForwardArgs& a) { a.cu_seqlens_k = t.cu_5.view(); }, {"cu_seqlens_k has shape [5], expected [4]"}},
      {"cu_q start", [&](ForwardArgs& a) { a.cu_seqlens_q = t.cu_start1.view(); }, {"cu_seqlens_q[0] = 1, expected 0"}},
      {"cu_k decreasing", [&](ForwardArgs& a) { a.cu_seqlens_k = t.cu_decreasing.view(); },
       {"cu_seqlens_k must be non-decreasing, but cu_seqlens_k[2] = 3 < cu_seqlens_k[1] = 4"}},
      {"longer than max", [](ForwardArgs& a) { a.max_seqlen_q = 3; },
       {"sequence 2 has length 4 (from cu_seqlens_q) but max_seqlen_q = 3"}},
      {"key longer than max", [](ForwardArgs& a) { a.max_seqlen_k = 3; },
       {"sequence 0 has length 4 (from cu_seqlens_k) but max_seqlen_k = 3"}},
      {"past the tokens", [&](ForwardArgs& a) { a.cu_seqlens_q = t.cu_past_end.view(); a.max_seqlen_q = 5; },
       {"cu_seqlens_q[3] = 8 exceeds the 7 packed tokens"}},
      {"lse dtype", [](ForwardArgs& a) { a.lse.dtype = DType::bf16; }, {"lse has dtype bf16, expected f32"}},
      {"lse device", [](ForwardArgs& a) { a.lse.device = kCuda; }, {"lse is on cuda:0"}},
      {"lse shape", [](ForwardArgs& a) { a.lse.shape[1] = 6; }, {"lse has shape [4, 6], expected [4, 7]"}},
      {"lse batched shape", [](ForwardArgs& a) { a.lse.ndim = 3; a.lse.shape[2] = 1; },
       {"lse has shape [4, 7, 1], expected [4, 7]"}},
  });
}

TEST(ValidateView, RankAndStrides) {
  float x = 0;
  auto expect = [](const std::function<void()>& f, const std::string& fragment) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tileattn::view"), std::string::npos) << e.what();
    }
  };
  expect([&] { view(&x, DType::f32, {}); }, "rank 0 is outside [1, 5]");
  expect([&] { view(&x, DType::f32, {1, 1, 1, 1, 1, 1}); }, "rank 6 is outside [1, 5]");
  expect([&] { view(&x, DType::f32, {}, {}); }, "rank 0 is outside [1, 5]");
  expect([&] { view(&x, DType::f32, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}); }, "rank 6 is outside [1, 5]");
  expect([&] { view(&x, DType::f32, {1, 2, 3}, {6, 3}); }, "2 strides for 3 dimensions");
  // And the valid forms produce what they say.
  const TensorView c = view(&x, DType::bf16, {2, 3, 4});
  EXPECT_EQ(c.ndim, 3);
  EXPECT_EQ(c.stride[0], 12);
  EXPECT_EQ(c.stride[1], 4);
  EXPECT_EQ(c.stride[2], 1);
  const TensorView s = view(&x, DType::f32, {2, 3}, {1, 2}, Device{DeviceType::cuda, 3});
  EXPECT_EQ(s.stride[0], 1);
  EXPECT_EQ(s.stride[1], 2);
  EXPECT_EQ(s.device.index, 3);
}

}  // namespace
}  // namespace tileattn
