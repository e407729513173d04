// The host side of the varlen tails (tail_rows.hpp): the rows each call writes, and a kernel of
// their own for the forward and for the calls that launch no other.
#pragma once

#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/tail_rows.hpp"

namespace tileattn::cuda {

// out's and lse's tails of a forward call; none unless varlen.
TailRows forward_tails(const Problem& p, const ForwardArgs& a);
// dk's and dv's tails (keys) of a backward call, and dq's (queries); none unless varlen.
TailRows key_tails(const Problem& p, const BackwardArgs& a);
TailRows query_tails(const Problem& p, const BackwardArgs& a);

// Writes t on the stream with a small kernel of its own (nothing where t.end is nullptr).
void launch_varlen_tails(const TailRows& t, cudaStream_t stream);

}  // namespace tileattn::cuda
