// Times tileattn's GPU decode on the DESIGN.md decode grid (one query row, bf16, head dim 128),
// contiguous caches in two layouts and paged caches, and the device's copy bandwidth, printing one
// JSON row per line.
// bench/gpu_decode.py runs it beside the PyTorch peers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_timing.hpp"
#include "tileattn/tileattn.hpp"

namespace {

using bench::check;
using bench::isolated_ms;
using bench::median_ms;

// Random bf16 values (never zeros: they can run faster than real data).
void fill_random(void* dst, std::size_t n, std::uint64_t seed) {
  std::vector<__nv_bfloat16> h(std::min<std::size_t>(n, 1 << 20));  // a 2 MB pattern: quick to make
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& x : h) x = __float2bfloat16(d(rng));
  for (std::size_t at = 0; at < n; at += h.size()) {
    const std::size_t m = std::min(h.size(), n - at);
    check(cudaMemcpy(static_cast<__nv_bfloat16*>(dst) + at, h.data(), m * 2, cudaMemcpyHostToDevice), "fill");
  }
}

double copy_tbps() {
  const std::size_t bytes = std::size_t(2) << 30;
  void *a, *b;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  check(cudaMemset(a, 1, bytes), "memset");
  const double ms = median_ms([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); }, 3, 10);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms * 1e-3) / 1e12;  // bytes read plus bytes written
}

// The time at fixed split counts (options.num_splits), on stderr: what tunes the split heuristic
// of the decode backend.
void split_sweep(tileattn::DecodeArgs a, int batch, int kv, int hq, int hkv) {
  std::string line;
  for (int splits : {1, 2, 4, 8, 12, 16, 24, 32, 33, 48, 64, 66}) {
    a.options.num_splits = splits;
    const std::size_t bytes = tileattn::workspace_size(a);
    void* ws = nullptr;
    if (bytes) check(cudaMalloc(&ws, bytes), "cudaMalloc sweep workspace");
    a.options.workspace = ws;
    a.options.workspace_bytes = bytes;
    char cell[48];
    std::snprintf(cell, sizeof cell, " %d:%.4f", splits, median_ms([&] { tileattn::decode(a); }));
    line += cell;
    cudaFree(ws);
  }
  std::fprintf(stderr, "# splits:ms for %dx%d %d/%d:%s\n", batch, kv, hq, hkv, line.c_str());
}

}  // namespace

int main() {
  using namespace tileattn;
  const int hdim = 128;
  const std::array<std::array<int, 4>, 5> grid{{{1, 32768, 32, 8}, {1, 131072, 32, 8}, {16, 8192, 32, 8}, {64, 4096, 32, 32}, {1, 65536, 16, 16}}};
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("{\"device\": \"%s\", \"copy_tbps\": %.3f}\n", prop.name, copy_tbps());
  for (const auto& [batch, kv, hq, hkv] : grid) {
    // page 0: contiguous, [batch, kv, heads, d] ("bshd", the layout of flash_attn_with_kvcache);
    // page -1: contiguous, [batch, heads, kv, d] ("bhsd", the layout SDPA's peers are timed on),
    // passed as a strided view. Paged caches are pages of [page, heads, d].
    for (int page : {0, -1, 16, 256}) {
      const std::size_t cache = std::size_t(batch) * kv * hkv * hdim;
      void *q, *k, *v, *out, *lens, *table = nullptr;
      check(cudaMalloc(&q, std::size_t(batch) * hq * hdim * 2), "cudaMalloc q");
      check(cudaMalloc(&out, std::size_t(batch) * hq * hdim * 2), "cudaMalloc out");
      check(cudaMalloc(&k, cache * 2), "cudaMalloc k");
      check(cudaMalloc(&v, cache * 2), "cudaMalloc v");
      fill_random(q, std::size_t(batch) * hq * hdim, 1);
      fill_random(k, cache, 2);
      fill_random(v, cache, 3);
      std::vector<int> len(batch, kv);
      check(cudaMalloc(&lens, batch * 4), "cudaMalloc lens");
      check(cudaMemcpy(lens, len.data(), batch * 4, cudaMemcpyHostToDevice), "lens");
      DecodeArgs a;
      const Device dev{DeviceType::cuda, 0};
      a.q = view(q, DType::bf16, {batch, 1, hq, hdim}, dev);
      a.out = view(out, DType::bf16, {batch, 1, hq, hdim}, dev);
      a.cache_seqlens = view(lens, DType::i32, {batch}, dev);
      if (page == 0) {
        a.k_cache = view(k, DType::bf16, {batch, kv, hkv, hdim}, dev);
        a.v_cache = view(v, DType::bf16, {batch, kv, hkv, hdim}, dev);
      } else if (page < 0) {
        const std::initializer_list<std::int64_t> strides{std::int64_t(hkv) * kv * hdim, hdim, std::int64_t(kv) * hdim, 1};
        a.k_cache = view(k, DType::bf16, {batch, kv, hkv, hdim}, strides, dev);
        a.v_cache = view(v, DType::bf16, {batch, kv, hkv, hdim}, strides, dev);
      } else {
        // Pages shuffled through the pool, as a serving engine's allocator leaves them.
        const int per_seq = kv / page, pages = batch * per_seq;
        std::vector<int> perm(pages);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
        check(cudaMalloc(&table, pages * 4), "cudaMalloc table");
        check(cudaMemcpy(table, perm.data(), pages * 4, cudaMemcpyHostToDevice), "table");
        a.page_table = view(table, DType::i32, {batch, per_seq}, dev);
        a.k_cache = view(k, DType::bf16, {pages, page, hkv, hdim}, dev);
        a.v_cache = view(v, DType::bf16, {pages, page, hkv, hdim}, dev);
      }
      a.options.check_device_indices = false;  // the hot path: no host synchronization per call
      std::size_t ws_bytes = workspace_size(a);
      void* ws = nullptr;
      if (ws_bytes) check(cudaMalloc(&ws, ws_bytes), "cudaMalloc workspace");
      a.options.workspace = ws;
      a.options.workspace_bytes = ws_bytes;
      const double ms = median_ms([&] { decode(a); });
      const double call_ms = isolated_ms([&] { decode(a); });
      if (page == 0) split_sweep(a, batch, kv, hq, hkv);
      const double tbps = 2.0 * cache * 2 / (ms * 1e-3) / 1e12;
      // The same call replayed from a CUDA graph: device time without the host's per-call work
      // (validation, launch), as a serving loop that captures its decode step sees it.
      cudaStream_t stream;
      check(cudaStreamCreate(&stream), "cudaStreamCreate");
      a.options.stream = stream;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
      for (int i = 0; i < 10; ++i) decode(a);
      check(cudaStreamEndCapture(stream, &graph), "capture end");
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      const double graph_ms = median_ms([&] { cudaGraphLaunch(exec, 0); }, 3, 20) / 10;
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
      std::printf(
          "{\"grid\": \"decode\", \"impl\": \"tileattn\", \"dtype\": \"bf16\", \"batch\": %d, \"seqlen_q\": 1, "
          "\"seqlen_k\": %d, \"heads_q\": %d, \"heads_kv\": %d, \"hdim\": %d, \"causal\": false, \"page_size\": %s, "
          "\"layout\": \"%s\", "
          "\"ms\": %.5f, \"tflops\": null, \"tbps\": %.4f, \"graph_ms\": %.5f, \"call_ms\": %.5f, \"workspace_bytes\": %zu}\n",
          batch, kv, hq, hkv, hdim, page > 0 ? std::to_string(page).c_str() : "null", page < 0 ? "bhsd" : "bshd", ms, tbps, graph_ms, call_ms, ws_bytes);
      std::fflush(stdout);
      for (void* p : {q, k, v, out, lens, table, ws}) cudaFree(p);
    }
  }
  return 0;
}
