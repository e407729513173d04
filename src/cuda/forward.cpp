// The cuda backend's forward entry point: resolves kernel arguments from the validated problem and
// picks the smallest instantiated head dim that holds both head dims of the call.
#include <cuda_runtime.h>

#include "common/score_mod.hpp"
#include "core/backends.hpp"
#include "cuda/fwd_launch.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cuda {
namespace {

struct FwdInstance {
  DType dtype;
  int hdim;
  void (*launch)(const FwdParams&, const FwdGrid&);
};

constexpr FwdInstance kInstances[] = {
#define TA_FWD_INSTANCE(dtype, hdim) {DType::dtype, hdim, &launch_fwd<DType::dtype, hdim>},
#include "fwd_instances.inc"
#undef TA_FWD_INSTANCE
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

std::size_t workspace_size(const Problem&, const ForwardArgs&) { return 0; }

void forward(const Problem& pr, const ForwardArgs& a) {
  if (pr.batch == 0 || pr.seqlen_q == 0 || pr.heads_q == 0) return;
  FwdParams p{};
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.out.data;
  p.lse = a.lse.present() ? a.lse.ptr<float>() : nullptr;
  // Batched tensors are [b, s, h, d], varlen ones [total, h, d] whose rows start at cu_seqlens[b].
  const int r = pr.varlen ? 0 : 1;
  auto strides = [&](const TensorView& t, std::int64_t& batch, std::int64_t& row, std::int64_t& head) {
    batch = pr.varlen ? 0 : t.stride[0];
    row = t.stride[r];
    head = t.stride[r + 1];
  };
  strides(a.q, p.q_batch, p.q_row, p.q_head);
  strides(a.k, p.k_batch, p.k_row, p.k_head);
  strides(a.v, p.v_batch, p.v_row, p.v_head);
  strides(a.out, p.o_batch, p.o_row, p.o_head);
  if (p.lse) {
    p.lse_batch = pr.varlen ? 0 : a.lse.stride[0];
    p.lse_head = a.lse.stride[pr.varlen ? 0 : 1];
    p.lse_row = a.lse.stride[pr.varlen ? 1 : 2];
  }
  p.cu_q = pr.varlen ? a.cu_seqlens_q.ptr<const int>() : nullptr;
  p.cu_k = pr.varlen ? a.cu_seqlens_k.ptr<const int>() : nullptr;
  p.heads_q = pr.heads_q;
  p.group = pr.group();
  p.seqlen_q = pr.seqlen_q;
  p.seqlen_k = pr.seqlen_k;
  p.d_qk = pr.hdim_qk;
  p.d_v = pr.hdim_v;
  p.scale = pr.scale;
  p.scale_log2 = pr.scale * kLog2e;
  p.softcap = pr.softcap;
  p.bottom_right = pr.bottom_right;
  p.window_left = pr.window_left;
  p.window_right = pr.window_right;
  if (pr.has_alibi) {
    p.alibi = a.alibi_slopes.ptr<const float>();
    p.alibi_batch = pr.alibi_per_batch ? a.alibi_slopes.stride[0] : 0;
    p.alibi_head = a.alibi_slopes.stride[pr.alibi_per_batch ? 1 : 0];
  }
  p.dropout = pr.dropout_p > 0.f;
  p.drop = pr.dropout(a.options);

  const FwdInstance* in = find_instance(pr.dtype, pr.hdim_qk > pr.hdim_v ? pr.hdim_qk : pr.hdim_v);
  const FwdGrid g{pr.batch, pr.heads_q, pr.seqlen_q,
                  pr.softcap > 0.f || pr.has_alibi || p.dropout || !(pr.scale > 0.f),
                  static_cast<cudaStream_t>(a.options.stream)};
  in->launch(p, g);
}

}  // namespace tileattn::cuda
