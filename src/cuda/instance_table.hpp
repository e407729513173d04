// The lookup every kernel family's table of instantiations (one entry per built dtype and head
// dim, from the generated instances lists) shares.
#pragma once

#include <cstddef>

#include "tileattn/tensor.hpp"

namespace tileattn::cuda {

// Of the entries built for dtype, the one with the smallest head dim that holds hdim; nullptr if
// none does. Instance has members dtype and hdim.
template <class Instance, std::size_t N>
const Instance* smallest_instance(const Instance (&table)[N], DType dtype, int hdim) {
  const Instance* best = nullptr;
  for (const Instance& in : table)
    if (in.dtype == dtype && in.hdim >= hdim && (!best || in.hdim < best->hdim)) best = &in;
  return best;
}

}  // namespace tileattn::cuda
