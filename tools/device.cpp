#include "device.hpp"

#include <fstream>
#include <stdexcept>

#if defined(TILEATTN_CLI_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace tileattn::tools {

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

#if defined(TILEATTN_CLI_CUDA)

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

bool cuda_device_present() {
  int n = 0;
  // Without a driver this fails ("driver version is insufficient"): no device then.
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string cuda_device_name() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return prop.name;
}

void cuda_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes) check(cudaMalloc(&data_, bytes), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
void DeviceBuffer::upload(const void* host) {
  check(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
void DeviceBuffer::download(void* host) const {
  check(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

#else

bool cuda_device_present() { return false; }
std::string cuda_device_name() { return "none"; }
void cuda_synchronize() {}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  throw std::runtime_error("this tileattn tool was built without the CUDA runtime");
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const void*) {}
void DeviceBuffer::download(void*) const {}

#endif

}  // namespace tileattn::tools
