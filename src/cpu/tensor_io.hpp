// Scalar element access and sequence geometry for CPU code. The vector paths load whole rows with
// Highway instead; these serve the reference, setup code and the odd element.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/half.hpp"
#include "core/problem.hpp"

namespace tileattn::cpu {

inline float load_f32(const TensorView& t, std::int64_t off) {
  const char* p = static_cast<const char*>(t.data);
  std::uint16_t h;
  switch (t.dtype) {
    case DType::f16: std::memcpy(&h, p + off * 2, 2); return f16_to_f32(h);
    case DType::bf16: std::memcpy(&h, p + off * 2, 2); return bf16_to_f32(h);
    case DType::i32: return static_cast<float>(reinterpret_cast<const std::int32_t*>(p)[off]);
    default: return reinterpret_cast<const float*>(p)[off];
  }
}

inline void store_f32(const TensorView& t, std::int64_t off, float v) {
  char* p = static_cast<char*>(t.data);
  std::uint16_t h;
  switch (t.dtype) {
    case DType::f16: h = f32_to_f16(v); std::memcpy(p + off * 2, &h, 2); return;
    case DType::bf16: h = f32_to_bf16(v); std::memcpy(p + off * 2, &h, 2); return;
    case DType::i32: reinterpret_cast<std::int32_t*>(p)[off] = static_cast<std::int32_t>(v); return;
    default: reinterpret_cast<float*>(p)[off] = v; return;
  }
}

inline std::int32_t load_i32(const TensorView& t, std::int64_t i) {
  return t.ptr<const std::int32_t>()[i * t.stride[0]];
}

// Rows of one sequence: where its query and key rows start in the (possibly packed) tensors.
struct Seq {
  std::int64_t q0 = 0, k0 = 0;  // first row (varlen: packed index; batched: 0)
  int sq = 0, sk = 0;
};

inline Seq sequence(const Problem& p, const TensorView& cu_q, const TensorView& cu_k, int b) {
  if (!p.varlen) return Seq{0, 0, p.seqlen_q, p.seqlen_k};
  const std::int64_t q0 = load_i32(cu_q, b), k0 = load_i32(cu_k, b);
  return Seq{q0, k0, static_cast<int>(load_i32(cu_q, b + 1) - q0),
             static_cast<int>(load_i32(cu_k, b + 1) - k0)};
}

// Element offset of [b, row, h, c] (batched) or [row, h, c] (varlen; row already packed).
inline std::int64_t elem(const TensorView& t, bool varlen, int b, std::int64_t row, int h, int c = 0) {
  return varlen ? row * t.stride[0] + h * t.stride[1] + c
                : b * t.stride[0] + row * t.stride[1] + h * t.stride[2] + c;
}

// Offset of lse[b, h, row] (batched) or lse[h, row] (varlen).
inline std::int64_t lse_elem(const TensorView& t, bool varlen, int b, std::int64_t row, int h) {
  return varlen ? h * t.stride[0] + row * t.stride[1]
                : b * t.stride[0] + h * t.stride[1] + row * t.stride[2];
}

// Query head h of sequence b: its view of a block mask's dense element mask (m; dims 0 and 1 may be
// broadcast) into the variant, where the call has one.
inline void set_dense_mask(const Problem& p, const TensorView& m, int b, int h, Variant& v) {
  if (!p.dense_mask) return;
  v.dense = m.ptr<const unsigned char>() + (m.shape[0] == 1 ? 0 : b * m.stride[0]) + (m.shape[1] == 1 ? 0 : h * m.stride[1]);
  v.dense_row = m.stride[2];
  v.dense_col = m.stride[3];
}

// Sequence b's prefix-LM length into its variant, where the call gives one per sequence.
inline void set_prefix(const Problem& p, const TensorView& lens, int b, Variant& v) {
  if (p.prefix_per_seq) v.prefix = load_i32(lens, b);
}

inline float alibi_slope(const Problem& p, const TensorView& slopes, int b, int h) {
  if (!p.has_alibi) return 0.f;
  const float* s = slopes.ptr<const float>();
  return p.alibi_per_batch ? s[b * slopes.stride[0] + h * slopes.stride[1]] : s[h * slopes.stride[0]];
}

}  // namespace tileattn::cpu
