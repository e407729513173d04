// Varlen: the rows of a packed tensor past cu_seqlens[batch] belong to no sequence. As on the CPU
// (cpu/varlen_tails.hpp), the cuda backend writes them as an empty sequence's: out = 0 and
// lse = -inf, dq = 0, dk = dv = 0, so that a caller who packs into a buffer of fixed size and reads
// or differentiates all of it never meets uninitialized memory. cu_seqlens[batch] is read on the
// device (the host never reads the device's cu_seqlens), so a small kernel does it after the call's
// own kernels, on its stream.
#pragma once

#include <cuda_runtime.h>

#include "core/problem.hpp"

namespace tileattn::cuda {

void write_varlen_tails(const Problem& p, const ForwardArgs& a, cudaStream_t stream);
// dk, dv, and dq where `dq_written` is false (the calls whose dQ no conversion pass covers: that
// pass writes every row, tails as zeros).
void write_varlen_tails(const Problem& p, const BackwardArgs& a, bool dq_written, cudaStream_t stream);

}  // namespace tileattn::cuda
