// Pins the dropout generator to the published Philox4x32-10 known answers (Random123's kat
// vectors), so every backend that shares it draws the same, documented stream.
#include <gtest/gtest.h>

#include "common/philox.hpp"

namespace tileattn {
namespace {

void expect_kat(Philox4 ctr, std::uint32_t k0, std::uint32_t k1, Philox4 want) {
  const Philox4 got = philox4x32_10(ctr, k0, k1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], want.v[i]) << "word " << i;
}

TEST(Philox, KnownAnswers) {
  expect_kat({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_kat({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
             {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
             {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST(Philox, DropoutKeepRateMatchesP) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const Dropout d(p, 1234567, 89);
    int kept = 0;
    const int n = 64 * 1024;
    for (int j = 0; j < n; ++j) kept += d.keep(3, static_cast<std::uint32_t>(j / 256), static_cast<std::uint32_t>(j % 256));
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01) << "p = " << p;
  }
}

TEST(Philox, MaskDependsOnEveryKeyPart) {
  const Dropout a(0.5f, 1, 0), seed(0.5f, 2, 0), off(0.5f, 1, 1), off_hi(0.5f, 1, 1ull << 32);
  auto bits = [](const Dropout& d, std::uint32_t bh) {
    std::uint64_t m = 0;
    for (std::uint32_t j = 0; j < 64; ++j) m |= static_cast<std::uint64_t>(d.keep(bh, 7, j)) << j;
    return m;
  };
  EXPECT_NE(bits(a, 0), bits(seed, 0));
  EXPECT_NE(bits(a, 0), bits(off, 0));
  EXPECT_NE(bits(a, 0), bits(off_hi, 0));
  EXPECT_NE(bits(a, 0), bits(a, 1));
}

}  // namespace
}  // namespace tileattn
