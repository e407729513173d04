// The check every tensor view of a call goes through: rank, enums, shape, element count and byte
// extent in checked arithmetic, so a hostile view is reported before anything relies on it.
#pragma once

#include <cstdint>

#include "tileattn/tensor.hpp"

namespace tileattn {

// Every byte a tensor reaches must lie below 2^57, the top of the largest user address space of a
// 64-bit machine (x86-64 with 5-level paging): a view reaching past it cannot be memory, and would
// crash the kernels rather than read it. Then every sum of two byte offsets of a call, and every
// difference of two addresses the overlap check forms, fits in int64 with room to spare.
inline constexpr std::int64_t kMaxExtentBytes = std::int64_t{1} << 57;

// The view itself: present, rank, enums (dtype, device), non-negative shape, an element count and a
// byte extent that fit (the addresses it spans must not wrap around), data where there are
// elements, and a contiguous last dim unless any_strides. Throws tileattn::Error naming fn and name.
void check_tensor(const char* fn, const char* name, const TensorView& t, int ndim, bool any_strides = false);

void check_dtype(const char* fn, const char* name, const TensorView& t, DType want);

// ref_name: the tensor whose device every other argument must share.
void check_same_device(const char* fn, const char* name, const TensorView& t, const Device& dev,
                       const char* ref_name = "q");

}  // namespace tileattn
