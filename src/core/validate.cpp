// The one place every invariant of a call is checked. Each failure throws tileattn::Error naming
// the call, the argument and the offending values; nothing has been written to any output then.
#include <algorithm>
#include <array>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backends.hpp"
#include "core/check_tensor.hpp"
#include "core/checked.hpp"
#include "core/fail.hpp"
#include "core/overlap.hpp"
#include "core/problem.hpp"
#include "core/validate_variant.hpp"
#include "tileattn/error.hpp"

namespace tileattn {
namespace {

// Optional views get the same check when present.
void check_optional(const char* fn, const char* name, const TensorView& t, int ndim) {
  if (t.present()) check_tensor(fn, name, t, ndim);
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

void check_float_dtype(const char* fn, const char* name, const TensorView& t) {
  if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::bf16)
    fail(fn, name, " has dtype ", dtype_name(t.dtype), ", expected f32, f16 or bf16");
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
  if (static_cast<unsigned>(o.backend) > static_cast<unsigned>(Backend::cuda))
    fail(fn, "options.backend = ", static_cast<unsigned>(o.backend), " is not a tileattn::Backend");
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
// The kernels fold scale * log2(e) into one fp32 factor (and scale / softcap, softcap * log2(e)
// with a softcap): each must be a finite fp32 value, or every score would be Inf or NaN.
bool fp32_finite(double x) { return std::isfinite(x) && std::fabs(x) <= FLT_MAX; }

void check_options(const char* fn, const Options& o, Problem& p) {
  if (o.scale && !std::isfinite(*o.scale)) fail(fn, "options.scale = ", *o.scale, " is not finite");
  if (o.scale && !fp32_finite(static_cast<double>(*o.scale) * kLog2e))
    fail(fn, "options.scale = ", *o.scale, ", expected a finite value with |scale| * log2(e) below FLT_MAX");
  p.scale = o.scale ? *o.scale : 1.f / std::sqrt(static_cast<float>(p.hdim_qk));
  if (static_cast<unsigned>(o.align) > static_cast<unsigned>(MaskAlign::top_left))
    fail(fn, "options.align = ", static_cast<unsigned>(o.align), " is not a tileattn::MaskAlign");
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
  if (o.alibi_diagonal) {
    // |i + alibi_diagonal - j| must stay in int for every row and key.
    const long long reach = static_cast<long long>(p.seqlen_q) + p.seqlen_k + std::llabs(static_cast<long long>(*o.alibi_diagonal));
    if (reach > INT_MAX)
      fail(fn, "options.alibi_diagonal = ", *o.alibi_diagonal, " with seqlen_q = ", p.seqlen_q, " and seqlen_k = ",
           p.seqlen_k, ": |alibi_diagonal| + seqlen_q + seqlen_k must fit a 32-bit int");
    p.alibi_diag_set = true;
    p.alibi_diag = *o.alibi_diagonal;
  }
  if (!(o.softcap >= 0.f) || !std::isfinite(o.softcap))
    fail(fn, "options.softcap = ", o.softcap, ", expected a finite value >= 0 (0 = off)");
  if (o.softcap > 0.f && !(fp32_finite(p.scale / static_cast<double>(o.softcap)) &&
                           fp32_finite(static_cast<double>(o.softcap) * kLog2e)))
    fail(fn, "options.softcap = ", o.softcap, " with scale ", p.scale,
         ": scale / softcap and softcap * log2(e) must be finite fp32 values");
  p.softcap = o.softcap;
  if (!(o.dropout_p >= 0.f && o.dropout_p < 1.f))
    fail(fn, "options.dropout_p = ", o.dropout_p, ", expected 0 <= p < 1");
  p.dropout_p = o.dropout_p;
  if (o.num_splits < 0) fail(fn, "options.num_splits = ", o.num_splits, ", expected >= 0 (0 = heuristic)");
  if (o.sm_margin < 0) fail(fn, "options.sm_margin = ", o.sm_margin, ", expected >= 0 (0 = every SM)");
  check_variant_options(fn, o, p);
}

void check_alibi(const char* fn, const TensorView& s, const Device& dev, Problem& p) {
  if (!s.present()) return;
  if (s.ndim < 1 || s.ndim > 2)
    fail(fn, "alibi_slopes must be [heads_q] or [batch, heads_q], got shape ", shape_str(s));
  check_tensor(fn, "alibi_slopes", s, s.ndim);
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
  // Host slopes are read here: a slope times the longest distance, in log2 units, must stay a
  // finite fp32 value. Device slopes are trusted (reading them would synchronize).
  if (s.device.type == DeviceType::cpu) {
    const double reach = std::max({p.seqlen_q, p.seqlen_k, 1}) + (p.alibi_diag_set ? std::fabs(p.alibi_diag) : 0.0);
    const std::int64_t rows = s.ndim == 2 ? s.shape[0] : 1, cols = s.shape[s.ndim - 1];
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const float v = s.ptr<const float>()[(s.ndim == 2 ? r * s.stride[0] : 0) + c * s.stride[s.ndim - 1]];
        if (!fp32_finite(static_cast<double>(v) * kLog2e * reach))
          fail(fn, "alibi_slopes[", s.ndim == 2 ? std::to_string(r) + ", " : "", c, "] = ", v,
               ", expected a finite slope with |slope| * log2(e) * ", reach, " (the longest distance) below FLT_MAX");
      }
  }
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

// Returns the longest sequence: read from host offsets, else bounded by max_len and the packed
// token count (no sequence is longer than all of them), so that a loose max_seqlen never sizes
// tiles or scratch.
int check_cu_seqlens(const char* fn, const char* name, const TensorView& cu, int batch,
                     std::int64_t total, int max_len, const char* max_name, const Device& dev) {
  check_tensor(fn, name, cu, 1);
  check_dtype(fn, name, cu, DType::i32);
  check_same_device(fn, name, cu, dev);
  check_shape(fn, name, cu, {std::int64_t{batch} + 1});
  std::vector<std::int64_t> v;
  if (!host_ints(cu, v)) return static_cast<int>(std::min<std::int64_t>(max_len, total));
  if (v[0] != 0) fail(fn, name, "[0] = ", v[0], ", expected 0");
  std::int64_t longest = 0;
  for (int b = 0; b < batch; ++b) {
    std::int64_t len = v[b + 1] - v[b];
    longest = std::max(longest, len);
    if (len < 0) fail(fn, name, " must be non-decreasing, but ", name, "[", b + 1, "] = ", v[b + 1], " < ", name, "[", b, "] = ", v[b]);
    if (len > max_len) fail(fn, "sequence ", b, " has length ", len, " (from ", name, ") but ", max_name, " = ", max_len);
  }
  if (v[batch] > total) fail(fn, name, "[", batch, "] = ", v[batch], " exceeds the ", total, " packed tokens");
  return static_cast<int>(longest);
}

// Rows per sequence the kernels index: Mask adds a row, the key offset and a window in int, and
// each is below this bound, so their sum stays below 2^31.
constexpr std::int64_t kMaxRows = (std::int64_t{1} << 30) - 1;

void check_rows(const char* fn, const char* name, std::int64_t rows) {
  if (rows > kMaxRows) fail(fn, name, " = ", rows, " exceeds the 2^30 - 1 rows per sequence the kernels index");
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
    const std::int64_t tq = a.q->shape[0], tk = a.k->shape[0];
    check_shape(fn, "k", *a.k, {tk, p.heads_kv, p.hdim_qk});
    check_shape(fn, "v", *a.v, {tk, p.heads_kv, p.hdim_v});
    check_shape(fn, "out", *a.out, {tq, p.heads_q, p.hdim_v});
    p.seqlen_q = check_cu_seqlens(fn, "cu_seqlens_q", *a.cu_q, p.batch, tq, a.max_q, "max_seqlen_q", dev);
    p.seqlen_k = check_cu_seqlens(fn, "cu_seqlens_k", *a.cu_k, p.batch, tk, a.max_k, "max_seqlen_k", dev);
    if (a.lse->present()) {
      check_dtype(fn, "lse", *a.lse, DType::f32);
      check_same_device(fn, "lse", *a.lse, dev);
      check_shape(fn, "lse", *a.lse, {p.heads_q, tq});
      check_tensor(fn, "lse", *a.lse, 2);
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
      check_tensor(fn, "lse", *a.lse, 3);
    }
  }
  check_rows(fn, p.varlen ? "the longest query sequence" : "q seqlen", p.seqlen_q);
  check_rows(fn, p.varlen ? "the longest key sequence" : "k seqlen", p.seqlen_k);
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
// another output, or an input it is computed from; the caller's workspace, which the call writes
// too, must overlap no tensor of the call.
struct Named {
  const char* name;
  const TensorView* t;
};

// The inputs of a forward or backward call (ForwardArgs, BackwardArgs): q, k, v, the given extra
// ones (the backward's out, dout, lse), then the sequence, mask and block mask tensors (absent ones
// are skipped).
template <class Args>
std::vector<Named> attention_inputs(const Args& a, std::initializer_list<Named> extra) {
  std::vector<Named> all{{"q", &a.q}, {"k", &a.k}, {"v", &a.v}};
  all.insert(all.end(), extra);
  const BlockMask& m = a.block_mask;
  all.insert(all.end(), {{"cu_seqlens_q", &a.cu_seqlens_q}, {"cu_seqlens_k", &a.cu_seqlens_k},
                         {"alibi_slopes", &a.alibi_slopes}, {"document_ids_q", &a.document_ids_q},
                         {"document_ids_k", &a.document_ids_k}, {"prefix_lens", &a.prefix_lens},
                         {"block_mask.kv_num_blocks", &m.kv_num_blocks}, {"block_mask.kv_indices", &m.kv_indices},
                         {"block_mask.full_kv_num_blocks", &m.full_kv_num_blocks},
                         {"block_mask.full_kv_indices", &m.full_kv_indices}, {"block_mask.mask", &m.mask}});
  return all;
}

void check_outputs_disjoint(const char* fn, std::initializer_list<Named> outputs, const std::vector<Named>& inputs,
                            const Options& o) {
  if (o.workspace_bytes > 0 && o.workspace == nullptr)
    fail(fn, "options.workspace is null but options.workspace_bytes = ", o.workspace_bytes);
  if (o.workspace != nullptr && o.workspace_bytes > 0) {
    const auto addr = reinterpret_cast<std::uintptr_t>(o.workspace);
    if (o.workspace_bytes > static_cast<std::size_t>(kMaxExtentBytes) ||
        addr > static_cast<std::uintptr_t>(kMaxExtentBytes) - o.workspace_bytes)
      fail(fn, "options.workspace_bytes = ", o.workspace_bytes, " from ", o.workspace,
           " reaches outside the 2^57-byte address space");
    auto check_workspace = [&](const Named& t) {
      if (t.t->present() && range_overlaps(o.workspace, o.workspace_bytes, *t.t))
        fail(fn, "options.workspace (", o.workspace_bytes, " bytes at ", o.workspace, ") overlaps ", t.name, " in memory");
    };
    for (const Named& t : outputs) check_workspace(t);
    for (const Named& t : inputs) check_workspace(t);
  }
  for (const Named& o : outputs) {
    if (!o.t->present()) continue;
    if (view_self_overlaps(*o.t))
      fail(fn, o.name, " with shape ", shape_str(*o.t), " and strides ", dims_str(*o.t, o.t->stride),
           " maps several elements to one address");
  }
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (!o->t->present()) continue;
    for (auto p = std::next(o); p != outputs.end(); ++p)
      if (p->t->present() && views_overlap(*o->t, *p->t)) fail(fn, "outputs ", o->name, " and ", p->name, " overlap in memory");
    for (const Named& i : inputs)
      if (i.t->present() && views_overlap(*o->t, *i.t)) fail(fn, "output ", o->name, " overlaps input ", i.name, " in memory");
  }
}

// What a forward and a backward call share: q, k, v, out and lse with the sequences, the options,
// the block mask, document ids and prefix lengths.
template <class Args>
Problem check_attention(const char* fn, const Args& a) {
  Problem p = check_qkv(fn, Qkv{&a.q, &a.k, &a.v, &a.out, &a.lse, &a.cu_seqlens_q, &a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k},
                        a.alibi_slopes, a.options);
  check_block_mask(fn, a.block_mask, a.q.device, a.options.check_device_indices, p);
  check_documents(fn, a.document_ids_q, a.document_ids_k, a.q.device, a.q.shape[0], a.k.shape[0], p);
  check_prefix_lens(fn, a.prefix_lens, a.options, a.q.device, p);
  return p;
}

}  // namespace

static Problem validate_forward(const ForwardArgs& a) {
  const char* fn = "forward";
  Problem p = check_attention(fn, a);
  check_outputs_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}}, attention_inputs(a, {}), a.options);
#if defined(TILEATTN_WITH_CUDA)
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_forward(p, a); !why.empty()) fail(fn, why);
#endif
  return p;
}

static Problem validate_backward(const BackwardArgs& a) {
  const char* fn = "backward";
  if (!a.lse.present()) fail(fn, "lse is required: pass the forward's log-sum-exp");
  Problem p = check_attention(fn, a);
  check_like(fn, "dout", a.dout, "out", a.out);
  check_like(fn, "dq", a.dq, "q", a.q);
  check_like(fn, "dk", a.dk, "k", a.k);
  check_like(fn, "dv", a.dv, "v", a.v);
  check_outputs_disjoint(fn, {{"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}},
                         attention_inputs(a, {{"out", &a.out}, {"dout", &a.dout}, {"lse", &a.lse}}), a.options);
#if defined(TILEATTN_WITH_CUDA)
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_backward(p, a); !why.empty()) fail(fn, why);
#endif
  return p;
}

static Problem validate_decode(const DecodeArgs& a) {
  const char* fn = "decode";
  Problem p;
  check_tensor(fn, "q", a.q, 4);
  check_tensor(fn, "k_cache", a.k_cache, 4);
  check_tensor(fn, "v_cache", a.v_cache, 4);
  check_tensor(fn, "out", a.out, 4);
  check_optional(fn, "lse", a.lse, a.lse.ndim);
  check_optional(fn, "page_table", a.page_table, 2);
  check_optional(fn, "cache_seqlens", a.cache_seqlens, 1);
  check_optional(fn, "k_new", a.k_new, 4);
  check_optional(fn, "v_new", a.v_new, 4);
  check_optional(fn, "rotary_cos", a.rotary_cos, 2);
  check_optional(fn, "rotary_sin", a.rotary_sin, 2);
  check_optional(fn, "alibi_slopes", a.alibi_slopes, a.alibi_slopes.ndim);
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
#if defined(TILEATTN_WITH_CUDA)
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_decode_head_dim(p); !why.empty()) fail(fn, why);
#endif
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
  }
  check_rows(fn, "q seqlen", p.seqlen_q);

  p.paged = a.page_table.present();
  std::int64_t capacity = n1;
  if (p.paged) {
    check_tensor(fn, "page_table", a.page_table, 2);
    check_dtype(fn, "page_table", a.page_table, DType::i32);
    check_same_device(fn, "page_table", a.page_table, dev);
    if (a.page_table.shape[0] != p.batch)
      fail(fn, "page_table has shape ", shape_str(a.page_table), ", expected ", p.batch, " rows (batch)");
    if (n1 < 1) fail(fn, "k_cache.shape[1] (page_size) = ", n1, ", expected >= 1");
    p.page_size = to_int(fn, "k_cache.shape[1] (page_size)", n1);
    const auto pages_times_size = checked_mul(a.page_table.shape[1], n1);
    if (!pages_times_size)
      fail(fn, "page_table.shape[1] * page_size = ", a.page_table.shape[1], " * ", n1, " overflows int64");
    capacity = *pages_times_size;
    if (!a.cache_seqlens.present()) fail(fn, "cache_seqlens is required with a page_table");
  } else if (n0 != p.batch) {
    fail(fn, "k_cache.shape[0] = ", n0, " must equal q.shape[0] (batch) = ", p.batch, " for a contiguous cache");
  }
  check_rows(fn, p.paged ? "the cache capacity (page_table.shape[1] * page_size)" : "the cache capacity (k_cache.shape[1])",
             capacity);
  p.seqlen_k = static_cast<int>(capacity);
  p.decode_keys = p.seqlen_k;

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
      p.decode_keys = 0;
      for (int b = 0; b < p.batch; ++b) {
        if (lens[b] < 0) fail(fn, "cache_seqlens[", b, "] = ", lens[b], " is negative");
        if (lens[b] + p.seqlen_new > capacity)
          fail(fn, "cache_seqlens[", b, "] = ", lens[b], " plus ", p.seqlen_new, " appended rows exceeds the cache capacity of ", capacity,
               p.paged ? " (page_table.shape[1] * page_size)" : " (k_cache.shape[1])");
        p.decode_keys = std::max(p.decode_keys, static_cast<int>(lens[b] + p.seqlen_new));
      }
      if (p.paged) {
        // The page table in row-major order, from wherever it lives: on the host only the entries
        // the call reads (a table's width is a loose bound), the rest -1.
        std::vector<std::int64_t> pt;
        std::int64_t row = a.page_table.shape[1];
        if (a.page_table.device.type == DeviceType::cpu) {
          row = std::min<std::int64_t>(row, (p.decode_keys + n1 - 1) / n1);
          pt.assign(static_cast<std::size_t>(p.batch) * row, -1);
          for (int b = 0; b < p.batch; ++b)
            for (std::int64_t i = 0; i < (lens[b] + p.seqlen_new + n1 - 1) / n1; ++i)
              pt[b * row + i] = a.page_table.ptr<const std::int32_t>()[b * a.page_table.stride[0] + i * a.page_table.stride[1]];
        } else {
#if defined(TILEATTN_WITH_CUDA)
          const std::vector<std::int32_t> v = cuda::read_i32(a.page_table);
          pt.assign(v.begin(), v.end());
#endif
        }
        for (int b = 0; b < p.batch; ++b) {
          const std::int64_t used = (lens[b] + p.seqlen_new + n1 - 1) / n1;
          for (std::int64_t i = 0; i < used; ++i) {
            const std::int64_t page = pt[b * row + i];
            if (page < 0 || page >= n0)
              fail(fn, "page_table[", b, ", ", i, "] = ", page, " is outside [0, ", n0, ") (k_cache.shape[0] pages)");
          }
        }
        if (p.seqlen_new > 0) check_append_pages(fn, pt, row, lens, p.seqlen_new, n1);
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
    if (half < 1 || 2 * half > p.hdim_qk)
      fail(fn, "rotary_cos.shape[1] = ", half, " gives rotary_dim = ", 2 * half, ", expected 2 <= rotary_dim <= head_dim_qk = ", p.hdim_qk);
    check_shape(fn, "rotary_sin", a.rotary_sin, {positions, half});
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
  if (o.alibi_diagonal)
    fail(fn, "options.alibi_diagonal = ", *o.alibi_diagonal, ", decode measures ALiBi from each sequence's cache end");
  check_options(fn, o, p);
  check_alibi(fn, a.alibi_slopes, dev, p);
  // An append writes the caches: then they are outputs like out and lse.
  static const TensorView kAbsent{};
  const bool append = p.seqlen_new > 0;
  const TensorView& kc_out = append ? a.k_cache : kAbsent;
  const TensorView& vc_out = append ? a.v_cache : kAbsent;
  const TensorView& kc_in = append ? kAbsent : a.k_cache;
  const TensorView& vc_in = append ? kAbsent : a.v_cache;
  check_outputs_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}, {"k_cache", &kc_out}, {"v_cache", &vc_out}},
                         {{"q", &a.q}, {"k_cache", &kc_in}, {"v_cache", &vc_in}, {"page_table", &a.page_table},
                          {"cache_seqlens", &a.cache_seqlens}, {"k_new", &a.k_new}, {"v_new", &a.v_new},
                          {"rotary_cos", &a.rotary_cos}, {"rotary_sin", &a.rotary_sin},
                          {"alibi_slopes", &a.alibi_slopes}},
                         a.options);
  return p;
}

static Problem validate_combine(const CombineArgs& a) {
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
  to_int(fn, "out_partial.shape[0] (splits)", s[0]);
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
    check_tensor(fn, "lse", a.lse, 3);
  }
  check_outputs_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}},
                         {{"out_partial", &a.out_partial}, {"lse_partial", &a.lse_partial}}, a.options);
#if defined(TILEATTN_WITH_CUDA)
  if (p.backend == Backend::cuda)
    if (const std::string why = cuda::check_combine(p, a); !why.empty()) fail(fn, why);
#endif
  return p;
}

// Validation reads index tensors on the host (cu_seqlens, cache_seqlens, page tables); one whose
// length is absurd (a stride-0 view of 2^31 entries, say) may not fit in memory. That is reported
// as tileattn::Error like any bad argument, never as std::bad_alloc.
template <class Args>
static Problem guarded(const char* fn, Problem (*check)(const Args&), const Args& a) {
  try {
    return check(a);
  } catch (const std::bad_alloc&) {
    fail(fn, "out of host memory while checking the arguments (an index tensor too long to read?)");
  }
}

Problem validate(const ForwardArgs& a) { return guarded("forward", validate_forward, a); }
Problem validate(const BackwardArgs& a) { return guarded("backward", validate_backward, a); }
Problem validate(const DecodeArgs& a) { return guarded("decode", validate_decode, a); }
Problem validate(const CombineArgs& a) { return guarded("combine", validate_combine, a); }

}  // namespace tileattn
