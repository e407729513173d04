// The flash path's extra memory: exactly what workspace_size reports, linear in the sequence
// length, and nothing at all when the caller lends the workspace.
#include <gtest/gtest.h>

#include "attention_case.hpp"
#include "cpu/flash_common.hpp"

namespace tileattn::test {
namespace {

// Extra bytes a call allocates at its peak. One thread: per-thread tiles are allocated on a
// thread's first call and kept, so a warm-up call on the same thread leaves only the call's own.
template <class Call>
std::size_t peak_extra(Call call) {
  reset_peak_memory();
  const std::size_t before = memory_stats().current_bytes;
  call();
  return memory_stats().peak_bytes - before;
}

Case long_case(int n) {
  Case c;
  c.dtype = DType::bf16;
  c.batch = 1;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seqlen_q = c.seqlen_k = n;
  c.hdim = c.hdim_v = 64;
  c.options.backend = Backend::cpu_flash;
  c.options.causal = true;
  return c;
}

TEST(FlashMemory, ExtraMemoryIsTheWorkspaceAndLinearInN) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  set_num_threads(1);
  std::vector<std::size_t> fwd, bwd;
  {
    const Case c = long_case(256);  // warms this thread's tiles up
    CaseTensors t(c, rng);
    forward(t.forward(c));
    backward(t.backward(c));
  }
  for (int n : {1024, 2048, 4096}) {
    const Case c = long_case(n);
    CaseTensors t(c, rng);
    const ForwardArgs f = t.forward(c);
    const BackwardArgs b = t.backward(c);
    fwd.push_back(peak_extra([&] { forward(f); }));
    EXPECT_EQ(fwd.back(), workspace_size(f)) << "forward n = " << n;
    bwd.push_back(peak_extra([&] { backward(b); }));
    EXPECT_EQ(bwd.back(), workspace_size(b)) << "backward n = " << n;
    EXPECT_GT(workspace_size(b), 0u);
  }
  set_num_threads(0);
  for (std::size_t i = 1; i < bwd.size(); ++i) {
    const double ratio = static_cast<double>(bwd[i]) / static_cast<double>(bwd[i - 1]);
    EXPECT_NEAR(ratio, 2.0, 0.05) << "backward extra memory per doubling of N (quadratic would be 4)";
    EXPECT_LE(fwd[i], fwd[i - 1] * 2) << "forward extra memory";
  }
}

TEST(FlashMemory, CallerWorkspaceMeansNoAllocation) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  set_num_threads(1);
  const Case c = long_case(512);
  CaseTensors t(c, rng);
  BackwardArgs b = t.backward(c);
  forward(t.forward(c));
  backward(b);  // warm-up
  // At any alignment: the library aligns the buffer within the slack workspace_size includes.
  std::vector<char> ws(workspace_size(b) + 64);
  for (std::size_t skew : {0, 1, 16, 63}) {
    char* base = ws.data() + align_skip(ws.data(), cpu::flash::kWorkspaceAlign) + skew;
    b.options.workspace = base;
    b.options.workspace_bytes = workspace_size(b);
    EXPECT_EQ(peak_extra([&] { backward(b); }), 0u) << "workspace 64-byte aligned plus " << skew;
  }
  set_num_threads(0);
}

TEST(FlashMemory, DecodeSplitsUseExactlyTheWorkspace) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  set_num_threads(1);
  const int batch = 2, heads = 4, d = 64, cap = 2048;
  HostTensor q(DType::f32, {batch, 1, heads, d}), kc(DType::f32, {batch, cap, heads, d}),
      vc(DType::f32, {batch, cap, heads, d}), out(DType::f32, {batch, 1, heads, d});
  q.fill_normal(rng);
  kc.fill_normal(rng);
  vc.fill_normal(rng);
  DecodeArgs a;
  a.q = q.view();
  a.k_cache = kc.view();
  a.v_cache = vc.view();
  a.out = out.view();
  a.options.backend = Backend::cpu_flash;
  a.options.num_splits = 4;
  decode(a);  // warm-up
  EXPECT_GT(workspace_size(a), 0u);
  EXPECT_EQ(peak_extra([&] { decode(a); }), workspace_size(a));
  set_num_threads(0);
}

}  // namespace
}  // namespace tileattn::test
