// Sorted document ids as per-row runs of keys, for the forward's element mask: where a sequence's
// ids never decrease (packed documents, each one run of rows and one of keys), row i's document is
// the run [begin, end) of keys with its id, so its partial tiles take one more bound per row instead
// of an id per element. Built on the device once per call into the call's scratch (the device's
// counterpart of cpu/document_runs: a binary search per row in place of the host's sweep); unsorted
// sequences keep the element test.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/fwd_params.hpp"

namespace tileattn::cuda {

// Scratch bytes of the runs (a multiple of 256; 0 without document ids): a flag per sequence and
// two ints per query row. rows: the call's query rows (batch x seqlen_q, or the packed total).
std::size_t document_runs_bytes(const Problem& p, std::int64_t rows);

// Fills `scratch` (document_runs_bytes of it) on the stream from p's ids and sets p.doc_sorted and
// p.doc_runs to it.
void make_document_runs(const Problem& pr, FwdParams& p, unsigned char* scratch, cudaStream_t stream);

}  // namespace tileattn::cuda
