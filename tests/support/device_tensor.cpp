#include "support/device_tensor.hpp"

#include <stdexcept>
#include <utility>

#include <cuda_runtime.h>

namespace tileattn::test {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

std::size_t storage_bytes(const HostTensor& h) {
  return static_cast<std::size_t>(h.numel()) * dtype_size(h.dtype()) + 1;
}

}  // namespace

std::string gpu_unavailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device present";
  return {};
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) { check(cudaMalloc(&data_, bytes), "cudaMalloc"); }
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  return *this;
}
void DeviceBuffer::fill(unsigned char byte) { check(cudaMemset(data_, byte, bytes_), "cudaMemset"); }

DeviceTensor::DeviceTensor(const HostTensor& host) : buf_(storage_bytes(host)), view_(host.view()) {
  check(cudaMemcpy(buf_.data(), view_.data, storage_bytes(host), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  view_.data = buf_.data();
  view_.device = Device{DeviceType::cuda, 0};
}

TensorView DeviceTensor::view() const { return view_; }

void DeviceTensor::to_host(HostTensor& host) const {
  check(cudaMemcpy(host.data(), buf_.data(), storage_bytes(host), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

DeviceStream::DeviceStream() {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
}
DeviceStream::~DeviceStream() { cudaStreamDestroy(static_cast<cudaStream_t>(stream_)); }
void DeviceStream::synchronize() const {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

}  // namespace tileattn::test
