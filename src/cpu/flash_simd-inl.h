// Vector building blocks of the CPU flash kernels, compiled once per SIMD target (Highway's
// foreach_target re-includes this file): the register-blocked tile product, exp2, row loads with
// fp16/bf16 widened in registers, the score pipeline of a tile, and the online-softmax attention of
// one query tile that the forward and the decode share.
//
// Tiles keep the query row as the vector lane: scores are stored transposed, S^T [keys][Br], so
// row maxima, sums, rescales and per-row mask bounds are plain vertical vector ops with no
// horizontal reductions.

#if defined(TILEATTN_FLASH_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEATTN_FLASH_SIMD_INL_H_
#undef TILEATTN_FLASH_SIMD_INL_H_
#else
#define TILEATTN_FLASH_SIMD_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/half.hpp"
#include "common/variant.hpp"
#include "cpu/flash_common.hpp"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tileattn::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using flash::kBc;
using flash::kBr;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kLn2 = 0.6931471805599453f;

// Rows of the micro-kernel: the accumulators are kMR x 2 vectors, which with the two B vectors
// and the broadcast fill the register file (16 registers below AVX-512, 32 with it).
#if HWY_TARGET <= HWY_AVX3
inline constexpr int kMR = 12;
#else
inline constexpr int kMR = 6;
#endif

// ---------------------------------------------------------------------------------------------
// C[M][cols] (+)= A[M][K] B[K][cols]; cols a multiple of the vector width, A read as scalars at
// A[m * sm + k * sk] (so either operand order of a transposed tile works), B and C row-major.
// With colscale, C is first multiplied column-wise by it (the online-softmax rescale).

template <int MR, int NV>
HWY_INLINE void Micro(const float* HWY_RESTRICT A, std::ptrdiff_t sm, std::ptrdiff_t sk,
                      const float* HWY_RESTRICT B, std::ptrdiff_t ldb, float* HWY_RESTRICT C,
                      std::ptrdiff_t ldc, int K, const float* HWY_RESTRICT colscale, bool acc) {
  const DF d;
  constexpr std::size_t N = hn::MaxLanes(DF());
  VF c[MR][NV];
  if (acc) {
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < NV; ++v) c[m][v] = hn::LoadU(d, C + m * ldc + v * N);
    if (colscale) {
      for (int v = 0; v < NV; ++v) {
        const VF s = hn::LoadU(d, colscale + v * N);
        for (int m = 0; m < MR; ++m) c[m][v] = hn::Mul(c[m][v], s);
      }
    }
  } else {
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < NV; ++v) c[m][v] = hn::Zero(d);
  }
  for (int k = 0; k < K; ++k) {
    VF b[NV];
    for (int v = 0; v < NV; ++v) b[v] = hn::LoadU(d, B + k * ldb + v * N);
    const float* a = A + k * sk;
    for (int m = 0; m < MR; ++m) {
      const VF am = hn::Set(d, a[m * sm]);
      for (int v = 0; v < NV; ++v) c[m][v] = hn::MulAdd(am, b[v], c[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) hn::StoreU(c[m][v], d, C + m * ldc + v * N);
}

template <int MR, int NV>
HWY_INLINE void MicroTail(int rows, const float* A, std::ptrdiff_t sm, std::ptrdiff_t sk, const float* B,
                          std::ptrdiff_t ldb, float* C, std::ptrdiff_t ldc, int K, const float* colscale,
                          bool acc) {
  if constexpr (MR > 0) {
    if (rows == MR) return Micro<MR, NV>(A, sm, sk, B, ldb, C, ldc, K, colscale, acc);
    MicroTail<MR - 1, NV>(rows, A, sm, sk, B, ldb, C, ldc, K, colscale, acc);
  }
}

template <int NV>
HWY_INLINE void GemmPanel(const float* A, std::ptrdiff_t sm, std::ptrdiff_t sk, const float* B,
                          std::ptrdiff_t ldb, float* C, std::ptrdiff_t ldc, int M, int K,
                          const float* colscale, bool acc) {
  int m = 0;
  for (; m + kMR <= M; m += kMR)
    Micro<kMR, NV>(A + m * sm, sm, sk, B, ldb, C + m * ldc, ldc, K, colscale, acc);
  if (m < M) MicroTail<kMR - 1, NV>(M - m, A + m * sm, sm, sk, B, ldb, C + m * ldc, ldc, K, colscale, acc);
}

HWY_INLINE void Gemm(const float* A, std::ptrdiff_t sm, std::ptrdiff_t sk, const float* B, std::ptrdiff_t ldb,
                     float* C, std::ptrdiff_t ldc, int M, int cols, int K, const float* colscale = nullptr,
                     bool acc = true) {
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  if (M <= 0) return;
  if (K <= 0 && acc && !colscale) return;
  int c = 0;
  for (; c + 2 * N <= cols; c += 2 * N)
    GemmPanel<2>(A, sm, sk, B + c, ldb, C + c, ldc, M, K, colscale ? colscale + c : nullptr, acc);
  for (; c < cols; c += N)
    GemmPanel<1>(A, sm, sk, B + c, ldb, C + c, ldc, M, K, colscale ? colscale + c : nullptr, acc);
}

// ---------------------------------------------------------------------------------------------
// 2^x for x <= 127, 0 below -126.5 (so exp2(-inf) = 0), NaN for NaN (a NaN score reaches the
// row's sum and output, never a silent 0): round-to-nearest range reduction, a
// polynomial for 2^f on [-0.5, 0.5] fitted to relative error, and the factor 2^n. Degree 6 errs by
// 4.4e-9 (below fp32 rounding); degree 3 by 1.0e-4, for probabilities that are rounded to bf16
// next (2^-9) and three multiply-adds cheaper. Degree 3's constant term is held at 1, so integer x
// (a row's own maximum among them) come out exact: a free fit errs by 7.5e-5 there, which a row
// that sees one key carries whole into its LSE.
template <int kDegree = 6>
HWY_INLINE VF Exp2(DF d, VF x) {
  static_assert(kDegree == 6 || kDegree == 3);
#if HWY_TARGET <= HWY_AVX3
  // No clamp: n <= -127 (x = -inf included) is zeroed by the scalef's mask below; NaN passes it.
  const VF n{_mm512_roundscale_ps(x.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
#else
  // The 1.5 * 2^23 shifter rounds to nearest; its sum t also carries n into the exponent below.
  const VF shifter = hn::Set(d, 12582912.f);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  // x second: x86's max returns its second operand when either is NaN, so NaN stays NaN.
  x = hn::Max(hn::Set(d, -127.f), x);
#else
  // Elsewhere Max may drop a NaN operand: keep it explicitly.
  x = hn::IfThenElse(hn::IsNaN(x), x, hn::Max(x, hn::Set(d, -127.f)));
#endif
  const VF t = hn::Add(x, shifter);
  const VF n = hn::Sub(t, shifter);
#endif
  const VF f = hn::Sub(x, n);
  VF p;
  if constexpr (kDegree == 6) {
    p = hn::Set(d, 1.5332507706943978e-04f);
    p = hn::MulAdd(p, f, hn::Set(d, 1.3394701155522834e-03f));
    p = hn::MulAdd(p, f, hn::Set(d, 9.618491006078951e-03f));
    p = hn::MulAdd(p, f, hn::Set(d, 5.550342284395828e-02f));
    p = hn::MulAdd(p, f, hn::Set(d, 2.402264736446933e-01f));
    p = hn::MulAdd(p, f, hn::Set(d, 6.931471992071403e-01f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.f));
  } else {
    p = hn::Set(d, 5.500869e-02f);
    p = hn::MulAdd(p, f, hn::Set(d, 2.4221063e-01f));
    p = hn::MulAdd(p, f, hn::Set(d, 6.9328292e-01f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.f));
  }
#if HWY_TARGET <= HWY_AVX3
  // One scalef instead of building 2^n and multiplying; n = -127 is zeroed by the mask rather than
  // computed, since a denormal result would take a microcode assist. Unordered compare: a NaN n
  // keeps its lane, and scalef returns NaN.
  return VF{_mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(n.raw, _mm512_set1_ps(-127.f), _CMP_NLE_UQ), p.raw, n.raw)};
#else
  // The shifter's own bits vanish below bit 9, so this is (n + 127) << 23; n = -127 gives a zero
  // exponent field, i.e. a factor of exactly 0.
  const hn::RebindToSigned<DF> di;
  const auto e = hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(d, e));
#endif
}

// ---------------------------------------------------------------------------------------------
// Rows of the input dtype widened to fp32 in registers. Head dims are multiples of 8, so the tail
// after whole vectors is whole 8-lane (or narrower) vectors.

template <class D, class T>
HWY_INLINE hn::Vec<D> LoadF32(D d, const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(d, p);
  } else {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<T, D>(), p));
  }
}

template <class T>
HWY_INLINE void LoadRow(const T* HWY_RESTRICT src, float* HWY_RESTRICT dst, int n) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  int c = 0;
  for (; c + N <= n; c += N) hn::StoreU(LoadF32(d, src + c), d, dst + c);
  const hn::CappedTag<float, 8> d8;
  constexpr int N8 = static_cast<int>(hn::MaxLanes(hn::CappedTag<float, 8>()));
  for (; c < n; c += N8) hn::StoreU(LoadF32(d8, src + c), d8, dst + c);
}

// Outputs are O(N) next to the O(N^2) work; they round to nearest even through the scalar
// conversions every other path of the library uses.
template <class T>
HWY_INLINE void StoreRow(const float* src, T* dst, int n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
  } else if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
    auto* u = reinterpret_cast<std::uint16_t*>(dst);
    for (int c = 0; c < n; ++c) u[c] = f32_to_bf16(src[c]);
  } else {
    auto* u = reinterpret_cast<std::uint16_t*>(dst);
    for (int c = 0; c < n; ++c) u[c] = f32_to_f16(src[c]);
  }
}

// Loads rows [j0, j0 + n) (row(j) gives each one's address) into a dense fp32 tile [n][ld];
// columns past `width` up to ld are zeroed.
template <class T, class RowFn>
HWY_INLINE void LoadTile(RowFn row, int j0, int n, int width, int ld, float* tile) {
  for (int j = 0; j < n; ++j) {
    LoadRow(row(j0 + j), tile + j * ld, width);
    for (int c = width; c < ld; ++c) tile[j * ld + c] = 0.f;
  }
}

// ---------------------------------------------------------------------------------------------
// Per-row facts of one query tile (lane r = row r of the tile). Padding rows have an empty key
// range, so every key is masked for them.
struct TileRows {
  int n = 0;                      // valid rows
  int w = kBr;                    // lanes the score and softmax passes cover (finish's width)
  float kb[kBr], ke[kBr];         // visible keys [kb, ke) as floats (exact below 2^24)
  float pos[kBr];                 // i + the mask's alibi_diag: the ALiBi distance origin
  float slope2[kBr];              // ALiBi slope in log2 units
  std::uint32_t bh[kBr], i[kBr];  // dropout coordinates
  int key_lo = 0, key_hi = 0;     // union of the rows' key ranges
  int kb_max = 0, ke_min = 0;     // intersection: tiles inside it need no per-element mask

  void reset() {
    any_ = false;
    key_lo = key_hi = kb_max = 0;
    ke_min = std::numeric_limits<int>::max();
  }
  // Row r is query row `row` of a sequence with variant v; empty rows never widen the key range.
  void set(int r, const Variant& v, int row, float slope, std::uint32_t bh_r) {
    set(r, v, row, slope, bh_r, v.key_begin(row), v.key_end(row));
  }
  // The same with the visible keys [b, e) given (a block-sparse backward restricts them).
  void set(int r, const Variant& v, int row, float slope, std::uint32_t bh_r, int b, int e) {
    kb[r] = static_cast<float>(b);
    ke[r] = static_cast<float>(e);
    pos[r] = static_cast<float>(row + v.mask.alibi_diag);
    slope2[r] = slope * kLog2e;
    bh[r] = bh_r;
    i[r] = static_cast<std::uint32_t>(row);
    if (e > b) {
      key_lo = any_ ? std::min(key_lo, b) : b;
      key_hi = any_ ? std::max(key_hi, e) : e;
      any_ = true;
    }
    kb_max = std::max(kb_max, b);
    ke_min = std::min(ke_min, e);
  }
  // Marks rows [n, kBr) as padding; `width` (a whole number of 16-lane vectors, >= rows) bounds the
  // lanes later passes compute, where the caller's products cover no more.
  void finish(int rows, int width = kBr) {
    n = rows;
    w = width;
    for (int r = rows; r < kBr; ++r) {
      kb[r] = ke[r] = pos[r] = slope2[r] = 0.f;
      bh[r] = i[r] = 0;
    }
  }
  // Whether keys [j0, j1) are visible to every row, padding aside.
  bool full(int j0, int j1) const { return j0 >= kb_max && j1 <= ke_min; }

 private:
  bool any_ = false;
};

// The score pipeline of a tile of transposed raw products S^T [nk][kBr] (keys j0..j0+nk):
// scale, softcap, ALiBi, mask, in log2 units (score * log2 e), in place. With softcap and `t`,
// the tanh values are kept for the backward's derivative. `prescaled`: the products already carry
// scale * log2 e (folded into Q; never with softcap).
template <bool kSoftcap, bool kAlibi, bool kMasked>
HWY_INLINE void ScoreTileT(const ScoreMod& sm, const TileRows& rows, float* S, float* t, int j0, int nk,
                           bool prescaled) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  const VF to_log2 = hn::Set(d, prescaled ? 1.f : sm.scale * kLog2e);
  const VF inner = hn::Set(d, kSoftcap ? sm.scale / sm.softcap : 0.f);
  const VF outer = hn::Set(d, kSoftcap ? sm.softcap * kLog2e : 0.f);
  const VF neg_inf = hn::Set(d, -kInf);
  for (int v = 0; v < rows.w; v += N) {
    const VF kb = hn::LoadU(d, rows.kb + v), ke = hn::LoadU(d, rows.ke + v);
    const VF pos = hn::LoadU(d, rows.pos + v), slope = hn::LoadU(d, rows.slope2 + v);
    for (int jj = 0; jj < nk; ++jj) {
      const VF jf = hn::Set(d, static_cast<float>(j0 + jj));
      VF x = hn::LoadU(d, S + jj * kBr + v);
      if constexpr (kSoftcap) {
        const VF th = hn::Tanh(d, hn::Mul(x, inner));
        if (t) hn::StoreU(th, d, t + jj * kBr + v);
        x = hn::Mul(th, outer);
      } else {
        x = hn::Mul(x, to_log2);
      }
      if constexpr (kAlibi) x = hn::NegMulAdd(slope, hn::Abs(hn::Sub(pos, jf)), x);
      if constexpr (kMasked) x = hn::IfThenElse(hn::And(hn::Ge(jf, kb), hn::Lt(jf, ke)), x, neg_inf);
      hn::StoreU(x, d, S + jj * kBr + v);
    }
  }
}

// The variant's score transform and mask, vectorized (one copy for every CPU kernel). ALiBi slopes
// come per row from `rows` (a GQA-packed decode tile mixes heads); var.alibi says on. A prescaled
// tile that needs no ALiBi and no mask is already done.
HWY_INLINE void ScoreTile(const Variant& var, const TileRows& rows, float* S, float* t, int j0, int nk, bool masked,
                          bool prescaled = false) {
  const ScoreMod& sm = var.score;
  const bool alibi = var.alibi;
  const bool cap = sm.softcap > 0.f;
  const bool ps = prescaled;
  if (cap) {
    if (alibi) return masked ? ScoreTileT<true, true, true>(sm, rows, S, t, j0, nk, ps) : ScoreTileT<true, true, false>(sm, rows, S, t, j0, nk, ps);
    return masked ? ScoreTileT<true, false, true>(sm, rows, S, t, j0, nk, ps) : ScoreTileT<true, false, false>(sm, rows, S, t, j0, nk, ps);
  }
  if (alibi) return masked ? ScoreTileT<false, true, true>(sm, rows, S, t, j0, nk, ps) : ScoreTileT<false, true, false>(sm, rows, S, t, j0, nk, ps);
  if (masked) return ScoreTileT<false, false, true>(sm, rows, S, t, j0, nk, ps);
  if (!ps) ScoreTileT<false, false, false>(sm, rows, S, t, j0, nk, ps);
}

// The factor a query row may carry into the product so that S arrives in log2 units: scale *
// log2 e, unless a softcap needs the raw product.
inline float query_prescale(const ScoreMod& sm) { return sm.softcap > 0.f ? 1.f : sm.scale * kLog2e; }

// Zeroes the dropped elements of a probability tile P^T [nk][kBr] (keys from j0): the variant's
// keep bit, four columns per Philox draw.
HWY_INLINE void DropTile(const Variant& var, const TileRows& rows, float* P, int j0, int nk) {
  const Dropout& drop = var.drop;
  for (int r = 0; r < rows.n; ++r) {
    unsigned bits = 0;
    for (int jj = 0; jj < nk; ++jj) {
      const int j = j0 + jj;
      if (jj == 0 || (j & 3) == 0) bits = drop.keep4(rows.bh[r], rows.i[r], static_cast<std::uint32_t>(j) >> 2);
      if (!((bits >> (j & 3)) & 1u)) P[jj * kBr + r] = 0.f;
    }
  }
}

// Masks the elements of a score tile S^T [nk][kBr] (keys from j0) that the variant's per-element
// tests hide: query row and key in different documents (document ids), or a zero in the dense mask.
// A scalar pass, on tiles that need it only (Variant::element_tests, outside fully visible blocks).
HWY_INLINE void ElementTile(const Variant& var, const TileRows& rows, float* S, int j0, int nk) {
  if (var.document_tests())
    for (int jj = 0; jj < nk; ++jj) {
      const int dk = var.doc_k[(j0 + jj) * var.doc_k_stride];
      for (int r = 0; r < rows.n; ++r)
        if (var.doc_q[static_cast<long long>(rows.i[r]) * var.doc_q_stride] != dk) S[jj * kBr + r] = -kInf;
    }
  if (var.dense_mask())
    for (int r = 0; r < rows.n; ++r)
      for (int jj = 0; jj < nk; ++jj)
        if (!var.dense_visible(rows.i[r], j0 + jj)) S[jj * kBr + r] = -kInf;
}

// ---------------------------------------------------------------------------------------------
// The online softmax of a query tile, kept per row (lane): m the running max in log2 units, l the
// running sum.

HWY_INLINE void SoftmaxInit(float* m, float* l) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  for (int v = 0; v < kBr; v += N) {
    hn::StoreU(hn::Set(d, -kInf), d, m + v);
    hn::StoreU(hn::Zero(d), d, l + v);
  }
}

// One key tile: turns the scores S^T [nk][kBr], in log2 units once multiplied by `scale` (> 0;
// folding a plain scale in here saves a pass over the tile), into probabilities against the new
// running max, and writes alpha, the factor each row's output so far must be rescaled by. With
// slack > 0 a row's max moves only when the tile's exceeds it by more than that: the
// probabilities may then reach 2^slack, and alpha is 1 for most rows once the max has settled.
// kExpDegree 3 where the probabilities are rounded to bf16 next (see Exp2). Lanes [0, cols) only.
template <int kExpDegree = 6>
HWY_INLINE void SoftmaxStep(float* S, int nk, float* m, float* l, float* alpha, float scale = 1.f,
                            float slack = 0.f, int cols = kBr) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  const VF c = hn::Set(d, scale);
  for (int v = 0; v < cols; v += N) {
    VF mt = hn::Set(d, -kInf);
    for (int jj = 0; jj < nk; ++jj) mt = hn::Max(mt, hn::LoadU(d, S + jj * kBr + v));
    const VF m_old = hn::LoadU(d, m + v);
    mt = hn::Mul(mt, c);
    const VF m_new = hn::IfThenElse(hn::Gt(mt, hn::Add(m_old, hn::Set(d, slack))), hn::Max(m_old, mt), m_old);
    // A row with nothing visible yet keeps max -inf; subtracting 0 keeps its terms at 0.
    const VF m_safe = hn::IfThenZeroElse(hn::Eq(m_new, hn::Set(d, -kInf)), m_new);
    VF sum = hn::Zero(d);
    for (int jj = 0; jj < nk; ++jj) {
      const VF pj = Exp2<kExpDegree>(d, hn::MulSub(hn::LoadU(d, S + jj * kBr + v), c, m_safe));
      hn::StoreU(pj, d, S + jj * kBr + v);
      sum = hn::Add(sum, pj);
    }
    const VF a = Exp2(d, hn::Sub(m_old, m_safe));
    hn::StoreU(a, d, alpha + v);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, l + v), a, sum), d, l + v);
    hn::StoreU(m_new, d, m + v);
  }
}

// A query tile's attention: head dims and the sequence's variant.
struct AttendShape {
  int d = 0, dv = 0;
  Variant var;
};

// The keys a query tile visits, as calls visit(j0, j1, full) over disjoint ranges: `full` when
// every element of the range is visible (no element mask; a block-sparse mask's full blocks),
// otherwise tiles of the range are masked where they cut a row's key range.
// DenseKeys: one range, keys [lo, hi) clipped to the rows' key range.
struct DenseKeys {
  int lo = 0, hi = 0;
  template <class Visit>
  HWY_INLINE void operator()(const TileRows& rows, Visit visit) const {
    visit(std::max(lo, rows.key_lo), std::min(hi, rows.key_hi), false);
  }
};

// The end of a query tile: emit(r, o, lse) per valid row r with o its normalized output (fp32, dv
// values; element c of row r at O[r * rs + c * cs]) and lse in natural log; rows with no visible
// key (or no key tile at all: `none`) get o = 0 and lse = -inf. A NaN sum (a NaN or Inf input
// reached the row) gives NaN o and lse: propagated, as PyTorch does, never taken for "no key".
template <class Emit>
HWY_INLINE void EmitRows(const AttendShape& sh, const TileRows& rows, bool none, const float* m, const float* l,
                         const float* O, std::ptrdiff_t rs, std::ptrdiff_t cs, float* row, Emit emit) {
  const float keep_scale = sh.var.dropout ? sh.var.drop.keep_scale : 1.f;
  for (int r = 0; r < rows.n; ++r) {
    if (none || l[r] == 0.f) {
      for (int c = 0; c < sh.dv; ++c) row[c] = 0.f;
      emit(r, row, -kInf);
      continue;
    }
    const float inv = keep_scale / l[r];
    for (int c = 0; c < sh.dv; ++c) row[c] = O[r * rs + c * cs] * inv;
    emit(r, row, (m[r] + std::log2(l[r])) * kLn2);
  }
}

// ---------------------------------------------------------------------------------------------
// Online-softmax attention of one query tile over the key ranges `keys` gives (DenseKeys, or a
// block-sparse mask's blocks), on the rows.w lanes its rows take; qrow(r, dst) writes query row r
// as fp32; krow(j) and vrow(j) give
// key row j. With T = float and ldk (ldv) > 0, key rows lie ldk floats apart and are read in
// place; otherwise each key tile is copied (widened) into a dense one first. S = Q K^T and O += P V
// per key tile, only tiles that cut a row's key range masked per element; the rows end in
// EmitRows.

// Floats of per-thread tiles AttendTile needs.
inline std::size_t attend_tile_floats(int d, int dv) {
  return static_cast<std::size_t>(d) * kBr + static_cast<std::size_t>(kBc) * d +
         static_cast<std::size_t>(kBc) * dv + static_cast<std::size_t>(kBc) * kBr +
         static_cast<std::size_t>(dv) * kBr + 3 * kBr + std::max(d, dv);
}

template <class T, class QRow, class KRow, class VRow, class Keys, class Emit>
HWY_INLINE void AttendTile(const AttendShape& sh, const TileRows& rows, QRow qrow, KRow krow, VRow vrow,
                           std::ptrdiff_t ldk, std::ptrdiff_t ldv, const Keys& keys, float* tiles, Emit emit) {
  const int D = sh.d, DV = sh.dv;
  float* QT = tiles;                  // [D][kBr]
  float* Kt = QT + D * kBr;           // [kBc][D]
  float* Vt = Kt + kBc * D;           // [kBc][DV]
  float* S = Vt + kBc * DV;           // [kBc][kBr]
  float* OT = S + kBc * kBr;          // [DV][kBr]
  float* m = OT + DV * kBr;           // [kBr] running max (log2 units)
  float* l = m + kBr;                 // [kBr] running sum
  float* alpha = l + kBr;             // [kBr] rescale of this step
  float* row = alpha + kBr;           // [max(D, DV)] one row

  // Q^T carrying the scale where it can, padding rows zero.
  const float qscale = query_prescale(sh.var.score);
  const bool prescaled = sh.var.score.softcap <= 0.f;
  for (int r = 0; r < kBr; ++r) {
    if (r < rows.n) {
      qrow(r, row);
      for (int c = 0; c < D; ++c) QT[c * kBr + r] = row[c] * qscale;
    } else {
      for (int c = 0; c < D; ++c) QT[c * kBr + r] = 0.f;
    }
  }
  SoftmaxInit(m, l);

  bool first = true;
  keys(rows, [&](int key_lo, int key_hi, bool full) {
    for (int j0 = key_lo; j0 < key_hi; j0 += kBc) {
      const int nk = std::min(kBc, key_hi - j0);
      const float* K = Kt;
      const float* V = Vt;
      std::ptrdiff_t kld = D, vld = DV;
      if constexpr (std::is_same_v<T, float>) {
        if (ldk > 0) K = krow(j0), kld = ldk;
        if (ldv > 0) V = vrow(j0), vld = ldv;
      }
      if (K == Kt) LoadTile<T>(krow, j0, nk, D, D, Kt);
      if (V == Vt) LoadTile<T>(vrow, j0, nk, DV, DV, Vt);
      Gemm(K, kld, 1, QT, kBr, S, kBr, nk, rows.w, D, nullptr, false);
      ScoreTile(sh.var, rows, S, nullptr, j0, nk, !full && !rows.full(j0, j0 + nk), prescaled);
      if (!full && sh.var.element_tests()) ElementTile(sh.var, rows, S, j0, nk);
      SoftmaxStep(S, nk, m, l, alpha, 1.f, 0.f, rows.w);
      if (sh.var.dropout) DropTile(sh.var, rows, S, j0, nk);
      Gemm(V, 1, vld, S, kBr, OT, kBr, DV, rows.w, nk, alpha, !first);
      first = false;
    }
  });

  EmitRows(sh, rows, first, m, l, OT, 1, kBr, row, emit);
}

}  // namespace tileattn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
