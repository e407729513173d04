// The cuda backend's forward entry point: resolves kernel arguments from the validated problem,
// picks the smallest instantiated head dim that holds both head dims of the call, and provides the
// Hopper kernel's tile counter where it needs one.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/backends.hpp"
#include "cuda/attn_params.hpp"
#include "cuda/block_state.hpp"
#include "cuda/document_runs.hpp"
#include "cuda/fwd_launch.hpp"
#include "cuda/instance_table.hpp"
#include "cuda/runtime.hpp"
#include "cuda/scratch_align.hpp"
#include "cuda/varlen_tails.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cuda {
namespace {

struct FwdInstance {
  DType dtype;
  int hdim;
  void (*launch)(const FwdParams&, const FwdGrid&);
};

constexpr FwdInstance kInstances[] = {
#define TA_INSTANCE(dtype, hdim) {DType::dtype, hdim, &launch_fwd<DType::dtype, hdim>},
#include "instances.inc"
#undef TA_INSTANCE
};

const FwdInstance* find_instance(DType dtype, int hdim) { return smallest_instance(kInstances, dtype, hdim); }

}  // namespace

int forward_instance_hdim(DType dtype, int hdim) {
  const FwdInstance* in = find_instance(dtype, hdim);
  return in ? in->hdim : 0;
}

// Masks and varlen make some work tiles cheaper than others: the Hopper kernel then has its blocks
// claim tiles from a counter in the call's scratch (tile_scheduler.cuh). Not where every tile has a
// block of its own (one wave, counted with the kernels' smallest query tile, 128 rows): nothing is
// left to claim there, and a small call then allocates no scratch and launches no clearing kernel,
// which its host time would feel.
bool claims_tiles(const Problem& pr) {
  if (!device_runs_sm90a() || !(pr.varlen || pr.window_left >= 0 || pr.window_right >= 0 || takes_variant(pr)))
    return false;
  const std::int64_t tiles = (std::int64_t{pr.seqlen_q} + 127) / 128 * pr.batch * pr.heads_q;
  return tiles > device_sm_count();
}

// The call's scratch: the tile counter (where claimed), then the block mask's cells, then the
// document ids' runs.
std::size_t counter_bytes(const Problem& pr) { return claims_tiles(pr) ? kTileCounterBytes : 0; }

std::size_t runs_bytes(const Problem& pr, const ForwardArgs& a) {
  return document_runs_bytes(pr, pr.varlen ? a.q.shape[0] : std::int64_t(pr.batch) * pr.seqlen_q);
}

std::size_t workspace_size(const Problem& pr, const ForwardArgs& a) {
  DeviceGuard device(a.q.device.index);
  return reported_bytes(counter_bytes(pr) + block_state_bytes(pr, a.block_mask) + runs_bytes(pr, a));
}

namespace {

void run(const Problem& pr, const ForwardArgs& a, cudaStream_t stream) {
  FwdParams p = attn_params(pr, {a.q, a.k, a.v, a.out, a.lse, a.cu_seqlens_q, a.cu_seqlens_k, a.alibi_slopes,
                                  a.document_ids_q, a.document_ids_k, a.prefix_lens, a.block_mask.mask, a.options});
  const FwdInstance* in = find_instance(pr.dtype, pr.hdim());
  const std::size_t counter = counter_bytes(pr), cells = block_state_bytes(pr, a.block_mask);
  Workspace ws(a.options, counter + cells + runs_bytes(pr, a), stream);
  if (pr.block_sparse())
    p.blocks = make_block_state(pr, a.block_mask, reinterpret_cast<unsigned char*>(ws.data() + counter), stream);
  if (pr.documents) make_document_runs(pr, p, reinterpret_cast<unsigned char*>(ws.data() + counter + cells), stream);
  const FwdGrid g{pr.batch, pr.heads_q, pr.seqlen_q,
                  pr.softcap > 0.f || pr.has_alibi || p.dropout || !(pr.scale > 0.f),
                  takes_variant(pr), device_runs_sm90a(),
                  pr.block_q, pr.block_k, counter ? reinterpret_cast<int*>(ws.data()) : nullptr,
                  a.options.sm_margin, stream};
  in->launch(p, g);
}

}  // namespace

void forward(const Problem& pr, const ForwardArgs& a) {
  if (pr.heads_q == 0) return;
  DeviceGuard device(a.q.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.options.stream);
  if (pr.batch > 0 && pr.seqlen_q > 0) run(pr, a, stream);
  // The varlen tails in a kernel of their own, after the forward's where there is one: folded into
  // the Hopper kernel's idle producer warps they cost the plain calls up to 1.5%
  // (bench/notes/forward.md).
  launch_varlen_tails(forward_tails(pr, a), stream);
}

}  // namespace tileattn::cuda
