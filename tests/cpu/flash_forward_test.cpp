// The CPU flash forward against the fp64 reference on a random sweep, plus the edge rows.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <vector>

#include "attention_case.hpp"
#include "core/problem.hpp"
#include "cpu/amx.hpp"
#include "cpu/flash_common.hpp"
#include "cpu/reference.hpp"

namespace tileattn::test {
namespace {

struct ForwardResult {
  std::vector<double> out, lse;
};

ForwardResult run_forward(const Case& c, CaseTensors& t, Backend backend) {
  t.out.poison();
  t.lse.poison();
  ForwardArgs a = t.forward(c);
  a.options.backend = backend;
  forward(a);
  return {t.out.to_f64(), t.lse.to_f64()};
}

// Standard attention in the input dtype: the baseline of the tolerance rule.
ForwardResult run_baseline(const Case& c, CaseTensors& t) {
  t.out.poison();
  t.lse.poison();
  ForwardArgs a = t.forward(c);
  a.options.backend = Backend::cpu_reference;
  cpu::reference_forward(validate(a), a, cpu::RefPrecision::input_dtype);
  return {t.out.to_f64(), t.lse.to_f64()};
}

// Out and LSE of `iterations` cases from make_case(rng) against the oracle by the tolerance rule.
template <class MakeCase>
void expect_sweep_matches_reference(int iterations, MakeCase make_case) {
  const char* forced = std::getenv("TILEATTN_TEST_SEED");  // replays a failure's printed seed
  const std::uint64_t seed = forced ? std::stoull(forced) : fresh_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < iterations; ++it) {
    const Case c = make_case(rng);
    CaseTensors t(c, rng);
    const std::string ctx = "seed " + std::to_string(seed) + " case " + std::to_string(it) + ": " + c.str();
    const ForwardResult got = run_forward(c, t, Backend::cpu_flash);
    const ForwardResult ref = run_forward(c, t, Backend::cpu_reference);
    ForwardResult base;
    bool have_base = false;
    auto baseline = [&]() -> const ForwardResult& {
      if (!have_base) base = run_baseline(c, t);
      have_base = true;
      return base;
    };
    EXPECT_TRUE(close_to_oracle(c.dtype, got.out, ref.out, [&] { return baseline().out; })) << "out, " << ctx;
    EXPECT_TRUE(close_to_oracle(c.dtype, got.lse, ref.lse, [&] { return baseline().lse; })) << "lse, " << ctx;
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(FlashForward, RandomSweepMatchesReference) {
  expect_sweep_matches_reference(300, [](std::mt19937_64& rng) { return random_case(rng); });
}

// bf16 at the head dims models use, over several key tiles: on a CPU with AMX these run the tile
// products on it (operands in bf16, K and V read in place), elsewhere the widening path.
TEST(FlashForward, Bf16ModelHeadDimsMatchReference) {
  RecordProperty("amx", cpu::amx::available() ? "yes" : "no");
  expect_sweep_matches_reference(60, [](std::mt19937_64& rng) { return random_bf16_model_case(rng, 300); });
}

// Block-sparse masks of every pattern (random blocks, all full, all partial, one block, empty rows,
// causal as blocks) over the sweep's options, layouts, grouped heads and varlen batches.
TEST(FlashForward, BlockSparseSweepMatchesReference) {
  expect_sweep_matches_reference(200, [](std::mt19937_64& rng) {
    Case c = random_case(rng, 200);
    add_random_block_mask(c, rng);
    return c;
  });
}

// A dense element mask in the partial blocks (random bits, rows all False, blocks all True; broadcast
// over batch and heads, any strides, varlen masks longer than the sequences) over every block
// pattern and the sweep's options, layouts, grouped heads and varlen batches; bf16 at model head
// dims (AMX where the CPU has it) among them.
TEST(FlashForward, DenseMaskSweepMatchesReference) {
  expect_sweep_matches_reference(150, [](std::mt19937_64& rng) {
    Case c = std::uniform_int_distribution<int>(0, 4)(rng) == 0 ? random_bf16_model_case(rng, 300) : random_case(rng, 200);
    add_random_block_mask(c, rng);
    add_random_dense_mask(c, rng);
    return c;
  });
}

// Prefix-LM (per call and per sequence, prefixes from 0 to past every key) over the sweep's
// layouts, grouped heads, varlen batches, score mods and dropout, alone and as the element mask of
// a block mask's partial blocks; bf16 at model head dims (AMX where the CPU has it) among them.
TEST(FlashForward, PrefixLmSweepMatchesReference) {
  expect_sweep_matches_reference(150, [](std::mt19937_64& rng) {
    const int kind = std::uniform_int_distribution<int>(0, 3)(rng);
    Case c = kind == 3 ? random_bf16_model_case(rng, 300) : random_case(rng, 200);
    add_prefix_lm(c, rng);
    if (kind == 2) add_random_block_mask(c, rng);
    return c;
  });
}

// The same in bf16 at model head dims: on a CPU with AMX the tile-unit path where key blocks start
// on multiples of 32.
TEST(FlashForward, BlockSparseBf16ModelHeadDimsMatchReference) {
  RecordProperty("amx", cpu::amx::available() ? "yes" : "no");
  expect_sweep_matches_reference(30, [](std::mt19937_64& rng) {
    Case c = random_bf16_model_case(rng, 300);
    add_random_block_mask(c, rng);
    return c;
  });
}

// bf16 over 4k+ keys at head dim 128 (K and V past a core's L2, dozens of key blocks per tile): on
// a CPU with AMX, the tile-unit path under the sweep's options.
TEST(FlashForward, Bf16LongKeysMatchReference) {
  RecordProperty("amx", cpu::amx::available() ? "yes" : "no");
  expect_sweep_matches_reference(6, [](std::mt19937_64& rng) {
    Case c = random_case(rng, 300);  // options, mask alignment, layout
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    c.dtype = DType::bf16;
    c.batch = 1;
    c.heads_kv = 1;
    c.heads_q = std::vector<int>{1, 2, 4}[uni(0, 2)];
    c.hdim = c.hdim_v = 128;
    c.seqlen_q = uni(65, 300);
    c.seqlen_k = uni(4097, 4700);
    if (c.varlen) c.lens_q = {c.seqlen_q}, c.lens_k = {c.seqlen_k};
    return c;
  });
}

// Rows that see no key: out = 0, lse = -inf, and no NaN anywhere.
TEST(FlashForward, MaskedRowsGiveZeroAndNegInf) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (DType dt : {DType::f32, DType::bf16}) {
    Case c;
    c.dtype = dt;
    c.batch = 2;
    c.heads_q = c.heads_kv = 2;
    c.seqlen_q = 100;
    c.seqlen_k = 70;  // bottom-right causal: the first 30 rows see nothing
    c.hdim = c.hdim_v = 32;
    c.options.causal = true;
    CaseTensors t(c, rng);
    const ForwardResult got = run_forward(c, t, Backend::cpu_flash);
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.heads_q; ++h)
        for (int i = 0; i < c.seqlen_q; ++i) {
          const double l = got.lse[(b * c.heads_q + h) * c.seqlen_q + i];
          if (i < 30) {
            EXPECT_EQ(l, -std::numeric_limits<double>::infinity()) << "seed " << seed << " row " << i;
            for (int col = 0; col < c.hdim_v; ++col)
              EXPECT_EQ(got.out[((b * c.seqlen_q + i) * c.heads_q + h) * c.hdim_v + col], 0.0) << "row " << i;
          } else {
            EXPECT_TRUE(std::isfinite(l)) << "seed " << seed << " row " << i;
          }
        }
    EXPECT_TRUE(all_finite(got.out));
  }
}

// Options::alibi_diagonal: rows [40, 72) of a 96-token sequence, attended alone to all its keys with
// ALiBi measured from the sequence's diagonal (row i' sits at 40 + i'), give the whole call's rows,
// in both backends; non-causal, so that ALiBi's |distance| is tested on both sides of the diagonal.
TEST(FlashForward, AlibiDiagonalOfABlockMatchesTheWholeSequence) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  constexpr int kFirst = 40, kRows = 32;
  Case whole;
  whole.dtype = DType::f32;
  whole.heads_q = whole.heads_kv = 2;
  whole.seqlen_q = whole.seqlen_k = 96;
  whole.hdim = whole.hdim_v = 32;
  whole.alibi = true;
  CaseTensors tw(whole, rng);
  Case block = whole;
  block.seqlen_q = kRows;
  block.options.alibi_diagonal = kFirst;
  CaseTensors tb(block, rng);
  const std::int64_t row = whole.heads_q * whole.hdim;  // q and out rows ([1, seqlen, heads, d])
  for (std::int64_t x = 0; x < kRows * row; ++x) tb.q.set(x, tw.q.get(kFirst * row + x));
  for (std::int64_t x = 0; x < tw.k.numel(); ++x) tb.k.set(x, tw.k.get(x));
  for (std::int64_t x = 0; x < tw.v.numel(); ++x) tb.v.set(x, tw.v.get(x));
  for (std::int64_t x = 0; x < tw.slopes.numel(); ++x) tb.slopes.set(x, tw.slopes.get(x));
  for (Backend backend : {Backend::cpu_flash, Backend::cpu_reference}) {
    const ForwardResult all = run_forward(whole, tw, backend);
    const ForwardResult part = run_forward(block, tb, backend);
    const std::vector<double> want(all.out.begin() + kFirst * row, all.out.begin() + (kFirst + kRows) * row);
    EXPECT_LE(max_abs_error(part.out, want), 1e-5) << "seed " << seed << " backend " << int(backend);
    for (int h = 0; h < whole.heads_q; ++h)
      for (int i = 0; i < kRows; ++i)
        EXPECT_NEAR(part.lse[h * kRows + i], all.lse[h * whole.seqlen_q + kFirst + i], 1e-5)
            << "seed " << seed << " head " << h << " row " << i;
  }
}

// Scores set by the first column alone: q_i = (q0, 0, ...), k_j = (key(j), 0, ...), so q_i . k_j =
// q0 * key(j) exactly (scale 1), for 70 query rows and `keys` keys in every dtype; the flash output
// and LSE must be finite and match the oracle's.
template <class Key>
void ExpectFirstColumnScoresMatchReference(int keys, double q0, Key key) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Case c;
    c.dtype = dt;
    c.seqlen_q = 70;
    c.seqlen_k = keys;
    c.hdim = c.hdim_v = 64;
    c.options.scale = 1.f;
    CaseTensors t(c, rng);
    t.q.fill(0);
    t.k.fill(0);
    for (int i = 0; i < c.seqlen_q; ++i) t.q.set(i * c.hdim, q0);
    for (int j = 0; j < c.seqlen_k; ++j) t.k.set(j * c.hdim, key(j, rng));
    const ForwardResult got = run_forward(c, t, Backend::cpu_flash);
    const ForwardResult ref = run_forward(c, t, Backend::cpu_reference);
    EXPECT_TRUE(all_finite(got.out)) << "seed " << seed;
    EXPECT_TRUE(all_finite(got.lse)) << "seed " << seed;
    EXPECT_LE(max_abs_error(got.out, ref.out), dt == DType::f32 ? 1e-5 : 2e-2) << "seed " << seed;
    EXPECT_LE(rel_error(got.lse, ref.lse), 1e-6) << "seed " << seed;
  }
}

// Logits of +-1e4: the online softmax must neither overflow nor produce NaN.
TEST(FlashForward, HugeLogitsStayFinite) {
  std::bernoulli_distribution coin(0.5);
  ExpectFirstColumnScoresMatchReference(150, 100, [&](int, std::mt19937_64& rng) { return coin(rng) ? 100 : -100; });
}

// Scores that keep rising across the keys, far past the first key tiles' max: every later tile
// must move the running max and rescale what came before (a max left behind overflows 2^x).
// q . k_j = j / 2: from 0 to 166, a rise of 240 in log2 units.
TEST(FlashForward, ScoresRisingLateRescaleTheOutput) {
  ExpectFirstColumnScoresMatchReference(333, 1, [](int j, std::mt19937_64&) { return 0.5 * j; });
}

// K and V rows that lie apart (BSHD with several KV heads, packed varlen) are copied by whole
// (sequence, KV head) before the query tiles read them, in one round or, within a caller's smaller
// workspace, in several. Every way gives bit for bit the output of the same values laid out dense
// (BHSD, read in place), which the sweeps check against the oracle. With bf16 on AMX the values are
// transposed: in the copy; for dense rows, once per pair where 48 query tiles read each (GQA 16),
// and step by step in each tile where 6 do.
TEST(FlashForward, CopiedKeyRowsMatchDenseRowsBitwise) {
  const std::uint64_t seed = fresh_seed();
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (int heads_q : {6, 48}) {
      for (bool varlen : {false, true}) {
        Case c;
        c.dtype = dt;
        c.batch = 3;
        c.heads_q = heads_q;
        c.heads_kv = 3;
        c.seqlen_q = 150;
        c.seqlen_k = 601;  // copied in three chunks
        c.hdim = 72;
        c.hdim_v = 40;
        c.options.causal = true;
        c.varlen = varlen;
        if (varlen) c.lens_q = {150, 0, 97}, c.lens_k = {601, 35, 331};
        const std::string ctx = "seed " + std::to_string(seed) + ": " + c.str();
        std::mt19937_64 rng(seed);
        CaseTensors t(c, rng);
        // The query's size: whole pairs' copies and the slack for aligning the caller's buffer.
        const std::size_t slack = cpu::flash::kWorkspaceAlign - 1, pairs = c.batch * c.heads_kv;
        const std::size_t whole = workspace_size(t.forward(c)), pair = (whole - slack) / pairs;
        ASSERT_GT(whole, slack) << ctx;
        ASSERT_EQ((whole - slack) % pairs, 0u) << ctx;
        const ForwardResult once = run_forward(c, t, Backend::cpu_flash);
        for (std::size_t bytes : {slack + pair, slack + pair * 5 / 2}) {
          // One byte past an aligned address: the worst the slack allows for.
          std::vector<unsigned char> ws(bytes + 2 * slack);
          t.out.poison();
          t.lse.poison();
          ForwardArgs a = t.forward(c);
          a.options.workspace = ws.data() + align_skip(ws.data(), cpu::flash::kWorkspaceAlign) + 1;
          a.options.workspace_bytes = bytes;
          forward(a);
          EXPECT_EQ(t.out.to_f64(), once.out) << bytes << " bytes of workspace, " << ctx;
          EXPECT_EQ(t.lse.to_f64(), once.lse) << bytes << " bytes of workspace, " << ctx;
        }
        {
          // A caller's parallel_for running the ranges one at a time, last first: each pair's
          // readers come before the items that would copy it, so they must copy it themselves
          // (a reader that only waited would hang here).
          struct Restore {
            ~Restore() { set_parallel_for({}); }
          } restore;
          set_parallel_for([](std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body) {
            for (std::int64_t i = n; i-- > 0;) body(i, i + 1);
          });
          t.out.poison();
          t.lse.poison();
          forward(t.forward(c));
          EXPECT_EQ(t.out.to_f64(), once.out) << "ranges in reverse, " << ctx;
          EXPECT_EQ(t.lse.to_f64(), once.lse) << "ranges in reverse, " << ctx;
        }
        if (varlen) continue;
        Case d = c;
        d.bhsd = true;
        std::mt19937_64 same(seed);
        CaseTensors td(d, same);
        // Dense rows are read in place; bf16 on AMX transposes its values once where many tiles read them.
        const std::size_t dense_ws = workspace_size(td.forward(d));
        if (c.dtype == DType::bf16 && cpu::amx::available() && heads_q == 48)
          EXPECT_GT(dense_ws, 0u) << ctx;
        else
          EXPECT_EQ(dense_ws, 0u) << ctx;
        const ForwardResult dense = run_forward(d, td, Backend::cpu_flash);
        EXPECT_EQ(dense.out, once.out) << ctx;
        EXPECT_EQ(dense.lse, once.lse) << ctx;
      }
    }
  }
}

}  // namespace
}  // namespace tileattn::test
