// The CPU thread pool behind every CPU kernel: exact coverage, exceptions, resizing, caller hooks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/parallel.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

// Restores the default pool and hook whatever a test did.
class Parallel : public ::testing::Test {
 protected:
  void TearDown() override {
    set_parallel_for({});
    set_num_threads(0);
  }
};

void expect_exact_cover(std::int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  for (auto& h : hits) h.store(0);
  std::atomic<bool> bad_range{false};
  cpu::parallel_for(n, [&](std::int64_t b, std::int64_t e) {
    if (b < 0 || e > n || b >= e) bad_range = true;
    for (std::int64_t i = b; i < e && i < n && i >= 0; ++i) hits[i].fetch_add(1);
  });
  EXPECT_FALSE(bad_range) << "n " << n;
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " index " << i;
}

TEST_F(Parallel, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    for (std::int64_t n : {1, 2, 3, 7, 8, 9, 63, 64, 65, 1000, 12345}) expect_exact_cover(n);
  }
}

TEST_F(Parallel, EmptyRangeCallsNothing) {
  set_num_threads(4);
  int calls = 0;
  cpu::parallel_for(0, [&](std::int64_t, std::int64_t) { ++calls; });
  cpu::parallel_for(-5, [&](std::int64_t, std::int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST_F(Parallel, UsesSeveralThreads) {
  set_num_threads(4);
  std::mutex m;
  std::vector<std::thread::id> ids;
  std::atomic<int> arrived{0};
  // Each chunk waits (bounded) for the others, so a pool that ran chunks serially would see one id.
  cpu::parallel_for(4000, [&](std::int64_t, std::int64_t) {
    {
      std::lock_guard<std::mutex> g(m);
      ids.push_back(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    // Bounded in time, not in spins: on a loaded machine a second worker can take a while to start.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  });
  std::sort(ids.begin(), ids.end());
  EXPECT_GT(std::unique(ids.begin(), ids.end()) - ids.begin(), 1);
}

TEST_F(Parallel, NegativeThreadCountsAreRefused) {
  set_num_threads(3);
  try {
    set_num_threads(-1);
    FAIL() << "set_num_threads(-1) was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_num_threads: n = -1, expected >= 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(num_threads(), 3);
}

TEST_F(Parallel, ExceptionsPropagateAndThePoolSurvives) {
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    EXPECT_THROW(cpu::parallel_for(1000, [](std::int64_t b, std::int64_t e) {
                   if (b <= 500 && 500 < e) throw std::runtime_error("chunk 500");
                 }),
                 std::runtime_error);
    expect_exact_cover(777);
  }
}

TEST_F(Parallel, SetNumThreadsRepeatedly) {
  for (int round = 0; round < 20; ++round) {
    const int t = 1 + round % 5;
    set_num_threads(t);
    ASSERT_EQ(num_threads(), t);
    expect_exact_cover(100 + round);
  }
  set_num_threads(0);
  const int hc = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(num_threads(), hc > 0 ? hc : 1);
}

TEST_F(Parallel, CallerHookIsUsedAndCanBeReset) {
  int hook_calls = 0;
  set_parallel_for([&](std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body) {
    ++hook_calls;
    for (std::int64_t i = 0; i < n; i += 3) body(i, std::min(n, i + 3));  // the caller's chunking
  });
  expect_exact_cover(10);
  EXPECT_EQ(hook_calls, 1);

  // The library's own calls go through it too.
  std::vector<float> qkv(8, 1.f), out(8), lse(1);
  ForwardArgs a;
  a.q = view(qkv.data(), DType::f32, {1, 1, 1, 8});
  a.k = a.q;
  a.v = a.q;
  a.out = view(out.data(), DType::f32, {1, 1, 1, 8});
  a.lse = view(lse.data(), DType::f32, {1, 1, 1});
  a.options.backend = Backend::cpu_reference;
  forward(a);
  EXPECT_EQ(hook_calls, 2);
  EXPECT_FLOAT_EQ(out[3], 1.f);

  set_parallel_for({});
  expect_exact_cover(10);
  EXPECT_EQ(hook_calls, 2);
}

}  // namespace
}  // namespace tileattn
