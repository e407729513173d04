#include "cuda/document_runs.hpp"

#include "cuda/runtime.hpp"

namespace tileattn::cuda {
namespace {

std::size_t flag_bytes(const Problem& p) { return (std::size_t(p.batch) * sizeof(int) + 255) / 256 * 256; }

// The first of keys [0, n) (ids at ids[j * stride], non-decreasing) whose id is > d (upper) or
// >= d (lower).
template <bool kUpper>
__device__ int bound(const int* ids, std::int64_t stride, int n, int d) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const int x = ids[mid * stride];
    if (kUpper ? x <= d : x < d)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Block b: sequence b's ids checked for order, then each row's run by binary search.
__global__ void runs_kernel(FwdParams p, int* sorted, int2* runs) {
  const int b = blockIdx.x;
  const auto [q_start, k_start, sq, sk] = seq_rows(p, b);
  const int* dq = p.doc_q + b * p.doc_q_batch + std::int64_t(q_start) * p.doc_q_row;
  const int* dk = p.doc_k + b * p.doc_k_batch + std::int64_t(k_start) * p.doc_k_row;
  int down = 0;
  for (int i = threadIdx.x; i + 1 < sq; i += blockDim.x) down |= dq[(i + 1) * p.doc_q_row] < dq[i * p.doc_q_row];
  for (int j = threadIdx.x; j + 1 < sk; j += blockDim.x) down |= dk[(j + 1) * p.doc_k_row] < dk[j * p.doc_k_row];
  down = __syncthreads_or(down);
  if (threadIdx.x == 0) sorted[b] = !down;
  if (down) return;
  int2* out = runs + (p.cu_q != nullptr ? 0 : std::int64_t(b) * p.seqlen_q) + q_start;
  for (int i = threadIdx.x; i < sq; i += blockDim.x) {
    const int d = dq[i * p.doc_q_row];
    out[i] = make_int2(bound<false>(dk, p.doc_k_row, sk, d), bound<true>(dk, p.doc_k_row, sk, d));
  }
}

}  // namespace

std::size_t document_runs_bytes(const Problem& p, std::int64_t rows) {
  if (!p.documents) return 0;
  return flag_bytes(p) + (std::size_t(rows) * sizeof(int2) + 255) / 256 * 256;
}

void make_document_runs(const Problem& pr, FwdParams& p, unsigned char* scratch, cudaStream_t stream) {
  int* sorted = reinterpret_cast<int*>(scratch);
  int2* runs = reinterpret_cast<int2*>(scratch + flag_bytes(pr));
  runs_kernel<<<pr.batch, 256, 0, stream>>>(p, sorted, runs);
  check_launch("launching the document runs kernel");
  p.doc_sorted = sorted;
  p.doc_runs = reinterpret_cast<const int*>(runs);
}

}  // namespace tileattn::cuda
