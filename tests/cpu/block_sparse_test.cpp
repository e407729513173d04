// Block masks and attention chunks against what they must equal without them: a block mask of only
// full blocks is dense attention, causal as blocks under a causal element mask is causal attention,
// all-partial blocks under any element mask are that mask (a dense boolean one included), and
// chunked-local attention is each chunk attending on its own. Checked on the fp64 reference (exactly: the same sums) and on the
// CPU flash path (fp32, within 1e-5), forward and backward.
#include <gtest/gtest.h>

#include "attention_case.hpp"
#include "common/variant.hpp"
#include "cpu/document_runs.hpp"

namespace tileattn::test {
namespace {

struct Outputs {
  std::vector<double> out, lse, dq, dk, dv;
};

Outputs run(const Case& c, CaseTensors& t, Backend backend) {
  ForwardArgs f = t.forward(c);
  f.options.backend = backend;
  t.out.poison();
  t.lse.poison();
  forward(f);
  BackwardArgs b = t.backward(c);
  b.options.backend = backend;
  t.dq.poison();
  t.dk.poison();
  t.dv.poison();
  backward(b);
  return {t.out.to_f64(), t.lse.to_f64(), t.dq.to_f64(), t.dk.to_f64(), t.dv.to_f64()};
}

void expect_same(const Outputs& x, const Outputs& y, Backend backend, const std::string& ctx) {
  const double tol = backend == Backend::cpu_reference ? 0.0 : 1e-5;
  auto near = [&](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    if (tol == 0.0) {
      EXPECT_EQ(a, b) << what << ", " << ctx;
    } else {
      EXPECT_LE(f32_error(a, b), tol) << what << ", " << ctx;
    }
  };
  near(x.out, y.out, "out");
  near(x.lse, y.lse, "lse");
  near(x.dq, y.dq, "dq");
  near(x.dk, y.dk, "dk");
  near(x.dv, y.dv, "dv");
}

// A random f32 case without dropout and with a block mask of one pattern.
Case masked_case(std::mt19937_64& rng, int pattern_kind) {
  Case c;
  for (;;) {
    c = random_case(rng, 150);
    c.dtype = DType::f32;
    c.options.dropout_p = 0.f;
    c.options.chunk_size = 0;
    add_random_block_mask(c, rng);
    if ((pattern_kind == 2 && c.sparse.pattern == "all-full" && c.sparse.full_lists) ||
        (pattern_kind == 3 && c.sparse.pattern == "all-partial") || (pattern_kind == 6 && c.sparse.pattern == "causal-blocks"))
      return c;
  }
}

class BlockMaskEquivalence : public ::testing::TestWithParam<Backend> {
 protected:
  // Twelve random cases of one pattern (masked_case; `adjust` edits each), each against the same
  // call without its block mask (`unmask` edits that call where the blocks stand for more).
  template <class Adjust, class Unmask>
  void expect_as_dense(int pattern_kind, Adjust adjust, Unmask unmask) {
    const std::uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    for (int it = 0; it < 12; ++it) {
      Case c = masked_case(rng, pattern_kind);
      adjust(c);
      CaseTensors t(c, rng);
      Case dense = c;
      dense.sparse = SparseSpec{};
      unmask(dense);
      const Outputs a = run(c, t, GetParam()), b = run(dense, t, GetParam());
      expect_same(a, b, GetParam(), "seed " + std::to_string(seed) + ": " + c.str());
      if (HasFailure()) return;
    }
  }
};

TEST_P(BlockMaskEquivalence, AllFullBlocksAreDenseAttention) {
  // Full blocks take no element mask: the dense call has none either.
  expect_as_dense(2, [](Case&) {}, [](Case& dense) {
    dense.documents = false;
    dense.options.causal = false;
    dense.options.window_left = dense.options.window_right = -1;
  });
}

TEST_P(BlockMaskEquivalence, AllPartialBlocksAreTheElementMask) {
  expect_as_dense(3, [](Case&) {}, [](Case&) {});
}

TEST_P(BlockMaskEquivalence, CausalBlocksAreCausalAttention) {
  expect_as_dense(6, [](Case& c) {
    c.options.window_left = -1;  // full blocks below the diagonal see every key before it
    c.documents = false;
  }, [](Case&) {});
}

// A dense mask that holds the call's causal or window rule, under all-partial blocks and without the
// rule, is that rule (the visible sets are equal, so the reference's sums are the same); a dense mask
// of all True changes nothing. Batched, so that the rule's mask is one [seqlen_q, seqlen_k] table.
TEST_P(BlockMaskEquivalence, DenseMaskOfTheRuleIsTheRule) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 12; ++it) {
    Case c = masked_case(rng, 3);
    c.varlen = false;  // the lengths: seqlen_q and seqlen_k
    c.documents = false;
    if (!c.options.causal && c.options.window_left < 0 && c.options.window_right < 0) c.options.window_left = uni(0, 20);
    CaseTensors t(c, rng);
    const Options& o = c.options;
    const int sq = c.seqlen_q, sk = c.seqlen_k, right = o.causal ? 0 : o.window_right;
    Case dense = c;
    dense.options.causal = false;
    dense.options.window_left = dense.options.window_right = -1;
    dense.dense = DenseSpec{1, 1, sq, sk};
    t.dense = HostTensor(DType::u8, {1, 1, sq, sk});
    for (int i = 0; i < sq; ++i)
      for (int j = 0; j < sk; ++j) {
        const int diag = o.align == MaskAlign::bottom_right ? i + sk - sq : i;
        const bool vis = (o.window_left < 0 || j >= diag - o.window_left) && (right < 0 || j <= diag + right);
        t.dense.set(static_cast<std::int64_t>(i) * sk + j, vis);
      }
    const std::string ctx = "seed " + std::to_string(seed) + ": " + c.str();
    const Outputs rule = run(c, t, GetParam());
    expect_same(run(dense, t, GetParam()), rule, GetParam(), "dense mask of the rule, " + ctx);
    Case all_true = c;
    all_true.dense = DenseSpec{1, 1, sq, sk};
    t.dense.fill(1);
    expect_same(run(all_true, t, GetParam()), rule, GetParam(), "dense mask of all True, " + ctx);
    if (HasFailure()) return;
  }
}

// Chunked-local attention over one sequence (seqlen_q = seqlen_k) is the same batch cut into
// sequences at the chunk boundaries, each attending on its own; so are packed documents (ids in
// runs, the same for queries and keys) cut at the document boundaries.
TEST_P(BlockMaskEquivalence, ChunksAndDocumentsAreSequencesOfTheirOwn) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 16; ++it) {
    const bool documents = it % 2 == 1;
    Case c;
    c.heads_kv = uni(1, 2);
    c.heads_q = c.heads_kv * uni(1, 3);
    c.seqlen_q = c.seqlen_k = uni(1, 200);
    c.hdim = c.hdim_v = 8 * uni(1, 8);
    c.options.causal = uni(0, 1) == 1;
    c.options.align = uni(0, 1) ? MaskAlign::top_left : MaskAlign::bottom_right;
    std::vector<int> lens;  // the pieces
    for (int s = 0, chunk = uni(1, 80); s < c.seqlen_q; s += lens.back())
      lens.push_back(std::min(documents ? uni(1, 70) : chunk, c.seqlen_q - s));
    if (!documents) c.options.chunk_size = lens[0];
    CaseTensors t(c, rng);
    if (documents) {
      c.documents = true;
      t.doc_q = HostTensor(DType::i32, {1, c.seqlen_q});
      for (int d = 0, i = 0; d < static_cast<int>(lens.size()); ++d)
        for (int n = 0; n < lens[d]; ++n) t.doc_q.set(i++, 1000 + 7 * d);
      t.doc_k = t.doc_q;
    }
    Case cut = c;
    cut.options.chunk_size = 0;
    cut.documents = false;
    cut.varlen = true;
    cut.batch = static_cast<int>(lens.size());
    cut.lens_q = cut.lens_k = lens;
    cut.seqlen_q = cut.seqlen_k = *std::max_element(cut.lens_q.begin(), cut.lens_q.end());
    CaseTensors u(cut, rng);
    // The same inputs: [1, L, h, d] and [L, h, d] row-major lie alike.
    u.q.from_f64(t.q.to_f64());
    u.k.from_f64(t.k.to_f64());
    u.v.from_f64(t.v.to_f64());
    u.dout.from_f64(t.dout.to_f64());
    const Outputs a = run(c, t, GetParam()), b = run(cut, u, GetParam());
    // lse is [1, h, L] against [h, L]: alike too.
    expect_same(a, b, GetParam(), "seed " + std::to_string(seed) + ": " + c.str());
    if (HasFailure()) return;
  }
}

// Variant::visit against the element rule it summarizes: a skipped block has no visible element,
// a full one no hidden element (a partial one may have none visible where chunks or documents
// leave gaps); the backward's row range holds every row that sees a key; sorted document ids'
// runs of keys give the ids' own element rule.
TEST(Variant, BlocksAndRowRangesAgreeWithElements) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 300; ++it) {
    const int sq = uni(1, 60), sk = uni(1, 60);
    const int left = uni(0, 2) ? -1 : uni(0, 30), right = uni(0, 2) ? -1 : uni(0, 30);
    Variant v;
    v.mask = Mask(sq, sk, uni(0, 1) == 1, left, right);
    v.chunk = uni(0, 1) ? 0 : uni(1, 20);
    // Half the time sorted document ids (runs of random lengths, numbered independently on each
    // side, so some rows' documents have no key), as per-row runs of keys: the element rule is
    // the ids' own test (truth, without the runs).
    std::vector<int> doc_q(sq), doc_k(sk), runs(2 * sq);
    Variant truth = v;
    if (uni(0, 1)) {
      for (int i = 1; i < sq; ++i) doc_q[i] = doc_q[i - 1] + (uni(0, 9) == 0);
      for (int j = 1; j < sk; ++j) doc_k[j] = doc_k[j - 1] + (uni(0, 9) == 0);
      cpu::sweep_document_runs([&](int i) { return doc_q[i]; }, [&](int j) { return doc_k[j]; }, sq, sk, runs.data());
      truth.doc_q = v.doc_q = doc_q.data();
      truth.doc_k = v.doc_k = doc_k.data();
      v.doc_keys = runs.data();
    }
    const int i0 = uni(0, sq - 1), i1 = uni(i0 + 1, sq), j0 = uni(0, sk - 1), j1 = uni(j0 + 1, sk);
    int seen = 0;
    for (int i = i0; i < i1; ++i)
      for (int j = j0; j < j1; ++j) {
        ASSERT_EQ(v.visible(i, j), truth.visible(i, j)) << "seed " << seed << " i=" << i << " j=" << j;
        seen += v.visible(i, j);
        if (v.visible(i, j)) {
          EXPECT_GE(i, v.row_begin(j0)) << "seed " << seed;
          EXPECT_LT(i, v.row_end(j1)) << "seed " << seed;
        }
      }
    const int all = (i1 - i0) * (j1 - j0);
    const BlockVisit got = v.visit(i0, i1, j0, j1);
    const bool ok = got == BlockVisit::skip ? seen == 0 : got == BlockVisit::full ? seen == all : seen < all || all == 0;
    const bool exact = v.chunk > 0 || v.doc_keys != nullptr || got == (seen == 0 ? BlockVisit::skip : seen == all ? BlockVisit::full : BlockVisit::partial);
    ASSERT_TRUE(ok && exact) << "visit " << static_cast<int>(got) << ", " << seen << " of " << all << " visible; "
        << "seed " << seed << " sq=" << sq << " sk=" << sk << " window=(" << left << "," << right << ") chunk=" << v.chunk
        << " rows [" << i0 << "," << i1 << ") keys [" << j0 << "," << j1 << ")";
  }
}

// The backward masks an S^T tile by each key's rows: [query_begin(j), query_end(j)) must be exactly
// the rows whose range holds key j, under every rule the ranges combine (window, causal in both
// alignments, chunks, a prefix where validation allows one).
TEST(Variant, QueryRangesOfEachKeyAreExact) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 500; ++it) {
    const int sq = uni(1, 50), sk = uni(1, 50);
    const bool prefix = uni(0, 3) == 0;
    const int left = prefix || uni(0, 2) ? -1 : uni(0, 30);
    const int right = prefix ? uni(0, 20) : uni(0, 2) ? -1 : uni(0, 30);
    Variant v;
    v.mask = Mask(sq, sk, uni(0, 1) == 1, left, right);
    v.chunk = prefix || uni(0, 1) ? 0 : uni(1, 20);
    v.prefix = prefix ? uni(0, sk + 3) : 0;
    for (int j = 0; j < sk; ++j)
      for (int i = 0; i < sq; ++i) {
        const bool in = i >= v.query_begin(j) && i < v.query_end(j);
        ASSERT_EQ(in, v.visible(i, j)) << "seed " << seed << " sq=" << sq << " sk=" << sk << " window=(" << left
                                       << "," << right << ") chunk=" << v.chunk << " prefix=" << v.prefix
                                       << " bottom_right=" << (v.mask.diag_offset != 0) << " i=" << i << " j=" << j;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BlockMaskEquivalence, ::testing::Values(Backend::cpu_reference, Backend::cpu_flash),
                         [](const auto& info) { return info.param == Backend::cpu_reference ? "reference" : "flash"; });

}  // namespace
}  // namespace tileattn::test
