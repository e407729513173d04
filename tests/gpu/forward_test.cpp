// The cuda forward kernel against the fp64 oracle (DESIGN.md tolerance rule, baseline: standard
// attention in the input dtype), plus the properties the oracle cannot show: masked rows, large
// logits, the exact dropout mask, strided views, determinism, and the inputs it must reject.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cpu/reference.hpp"
#include "support/device_tensor.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::DeviceTensor;
using test::HostTensor;

#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    if (const std::string why = test::gpu_unavailable(); !why.empty()) \
      GTEST_SKIP() << "GPU test skipped: " << why;                      \
  } while (0)

struct Case {
  DType dtype = DType::bf16;
  int batch = 1, seqlen_q = 64, seqlen_k = 64, heads_q = 2, heads_kv = 2, hdim_qk = 64, hdim_v = 64;
  bool varlen = false;
  bool bhsd = false;  // q, k, v, out stored [b, h, s, d] (strided views)
  bool causal = false;
  MaskAlign align = MaskAlign::bottom_right;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool alibi = false;
  float dropout_p = 0.f;
  double input_std = 1.0;

  std::string str() const {
    std::ostringstream os;
    os << dtype_name(dtype) << " b" << batch << " sq" << seqlen_q << " sk" << seqlen_k << " h" << heads_q << "/"
       << heads_kv << " d" << hdim_qk << "/" << hdim_v << (varlen ? " varlen" : "") << (bhsd ? " bhsd" : "")
       << (causal ? " causal" : "") << (align == MaskAlign::top_left ? " top-left" : "") << " window(" << window_left
       << "," << window_right << ") softcap " << softcap << (alibi ? " alibi" : "") << " dropout " << dropout_p
       << " std " << input_std;
    return os.str();
  }
};

// One problem's tensors on the host (inputs random, outputs poisoned) and their device copies.
struct Problem3 {
  Case c;
  HostTensor q, k, v, out, lse, cu_q, cu_k, slopes;
  int max_q = 0, max_k = 0;

  Problem3(const Case& cs, std::mt19937_64& rng) : c(cs) {
    const std::vector<int> order = c.bhsd ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{};
    if (c.varlen) {
      std::uniform_int_distribution<int> lq(0, c.seqlen_q), lk(0, c.seqlen_k);
      std::vector<std::int32_t> pq{0}, pk{0};
      for (int b = 0; b < c.batch; ++b) {
        const int a = lq(rng), bk = lk(rng);
        pq.push_back(pq.back() + a);
        pk.push_back(pk.back() + bk);
        max_q = std::max(max_q, a);
        max_k = std::max(max_k, bk);
      }
      cu_q = test::int_tensor(pq);
      cu_k = test::int_tensor(pk);
      q = HostTensor(c.dtype, {pq.back(), c.heads_q, c.hdim_qk});
      k = HostTensor(c.dtype, {pk.back(), c.heads_kv, c.hdim_qk});
      v = HostTensor(c.dtype, {pk.back(), c.heads_kv, c.hdim_v});
      out = HostTensor(c.dtype, {pq.back(), c.heads_q, c.hdim_v});
      lse = HostTensor(DType::f32, {c.heads_q, pq.back()});
    } else {
      q = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.heads_q, c.hdim_qk}, order);
      k = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.hdim_qk}, order);
      v = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.hdim_v}, order);
      out = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.heads_q, c.hdim_v}, order);
      lse = HostTensor(DType::f32, {c.batch, c.heads_q, c.seqlen_q});
    }
    q.fill_normal(rng, c.input_std);
    k.fill_normal(rng, c.input_std);
    v.fill_normal(rng);
    out.poison();
    lse.poison();
    if (c.alibi) {
      slopes = HostTensor(DType::f32, {c.heads_q});
      for (int h = 0; h < c.heads_q; ++h) slopes.set(h, std::pow(2.0, -8.0 * (h + 1) / c.heads_q));
    }
  }

  ForwardArgs args(const HostTensor& q_, const HostTensor& k_, const HostTensor& v_, const HostTensor& out_,
                   const HostTensor& lse_, const TensorView& cuq, const TensorView& cuk, const TensorView& al) const {
    ForwardArgs a;
    a.q = q_.view();
    a.k = k_.view();
    a.v = v_.view();
    a.out = out_.view();
    a.lse = lse_.view();
    a.cu_seqlens_q = cuq;
    a.cu_seqlens_k = cuk;
    a.max_seqlen_q = max_q;
    a.max_seqlen_k = max_k;
    a.alibi_slopes = al;
    a.options.causal = c.causal;
    a.options.align = c.align;
    a.options.window_left = c.window_left;
    a.options.window_right = c.window_right;
    a.options.softcap = c.softcap;
    a.options.dropout_p = c.dropout_p;
    a.options.seed = 0x1234abcd5678ull;
    a.options.offset = 77;
    return a;
  }

  ForwardArgs host_args(const HostTensor& out_, const HostTensor& lse_) const {
    return args(q, k, v, out_, lse_, c.varlen ? cu_q.view() : TensorView{}, c.varlen ? cu_k.view() : TensorView{},
                c.alibi ? slopes.view() : TensorView{});
  }

  // Runs the reference at a precision into fresh output tensors.
  void reference(cpu::RefPrecision prec, HostTensor& o, HostTensor& l) const {
    o = out;
    l = lse;
    ForwardArgs a = host_args(o, l);
    a.options.backend = Backend::cpu_reference;
    cpu::reference_forward(validate(a), a, prec);
  }
};

// The device side of a problem: copies of every tensor; run() calls the cuda backend.
struct OnDevice {
  DeviceTensor q, k, v, out, lse, cu_q, cu_k, slopes;
  const Problem3& p;
  explicit OnDevice(const Problem3& pr)
      : q(pr.q), k(pr.k), v(pr.v), out(pr.out), lse(pr.lse), p(pr) {
    if (pr.c.varlen) {
      cu_q = DeviceTensor(pr.cu_q);
      cu_k = DeviceTensor(pr.cu_k);
    }
    if (pr.c.alibi) slopes = DeviceTensor(pr.slopes);
  }
  ForwardArgs args() const {
    ForwardArgs a;
    const Case& c = p.c;
    a = p.host_args(p.out, p.lse);
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    if (c.varlen) {
      a.cu_seqlens_q = cu_q.view();
      a.cu_seqlens_k = cu_k.view();
    }
    if (c.alibi) a.alibi_slopes = slopes.view();
    a.options.backend = Backend::cuda;
    return a;
  }
  void run() const {
    forward(args());
    test::device_synchronize();
  }
};

double floor_for(DType t) { return t == DType::f16 ? 2e-4 : 1e-3; }

// Checks the device's out and lse of problem p against the oracle.
void expect_matches_oracle(const Problem3& p, const OnDevice& d) {
  HostTensor out = p.out, lse = p.lse;
  d.out.to_host(out);
  d.lse.to_host(lse);

  HostTensor o64, l64, olp, llp;
  p.reference(cpu::RefPrecision::f64, o64, l64);
  p.reference(cpu::RefPrecision::input_dtype, olp, llp);
  const auto got_o = out.to_f64(), got_l = lse.to_f64(), want_o = o64.to_f64();
  ASSERT_TRUE(test::all_finite(got_o)) << "out has a NaN or Inf";
  for (double x : got_l) ASSERT_FALSE(std::isnan(x) || x == INFINITY) << "lse has a NaN or +Inf";
  // The oracle's out is stored in the input dtype too: where the baseline happens to round like it
  // everywhere, its error is 0, and a result one rounding step away must still pass.
  const double floor = std::max(floor_for(p.c.dtype), test::ulp_at_max(p.c.dtype, want_o));
  const auto ro = test::check_rule(got_o, olp.to_f64(), want_o, floor);
  EXPECT_TRUE(ro.ok) << "out: " << ro.message;
  const auto rl = test::check_rule(got_l, llp.to_f64(), l64.to_f64(), 1e-3);
  EXPECT_TRUE(rl.ok) << "lse: " << rl.message;
}

// Runs one case on the GPU and checks out and lse against the oracle.
void check_case(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE("case: " + c.str() + ", seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Problem3 p(c, rng);
  OnDevice d(p);
  d.run();
  expect_matches_oracle(p, d);
}

class GpuForward : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

TEST_F(GpuForward, EveryHeadDimAndDtype) {
  const std::uint64_t seed = test::fresh_seed();
  for (DType t : {DType::f16, DType::bf16})
    for (int d : {64, 96, 128, 192, 256}) {
      Case c;
      c.dtype = t;
      c.hdim_qk = c.hdim_v = d;
      c.seqlen_q = 200;
      c.seqlen_k = 333;
      check_case(c, seed + d);
    }
}

// Random draws over every feature at once, on odd sizes.
TEST_F(GpuForward, RandomSweep) {
  const std::uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 40; ++it) {
    Case c;
    c.dtype = pick(0, 1) ? DType::bf16 : DType::f16;
    c.batch = pick(1, 3);
    c.heads_kv = pick(1, 2);
    c.heads_q = c.heads_kv * pick(1, 3);
    c.hdim_qk = 8 * pick(1, 32);
    c.hdim_v = pick(0, 2) ? c.hdim_qk : 8 * pick(1, 32);
    c.seqlen_q = pick(1, 300);
    c.seqlen_k = pick(0, 4) ? pick(1, 300) : c.seqlen_q;
    c.varlen = pick(0, 3) == 0;
    c.bhsd = !c.varlen && pick(0, 3) == 0;
    switch (pick(0, 3)) {
      case 0: break;
      case 1: c.causal = true; break;
      case 2: c.window_left = pick(0, 100); c.window_right = pick(-1, 50); break;
      default: c.causal = true; c.window_left = pick(0, 100); break;
    }
    c.align = pick(0, 2) ? MaskAlign::bottom_right : MaskAlign::top_left;
    if (pick(0, 3) == 0) c.softcap = 0.5f * pick(1, 60);
    c.alibi = pick(0, 3) == 0;
    if (pick(0, 4) == 0) c.dropout_p = 0.1f * pick(1, 8);
    check_case(c, rng());
    if (HasFailure()) break;
  }
  if (HasFailure()) std::cout << "sweep seed " << seed << "\n";
}

TEST_F(GpuForward, LongSequencesAndGqa) {
  const std::uint64_t seed = test::fresh_seed();
  Case c;
  c.seqlen_q = 1000;
  c.seqlen_k = 1500;
  c.heads_q = 4;
  c.heads_kv = 1;
  c.hdim_qk = c.hdim_v = 128;
  check_case(c, seed);
  c.causal = true;
  check_case(c, seed + 1);
  c.dtype = DType::f16;
  c.hdim_qk = c.hdim_v = 64;
  c.window_left = 200;
  c.window_right = 30;
  c.causal = false;
  check_case(c, seed + 2);
  // Head dim 64 over 2k keys, causal with ragged tiles, then with a narrower V (the
  // column-checked variant) and softcap (the modifiers' variant).
  Case d;
  d.seqlen_q = 333;
  d.seqlen_k = 2333;
  d.heads_q = 6;
  d.heads_kv = 2;
  d.causal = true;
  check_case(d, seed + 3);
  d.hdim_v = 40;
  d.softcap = 30.f;
  check_case(d, seed + 4);
}

// Value head dims below the query/key one: 192/128 as DeepSeek's attention has it (on Hopper its own
// kernel, 128-column V and O), 176/96 padded within it, 192/160 on the wide kernel; causal GQA over
// several key tiles, varlen (a V tile past a sequence's end zeroed), and a softcap (the modifiers'
// kernel, V padded).
TEST_F(GpuForward, ValueHeadDimBelowQueryKeyHeadDim) {
  const std::uint64_t seed = test::fresh_seed();
  for (auto [d, dv] : {std::pair{192, 128}, std::pair{176, 96}, std::pair{192, 160}}) {
    Case c;
    c.hdim_qk = d;
    c.hdim_v = dv;
    c.seqlen_q = 300;
    c.seqlen_k = 757;
    c.heads_q = 4;
    c.heads_kv = 2;
    check_case(c, seed + d + dv);
    c.causal = true;
    c.dtype = DType::f16;
    check_case(c, seed + d + dv + 1);
    c.batch = 3;
    c.varlen = true;
    check_case(c, seed + d + dv + 2);
    c.softcap = 20.f;
    check_case(c, seed + d + dv + 3);
  }
}

// More work tiles than the GPU has multiprocessors: the Hopper kernel's persistent blocks each walk
// several tiles through their K/V pipeline and Q buffer (head dims 64 and 128 with O's own
// buffer, 192 and 256 through Q's), with GQA, causal masks and varlen sequences.
TEST_F(GpuForward, MoreTilesThanMultiprocessors) {
  const std::uint64_t seed = test::fresh_seed();
  Case c;
  c.batch = 2;
  c.heads_q = 16;
  c.heads_kv = 4;
  c.seqlen_q = 600;
  c.seqlen_k = 700;
  c.hdim_qk = c.hdim_v = 128;
  check_case(c, seed);  // 5 query tiles x 2 x 16 heads = 160 tiles
  c.causal = true;
  c.dtype = DType::f16;
  c.hdim_qk = c.hdim_v = 64;
  check_case(c, seed + 1);
  Case v;
  v.varlen = true;
  v.batch = 12;
  v.heads_q = v.heads_kv = 12;
  v.seqlen_q = 500;
  v.seqlen_k = 520;
  v.hdim_qk = v.hdim_v = 256;
  v.causal = true;
  check_case(v, seed + 2);  // up to 4 query tiles x 12 x 12 heads
  v.hdim_qk = v.hdim_v = 192;
  v.causal = false;
  v.window_left = 150;
  v.window_right = 40;
  check_case(v, seed + 3);
  // Head dim 64 over 2k query rows: the kernel with three consumer warpgroups.
  Case t;
  t.seqlen_q = 2100;
  t.seqlen_k = 1900;
  t.heads_q = 4;
  t.heads_kv = 2;
  check_case(t, seed + 4);
}

// Packed k and v may hold rows past the last sequence (cu_seqlens_k[batch] < rows). Whatever
// they hold (NaN here) must not reach an output, although a key tile that ends past a sequence's
// last key reads them.
TEST_F(GpuForward, VarlenIgnoresRowsPastTheLastSequence) {
  const std::uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int d : {64, 128, 256}) {
    Case c;
    c.varlen = true;
    c.batch = 3;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.seqlen_q = 150;
    c.seqlen_k = 170;
    c.hdim_qk = c.hdim_v = d;
    SCOPED_TRACE("case: " + c.str() + ", seed " + std::to_string(seed));
    Problem3 p(c, rng);
    const std::int64_t rows = p.k.shape()[0];
    HostTensor k(c.dtype, {rows + 40, c.heads_kv, d}), v(c.dtype, {rows + 40, c.heads_kv, d});
    k.poison();
    v.poison();
    for (std::int64_t i = 0; i < p.k.numel(); ++i) {
      k.set(i, p.k.get(i));
      v.set(i, p.v.get(i));
    }
    OnDevice on(p);
    const DeviceTensor dk(k), dv(v);
    ForwardArgs a = on.args();
    a.k = dk.view();
    a.v = dv.view();
    forward(a);
    test::device_synchronize();
    expect_matches_oracle(p, on);
  }
}

// seqlen_q > seqlen_k with bottom-right causal leaves the first rows without keys: out = 0,
// lse = -inf, no NaN; a window can empty rows in the middle of a tile too.
TEST_F(GpuForward, RowsWithoutKeys) {
  const std::uint64_t seed = test::fresh_seed();
  Case c;
  c.seqlen_q = 300;
  c.seqlen_k = 100;
  c.causal = true;
  check_case(c, seed);
  c.seqlen_k = 0;
  check_case(c, seed + 1);
  c.seqlen_k = 100;
  c.causal = false;
  c.window_left = 0;
  c.window_right = 0;
  c.align = MaskAlign::top_left;
  check_case(c, seed + 2);  // rows >= 100 see nothing

  std::mt19937_64 rng(seed);
  Case e;
  e.seqlen_q = 300;
  e.seqlen_k = 100;
  e.causal = true;
  Problem3 p(e, rng);
  OnDevice d(p);
  d.run();
  HostTensor out = p.out, lse = p.lse;
  d.out.to_host(out);
  d.lse.to_host(lse);
  // Row i sees keys j <= i - 200: rows 0..199 see none.
  for (int h = 0; h < e.heads_q; ++h)
    for (int i = 0; i < 200; ++i) {
      ASSERT_EQ(lse.get(h * e.seqlen_q + i), -INFINITY) << "row " << i;
      for (int x = 0; x < e.hdim_v; ++x) ASSERT_EQ(out.get((i * e.heads_q + h) * e.hdim_v + x), 0.0) << "row " << i;
    }
}

// Logits of about +-1e4 must not overflow the running max or sum.
TEST_F(GpuForward, LargeLogits) {
  const std::uint64_t seed = test::fresh_seed();
  Case c;
  c.seqlen_q = 130;
  c.seqlen_k = 190;
  c.input_std = 30.0;  // |q.k| * scale reaches 1e4 with d = 64
  check_case(c, seed);
  c.causal = true;
  c.dtype = DType::f16;
  c.input_std = 12.0;  // f16 inputs stay in range
  check_case(c, seed + 1);
}

// With V = identity, out[i, j] = P_ij * keep_ij / (1 - p): its zeros are exactly the dropped keys.
TEST_F(GpuForward, DropoutMaskIsThePhiloxMask) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Case c;
  c.batch = 2;
  c.heads_q = c.heads_kv = 2;
  c.seqlen_q = 150;
  c.seqlen_k = 64;
  c.hdim_qk = 64;
  c.hdim_v = 64;
  c.dropout_p = 0.3f;
  c.input_std = 0.3;
  Problem3 p(c, rng);
  for (std::int64_t i = 0; i < p.v.numel(); ++i)  // v[b, s, h, x] = (s == x)
    p.v.set(i, (i / (c.hdim_v * c.heads_kv)) % c.seqlen_k == i % c.hdim_v ? 1.0 : 0.0);
  OnDevice d(p);
  ForwardArgs a = d.args();
  forward(a);
  test::device_synchronize();
  HostTensor out = p.out;
  d.out.to_host(out);
  const Dropout drop(c.dropout_p, a.options.seed, a.options.offset);
  std::int64_t dropped = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.seqlen_q; ++i)
      for (int h = 0; h < c.heads_q; ++h)
        for (int j = 0; j < c.seqlen_k; ++j) {
          const bool keep = drop.keep(static_cast<std::uint32_t>(b * c.heads_q + h), i, j);
          const double o = out.get(((static_cast<std::int64_t>(b) * c.seqlen_q + i) * c.heads_q + h) * c.hdim_v + j);
          ASSERT_EQ(o != 0.0, keep) << "b " << b << " h " << h << " i " << i << " j " << j << " out " << o;
          dropped += !keep;
        }
  EXPECT_GT(dropped, 0);
  check_case(c, seed + 1);  // and the values against the oracle's dropout
}

TEST_F(GpuForward, StridedViews) {
  const std::uint64_t seed = test::fresh_seed();
  Case c;
  c.bhsd = true;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seqlen_q = 177;
  c.seqlen_k = 250;
  c.hdim_qk = c.hdim_v = 128;
  c.causal = true;
  check_case(c, seed);
}

TEST_F(GpuForward, Deterministic) {
  const std::uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  Case c;
  c.seqlen_q = c.seqlen_k = 700;
  c.causal = true;
  c.dropout_p = 0.2f;
  Problem3 p(c, rng);
  OnDevice d(p);
  d.run();
  HostTensor o1 = p.out, o2 = p.out, l1 = p.lse, l2 = p.lse;
  d.out.to_host(o1);
  d.lse.to_host(l1);
  d.run();
  d.out.to_host(o2);
  d.lse.to_host(l2);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.numel() * dtype_size(o1.dtype())), 0);
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.numel() * 4), 0);
}

// Options::sm_margin changes how many persistent blocks share the tiles, not what a tile computes:
// every margin (one leaving a single SM, one larger than the device) gives the same bytes.
TEST_F(GpuForward, SmMarginLeavesTheResultAlone) {
  std::mt19937_64 rng(test::fresh_seed());
  for (const bool causal : {false, true}) {
    Case c;
    c.batch = 3;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.seqlen_q = c.seqlen_k = 900;
    c.causal = causal;
    Problem3 p(c, rng);
    OnDevice d(p);
    HostTensor o0 = p.out, l0 = p.lse;
    for (const int margin : {0, 7, 1 << 20}) {
      ForwardArgs a = d.args();
      a.options.sm_margin = margin;
      forward(a);
      test::device_synchronize();
      HostTensor o = p.out, l = p.lse;
      d.out.to_host(o);
      d.lse.to_host(l);
      if (margin == 0) {
        o0 = o;
        l0 = l;
        continue;
      }
      EXPECT_EQ(std::memcmp(o.data(), o0.data(), o.numel() * dtype_size(o.dtype())), 0) << "margin " << margin;
      EXPECT_EQ(std::memcmp(l.data(), l0.data(), l.numel() * 4), 0) << "margin " << margin;
    }
  }
}

TEST_F(GpuForward, RunsOnTheCallersStreamWithoutWorkspace) {
  std::mt19937_64 rng(test::fresh_seed());
  Case c;
  Problem3 p(c, rng);
  OnDevice d(p);
  ForwardArgs a = d.args();
  EXPECT_EQ(workspace_size(a), 0u);
  test::DeviceStream s;
  a.options.stream = s.get();
  forward(a);
  s.synchronize();
  HostTensor out = p.out;
  d.out.to_host(out);
  EXPECT_TRUE(test::all_finite(out.to_f64()));
}

void expect_error(const ForwardArgs& a, const std::string& needle) {
  try {
    forward(a);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(GpuForward, RejectsWhatTheKernelCannotTake) {
  std::mt19937_64 rng(test::fresh_seed());
  Case c;
  Problem3 p(c, rng);
  OnDevice d(p);

  ForwardArgs host_q = d.args();
  host_q.q.data = p.q.view().data;  // a host pointer labelled cuda
  expect_error(host_q, "q = ");
  expect_error(host_q, "host pointer");

  test::DeviceBuffer buf(p.q.numel() * 2 + 64);
  ForwardArgs misaligned = d.args();
  misaligned.k.data = static_cast<char*>(buf.data()) + 2;
  expect_error(misaligned, "k = ");
  expect_error(misaligned, "16-byte aligned");

  test::DeviceBuffer wide(64 * 136 * 2);
  ForwardArgs odd_stride = d.args();
  odd_stride.v = view(wide.data(), DType::bf16, {1, 64, 2, 64}, {64 * 136, 136, 68, 1}, Device{DeviceType::cuda, 0});
  expect_error(odd_stride, "v.stride[2] = 68");

  // Whole f32 tensors: relabelling the bf16 buffers would make out overlap its neighbours.
  HostTensor q32(DType::f32, p.q.shape()), k32(DType::f32, p.k.shape()), v32(DType::f32, p.v.shape()),
      o32(DType::f32, p.out.shape());
  DeviceTensor dq32(q32), dk32(k32), dv32(v32), do32(o32);
  ForwardArgs f32 = d.args();
  f32.q = dq32.view();
  f32.k = dk32.view();
  f32.v = dv32.view();
  f32.out = do32.view();
  expect_error(f32, "f16 and bf16");
}

}  // namespace
}  // namespace tileattn
