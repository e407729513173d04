#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "fma_peak.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstdint>

#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace tileattn::tools::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// `rounds` rounds of twelve independent multiply-adds: more chains than two FMA pipes of four
// cycles' latency keep busy. Returns the flops done; the sums go to `sink` so nothing is elided.
double FmaRounds(std::int64_t rounds, float* sink) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
#define TILEATTN_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define TILEATTN_INIT(i) auto a##i = hn::Set(d, 1.f + (i) * 1e-3f);
#define TILEATTN_STEP(i) a##i = hn::MulAdd(a##i, m, b);
#define TILEATTN_SUM(i) s = hn::Add(s, a##i);
  TILEATTN_CHAINS(TILEATTN_INIT)
  for (std::int64_t r = 0; r < rounds; ++r) {
    TILEATTN_CHAINS(TILEATTN_STEP)
  }
  auto s = hn::Zero(d);
  TILEATTN_CHAINS(TILEATTN_SUM)
#undef TILEATTN_SUM
#undef TILEATTN_STEP
#undef TILEATTN_INIT
#undef TILEATTN_CHAINS
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return 2.0 * 12 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(rounds);
}

}  // namespace tileattn::tools::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "bench_config.hpp"
#include "fma_peak.hpp"

namespace tileattn::tools {

HWY_EXPORT(FmaRounds);

namespace {

struct Run {
  double flops = 0, seconds = 0;  // all threads' flops, the slowest thread's time
};

Run run_threads(int threads, std::int64_t rounds) {
  std::atomic<int> ready{0};
  std::vector<double> seconds(threads), flops(threads);
  std::vector<float> sink(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      const auto t0 = std::chrono::steady_clock::now();
      flops[t] = HWY_DYNAMIC_DISPATCH(FmaRounds)(rounds, &sink[t]);
      seconds[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  for (auto& p : pool) p.join();
  Run r;
  for (double f : flops) r.flops += f;
  r.seconds = *std::max_element(seconds.begin(), seconds.end());
  return r;
}

}  // namespace

const char* peak_usage() {
  return R"(usage: tileattn peak [--threads N] [--json]

Measures the fp32 multiply-add rate of N threads (default: all hardware threads) running
independent chains of vector multiply-adds on the best SIMD target, the fastest of 5 runs of about
0.2 s. The ceiling of the CPU flash kernels' fp32 products on this machine.
)";
}

int run_peak(const std::vector<std::string>& flags) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool json = false;
  for (std::size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] == "--json") {
      json = true;
    } else if (flags[i] == "--threads") {
      if (i + 1 == flags.size()) throw UsageError("--threads expects a value");
      threads = parse_int("--threads", flags[++i], 1, 4096);
    } else {
      throw UsageError("unknown flag '" + flags[i] + "'");
    }
  }
  // Runs of about 0.2 s, sized from a short one; the fastest of five.
  const std::int64_t probe = 1 << 20;
  const Run p = run_threads(1, probe);
  const auto rounds = std::max<std::int64_t>(probe, static_cast<std::int64_t>(0.2 / p.seconds * probe));
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const Run run = run_threads(threads, rounds);
    best = std::max(best, run.flops / run.seconds);
  }
  // Highway numbers its targets best first: the lowest bit set is the one dispatched to.
  const std::int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
  const char* target = hwy::TargetName(usable & -usable);
  if (json) {
    std::printf("{\"fma_fp32_tflops\": %.4g, \"threads\": %d, \"simd_target\": \"%s\"}\n", best / 1e12, threads, target);
  } else {
    std::printf("fp32 multiply-add peak: %.3f TFLOP/s on %d threads (%.1f GFLOP/s each), %s\n", best / 1e12, threads,
                best / 1e9 / threads, target);
  }
  return 0;
}

}  // namespace tileattn::tools
#endif  // HWY_ONCE
