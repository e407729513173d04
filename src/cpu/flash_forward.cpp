// FlashAttention-2 forward on the CPU: one task per (sequence, query head, query tile), each
// streaming its keys through AttendTile. fp32 K and V are read in place; fp16/bf16 key tiles are
// widened into a per-thread tile, so nothing larger than a tile is ever allocated. Where the CPU
// has AMX, bf16 runs the tile products on it from the inputs as they are (AttendTileAmx).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_forward.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "core/backends.hpp"
#include "cpu/amx.hpp"
#include "cpu/flash_simd-inl.h"
#include "cpu/parallel.hpp"
#include "cpu/tensor_io.hpp"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tileattn::cpu::HWY_NAMESPACE {

// Keys per step of AttendTileAmx: twice kBc, so that each output tile the P V product loads
// accumulates over 128 keys, and the step's fixed work is shared by twice the keys (measured 3-10%
// faster than 64).
inline constexpr int kAmxKeys = 128;

// Floats of per-thread tiles AttendTileAmx needs (bf16 and fp32 pieces, each a multiple of 64 bytes).
inline std::size_t amx_tile_floats(int d, int dv) {
  const std::size_t dp = amx::pad32(d), dvp = amx::pad16(dv), kc = kAmxKeys;
  return dp * kBr / 2 + kc * dp / 2 + kBr * kc / 2 + kc * dvp / 2 + kc * kBr + kBr * dvp + 3 * kBr + dvp;
}

// O[r][:] *= alpha[r] for the valid rows whose running max moved (alpha != 1).
HWY_INLINE void RescaleRows(float* O, int dvp, int n, const float* alpha) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  for (int r = 0; r < n; ++r) {
    if (alpha[r] == 1.f) continue;
    const VF a = hn::Set(d, alpha[r]);
    for (int c = 0; c < dvp; c += N) hn::StoreU(hn::Mul(hn::LoadU(d, O + r * dvp + c), a), d, O + r * dvp + c);
  }
}

// AttendTile for bf16 with the tile products on AMX: the same scores, mask and online softmax, with
// S^T = K Q^T and O += P V multiplied from bf16 operands (K and V read where they lie, Q packed once
// per query tile, P rounded to bf16 as on the GPU) into fp32, over the rows' keys [key_lo, key_hi)
// (the mask keeps them inside the sequence). Query row r lies at q + r * qs, key row j at
// k + j * ks and v + j * vs (bytes).
template <class Emit>
void AttendTileAmx(const AttendShape& sh, const TileRows& rows, const char* q, std::ptrdiff_t qs, const char* k,
                   std::ptrdiff_t ks, const char* v, std::ptrdiff_t vs, float* tiles, Emit emit) {
  const int dp = amx::pad32(sh.d), dvp = amx::pad16(sh.dv);
  auto* qt = reinterpret_cast<std::uint32_t*>(tiles);                  // [dp / 2][kBr] pairs
  auto* stage = reinterpret_cast<std::uint16_t*>(qt + dp / 2 * kBr);  // [kAmxKeys][dp]
  std::uint16_t* pb = stage + kAmxKeys * dp;                           // [kBr][kAmxKeys]
  std::uint16_t* vv = pb + kBr * kAmxKeys;                             // [kAmxKeys / 2][2 dvp] pairs
  float* S = reinterpret_cast<float*>(vv + kAmxKeys * dvp);            // [kAmxKeys][kBr]
  float* O = S + kAmxKeys * kBr;                                       // [kBr][dvp]
  float* m = O + kBr * dvp;
  float* l = m + kBr;
  float* alpha = l + kBr;
  float* row = alpha + kBr;  // [dvp]
  constexpr std::ptrdiff_t kRow = kBr * sizeof(float);

  amx::pack_column_pairs(q, qs, rows.n, sh.d, kBr, qt);
  SoftmaxInit(m, l);
  const amx::Session session;
  bool first = true;
  // Without ALiBi or a softcap, a tile inside every row's key range needs only the scale, which
  // the softmax applies on its way (no pass of its own).
  const bool scale_only = !sh.alibi && sh.sm.softcap <= 0.f;
  for (int j0 = rows.key_lo; j0 < rows.key_hi; j0 += kAmxKeys) {
    const int nk = std::min(kAmxKeys, rows.key_hi - j0), keys16 = amx::pad16(nk), keys32 = amx::pad32(nk);
    std::ptrdiff_t kts = ks;
    const void* kt = amx::rows_operand(k + j0 * ks, kts, nk, sh.d, stage);
    amx::product(kt, kts, qt, kRow, S, kRow, keys16, kBr, dp, false);
    const bool masked = !rows.full(j0, j0 + nk);
    if (scale_only && !masked) {
      SoftmaxStep(S, nk, m, l, alpha, sh.sm.scale * kLog2e);
    } else {
      ScoreTile(sh.sm, sh.alibi, rows, S, nullptr, j0, nk, masked);
      SoftmaxStep(S, nk, m, l, alpha);
    }
    if (sh.dropout) DropTile(sh.drop, rows, S, j0, nk);
    if (!first) RescaleRows(O, dvp, rows.n, alpha);
    amx::transpose_round(S, nk, keys32, pb);
    amx::pack_row_pairs(v + j0 * vs, vs, nk, keys32, sh.dv, vv);
    amx::product(pb, keys32 * 2, vv, dvp * 4, O, dvp * 4, kBr, dvp, keys32, !first);
    first = false;
  }
  EmitRows(sh, rows, first, m, l, O, dvp, 1, row, emit);
}

template <class T>
void ForwardT(const Problem& p, const ForwardArgs& a) {
  const std::int64_t qblocks = (p.seqlen_q + flash::kBr - 1) / flash::kBr;
  AttendShape sh;
  sh.d = p.hdim_qk;
  sh.dv = p.hdim_v;
  sh.sm = p.score_mod(0.f);
  sh.alibi = p.has_alibi;
  sh.dropout = p.dropout_p > 0.f;
  sh.drop = p.dropout(a.options);
  const std::size_t es = sizeof(T);
  const std::int64_t qs = (p.varlen ? a.q.stride[0] : a.q.stride[1]) * es;
  const std::int64_t ks = (p.varlen ? a.k.stride[0] : a.k.stride[1]) * es;
  const std::int64_t vs = (p.varlen ? a.v.stride[0] : a.v.stride[1]) * es;
  const bool on_amx = std::is_same_v<T, hwy::bfloat16_t> && amx::available();
  parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_q * qblocks, [&](std::int64_t begin, std::int64_t end) {
    float* tiles = flash::thread_tiles(on_amx ? amx_tile_floats(p.hdim_qk, p.hdim_v)
                                              : attend_tile_floats(p.hdim_qk, p.hdim_v));
    TileRows rows;
    for (std::int64_t t = begin; t < end; ++t) {
      const int qb = static_cast<int>(t % qblocks);
      const int h = static_cast<int>(t / qblocks % p.heads_q);
      const int b = static_cast<int>(t / qblocks / p.heads_q);
      const Seq s = sequence(p, a.cu_seqlens_q, a.cu_seqlens_k, b);
      const int i0 = qb * flash::kBr;
      if (i0 >= s.sq) continue;
      const int n = std::min(flash::kBr, s.sq - i0);
      const int g = h / p.group();
      const Mask mask = p.mask(s.sq, s.sk);
      const float slope = alibi_slope(p, a.alibi_slopes, b, h);
      const std::uint32_t bh = static_cast<std::uint32_t>(b * p.heads_q + h);
      rows.reset();
      for (int r = 0; r < n; ++r) rows.set(r, mask, i0 + r, slope, bh);
      rows.finish(n);
      auto qrow = [&](int r, float* dst) {
        LoadRow(reinterpret_cast<const T*>(static_cast<const char*>(a.q.data) +
                                           elem(a.q, p.varlen, b, s.q0 + i0 + r, h) * es),
                dst, p.hdim_qk);
      };
      auto emit = [&](int r, const float* o, float lse) {
        const std::int64_t row = s.q0 + i0 + r;
        StoreRow(o, reinterpret_cast<T*>(static_cast<char*>(a.out.data) + elem(a.out, p.varlen, b, row, h) * es), p.hdim_v);
        if (a.lse.present()) a.lse.ptr<float>()[lse_elem(a.lse, p.varlen, b, row, h)] = lse;
      };
      const char* kbase = static_cast<const char*>(a.k.data) + elem(a.k, p.varlen, b, s.k0, g) * es;
      const char* vbase = static_cast<const char*>(a.v.data) + elem(a.v, p.varlen, b, s.k0, g) * es;
      if (on_amx) {
        const char* q0 = static_cast<const char*>(a.q.data) + elem(a.q, p.varlen, b, s.q0 + i0, h) * es;
        AttendTileAmx(sh, rows, q0, qs, kbase, ks, vbase, vs, tiles, emit);
        continue;
      }
      // fp32 rows are read where they lie; 16-bit ones are widened a tile at a time.
      const std::ptrdiff_t ldk = std::is_same_v<T, float> ? ks / 4 : 0, ldv = std::is_same_v<T, float> ? vs / 4 : 0;
      AttendTile<T>(
          sh, rows, qrow, [&](int j) { return reinterpret_cast<const T*>(kbase + j * ks); },
          [&](int j) { return reinterpret_cast<const T*>(vbase + j * vs); }, ldk, ldv, 0, s.sk, tiles, emit);
    }
  });
}

void FlashForward(const Problem& p, const ForwardArgs& a) {
  switch (p.dtype) {
    case DType::f16: return ForwardT<hwy::float16_t>(p, a);
    case DType::bf16: return ForwardT<hwy::bfloat16_t>(p, a);
    default: return ForwardT<float>(p, a);
  }
}

}  // namespace tileattn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tileattn::cpu {

HWY_EXPORT(FlashForward);

void flash_forward(const Problem& p, const ForwardArgs& a) { HWY_DYNAMIC_DISPATCH(FlashForward)(p, a); }

// The forward keeps nothing between tiles but the LSE it writes to the caller's tensor.
std::size_t workspace_size(const Problem&, const ForwardArgs&) { return 0; }

}  // namespace tileattn::cpu
#endif
