// The decode kernels' instantiations as seen from host code: per (dtype, head dim), the kernel a
// call with a given number of query rows per KV head runs, defined in generated translation units
// (see src/cuda/CMakeLists.txt) and listed in decode_instances.inc.
#pragma once

#include <cstddef>

#include "tileattn/tensor.hpp"

namespace tileattn::cuda {

// The head dim of the decode instantiation a call with head dim hdim runs on; 0 if none was built.
int decode_instance_hdim(DType dtype, int hdim);

namespace decoding {

struct Params;  // common.cuh

// A decode kernel as the host sees it: the function, its block size and shared memory, and how
// many query rows of a (sequence, KV head) one block carries.
struct Kernel {
  void (*fn)(Params);
  int threads;
  std::size_t smem;
  int rows;
  int per_sm = 0;  // resident blocks per SM
};

// rows: query rows per KV head (seqlen_q x group); per_key: a key tile may span pages.
template <DType kDtype, int kHeadDim>
Kernel pick_kernel(int rows, bool per_key);

}  // namespace decoding
}  // namespace tileattn::cuda
