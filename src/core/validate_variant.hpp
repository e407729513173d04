// Validation of the variant options and of the block mask: kept apart from the core's other checks
// (validate.cpp calls them) so that each stays small. Same contract: a clear tileattn::Error naming
// the argument and values, before anything is written.
#pragma once

#include "core/problem.hpp"

namespace tileattn {

// options.chunk_size and options.prefix_len; fills p.chunk and p.prefix_len. Needs p's sequence
// lengths and mask (window_left, window_right).
void check_variant_options(const char* fn, const Options& o, Problem& p);

// Document ids of a forward or backward call (absent: nothing to check); sets p.documents. Needs
// p's batch and sequence lengths (varlen: the packed token counts total_q, total_k).
void check_documents(const char* fn, const TensorView& ids_q, const TensorView& ids_k, const Device& dev,
                     std::int64_t total_q, std::int64_t total_k, Problem& p);

// Per-sequence prefix-LM lengths of a forward or backward call (absent: nothing to check); sets
// p.prefix_per_seq. Needs p's batch and mask; host-resident lengths are checked one by one.
void check_prefix_lens(const char* fn, const TensorView& t, const Options& o, const Device& dev, Problem& p);

// The block mask of a forward or backward call (absent: nothing to check); fills p.block_q,
// p.block_k and p.dense_mask. Needs p's batch, heads and sequence lengths. Counts and indices are checked element by
// element: host-resident ones always, device-resident ones where read_device (copied to the host).
void check_block_mask(const char* fn, const BlockMask& m, const Device& dev, bool read_device, Problem& p);

}  // namespace tileattn
