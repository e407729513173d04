// FlashAttention-2 forward on the CPU: one task per (sequence, query head, query tile), each
// streaming its keys through AttendTile. fp32 K and V are read in place; fp16/bf16 key tiles are
// widened into a per-thread tile, so nothing larger than a tile is ever allocated.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_forward.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "core/backends.hpp"
#include "cpu/flash_simd-inl.h"
#include "cpu/parallel.hpp"
#include "cpu/tensor_io.hpp"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tileattn::cpu::HWY_NAMESPACE {

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
  const std::int64_t ks = (p.varlen ? a.k.stride[0] : a.k.stride[1]) * es;
  const std::int64_t vs = (p.varlen ? a.v.stride[0] : a.v.stride[1]) * es;
  parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_q * qblocks, [&](std::int64_t begin, std::int64_t end) {
    float* tiles = flash::thread_tiles(attend_tile_floats(p.hdim_qk, p.hdim_v));
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
      // fp32 rows are read where they lie; 16-bit ones are widened a tile at a time.
      const std::ptrdiff_t ldk = std::is_same_v<T, float> ? ks / 4 : 0, ldv = std::is_same_v<T, float> ? vs / 4 : 0;
      const char* kbase = static_cast<const char*>(a.k.data) + elem(a.k, p.varlen, b, s.k0, g) * es;
      const char* vbase = static_cast<const char*>(a.v.data) + elem(a.v, p.varlen, b, s.k0, g) * es;
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
