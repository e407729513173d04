// The cuda backend's forward entry point: resolves kernel arguments from the validated problem,
// picks the smallest instantiated head dim that holds both head dims of the call, and provides the
// Hopper kernel's tile counter where it needs one.
#include <cuda_runtime.h>

#include "core/backends.hpp"
#include "cuda/attn_params.hpp"
#include "cuda/fwd_launch.hpp"
#include "cuda/runtime.hpp"
#include "cuda/scratch_align.hpp"
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

const FwdInstance* find_instance(DType dtype, int hdim) {
  const FwdInstance* best = nullptr;
  for (const auto& in : kInstances)
    if (in.dtype == dtype && in.hdim >= hdim && (!best || in.hdim < best->hdim)) best = &in;
  return best;
}

}  // namespace

int forward_instance_hdim(DType dtype, int hdim) {
  const FwdInstance* in = find_instance(dtype, hdim);
  return in ? in->hdim : 0;
}

// Masks and varlen make some work tiles cheaper than others: the Hopper kernel then has its blocks
// claim tiles from a counter in the call's scratch (tile_scheduler.cuh).
bool claims_tiles(const Problem& pr) {
  return device_runs_sm90a() && (pr.varlen || pr.window_left >= 0 || pr.window_right >= 0);
}

std::size_t workspace_size(const Problem& pr, const ForwardArgs& a) {
  DeviceGuard device(a.q.device.index);
  return reported_bytes(claims_tiles(pr) ? kTileCounterBytes : 0);
}

void forward(const Problem& pr, const ForwardArgs& a) {
  if (pr.batch == 0 || pr.seqlen_q == 0 || pr.heads_q == 0) return;
  DeviceGuard device(a.q.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.options.stream);
  const FwdParams p = attn_params(pr, {a.q, a.k, a.v, a.out, a.lse, a.cu_seqlens_q, a.cu_seqlens_k,
                                        a.alibi_slopes, a.options});
  const FwdInstance* in = find_instance(pr.dtype, pr.hdim_qk > pr.hdim_v ? pr.hdim_qk : pr.hdim_v);
  const bool claims = claims_tiles(pr);
  Workspace ws(a.options, claims ? kTileCounterBytes : 0, stream);
  const FwdGrid g{pr.batch, pr.heads_q, pr.seqlen_q,
                  pr.softcap > 0.f || pr.has_alibi || p.dropout || !(pr.scale > 0.f), device_runs_sm90a(),
                  claims ? reinterpret_cast<int*>(ws.data()) : nullptr, stream};
  in->launch(p, g);
}

}  // namespace tileattn::cuda
