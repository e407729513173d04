// Device memory for the GPU tests: buffers, copies of host tensors (strides kept), and whether a
// usable GPU is present.
#pragma once

#include <cstddef>
#include <string>

#include "support/host_tensor.hpp"
#include "tileattn/tensor.hpp"

namespace tileattn::test {

// Empty when a GPU is usable; otherwise why not (for GTEST_SKIP).
std::string gpu_unavailable();

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  void fill(unsigned char byte);  // every byte (cudaMemset, on the default stream)

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A host tensor's bytes on the device, with the same shape and strides.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host);  // copies host's contents
  TensorView view() const;                        // device = cuda:0
  void to_host(HostTensor& host) const;           // host must have the same shape and storage order
  void* data() const { return buf_.data(); }

 private:
  DeviceBuffer buf_;
  TensorView view_;
};

void device_synchronize();  // throws on any pending device error

// A stream of the caller's, as options.stream takes it.
class DeviceStream {
 public:
  DeviceStream();
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  void* get() const { return stream_; }
  void synchronize() const;

 private:
  void* stream_ = nullptr;
};

}  // namespace tileattn::test
