// Programmatic dependent launch (sm_90+): a kernel launched as the dependent of the one before it
// starts once every block of that one has allowed it (allow_dependent_launch) or ended, and waits
// for it on the device (wait_for_primary) only before it first reads what that kernel writes, so
// the launch gap and its prologue run under the other's end. Kernels that count on zeroed counters
// (work claimed tile by tile, arrivals of split blocks) start so behind a one-block kernel that
// zeroes them. Without the launch attribute, or before sm_90, the device calls are no-ops and the
// kernels run one after the other.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime.h>

#include "cuda/runtime.hpp"

namespace tileattn::cuda {

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

template <class C>
__global__ void clear_counters(C* counters, int n) {
  allow_dependent_launch();
  wait_for_primary();  // launched early (launch_after_clearing's `early`): the counters' last users are done
  for (int i = threadIdx.x; i < n; i += blockDim.x) counters[i] = 0;
}

// Launches kernel<<<grid, block, smem, s>>>(args...) as a programmatic dependent of the work before
// it on stream s, where the device has dependent launch: its blocks may start while that work
// finishes, so it calls wait_for_primary() before it first reads or writes what that work touches.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
                      Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = device_has_dependent_launch() ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), "launching a kernel as a dependent launch");
}

// Zeroes counters[0, n) on stream s, then launches kernel<<<grid, block, smem, s>>>(args...) as the
// clearing kernel's programmatic dependent. early: the clearing kernel itself is a dependent launch
// of the work before it, so that neither launch waits for that work to end; the kernel must then
// call wait_for_primary() before it reads anything earlier work writes, not only the counters.
template <class C, class... Params, class... Args>
void launch_after_clearing(C* counters, int n, bool early, void (*kernel)(Params...), dim3 grid, dim3 block,
                           std::size_t smem, cudaStream_t s, Args&&... args) {
  if (early) {
    launch_dependent(clear_counters<C>, dim3(1), dim3(256), 0, s, counters, n);
  } else {
    clear_counters<<<1, 256, 0, s>>>(counters, n);
    check_launch("clearing the work counters");
  }
  launch_dependent(kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace tileattn::cuda
