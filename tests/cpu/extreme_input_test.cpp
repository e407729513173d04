// Extreme but valid calls: loose varlen bounds up to INT_MAX, windows near INT_MAX, split counts
// far beyond the keys, huge strides on size-one dimensions, empty calls over huge batches, and
// extreme option values. Each computes what the tight call computes (bitwise on the flash path) or
// what the fp64 reference computes, with scratch bounded by the real lengths.
#include <gtest/gtest.h>

#include <climits>
#include <vector>

#include "attention_case.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

Case varlen_case(DType dtype) {
  Case c;
  c.dtype = dtype;
  c.batch = 3;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.hdim = c.hdim_v = 32;
  c.varlen = true;
  c.lens_q = {5, 0, 70};
  c.lens_k = {12, 3, 90};
  c.seqlen_q = 70;
  c.seqlen_k = 90;
  c.options.backend = Backend::cpu_flash;
  return c;
}

TEST(ExtremeInput, VarlenBoundsUpToIntMaxComputeTheTightCall) {
  std::mt19937_64 rng(fresh_seed());
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool causal : {false, true}) {
      Case c = varlen_case(dtype);
      c.options.causal = causal;
      CaseTensors t(c, rng);
      const ForwardArgs tight = t.forward(c);
      forward(tight);
      const std::vector<double> out = t.out.to_f64(), lse = t.lse.to_f64();
      backward(t.backward(c));
      const std::vector<double> dq = t.dq.to_f64(), dk = t.dk.to_f64();
      ForwardArgs loose = tight;
      loose.max_seqlen_q = loose.max_seqlen_k = INT_MAX;
      // A window reaching past INT_MAX - 1 keys is no window at all.
      loose.options.window_left = INT_MAX - 1;
      if (!causal) loose.options.window_right = INT_MAX - 1;
      EXPECT_EQ(workspace_size(loose), workspace_size(tight));
      t.out.poison();
      t.lse.poison();
      forward(loose);
      EXPECT_EQ(t.out.to_f64(), out);
      EXPECT_EQ(t.lse.to_f64(), lse);
      BackwardArgs b = t.backward(c);
      b.max_seqlen_q = b.max_seqlen_k = INT_MAX;
      EXPECT_EQ(workspace_size(b), workspace_size(t.backward(c)));
      t.dq.poison();
      backward(b);
      EXPECT_EQ(t.dq.to_f64(), dq);
      EXPECT_EQ(t.dk.to_f64(), dk);
    }
  }
}

TEST(ExtremeInput, LooseKeyBoundDoesNotSizeTheCopies) {
  // BSHD-packed keys are copied per (sequence, KV head): 12 real keys under a bound of 2^26.
  std::mt19937_64 rng(fresh_seed());
  Case c = varlen_case(DType::bf16);
  c.lens_q = {200};
  c.lens_k = {12};
  c.batch = 1;
  c.seqlen_q = 200;
  c.seqlen_k = 12;
  CaseTensors t(c, rng);
  ForwardArgs a = t.forward(c);
  a.max_seqlen_k = 1 << 26;
  EXPECT_LT(workspace_size(a), std::size_t{1} << 20);
}

TEST(ExtremeInput, BackwardScratchFollowsTheRealRows) {
  // 64 one-token sequences: one query tile each, not one per 64 packed rows plus one per sequence.
  std::mt19937_64 rng(fresh_seed());
  Case c = varlen_case(DType::f32);
  c.batch = 64;
  c.lens_q.assign(64, 1);
  c.lens_k.assign(64, 1);
  c.seqlen_q = c.seqlen_k = 1;
  CaseTensors t(c, rng);
  const std::size_t ws = workspace_size(t.backward(c));
  Case d = c;
  d.batch = 1;
  d.lens_q = {1};
  d.lens_k = {1};
  CaseTensors u(d, rng);
  EXPECT_LE(ws, 64 * workspace_size(u.backward(d)));
  // And a one-row tile packs 16 lanes (f32), not 64: a quarter of the scratch of 64-row sequences.
  Case full = c;
  full.lens_q.assign(64, 64);
  full.seqlen_q = 64;
  CaseTensors w(full, rng);
  EXPECT_LE(4 * ws, workspace_size(w.backward(full)));
}

TEST(ExtremeInput, SplitCountFarBeyondTheKeys) {
  std::mt19937_64 rng(fresh_seed());
  HostTensor q(DType::f32, {2, 1, 4, 32}), kc(DType::f32, {2, 8, 2, 32}), vc(DType::f32, {2, 8, 2, 32});
  HostTensor out(DType::f32, {2, 1, 4, 32}), ref(DType::f32, {2, 1, 4, 32});
  for (HostTensor* x : {&q, &kc, &vc}) x->fill_normal(rng);
  DecodeArgs a;
  a.q = q.view(), a.k_cache = kc.view(), a.v_cache = vc.view(), a.out = out.view();
  a.options.num_splits = 1 << 20;
  EXPECT_LT(workspace_size(a), std::size_t{1} << 16);
  decode(a);
  a.out = ref.view();
  a.options.backend = Backend::cpu_reference;
  decode(a);
  EXPECT_LT(f32_error(out.to_f64(), ref.to_f64()), 1e-5);
}

TEST(ExtremeInput, EmptyCallsOverHugeBatchesAllocateNothing) {
  std::vector<float> one(64, 0.5f);
  const std::int64_t batch = std::int64_t{1} << 20, heads = 1 << 12;
  // q and out hold no rows; k and v are stride-0 views of one small buffer.
  TensorView q = view(one.data(), DType::f32, {batch, 0, heads, 8});
  TensorView out = view(one.data(), DType::f32, {batch, 0, heads, 8});
  TensorView k = view(one.data(), DType::f32, {batch, 5, heads, 8}, {0, 0, 0, 1});
  ForwardArgs f;
  f.q = q, f.k = k, f.v = k, f.out = out;
  EXPECT_EQ(workspace_size(f), 0u);
  reset_peak_memory();
  const std::size_t before = memory_stats().current_bytes;
  forward(f);
  EXPECT_EQ(memory_stats().peak_bytes, before);

  DecodeArgs d;
  d.q = q, d.out = out, d.k_cache = k, d.v_cache = k;
  d.options.num_splits = 1 << 20;
  EXPECT_EQ(workspace_size(d), 0u);
  decode(d);
  EXPECT_EQ(memory_stats().peak_bytes, before);
}

TEST(ExtremeInput, BackwardWithoutQueryRowsZeroesKeyGradients) {
  std::mt19937_64 rng(fresh_seed());
  Case c;
  c.batch = 3;
  c.heads_q = 2;
  c.seqlen_q = 0;
  c.seqlen_k = 70;
  c.hdim = c.hdim_v = 16;
  c.options.backend = Backend::cpu_flash;
  CaseTensors t(c, rng);
  t.dk.poison();
  t.dv.poison();
  const BackwardArgs b = t.backward(c);
  EXPECT_EQ(workspace_size(b), 0u);
  backward(b);
  for (double x : t.dk.to_f64()) ASSERT_EQ(x, 0.0);
  for (double x : t.dv.to_f64()) ASSERT_EQ(x, 0.0);
}

TEST(ExtremeInput, HugeStrideOnSizeOneDimension) {
  std::mt19937_64 rng(fresh_seed());
  Case c;
  c.batch = 1;
  c.heads_q = 2;
  c.seqlen_q = 33;
  c.seqlen_k = 40;
  c.hdim = c.hdim_v = 16;
  c.options.backend = Backend::cpu_flash;
  CaseTensors t(c, rng);
  forward(t.forward(c));
  const std::vector<double> out = t.out.to_f64();
  ForwardArgs a = t.forward(c);
  a.q.stride[0] = a.k.stride[0] = a.out.stride[0] = std::int64_t{1} << 61;  // batch 1: never stepped
  t.out.poison();
  forward(a);
  EXPECT_EQ(t.out.to_f64(), out);
}

// Option values at the edge of what the fp32 kernels can hold, against the fp64 reference.
TEST(ExtremeInput, ExtremeOptionValuesMatchTheReference) {
  std::mt19937_64 rng(fresh_seed());
  struct Edge {
    const char* what;
    float scale, softcap, slope;
    double q_scale;  // q multiplied by this, so that scale * q.k stays in range
  };
  for (const Edge& e : {Edge{"scale 1e30", 1e30f, 0.f, 0.f, 1e-30}, Edge{"scale 1e-30", 1e-30f, 0.f, 0.f, 1e29},
                        Edge{"scale -0.5", -0.5f, 0.f, 0.f, 1.0}, Edge{"scale 0", 0.f, 0.f, 0.f, 1.0},
                        Edge{"softcap 1e-3", 0.3f, 1e-3f, 0.f, 1.0}, Edge{"softcap 1e30", 0.3f, 1e30f, 0.f, 1.0},
                        Edge{"slope 1e3", 0.3f, 0.f, 1e3f, 1.0}, Edge{"slope -2", 0.3f, 0.f, -2.f, 1.0}}) {
    SCOPED_TRACE(e.what);
    Case c;
    c.batch = 2;
    c.heads_q = 2;
    c.seqlen_q = 70;
    c.seqlen_k = 90;
    c.hdim = c.hdim_v = 16;
    c.alibi = e.slope != 0.f;
    c.options.scale = e.scale;
    c.options.softcap = e.softcap;
    c.options.causal = true;
    c.options.backend = Backend::cpu_flash;
    CaseTensors t(c, rng);
    std::vector<double> q = t.q.to_f64();
    for (double& x : q) x *= e.q_scale;
    t.q.from_f64(q);
    if (c.alibi) t.slopes.fill(e.slope);
    forward(t.forward(c));
    const std::vector<double> out = t.out.to_f64(), lse = t.lse.to_f64();
    c.options.backend = Backend::cpu_reference;
    forward(t.forward(c));
    EXPECT_LT(f32_error(out, t.out.to_f64()), 1e-5);
    EXPECT_LT(f32_error(lse, t.lse.to_f64()), 1e-5);
  }
}

}  // namespace
}  // namespace tileattn::test
