// Asserts that a call is rejected by validation: it throws tileattn::Error whose message contains
// every expected fragment (the argument's name, the offending value), and it wrote nothing to the
// given outputs (compared byte for byte with their poisoned contents).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "support/host_tensor.hpp"
#include "tileattn/error.hpp"

namespace tileattn::test {

inline std::vector<unsigned char> bytes_of(HostTensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return std::vector<unsigned char>(p, p + t.numel() * dtype_size(t.dtype()));
}

inline void expect_rejected(const std::function<void()>& call, const std::vector<std::string>& fragments,
                            const std::vector<HostTensor*>& outputs) {
  std::vector<std::vector<unsigned char>> before;
  for (HostTensor* t : outputs) before.push_back(bytes_of(*t));
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error mentioning '" << fragments.front() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-tileattn exception: " << e.what();
  }
  for (std::size_t i = 0; i < outputs.size(); ++i)
    EXPECT_TRUE(bytes_of(*outputs[i]) == before[i]) << "output " << i << " was written";
}

}  // namespace tileattn::test
