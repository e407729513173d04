#include "cuda/runtime.hpp"

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/backends.hpp"
#include "cuda/scratch_align.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cuda {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(std::string("tileattn: CUDA error in ") + what + ": " + cudaGetErrorString(err));
}

void check_launch(const char* what) { check(cudaGetLastError(), what); }

namespace {

struct DeviceInfo {
  int sms = 0, major = 0, l2_bytes = 0;
};

// Attributes of the current device, queried once per device and process.
DeviceInfo device_info() {
  static std::mutex m;
  static std::vector<DeviceInfo> infos;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> g(m);
  if (static_cast<int>(infos.size()) <= dev) infos.resize(dev + 1);
  DeviceInfo& d = infos[dev];
  if (d.sms == 0) {
    check(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute");
  }
  return d;
}

// The pool of the calls' own scratch on the current device, made at its first use. It keeps
// freed memory for the next call, as PyTorch's caching allocator does: the device's default pool
// hands its memory back at every synchronization, so a call after one would map its scratch afresh
// (for the backward's fp32 dQ rows, a cost of the order of its dQ conversion kernel).
cudaMemPool_t scratch_pool() {
  static std::mutex m;
  static std::vector<cudaMemPool_t> pools;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> g(m);
  if (static_cast<int>(pools.size()) <= dev) pools.resize(dev + 1, nullptr);
  if (pools[dev] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = nullptr;
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate (the calls' scratch pool)");
    std::uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    pools[dev] = pool;
  }
  return pools[dev];
}

}  // namespace

int device_sm_count() { return device_info().sms; }

std::size_t device_l2_bytes() { return std::size_t(device_info().l2_bytes); }

bool device_has_dependent_launch() { return device_info().major >= 9; }

bool device_runs_sm90a() {
  static const bool portable = std::getenv("TILEATTN_CUDA_PORTABLE") != nullptr;
  return device_info().major == 9 && !portable;
}

void raise_smem_limit(const void* kernel, int bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  static std::mutex m;
  static std::map<std::pair<const void*, int>, int> raised;  // (kernel, device) -> limit set
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> g(m);
  int& limit = raised[{kernel, dev}];
  if (limit >= bytes) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  limit = bytes;
}

DeviceGuard::DeviceGuard(int index) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != index) check(cudaSetDevice(index), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  int now = 0;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

Workspace::Workspace(const Options& o, std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes == 0) return;
  const std::size_t skip = align_skip(o.workspace, kScratchAlign);
  if (o.workspace && o.workspace_bytes >= skip + bytes) {
    data_ = static_cast<char*>(o.workspace) + skip;
    return;
  }
  // Inside a stream capture the allocation becomes the graph's own (a pool cannot be made there).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  void* p = nullptr;
  if (capture == cudaStreamCaptureStatusNone)
    check(cudaMallocFromPoolAsync(&p, bytes, scratch_pool(), stream), "cudaMallocFromPoolAsync (call workspace)");
  else
    check(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync (call workspace, captured)");
  data_ = static_cast<char*>(p);
  owned_ = true;
}

Workspace::~Workspace() {
  if (owned_) cudaFreeAsync(data_, stream_);
}

std::vector<std::int32_t> read_i32(const TensorView& t) {
  // Copy the span the view covers (from its lowest address: strides may be negative), then gather
  // in logical order on the host.
  std::vector<std::int32_t> out;
  const std::int64_t n = t.numel();
  if (n == 0) return out;
  std::int64_t lo = 0, hi = 0;
  for (int d = 0; d < t.ndim; ++d) (t.stride[d] < 0 ? lo : hi) += (t.shape[d] - 1) * t.stride[d];
  std::vector<std::int32_t> raw(hi - lo + 1);
  DeviceGuard device(t.device.index);
  check(cudaMemcpy(raw.data(), static_cast<const std::int32_t*>(t.data) + lo, raw.size() * sizeof(std::int32_t),
                   cudaMemcpyDeviceToHost),
        "cudaMemcpy (reading index tensors to check them; see Options::check_device_indices)");
  out.reserve(n);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t at = -lo;
    for (std::int64_t d = t.ndim - 1, rest = i; d >= 0; --d) {
      at += rest % t.shape[d] * t.stride[d];
      rest /= t.shape[d];
    }
    out.push_back(raw[at]);
  }
  return out;
}

}  // namespace tileattn::cuda
