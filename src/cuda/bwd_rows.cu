// The backward's per-row kernels, 16-byte accesses, one thread per 8 columns and as many rows per
// warp as fit (a row's threads are a power of two, so they reduce by shuffles within the warp):
// D = rowsum(dO * O) (and the Hopper kernel's turn counters, or for the portable kernels the fp32
// dQ accumulator's row, zeroed) before the main kernels, and the accumulator scaled and converted to
// the output dtype after them (and a split group's dK, dV accumulators converted). The D kernel lets
// the Hopper kernel start as its dependent (dependent_launch.cuh) and the dQ conversion starts as
// the main kernel's, waiting for it on the device: the launches' gaps and the main kernel's
// prologue run under the kernel before.
#include <cuda_runtime.h>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "cuda/bwd_launch.hpp"
#include "cuda/dependent_launch.cuh"
#include "cuda/element.cuh"
#include "cuda/runtime.hpp"
#include "cuda/varlen_tails.cuh"

namespace tileattn::cuda {
namespace {

constexpr int kThreads = 256;

// Threads per row: one per 8 of `cols` columns, rounded up to a power of two (at most 32).
int threads_per_row(int cols) {
  int t = 1;
  while (t < 32 && t * 8 < cols) t *= 2;
  return t;
}

// The element offset of (row of the whole batch, head) in a tensor with these strides.
__device__ __forceinline__ std::int64_t row_offset(const BwdParams& p, std::int64_t row, int h, std::int64_t batch,
                                                   std::int64_t row_stride, std::int64_t head_stride) {
  const bool varlen = p.fwd.cu_q != nullptr;
  const std::int64_t b = varlen ? 0 : row / p.fwd.seqlen_q, i = varlen ? row : row % p.fwd.seqlen_q;
  return b * batch + i * row_stride + h * head_stride;
}

using Vec8 = cutlass::Array<float, 8>;

template <class E>
__device__ __forceinline__ Vec8 load8(const E* at) {
  const auto raw = *reinterpret_cast<const cutlass::Array<E, 8>*>(at);
  return cutlass::NumericArrayConverter<float, E, 8>{}(raw);
}

template <class E>
__global__ void dsum_kernel(const BwdParams p, int tpr) {
  allow_dependent_launch();  // the Hopper kernel waits for D and the turns where it reads them
  const std::int64_t threads = std::int64_t(gridDim.x) * gridDim.y * kThreads;
  for (std::int64_t i = (std::int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kThreads + threadIdx.x; i < p.turn_slots;
       i += threads)
    p.dq_turns[i] = 0;
  const std::int64_t row = std::int64_t(blockIdx.x) * (kThreads / tpr) + threadIdx.x / tpr;
  const int h = blockIdx.y, lane = threadIdx.x % tpr;
  // The varlen tails, each row group of the grid a worker (a kernel every backward runs anyway).
  const std::int64_t worker = std::int64_t(blockIdx.y) * gridDim.x * (kThreads / tpr) + row;
  const std::int64_t workers = std::int64_t(gridDim.x) * gridDim.y * (kThreads / tpr);
  write_tails(p.key_tails, worker, workers, lane, tpr);
  write_tails(p.query_tails, worker, workers, lane, tpr);
  const bool live = row < p.rows_total;  // every thread takes part in the shuffles
  const FwdParams& f = p.fwd;
  float sum = 0.f;
  if (live) {
    const E* o = static_cast<const E*>(f.o) + row_offset(p, row, h, f.o_batch, f.o_row, f.o_head);
    const E* dO = static_cast<const E*>(p.dout) + row_offset(p, row, h, p.do_batch, p.do_row, p.do_head);
    for (int c = lane * 8; c < f.d_v; c += tpr * 8) {
      const Vec8 a = load8(o + c), d = load8(dO + c);
      for (int e = 0; e < 8; ++e) sum += a[e] * d[e];
    }
  }
  for (int s = tpr / 2; s > 0; s /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  if (!live) return;
  if (lane == 0) p.dsum[h * p.rows_total + row] = sum;
  if (p.dq_accum != nullptr && p.dq_turns == nullptr) {  // the Hopper kernel stores first
    float* acc = p.dq_accum + (h * p.rows_total + row) * p.dq_cols;
    for (int c = lane * 4; c < p.dq_cols; c += tpr * 4) *reinterpret_cast<float4*>(acc + c) = make_float4(0, 0, 0, 0);
  }
}

// Whether the Hopper kernel wrote dQ row `row` (of the whole batch) of head h: its 64-row tile's
// turn counter is nonzero. False for rows past the sequences (varlen tails) and for tiles no key
// block reached (rows that see no key).
__device__ __forceinline__ bool dq_written(const BwdParams& p, std::int64_t row, int h) {
  const FwdParams& f = p.fwd;
  int b = 0;
  std::int64_t i = row;
  if (f.cu_q == nullptr) {
    b = int(row / f.seqlen_q);
    i = row % f.seqlen_q;
  } else {  // the last sequence starting at or before the row
    int lo = 0, hi = p.batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (seq_rows(f, mid).q_start <= row)
        lo = mid;
      else
        hi = mid - 1;
    }
    b = lo;
    const SeqRows r = seq_rows(f, b);
    i = row - r.q_start;
    if (i < 0 || i >= r.sq) return false;
  }
  const std::int64_t row_base = row - i;
  return p.dq_turns[dq_turn_index(p, h, row_base, b, int(i / kDqTurnRows * kDqTurnRows))] != 0;
}

// Heads and rows last to first, the order in which the Hopper kernel's blocks (KV heads, then
// sequences, slowest) leave them: the first blocks read the tiles written last, which L2 may hold.
template <class E>
__global__ void dq_convert_kernel(const BwdParams p, int tpr) {
  wait_for_primary();  // a dependent launch: the main kernel's sums are complete
  const std::int64_t row = std::int64_t(gridDim.x - 1 - blockIdx.x) * (kThreads / tpr) + threadIdx.x / tpr;
  const int h = gridDim.y - 1 - blockIdx.y, lane = threadIdx.x % tpr;
  if (row >= p.rows_total) return;
  const float* acc = p.dq_accum + (h * p.rows_total + row) * p.dq_cols;
  E* dq = static_cast<E*>(p.dq) + row_offset(p, row, h, p.dq_batch, p.dq_row, p.dq_head);
  const float scale = ds_scale(p.fwd);
  const bool written = p.dq_turns == nullptr || dq_written(p, row, h);  // else never-written memory: not read
  const std::int64_t acc_row = h * p.rows_total + row;
  for (int c = lane * 8; c < p.fwd.d_qk; c += tpr * 8) {
    // dq_column keeps an aligned group of 8 columns together (its permutation moves 4-column
    // chunks in pairs).
    Vec8 v;
    v.fill(0.f);
    if (written) v = *reinterpret_cast<const Vec8*>(acc + dq_column(acc_row, c));
    for (int e = 0; e < 8; ++e) v[e] *= scale;
    *reinterpret_cast<cutlass::Array<E, 8>*>(dq + c) = cutlass::NumericArrayConverter<E, float, 8>{}(v);
  }
}

// dK and dV from the fp32 rows of a split group (BwdParams::group_parts), already scaled.
template <class E>
__global__ void dkv_convert_kernel(const BwdParams p, int tpr) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (kThreads / tpr) + threadIdx.x / tpr;
  const int h = blockIdx.y, lane = threadIdx.x % tpr;
  if (row >= p.rows_k_total) return;
  const FwdParams& f = p.fwd;
  const bool varlen = f.cu_k != nullptr;
  const std::int64_t b = varlen ? 0 : row / f.seqlen_k, i = varlen ? row : row % f.seqlen_k;
  const std::int64_t acc_row = h * p.rows_k_total + row;
  auto convert = [&](const float* acc, E* out, int cols) {
    for (int c = lane * 8; c < cols; c += tpr * 8) {
      const Vec8 v = *reinterpret_cast<const Vec8*>(acc + acc_row * p.dq_cols + dq_column(acc_row, c));
      *reinterpret_cast<cutlass::Array<E, 8>*>(out + c) = cutlass::NumericArrayConverter<E, float, 8>{}(v);
    }
  };
  convert(p.dk_accum, static_cast<E*>(p.dk) + b * p.dk_batch + i * p.dk_row + h * p.dk_head, f.d_qk);
  convert(p.dv_accum, static_cast<E*>(p.dv) + b * p.dv_batch + i * p.dv_row + h * p.dv_head, f.d_v);
}

using RowKernel = void (*)(BwdParams, int);

// dependent: launched as a programmatic dependent of the work before it (the kernel waits for it).
void launch_rows(RowKernel f16, RowKernel bf16, DType dtype, const BwdParams& p, std::int64_t rows, int heads,
                 int cols, cudaStream_t stream, const char* what, bool dependent = false) {
  if (rows == 0) return;
  const int tpr = threads_per_row(cols), rows_per_block = kThreads / tpr;
  const dim3 grid(unsigned((rows + rows_per_block - 1) / rows_per_block), heads);
  const RowKernel kernel = dtype == DType::f16 ? f16 : bf16;
  if (dependent) {
    launch_dependent(kernel, grid, dim3(kThreads), 0, stream, p, tpr);
    return;
  }
  kernel<<<grid, kThreads, 0, stream>>>(p, tpr);
  check_launch(what);
}

}  // namespace

void launch_bwd_dsum(DType dtype, const BwdParams& p, cudaStream_t stream) {
  launch_rows(dsum_kernel<ElementOf<DType::f16>::type>, dsum_kernel<ElementOf<DType::bf16>::type>, dtype, p,
              p.rows_total, p.fwd.heads_q, p.fwd.d_v, stream, "launching the backward's D = rowsum(dO * O) kernel");
}

void launch_bwd_dq_convert(DType dtype, const BwdParams& p, cudaStream_t stream) {
  launch_rows(dq_convert_kernel<ElementOf<DType::f16>::type>, dq_convert_kernel<ElementOf<DType::bf16>::type>, dtype,
              p, p.rows_total, p.fwd.heads_q, p.fwd.d_qk, stream, "launching the backward's dQ conversion kernel",
              true);
}

void launch_bwd_dkv_convert(DType dtype, const BwdParams& p, cudaStream_t stream) {
  launch_rows(dkv_convert_kernel<ElementOf<DType::f16>::type>, dkv_convert_kernel<ElementOf<DType::bf16>::type>,
              dtype, p, p.rows_k_total, p.fwd.heads_q / p.fwd.group, p.fwd.d_qk > p.fwd.d_v ? p.fwd.d_qk : p.fwd.d_v,
              stream, "launching the backward's dK, dV conversion kernel");
}

}  // namespace tileattn::cuda
