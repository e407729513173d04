// The one exception type the library throws for bad input and runtime failures.
#pragma once

#include <stdexcept>
#include <string>

namespace tileattn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tileattn
