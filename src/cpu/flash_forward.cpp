// FlashAttention-2 forward on the CPU: one task per (sequence, query head, query tile), each
// streaming its keys through AttendTile, from the inputs or from KVCopy's dense copy of them. Dense
// fp32 K and V are read in place; fp16/bf16 key tiles are widened into a per-thread tile. Where
// the CPU has AMX, bf16 runs the tile products on it (AttendTileAmx), K from its rows as they are.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_forward.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <optional>

#include "core/backends.hpp"
#include "cpu/amx.hpp"
#include "cpu/block_sparse.hpp"
#include "cpu/document_runs.hpp"
#include "cpu/kv_copy.hpp"
#include "cpu/flash_simd-inl.h"
#include "cpu/parallel.hpp"
#include "cpu/tensor_io.hpp"
#include "cpu/varlen_tails.hpp"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tileattn::cpu::HWY_NAMESPACE {

// Floats of per-thread tiles AttendTileAmx needs (bf16 and fp32 pieces, each a multiple of 64 bytes).
inline std::size_t amx_tile_floats(int d, int dv) {
  const std::size_t dp = amx::pad32(d), dvp = amx::pad16(dv), kc = kVTKeys;
  return dp * kBr / 2 + kc * dp / 2 + dvp * kc / 2 + kc / 2 * kBr + std::max(kc, dvp) * kBr + dvp * kBr + 3 * kBr + dvp;
}

// O^T[c][r] *= alpha[r], skipping groups of rows whose running max stayed put (alpha = 1).
HWY_INLINE void RescaleColumns(float* OT, int dvp, const float* alpha) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  for (int v = 0; v < kBr; v += N) {
    const VF a = hn::LoadU(d, alpha + v);
    if (hn::AllTrue(d, hn::Eq(a, hn::Set(d, 1.f)))) continue;
    for (int c = 0; c < dvp; ++c) hn::StoreU(hn::Mul(hn::LoadU(d, OT + c * kBr + v), a), d, OT + c * kBr + v);
  }
}

// A running max may lag a row's true max by this much (log2 units) before it moves: P then stays
// below 2^8, exact in fp32 and as exactly rounded to bf16 as below 1, and after the first steps
// most rows keep their max, so most steps rescale nothing.
inline constexpr float kMaxSlack = 8.f;

// AttendTile for bf16 with the tile products on AMX: the same scores, mask and online softmax, with
// S^T = K Q^T and O^T += V^T P^T multiplied from bf16 operands into fp32: K read where it lies, Q
// packed once per query tile, P rounded to bf16 (as on the GPU) in pairs of keys, V^T from KVCopy's
// blocks (vt) or, where there are none, transposed here step by step. Steps follow the blocks of
// kVTKeys keys over [key_lo, key_hi), the first from key_lo rounded down to 32 (the mask keeps each
// row to its own keys; key ranges from `keys` start on multiples of 32 where they are full). Query
// row r lies at q + r * qs, key row j at k + j * ks and v + j * vs (bytes).
template <class Keys, class Emit>
void AttendTileAmx(const AttendShape& sh, const TileRows& rows, const char* q, std::ptrdiff_t qs, const char* k,
                   std::ptrdiff_t ks, const char* v, std::ptrdiff_t vs, const char* vt, const Keys& keys, float* tiles,
                   Emit emit) {
  const int dp = amx::pad32(sh.d), dvp = amx::pad16(sh.dv);
  auto* qt = reinterpret_cast<std::uint32_t*>(tiles);                  // [dp / 2][kBr] pairs
  auto* stage = reinterpret_cast<std::uint16_t*>(qt + dp / 2 * kBr);  // [kVTKeys][dp]
  std::uint16_t* vstage = stage + kVTKeys * dp;                        // [dvp][kVTKeys]
  auto* pt = reinterpret_cast<std::uint32_t*>(vstage + dvp * kVTKeys);  // [kVTKeys / 2][kBr] pairs
  float* S = reinterpret_cast<float*>(pt + kVTKeys / 2 * kBr);          // [kVTKeys][kBr], at the end O [kBr][dvp]
  float* OT = S + std::max(kVTKeys, dvp) * kBr;                         // [dvp][kBr]
  float* m = OT + kBr * dvp;
  float* l = m + kBr;
  float* alpha = l + kBr;
  float* row = alpha + kBr;  // [dvp]
  constexpr std::ptrdiff_t kRow = kBr * sizeof(float), kVTRow = kVTKeys * 2;

  amx::pack_column_pairs(q, qs, rows.n, sh.d, kBr, qt);
  SoftmaxInit(m, l);
  const amx::Session session;
  bool first = true;
  // Without ALiBi or a softcap, a tile inside every row's key range needs only the scale, which
  // the softmax applies on its way (no pass of its own).
  const bool scale_only = !sh.var.alibi && sh.var.score.softcap <= 0.f;
  keys(rows, [&](int key_lo, int key_hi, bool full) {
    for (int j0 = key_lo / 32 * 32, j1; j0 < key_hi; j0 = j1) {
      j1 = std::min(key_hi, (j0 / kVTKeys + 1) * kVTKeys);
      const int nk = j1 - j0, keys32 = amx::pad32(nk);
      std::ptrdiff_t kts = ks;
      const void* kt = amx::rows_operand(k + j0 * ks, kts, nk, sh.d, stage);
      amx::product(kt, kts, qt, kRow, S, kRow, amx::pad16(nk), kBr, dp, false);
      const bool masked = !full && !rows.full(j0, j1), elements = !full && sh.var.element_tests();
      if (scale_only && !masked && !elements) {
        SoftmaxStep<3>(S, nk, m, l, alpha, sh.var.score.scale * kLog2e, kMaxSlack);
      } else {
        ScoreTile(sh.var, rows, S, nullptr, j0, nk, masked);
        if (elements) ElementTile(sh.var, rows, S, j0, nk);
        SoftmaxStep<3>(S, nk, m, l, alpha, 1.f, kMaxSlack);
      }
      if (sh.var.dropout) DropTile(sh.var, rows, S, j0, nk);
      if (!first) RescaleColumns(OT, dvp, alpha);
      amx::pair_round(S, nk, keys32, pt);
      const void* va = vstage;
      if (vt != nullptr)
        va = vt + j0 / kVTKeys * vt_block_bytes(sh.dv) + j0 % kVTKeys * 2;
      else
        amx::transpose_rows(v + j0 * vs, vs, nk, keys32, sh.dv, vstage, kVTKeys);
      amx::product(va, kVTRow, pt, kRow, OT, kRow, dvp, kBr, keys32, !first);
      first = false;
    }
  });
  amx::transpose(OT, dvp, kBr, S);
  EmitRows(sh, rows, first, m, l, S, dvp, 1, row, emit);
}

// A block-sparse mask's key blocks for one query tile (inside query block qb): full blocks whole,
// partial ones clipped to the rows' key range (the variant masks them per element).
struct SparseKeys {
  const BlockMaskRows* mask;
  int b, h, qb, block_k, sk;
  template <class Visit>
  void operator()(const TileRows& rows, Visit visit) const {
    mask->for_each(b, h, qb, [&](int kb, bool full) {
      const int j0 = kb * block_k, j1 = std::min(sk, j0 + block_k);
      if (full)
        visit(j0, j1, true);
      else
        visit(std::max(j0, rows.key_lo), std::min(j1, rows.key_hi), false);
    });
  }
};

template <class T>
void ForwardT(const Problem& p, const ForwardArgs& a) {
  // Query tiles of kBr rows, inside one query block of a block-sparse mask.
  const BlockTiling qtiling(flash::kBr, p.block_q);
  const std::int64_t qblocks = qtiling.tiles(p.seqlen_q);
  const std::optional<BlockMaskRows> sparse =
      p.block_sparse() ? std::optional<BlockMaskRows>(std::in_place, a.block_mask) : std::nullopt;
  const DocumentRuns docs(p, a.cu_seqlens_q, a.cu_seqlens_k, a.document_ids_q, a.document_ids_k);
  const std::size_t es = sizeof(T);
  const std::int64_t qs = (p.varlen ? a.q.stride[0] : a.q.stride[1]) * es;
  // AMX steps through keys from multiples of 32: block-sparse key blocks must start on them.
  const bool on_amx = std::is_same_v<T, hwy::bfloat16_t> && amx::available() && p.block_k % 32 == 0;
  // A caller's workspace below workspace_size bounds the copies (more waves).
  const KVCopy kv(p, a, a.options.workspace != nullptr ? flash::usable_bytes(a.options) : kKVCopyBudget);
  flash::Workspace ws(a.options, kv.bytes());
  char* copies = reinterpret_cast<char*>(ws.floats(kv.bytes() / sizeof(float)));
  // Pairs in 64 bits: batch x heads_kv may exceed 2^31.
  const std::int64_t pairs = static_cast<std::int64_t>(p.batch) * p.heads_kv;
  const int group = p.group();
  const std::int64_t readers = group * qblocks, chunks = kv.chunks();
  for (std::int64_t u0 = 0; u0 < pairs; u0 += kv.wave()) {
    const std::int64_t u1 = std::min(pairs, u0 + kv.wave());
    KVFill fill(kv, copies, u0, u1);
    // Per pair of the wave, its readers' tasks (query head of the group, query tile; the tile
    // fastest, last first: under a causal mask the last tiles see the most keys, and the longest
    // tasks taken first leave the shortest for the end), each run of them led by the chunks of
    // the next pair's copy.
    parallel_for((u1 - u0) * (chunks + readers), [&](std::int64_t begin, std::int64_t end) {
      float* tiles = flash::thread_tiles(on_amx ? amx_tile_floats(p.hdim_qk, p.hdim_v)
                                                : attend_tile_floats(p.hdim_qk, p.hdim_v));
      TileRows rows;
      for (std::int64_t i = begin; i < end; ++i) {
        const std::int64_t u = u0 + i / (chunks + readers);
        const std::int64_t t = i % (chunks + readers) - chunks;
        if (t < 0) {
          if (u + 1 < u1) fill.help(u + 1);
          continue;
        }
        const std::int64_t qt = qblocks - 1 - t % qblocks;
        const int b = static_cast<int>(u / p.heads_kv), g = static_cast<int>(u % p.heads_kv);
        const int h = g * group + static_cast<int>(t / qblocks);
        const Seq s = sequence(p, a.cu_seqlens_q, a.cu_seqlens_k, b);
        const int i0 = qtiling.start(qt);
        if (i0 >= s.sq) continue;
        const int n = std::min(qtiling.size(qt), s.sq - i0);
        AttendShape sh;
        sh.d = p.hdim_qk;
        sh.dv = p.hdim_v;
        sh.var = p.variant(s.sq, s.sk, a.options);
        docs.set(b, s, sh.var);
        set_prefix(p, a.prefix_lens, b, sh.var);
        set_dense_mask(p, a.block_mask.mask, b, h, sh.var);
        const float slope = alibi_slope(p, a.alibi_slopes, b, h);
        const std::uint32_t bh = static_cast<std::uint32_t>(b * p.heads_q + h);
        const char* q0 = static_cast<const char*>(a.q.data) + elem(a.q, p.varlen, b, s.q0 + i0, h) * es;
        // Query rows heads * d apart each start on a new page: ask for all of them at once
        // rather than one miss after another as the tile is read.
        for (int r = 0; r < n; ++r)
          for (std::size_t c = 0; c < p.hdim_qk * es; c += 64) hwy::Prefetch(q0 + r * qs + c);
        rows.reset();
        for (int r = 0; r < n; ++r) rows.set(r, sh.var, i0 + r, slope, bh);
        rows.finish(n);
        auto qrow = [&](int r, float* dst) { LoadRow(reinterpret_cast<const T*>(q0 + r * qs), dst, p.hdim_qk); };
        auto emit = [&](int r, const float* o, float lse) {
          const std::int64_t row = s.q0 + i0 + r;
          StoreRow(o, reinterpret_cast<T*>(static_cast<char*>(a.out.data) + elem(a.out, p.varlen, b, row, h) * es), p.hdim_v);
          if (a.lse.present()) a.lse.ptr<float>()[lse_elem(a.lse, p.varlen, b, row, h)] = lse;
        };
        fill.await(u);
        const KVRows kvr = kv.rows(copies, u0, u);
        auto attend = [&](const auto& keys) {
          if (on_amx) {
            AttendTileAmx(sh, rows, q0, qs, kvr.k, kvr.ks, kvr.v, kvr.vs, kvr.vt, keys, tiles, emit);
            return;
          }
          // Dense fp32 rows are read where they lie; others are copied a tile at a time, 16-bit
          // ones widened on the way.
          const bool f32 = std::is_same_v<T, float>;
          const std::ptrdiff_t ldk = f32 && kvr.ks == 4 * sh.d ? sh.d : 0, ldv = f32 && kvr.vs == 4 * sh.dv ? sh.dv : 0;
          AttendTile<T>(
              sh, rows, qrow, [&](int j) { return reinterpret_cast<const T*>(kvr.k + j * kvr.ks); },
              [&](int j) { return reinterpret_cast<const T*>(kvr.v + j * kvr.vs); }, ldk, ldv, keys, tiles, emit);
        };
        if (sparse)
          attend(SparseKeys{&*sparse, b, h, qtiling.block_of(qt), p.block_k, s.sk});
        else
          attend(DenseKeys{0, s.sk});
      }
    });
  }
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

void flash_forward(const Problem& p, const ForwardArgs& a) {
  HWY_DYNAMIC_DISPATCH(FlashForward)(p, a);
  write_varlen_tails(p, a);
}

std::size_t workspace_size(const Problem& p, const ForwardArgs& a) {
  return flash::reported_bytes(KVCopy(p, a, kKVCopyBudget).bytes());
}

}  // namespace tileattn::cpu
#endif
