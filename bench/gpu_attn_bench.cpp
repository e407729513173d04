// Times tileattn's cuda forward (or, with --backward, its backward) on the rows given on the
// command line and prints one JSON object per row (bench/gpu_bench.py runs it beside the PyTorch
// peers and merges the records).
//
//   tileattn_gpu_bench [--iters N] [--dtype bf16|f16] [--backward [--deterministic]]
//                      BATCH:SEQLEN:HEADS:HDIM:CAUSAL[:HEADS_KV[:HDIM_V[:WINDOW_LEFT:WINDOW_RIGHT]]] ...
//                      vLEN,LEN,...:HEADS:HDIM:CAUSAL[:HEADS_KV[:HDIM_V]] ...   (varlen: packed sequences)
//
// HEADS_KV defaults to HEADS (grouped-query rows give fewer), HDIM_V to HDIM, the window to none
// (-1: that side unbounded). FLOP counts take the pairs the mask keeps. A varlen row packs its
// sequences ([total, heads, hdim], cu_seqlens on the device) and records their lengths.
// The backward's out and lse come from one forward call per input set, before the timing.
// Inputs are random, laid out [batch, seqlen, heads, hdim], and rotate among several sets so that
// no call finds its inputs in L2. `ms` is the median of calls issued back to back, as the peers are
// timed; `call_ms` the median of calls synchronized one by one (host work and launch included).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/half.hpp"
#include "gpu_timing.hpp"
#include "tileattn/tileattn.hpp"

namespace {

using bench::check;

struct Row {
  int batch, seqlen, heads, hdim;  // varlen: batch = sequences, seqlen = the longest
  bool causal;
  int heads_kv, hdim_v;
  int window_left = -1, window_right = -1;
  std::vector<int> lens;  // varlen: each sequence's length; empty: batched
};

std::int64_t tokens(const Row& r) {
  std::int64_t n = 0;
  for (int l : r.lens) n += l;
  return r.lens.empty() ? std::int64_t(r.batch) * r.seqlen : n;
}

// The (query, key) pairs a row of one sequence keeps: seqlen_q == seqlen_k, so causal is a window
// bounded at 0 on the right.
double kept_pairs(const Row& r) {
  const int right = r.causal ? (r.window_right < 0 ? 0 : std::min(r.window_right, 0)) : r.window_right;
  double pairs = 0;
  for (int i = 0; i < r.seqlen; ++i) {
    const int lo = r.window_left < 0 ? 0 : std::max(0, i - r.window_left);
    const int hi = right < 0 ? r.seqlen - 1 : std::min(r.seqlen - 1, i + right);
    pairs += std::max(0, hi - lo + 1);
  }
  return pairs;
}

// The pairs every sequence of a row keeps, summed.
double row_pairs(const Row& r) {
  if (r.window_left >= 0 || r.window_right >= 0) return r.batch * kept_pairs(r);
  double pairs = 0;
  for (int l : r.lens.empty() ? std::vector<int>(r.batch, r.seqlen) : r.lens) pairs += double(l) * l;
  return pairs * (r.causal ? 0.5 : 1.0);
}

// "vLEN,LEN,...:HEADS:HDIM:CAUSAL[:HEADS_KV[:HDIM_V]]"; false where it does not parse.
bool parse_varlen(const char* spec, Row& r) {
  const char* at = spec + 1;
  char* end = nullptr;
  while (true) {
    const long l = std::strtol(at, &end, 10);
    if (end == at || l < 1) return false;
    r.lens.push_back(int(l));
    if (*end != ',') break;
    at = end + 1;
  }
  int causal = 0;
  const int n = std::sscanf(end, ":%d:%d:%d:%d:%d", &r.heads, &r.hdim, &causal, &r.heads_kv, &r.hdim_v);
  if (n < 3) return false;
  r.causal = causal != 0;
  if (n < 4) r.heads_kv = r.heads;
  if (n < 5) r.hdim_v = r.hdim;
  r.batch = int(r.lens.size());
  r.seqlen = *std::max_element(r.lens.begin(), r.lens.end());
  return true;
}

constexpr int kSets = 3;

}  // namespace

int main(int argc, char** argv) {
  int iters = 30;
  bool backward = false, deterministic = false;
  tileattn::DType dtype = tileattn::DType::bf16;
  std::vector<Row> rows;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) {
      dtype = std::strcmp(argv[++i], "f16") ? tileattn::DType::bf16 : tileattn::DType::f16;
    } else if (!std::strcmp(argv[i], "--backward")) {
      backward = true;
    } else if (!std::strcmp(argv[i], "--deterministic")) {
      deterministic = true;
    } else if (argv[i][0] == 'v') {
      Row r{};
      if (!parse_varlen(argv[i], r)) {
        std::fprintf(stderr, "%s: bad varlen row '%s'\n", argv[0], argv[i]);
        return 2;
      }
      rows.push_back(r);
    } else {
      Row r{};
      int causal = 0;
      const int n = std::sscanf(argv[i], "%d:%d:%d:%d:%d:%d:%d:%d:%d", &r.batch, &r.seqlen, &r.heads, &r.hdim, &causal,
                                &r.heads_kv, &r.hdim_v, &r.window_left, &r.window_right);
      if (n < 5 || n == 8) {
        std::fprintf(stderr,
                     "usage: %s [--iters N] [--dtype bf16|f16] [--backward [--deterministic]] "
                     "BATCH:SEQLEN:HEADS:HDIM:CAUSAL[:HEADS_KV[:HDIM_V[:WINDOW_LEFT:WINDOW_RIGHT]]] ... "
                     "vLEN,LEN,...:HEADS:HDIM:CAUSAL[:HEADS_KV[:HDIM_V]] ...\n",
                     argv[0]);
        return 2;
      }
      r.causal = causal != 0;
      if (n < 6) r.heads_kv = r.heads;
      if (n < 7) r.hdim_v = r.hdim;
      rows.push_back(r);
    }
  }

  std::size_t max_elems = 0;
  for (const Row& r : rows)
    max_elems = std::max(max_elems, std::size_t(tokens(r)) * r.heads * std::max(r.hdim, r.hdim_v));
  // Random inputs: one host pattern per tensor role, copied into every set.
  std::vector<std::uint16_t> host(max_elems);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  std::vector<void*> q(kSets), k(kSets), v(kSets), o(kSets), dout(kSets), dq(kSets), dk(kSets), dv(kSets);
  std::vector<std::vector<void*>*> roles{&q, &k, &v, &o};
  if (backward) roles.insert(roles.end(), {&dout, &dq, &dk, &dv});
  for (auto* bufs : roles) {
    for (auto& h : host) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const float f = (static_cast<float>(x >> 40) / 16777216.f - 0.5f) * 3.4f;
      h = dtype == tileattn::DType::bf16 ? tileattn::f32_to_bf16(f) : tileattn::f32_to_f16(f);
    }
    for (int s = 0; s < kSets; ++s) {
      check(cudaMalloc(&(*bufs)[s], max_elems * 2), "cudaMalloc");
      check(cudaMemcpy((*bufs)[s], host.data(), max_elems * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
  }
  std::size_t max_rows = 0;
  for (const Row& r : rows) max_rows = std::max(max_rows, std::size_t(tokens(r)) * r.heads);
  std::vector<void*> lse(kSets);
  for (auto& l : lse) check(cudaMalloc(&l, max_rows * sizeof(float)), "cudaMalloc");

  const tileattn::Device dev{tileattn::DeviceType::cuda, 0};
  for (const Row& r : rows) {
    const bool varlen = !r.lens.empty();
    // Varlen: the sequences' offsets on the device.
    int* cu = nullptr;
    if (varlen) {
      std::vector<int> offsets{0};
      for (int l : r.lens) offsets.push_back(offsets.back() + l);
      check(cudaMalloc(&cu, offsets.size() * sizeof(int)), "cudaMalloc");
      check(cudaMemcpy(cu, offsets.data(), offsets.size() * sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    const std::int64_t total = tokens(r);
    // A [batch, seqlen, heads, d] tensor, or varlen [total, heads, d].
    auto rows_of = [&](void* data, int heads, int d) {
      return varlen ? tileattn::view(data, dtype, {total, heads, d}, dev)
                    : tileattn::view(data, dtype, {r.batch, r.seqlen, heads, d}, dev);
    };
    auto args_for = [&](int s) {
      tileattn::ForwardArgs a;
      a.q = rows_of(q[s], r.heads, r.hdim);
      a.k = rows_of(k[s], r.heads_kv, r.hdim);
      a.v = rows_of(v[s], r.heads_kv, r.hdim_v);
      a.out = rows_of(o[s], r.heads, r.hdim_v);
      a.lse = varlen ? tileattn::view(lse[s], tileattn::DType::f32, {r.heads, total}, dev)
                     : tileattn::view(lse[s], tileattn::DType::f32, {r.batch, r.heads, r.seqlen}, dev);
      if (varlen) {
        a.cu_seqlens_q = a.cu_seqlens_k = tileattn::view(cu, tileattn::DType::i32, {r.batch + 1}, dev);
        a.max_seqlen_q = a.max_seqlen_k = r.seqlen;
      }
      a.options.causal = r.causal;
      a.options.window_left = r.window_left;
      a.options.window_right = r.window_right;
      a.options.backend = tileattn::Backend::cuda;
      return a;
    };
    auto bwd_args_for = [&](int s) {
      const tileattn::ForwardArgs f = args_for(s);
      tileattn::BackwardArgs a;
      a.q = f.q;
      a.k = f.k;
      a.v = f.v;
      a.out = f.out;
      a.lse = f.lse;
      a.cu_seqlens_q = f.cu_seqlens_q;
      a.cu_seqlens_k = f.cu_seqlens_k;
      a.max_seqlen_q = f.max_seqlen_q;
      a.max_seqlen_k = f.max_seqlen_k;
      a.dout = rows_of(dout[s], r.heads, r.hdim_v);
      a.dq = rows_of(dq[s], r.heads, r.hdim);
      a.dk = rows_of(dk[s], r.heads_kv, r.hdim);
      a.dv = rows_of(dv[s], r.heads_kv, r.hdim_v);
      a.options = f.options;
      a.options.deterministic = deterministic;
      return a;
    };
    auto call = [&](int s) {
      if (backward)
        tileattn::backward(bwd_args_for(s));
      else
        tileattn::forward(args_for(s));
    };
    if (backward)
      for (int s = 0; s < kSets; ++s) tileattn::forward(args_for(s));
    std::size_t free_before = 0, free_after = 0, device_bytes = 0;
    check(cudaDeviceSynchronize(), "forward");
    check(cudaMemGetInfo(&free_before, &device_bytes), "cudaMemGetInfo");
    for (int w = 0; w < 3; ++w) call(w % kSets);
    check(cudaDeviceSynchronize(), "warm-up");
    check(cudaMemGetInfo(&free_after, &device_bytes), "cudaMemGetInfo");
    int next = 0;
    const double median = bench::median_ms([&] { call(next++ % kSets); }, 0, iters);
    const double call_ms = bench::isolated_ms([&] { call(next++ % kSets); }, 0, iters);
    // 2 * (hdim + hdim_v) per (query, key) pair: S = Q K^T and O = P V. Causal rows count half the
    // square, as every peer's and FlashAttention's figures do (kept_pairs would add the diagonal).
    const double flops = (backward ? 2.5 : 1.0) * 2.0 * r.heads * row_pairs(r) * (r.hdim + r.hdim_v);
    const std::size_t lse_bytes = std::size_t(total) * r.heads * sizeof(float);
    std::string lens;  // the varlen row's lengths, as a JSON list
    for (int l : r.lens) lens += (lens.empty() ? "" : ", ") + std::to_string(l);
    std::printf(
        "{\"grid\": \"%s\", \"impl\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, \"seqlen_q\": %d, \"seqlen_k\": %d, "
        "\"heads_q\": %d, \"heads_kv\": %d, \"hdim\": %d, \"hdim_v\": %d, \"causal\": %s, \"window_left\": %d, \"window_right\": %d, "
        "\"varlen\": %s, \"lens\": [%s], \"tokens\": %lld, \"page_size\": null, \"ms\": %.5f, "
        "\"tflops\": %.2f, \"tbps\": null, \"call_ms\": %.5f, \"workspace_bytes\": %zu, \"lse_bytes\": %zu, \"device_alloc_bytes\": %lld}\n",
        backward ? "bwd" : "fwd", deterministic ? "tileattn-deterministic" : "tileattn", tileattn::dtype_name(dtype), r.batch, r.seqlen, r.seqlen, r.heads, r.heads_kv, r.hdim, r.hdim_v, r.causal ? "true" : "false",
        r.window_left, r.window_right, varlen ? "true" : "false", lens.c_str(), static_cast<long long>(total), median,
        flops / (median * 1e-3) / 1e12, call_ms,
        backward ? tileattn::workspace_size(bwd_args_for(0)) : tileattn::workspace_size(args_for(0)), lse_bytes,
        static_cast<long long>(free_before) - static_cast<long long>(free_after));
    if (cu) check(cudaFree(cu), "cudaFree");
    std::fflush(stdout);
  }
  return 0;
}
