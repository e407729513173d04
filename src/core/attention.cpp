// Dispatch: validate once, then hand the problem to the backend it resolved to.
#include "core/backends.hpp"
#include "tileattn/error.hpp"

namespace tileattn {

#if defined(TILEATTN_WITH_CUDA)
bool cuda_available() { return true; }
#define TA_CUDA_CALL(call) return cuda::call
#else
bool cuda_available() { return false; }
// Unreachable: validation rejects the cuda backend in a CPU-only build.
#define TA_CUDA_CALL(call) throw Error("tileattn: built without CUDA support")
#endif

namespace {
// A valid call with nothing to write returns before any backend runs: it never allocates, however
// large the other dimensions (batch x heads with no rows, say) make its scratch look.
bool empty(const TensorView& t) { return !t.present() || t.numel() == 0; }
bool writes_nothing(const Problem&, const ForwardArgs& a) { return empty(a.out) && empty(a.lse); }
bool writes_nothing(const Problem&, const BackwardArgs& a) { return empty(a.dq) && empty(a.dk) && empty(a.dv); }
bool writes_nothing(const Problem& p, const DecodeArgs& a) {
  return empty(a.out) && empty(a.lse) && (p.seqlen_new == 0 || p.batch == 0 || p.heads_kv == 0);
}
}  // namespace

void forward(const ForwardArgs& a) {
  const Problem p = validate(a);
  if (writes_nothing(p, a)) return;
  switch (p.backend) {
    case Backend::cpu_reference: return cpu::reference_forward(p, a);
    case Backend::cuda: TA_CUDA_CALL(forward(p, a));
    default: return cpu::flash_forward(p, a);
  }
}

void backward(const BackwardArgs& a) {
  const Problem p = validate(a);
  if (writes_nothing(p, a)) return;
  switch (p.backend) {
    case Backend::cpu_reference: return cpu::reference_backward(p, a);
    case Backend::cuda: TA_CUDA_CALL(backward(p, a));
    default: return cpu::flash_backward(p, a);
  }
}

void decode(const DecodeArgs& a) {
  const Problem p = validate(a);
  if (writes_nothing(p, a)) return;
  switch (p.backend) {
    case Backend::cpu_reference: return cpu::reference_decode(p, a);
    case Backend::cuda: TA_CUDA_CALL(decode(p, a));
    default: return cpu::flash_decode(p, a);
  }
}

void combine(const CombineArgs& a) {
  const Problem p = validate(a);
  if (empty(a.out) && empty(a.lse)) return;
  if (p.backend == Backend::cuda) TA_CUDA_CALL(combine(p, a));
  return cpu::combine(p, a);
}

std::size_t workspace_size(const ForwardArgs& a) {
  const Problem p = validate(a);
  if (writes_nothing(p, a)) return 0;
  if (p.backend == Backend::cuda) TA_CUDA_CALL(workspace_size(p, a));
  return cpu::workspace_size(p, a);
}

std::size_t workspace_size(const BackwardArgs& a) {
  const Problem p = validate(a);
  if (writes_nothing(p, a)) return 0;
  if (p.backend == Backend::cuda) TA_CUDA_CALL(workspace_size(p, a));
  return cpu::workspace_size(p, a);
}

std::size_t workspace_size(const DecodeArgs& a) {
  const Problem p = validate(a);
  if (writes_nothing(p, a)) return 0;
  if (p.backend == Backend::cuda) TA_CUDA_CALL(workspace_size(p, a));
  return cpu::workspace_size(p, a);
}

}  // namespace tileattn
