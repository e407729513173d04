// Hopper's bulk copy engine adding a contiguous shared-memory buffer into global memory
// (cp.reduce.async.bulk, sm_90) or copying it there (cp.async.bulk), and the waits on those:
// one instruction from one thread replaces a tile's worth of per-thread atomics and leaves the
// issuing warps free.
#pragma once

#include <cstdint>

namespace tileattn::cuda {

// global[0, bytes) += shared[0, bytes) as fp32, asynchronously. Both addresses 16-byte aligned,
// bytes a multiple of 16. The shared buffer's writers fence it for the async proxy first.
__device__ __forceinline__ void bulk_reduce_add_f32(float* global, const float* shared, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global), "r"(s),
               "r"(bytes)
               : "memory");
#endif
}

// global[0, bytes) = shared[0, bytes), asynchronously; the same alignment as bulk_reduce_add_f32.
__device__ __forceinline__ void bulk_store(float* global, const float* shared, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(global), "r"(s), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// Until at most kPending of this thread's committed groups still read their shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Until at most kPending of this thread's committed groups have writes outstanding.
template <int kPending = 0>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Turnstiles between blocks: a block waits until the counter reaches `count`, then passes itself
// (adding `by`) once its bulk writes are complete (bulk_wait). The proxy fences order the copy
// engine's writes with the counter on both sides.
__device__ __forceinline__ void turn_wait(const int* turn, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
  } while (seen < count);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void turn_pass(int* turn, int by = 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(turn), "r"(by) : "memory");
#endif
}

}  // namespace tileattn::cuda
