// How the GPU benchmarks time a call, shared by the forward/backward and the decode programs so
// that every figure of ours is taken the way the Python scripts take the PyTorch peers'.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

namespace bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median milliseconds of fn over reps runs after warm-up runs, each bracketed by events and all
// issued back to back before one synchronization: the method bench/gpu_bench.py and
// bench/gpu_decode.py use for the peers (a call's host work overlaps the previous call's kernels).
template <class F>
double median_ms(F fn, int warmup = 5, int reps = 40) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<cudaEvent_t> a(reps), b(reps);
  for (int i = 0; i < reps; ++i) {
    cudaEventCreate(&a[i]);
    cudaEventCreate(&b[i]);
  }
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a[i]);
    fn();
    cudaEventRecord(b[i]);
  }
  check(cudaEventSynchronize(b[reps - 1]), "timed runs");
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    cudaEventElapsedTime(&t[i], a[i], b[i]);
    cudaEventDestroy(a[i]);
    cudaEventDestroy(b[i]);
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

// Median milliseconds of one call on an idle GPU (synchronized after each): the host's per-call
// work (validation, launches) and the launch latency included, as a caller that waits on every
// call sees it.
template <class F>
double isolated_ms(F fn, int warmup = 5, int reps = 40) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&t[i], a, b);
  }
  check(cudaGetLastError(), "timed runs");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

}  // namespace bench
