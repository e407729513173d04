// What the cuda backend cannot take, for the core's validation to report: tensors that are not in
// this device's memory, dtypes and head dims without a kernel, and addresses or strides that break
// the kernels' 16-byte vector accesses.
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "core/backends.hpp"
#include "cuda/block_state.hpp"
#include "cuda/bwd_launch.hpp"
#include "cuda/decode/decode_kernel.hpp"
#include "cuda/fwd_launch.hpp"

namespace tileattn::cuda {
namespace {

// Both checks run on every tensor of every call: the message (a stream, whose construction costs
// about as much as the pointer query) is built only for a tensor that fails. check: the call's
// Options::check_residence.
std::string where_is(const char* name, const TensorView& t, bool check) {
  if (!check || !t.present() || t.numel() == 0) return {};
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, t.data);
  if (e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) &&
      attr.device == t.device.index)
    return {};
  std::ostringstream os;
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error this query leaves
    os << name << ": cannot query its pointer " << t.data << " (" << cudaGetErrorString(e) << ")";
  } else if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    os << name << " = " << t.data << " is a host pointer but " << name << ".device is cuda:" << t.device.index;
  } else {
    os << name << " = " << t.data << " is on cuda:" << attr.device << " but " << name << ".device is cuda:"
       << t.device.index;
  }
  return os.str();
}

// The tile loads and stores move 8 elements (16 bytes) at a time.
std::string vector_aligned(const char* name, const TensorView& t) {
  if (!t.present() || t.numel() == 0) return {};
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  if (addr % 16 != 0) {
    std::ostringstream os;
    os << name << " = " << t.data << " is not 16-byte aligned (the cuda backend loads 16 bytes at a time)";
    return os.str();
  }
  for (int d = 0; d + 1 < t.ndim; ++d)
    if (t.shape[d] > 1 && t.stride[d] % 8 != 0) {
      std::ostringstream os;
      os << name << ".stride[" << d << "] = " << t.stride[d]
         << " is not a multiple of 8 elements (the cuda backend loads 16 bytes at a time)";
      return os.str();
    }
  return {};
}

std::string no_kernel(const Problem& p, const char* what) {
  std::ostringstream os;
  os << "head_dim " << p.hdim() << " with dtype " << dtype_name(p.dtype) << " has no cuda " << what
     << " kernel in this build (see TILEATTN_CUDA_DTYPES / TILEATTN_CUDA_HDIMS)";
  return os.str();
}

// Dtype, a kernel for the head dim, residence and 16-byte alignment of every tensor.
std::string check_attention(const Problem& p, const char* what, int instance_hdim, bool check_residence,
                            std::initializer_list<std::pair<const char*, const TensorView*>> all) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return std::string("q has dtype ") + dtype_name(p.dtype) + ", the cuda backend supports f16 and bf16";
  if (instance_hdim == 0) return no_kernel(p, what);
  for (const auto& [name, t] : all)
    if (auto m = where_is(name, *t, check_residence); !m.empty()) return m;
  for (const auto& [name, t] : all)
    if (t->dtype != DType::f32 && t->dtype != DType::i32)
      if (auto m = vector_aligned(name, *t); !m.empty()) return m;
  return {};
}

// The variant's tensors (document ids, the block mask and its dense mask) in this device's memory,
// and block sizes the kernels' tiles divide: every kernel tile then meets one cell of the mask.
std::string check_variant(const Problem& p, const TensorView& doc_q, const TensorView& doc_k, const BlockMask& m,
                          bool check_residence) {
  const std::pair<const char*, const TensorView*> all[] = {
      {"document_ids_q", &doc_q}, {"document_ids_k", &doc_k}, {"block_mask.kv_num_blocks", &m.kv_num_blocks},
      {"block_mask.kv_indices", &m.kv_indices}, {"block_mask.full_kv_num_blocks", &m.full_kv_num_blocks},
      {"block_mask.full_kv_indices", &m.full_kv_indices}, {"block_mask.mask", &m.mask}};
  for (const auto& [name, t] : all)
    if (auto msg = where_is(name, *t, check_residence); !msg.empty()) return msg;
  if (p.block_sparse() && (p.block_q % kBlockMaskTile != 0 || p.block_k % kBlockMaskTile != 0)) {
    std::ostringstream os;
    os << "block_mask.block_q = " << p.block_q << ", block_mask.block_k = " << p.block_k
       << ": the cuda backend takes block sizes that are multiples of " << kBlockMaskTile;
    return os.str();
  }
  return {};
}

}  // namespace

std::string check_forward(const Problem& p, const ForwardArgs& a) {
  std::string why =
      check_attention(p, "forward", forward_instance_hdim(p.dtype, p.hdim()),
                      a.options.check_residence,
                      {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}, {"lse", &a.lse},
                       {"cu_seqlens_q", &a.cu_seqlens_q}, {"cu_seqlens_k", &a.cu_seqlens_k},
                       {"alibi_slopes", &a.alibi_slopes}});
  return why.empty() ? check_variant(p, a.document_ids_q, a.document_ids_k, a.block_mask, a.options.check_residence) : why;
}

std::string check_backward(const Problem& p, const BackwardArgs& a) {
  std::string why =
      check_attention(p, "backward", backward_instance_hdim(p.dtype, p.hdim()),
                      a.options.check_residence,
                      {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}, {"dout", &a.dout}, {"lse", &a.lse},
                       {"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}, {"cu_seqlens_q", &a.cu_seqlens_q},
                       {"cu_seqlens_k", &a.cu_seqlens_k}, {"alibi_slopes", &a.alibi_slopes}});
  return why.empty() ? check_variant(p, a.document_ids_q, a.document_ids_k, a.block_mask, a.options.check_residence) : why;
}

std::string check_decode(const Problem& p, const DecodeArgs& a) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return std::string("q has dtype ") + dtype_name(p.dtype) + ", the cuda backend decodes f16 and bf16";
  const std::pair<const char*, const TensorView*> all[] = {
      {"q", &a.q}, {"k_cache", &a.k_cache}, {"v_cache", &a.v_cache}, {"page_table", &a.page_table},
      {"cache_seqlens", &a.cache_seqlens}, {"k_new", &a.k_new}, {"v_new", &a.v_new}, {"rotary_cos", &a.rotary_cos},
      {"rotary_sin", &a.rotary_sin}, {"out", &a.out}, {"lse", &a.lse}, {"alibi_slopes", &a.alibi_slopes}};
  for (const auto& [name, t] : all)
    if (auto m = where_is(name, *t, a.options.check_residence); !m.empty()) return m;
  // The kernels read q and the caches 16 bytes at a time; the rest element by element.
  for (const auto& [name, t] : {std::pair{"q", &a.q}, std::pair{"k_cache", &a.k_cache}, std::pair{"v_cache", &a.v_cache}})
    if (auto m = vector_aligned(name, *t); !m.empty()) return m;
  return {};
}

std::string check_decode_head_dim(const Problem& p) {
  return decode_instance_hdim(p.dtype, p.hdim()) == 0 ? no_kernel(p, "decode") : std::string();
}

std::string check_combine(const Problem&, const CombineArgs& a) {
  const std::pair<const char*, const TensorView*> all[] = {
      {"out_partial", &a.out_partial}, {"lse_partial", &a.lse_partial}, {"out", &a.out}, {"lse", &a.lse}};
  for (const auto& [name, t] : all)
    if (auto m = where_is(name, *t, a.options.check_residence); !m.empty()) return m;
  return {};
}

}  // namespace tileattn::cuda
