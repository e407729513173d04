// The CPU decode on one query token per sequence against a long contiguous cache, fp32: the
// fastest and the median of R calls, as one JSON line (the DESIGN.md record's row fields).
//
//   tileattn_cpu_decode_bench [heads_q heads_kv keys hdim threads repeats]   (default 8 8 4000 64 1 50)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tileattn/attention.hpp"
#include "tileattn/tensor.hpp"

int main(int argc, char** argv) {
  using namespace tileattn;
  auto arg = [&](int i, int dflt) { return argc > i ? std::atoi(argv[i]) : dflt; };
  const int hq = arg(1, 8), hkv = arg(2, 8), keys = arg(3, 4000), d = arg(4, 64), threads = arg(5, 1), reps = arg(6, 50);
  std::vector<float> q(std::size_t(hq) * d), k(std::size_t(keys) * hkv * d), v(k.size()), o(q.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = normal(gen);
  DecodeArgs a;
  a.q = view(q.data(), DType::f32, {1, 1, hq, d});
  a.k_cache = view(k.data(), DType::f32, {1, keys, hkv, d});
  a.v_cache = view(v.data(), DType::f32, {1, keys, hkv, d});
  a.out = view(o.data(), DType::f32, {1, 1, hq, d});
  set_num_threads(threads);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    decode(a);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("{\"grid\": \"cpu-decode\", \"dtype\": \"f32\", \"heads_q\": %d, \"heads_kv\": %d, \"seqlen_k\": %d, "
              "\"hdim\": %d, \"threads\": %d, \"ms\": %.4f, \"ms_median\": %.4f}\n",
              hq, hkv, keys, d, threads, ms[0], ms[ms.size() / 2]);
}
