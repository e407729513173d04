// The CPU flash backward against the fp64 reference on a random sweep, and its determinism.
#include <gtest/gtest.h>

#include "attention_case.hpp"
#include "core/problem.hpp"
#include "cpu/amx.hpp"
#include "cpu/reference.hpp"

namespace tileattn::test {
namespace {

Grads run_backward(const Case& c, CaseTensors& t, Backend backend, bool input_dtype = false) {
  t.dq.poison();
  t.dk.poison();
  t.dv.poison();
  BackwardArgs a = t.backward(c);
  a.options.backend = backend;
  if (input_dtype) {
    cpu::reference_backward(validate(a), a, cpu::RefPrecision::input_dtype);
  } else {
    backward(a);
  }
  return {t.dq.to_f64(), t.dk.to_f64(), t.dv.to_f64()};
}

// dQ, dK and dV of `iterations` cases from make_case(rng) against the oracle by the tolerance rule.
template <class MakeCase>
void expect_sweep_matches_reference(int iterations, MakeCase make_case) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < iterations; ++it) {
    const Case c = make_case(rng);
    CaseTensors t(c, rng);
    const std::string ctx = "seed " + std::to_string(seed) + " case " + std::to_string(it) + ": " + c.str();
    // Both backends differentiate the same forward: the reference's out and lse.
    ForwardArgs f = t.forward(c);
    f.options.backend = Backend::cpu_reference;
    forward(f);
    const Grads got = run_backward(c, t, Backend::cpu_flash);
    const Grads ref = run_backward(c, t, Backend::cpu_reference);
    Grads base;
    bool have_base = false;
    auto baseline = [&]() -> const Grads& {
      if (!have_base) base = run_backward(c, t, Backend::cpu_reference, true);
      have_base = true;
      return base;
    };
    const std::int64_t kr = c.heads_kv * c.hdim, vr = c.heads_kv * c.hdim_v;
    const BackwardFloors fl = backward_floors(c, t);
    EXPECT_TRUE(close_to_oracle(c.dtype, got.dq, ref.dq, [&] { return baseline().dq; }, fl.dq)) << "dq, " << ctx;
    EXPECT_TRUE(close_to_oracle(c.dtype, used_rows(c, got.dk, kr), used_rows(c, ref.dk, kr),
                                [&] { return used_rows(c, baseline().dk, kr); }, fl.dk)) << "dk, " << ctx;
    EXPECT_TRUE(close_to_oracle(c.dtype, used_rows(c, got.dv, vr), used_rows(c, ref.dv, vr),
                                [&] { return used_rows(c, baseline().dv, vr); })) << "dv, " << ctx;
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(FlashBackward, RandomSweepMatchesReference) {
  expect_sweep_matches_reference(200, [](std::mt19937_64& rng) { return random_case(rng, 110); });
}

// bf16 at the head dims models use, over several key and query tiles: on a CPU with AMX these run
// the five tile products on it, elsewhere the widening path.
TEST(FlashBackward, Bf16ModelHeadDimsMatchReference) {
  RecordProperty("amx", cpu::amx::available() ? "yes" : "no");
  expect_sweep_matches_reference(40, [](std::mt19937_64& rng) { return random_bf16_model_case(rng, 200); });
}

// Block-sparse masks of every pattern: the backward walks the transposed mask.
TEST(FlashBackward, BlockSparseSweepMatchesReference) {
  expect_sweep_matches_reference(120, [](std::mt19937_64& rng) {
    Case c = random_case(rng, 160);
    add_random_block_mask(c, rng);
    return c;
  });
}

// A dense element mask in the partial blocks (as FlashForward's sweep): the backward reads it per
// query head of each GQA group while walking the transposed block mask.
TEST(FlashBackward, DenseMaskSweepMatchesReference) {
  expect_sweep_matches_reference(100, [](std::mt19937_64& rng) {
    Case c = std::uniform_int_distribution<int>(0, 4)(rng) == 0 ? random_bf16_model_case(rng, 200) : random_case(rng, 140);
    add_random_block_mask(c, rng);
    add_random_dense_mask(c, rng);
    return c;
  });
}

// Prefix-LM, per call and per sequence, alone and as a block mask's element mask, in every dtype.
TEST(FlashBackward, PrefixLmSweepMatchesReference) {
  expect_sweep_matches_reference(100, [](std::mt19937_64& rng) {
    const int kind = std::uniform_int_distribution<int>(0, 3)(rng);
    Case c = kind == 3 ? random_bf16_model_case(rng, 200) : random_case(rng, 140);
    add_prefix_lm(c, rng);
    if (kind == 2) add_random_block_mask(c, rng);
    return c;
  });
}

TEST(FlashBackward, BlockSparseBf16ModelHeadDimsMatchReference) {
  RecordProperty("amx", cpu::amx::available() ? "yes" : "no");
  expect_sweep_matches_reference(20, [](std::mt19937_64& rng) {
    Case c = random_bf16_model_case(rng, 200);
    add_random_block_mask(c, rng);
    return c;
  });
}

// options.deterministic: bitwise the same gradients across runs and thread counts.
TEST(FlashBackward, DeterministicAcrossThreadCounts) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 6; ++it) {
    Case c = random_case(rng, 300);
    c.options.deterministic = true;
    CaseTensors t(c, rng);
    forward(t.forward(c));
    std::vector<Grads> runs;
    for (int threads : {1, 2, 3, 2}) {
      set_num_threads(threads);
      runs.push_back(run_backward(c, t, Backend::cpu_flash));
    }
    set_num_threads(0);
    for (std::size_t r = 1; r < runs.size(); ++r) {
      EXPECT_EQ(runs[r].dq, runs[0].dq) << "seed " << seed << " run " << r << ": " << c.str();
      EXPECT_EQ(runs[r].dk, runs[0].dk) << "seed " << seed << " run " << r << ": " << c.str();
      EXPECT_EQ(runs[r].dv, runs[0].dv) << "seed " << seed << " run " << r << ": " << c.str();
    }
  }
}

}  // namespace
}  // namespace tileattn::test
