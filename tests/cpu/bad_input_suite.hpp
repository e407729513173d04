// The machinery of the bad-input suite: a case is a call with one argument broken; running it
// asserts that it throws tileattn::Error naming the argument (as a whole word) and that no byte of
// any buffer of the fixture (inputs, outputs, caches, the caller's workspace) changed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {

struct BadCase {
  std::string what;
  std::function<void()> call;
  std::vector<std::string> names;  // each must appear in the message as a whole word
};

// name occurs in msg with no identifier character right before or after it.
inline bool names_word(const std::string& msg, const std::string& name) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (std::size_t at = msg.find(name); at != std::string::npos; at = msg.find(name, at + 1)) {
    const bool left = at == 0 || !ident(msg[at - 1]);
    const bool right = at + name.size() == msg.size() || !ident(msg[at + name.size()]);
    if (left && right) return true;
  }
  return false;
}

struct SuiteCounts {
  int tried = 0, rejected = 0, accepted = 0, other_exception = 0, unnamed = 0, bytes_changed = 0;
};

inline std::vector<std::vector<unsigned char>> snapshot(const std::vector<HostTensor*>& buffers,
                                                         const std::vector<unsigned char>* extra) {
  std::vector<std::vector<unsigned char>> s;
  for (HostTensor* t : buffers) {
    const auto* p = static_cast<const unsigned char*>(t->data());
    s.emplace_back(p, p + t->numel() * dtype_size(t->dtype()));
  }
  if (extra) s.push_back(*extra);
  return s;
}

inline SuiteCounts run_bad_cases(const std::vector<BadCase>& cases, const std::vector<HostTensor*>& buffers,
                                 const std::vector<unsigned char>* workspace) {
  SuiteCounts n;
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    ++n.tried;
    const auto before = snapshot(buffers, workspace);
    try {
      c.call();
      ++n.accepted;
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      ++n.rejected;
      const std::string msg = e.what();
      bool named = true;
      for (const auto& name : c.names) named = named && names_word(msg, name);
      if (!named) {
        ++n.unnamed;
        ADD_FAILURE() << "the error does not name every one of the arguments: " << msg;
      }
    } catch (const std::exception& e) {
      ++n.other_exception;
      ADD_FAILURE() << "threw a non-tileattn exception: " << e.what();
    }
    if (snapshot(buffers, workspace) != before) {
      ++n.bytes_changed;
      ADD_FAILURE() << "a buffer changed";
    }
  }
  return n;
}

// One argument's field of an argument struct (a member, or a view reached through `get`, such as the
// block mask's), and how to break its shape so that the error names it. any_strides: the argument
// takes any strides (no "last stride 2" case).
template <class Args>
struct Field {
  const char* name;
  std::function<TensorView&(Args&)> get;
  bool required;
  std::function<void(TensorView&)> bad_shape;
  bool any_strides = false;

  Field(const char* n, TensorView Args::*member, bool req, std::function<void(TensorView&)> bad)
      : name(n), get([member](Args& a) -> TensorView& { return a.*member; }), required(req), bad_shape(std::move(bad)) {}
  Field(const char* n, std::function<TensorView&(Args&)> g, bool req, std::function<void(TensorView&)> bad, bool any)
      : name(n), get(std::move(g)), required(req), bad_shape(std::move(bad)), any_strides(any) {}
  TensorView of(const std::function<Args()>& make) const {
    Args a = make();
    return get(a);
  }
};

inline void grow_dim0(TensorView& t) { t.shape[0] += 1; }

// The generic breakages of one view: rank, enums, shape, element-count and byte-extent overflow,
// null data, strides, dtype, device. `make` returns a valid argument struct; `call` runs the entry
// point. The expected name is the field's.
template <class Args>
void add_view_cases(std::vector<BadCase>& out, const std::string& fn, const std::function<Args()>& make,
                    const std::function<void(const Args&)>& call, const Field<Args>& f, bool reference_tensor) {
  const std::string base = fn + " " + f.name + ": ";
  auto add = [&](const std::string& what, std::function<void(TensorView&)> mutate) {
    out.push_back({base + what, [make, call, get = f.get, mutate] {
                     Args a = make();
                     mutate(get(a));
                     call(a);
                   },
                   {f.name}});
  };
  const TensorView v = f.of(make);
  const int n = v.ndim;
  if (f.required) {
    add("absent", [](TensorView& t) { t = TensorView{}; });
    add("rank -1", [](TensorView& t) { t.ndim = -1; });
  }
  add("rank 100000", [](TensorView& t) { t.ndim = 100000; });
  add("rank 6", [](TensorView& t) { t.ndim = kMaxDims + 1; });
  if (n < kMaxDims) add("rank + 1", [](TensorView& t) { t.stride[t.ndim] = 1, t.shape[t.ndim] = 1, ++t.ndim; });
  if (n > 1) add("rank - 1", [](TensorView& t) { --t.ndim; });
  add("dtype enum 9", [](TensorView& t) { t.dtype = static_cast<DType>(9); });
  add("dtype enum 255", [](TensorView& t) { t.dtype = static_cast<DType>(255); });
  add("device type enum 5", [](TensorView& t) { t.device.type = static_cast<DeviceType>(5); });
  add("device index -1", [](TensorView& t) { t.device.index = -1; });
  add("negative shape[0]", [](TensorView& t) { t.shape[0] = -1; });
  add("negative last dim", [](TensorView& t) { t.shape[t.ndim - 1] = -8; });
  if (n >= 2) {
    add("element count overflows", [](TensorView& t) { t.shape[0] = t.shape[1] = std::int64_t{1} << 40; });
    add("element count INT64_MAX", [](TensorView& t) { t.shape[0] = std::numeric_limits<std::int64_t>::max(); });
  } else {
    add("extent 2^62 elements", [](TensorView& t) { t.shape[0] = std::int64_t{1} << 62; });
  }
  // The first dimension with more than one element (its stride is free unless it is the last).
  int d0 = 0;
  while (d0 + 1 < n && v.shape[d0] <= 1) ++d0;
  // A stride whose step alone reaches 2^57 bytes (2^55 elements of 4 bytes), then larger ones.
  const std::int64_t past = (std::int64_t{1} << 57) / static_cast<std::int64_t>(dtype_size(v.dtype));
  for (std::int64_t s : {past, std::int64_t{1} << 61, std::numeric_limits<std::int64_t>::max(),
                         std::numeric_limits<std::int64_t>::min() + 1, -(std::int64_t{1} << 61)})
    add("stride[" + std::to_string(d0) + "] = " + std::to_string(s), [d0, s](TensorView& t) { t.stride[d0] = s; });
  add("null data", [](TensorView& t) { t.data = nullptr; });
  add("data at the top of the address space", [](TensorView& t) {
    t.data = reinterpret_cast<void*>(std::numeric_limits<std::uintptr_t>::max() - 3);  // its bytes wrap past 2^64
  });
  add("data at address 16 with a negative stride", [d0](TensorView& t) {
    t.data = reinterpret_cast<void*>(std::uintptr_t{16});
    t.stride[d0] = -(std::int64_t{1} << 40);
  });
  if (v.shape[n - 1] > 1 && !f.any_strides) add("last stride 2", [](TensorView& t) { t.stride[t.ndim - 1] = 2; });
  const bool ints = v.dtype == DType::i32;
  add("wrong dtype", [ints, reference_tensor](TensorView& t) {
    t.dtype = ints ? DType::f32 : reference_tensor ? DType::i32 : (t.dtype == DType::f16 ? DType::bf16 : DType::f16);
  });
  add("on cuda:0", [](TensorView& t) { t.device = Device{DeviceType::cuda, 0}; });
  add("on cuda:3", [](TensorView& t) { t.device = Device{DeviceType::cuda, 3}; });
  add("wrong shape", f.bad_shape);
}

// Every written buffer aliased with every other buffer of the call, written buffers mapping two
// elements to one address, and the caller's workspace over each buffer. A buffer moved onto a
// smaller one may reach its neighbours too, and the error may name one of those: it must name the
// written buffer (or the workspace).
template <class Args>
void add_alias_cases(std::vector<BadCase>& out, const std::string& fn, const std::function<Args()>& make,
                     const std::function<void(const Args&)>& call, const std::vector<Field<Args>>& written,
                     const std::vector<Field<Args>>& all) {
  for (const auto& w : written) {
    for (const auto& o : all) {
      if (o.name == std::string(w.name)) continue;
      out.push_back({fn + " " + w.name + " aliases " + o.name, [make, call, wg = w.get, og = o.get] {
                       Args a = make();
                       wg(a).data = og(a).data;
                       call(a);
                     },
                     {w.name}});
    }
    const TensorView v = w.of(make);
    int d0 = 0;
    while (d0 + 1 < v.ndim && v.shape[d0] <= 1) ++d0;
    out.push_back({fn + " " + w.name + " with stride 0", [make, call, wg = w.get, d0] {
                     Args a = make();
                     wg(a).stride[d0] = 0;
                     call(a);
                   },
                   {w.name}});
    out.push_back({fn + " " + w.name + " strides interleaved", [make, call, wg = w.get] {
                     Args a = make();
                     TensorView& t = wg(a);
                     for (int d = 0; d + 1 < t.ndim; ++d) t.stride[d] = 1;
                     call(a);
                   },
                   {w.name}});
  }
  for (const auto& o : all)
    out.push_back({fn + " options.workspace over " + o.name, [make, call, og = o.get] {
                     Args a = make();
                     a.options.workspace = static_cast<char*>(og(a).data) + 4;
                     a.options.workspace_bytes = 64;
                     call(a);
                   },
                   {"options.workspace"}});
}

}  // namespace tileattn::test
