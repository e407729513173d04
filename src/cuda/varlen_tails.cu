#include "cuda/varlen_tails.hpp"

#include "cuda/runtime.hpp"
#include "cuda/varlen_tails.cuh"

namespace tileattn::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// A warp per (row, head), strided over the grid.
__global__ void tails_kernel(const TailRows t) {
  write_tails(t, std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32, std::int64_t(gridDim.x) * kWarps,
              threadIdx.x % 32, 32);
}

void add(TailRows& t, int i, const TensorView& x) {
  t.t[i] = static_cast<std::uint16_t*>(x.data);
  t.row[i] = x.stride[0];
  t.head[i] = x.stride[1];
  t.cols[i] = static_cast<int>(x.shape[2]);
}

TailRows tails(const Problem& p, const TensorView& cu, const TensorView& rows_of, int heads) {
  TailRows t{};
  if (!p.varlen) return t;
  t.end = cu.ptr<const int>() + p.batch;
  t.rows = rows_of.shape[0];
  t.heads = heads;
  return t;
}

}  // namespace

TailRows forward_tails(const Problem& p, const ForwardArgs& a) {
  TailRows t = tails(p, a.cu_seqlens_q, a.out, p.heads_q);
  if (t.end == nullptr) return t;
  add(t, 0, a.out);
  if (a.lse.present()) {
    t.lse = a.lse.ptr<float>();
    t.lse_head = a.lse.stride[0];
    t.lse_row = a.lse.stride[1];
  }
  return t;
}

TailRows key_tails(const Problem& p, const BackwardArgs& a) {
  TailRows t = tails(p, a.cu_seqlens_k, a.dk, p.heads_kv);
  if (t.end == nullptr) return t;
  add(t, 0, a.dk);
  add(t, 1, a.dv);
  return t;
}

TailRows query_tails(const Problem& p, const BackwardArgs& a) {
  TailRows t = tails(p, a.cu_seqlens_q, a.dq, p.heads_q);
  if (t.end != nullptr) add(t, 0, a.dq);
  return t;
}

void launch_varlen_tails(const TailRows& t, cudaStream_t stream) {
  if (t.end == nullptr || t.rows == 0 || t.heads == 0) return;
  // Enough warps for every (row, head) pair when all rows are tails, at most two blocks an SM: in the
  // usual call no row is one, and each block reads the end and leaves.
  const std::int64_t wanted = (t.rows * t.heads + kWarps - 1) / kWarps;
  const int blocks = static_cast<int>(wanted < 2 * device_sm_count() ? wanted : 2 * device_sm_count());
  tails_kernel<<<blocks, kThreads, 0, stream>>>(t);
  check_launch("launching the varlen tails kernel");
}

}  // namespace tileattn::cuda
