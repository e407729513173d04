// CUDA runtime glue shared by the CUDA backend's entry points: errors as tileattn::Error, the
// current device, SM counts, and call workspace (caller-provided or stream-ordered allocation).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "tileattn/options.hpp"

namespace tileattn::cuda {

// Throws tileattn::Error naming `what` if err is not cudaSuccess.
void check(cudaError_t err, const char* what);
// Checks the launch that just happened (configuration errors surface here, asynchronously).
void check_launch(const char* what);

// Multiprocessors of the current device (cached per device).
int device_sm_count();
// Bytes of L2 cache of the current device (cached per device).
std::size_t device_l2_bytes();
// Whether the current device runs programmatic dependent launches (sm_90+): a kernel launched so
// may start while the previous one in the stream still runs, and waits for its results itself.
bool device_has_dependent_launch();
// Whether calls on the current device run the Hopper (sm_90a) kernels: the device is sm_90 and the
// environment variable TILEATTN_CUDA_PORTABLE is unset (set, it selects the portable sm_80 kernels,
// so that they can be tested and compared on a Hopper machine).
bool device_runs_sm90a();
// Raises `kernel`'s dynamic shared-memory limit on the current device to `bytes` (needed past
// 48 KB). The limit belongs to the kernel on its device, so the driver is asked once per (kernel,
// device) and later calls only look it up: asked on every launch, it cost a driver call per launch
// in the host time of small calls.
void raise_smem_limit(const void* kernel, int bytes, const char* what);

// Makes `index` the current device for the scope of a call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A call's scratch: the caller's options.workspace when it is large enough, otherwise a
// stream-ordered allocation from the library's pool on the device (which keeps freed memory for
// later calls; inside a stream capture, the graph's own), freed on the same stream after the
// call's kernels.
class Workspace {
 public:
  Workspace(const Options& o, std::size_t bytes, cudaStream_t stream);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  bool owned_ = false;
  cudaStream_t stream_ = nullptr;
};

}  // namespace tileattn::cuda
