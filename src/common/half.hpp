// Scalar fp16/bf16 <-> fp32 conversions (round to nearest even), for host code that is not on a
// vector path: the reference backend, tests, tools.
#pragma once

#include <cstdint>
#include <cstring>

namespace tileattn {

inline float bf16_to_f32(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while (!(man & 0x400u));
    u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;         // rounds to inf
  if (a < 0x38800000u) {                               // subnormal or zero in fp16
    if (a < 0x33000000u) return sign;                  // below half the smallest subnormal
    // value = m * 2^(e - 150); in units of the fp16 subnormal step 2^-24 that is m >> (126 - e).
    const std::uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    const int s = 126 - static_cast<int>(e);
    std::uint32_t r = m >> s;
    const std::uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<std::uint16_t>(r);
  }
  std::uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<std::uint16_t>(r >> 13);
}

}  // namespace tileattn
