// The core's one way to reject a call: a tileattn::Error whose message names the entry point and
// then the argument and values; and the shape strings those messages quote.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <sstream>
#include <string>

#include "tileattn/error.hpp"
#include "tileattn/tensor.hpp"

namespace tileattn {

template <class... Ts>
[[noreturn]] void fail(const char* fn, const Ts&... parts) {
  std::ostringstream os;
  os << "tileattn::" << fn << ": ";
  (os << ... << parts);
  throw Error(os.str());
}

// The rank is clamped before any dim is read, so a bad rank never reads past the array.
inline std::string dims_str(const TensorView& t, const std::array<std::int64_t, kMaxDims>& dims) {
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < std::clamp(t.ndim, 0, kMaxDims); ++d) os << (d ? ", " : "") << dims[d];
  os << "]";
  return os.str();
}
inline std::string shape_str(const TensorView& t) { return dims_str(t, t.shape); }

}  // namespace tileattn
