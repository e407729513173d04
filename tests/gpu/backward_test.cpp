// The cuda backward kernels against the fp64 oracle's gradients (DESIGN.md tolerance rule, with
// the baseline standard attention in the input dtype), and what the oracle cannot show: masked
// rows and unseen keys get exact zeros, the deterministic mode is bitwise reproducible, and the
// inputs the kernels cannot take are rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/workspace.hpp"
#include "cpu/attention_case.hpp"
#include "cpu/reference.hpp"
#include "support/device_tensor.hpp"
#include "support/expect_rejected.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

class GpuBackward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

// Device copies of a case's tensors (gradients poisoned) and the cuda backward call on them.
struct OnDevice {
  DeviceTensor q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k, slopes;

  OnDevice(const Case& c, const CaseTensors& t)
      : q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse), dout(t.dout), dq(t.dq), dk(t.dk), dv(t.dv) {
    if (c.varlen) {
      cu_q = DeviceTensor(t.cu_q);
      cu_k = DeviceTensor(t.cu_k);
    }
    if (c.alibi) slopes = DeviceTensor(t.slopes);
  }

  BackwardArgs args(const Case& c, const CaseTensors& t) const {
    BackwardArgs a = t.backward(c);
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    if (c.varlen) {
      a.cu_seqlens_q = cu_q.view();
      a.cu_seqlens_k = cu_k.view();
    }
    if (c.alibi) a.alibi_slopes = slopes.view();
    a.options.backend = Backend::cuda;
    return a;
  }

  // backward(a) on these tensors, its gradients read back into t.
  Grads run(const BackwardArgs& a, CaseTensors& t) const {
    backward(a);
    device_synchronize();
    dq.to_host(t.dq);
    dk.to_host(t.dk);
    dv.to_host(t.dv);
    return {t.dq.to_f64(), t.dk.to_f64(), t.dv.to_f64()};
  }
};

// The reference's forward (out, lse) in t, so that every backend differentiates the same one.
void reference_forward(const Case& c, CaseTensors& t) {
  ForwardArgs f = t.forward(c);
  f.options.backend = Backend::cpu_reference;
  forward(f);
}

Grads gpu_backward(const Case& c, CaseTensors& t) {
  t.dq.poison();
  t.dk.poison();
  t.dv.poison();
  const OnDevice d(c, t);
  return d.run(d.args(c, t), t);
}

// Two runs of one call: the same gradients, bitwise in the deterministic mode; in the default mode,
// whose atomics' order varies, dq as close as that allows (and exactly 0 where the first run's is).
void expect_same_call(const Grads& got, const Grads& first, bool deterministic) {
  EXPECT_EQ(got.dk, first.dk);
  EXPECT_EQ(got.dv, first.dv);
  if (deterministic) {
    EXPECT_EQ(got.dq, first.dq);
    return;
  }
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.dq.size(); ++i) {
    worst = std::max(worst, std::abs(got.dq[i] - first.dq[i]));
    scale = std::max(scale, std::abs(first.dq[i]));
    if (first.dq[i] == 0) EXPECT_EQ(got.dq[i], 0.0) << "dq element " << i;
  }
  EXPECT_LE(worst, scale / 64) << "largest dq difference";
}

Grads reference_backward(const Case& c, CaseTensors& t, cpu::RefPrecision prec) {
  t.dq.poison();
  t.dk.poison();
  t.dv.poison();
  BackwardArgs a = t.backward(c);
  a.options.backend = Backend::cpu_reference;
  cpu::reference_backward(validate(a), a, prec);
  return {t.dq.to_f64(), t.dk.to_f64(), t.dv.to_f64()};
}

// Runs the cuda backward on a fresh draw of case c and checks dq, dk, dv against the oracle.
Grads check_case(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + c.str());
  std::mt19937_64 rng(seed);
  CaseTensors t(c, rng);
  reference_forward(c, t);
  const Grads got = gpu_backward(c, t);
  EXPECT_TRUE(all_finite(got.dq) && all_finite(used_rows(c, got.dk, c.heads_kv * c.hdim)) &&
              all_finite(used_rows(c, got.dv, c.heads_kv * c.hdim_v)))
      << "a gradient has a NaN or Inf";
  const Grads ref = reference_backward(c, t, cpu::RefPrecision::f64);
  const Grads base = reference_backward(c, t, cpu::RefPrecision::input_dtype);
  const std::int64_t kr = c.heads_kv * c.hdim, vr = c.heads_kv * c.hdim_v;
  const BackwardFloors fl = backward_floors(c, t);
  EXPECT_TRUE(close_to_oracle(c.dtype, got.dq, ref.dq, [&] { return base.dq; }, fl.dq)) << "dq";
  EXPECT_TRUE(close_to_oracle(c.dtype, used_rows(c, got.dk, kr), used_rows(c, ref.dk, kr),
                              [&] { return used_rows(c, base.dk, kr); }, fl.dk))
      << "dk";
  EXPECT_TRUE(close_to_oracle(c.dtype, used_rows(c, got.dv, vr), used_rows(c, ref.dv, vr),
                              [&] { return used_rows(c, base.dv, vr); }))
      << "dv";
  return got;
}

Case base_case(DType t, int sq, int sk, int hdim) {
  Case c;
  c.dtype = t;
  c.batch = 2;
  c.heads_q = c.heads_kv = 2;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.hdim = c.hdim_v = hdim;
  c.options.backend = Backend::cuda;
  return c;
}

TEST_F(GpuBackward, EveryHeadDimAndDtype) {
  const std::uint64_t seed = fresh_seed();
  for (DType t : {DType::f16, DType::bf16})
    for (int d : {64, 96, 128, 192, 256}) {
      Case c = base_case(t, 200, 333, d);
      check_case(c, seed + d);
      c.options.causal = true;
      check_case(c, seed + d + 1);
      if (HasFailure()) return;
    }
}

// One small case of each Hopper backward kernel, in both modes, for the sanitizer's racecheck,
// synccheck and initcheck (scripts/gpu/30-sanitize.sh): 128-row tiles (64), 64-row ones with dQ
// staged in buffers of its own (128), 96-key tiles with V's own head dim (192/128), and the split
// head dim with dQ staged in the consumed stage (192, 256). Causal GQA, sizes no multiple of a tile
// (the last query tile of 150 rows holds 22, under half of a 64-row tile); then varlen, whose tiles
// past a sequence's end have their rows zeroed in the stage.
TEST_F(GpuBackward, SmallCaseOfEachHopperKernel) {
  const std::uint64_t seed = fresh_seed();
  for (auto [d, dv] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{192, 128}, std::pair{192, 192},
                       std::pair{256, 256}}) {
    Case c = base_case(DType::bf16, 150, 210, d);
    c.hdim_v = dv;
    c.batch = 1;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.options.causal = true;
    check_case(c, seed + d + dv);
    c.options.deterministic = true;
    check_case(c, seed + d + dv + 1);
    c.batch = 3;
    c.varlen = true;
    c.lens_q = {150, 0, 100};
    c.lens_k = {120, 40, 210};
    c.options.deterministic = false;
    check_case(c, seed + d + dv + 2);
    if (HasFailure()) return;
  }
}

// Value head dims below the query/key one: 192/128 as DeepSeek's attention has it (on Hopper, 96-key
// tiles with 128-column V and dO tiles, dK and dV transposed), 176/96 padded within them, 192/160 on
// the kernel with 192-column V tiles; key lengths that are no multiple of a key tile; causal GQA, then
// varlen with a sequence that ends inside a query tile (its dO rows zeroed) and one shorter than a key
// tile.
TEST_F(GpuBackward, ValueHeadDimBelowQueryKeyHeadDim) {
  const std::uint64_t seed = fresh_seed();
  for (auto [d, dv, sk] : {std::tuple{192, 128, 457}, std::tuple{192, 128, 1100}, std::tuple{176, 96, 457},
                           std::tuple{176, 96, 1100}, std::tuple{192, 160, 457}}) {
    Case c = base_case(DType::bf16, 300, sk, d);
    c.hdim_v = dv;
    check_case(c, seed + d + dv + sk);
    c.heads_q = 4;
    c.options.causal = true;
    check_case(c, seed + d + dv + sk + 1);
    c.dtype = DType::f16;
    c.varlen = true;
    c.batch = 3;
    c.lens_q = {77, 200, 31};
    c.lens_k = {130, sk, 40};
    c.seqlen_q = 200;
    c.seqlen_k = sk;
    check_case(c, seed + d + dv + sk + 2);
    c.options.deterministic = true;  // on Hopper the 96-key kernel, dQ added in turn
    check_case(c, seed + d + dv + sk + 3);
    if (HasFailure()) return;
  }
}

// Random draws over every feature at once (masks, softcap, ALiBi, dropout, GQA, varlen with empty
// sequences, strided views, hdim_v != hdim_qk), on odd sizes.
TEST_F(GpuBackward, RandomSweep) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 60; ++it) {
    Case c = random_case(rng, 300);
    c.options.chunk_size = 0;  // chunks and document ids: variant_test.cpp
    c.documents = false;
    c.dtype = std::bernoulli_distribution(0.5)(rng) ? DType::bf16 : DType::f16;
    c.options.backend = Backend::cuda;
    check_case(c, rng());
    if (HasFailure()) {
      std::cout << "sweep seed " << seed << ", case " << it << "\n";
      return;
    }
  }
}

// Many key and query tiles, GQA groups of 4 summed into dK and dV, both modes; head dim 256 (on
// Hopper, warpgroups splitting the head dim) with a softcap, in both modes.
TEST_F(GpuBackward, LongSequencesGqaAndDeterministicMode) {
  const std::uint64_t seed = fresh_seed();
  Case c = base_case(DType::bf16, 700, 900, 128);
  c.batch = 1;
  c.heads_q = 8;
  c.heads_kv = 2;
  check_case(c, seed);
  c.options.causal = true;
  check_case(c, seed + 1);
  c.options.deterministic = true;
  check_case(c, seed + 2);
  c = base_case(DType::f16, 650, 650, 64);
  c.options.window_left = 150;
  c.options.window_right = 20;
  check_case(c, seed + 3);
  c.options.deterministic = true;
  c.options.softcap = 8.f;
  check_case(c, seed + 4);
  c = base_case(DType::bf16, 390, 530, 256);
  c.batch = 1;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.options.causal = true;
  c.options.softcap = 10.f;
  check_case(c, seed + 5);
  c.options.deterministic = true;  // on Hopper dQ staged in the consumed Q and dO stage, added in turn
  check_case(c, seed + 6);
}

// options.deterministic: three runs give bitwise the same gradients, with many key blocks adding
// into each query tile's dQ (GQA groups of 4 at head dim 128, a window at 64, 192/128's kernel).
TEST_F(GpuBackward, DeterministicModeIsBitwiseReproducible) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (auto [d, dv] : {std::pair{64, 64}, std::pair{96, 96}, std::pair{128, 128}, std::pair{192, 192},
                       std::pair{192, 128}, std::pair{256, 256}}) {
    Case c = base_case(DType::bf16, 517, 1771, d);
    c.hdim_v = dv;
    c.heads_q = 8;
    c.heads_kv = d == 128 ? 2 : 8;
    c.options.causal = d != 128;
    if (d == 64) c.options.window_left = 400;
    c.options.deterministic = true;
    CaseTensors t(c, rng);
    reference_forward(c, t);
    const Grads first = gpu_backward(c, t);
    for (int run = 1; run < 3; ++run) {
      const Grads again = gpu_backward(c, t);
      EXPECT_EQ(again.dq, first.dq) << "d " << d << "/" << dv << " run " << run;
      EXPECT_EQ(again.dk, first.dk) << "d " << d << "/" << dv << " run " << run;
      EXPECT_EQ(again.dv, first.dv) << "d " << d << "/" << dv << " run " << run;
    }
  }
}

// Rows that see no key get dq = 0 and keys no row sees get dk = dv = 0, exactly; no NaN.
TEST_F(GpuBackward, MaskedRowsAndUnseenKeysGetZeroGradients) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Bottom-right causal, seqlen_q 300 > seqlen_k 100: rows 0..199 see no key.
  Case c = base_case(DType::bf16, 300, 100, 64);
  c.batch = 1;
  c.options.causal = true;
  const Grads g = check_case(c, rng());
  for (int i = 0; i < 200; ++i)
    for (int h = 0; h < c.heads_q; ++h)
      for (int x = 0; x < c.hdim; ++x) ASSERT_EQ(g.dq[(i * c.heads_q + h) * c.hdim + x], 0.0) << "row " << i;
  // Top-left window (0, 0) with seqlen_k 260 > seqlen_q 130: keys 130.. are seen by no row.
  Case w = base_case(DType::f16, 130, 260, 64);
  w.batch = 1;
  w.options.align = MaskAlign::top_left;
  w.options.window_left = 0;
  w.options.window_right = 0;
  const Grads gw = check_case(w, rng());
  for (int j = 130; j < 260; ++j)
    for (int x = 0; x < w.heads_kv * w.hdim; ++x) {
      ASSERT_EQ(gw.dk[j * w.heads_kv * w.hdim + x], 0.0) << "key " << j;
      ASSERT_EQ(gw.dv[j * w.heads_kv * w.hdim_v + x], 0.0) << "key " << j;
    }
  // No key at all.
  Case e = base_case(DType::bf16, 70, 0, 64);
  check_case(e, rng());
}

// Dropout's gradients use the forward's Philox mask, regenerated: they match the oracle's, which
// draws the same mask.
TEST_F(GpuBackward, DropoutMatchesTheOracle) {
  const std::uint64_t seed = fresh_seed();
  for (float p : {0.1f, 0.5f}) {
    Case c = base_case(DType::bf16, 333, 250, 128);
    c.heads_q = 4;
    c.options.dropout_p = p;
    c.options.seed = seed;
    c.options.offset = seed >> 7;
    check_case(c, seed + 1);
    c.options.causal = true;
    c.options.deterministic = true;
    check_case(c, seed + 2);
  }
}

// Varlen with empty sequences on either side, and logits large enough to make P nearly one-hot.
TEST_F(GpuBackward, VarlenWithEmptySequencesAndLargeLogits) {
  const std::uint64_t seed = fresh_seed();
  Case c = base_case(DType::f16, 0, 0, 64);
  c.batch = 5;
  c.varlen = true;
  c.lens_q = {150, 0, 77, 200, 1};
  c.lens_k = {190, 60, 0, 200, 129};
  c.seqlen_q = 200;
  c.seqlen_k = 200;
  check_case(c, seed);
  c.options.causal = true;
  c.options.deterministic = true;
  check_case(c, seed + 1);

  Case big = base_case(DType::bf16, 190, 230, 64);
  big.options.scale = 8.f;  // logits of +-1e3 and more
  check_case(big, seed + 2);
}

// A caller's workspace at any address: the call starts its scratch (D = rowsum(dO * O), and the
// fp32 dQ accumulator its atomics add into) at the buffer's first 256-byte boundary, within the
// room workspace_size leaves, so the gradients are those of the library's own allocation.
TEST_F(GpuBackward, TakesAWorkspaceAtAnyAlignment) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (bool deterministic : {true, false}) {
    Case c = base_case(DType::bf16, 300, 411, 128);
    c.options.deterministic = deterministic;
    CaseTensors t(c, rng);
    reference_forward(c, t);
    const Grads own = gpu_backward(c, t);
    OnDevice d(c, t);
    BackwardArgs a = d.args(c, t);
    const std::size_t bytes = workspace_size(a);
    ASSERT_GT(bytes, 0u);
    DeviceBuffer buf(bytes + 512);
    for (std::size_t skew : {0, 1, 4, 255}) {
      SCOPED_TRACE("deterministic " + std::to_string(deterministic) + ", 256-byte boundary + " + std::to_string(skew));
      a.options.workspace = static_cast<char*>(buf.data()) + align_skip(buf.data(), 256) + skew;
      a.options.workspace_bytes = bytes;
      expect_same_call(d.run(a, t), own, deterministic);
    }
  }
}

// Nothing zeroes the fp32 dQ rows on Hopper (a tile's first key block stores, the others add), so
// a workspace full of NaN bytes must give the gradients of a fresh allocation: rows that see no
// key (bottom-right causal, seqlen_q > seqlen_k; a varlen sequence without keys), rows past the
// sequences' ends and tiles a sequence ends inside, in both modes.
TEST_F(GpuBackward, IgnoresWhatTheWorkspaceHeld) {
  const std::uint64_t seed = fresh_seed();
  Case causal = base_case(DType::bf16, 300, 170, 128);
  causal.options.causal = true;  // rows 0..129 see no key
  Case varlen = base_case(DType::bf16, 0, 0, 64);
  varlen.batch = 5;
  varlen.varlen = true;
  varlen.lens_q = {150, 0, 77, 200, 1};
  varlen.lens_k = {190, 60, 0, 200, 129};
  varlen.seqlen_q = varlen.seqlen_k = 200;
  for (Case c : {causal, varlen})
    for (bool deterministic : {true, false}) {
      c.options.deterministic = deterministic;
      SCOPED_TRACE("seed " + std::to_string(seed) + ": " + c.str());
      const Grads own = check_case(c, seed);
      std::mt19937_64 rng(seed);  // check_case's draw again
      CaseTensors t(c, rng);
      reference_forward(c, t);
      OnDevice d(c, t);
      BackwardArgs a = d.args(c, t);
      const std::size_t bytes = workspace_size(a);
      DeviceBuffer buf(bytes);
      buf.fill(0xff);
      a.options.workspace = buf.data();
      a.options.workspace_bytes = bytes;
      const Grads got = d.run(a, t);
      ASSERT_TRUE(all_finite(got.dq)) << "dq has a NaN or Inf";
      expect_same_call(got, own, deterministic);
    }
}

TEST_F(GpuBackward, RejectsWhatTheKernelCannotTake) {
  std::mt19937_64 rng(fresh_seed());
  Case c = base_case(DType::bf16, 64, 64, 64);
  CaseTensors t(c, rng);
  OnDevice d(c, t);
  BackwardArgs host_dq = d.args(c, t);
  host_dq.dq.data = t.dq.view().data;  // a host pointer labelled cuda
  expect_rejected([&] { backward(host_dq); }, {"dq = ", "host pointer"}, {});

  DeviceBuffer buf(t.dout.numel() * 2 + 64);
  BackwardArgs misaligned = d.args(c, t);
  misaligned.dout.data = static_cast<char*>(buf.data()) + 2;
  expect_rejected([&] { backward(misaligned); }, {"dout = ", "16-byte aligned"}, {});

  BackwardArgs no_lse = d.args(c, t);
  no_lse.lse = TensorView{};
  expect_rejected([&] { backward(no_lse); }, {"lse is required"}, {});
}

}  // namespace
}  // namespace tileattn::test
