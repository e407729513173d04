// The entry points every backend implements for a validated problem. The core calls them; they
// call nothing in the core but the scratch allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace tileattn {

bool cuda_available();  // the library was built with the CUDA backend

namespace cpu {
void reference_forward(const Problem& p, const ForwardArgs& a);
void reference_backward(const Problem& p, const BackwardArgs& a);
void reference_decode(const Problem& p, const DecodeArgs& a);

void flash_forward(const Problem& p, const ForwardArgs& a);
void flash_backward(const Problem& p, const BackwardArgs& a);
void flash_decode(const Problem& p, const DecodeArgs& a);
void combine(const Problem& p, const CombineArgs& a);

std::size_t workspace_size(const Problem& p, const ForwardArgs& a);
std::size_t workspace_size(const Problem& p, const BackwardArgs& a);
std::size_t workspace_size(const Problem& p, const DecodeArgs& a);
}  // namespace cpu

namespace cuda {
// Copies a device int32 tensor to the host, in logical row-major order.
std::vector<std::int32_t> read_i32(const TensorView& t);

void forward(const Problem& p, const ForwardArgs& a);
void backward(const Problem& p, const BackwardArgs& a);
void decode(const Problem& p, const DecodeArgs& a);
void combine(const Problem& p, const CombineArgs& a);

std::size_t workspace_size(const Problem& p, const ForwardArgs& a);
std::size_t workspace_size(const Problem& p, const BackwardArgs& a);
std::size_t workspace_size(const Problem& p, const DecodeArgs& a);

// For the core's validation: why the cuda backend cannot run this call (host pointers, dtypes or
// head dims without a kernel, misaligned data); empty when it can.
std::string check_forward(const Problem& p, const ForwardArgs& a);
std::string check_backward(const Problem& p, const BackwardArgs& a);
std::string check_decode(const Problem& p, const DecodeArgs& a);
// Once the head dims are known (check_decode runs before: it clears the index tensors to be read).
std::string check_decode_head_dim(const Problem& p);
std::string check_combine(const Problem& p, const CombineArgs& a);
}  // namespace cuda

}  // namespace tileattn
