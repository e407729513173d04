// The backward kernels as seen from host code: one launcher per (dtype, head dim), defined in
// generated translation units (see CMakeLists.txt) and listed in instances.inc, plus the
// per-row kernels around them (bwd_rows.cu).
#pragma once

#include <cuda_runtime.h>

#include "cuda/bwd_params.hpp"
#include "tileattn/tensor.hpp"

namespace tileattn::cuda {

struct BwdGrid {
  int batch, heads_q, heads_kv, max_seqlen_q, max_seqlen_k;
  bool mods;           // softcap, ALiBi, dropout or a non-positive scale
  bool variant;        // takes_variant: the kernels' kVariant instantiations
  bool deterministic;  // bitwise-reproducible gradients
  bool sm90a;          // run the Hopper kernel (where built)
  cudaStream_t stream;
};

// Launches the dK/dV kernel and, in the deterministic mode, the dQ kernel.
template <DType kDtype, int kHeadDim>
void launch_bwd(const BwdParams& p, const BwdGrid& g);

// Whether the call runs the Hopper kernel (in the deterministic mode: whether dQ is summed in
// order in fp32 rows rather than by its own kernel).
template <DType kDtype, int kHeadDim>
bool bwd_runs_sm90(const BwdGrid& g);

// The Hopper kernel's key tile (keys per block); 0 where it is not built.
template <DType kDtype, int kHeadDim>
int bwd_sm90_key_tile();

// The head dim of the instantiation a call with head dim hdim runs on; 0 if none was built.
int backward_instance_hdim(DType dtype, int hdim);

// D = rowsum(dO * O) into p.dsum, p.turn_slots turns from p.dq_turns on zeroed, and p.dq_accum (if
// any, and no p.dq_turns) zeroed.
void launch_bwd_dsum(DType dtype, const BwdParams& p, cudaStream_t stream);
// dQ = the fp32 accumulator rows, as the element type (0 in a tile p.dq_turns has left at 0); a
// dependent launch of the main kernel.
void launch_bwd_dq_convert(DType dtype, const BwdParams& p, cudaStream_t stream);
// dK, dV = the fp32 rows of a split group (p.group_parts > 1), as the element type.
void launch_bwd_dkv_convert(DType dtype, const BwdParams& p, cudaStream_t stream);

}  // namespace tileattn::cuda
