// The forward kernel's instantiations as seen from host code: one launcher per (dtype, head dim),
// defined in generated translation units (see CMakeLists.txt) and listed in instances.inc.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "cuda/fwd_params.hpp"
#include "tileattn/tensor.hpp"

namespace tileattn::cuda {

struct FwdGrid {
  int batch, heads_q, max_seqlen_q;
  bool mods;  // softcap, ALiBi, dropout or a non-positive scale: the kernel variant that applies them
  bool variant;  // takes_variant: the kernels that take chunks, document ids, prefixes and block masks
  bool sm90a;  // run the Hopper kernel (where built)
  int block_q, block_k;  // the block mask's block sizes (0: none): the Hopper kernel's tiles must divide them
  int* tile_counter;  // Hopper kernel: claim tiles from this counter (zeroed by the launch); nullptr: static order
  int sm_margin;      // Hopper kernel: SMs left free (Options::sm_margin)
  cudaStream_t stream;
};

// The scratch of a forward call that claims its tiles: the counter, alone in its 256 bytes.
inline constexpr std::size_t kTileCounterBytes = 256;

template <DType kDtype, int kHeadDim>
void launch_fwd(const FwdParams& p, const FwdGrid& g);

// The head dim of the instantiation a call with head dim hdim runs on; 0 if none was built.
int forward_instance_hdim(DType dtype, int hdim);

}  // namespace tileattn::cuda
