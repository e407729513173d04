// tileattn._C: the C++ API for Python. Each function takes DLPack arrays for the views of the C++
// argument structs, outputs preallocated by the caller, and an Options object; the pure-Python
// package allocates outputs and builds the options.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include <hwy/targets.h>

#include "cpu/amx.hpp"
#include "tileattn/tileattn.hpp"
#include "views.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tileattn::python {
namespace {

using OptIn = std::optional<Input>;
using OptOut = std::optional<Output>;

void attach_workspace(Options& o, const OptOut& ws) {
  if (!ws) return;
  o.workspace = static_cast<char*>(ws->t.data) + ws->t.byte_offset;
  o.workspace_bytes = nbytes(ws->t);
}

// The scratch sizes of recent calls by everything a size can depend on: the views' shapes, strides,
// dtypes and devices, the lengths and the options, never the data. A call like a recent one then
// skips the size query, which validates every argument as the call itself does again (on a GPU with
// a pointer query per tensor): a second validation per call, for a number that a training or
// serving loop asks again and again. A size gone stale would cost no safety: every backend takes its
// scratch itself when given less than it needs. Used under the GIL, like the rest of the argument
// handling.
template <class Args>
class ScratchSizes {
 public:
  std::size_t operator()(const Args& a) {
    key_.clear();
    add(a);
    for (const Entry& e : entries_)
      if (e.key == key_) return e.bytes;
    const std::size_t n = tileattn::workspace_size(a);
    Entry& e = entries_[next_++ % entries_.size()];
    e.key = key_;
    e.bytes = n;
    return n;
  }

 private:
  struct Entry {
    std::vector<std::int64_t> key;  // empty: unused (a key never is)
    std::size_t bytes = 0;
  };

  void add(std::int64_t v) { key_.push_back(v); }
  void add(float f) {
    std::int32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    add(std::int64_t{bits});
  }
  void add(const TensorView& t) {
    add(std::int64_t{t.ndim});
    if (!t.present()) return;
    add(static_cast<std::int64_t>(t.dtype));
    add(static_cast<std::int64_t>(t.device.type));
    add(std::int64_t{t.device.index});
    for (int d = 0; d < t.ndim && d < kMaxDims; ++d) {
      add(t.shape[d]);
      add(t.stride[d]);
    }
  }
  void add(const Options& o) {
    add(std::int64_t{o.scale.has_value()});
    add(o.scale.value_or(0.f));
    add(std::int64_t{o.causal} | std::int64_t{o.deterministic} << 1 | std::int64_t{o.check_device_indices} << 2 |
        static_cast<std::int64_t>(o.align) << 8 | static_cast<std::int64_t>(o.backend) << 16);
    add(std::int64_t{o.window_left});
    add(std::int64_t{o.window_right});
    add(std::int64_t{o.chunk_size});
    add(std::int64_t{o.num_splits});
    add(std::int64_t{o.sm_margin});
    add(o.softcap);
    add(o.dropout_p);
  }
  void add(const BlockMask& m) {
    for (const TensorView* t : {&m.kv_num_blocks, &m.kv_indices, &m.full_kv_num_blocks, &m.full_kv_indices, &m.mask})
      add(*t);
    add(std::int64_t{m.block_q});
    add(std::int64_t{m.block_k});
  }
  void add(const ForwardArgs& a) {
    for (const TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.cu_seqlens_q, &a.cu_seqlens_k, &a.alibi_slopes,
                                &a.document_ids_q, &a.document_ids_k})
      add(*t);
    add(std::int64_t{a.max_seqlen_q});
    add(std::int64_t{a.max_seqlen_k});
    add(a.block_mask);
    add(a.options);
  }
  void add(const BackwardArgs& a) {
    for (const TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.lse, &a.dq, &a.dk, &a.dv, &a.cu_seqlens_q,
                                &a.cu_seqlens_k, &a.alibi_slopes, &a.document_ids_q, &a.document_ids_k})
      add(*t);
    add(std::int64_t{a.max_seqlen_q});
    add(std::int64_t{a.max_seqlen_k});
    add(a.block_mask);
    add(a.options);
  }

  std::vector<std::int64_t> key_;
  std::array<Entry, 8> entries_;
  std::size_t next_ = 0;
};

// workspace: None, an array, or a callable that allocates n bytes in the caller's library. The
// callable saves a caller the second conversion of every argument that asking
// *_workspace_size first costs: tens of microseconds per call, more than a short kernel takes.
// size(a): the bytes the call needs; forward and backward look them up (ScratchSizes), decode asks
// every call (its scratch follows the cache lengths, which may be device data).
// Returns the object that keeps the scratch alive for the call.
template <class Args, class Size>
nb::object attach_workspace(Args& a, nb::object workspace, Size&& size) {
  nb::object ws = workspace;
  if (PyCallable_Check(workspace.ptr())) {
    const std::size_t n = size(a);
    ws = n > 0 ? workspace(n) : nb::none();
  }
  if (!ws.is_none()) attach_workspace(a.options, nb::cast<Output>(ws));
  return ws;
}

template <class Args>
nb::object attach_workspace(Args& a, nb::object workspace) {
  return attach_workspace(a, workspace, [](const Args& x) { return tileattn::workspace_size(x); });
}

ScratchSizes<ForwardArgs> forward_sizes;
ScratchSizes<BackwardArgs> backward_sizes;

// Runs a native call, without the GIL where it may take long: a CPU call computes for as long as the
// attention takes, and other Python threads run meanwhile; so does a call that synchronizes with the
// GPU (a decode that reads device indices back). A CUDA call that only validates and launches keeps
// it, as PyTorch's own operators do: releasing and retaking the GIL adds to its few microseconds of
// host time, and a Python thread waiting for the GIL could take it in between and hold it for up to
// a switch interval.
template <class Call>
void run_native(bool release_gil, Call&& call) {
  if (!release_gil) return call();
  nb::gil_scoped_release release;
  call();
}

// Lengths and windows cross as 64-bit integers and are range-checked here, so a value past int
// gets an error naming it instead of nanobind's "incompatible function arguments".
int to_int(const char* fn, const char* name, std::int64_t v) {
  if (v < INT32_MIN || v > INT32_MAX)
    throw Error(std::string("tileattn::") + fn + ": " + name + " = " + std::to_string(v) +
                " does not fit a 32-bit int");
  return static_cast<int>(v);
}

// heads_first: the 4-D arrays are [batch, heads, seqlen, d] (PyTorch SDPA's layout) and cross as
// their [batch, seqlen, heads, d] transposes, so that the caller makes no transposed views (about a
// microsecond of host time each in PyTorch). Other ranks are left for the core to report.
void heads_first_to_core(std::initializer_list<TensorView*> views) {
  for (TensorView* t : views)
    if (t->ndim == 4) {
      std::swap(t->shape[1], t->shape[2]);
      std::swap(t->stride[1], t->stride[2]);
    }
}

// The sequence fields and options that forward and backward arguments share.
template <class Args>
void set_sequences(const char* fn, Args& a, const OptIn& cu_q, const OptIn& cu_k, int max_q, int max_k,
                   const OptIn& alibi, const Options& o) {
  a.cu_seqlens_q = to_view(fn, "cu_seqlens_q", cu_q);
  a.cu_seqlens_k = to_view(fn, "cu_seqlens_k", cu_k);
  a.max_seqlen_q = max_q;
  a.max_seqlen_k = max_k;
  a.alibi_slopes = to_view(fn, "alibi_slopes", alibi);
  a.options = o;
}

ForwardArgs forward_args(const char* fn, const Input& q, const Input& k, const Input& v, const Output& out,
                         const OptOut& lse, const OptIn& cu_q, const OptIn& cu_k, int max_q, int max_k,
                         const OptIn& alibi, const Options& o, bool heads_first = false) {
  ForwardArgs a;
  a.q = to_view(fn, "q", q);
  a.k = to_view(fn, "k", k);
  a.v = to_view(fn, "v", v);
  a.out = to_view(fn, "out", out);
  if (heads_first) heads_first_to_core({&a.q, &a.k, &a.v, &a.out});
  a.lse = to_view(fn, "lse", lse);
  set_sequences(fn, a, cu_q, cu_k, max_q, max_k, alibi, o);
  return a;
}

BackwardArgs backward_args(const char* fn, const Input& q, const Input& k, const Input& v, const Input& out,
                           const Input& dout, const OptIn& lse, const Output& dq, const Output& dk,
                           const Output& dv, const OptIn& cu_q, const OptIn& cu_k, int max_q, int max_k,
                           const OptIn& alibi, const Options& o, bool heads_first = false) {
  BackwardArgs a;
  a.q = to_view(fn, "q", q);
  a.k = to_view(fn, "k", k);
  a.v = to_view(fn, "v", v);
  a.out = to_view(fn, "out", out);
  a.dout = to_view(fn, "dout", dout);
  a.lse = to_view(fn, "lse", lse);
  a.dq = to_view(fn, "dq", dq);
  a.dk = to_view(fn, "dk", dk);
  a.dv = to_view(fn, "dv", dv);
  if (heads_first) heads_first_to_core({&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv});
  set_sequences(fn, a, cu_q, cu_k, max_q, max_k, alibi, o);
  return a;
}

DecodeArgs decode_args(const char* fn, const Input& q, const Cache& k_cache, const Cache& v_cache,
                       const Output& out, const OptOut& lse, const OptIn& page_table,
                       const OptIn& cache_seqlens, const OptIn& k_new, const OptIn& v_new,
                       const OptIn& rotary_cos, const OptIn& rotary_sin, bool rotary_interleaved,
                       const OptIn& alibi, const Options& o) {
  DecodeArgs a;
  a.q = to_view(fn, "q", q);
  a.k_cache = to_view(fn, "k_cache", k_cache);
  a.v_cache = to_view(fn, "v_cache", v_cache);
  a.out = to_view(fn, "out", out);
  a.lse = to_view(fn, "lse", lse);
  a.page_table = to_view(fn, "page_table", page_table);
  a.cache_seqlens = to_view(fn, "cache_seqlens", cache_seqlens);
  a.k_new = to_view(fn, "k_new", k_new);
  a.v_new = to_view(fn, "v_new", v_new);
  a.rotary_cos = to_view(fn, "rotary_cos", rotary_cos);
  a.rotary_sin = to_view(fn, "rotary_sin", rotary_sin);
  a.rotary_interleaved = rotary_interleaved;
  a.alibi_slopes = to_view(fn, "alibi_slopes", alibi);
  a.options = o;
  return a;
}

void bind_options(nb::module_& m) {
  nb::enum_<Backend>(m, "Backend")
      .value("automatic", Backend::automatic)
      .value("cpu_flash", Backend::cpu_flash)
      .value("cpu_reference", Backend::cpu_reference)
      .value("cuda", Backend::cuda);
  nb::enum_<MaskAlign>(m, "MaskAlign")
      .value("bottom_right", MaskAlign::bottom_right)
      .value("top_left", MaskAlign::top_left);

  nb::class_<Options>(m, "Options", "tileattn::Options; see include/tileattn/options.hpp")
      .def(
          "__init__",
          [](Options* o, std::optional<float> scale, bool causal, MaskAlign align, std::int64_t window_left,
             std::int64_t window_right, float softcap, float dropout_p, std::uint64_t seed, std::uint64_t offset,
             bool deterministic, Backend backend, std::int64_t num_splits, std::int64_t sm_margin,
             bool check_device_indices, std::uintptr_t stream) {
            const int wl = to_int("Options", "window_left", window_left);
            const int wr = to_int("Options", "window_right", window_right);
            const int splits = to_int("Options", "num_splits", num_splits);
            const int margin = to_int("Options", "sm_margin", sm_margin);
            new (o) Options();
            o->scale = scale;
            o->causal = causal;
            o->align = align;
            o->window_left = wl;
            o->window_right = wr;
            o->softcap = softcap;
            o->dropout_p = dropout_p;
            o->seed = seed;
            o->offset = offset;
            o->deterministic = deterministic;
            o->backend = backend;
            o->num_splits = splits;
            o->sm_margin = margin;
            o->check_device_indices = check_device_indices;
            o->stream = reinterpret_cast<void*>(stream);
          },
          nb::kw_only(), "scale"_a = nb::none(), "causal"_a = false, "align"_a = MaskAlign::bottom_right,
          "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.f, "dropout_p"_a = 0.f, "seed"_a = 0,
          "offset"_a = 0, "deterministic"_a = false, "backend"_a = Backend::automatic, "num_splits"_a = 0,
          "sm_margin"_a = 0, "check_device_indices"_a = true, "stream"_a = 0)
      .def_rw("scale", &Options::scale)
      .def_rw("causal", &Options::causal)
      .def_rw("align", &Options::align)
      .def_rw("window_left", &Options::window_left)
      .def_rw("window_right", &Options::window_right)
      .def_rw("softcap", &Options::softcap)
      .def_rw("dropout_p", &Options::dropout_p)
      .def_rw("seed", &Options::seed)
      .def_rw("offset", &Options::offset)
      .def_rw("deterministic", &Options::deterministic)
      .def_rw("backend", &Options::backend)
      .def_rw("num_splits", &Options::num_splits)
      .def_rw("sm_margin", &Options::sm_margin)
      .def_rw("check_device_indices", &Options::check_device_indices)
      .def_rw("check_residence", &Options::check_residence)
      .def_rw("alibi_diagonal", &Options::alibi_diagonal)
      .def_rw("chunk_size", &Options::chunk_size)
      .def_rw("prefix_len", &Options::prefix_len)
      .def_prop_rw(
          "stream", [](const Options& o) { return reinterpret_cast<std::uintptr_t>(o.stream); },
          [](Options& o, std::uintptr_t s) { o.stream = reinterpret_cast<void*>(s); },
          "cudaStream_t as an integer; 0 = the default stream");
}

void bind_calls(nb::module_& m) {
  using Release = nb::call_guard<nb::gil_scoped_release>;

  m.def(
      "forward",
      [](const Input& q, const Input& k, const Input& v, const Output& out, const OptOut& lse,
         const OptIn& cu_q, const OptIn& cu_k, std::int64_t max_q, std::int64_t max_k, const OptIn& alibi,
         const Options& o, nb::object workspace, bool heads_first) {
        ForwardArgs a = forward_args("forward", q, k, v, out, lse, cu_q, cu_k, to_int("forward", "max_seqlen_q", max_q),
                                     to_int("forward", "max_seqlen_k", max_k), alibi, o, heads_first);
        nb::object ws = attach_workspace(a, workspace, forward_sizes);
        run_native(a.q.device.type == DeviceType::cpu, [&] { tileattn::forward(a); });
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = nb::none(), "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "alibi_slopes"_a = nb::none(),
      "options"_a = Options(), "workspace"_a = nb::none(), "heads_first"_a = false,
      "workspace: None, a byte array, or a callable n -> byte array of n bytes (called only when n > 0).\n"
      "heads_first: q, k, v and out are [batch, heads, seqlen, d] (PyTorch SDPA's layout) rather than "
      "[batch, seqlen, heads, d]; lse is [batch, heads, seqlen] either way.");

  m.def(
      "forward_workspace_size",
      [](const Input& q, const Input& k, const Input& v, const Output& out, const OptOut& lse,
         const OptIn& cu_q, const OptIn& cu_k, std::int64_t max_q, std::int64_t max_k, const OptIn& alibi,
         const Options& o) {
        return tileattn::workspace_size(forward_args("forward", q, k, v, out, lse, cu_q, cu_k,
                                                     to_int("forward", "max_seqlen_q", max_q),
                                                     to_int("forward", "max_seqlen_k", max_k), alibi, o));
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = nb::none(), "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "alibi_slopes"_a = nb::none(),
      "options"_a = Options(), Release());

  m.def(
      "backward",
      [](const Input& q, const Input& k, const Input& v, const Input& out, const Input& dout, const OptIn& lse,
         const Output& dq, const Output& dk, const Output& dv, const OptIn& cu_q, const OptIn& cu_k,
         std::int64_t max_q, std::int64_t max_k, const OptIn& alibi, const Options& o, nb::object workspace,
         bool heads_first) {
        BackwardArgs a = backward_args("backward", q, k, v, out, dout, lse, dq, dk, dv, cu_q, cu_k,
                                       to_int("backward", "max_seqlen_q", max_q),
                                       to_int("backward", "max_seqlen_k", max_k), alibi, o, heads_first);
        nb::object ws = attach_workspace(a, workspace, backward_sizes);
        run_native(a.q.device.type == DeviceType::cpu, [&] { tileattn::backward(a); });
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "alibi_slopes"_a = nb::none(),
      "options"_a = Options(), "workspace"_a = nb::none(), "heads_first"_a = false,
      "workspace: None, a byte array, or a callable n -> byte array of n bytes (called only when n > 0).\n"
      "heads_first: q, k, v, out, dout, dq, dk and dv are [batch, heads, seqlen, d] (as forward's).");

  m.def(
      "backward_workspace_size",
      [](const Input& q, const Input& k, const Input& v, const Input& out, const Input& dout, const OptIn& lse,
         const Output& dq, const Output& dk, const Output& dv, const OptIn& cu_q, const OptIn& cu_k,
         std::int64_t max_q, std::int64_t max_k, const OptIn& alibi, const Options& o) {
        return tileattn::workspace_size(backward_args("backward", q, k, v, out, dout, lse, dq, dk, dv, cu_q, cu_k,
                                                      to_int("backward", "max_seqlen_q", max_q),
                                                      to_int("backward", "max_seqlen_k", max_k), alibi, o));
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "alibi_slopes"_a = nb::none(),
      "options"_a = Options(), Release());

  m.def(
      "decode",
      [](const Input& q, const Cache& k_cache, const Cache& v_cache, const Output& out, const OptOut& lse,
         const OptIn& page_table, const OptIn& cache_seqlens, const OptIn& k_new, const OptIn& v_new,
         const OptIn& rotary_cos, const OptIn& rotary_sin, bool rotary_interleaved, const OptIn& alibi,
         const Options& o, nb::object workspace) {
        DecodeArgs a = decode_args("decode", q, k_cache, v_cache, out, lse, page_table, cache_seqlens, k_new,
                                   v_new, rotary_cos, rotary_sin, rotary_interleaved, alibi, o);
        if (k_new || v_new)
          for (auto [name, cache] : {std::pair{"k_cache", &k_cache}, std::pair{"v_cache", &v_cache}})
            if (cache->read_only)
              throw Error(std::string("tileattn::decode: ") + name + " is read-only, but k_new/v_new are appended to it");
        nb::object ws = attach_workspace(a, workspace);
        run_native(a.q.device.type == DeviceType::cpu || o.check_device_indices, [&] { tileattn::decode(a); });
      },
      "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "lse"_a = nb::none(), "page_table"_a = nb::none(),
      "cache_seqlens"_a = nb::none(), "k_new"_a = nb::none(), "v_new"_a = nb::none(),
      "rotary_cos"_a = nb::none(), "rotary_sin"_a = nb::none(), "rotary_interleaved"_a = false,
      "alibi_slopes"_a = nb::none(), "options"_a = Options(), "workspace"_a = nb::none());

  m.def(
      "decode_workspace_size",
      [](const Input& q, const Cache& k_cache, const Cache& v_cache, const Output& out, const OptOut& lse,
         const OptIn& page_table, const OptIn& cache_seqlens, const OptIn& k_new, const OptIn& v_new,
         const OptIn& rotary_cos, const OptIn& rotary_sin, bool rotary_interleaved, const OptIn& alibi,
         const Options& o) {
        return tileattn::workspace_size(decode_args("decode", q, k_cache, v_cache, out, lse, page_table,
                                                    cache_seqlens, k_new, v_new, rotary_cos, rotary_sin,
                                                    rotary_interleaved, alibi, o));
      },
      "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "lse"_a = nb::none(), "page_table"_a = nb::none(),
      "cache_seqlens"_a = nb::none(), "k_new"_a = nb::none(), "v_new"_a = nb::none(),
      "rotary_cos"_a = nb::none(), "rotary_sin"_a = nb::none(), "rotary_interleaved"_a = false,
      "alibi_slopes"_a = nb::none(), "options"_a = Options(), Release());

  m.def(
      "combine",
      [](const Input& out_partial, const Input& lse_partial, const Output& out, const OptOut& lse,
         const Options& o) {
        const char* fn = "combine";
        CombineArgs a;
        a.out_partial = to_view(fn, "out_partial", out_partial);
        a.lse_partial = to_view(fn, "lse_partial", lse_partial);
        a.out = to_view(fn, "out", out);
        a.lse = to_view(fn, "lse", lse);
        a.options = o;
        tileattn::combine(a);
      },
      "out_partial"_a, "lse_partial"_a, "out"_a, "lse"_a = nb::none(), "options"_a = Options(), Release());
}

// Block-sparse attention and document ids: forward and backward with an optional block mask (see
// BlockMask in attention.hpp) and optional document ids. heads_first as in forward / backward.
BlockMask block_mask(const char* fn, const OptIn& num, const OptIn& idx, const OptIn& full_num, const OptIn& full_idx,
                     const OptIn& dense, int block_q, int block_k) {
  BlockMask m;
  m.kv_num_blocks = to_view(fn, "kv_num_blocks", num);
  m.kv_indices = to_view(fn, "kv_indices", idx);
  m.full_kv_num_blocks = to_view(fn, "full_kv_num_blocks", full_num);
  m.full_kv_indices = to_view(fn, "full_kv_indices", full_idx);
  m.mask = to_view(fn, "mask", dense);
  m.block_q = block_q;
  m.block_k = block_k;
  return m;
}

void bind_block_sparse(nb::module_& m) {
  using Release = nb::call_guard<nb::gil_scoped_release>;
  m.def(
      "forward_block_sparse",
      [](const Input& q, const Input& k, const Input& v, const Output& out, const OptOut& lse, const OptIn& cu_q,
         const OptIn& cu_k, int max_q, int max_k, const OptIn& alibi, const OptIn& num, const OptIn& idx,
         const OptIn& full_num, const OptIn& full_idx, const OptIn& dense, int block_q, int block_k,
         const OptIn& docs_q, const OptIn& docs_k, const OptIn& prefix_lens, const Options& o, bool heads_first) {
        ForwardArgs a = forward_args("forward", q, k, v, out, lse, cu_q, cu_k, max_q, max_k, alibi, o, heads_first);
        a.block_mask = block_mask("forward", num, idx, full_num, full_idx, dense, block_q, block_k);
        a.document_ids_q = to_view("forward", "document_ids_q", docs_q);
        a.document_ids_k = to_view("forward", "document_ids_k", docs_k);
        a.prefix_lens = to_view("forward", "prefix_lens", prefix_lens);
        tileattn::forward(a);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = nb::none(), "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "alibi_slopes"_a = nb::none(),
      "kv_num_blocks"_a = nb::none(), "kv_indices"_a = nb::none(), "full_kv_num_blocks"_a = nb::none(),
      "full_kv_indices"_a = nb::none(), "mask"_a = nb::none(), "block_q"_a = 128, "block_k"_a = 128,
      "document_ids_q"_a = nb::none(), "document_ids_k"_a = nb::none(), "prefix_lens"_a = nb::none(),
      "options"_a = Options(), "heads_first"_a = false, Release());

  m.def(
      "backward_block_sparse",
      [](const Input& q, const Input& k, const Input& v, const Input& out, const Input& dout, const OptIn& lse,
         const Output& dq, const Output& dk, const Output& dv, const OptIn& cu_q, const OptIn& cu_k, int max_q,
         int max_k, const OptIn& alibi, const OptIn& num, const OptIn& idx, const OptIn& full_num,
         const OptIn& full_idx, const OptIn& dense, int block_q, int block_k, const OptIn& docs_q, const OptIn& docs_k,
         const OptIn& prefix_lens, const Options& o, bool heads_first) {
        BackwardArgs a = backward_args("backward", q, k, v, out, dout, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, alibi,
                                       o, heads_first);
        a.block_mask = block_mask("backward", num, idx, full_num, full_idx, dense, block_q, block_k);
        a.document_ids_q = to_view("backward", "document_ids_q", docs_q);
        a.document_ids_k = to_view("backward", "document_ids_k", docs_k);
        a.prefix_lens = to_view("backward", "prefix_lens", prefix_lens);
        tileattn::backward(a);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "alibi_slopes"_a = nb::none(),
      "kv_num_blocks"_a = nb::none(), "kv_indices"_a = nb::none(), "full_kv_num_blocks"_a = nb::none(),
      "full_kv_indices"_a = nb::none(), "mask"_a = nb::none(), "block_q"_a = 128, "block_k"_a = 128,
      "document_ids_q"_a = nb::none(), "document_ids_k"_a = nb::none(), "prefix_lens"_a = nb::none(),
      "options"_a = Options(), "heads_first"_a = false, Release());
}

void bind_runtime(nb::module_& m) {
  // NumPy exports no bfloat16 over DLPack or the buffer protocol (ml_dtypes' bfloat16 is a user
  // dtype), so the Python layer passes such arrays as their uint16 bits, relabeled here.
  m.def(
      "bf16_alias",
      [](const nb::ndarray<std::uint16_t, nb::ro>& bits) {
        std::vector<size_t> shape(bits.ndim());
        for (size_t d = 0; d < shape.size(); ++d) shape[d] = bits.shape(d);
        return nb::ndarray<nb::array_api>(const_cast<std::uint16_t*>(bits.data()), shape.size(), shape.data(), nb::cast(bits),
                             bits.stride_ptr(),
                             nb::dlpack::dtype{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1},
                             bits.device_type(), bits.device_id());
      },
      "bits"_a, "The same memory as a bfloat16 array (bits: uint16 of any shape, strides and device).");

  nb::class_<MemoryStats>(m, "MemoryStats")
      .def_ro("current_bytes", &MemoryStats::current_bytes)
      .def_ro("peak_bytes", &MemoryStats::peak_bytes)
      .def("__repr__", [](const MemoryStats& s) {
        return "MemoryStats(current_bytes=" + std::to_string(s.current_bytes) +
               ", peak_bytes=" + std::to_string(s.peak_bytes) + ")";
      });
  m.def("memory_stats", &tileattn::memory_stats, "Host memory the library itself holds and its peak.");
  m.def("reset_peak_memory", &tileattn::reset_peak_memory);
  m.def(
      "build_info",
      [] {
        nb::dict d;
        d["version"] = TILEATTN_VERSION;
#ifdef TILEATTN_BUILT_CUDA
        auto split = [](std::string s) {
          std::vector<std::string> out;
          for (std::size_t i = 0; i <= s.size();) {
            const std::size_t j = std::min(s.find(' ', i), s.size());
            if (j > i) out.push_back(s.substr(i, j - i));
            i = j + 1;
          }
          return out;
        };
        d["cuda"] = true;
        d["cuda_architectures"] = split(TILEATTN_BUILT_CUDA_ARCHS);
        d["cuda_dtypes"] = split(TILEATTN_BUILT_CUDA_DTYPES);
        d["cuda_head_dims"] = split(TILEATTN_BUILT_CUDA_HDIMS);
#else
        d["cuda"] = false;
        d["cuda_architectures"] = std::vector<std::string>{};
        d["cuda_dtypes"] = std::vector<std::string>{};
        d["cuda_head_dims"] = std::vector<std::string>{};
#endif
        // The best SIMD target Highway dispatches to on this CPU among those compiled in.
        const std::int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
        d["cpu_simd"] = hwy::TargetName(usable & -usable);
        d["cpu_amx"] = tileattn::cpu::amx::available();
        d["cpu_threads"] = tileattn::num_threads();
        return d;
      },
      "What this build holds and what it uses here: version, CUDA (built, architectures, kernel dtypes "
      "and head dims), the CPU's SIMD target, AMX, CPU threads.");
  m.def("set_num_threads", &tileattn::set_num_threads, "n"_a, "CPU threads; 0 = hardware concurrency.");
  m.def("num_threads", &tileattn::num_threads);
}

}  // namespace
}  // namespace tileattn::python

NB_MODULE(_C, m) {
  using namespace tileattn::python;
  m.attr("__version__") = TILEATTN_VERSION;
  // An autograd graph alive at exit (a global output of a differentiable call) holds its call's
  // Options in PyTorch's nodes, which the interpreter need not free before this module's teardown:
  // nanobind would report that as a leak on every such program's exit.
  nb::set_leak_warnings(false);

  // tileattn.Error: both a ValueError (bad input, the common case) and a RuntimeError (what the
  // C++ type derives from), so either except clause catches it.
  PyObject* bases = PyTuple_Pack(2, PyExc_ValueError, PyExc_RuntimeError);
  PyObject* error = PyErr_NewException("tileattn.Error", bases, nullptr);
  Py_DECREF(bases);
  m.attr("Error") = nb::steal(error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const tileattn::Error& e) {
          PyErr_SetString(static_cast<PyObject*>(type), e.what());
        }
      },
      error);

  bind_options(m);
  bind_calls(m);
  bind_block_sparse(m);
  bind_runtime(m);
}
