// Attention over caller-owned buffers: causal, grouped-query, with the row log-sum-exp.
// Built and run by the test suite, so this example stays true.
#include <tileattn/tileattn.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() try {
  const int batch = 2, seqlen = 256, heads = 8, heads_kv = 2, hdim = 64;
  std::vector<float> q(batch * seqlen * heads * hdim), k(batch * seqlen * heads_kv * hdim),
      v(k.size()), out(q.size()), lse(batch * heads * seqlen);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(rng);

  using tileattn::DType;
  tileattn::ForwardArgs args;  // layout [batch, seqlen, heads, head_dim]
  args.q = tileattn::view(q.data(), DType::f32, {batch, seqlen, heads, hdim});
  args.k = tileattn::view(k.data(), DType::f32, {batch, seqlen, heads_kv, hdim});
  args.v = tileattn::view(v.data(), DType::f32, {batch, seqlen, heads_kv, hdim});
  args.out = tileattn::view(out.data(), DType::f32, {batch, seqlen, heads, hdim});
  args.lse = tileattn::view(lse.data(), DType::f32, {batch, heads, seqlen});
  args.options.causal = true;
  tileattn::forward(args);  // host tensors: the CPU flash backend

  // The same call on the fp64 reference, for comparison.
  std::vector<float> expected(out.size());
  args.out = tileattn::view(expected.data(), DType::f32, {batch, seqlen, heads, hdim});
  args.options.backend = tileattn::Backend::cpu_reference;
  tileattn::forward(args);

  double max_diff = 0;
  for (std::size_t i = 0; i < out.size(); ++i) max_diff = std::fmax(max_diff, std::fabs(out[i] - expected[i]));
  std::printf("max |flash - reference| = %.2e\n", max_diff);
  return max_diff < 1e-4 ? 0 : 1;
} catch (const tileattn::Error& e) {  // bad arguments: the message names the argument and values
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
