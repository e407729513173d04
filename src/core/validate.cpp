// The one place every invariant of a call is checked. Each failure throws tileattn::Error naming
// the call, the argument and the offending values; nothing has been written to any output then.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backends.hpp"
#include "core/overlap.hpp"
#include "core/problem.hpp"
#include "core/validate_variant.hpp"
#include "tileattn/error.hpp"

namespace tileattn {
namespace {

template <class... Ts>
[[noreturn]] void fail(const char* fn, const Ts&... parts) {
  std::ostringstream os;
  os << "tileattn::" << fn << ": ";
  (os << ... << parts);
  throw Error(os.str());
}

std::string shape_str(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < t.ndim; ++d) os << (d ? ", " : "") << t.shape[d];
  os << "]";
  return os.str();
}

const char* device_str(const Device& d) { return d.type == DeviceType::cpu ? "cpu" : "cuda"; }

// Checks the view itself: present, rank, non-negative shape, contiguous last dim.
void check_tensor(const char* fn, const char* name, const TensorView& t, int ndim) {
  if (!t.present()) fail(fn, name, " is required but absent");
  if (t.ndim != ndim)
    fail(fn, name, " must have ", ndim, " dimensions, got ", t.ndim, " (shape ", shape_str(t), ")");
  for (int d = 0; d < ndim; ++d)
    if (t.shape[d] < 0) fail(fn, name, ".shape[", d, "] = ", t.shape[d], " is negative");
  if (t.numel() > 0 && t.data == nullptr) fail(fn, name, " has ", t.numel(), " elements but a null data pointer");
  if (t.shape[ndim - 1] > 1 && t.stride[ndim - 1] != 1)
    fail(fn, name, ".stride[", ndim - 1, "] = ", t.stride[ndim - 1], ", the last dimension must be contiguous (stride 1)");
}

void check_shape(const char* fn, const char* name, const TensorView& t,
                 std::initializer_list<std::int64_t> want) {
  int d = 0;
  bool ok = static_cast<int>(want.size()) == t.ndim;
  for (auto w : want) ok = ok && t.shape[d++] == w;
  if (!ok) {
    std::ostringstream os;
    os << "[";
    int i = 0;
    for (auto w : want) os << (i++ ? ", " : "") << w;
    os << "]";
    fail(fn, name, " has shape ", shape_str(t), ", expected ", os.str());
  }
}

void check_dtype(const char* fn, const char* name, const TensorView& t, DType want) {
  if (t.dtype != want)
    fail(fn, name, " has dtype ", dtype_name(t.dtype), ", expected ", dtype_name(want));
}

void check_float_dtype(const char* fn, const char* name, const TensorView& t) {
  if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::bf16)
    fail(fn, name, " has dtype ", dtype_name(t.dtype), ", expected f32, f16 or bf16");
}

// ref_name: the tensor whose device every other argument must share.
void check_same_device(const char* fn, const char* name, const TensorView& t, const Device& dev,
                       const char* ref_name = "q") {
  if (t.device.type != dev.type || (dev.type == DeviceType::cuda && t.device.index != dev.index))
    fail(fn, name, " is on ", device_str(t.device), ":", t.device.index, " but ", ref_name, " is on ",
         device_str(dev), ":", dev.index);
}

void check_head_dim(const char* fn, const char* name, std::int64_t d) {
  if (d < 8 || d > 256 || d % 8 != 0)
    fail(fn, name, " = ", d, ", head dims must be a multiple of 8 in [8, 256]");
}

int to_int(const char* fn, const char* name, std::int64_t v) {
  if (v > 0x7fffffff) fail(fn, name, " = ", v, " exceeds 2^31 - 1");
  return static_cast<int>(v);
}

Backend resolve_backend(const char* fn, const Options& o, const Device& dev) {
  Backend b = o.backend;
  if (b == Backend::automatic) b = dev.type == DeviceType::cuda ? Backend::cuda : Backend::cpu_flash;
  if (b == Backend::cuda) {
    if (dev.type != DeviceType::cuda) fail(fn, "options.backend = cuda but the tensors are on the cpu");
    if (!cuda_available()) fail(fn, "the tensors are on cuda but tileattn was built without CUDA support");
  } else if (dev.type != DeviceType::cpu) {
    fail(fn, "options.backend is a cpu backend but the tensors are on cuda:", dev.index);
  }
  return b;
}

// Options common to every call that attends; fills the mask and score fields of p.
void check_options(const char* fn, const Options& o, Problem& p) {
  if (o.scale && !std::isfinite(*o.scale)) fail(fn, "options.scale = ", *o.scale, " is not finite");
  p.scale = o.scale ? *o.scale : 1.f / std::sqrt(static_cast<float>(p.hdim_qk));
  if (o.window_left < -1) fail(fn, "options.window_left = ", o.window_left, ", expected -1 (unbounded) or >= 0");
  if (o.window_right < -1) fail(fn, "options.window_right = ", o.window_right, ", expected -1 (unbounded) or >= 0");
  if (o.causal && o.window_right > 0)
    fail(fn, "options.causal = true conflicts with options.window_right = ", o.window_right, " (causal means 0)");
  // A window reaching past every key is unbounded; folding it to -1 keeps Mask's int arithmetic
  // (i + diag_offset +- window) from overflowing on windows such as INT_MAX.
  const int reach_all = std::max(p.seqlen_q, p.seqlen_k);
  p.window_left = o.window_left >= reach_all ? -1 : o.window_left;
  p.window_right = o.causal ? 0 : (o.window_right >= reach_all ? -1 : o.window_right);
  p.bottom_right = o.align == MaskAlign::bottom_right;
  if (!(o.softcap >= 0.f) || !std::isfinite(o.softcap))
    fail(fn, "options.softcap = ", o.softcap, ", expected a finite value >= 0 (0 = off)");
  p.softcap = o.softcap;
  if (!(o.dropout_p >= 0.f && o.dropout_p < 1.f))
    fail(fn, "options.dropout_p = ", o.dropout_p, ", expected 0 <= p < 1");
  p.dropout_p = o.dropout_p;
  if (o.num_splits < 0) fail(fn, "options.num_splits = ", o.num_splits, ", expected >= 0 (0 = heuristic)");
  if (o.workspace_bytes > 0 && o.workspace == nullptr)
    fail(fn, "options.workspace is null but options.workspace_bytes = ", o.workspace_bytes);
  check_variant_options(fn, o, p);
}

void check_alibi(const char* fn, const TensorView& s, const Device& dev, Problem& p) {
  if (!s.present()) return;
  check_dtype(fn, "alibi_slopes", s, DType::f32);
  check_same_device(fn, "alibi_slopes", s, dev);
  if (s.ndim == 1) {
    check_shape(fn, "alibi_slopes", s, {p.heads_q});
  } else if (s.ndim == 2) {
    check_shape(fn, "alibi_slopes", s, {p.batch, p.heads_q});
    p.alibi_per_batch = true;
  } else {
    fail(fn, "alibi_slopes must be [heads_q] or [batch, heads_q], got shape ", shape_str(s));
  }
  if (s.numel() > 0 && s.data == nullptr) fail(fn, "alibi_slopes has a null data pointer");
  p.has_alibi = true;
}

// Reads a 1-D int32 tensor's values on the host. Device values need a copy and a synchronization:
// only when allow_device (options.check_device_indices, decode); otherwise they are trusted.
bool host_ints(const TensorView& t, std::vector<std::int64_t>& out, bool allow_device = false) {
  if (t.device.type != DeviceType::cpu) {
#if defined(TILEATTN_WITH_CUDA)
    if (!allow_device) return false;
    const std::vector<std::int32_t> v = cuda::read_i32(t);
    out.assign(v.begin(), v.end());
    return true;
#else
    (void)allow_device;
    return false;
#endif
  }
  out.resize(t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) out[i] = t.ptr<const std::int32_t>()[i * t.stride[0]];
  return true;
}

// A page that an append writes must not be read or written anywhere else in the call: two live
// slots sharing it would race (shared prefix pages are fine as long as nobody appends into them).
void check_append_pages(const char* fn, const std::vector<std::int64_t>& pt, std::int64_t per_seq,
                        const std::vector<std::int64_t>& lens, int seqlen_new, std::int64_t page_size) {
  std::unordered_map<std::int64_t, std::pair<std::int64_t, std::int64_t>> owner;  // page -> (b, slot)
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const std::int64_t used = (lens[b] + seqlen_new + page_size - 1) / page_size;
    for (std::int64_t i = 0; i < used; ++i) {
      const std::int64_t page = pt[b * per_seq + i];
      auto [it, fresh] = owner.emplace(page, std::make_pair(static_cast<std::int64_t>(b), i));
      if (fresh) continue;
      const auto [b2, i2] = it->second;
      auto written = [&](std::int64_t bb, std::int64_t ii) { return ii >= lens[bb] / page_size; };
      if (written(static_cast<std::int64_t>(b), i) || written(b2, i2))
        fail(fn, "page_table[", b2, ", ", i2, "] and page_table[", b, ", ", i, "] both name page ", page,
             ", which the append writes: it would be read and written concurrently");
    }
  }
}

void check_cu_seqlens(const char* fn, const char* name, const TensorView& cu, int batch,
                      std::int64_t total, int max_len, const char* max_name, const Device& dev) {
  check_tensor(fn, name, cu, 1);
  check_dtype(fn, name, cu, DType::i32);
  check_same_device(fn, name, cu, dev);
  check_shape(fn, name, cu, {batch + 1});
  std::vector<std::int64_t> v;
  if (!host_ints(cu, v)) return;
  if (v[0] != 0) fail(fn, name, "[0] = ", v[0], ", expected 0");
  for (int b = 0; b < batch; ++b) {
    std::int64_t len = v[b + 1] - v[b];
    if (len < 0) fail(fn, name, " must be non-decreasing, but ", name, "[", b + 1, "] = ", v[b + 1], " < ", name, "[", b, "] = ", v[b]);
    if (len > max_len) fail(fn, "sequence ", b, " has length ", len, " (from ", name, ") but ", max_name, " = ", max_len);
  }
  if (v[batch] > total) fail(fn, name, "[", batch, "] = ", v[batch], " exceeds the ", total, " packed tokens");
}

// q, k, v, out (and for the backward dout, dq, dk, dv): shapes, dtypes, devices.
struct Qkv {
  const TensorView *q, *k, *v, *out, *lse;
  const TensorView *cu_q, *cu_k;
  int max_q, max_k;
};

Problem check_qkv(const char* fn, const Qkv& a, const TensorView& alibi, const Options& o) {
  Problem p;
  p.varlen = a.cu_q->present() || a.cu_k->present();
  if (p.varlen && !(a.cu_q->present() && a.cu_k->present()))
    fail(fn, "cu_seqlens_q and cu_seqlens_k must be given together (", a.cu_q->present() ? "cu_seqlens_k" : "cu_seqlens_q", " is absent)");
  const int nd = p.varlen ? 3 : 4;
  check_tensor(fn, "q", *a.q, nd);
  check_tensor(fn, "k", *a.k, nd);
  check_tensor(fn, "v", *a.v, nd);
  check_tensor(fn, "out", *a.out, nd);
  check_float_dtype(fn, "q", *a.q);
  p.dtype = a.q->dtype;
  check_dtype(fn, "k", *a.k, p.dtype);
  check_dtype(fn, "v", *a.v, p.dtype);
  check_dtype(fn, "out", *a.out, p.dtype);
  const Device dev = a.q->device;
  check_same_device(fn, "k", *a.k, dev);
  check_same_device(fn, "v", *a.v, dev);
  check_same_device(fn, "out", *a.out, dev);
  p.backend = resolve_backend(fn, o, dev);

  const int h = nd - 2;  // the heads dimension
  p.heads_q = to_int(fn, "q heads", a.q->shape[h]);
  p.heads_kv = to_int(fn, "k heads", a.k->shape[h]);
  p.hdim_qk = to_int(fn, "q head_dim", a.q->shape[h + 1]);
  p.hdim_v = to_int(fn, "v head_dim", a.v->shape[h + 1]);
  check_head_dim(fn, "q.shape[-1] (head_dim_qk)", p.hdim_qk);
  check_head_dim(fn, "v.shape[-1] (head_dim_v)", p.hdim_v);
  if (p.heads_q < 1) fail(fn, "q has ", p.heads_q, " heads, expected >= 1");
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0)
    fail(fn, "k heads (heads_kv) = ", p.heads_kv, " must be >= 1 and divide q heads (heads_q) = ", p.heads_q);
  if (p.varlen) {
    p.batch = to_int(fn, "cu_seqlens_q length", a.cu_q->shape[0] - 1);
    if (p.batch < 0) fail(fn, "cu_seqlens_q must hold batch + 1 >= 1 entries, got shape ", shape_str(*a.cu_q));
    if (a.max_q < 0 || a.max_k < 0)
      fail(fn, "max_seqlen_q = ", a.max_q, ", max_seqlen_k = ", a.max_k, ", expected >= 0");
    p.seqlen_q = a.max_q;
    p.seqlen_k = a.max_k;
    const std::int64_t tq = a.q->shape[0], tk = a.k->shape[0];
    check_shape(fn, "k", *a.k, {tk, p.heads_kv, p.hdim_qk});
    check_shape(fn, "v", *a.v, {tk, p.heads_kv, p.hdim_v});
    check_shape(fn, "out", *a.out, {tq, p.heads_q, p.hdim_v});
    check_cu_seqlens(fn, "cu_seqlens_q", *a.cu_q, p.batch, tq, a.max_q, "max_seqlen_q", dev);
    check_cu_seqlens(fn, "cu_seqlens_k", *a.cu_k, p.batch, tk, a.max_k, "max_seqlen_k", dev);
    if (a.lse->present()) {
      check_dtype(fn, "lse", *a.lse, DType::f32);
      check_same_device(fn, "lse", *a.lse, dev);
      check_shape(fn, "lse", *a.lse, {p.heads_q, tq});
    }
  } else {
    p.batch = to_int(fn, "q batch", a.q->shape[0]);
    p.seqlen_q = to_int(fn, "q seqlen", a.q->shape[1]);
    p.seqlen_k = to_int(fn, "k seqlen", a.k->shape[1]);
    check_shape(fn, "k", *a.k, {p.batch, p.seqlen_k, p.heads_kv, p.hdim_qk});
    check_shape(fn, "v", *a.v, {p.batch, p.seqlen_k, p.heads_kv, p.hdim_v});
    check_shape(fn, "out", *a.out, {p.batch, p.seqlen_q, p.heads_q, p.hdim_v});
    if (a.lse->present()) {
      check_dtype(fn, "lse", *a.lse, DType::f32);
      check_same_device(fn, "lse", *a.lse, dev);
      check_shape(fn, "lse", *a.lse, {p.batch, p.heads_q, p.seqlen_q});
    }
  }
  if (a.lse->present() && a.lse->numel() > 0 && a.lse->data == nullptr) fail(fn, "lse has a null data pointer");
  check_options(fn, o, p);
  check_alibi(fn, alibi, dev, p);
  return p;
}

void check_like(const char* fn, const char* name, const TensorView& t, const char* ref_name,
                const TensorView& ref) {
  check_tensor(fn, name, t, ref.ndim);
  check_dtype(fn, name, t, ref.dtype);
  check_same_device(fn, name, t, ref.device);
  bool same = true;
  for (int d = 0; d < ref.ndim; ++d) same = same && t.shape[d] == ref.shape[d];
  if (!same) fail(fn, name, " has shape ", shape_str(t), " but ", ref_name, " has shape ", shape_str(ref));
}

// Outputs written by several threads must each own their memory: no output may alias itself,
// another output, or an input it is computed from.
struct Named {
  const char* name;
  const TensorView* t;
};

void check_outputs_disjoint(const char* fn, std::initializer_list<Named> outputs, std::initializer_list<Named> inputs) {
  for (const Named& o : outputs) {
    if (!o.t->present()) continue;
    if (view_self_overlaps(*o.t)) {
      std::ostringstream st;
      for (int d = 0; d < o.t->ndim; ++d) st << (d ? ", " : "") << o.t->stride[d];
      fail(fn, o.name, " with shape ", shape_str(*o.t), " and strides [", st.str(), "] maps several elements to one address");
    }
  }
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (!o->t->present()) continue;
    for (auto p = std::next(o); p != outputs.end(); ++p)
      if (p->t->present() && views_overlap(*o->t, *p->t)) fail(fn, "outputs ", o->name, " and ", p->name, " overlap in memory");
    for (const Named& i : inputs)
      if (i.t->present() && views_overlap(*o->t, *i.t)) fail(fn, "output ", o->name, " overlaps input ", i.name, " in memory");
  }
}

}  // namespace

Problem validate(const ForwardArgs& a) {
  const char* fn = "forward";
  Problem p = check_qkv(fn, Qkv{&a.q, &a.k, &a.v, &a.out, &a.lse, &a.cu_seqlens_q, &a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k},
                        a.alibi_slopes, a.options);
  check_block_mask(fn, a.block_mask, a.q.device, p);
  check_documents(fn, a.document_ids_q, a.document_ids_k, a.q.device, a.q.shape[0], a.k.shape[0], p);
  check_outputs_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}},
                         {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"cu_seqlens_q", &a.cu_seqlens_q},
                          {"cu_seqlens_k", &a.cu_seqlens_k}, {"alibi_slopes", &a.alibi_slopes}});
#if defined(TILEATTN_WITH_CUDA)
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_forward(p, a); !why.empty()) fail(fn, why);
#endif
  return p;
}

Problem validate(const BackwardArgs& a) {
  const char* fn = "backward";
  if (!a.lse.present()) fail(fn, "lse is required: pass the forward's log-sum-exp");
  Problem p = check_qkv(fn, Qkv{&a.q, &a.k, &a.v, &a.out, &a.lse, &a.cu_seqlens_q, &a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k},
                        a.alibi_slopes, a.options);
  check_block_mask(fn, a.block_mask, a.q.device, p);
  check_documents(fn, a.document_ids_q, a.document_ids_k, a.q.device, a.q.shape[0], a.k.shape[0], p);
  check_like(fn, "dout", a.dout, "out", a.out);
  check_like(fn, "dq", a.dq, "q", a.q);
  check_like(fn, "dk", a.dk, "k", a.k);
  check_like(fn, "dv", a.dv, "v", a.v);
  check_outputs_disjoint(fn, {{"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}},
                         {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}, {"dout", &a.dout}, {"lse", &a.lse},
                          {"cu_seqlens_q", &a.cu_seqlens_q}, {"cu_seqlens_k", &a.cu_seqlens_k},
                          {"alibi_slopes", &a.alibi_slopes}});
#if defined(TILEATTN_WITH_CUDA)
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_backward(p, a); !why.empty()) fail(fn, why);
#endif
  return p;
}

Problem validate(const DecodeArgs& a) {
  const char* fn = "decode";
  Problem p;
  check_tensor(fn, "q", a.q, 4);
  check_tensor(fn, "k_cache", a.k_cache, 4);
  check_tensor(fn, "v_cache", a.v_cache, 4);
  check_tensor(fn, "out", a.out, 4);
  check_float_dtype(fn, "q", a.q);
  p.dtype = a.q.dtype;
  check_dtype(fn, "k_cache", a.k_cache, p.dtype);
  check_dtype(fn, "v_cache", a.v_cache, p.dtype);
  check_dtype(fn, "out", a.out, p.dtype);
  const Device dev = a.q.device;
  check_same_device(fn, "k_cache", a.k_cache, dev);
  check_same_device(fn, "v_cache", a.v_cache, dev);
  check_same_device(fn, "out", a.out, dev);
  p.backend = resolve_backend(fn, a.options, dev);
#if defined(TILEATTN_WITH_CUDA)
  // Before any index tensor is read back from the device: their pointers must be device memory.
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_decode(p, a); !why.empty()) fail(fn, why);
#endif
  p.batch = to_int(fn, "q batch", a.q.shape[0]);
  p.seqlen_q = to_int(fn, "q seqlen", a.q.shape[1]);
  p.heads_q = to_int(fn, "q heads", a.q.shape[2]);
  p.hdim_qk = to_int(fn, "q head_dim", a.q.shape[3]);
  p.heads_kv = to_int(fn, "k_cache heads", a.k_cache.shape[2]);
  p.hdim_v = to_int(fn, "v_cache head_dim", a.v_cache.shape[3]);
  check_head_dim(fn, "q.shape[3] (head_dim_qk)", p.hdim_qk);
  check_head_dim(fn, "v_cache.shape[3] (head_dim_v)", p.hdim_v);
  if (p.heads_q < 1) fail(fn, "q has ", p.heads_q, " heads, expected >= 1");
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0)
    fail(fn, "k_cache heads (heads_kv) = ", p.heads_kv, " must be >= 1 and divide q heads (heads_q) = ", p.heads_q);
  const std::int64_t n0 = a.k_cache.shape[0], n1 = a.k_cache.shape[1];
  check_shape(fn, "k_cache", a.k_cache, {n0, n1, p.heads_kv, p.hdim_qk});
  check_shape(fn, "v_cache", a.v_cache, {n0, n1, p.heads_kv, p.hdim_v});
  check_shape(fn, "out", a.out, {p.batch, p.seqlen_q, p.heads_q, p.hdim_v});
  if (a.lse.present()) {
    check_dtype(fn, "lse", a.lse, DType::f32);
    check_same_device(fn, "lse", a.lse, dev);
    check_shape(fn, "lse", a.lse, {p.batch, p.heads_q, p.seqlen_q});
    if (a.lse.numel() > 0 && a.lse.data == nullptr) fail(fn, "lse has a null data pointer");
  }

  p.paged = a.page_table.present();
  std::int64_t capacity = n1;
  if (p.paged) {
    check_tensor(fn, "page_table", a.page_table, 2);
    check_dtype(fn, "page_table", a.page_table, DType::i32);
    check_same_device(fn, "page_table", a.page_table, dev);
    if (a.page_table.shape[0] != p.batch)
      fail(fn, "page_table has shape ", shape_str(a.page_table), ", expected ", p.batch, " rows (batch)");
    if (n1 < 1) fail(fn, "k_cache.shape[1] (page_size) = ", n1, ", expected >= 1");
    p.page_size = static_cast<int>(n1);
    capacity = a.page_table.shape[1] * n1;
    if (!a.cache_seqlens.present()) fail(fn, "cache_seqlens is required with a page_table");
  } else if (n0 != p.batch) {
    fail(fn, "k_cache.shape[0] = ", n0, " must equal q.shape[0] (batch) = ", p.batch, " for a contiguous cache");
  }
  p.seqlen_k = to_int(fn, "cache capacity", capacity);

  if (a.k_new.present() || a.v_new.present()) {
    if (!(a.k_new.present() && a.v_new.present()))
      fail(fn, "k_new and v_new must be given together (", a.k_new.present() ? "v_new" : "k_new", " is absent)");
    check_tensor(fn, "k_new", a.k_new, 4);
    check_tensor(fn, "v_new", a.v_new, 4);
    check_dtype(fn, "k_new", a.k_new, p.dtype);
    check_dtype(fn, "v_new", a.v_new, p.dtype);
    check_same_device(fn, "k_new", a.k_new, dev);
    check_same_device(fn, "v_new", a.v_new, dev);
    p.seqlen_new = to_int(fn, "k_new seqlen", a.k_new.shape[1]);
    check_shape(fn, "k_new", a.k_new, {p.batch, p.seqlen_new, p.heads_kv, p.hdim_qk});
    check_shape(fn, "v_new", a.v_new, {p.batch, p.seqlen_new, p.heads_kv, p.hdim_v});
    if (!a.cache_seqlens.present()) fail(fn, "cache_seqlens is required with k_new/v_new (where to append)");
  }

  if (a.cache_seqlens.present()) {
    check_tensor(fn, "cache_seqlens", a.cache_seqlens, 1);
    check_dtype(fn, "cache_seqlens", a.cache_seqlens, DType::i32);
    check_same_device(fn, "cache_seqlens", a.cache_seqlens, dev);
    check_shape(fn, "cache_seqlens", a.cache_seqlens, {p.batch});
    std::vector<std::int64_t> lens;
    if (host_ints(a.cache_seqlens, lens, a.options.check_device_indices)) {
      for (int b = 0; b < p.batch; ++b) {
        if (lens[b] < 0) fail(fn, "cache_seqlens[", b, "] = ", lens[b], " is negative");
        if (lens[b] + p.seqlen_new > capacity)
          fail(fn, "cache_seqlens[", b, "] = ", lens[b], " plus ", p.seqlen_new, " appended rows exceeds the cache capacity of ", capacity,
               p.paged ? " (page_table.shape[1] * page_size)" : " (k_cache.shape[1])");
      }
      if (p.paged) {
        // The page table in row-major order, from wherever it lives.
        std::vector<std::int64_t> pt;
        if (a.page_table.device.type == DeviceType::cpu) {
          for (std::int64_t b = 0; b < a.page_table.shape[0]; ++b)
            for (std::int64_t i = 0; i < a.page_table.shape[1]; ++i)
              pt.push_back(a.page_table.ptr<const std::int32_t>()[b * a.page_table.stride[0] + i * a.page_table.stride[1]]);
        } else {
#if defined(TILEATTN_WITH_CUDA)
          const std::vector<std::int32_t> v = cuda::read_i32(a.page_table);
          pt.assign(v.begin(), v.end());
#endif
        }
        for (int b = 0; b < p.batch; ++b) {
          const std::int64_t used = (lens[b] + p.seqlen_new + n1 - 1) / n1;
          for (std::int64_t i = 0; i < used; ++i) {
            const std::int64_t page = pt[b * a.page_table.shape[1] + i];
            if (page < 0 || page >= n0)
              fail(fn, "page_table[", b, ", ", i, "] = ", page, " is outside [0, ", n0, ") (k_cache.shape[0] pages)");
          }
        }
        if (p.seqlen_new > 0) check_append_pages(fn, pt, a.page_table.shape[1], lens, p.seqlen_new, n1);
      }
    }
  }
  if (a.rotary_cos.present() || a.rotary_sin.present()) {
    if (!(a.rotary_cos.present() && a.rotary_sin.present()))
      fail(fn, "rotary_cos and rotary_sin must be given together (", a.rotary_cos.present() ? "rotary_sin" : "rotary_cos", " is absent)");
    check_tensor(fn, "rotary_cos", a.rotary_cos, 2);
    check_tensor(fn, "rotary_sin", a.rotary_sin, 2);
    check_dtype(fn, "rotary_cos", a.rotary_cos, p.dtype);
    check_dtype(fn, "rotary_sin", a.rotary_sin, p.dtype);
    check_same_device(fn, "rotary_cos", a.rotary_cos, dev);
    check_same_device(fn, "rotary_sin", a.rotary_sin, dev);
    const std::int64_t positions = a.rotary_cos.shape[0], half = a.rotary_cos.shape[1];
    check_shape(fn, "rotary_sin", a.rotary_sin, {positions, half});
    if (half < 1 || 2 * half > p.hdim_qk)
      fail(fn, "rotary_cos.shape[1] = ", half, " gives rotary_dim = ", 2 * half, ", expected 2 <= rotary_dim <= head_dim_qk = ", p.hdim_qk);
    // flash_attn_with_kvcache's rule: query row i sits at cache_seqlens[b] + i when the call is
    // causal or windowed, else every row at cache_seqlens[b]; appended row n at cache_seqlens[b] + n.
    p.rotary_per_row = a.options.causal || a.options.window_left >= 0 || a.options.window_right >= 0;
    const std::int64_t needed = capacity + (p.rotary_per_row ? p.seqlen_q - 1 : 0);
    if (positions < needed)
      fail(fn, "rotary_cos.shape[0] = ", positions, " positions cannot cover the cache capacity of ", capacity,
           p.rotary_per_row ? " plus the query rows beyond the first" : "", " (", needed, " needed)");
    p.rotary_dim = static_cast<int>(2 * half);
  }
  Options o = a.options;
  if (o.dropout_p != 0.f) fail(fn, "options.dropout_p = ", o.dropout_p, ", decode does not support dropout");
  check_options(fn, o, p);
  check_alibi(fn, a.alibi_slopes, dev, p);
  check_outputs_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}},
                         {{"q", &a.q}, {"k_cache", &a.k_cache}, {"v_cache", &a.v_cache}, {"page_table", &a.page_table},
                          {"cache_seqlens", &a.cache_seqlens}, {"k_new", &a.k_new}, {"v_new", &a.v_new},
                          {"alibi_slopes", &a.alibi_slopes}});
  return p;
}

Problem validate(const CombineArgs& a) {
  const char* fn = "combine";
  Problem p;
  check_tensor(fn, "out_partial", a.out_partial, 5);
  check_tensor(fn, "lse_partial", a.lse_partial, 4);
  check_tensor(fn, "out", a.out, 4);
  check_dtype(fn, "out_partial", a.out_partial, DType::f32);
  check_dtype(fn, "lse_partial", a.lse_partial, DType::f32);
  check_float_dtype(fn, "out", a.out);
  p.dtype = a.out.dtype;
  const Device dev = a.out_partial.device;
  check_same_device(fn, "lse_partial", a.lse_partial, dev, "out_partial");
  check_same_device(fn, "out", a.out, dev, "out_partial");
  p.backend = resolve_backend(fn, a.options, dev);
  const auto& s = a.out_partial.shape;
  if (s[0] < 1) fail(fn, "out_partial.shape[0] (splits) = ", s[0], ", expected >= 1");
  p.batch = to_int(fn, "batch", s[1]);
  p.seqlen_q = to_int(fn, "seqlen_q", s[2]);
  p.heads_q = p.heads_kv = to_int(fn, "heads", s[3]);
  p.hdim_v = to_int(fn, "head_dim", s[4]);
  check_shape(fn, "lse_partial", a.lse_partial, {s[0], s[1], s[3], s[2]});
  check_shape(fn, "out", a.out, {s[1], s[2], s[3], s[4]});
  if (a.lse.present()) {
    check_dtype(fn, "lse", a.lse, DType::f32);
    check_same_device(fn, "lse", a.lse, dev, "out_partial");
    check_shape(fn, "lse", a.lse, {s[1], s[3], s[2]});
    if (a.lse.numel() > 0 && a.lse.data == nullptr) fail(fn, "lse has a null data pointer");
  }
  check_outputs_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}},
                         {{"out_partial", &a.out_partial}, {"lse_partial", &a.lse_partial}});
#if defined(TILEATTN_WITH_CUDA)
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_combine(p, a); !why.empty()) fail(fn, why);
#endif
  return p;
}

}  // namespace tileattn
