// A GoogleTest fixture that draws a fresh seed per test and prints it when the test fails, so a
// failing random input can be replayed (set TILEATTN_TEST_SEED to force a seed).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <random>
#include <string>

#include "support/host_tensor.hpp"

namespace tileattn::test {

class SeededTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* forced = std::getenv("TILEATTN_TEST_SEED");
    seed_ = forced ? std::stoull(forced) : fresh_seed();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "[ seed ] TILEATTN_TEST_SEED=" << seed_ << "\n";
  }
  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace tileattn::test
