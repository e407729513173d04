#include "cuda/block_state.hpp"

#include <cstdint>

#include "cuda/runtime.hpp"

namespace tileattn::cuda {
namespace {

// One of the caller's lists: counts [B, H, Q] and indices [B, H, Q, width], element strides.
struct List {
  const std::int32_t *num, *idx;
  std::int64_t n0, n1, n2, i0, i1, i2, i3;
  int width;
};

List list_of(const TensorView& num, const TensorView& idx) {
  return {num.ptr<const std::int32_t>(), idx.ptr<const std::int32_t>(), num.stride[0], num.stride[1], num.stride[2],
          idx.stride[0], idx.stride[1], idx.stride[2], idx.stride[3], static_cast<int>(idx.shape[3])};
}

// Block (b, h, q) of the grid writes the cells of row (b, h, q): `value` at each listed key block.
__global__ void scatter_kernel(BlockState s, List l, unsigned char value) {
  const int q = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int32_t* num = l.num + b * l.n0 + h * l.n1 + q * l.n2;
  const std::int32_t* idx = l.idx + b * l.i0 + h * l.i1 + q * l.i2;
  const int count = min(max(*num, 0), l.width);
  unsigned char* row = const_cast<unsigned char*>(s.row(b, h, q));
  for (int e = threadIdx.x; e < count; e += blockDim.x) {
    const int kb = idx[e * l.i3];
    if (kb >= 0 && kb < s.kblocks) row[kb] = value;
  }
}

BlockState shape_of(const Problem& p, const BlockMask& m) {
  BlockState s{};
  s.batches = static_cast<int>(m.kv_num_blocks.shape[0]);
  s.heads = static_cast<int>(m.kv_num_blocks.shape[1]);
  s.block_q = p.block_q;
  s.block_k = p.block_k;
  s.qblocks = (p.seqlen_q + p.block_q - 1) / p.block_q;
  s.kblocks = (p.seqlen_k + p.block_k - 1) / p.block_k;
  return s;
}

std::size_t cells(const BlockState& s) {
  return std::size_t(s.batches) * s.heads * std::size_t(s.qblocks) * std::size_t(s.row_cells());
}

}  // namespace

std::size_t block_state_bytes(const Problem& p, const BlockMask& m) {
  if (!p.block_sparse()) return 0;
  return (cells(shape_of(p, m)) + 255) / 256 * 256;
}

BlockState make_block_state(const Problem& p, const BlockMask& m, unsigned char* scratch, cudaStream_t stream) {
  BlockState s = shape_of(p, m);
  s.state = scratch;
  const std::size_t n = cells(s);
  if (n == 0) return s;
  check(cudaMemsetAsync(scratch, 0, n, stream), "cudaMemsetAsync (block mask cells)");
  const dim3 grid(s.qblocks, s.heads, s.batches);
  scatter_kernel<<<grid, 128, 0, stream>>>(s, list_of(m.kv_num_blocks, m.kv_indices), 1);
  check_launch("launching the block mask's scatter kernel");
  if (m.full_kv_num_blocks.present()) {
    scatter_kernel<<<grid, 128, 0, stream>>>(s, list_of(m.full_kv_num_blocks, m.full_kv_indices), 2);
    check_launch("launching the block mask's scatter kernel");
  }
  return s;
}

}  // namespace tileattn::cuda
