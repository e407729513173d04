// Where the bench's tensors live: host memory, or CUDA device memory when the tool was built with
// the CUDA runtime. Only the tool uses this; the library takes caller-owned memory.
#pragma once

#include <cstddef>
#include <string>

namespace tileattn::tools {

bool cuda_device_present();  // a CUDA device answers (false in a build without the CUDA runtime)
std::string cuda_device_name();
std::string cpu_name();
void cuda_synchronize();

// Device memory, uninitialized. Throws where the CUDA runtime is absent or fails.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  void upload(const void* host);
  void download(void* host) const;

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace tileattn::tools
