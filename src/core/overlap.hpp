// Memory overlap of strided views, for validation: outputs must not alias each other, an input, or
// themselves, or the result would depend on the order in which threads write.
#pragma once

#include <cstddef>

#include "tileattn/tensor.hpp"

namespace tileattn {

// True if the two views may share a byte. Exact for practical layouts (each stride at least the
// span of the smaller ones, e.g. dq/dk/dv interleaved in one packed buffer, which do not overlap);
// a layout too tangled to decide quickly counts as overlapping.
bool views_overlap(const TensorView& a, const TensorView& b);

// True if the byte range [data, data + bytes) may share a byte with the view (of any device: a
// caller's workspace is the backend's own memory). Validated: below address 2^57.
bool range_overlaps(const void* data, std::size_t bytes, const TensorView& v);

// True if the view maps two different elements to the same memory (a zero stride, or strides that
// interleave in a way the simple ordering check cannot rule out).
bool view_self_overlaps(const TensorView& t);

}  // namespace tileattn
