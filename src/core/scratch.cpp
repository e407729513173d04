#include "core/scratch.hpp"

#include <atomic>
#include <cstdlib>
#include <new>
#include <utility>

#include "tileattn/attention.hpp"
#include "tileattn/error.hpp"

namespace tileattn {
namespace {
std::atomic<std::size_t> g_current{0};
std::atomic<std::size_t> g_peak{0};

void account(std::size_t add) {
  const std::size_t now = g_current.fetch_add(add) + add;
  std::size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

Scratch::Scratch(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!data_) throw Error("tileattn: out of host memory allocating " + std::to_string(bytes) + " bytes of scratch");
  account(bytes);
}

Scratch::~Scratch() {
  if (data_) {
    std::free(data_);
    g_current.fetch_sub(bytes_);
  }
}

Scratch::Scratch(Scratch&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Scratch& Scratch::operator=(Scratch&& o) noexcept {
  if (this != &o) {
    this->~Scratch();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

MemoryStats memory_stats() { return MemoryStats{g_current.load(), g_peak.load()}; }
void reset_peak_memory() { g_peak.store(g_current.load()); }

}  // namespace tileattn
