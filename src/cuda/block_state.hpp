// The block mask of a forward or backward call as the kernels read it (BlockState, fwd_params.hpp):
// its cells scattered from the caller's lists into the call's scratch, once per call.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/fwd_params.hpp"

namespace tileattn::cuda {

// Block sizes the cuda backend takes are multiples of this: every forward and backward kernel's
// query and key tiles divide it (the Hopper forward's 80- and 112-key tiles excepted: with a block
// mask, head dims 192 and 256 run the portable forward).
inline constexpr int kBlockMaskTile = 128;

// Scratch bytes of the cells (a multiple of 256; 0 without a block mask).
std::size_t block_state_bytes(const Problem& p, const BlockMask& m);

// Fills `scratch` (block_state_bytes of it) with the cells of m on the stream and returns the view
// the kernels take. Entries whose count or index is out of range (possible only where the core did
// not read device-resident lists: Options::check_device_indices off) are ignored.
BlockState make_block_state(const Problem& p, const BlockMask& m, unsigned char* scratch, cudaStream_t stream);

}  // namespace tileattn::cuda
