// The cuda kernels' variants against the fp64 oracle with the same mask materialized (DESIGN.md
// tolerance rule, baseline: standard attention in the input dtype): chunked-local attention,
// document ids of packed sequences, prefix-LM and block-sparse masks (with a dense element mask or
// without), forward and backward, combined with the other options (causal and window in both alignments,
// softcap, ALiBi, dropout, GQA, varlen, BHSD views); the decode kernels' chunks; and the block masks
// and prefix lengths the cuda backend rejects.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/problem.hpp"
#include "cpu/attention_case.hpp"
#include "cpu/reference.hpp"
#include "support/device_tensor.hpp"
#include "support/expect_rejected.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

class GpuVariant : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

// Device copies of every tensor of a case, and its argument structs pointing at them.
struct OnDevice {
  DeviceTensor q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k, slopes, doc_q, doc_k, prefix, kv_num, kv_idx,
      full_num, full_idx, dense;

  OnDevice(const Case& c, const CaseTensors& t)
      : q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse), dout(t.dout), dq(t.dq), dk(t.dk), dv(t.dv) {
    if (c.varlen) cu_q = DeviceTensor(t.cu_q), cu_k = DeviceTensor(t.cu_k);
    if (c.alibi) slopes = DeviceTensor(t.slopes);
    if (c.documents) doc_q = DeviceTensor(t.doc_q), doc_k = DeviceTensor(t.doc_k);
    if (!c.prefix_lens.empty()) prefix = DeviceTensor(t.prefix);
    if (c.sparse.block_q) {
      kv_num = DeviceTensor(t.kv_num);
      kv_idx = DeviceTensor(t.kv_idx);
      if (c.sparse.full_lists) full_num = DeviceTensor(t.full_num), full_idx = DeviceTensor(t.full_idx);
      if (c.dense.batches) dense = DeviceTensor(t.dense);
    }
  }

  template <class Args>
  void point(const Case& c, Args& a) const {
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    if (c.varlen) a.cu_seqlens_q = cu_q.view(), a.cu_seqlens_k = cu_k.view();
    if (c.alibi) a.alibi_slopes = slopes.view();
    if (c.documents) a.document_ids_q = doc_q.view(), a.document_ids_k = doc_k.view();
    if (!c.prefix_lens.empty()) a.prefix_lens = prefix.view();
    if (c.sparse.block_q) {
      a.block_mask.kv_num_blocks = kv_num.view();
      a.block_mask.kv_indices = kv_idx.view();
      if (c.sparse.full_lists)
        a.block_mask.full_kv_num_blocks = full_num.view(), a.block_mask.full_kv_indices = full_idx.view();
      if (c.dense.batches) a.block_mask.mask = CaseTensors::dense_view(c, dense.view());
    }
    a.options.backend = Backend::cuda;
  }
  ForwardArgs forward_args(const Case& c, const CaseTensors& t) const {
    ForwardArgs a = t.forward(c);
    point(c, a);
    return a;
  }
  BackwardArgs backward_args(const Case& c, const CaseTensors& t) const {
    BackwardArgs a = t.backward(c);
    point(c, a);
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    return a;
  }
};

struct Outputs {
  std::vector<double> out, lse;
};

Outputs reference_forward(const Case& c, CaseTensors& t, cpu::RefPrecision prec) {
  t.out.poison();
  t.lse.poison();
  ForwardArgs a = t.forward(c);
  a.options.backend = Backend::cpu_reference;
  cpu::reference_forward(validate(a), a, prec);
  return {t.out.to_f64(), t.lse.to_f64()};
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

// The cuda forward of case c (fresh inputs from seed) against the oracle; then, where `backward`,
// the cuda backward of the oracle's forward against the oracle's gradients.
void check_case(const Case& c, std::uint64_t seed, bool backward_too) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + c.str());
  std::mt19937_64 rng(seed);
  CaseTensors t(c, rng);
  {
    t.out.poison();
    t.lse.poison();
    OnDevice d(c, t);
    forward(d.forward_args(c, t));
    device_synchronize();
    d.out.to_host(t.out);
    d.lse.to_host(t.lse);
    const Outputs got{t.out.to_f64(), t.lse.to_f64()};
    const Outputs ref = reference_forward(c, t, cpu::RefPrecision::f64);
    const Outputs base = reference_forward(c, t, cpu::RefPrecision::input_dtype);
    ASSERT_TRUE(all_finite(got.out)) << "out has a NaN or Inf";
    for (double x : got.lse) ASSERT_FALSE(std::isnan(x) || x == INFINITY) << "lse has a NaN or +Inf";
    EXPECT_TRUE(close_to_oracle(c.dtype, got.out, ref.out, [&] { return base.out; })) << "out";
    const RuleResult rl = check_rule(got.lse, base.lse, ref.lse, 1e-3);
    EXPECT_TRUE(rl.ok) << "lse: " << rl.message;
  }
  if (!backward_too || ::testing::Test::HasFailure()) return;
  reference_forward(c, t, cpu::RefPrecision::f64);  // every backend differentiates the oracle's forward
  t.dq.poison();
  t.dk.poison();
  t.dv.poison();
  OnDevice d(c, t);
  backward(d.backward_args(c, t));
  device_synchronize();
  d.dq.to_host(t.dq);
  d.dk.to_host(t.dk);
  d.dv.to_host(t.dv);
  const Grads got{t.dq.to_f64(), t.dk.to_f64(), t.dv.to_f64()};
  const std::int64_t kr = c.heads_kv * c.hdim, vr = c.heads_kv * c.hdim_v;
  ASSERT_TRUE(all_finite(got.dq) && all_finite(used_rows(c, got.dk, kr)) && all_finite(used_rows(c, got.dv, vr)))
      << "a gradient has a NaN or Inf";
  const Grads ref = reference_backward(c, t, cpu::RefPrecision::f64);
  const Grads base = reference_backward(c, t, cpu::RefPrecision::input_dtype);
  const BackwardFloors fl = backward_floors(c, t);
  EXPECT_TRUE(close_to_oracle(c.dtype, got.dq, ref.dq, [&] { return base.dq; }, fl.dq)) << "dq";
  EXPECT_TRUE(close_to_oracle(c.dtype, used_rows(c, got.dk, kr), used_rows(c, ref.dk, kr),
                              [&] { return used_rows(c, base.dk, kr); }, fl.dk))
      << "dk";
  EXPECT_TRUE(close_to_oracle(c.dtype, used_rows(c, got.dv, vr), used_rows(c, ref.dv, vr),
                              [&] { return used_rows(c, base.dv, vr); }))
      << "dv";
}

// A random case in f16 or bf16 at head dims the kernels are built for (odd ones run on the next
// wider instance), over several query and key tiles, kept small enough for the fp64 oracle: at most
// two sequences and four query heads.
Case gpu_case(std::mt19937_64& rng, int max_len) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int hdim = std::vector<int>{40, 64, 64, 96, 128, 128, 192, 256}[uni(0, 7)];
  Case c = random_case(rng, hdim > 128 ? max_len / 2 : max_len);
  c.dtype = uni(0, 1) ? DType::bf16 : DType::f16;
  c.hdim = hdim;
  c.hdim_v = uni(0, 9) < 7 ? hdim : 8 * uni(1, hdim / 8);
  if (c.batch > 2 && c.varlen) {
    c.lens_q.resize(2);
    c.lens_k.resize(2);
    c.seqlen_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
    c.seqlen_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  }
  c.batch = std::min(c.batch, 2);
  c.heads_kv = std::min(c.heads_kv, 2);
  c.heads_q = c.heads_kv * uni(1, 2);
  c.options.backend = Backend::cuda;
  return c;
}

// Runs `iterations` cases from make_case(rng), each on fresh inputs.
template <class MakeCase>
void sweep(int iterations, bool backward_too, MakeCase make_case) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < iterations; ++it) {
    const Case c = make_case(rng);
    check_case(c, seed + it, backward_too);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST_F(GpuVariant, ChunkedLocalAttentionMatchesOracle) {
  sweep(24, true, [](std::mt19937_64& rng) {
    Case c = gpu_case(rng, 400);
    c.documents = false;
    c.options.chunk_size = std::uniform_int_distribution<int>(1, std::max(1, c.seqlen_k))(rng);
    return c;
  });
}

TEST_F(GpuVariant, DocumentIdsMatchOracle) {
  sweep(24, true, [](std::mt19937_64& rng) {
    Case c = gpu_case(rng, 400);
    c.documents = true;
    return c;
  });
}

// Prefix-LM, per call and per sequence (lengths from none to past every key), with causal or a
// right window in either alignment and the other options.
TEST_F(GpuVariant, PrefixLmMatchesOracle) {
  sweep(24, true, [](std::mt19937_64& rng) {
    Case c = gpu_case(rng, 400);
    add_prefix_lm(c, rng);
    return c;
  });
}

// Every block-mask pattern (random density, all full, all partial, one block, empty rows, causal
// as blocks) with 128- and 256-wide blocks, under the options' element masks.
TEST_F(GpuVariant, BlockSparseMatchesOracle) {
  sweep(40, true, [](std::mt19937_64& rng) {
    Case c = gpu_case(rng, 600);
    add_random_block_mask(c, rng, {128, 128, 256});
    return c;
  });
}

// A dense element mask in the partial blocks (random bits, rows all False, blocks all True; broadcast
// over batch and heads, any strides, varlen masks longer than the sequences) over every block
// pattern: the mask is read per query head, in partial blocks only.
TEST_F(GpuVariant, DenseMaskMatchesOracle) {
  sweep(30, true, [](std::mt19937_64& rng) {
    Case c = gpu_case(rng, 600);
    add_random_block_mask(c, rng, {128, 128, 256});
    add_random_dense_mask(c, rng);
    return c;
  });
}

// Long sequences with grouped heads: many key tiles skipped and visited per query tile.
TEST_F(GpuVariant, LongBlockSparseAndChunkedGqa) {
  sweep(4, true, [](std::mt19937_64& rng) {
    Case c;
    c.dtype = DType::bf16;
    c.batch = 1;
    c.heads_kv = 2;
    c.heads_q = 8;
    c.seqlen_q = c.seqlen_k = 1024 + std::uniform_int_distribution<int>(0, 100)(rng);
    c.hdim = c.hdim_v = std::bernoulli_distribution(0.5)(rng) ? 64 : 128;
    c.options.backend = Backend::cuda;
    c.options.causal = std::bernoulli_distribution(0.5)(rng);
    if (std::bernoulli_distribution(0.5)(rng)) {
      add_random_block_mask(c, rng, {128});
      if (std::bernoulli_distribution(0.5)(rng)) add_random_dense_mask(c, rng);
    } else {
      c.options.chunk_size = std::uniform_int_distribution<int>(100, 400)(rng);
    }
    return c;
  });
}

// One small case of each variant, forward and backward, varlen with a short last sequence and odd
// sizes: small enough for compute-sanitizer (scripts/gpu/30-sanitize.sh), which checks that
// document ids, prefix lengths, the block mask's cells and its dense mask are never read past their
// sequences.
TEST_F(GpuVariant, SmallCasesOfEachVariant) {
  std::mt19937_64 rng(11);
  for (int kind = 0; kind < 5; ++kind) {
    Case c;
    c.dtype = DType::bf16;
    c.batch = 2;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.hdim = c.hdim_v = 64;
    c.varlen = true;
    c.lens_q = {200, 37};
    c.lens_k = {300, 45};
    c.seqlen_q = 200;
    c.seqlen_k = 300;
    c.options.backend = Backend::cuda;
    c.options.causal = true;
    if (kind == 0) c.options.chunk_size = 70;
    if (kind == 1) c.documents = true;
    if (kind >= 2) add_random_block_mask(c, rng, {128});
    if (kind == 3) add_random_dense_mask(c, rng);
    if (kind == 4) c.prefix_lens = {90, 60};  // past the second sequence's keys
    check_case(c, 100 + kind, true);
    if (HasFailure()) return;
  }
}

// Decoding with chunked-local attention or a prefix (every row also sees the cache's first keys)
// against the oracle; prefixes from one key to past the longest sequence, under causal or a right
// window.
TEST_F(GpuVariant, DecodeWithChunksOrPrefixMatchesOracle) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 12; ++it) {
    const DType dt = it % 2 ? DType::f16 : DType::bf16;
    const int batch = uni(1, 3), heads_kv = uni(1, 2), heads_q = heads_kv * uni(1, 4), d = it % 3 == 2 ? 256 : 128;
    const int sq = uni(1, 4), capacity = uni(64, 1500);
    const bool prefix_lm = it % 4 >= 2;  // else chunks
    const int chunk = prefix_lm ? 0 : uni(1, 600), prefix = prefix_lm ? uni(1, capacity + 8) : 0;
    const bool causal = prefix_lm ? uni(0, 2) > 0 : uni(0, 1) == 1;
    const int window_right = prefix_lm && !causal ? uni(0, 40) : -1;
    SCOPED_TRACE("seed " + std::to_string(seed) + " it " + std::to_string(it) + ": sq " + std::to_string(sq) +
                 " capacity " + std::to_string(capacity) + " chunk " + std::to_string(chunk) + " prefix " +
                 std::to_string(prefix) + " window_right " + std::to_string(window_right) + " d " +
                 std::to_string(d) + (causal ? " causal" : ""));
    HostTensor q(dt, {batch, sq, heads_q, d}), kc(dt, {batch, capacity, heads_kv, d}), vc(dt, {batch, capacity, heads_kv, d});
    HostTensor out(dt, {batch, sq, heads_q, d}), lse(DType::f32, {batch, heads_q, sq});
    q.fill_normal(rng);
    kc.fill_normal(rng);
    vc.fill_normal(rng);
    std::vector<std::int32_t> lens;
    for (int b = 0; b < batch; ++b) lens.push_back(uni(0, capacity));
    HostTensor seqlens = int_tensor(lens);
    auto args = [&](const TensorView& qv, const TensorView& kv, const TensorView& vv, const TensorView& ov,
                    const TensorView& lv, const TensorView& sv) {
      DecodeArgs a;
      a.q = qv;
      a.k_cache = kv;
      a.v_cache = vv;
      a.out = ov;
      a.lse = lv;
      a.cache_seqlens = sv;
      a.options.causal = causal;
      a.options.window_right = window_right;
      a.options.chunk_size = chunk;
      a.options.prefix_len = prefix;
      return a;
    };
    DeviceTensor dq(q), dk(kc), dv(vc), dout(out), dlse(lse), dlens(seqlens);
    DecodeArgs a = args(dq.view(), dk.view(), dv.view(), dout.view(), dlse.view(), dlens.view());
    a.options.backend = Backend::cuda;
    decode(a);
    device_synchronize();
    dout.to_host(out);
    dlse.to_host(lse);
    HostTensor o64 = out, l64 = lse, olp = out, llp = lse;
    for (auto [o, l, prec] : {std::tuple{&o64, &l64, cpu::RefPrecision::f64},
                              std::tuple{&olp, &llp, cpu::RefPrecision::input_dtype}}) {
      DecodeArgs r = args(q.view(), kc.view(), vc.view(), o->view(), l->view(), seqlens.view());
      r.options.backend = Backend::cpu_reference;
      cpu::reference_decode(validate(r), r, prec);
    }
    EXPECT_TRUE(close_to_oracle(dt, out.to_f64(), o64.to_f64(), [&] { return olp.to_f64(); })) << "out";
    const RuleResult rl = check_rule(lse.to_f64(), llp.to_f64(), l64.to_f64(), 1e-3);
    EXPECT_TRUE(rl.ok) << "lse: " << rl.message;
    if (HasFailure()) return;
  }
}

// Block sizes the kernels' tiles do not divide, and device-resident lists out of range, are
// rejected with the argument named before anything is written.
TEST_F(GpuVariant, RejectsBlockMasksTheKernelsCannotTake) {
  std::mt19937_64 rng(7);
  Case c;
  c.dtype = DType::bf16;
  c.seqlen_q = c.seqlen_k = 256;
  c.hdim = c.hdim_v = 64;
  c.options.backend = Backend::cuda;
  add_random_block_mask(c, rng, {64});
  {
    CaseTensors t(c, rng);
    OnDevice d(c, t);
    expect_rejected([&] { forward(d.forward_args(c, t)); }, {"block_mask.block_q = 64", "multiples of 128"}, {});
    expect_rejected([&] { backward(d.backward_args(c, t)); }, {"block_mask.block_q = 64", "multiples of 128"}, {});
  }
  // Every block partly visible (two key blocks), then an index past them.
  SparseSpec& m = c.sparse;
  m = SparseSpec{};
  m.block_q = m.block_k = 128;
  m.qblocks = m.kblocks = 2;
  m.pattern = "all-partial";
  m.full_lists = false;
  m.state.assign(4, 1);
  CaseTensors t(c, rng);
  t.kv_idx.set(0, 9);
  OnDevice d(c, t);
  expect_rejected([&] { forward(d.forward_args(c, t)); }, {"block_mask.kv_indices[0, 0, 0, 0] = 9"}, {});
  expect_rejected([&] { backward(d.backward_args(c, t)); }, {"block_mask.kv_indices[0, 0, 0, 0] = 9"}, {});
}

// A negative device-resident prefix length is read back and rejected, naming the sequence, before
// anything is written.
TEST_F(GpuVariant, RejectsNegativePrefixLengths) {
  std::mt19937_64 rng(8);
  Case c;
  c.dtype = DType::bf16;
  c.batch = 2;
  c.seqlen_q = c.seqlen_k = 100;
  c.hdim = c.hdim_v = 64;
  c.options.backend = Backend::cuda;
  c.options.causal = true;
  c.prefix_lens = {5, -3};
  CaseTensors t(c, rng);
  OnDevice d(c, t);
  expect_rejected([&] { forward(d.forward_args(c, t)); }, {"prefix_lens[1] = -3 is negative"}, {});
  expect_rejected([&] { backward(d.backward_args(c, t)); }, {"prefix_lens[1] = -3 is negative"}, {});
}

}  // namespace
}  // namespace tileattn::test
