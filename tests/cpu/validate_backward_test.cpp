// Every way validation rejects a backward call: the required lse, the gradient and dout tensors,
// and (through the shared checks) the forward's arguments. Gradients stay untouched.
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
  std::function<void(BackwardArgs&)> mutate;
  std::vector<std::string> fragments;
};

TEST(ValidateBackward, EveryArgument) {
  HostTensor q(DType::f32, {2, 3, 4, 8}), k(DType::f32, {2, 5, 2, 8}), v(DType::f32, {2, 5, 2, 16});
  HostTensor out(DType::f32, {2, 3, 4, 16}), dout(DType::f32, {2, 3, 4, 16}), lse(DType::f32, {2, 4, 3});
  HostTensor dq(DType::f32, {2, 3, 4, 8}), dk(DType::f32, {2, 5, 2, 8}), dv(DType::f32, {2, 5, 2, 16});
  for (HostTensor* t : {&q, &k, &v, &out, &dout, &lse}) t->fill(0.5);
  auto args = [&] {
    BackwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.dout = dout.view();
    a.lse = lse.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.options.backend = Backend::cpu_reference;
    return a;
  };
  backward(args());  // the unmodified call is valid
  const std::vector<Case> cases{
      {"lse absent", [](BackwardArgs& a) { a.lse = {}; }, {"lse is required"}},
      {"q dtype", [](BackwardArgs& a) { a.q.dtype = DType::i32; }, {"q has dtype i32"}},
      {"out shape", [](BackwardArgs& a) { a.out.shape[1] = 2; }, {"out has shape [2, 2, 4, 16], expected [2, 3, 4, 16]"}},
      {"lse shape", [](BackwardArgs& a) { a.lse.shape[1] = 2; }, {"lse has shape [2, 2, 3], expected [2, 4, 3]"}},
      {"options", [](BackwardArgs& a) { a.options.dropout_p = 2.f; }, {"options.dropout_p = 2"}},
      {"dout absent", [](BackwardArgs& a) { a.dout = {}; }, {"dout is required but absent"}},
      {"dout rank", [](BackwardArgs& a) { a.dout.ndim = 3; }, {"dout must have 4 dimensions, got 3"}},
      {"dout dtype", [](BackwardArgs& a) { a.dout.dtype = DType::f16; }, {"dout has dtype f16, expected f32"}},
      {"dout device", [](BackwardArgs& a) { a.dout.device = kCuda; }, {"dout is on cuda:0 but q is on cpu:0"}},
      {"dout shape", [](BackwardArgs& a) { a.dout.shape[3] = 8; },
       {"dout has shape [2, 3, 4, 8] but out has shape [2, 3, 4, 16]"}},
      {"dq absent", [](BackwardArgs& a) { a.dq = {}; }, {"dq is required but absent"}},
      {"dq shape", [](BackwardArgs& a) { a.dq.shape[1] = 4; }, {"dq has shape [2, 4, 4, 8] but q has shape [2, 3, 4, 8]"}},
      {"dq null", [](BackwardArgs& a) { a.dq.data = nullptr; }, {"dq has 192 elements but a null data pointer"}},
      {"dk dtype", [](BackwardArgs& a) { a.dk.dtype = DType::bf16; }, {"dk has dtype bf16, expected f32"}},
      {"dk rank", [](BackwardArgs& a) { a.dk.ndim = 5; a.dk.shape[4] = 1; }, {"dk must have 4 dimensions, got 5"}},
      {"dk negative", [](BackwardArgs& a) { a.dk.shape[0] = -2; }, {"dk.shape[0] = -2 is negative"}},
      {"dv device", [](BackwardArgs& a) { a.dv.device = kCuda; }, {"dv is on cuda:0 but q is on cpu:0"}},
      {"dv stride", [](BackwardArgs& a) { a.dv.stride[3] = 2; }, {"dv.stride[3] = 2"}},
      {"dv shape", [](BackwardArgs& a) { a.dv.shape[3] = 8; }, {"dv has shape [2, 5, 2, 8] but v has shape [2, 5, 2, 16]"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    for (HostTensor* t : {&dq, &dk, &dv}) t->poison();
    BackwardArgs a = args();
    c.mutate(a);
    auto fragments = c.fragments;
    fragments.push_back("tileattn::backward");
    test::expect_rejected([&] { backward(a); }, fragments, {&dq, &dk, &dv});
    test::expect_rejected([&] { (void)workspace_size(a); }, fragments, {&dq, &dk, &dv});
  }
}

TEST(ValidateBackward, VarlenOffsets) {
  HostTensor q(DType::f32, {5, 2, 8}), k(DType::f32, {6, 2, 8}), v(DType::f32, {6, 2, 8});
  HostTensor out(DType::f32, {5, 2, 8}), dout(DType::f32, {5, 2, 8}), lse(DType::f32, {2, 5});
  HostTensor dq(DType::f32, {5, 2, 8}), dk(DType::f32, {6, 2, 8}), dv(DType::f32, {6, 2, 8});
  HostTensor cq = test::int_tensor({0, 2, 5}), ck = test::int_tensor({0, 4, 6}), bad = test::int_tensor({0, 4, 7});
  for (HostTensor* t : {&dq, &dk, &dv}) t->poison();
  BackwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.dout = dout.view();
  a.lse = lse.view();
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  a.cu_seqlens_q = cq.view();
  a.cu_seqlens_k = bad.view();
  a.max_seqlen_q = 3;
  a.max_seqlen_k = 4;
  a.options.backend = Backend::cpu_reference;
  test::expect_rejected([&] { backward(a); }, {"tileattn::backward", "cu_seqlens_k[2] = 7 exceeds the 6 packed tokens"},
                        {&dq, &dk, &dv});
  a.cu_seqlens_k = ck.view();
  a.lse = HostTensor(DType::f32, {2, 2, 3}).view();
  a.lse.data = lse.data();
  test::expect_rejected([&] { backward(a); }, {"lse has shape [2, 2, 3], expected [2, 5]"}, {&dq, &dk, &dv});
}

}  // namespace
}  // namespace tileattn
