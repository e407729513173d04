// Philox 4x32-10 (Salmon et al., SC'11) and the dropout mask drawn from it.
// The keep bit of element (b, h, i, j) depends only on (seed, offset, b, h, i, j), so every backend,
// forward and backward, draws the same mask without storing it.
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace tileattn {

struct Philox4 {
  std::uint32_t v[4];
};

TA_HD Philox4 philox4x32_10(Philox4 ctr, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr std::uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    std::uint64_t p0 = static_cast<std::uint64_t>(M0) * ctr.v[0];
    std::uint64_t p1 = static_cast<std::uint64_t>(M1) * ctr.v[2];
    std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += W0;
    k1 += W1;
  }
  return ctr;
}

// The dropout generator of one call. Element (b, h, i, j): b = batch (or varlen sequence) index,
// h = query head, i = query row, j = key column, all within the sequence.
//   counter = (j / 4, i, b * heads_q + h, low 32 bits of offset)
//   key     = (low 32 bits of seed, high 32 bits of seed + high 32 bits of offset)
// Word j % 4 of the output is compared with p * 2^32: the element is kept iff it is not below.
struct Dropout {
  std::uint32_t k0 = 0, k1 = 0, offset_lo = 0;
  std::uint32_t threshold = 0;  // floor(p * 2^32)
  float keep_scale = 1.f;       // 1 / (1 - p)

  Dropout() = default;
  TA_HD Dropout(float p, std::uint64_t seed, std::uint64_t offset)
      : k0(static_cast<std::uint32_t>(seed)),
        k1(static_cast<std::uint32_t>(seed >> 32) + static_cast<std::uint32_t>(offset >> 32)),
        offset_lo(static_cast<std::uint32_t>(offset)),
        threshold(static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0)),
        keep_scale(1.f / (1.f - p)) {}

  // Four consecutive columns j4*4 .. j4*4+3 of row i; bit c set = column j4*4+c kept.
  TA_HD unsigned keep4(std::uint32_t bh, std::uint32_t i, std::uint32_t j4) const {
    Philox4 r = philox4x32_10(Philox4{{j4, i, bh, offset_lo}}, k0, k1);
    return (r.v[0] >= threshold ? 1u : 0u) | (r.v[1] >= threshold ? 2u : 0u) |
           (r.v[2] >= threshold ? 4u : 0u) | (r.v[3] >= threshold ? 8u : 0u);
  }
  TA_HD bool keep(std::uint32_t bh, std::uint32_t i, std::uint32_t j) const {
    return (keep4(bh, i, j >> 2) >> (j & 3)) & 1u;
  }
};

}  // namespace tileattn
