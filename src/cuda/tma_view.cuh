// A global tensor as the (rows, head dim, heads, batch) view the Hopper kernels' TMA descriptors are
// made from. TMA wants every stride a multiple of 16 bytes; a dimension of extent 1 may carry any
// stride in a view, so such a dimension gets the stride of a packed layout.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace tileattn::cuda {

using TmaGmemShape = cute::Shape<int, int, int, int>;

// entries: batch entries (1 for varlen, whose sequences are one packed entry).
template <class Element>
auto tma_gmem_view(const void* ptr, int rows, int d, int heads, int entries, std::int64_t row, std::int64_t head,
                   std::int64_t batch) {
  using namespace cute;
  rows = rows > 1 ? rows : 1;  // an empty tensor still needs a valid descriptor; no tile reads it
  const std::int64_t r = rows > 1 ? row : (d + 7) / 8 * 8;
  const std::int64_t hs = heads > 1 ? head : r * rows;
  const std::int64_t bs = entries > 1 ? batch : hs * heads;
  return make_tensor(make_gmem_ptr(static_cast<const Element*>(ptr)),
                     make_layout(make_shape(rows, d, heads, entries), make_stride(r, _1{}, hs, bs)));
}

}  // namespace tileattn::cuda
