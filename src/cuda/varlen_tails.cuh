// The writing of a call's varlen tails (tail_rows.hpp), shared by the kernels that take it on.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/tail_rows.hpp"

namespace tileattn::cuda {

// One worker's share of the tails: the (row, head) units worker, worker + workers, ..., each by the
// `width` threads of that worker (lane in [0, width)). The end is clamped to the buffers: cu_seqlens
// on the device are the caller's, and no value of theirs may make this write outside the tensors.
__device__ __forceinline__ void write_tails(const TailRows& t, std::int64_t worker, std::int64_t workers, int lane,
                                            int width) {
  if (t.end == nullptr) return;
  const std::int64_t end = min(max(std::int64_t(*t.end), std::int64_t(0)), t.rows);
  const std::int64_t units = (t.rows - end) * t.heads;
  for (std::int64_t u = worker; u < units; u += workers) {
    const std::int64_t r = end + u / t.heads;
    const int h = int(u % t.heads);
    for (int i = 0; i < 2; ++i) {
      if (t.t[i] == nullptr) continue;
      std::uint16_t* row = t.t[i] + r * t.row[i] + h * t.head[i];
      for (int c = lane; c < t.cols[i]; c += width) row[c] = 0;
    }
    if (t.lse != nullptr && lane == 0) t.lse[h * t.lse_head + r * t.lse_row] = -INFINITY;
  }
}

}  // namespace tileattn::cuda
