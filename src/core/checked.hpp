// Overflow-checked integer arithmetic for validation: every element count, byte extent, offset and
// capacity of a call is computed through these, so a hostile shape or stride is reported instead
// of wrapping around into a small, plausible number.
#pragma once

#include <cstdint>
#include <optional>

namespace tileattn {

inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

}  // namespace tileattn
