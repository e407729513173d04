// Varlen: the rows of a packed tensor past cu_seqlens[batch] belong to no sequence. As on the CPU
// (cpu/varlen_tails.hpp), the cuda backend writes them as an empty sequence's: out = 0 and
// lse = -inf, dq = 0, dk = dv = 0, so that a caller who packs into a buffer of fixed size and reads
// or differentiates all of it never meets uninitialized memory. cu_seqlens[batch] is read on the
// device (the host never reads the device's cu_seqlens): in the backward by its D kernel, which every
// backward runs (varlen_tails.cuh); after the forward, and in calls that launch no kernel, by a small
// kernel of their own (varlen_tails.hpp).
#pragma once

#include <cstdint>

namespace tileattn::cuda {

// Rows [*end, rows) of up to two [rows, heads, cols] tensors of 2-byte elements (f16 and bf16 alike:
// zero is all zero bits in both), and of lse [heads, rows]. end == nullptr: nothing to write.
struct TailRows {
  const int* end;  // cu_seqlens + batch
  std::int64_t rows;
  int heads;
  std::uint16_t* t[2];  // nullptr: none
  std::int64_t row[2], head[2];
  int cols[2];
  float* lse;  // nullptr: none
  std::int64_t lse_row, lse_head;
};

}  // namespace tileattn::cuda
