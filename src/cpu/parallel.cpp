#include "cpu/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tileattn/attention.hpp"
#include "tileattn/error.hpp"

namespace tileattn {
namespace cpu {
namespace {

// A persistent pool: workers sleep on a condition variable between jobs; the calling thread works
// too. One job at a time (a second caller waits), which is all the library needs.
class Pool {
 public:
  ~Pool() { resize(0); }

  int size() {
    std::lock_guard<std::mutex> g(job_mutex_);
    return static_cast<int>(workers_.size()) + 1;
  }

  // Returns false, with the pool back at its former size, where the system cannot start that many
  // threads.
  bool resize(int threads) {
    std::lock_guard<std::mutex> g(job_mutex_);
    const int before = static_cast<int>(workers_.size()) + 1;
    stop_workers();
    try {
      start_workers(threads);
      return true;
    } catch (const std::system_error&) {
      stop_workers();
      start_workers(before);
      return false;
    }
  }

  void run(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body) {
    std::lock_guard<std::mutex> g(job_mutex_);
    const std::int64_t threads = static_cast<std::int64_t>(workers_.size()) + 1;
    if (threads == 1 || n == 1) {
      body(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> l(m_);
      body_ = &body;
      n_ = n;
      grain_ = std::max<std::int64_t>(1, n / (threads * 8));
      next_.store(0);
      active_ = static_cast<int>(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> l(m_);
    done_cv_.wait(l, [&] { return active_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (;;) {
      const std::int64_t b = next_.fetch_add(grain_);
      if (b >= n_) return;
      try {
        (*body_)(b, std::min(n_, b + grain_));
      } catch (...) {
        std::lock_guard<std::mutex> l(m_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_);
      }
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    stop_ = false;
  }

  void start_workers(int threads) {
    // A worker starts from the current generation so it cannot miss a job posted before it runs.
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, g = generation_] { loop(g); });
  }

  void loop(std::uint64_t seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
      }
      work();
      std::lock_guard<std::mutex> l(m_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex job_mutex_;  // one job (or resize) at a time
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(std::int64_t, std::int64_t)>* body_ = nullptr;
  std::int64_t n_ = 0, grain_ = 1;
  std::atomic<std::int64_t> next_{0};
  int active_ = 0;
  std::exception_ptr error_;
};

int default_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc ? static_cast<int>(hc) : 1;
}

Pool& pool() {
  static Pool* p = [] {
    auto* q = new Pool;  // leaked on purpose: no join during static destruction
    q->resize(default_threads());
    return q;
  }();
  return *p;
}

std::mutex g_hook_mutex;
ParallelFor g_hook;

}  // namespace

void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  ParallelFor hook;
  {
    std::lock_guard<std::mutex> g(g_hook_mutex);
    hook = g_hook;
  }
  if (hook) {
    hook(n, body);
  } else {
    pool().run(n, body);
  }
}

}  // namespace cpu

void set_num_threads(int n) {
  const std::string what = "tileattn::set_num_threads: n = " + std::to_string(n);
  if (n < 0) throw Error(what + ", expected >= 0 (0 = hardware concurrency)");
  if (!cpu::pool().resize(n > 0 ? n : cpu::default_threads()))
    throw Error(what + ": the system could not start that many threads; the pool keeps its " +
                std::to_string(num_threads()));
}
int num_threads() { return cpu::pool().size(); }
void set_parallel_for(ParallelFor fn) {
  std::lock_guard<std::mutex> g(cpu::g_hook_mutex);
  cpu::g_hook = std::move(fn);
}

}  // namespace tileattn
