#include "cuda/varlen_tails.hpp"

#include <cmath>
#include <cstdint>

#include "cuda/runtime.hpp"

namespace tileattn::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// Rows [cu[batch], rows) of up to two [rows, heads, cols] tensors of 2-byte elements (f16 and bf16
// alike: zero is all zero bits in both), and of lse [heads, rows].
struct Tails {
  const int* end;  // cu_seqlens + batch
  std::int64_t rows;
  int heads;
  std::uint16_t* t[2];  // nullptr: none
  std::int64_t row[2], head[2];
  int cols[2];
  float* lse;  // nullptr: none
  std::int64_t lse_row, lse_head;
};

// A warp per (row, head), strided over the grid. The end is clamped to the buffer: cu_seqlens on the
// device are the caller's, and no value of theirs may make this write outside the tensors.
__global__ void tails_kernel(const Tails t) {
  const std::int64_t end = min(max(std::int64_t(*t.end), std::int64_t(0)), t.rows);
  const std::int64_t units = (t.rows - end) * t.heads;
  const int lane = threadIdx.x % 32;
  for (std::int64_t u = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; u < units;
       u += std::int64_t(gridDim.x) * kWarps) {
    const std::int64_t r = end + u / t.heads;
    const int h = int(u % t.heads);
    for (int i = 0; i < 2; ++i) {
      if (t.t[i] == nullptr) continue;
      std::uint16_t* row = t.t[i] + r * t.row[i] + h * t.head[i];
      for (int c = lane; c < t.cols[i]; c += 32) row[c] = 0;
    }
    if (t.lse != nullptr && lane == 0) t.lse[h * t.lse_head + r * t.lse_row] = -INFINITY;
  }
}

void add(Tails& t, int i, const TensorView& x) {
  t.t[i] = static_cast<std::uint16_t*>(x.data);
  t.row[i] = x.stride[0];
  t.head[i] = x.stride[1];
  t.cols[i] = static_cast<int>(x.shape[2]);
}

Tails tails(const TensorView& cu, int batch, const TensorView& rows_of, int heads) {
  Tails t{};
  t.end = cu.ptr<const int>() + batch;
  t.rows = rows_of.shape[0];
  t.heads = heads;
  return t;
}

void launch(const Tails& t, cudaStream_t stream) {
  if (t.rows == 0 || t.heads == 0) return;
  // Enough warps for every (row, head) pair when all rows are tails, at most two blocks an SM: in the
  // usual call no row is one, and each block reads the end and leaves.
  const std::int64_t units = t.rows * t.heads, wanted = (units + kWarps - 1) / kWarps;
  const int blocks = static_cast<int>(wanted < 2 * device_sm_count() ? wanted : 2 * device_sm_count());
  tails_kernel<<<blocks, kThreads, 0, stream>>>(t);
  check_launch("launching the varlen tails kernel");
}

}  // namespace

void write_varlen_tails(const Problem& p, const ForwardArgs& a, cudaStream_t stream) {
  if (!p.varlen) return;
  Tails t = tails(a.cu_seqlens_q, p.batch, a.out, p.heads_q);
  add(t, 0, a.out);
  if (a.lse.present()) {
    t.lse = a.lse.ptr<float>();
    t.lse_head = a.lse.stride[0];
    t.lse_row = a.lse.stride[1];
  }
  launch(t, stream);
}

void write_varlen_tails(const Problem& p, const BackwardArgs& a, bool dq_written, cudaStream_t stream) {
  if (!p.varlen) return;
  Tails t = tails(a.cu_seqlens_k, p.batch, a.dk, p.heads_kv);
  add(t, 0, a.dk);
  add(t, 1, a.dv);
  launch(t, stream);
  if (dq_written) return;
  Tails tq = tails(a.cu_seqlens_q, p.batch, a.dq, p.heads_q);
  add(tq, 0, a.dq);
  launch(tq, stream);
}

}  // namespace tileattn::cuda
