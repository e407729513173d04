// The core's one way to reject a call: a tileattn::Error whose message names the entry point and
// then the argument and values.
#pragma once

#include <sstream>

#include "tileattn/error.hpp"

namespace tileattn {

template <class... Ts>
[[noreturn]] void fail(const char* fn, const Ts&... parts) {
  std::ostringstream os;
  os << "tileattn::" << fn << ": ";
  (os << ... << parts);
  throw Error(os.str());
}

}  // namespace tileattn
