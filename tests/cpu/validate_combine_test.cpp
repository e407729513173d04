// Every way validation rejects a combine call; the outputs stay untouched.
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
  std::function<void(CombineArgs&)> mutate;
  std::vector<std::string> fragments;
};

TEST(ValidateCombine, EveryArgument) {
  // out_partial [3, 2, 2, 4, 16], lse_partial [3, 2, 4, 2], out [2, 2, 4, 16], lse [2, 4, 2]
  HostTensor op(DType::f32, {3, 2, 2, 4, 16}), lp(DType::f32, {3, 2, 4, 2});
  HostTensor out(DType::f32, {2, 2, 4, 16}), lse(DType::f32, {2, 4, 2});
  op.fill(1);
  lp.fill(0);
  auto args = [&] {
    CombineArgs a;
    a.out_partial = op.view();
    a.lse_partial = lp.view();
    a.out = out.view();
    a.lse = lse.view();
    return a;
  };
  combine(args());  // the unmodified call is valid
  const std::vector<Case> cases{
      {"out_partial absent", [](CombineArgs& a) { a.out_partial = {}; }, {"out_partial is required but absent"}},
      {"out_partial rank", [](CombineArgs& a) { a.out_partial.ndim = 4; }, {"out_partial must have 5 dimensions, got 4"}},
      {"lse_partial rank", [](CombineArgs& a) { a.lse_partial.ndim = 3; }, {"lse_partial must have 4 dimensions, got 3"}},
      {"out rank", [](CombineArgs& a) { a.out.ndim = 5; a.out.shape[4] = 1; }, {"out must have 4 dimensions, got 5"}},
      {"out null", [](CombineArgs& a) { a.out.data = nullptr; }, {"out has 256 elements but a null data pointer"}},
      {"lse_partial stride", [](CombineArgs& a) { a.lse_partial.stride[3] = 2; }, {"lse_partial.stride[3] = 2"}},
      {"out_partial dtype", [](CombineArgs& a) { a.out_partial.dtype = DType::f16; }, {"out_partial has dtype f16, expected f32"}},
      {"lse_partial dtype", [](CombineArgs& a) { a.lse_partial.dtype = DType::bf16; }, {"lse_partial has dtype bf16, expected f32"}},
      {"out dtype", [](CombineArgs& a) { a.out.dtype = DType::i32; }, {"out has dtype i32, expected f32, f16 or bf16"}},
      {"lse_partial device", [](CombineArgs& a) { a.lse_partial.device = kCuda; }, {"lse_partial is on cuda:0 but out_partial is on cpu:0"}},
      {"out device", [](CombineArgs& a) { a.out.device = kCuda; }, {"out is on cuda:0 but out_partial is on cpu:0"}},
      {"cuda backend", [](CombineArgs& a) { a.options.backend = Backend::cuda; },
       {"options.backend = cuda but the tensors are on the cpu"}},
      {"no splits", [](CombineArgs& a) { a.out_partial.shape[0] = 0; a.lse_partial.shape[0] = 0; },
       {"out_partial.shape[0] (splits) = 0, expected >= 1"}},
      {"lse_partial shape", [](CombineArgs& a) { a.lse_partial.shape[3] = 4; a.lse_partial.shape[2] = 2; },
       {"lse_partial has shape [3, 2, 2, 4], expected [3, 2, 4, 2]"}},
      {"out shape", [](CombineArgs& a) { a.out.shape[3] = 8; }, {"out has shape [2, 2, 4, 8], expected [2, 2, 4, 16]"}},
      {"lse dtype", [](CombineArgs& a) { a.lse.dtype = DType::f16; }, {"lse has dtype f16, expected f32"}},
      {"lse device", [](CombineArgs& a) { a.lse.device = kCuda; }, {"lse is on cuda:0 but out_partial is on cpu:0"}},
      {"lse null", [](CombineArgs& a) { a.lse.data = nullptr; }, {"lse has", "elements but a null data pointer"}},
      {"lse shape", [](CombineArgs& a) { a.lse.shape[2] = 3; }, {"lse has shape [2, 4, 3], expected [2, 4, 2]"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    out.poison();
    lse.poison();
    CombineArgs a = args();
    c.mutate(a);
    auto fragments = c.fragments;
    fragments.push_back("tileattn::combine");
    test::expect_rejected([&] { combine(a); }, fragments, {&out, &lse});
  }
}

}  // namespace
}  // namespace tileattn
