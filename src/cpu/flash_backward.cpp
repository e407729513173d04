// FlashAttention-2 backward on the CPU. Three passes, each parallel with no shared writes:
//   1. each query tile packed once in fp32 (Q^T, dO^T, Q, dO, LSE, D = rowsum(dO * O)), and the
//      dQ partials zeroed;
//   2. per (sequence, KV head, key group): every key block of the group keeps its dK, dV tiles
//      while the query tiles of all heads of the GQA group stream by; P is recomputed from the
//      LSE, dS = P * (dP - D), and dS K goes to the group's own fp32 dQ partial;
//   3. dQ = the partials summed in group order.
// Which task writes which partial depends on the problem shape alone, so every run, on any thread
// count, gives bitwise the same gradients: options.deterministic holds by construction. Where the
// CPU has AMX, bf16 runs the five tile products on it (P and dS rounded to bf16 as on the GPU).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_backward.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <optional>

#include "core/backends.hpp"
#include "cpu/amx.hpp"
#include "cpu/block_sparse.hpp"
#include "cpu/document_runs.hpp"
#include "cpu/flash_simd-inl.h"
#include "cpu/parallel.hpp"
#include "cpu/tensor_io.hpp"
#include "cpu/varlen_tails.hpp"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tileattn::cpu::HWY_NAMESPACE {

// A packed query tile of W lanes (its rows rounded up: flash::QueryTiles): pass 1 writes it once,
// pass 2 reads it once per key block. The FMA products take fp32 forms (Q^T carrying the scale
// where it can, dO^T, Q and dO padded); on AMX the same space (larger than needed) holds the bf16
// operands instead: Q and dO as column pairs, the B of S^T = K Q^T and dP^T = V dO^T, and as row
// pairs, the B of dK += dS^T Q and dV += P^T dO. Lanes past the tile's rows are zero (L = +inf).
struct QueryTile {
  float* base;                 // the tile's first float: W * backward_tile_floats of them
  int W;                       // lanes: a multiple of 16 (32 on AMX), at most kBr
  float *QT, *dOT, *Qr, *dOr;  // [D][W], [DV][W], [W][Dp], [W][DVp]
  std::uint32_t *Qd, *dOd;     // [pad32(D) / 2][W], [pad32(DV) / 2][W]
  std::uint16_t *Q2, *dO2;     // [W / 2][2 pad16(D)], [W / 2][2 pad16(DV)]
  float *L, *Dr;               // [W]: the LSE in log2 units (+inf: no key), D = rowsum(dO * O)

  QueryTile(float* first, int D, int DV, bool on_amx, int width) : base(first), W(width) {
    if (on_amx) {
      QT = dOT = Qr = dOr = nullptr;
      Qd = reinterpret_cast<std::uint32_t*>(base);
      dOd = Qd + amx::pad32(D) / 2 * W;
      Q2 = reinterpret_cast<std::uint16_t*>(dOd + amx::pad32(DV) / 2 * W);
      dO2 = Q2 + W * amx::pad16(D);
      L = reinterpret_cast<float*>(dO2 + W * amx::pad16(DV));
    } else {
      Qd = dOd = nullptr;
      Q2 = dO2 = nullptr;
      QT = base;
      dOT = QT + D * W;
      Qr = dOT + DV * W;
      dOr = Qr + W * flash::padded(D);
      L = dOr + W * flash::padded(DV);
    }
    Dr = L + W;
  }
};

template <class T>
void BackwardT(const Problem& p, const BackwardArgs& a) {
  const DF df;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  const int D = p.hdim_qk, DV = p.hdim_v, Dp = flash::padded(D), DVp = flash::padded(DV);
  const std::int64_t rows_total = flash::total_q_rows(p, a);
  const flash::QueryTiles qtiles = flash::backward_query_tiles(p, a);
  const bool on_amx = std::is_same_v<T, hwy::bfloat16_t> && amx::available();
  const int groups = flash::backward_key_groups(p);
  const std::size_t es = sizeof(T);
  const std::size_t row_floats = flash::backward_tile_floats(p);
  flash::Workspace ws(a.options, flash::backward_scratch_bytes(p, a));
  float* packed = ws.floats(static_cast<std::size_t>(p.heads_q) * qtiles.total * row_floats);  // [h][padded row]
  float* dQp = ws.floats(static_cast<std::size_t>(groups) * p.heads_q * rows_total * Dp);  // [g][h][row][Dp]
  auto row_index = [&](int b, const Seq& s, int i) -> std::int64_t {
    return p.varlen ? s.q0 + i : static_cast<std::int64_t>(b) * p.seqlen_q + i;
  };
  // Query tile qb of sequence b (of sq rows), head h.
  auto query_tile = [&](int h, int b, int sq, int qb) {
    float* base = packed + (h * qtiles.total + qtiles.first(b) + static_cast<std::int64_t>(qb) * kBr) * row_floats;
    return QueryTile(base, D, DV, on_amx, qtiles.width(sq, qb * kBr));
  };
  auto part = [&](int g, int h, std::int64_t row) {
    return dQp + ((static_cast<std::int64_t>(g) * p.heads_q + h) * rows_total + row) * Dp;
  };
  auto ptr = [&](const TensorView& t, int b, std::int64_t row, int h) {
    return reinterpret_cast<T*>(static_cast<char*>(t.data) + elem(t, p.varlen, b, row, h) * es);
  };
  const std::int64_t qblocks = (static_cast<std::int64_t>(p.seqlen_q) + kBr - 1) / kBr;
  const std::int64_t qtasks = static_cast<std::int64_t>(p.batch) * p.heads_q * qblocks;
  const float qscale = query_prescale(p.score_mod(0.f));

  const std::int64_t qst = (p.varlen ? a.q.stride[0] : a.q.stride[1]) * es;
  const std::int64_t dost = (p.varlen ? a.dout.stride[0] : a.dout.stride[1]) * es;
  // Pass 1: every query tile once, in the forms pass 2 multiplies with (QueryTile), so that pass 2
  // (which meets each tile once per key block) never copies or transposes. Padding rows and columns
  // are zero.
  parallel_for(qtasks, [&](std::int64_t begin, std::int64_t end) {
    float* orow = flash::thread_tiles(2 * static_cast<std::size_t>(DV));
    float* dorow = orow + DV;
    for (std::int64_t t = begin; t < end; ++t) {
      const int qb = static_cast<int>(t % qblocks), h = static_cast<int>(t / qblocks % p.heads_q);
      const int b = static_cast<int>(t / qblocks / p.heads_q);
      const Seq s = sequence(p, a.cu_seqlens_q, a.cu_seqlens_k, b);
      const int i0 = qb * kBr;
      if (i0 >= s.sq) continue;
      const int n = std::min(kBr, s.sq - i0);
      const QueryTile qt = query_tile(h, b, s.sq, qb);
      const int W = qt.W;
      std::memset(qt.base, 0, sizeof(float) * W * row_floats);
      if (on_amx) {
        const T* q0 = ptr(a.q, b, s.q0 + i0, h);
        const T* do0 = ptr(a.dout, b, s.q0 + i0, h);
        amx::pack_column_pairs(q0, qst, n, D, W, qt.Qd);
        amx::pack_column_pairs(do0, dost, n, DV, W, qt.dOd);
        amx::pack_row_pairs(q0, qst, n, W, D, qt.Q2);
        amx::pack_row_pairs(do0, dost, n, W, DV, qt.dO2);
      }
      for (int r = 0; r < n; ++r) {
        const std::int64_t qrow = s.q0 + i0 + r;
        float* dor = on_amx ? dorow : qt.dOr + r * DVp;
        LoadRow(ptr(a.dout, b, qrow, h), dor, DV);
        LoadRow(ptr(a.out, b, qrow, h), orow, DV);
        float acc = 0.f;
        for (int c = 0; c < DV; ++c) acc += dor[c] * orow[c];
        qt.Dr[r] = acc;
        if (!on_amx) {
          LoadRow(ptr(a.q, b, qrow, h), qt.Qr + r * Dp, D);
          for (int c = 0; c < D; ++c) qt.QT[c * W + r] = qt.Qr[r * Dp + c] * qscale;
          for (int c = 0; c < DV; ++c) qt.dOT[c * W + r] = dor[c];
        }
        const float lse = a.lse.ptr<const float>()[lse_elem(a.lse, p.varlen, b, qrow, h)];
        qt.L[r] = lse == -kInf ? kInf : lse * kLog2e;
        for (int g = 0; g < groups; ++g) std::memset(part(g, h, row_index(b, s, i0 + r)), 0, sizeof(float) * Dp);
      }
      for (int r = n; r < W; ++r) qt.L[r] = kInf;
    }
  });

  // Pass 2. Under a block-sparse mask key tiles stay inside key blocks and each key block visits
  // the query blocks of its transposed mask.
  const bool dropout = p.dropout_p > 0.f, softcap = p.softcap > 0.f;
  const BlockTiling ktiling(kBc, p.block_k);
  const std::optional<TransposedBlockMask> sparse =
      p.block_sparse() ? std::optional<TransposedBlockMask>(std::in_place, p, a.block_mask) : std::nullopt;
  const DocumentRuns docs(p, a.cu_seqlens_q, a.cu_seqlens_k, a.document_ids_q, a.document_ids_k);
  const int Dk = amx::pad32(D), DVk = amx::pad32(DV);  // AMX: K's and V's rows in whole tile columns
  const std::size_t kc = kBc, kr = kBr;
  const std::size_t work_floats = kc * (Dp + DVp) + 3 * kc * kr +
                                  (on_amx ? kc * (Dk + DVk + Dp) / 2 + 3 * kc * kr / 2 + kr * Dp : kc * (Dp + DV));
  parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_kv * groups, [&](std::int64_t begin, std::int64_t end) {
    float* dK = flash::thread_tiles(work_floats);  // [kBc][Dp]
    float* dV = dK + kBc * Dp;                     // [kBc][DVp]
    float* S = dV + kBc * DVp;                     // [kBc][kBr] scores, then P
    float* dP = S + kBc * kBr;                     // [kBc][kBr] dP, then dS
    float* Th = dP + kBc * kBr;                    // [kBc][kBr] tanh under the softcap
    float* Kj = Th + kBc * kBr;                    // FMA: [kBc][Dp]
    float* Vj = Kj + kBc * Dp;                     // FMA: [kBc][DV]
    // AMX: K and V staged where a tile would end mid-row or mid-key block, K in key pairs (the B of
    // dQ += dS K), P^T and dS^T rounded (the A of dV and dK), dS rounded (the A of dQ), dQ's tile.
    auto* Ks = reinterpret_cast<std::uint16_t*>(Th + kBc * kBr);  // [kBc][Dk]
    std::uint16_t* Vs = Ks + kBc * Dk;                            // [kBc][DVk]
    std::uint16_t* K2 = Vs + kBc * DVk;                           // [kBc / 2][2 Dp]
    std::uint16_t* Pb = K2 + kBc * Dp;                            // [kBc][kBr]
    std::uint16_t* dSb = Pb + kBc * kBr;                          // [kBc][kBr]
    std::uint16_t* dSr = dSb + kBc * kBr;                         // [kBr][kBc]
    float* dQt = reinterpret_cast<float*>(dSr + kBr * kBc);      // [kBr][Dp]
    std::optional<amx::Session> tiles;
    if (on_amx) tiles.emplace();
    TileRows rows;
    for (std::int64_t t = begin; t < end; ++t) {
      const int grp = static_cast<int>(t % groups), g = static_cast<int>(t / groups % p.heads_kv);
      const int b = static_cast<int>(t / groups / p.heads_kv);
      const Seq s = sequence(p, a.cu_seqlens_q, a.cu_seqlens_k, b);
      Variant var = p.variant(s.sq, s.sk, a.options);
      docs.set(b, s, var);
      set_prefix(p, a.prefix_lens, b, var);
      const char* kbase = reinterpret_cast<const char*>(ptr(a.k, b, s.k0, g));
      const char* vbase = reinterpret_cast<const char*>(ptr(a.v, b, s.k0, g));
      const std::int64_t ks = (p.varlen ? a.k.stride[0] : a.k.stride[1]) * es;
      const std::int64_t vs = (p.varlen ? a.v.stride[0] : a.v.stride[1]) * es;
      for (std::int64_t kti = grp; ktiling.start(kti) < s.sk; kti += groups) {
        const int j0 = ktiling.start(kti), nk = std::min(ktiling.size(kti), s.sk - j0), j1 = j0 + nk;
        const int keys16 = amx::pad16(nk), keys32 = amx::pad32(nk);
        // AMX: K's and V's rows are the A of S^T and dP^T.
        const void* kt = nullptr;
        const void* vt = nullptr;
        std::ptrdiff_t kts = ks, vts = vs;
        if (on_amx) {
          kt = amx::rows_operand(kbase + j0 * ks, kts, nk, D, Ks);
          vt = amx::rows_operand(vbase + j0 * vs, vts, nk, DV, Vs);
          amx::pack_row_pairs(kbase + j0 * ks, ks, nk, keys32, D, K2);
        } else {
          LoadTile<T>([&](int j) { return reinterpret_cast<const T*>(kbase + j * ks); }, j0, nk, D, Dp, Kj);
          LoadTile<T>([&](int j) { return reinterpret_cast<const T*>(vbase + j * vs); }, j0, nk, DV, DV, Vj);
        }
        std::memset(dK, 0, sizeof(float) * kBc * Dp);
        std::memset(dV, 0, sizeof(float) * kBc * DVp);
        // One query tile against this key tile, `rows` set; `full`: a block mask's fully visible
        // block (no element mask).
        auto tile = [&](int h, int qb, bool full) {
          const int i0 = qb * kBr, n = std::min(kBr, s.sq - i0);
          const QueryTile qt = query_tile(h, b, s.sq, qb);
          const int W = qt.W;  // lanes past W of S and dP are left as they were: never read
          float* dq = part(grp, h, row_index(b, s, i0));
          if (on_amx) {
            amx::product(kt, kts, qt.Qd, W * 4, S, kBr * 4, keys16, W, Dk, false);
            ScoreTile(var, rows, S, softcap ? Th : nullptr, j0, nk, !rows.full(j0, j1));
            amx::product(vt, vts, qt.dOd, W * 4, dP, kBr * 4, keys16, W, DVk, false);
          } else {
            Gemm(Kj, Dp, 1, qt.QT, W, S, kBr, nk, W, D, nullptr, false);
            ScoreTile(var, rows, S, softcap ? Th : nullptr, j0, nk, !rows.full(j0, j1), true);
            Gemm(Vj, DV, 1, qt.dOT, W, dP, kBr, nk, W, DV, nullptr, false);
          }
          if (!full && var.element_tests()) ElementTile(var, rows, S, j0, nk);
          if (dropout) DropTile(var, rows, dP, j0, nk);
          const VF keep_scale = hn::Set(df, dropout ? var.drop.keep_scale : 1.f);
          const VF scale = hn::Set(df, var.score.scale);
          for (int v = 0; v < W; v += N) {
            const VF lv = hn::LoadU(df, qt.L + v), dv = hn::LoadU(df, qt.Dr + v);
            for (int jj = 0; jj < nk; ++jj) {
              const VF pj = Exp2(df, hn::Sub(hn::LoadU(df, S + jj * kBr + v), lv));
              hn::StoreU(pj, df, S + jj * kBr + v);
              VF ds = hn::Mul(pj, hn::MulSub(hn::LoadU(df, dP + jj * kBr + v), keep_scale, dv));
              if (softcap) {
                const VF th = hn::LoadU(df, Th + jj * kBr + v);
                ds = hn::Mul(ds, hn::Mul(scale, hn::NegMulAdd(th, th, hn::Set(df, 1.f))));
              } else {
                ds = hn::Mul(ds, scale);
              }
              hn::StoreU(ds, df, dP + jj * kBr + v);
            }
          }
          if (dropout) {
            DropTile(var, rows, S, j0, nk);
            for (int e = 0; e < nk * kBr; e += N)
              hn::StoreU(hn::Mul(hn::LoadU(df, S + e), keep_scale), df, S + e);
          }
          if (on_amx) {
            // Key rows nk..keys16 of S and dP came from zero rows of K and V: they add nothing.
            amx::round(S, keys16 * kBr, Pb);
            amx::product(Pb, kBr * 2, qt.dO2, DVp * 4, dV, DVp * 4, keys16, DVp, W, true);
            amx::round(dP, keys16 * kBr, dSb);
            amx::product(dSb, kBr * 2, qt.Q2, Dp * 4, dK, Dp * 4, keys16, Dp, W, true);
            amx::transpose_round(dP, nk, keys32, dSr);
            amx::product(dSr, keys32 * 2, K2, Dp * 4, dQt, Dp * 4, W, Dp, keys32, false);
            // The tile's rows past n belong to the next sequence's partial (or lie past the last).
            for (int r = 0; r < n; ++r)
              for (int c = 0; c < Dp; c += N)
                hn::StoreU(hn::Add(hn::LoadU(df, dq + r * Dp + c), hn::LoadU(df, dQt + r * Dp + c)), df, dq + r * Dp + c);
          } else {
            Gemm(S, kBr, 1, qt.dOr, DVp, dV, DVp, nk, DVp, n);
            Gemm(dP, kBr, 1, qt.Qr, Dp, dK, Dp, nk, Dp, n);
            Gemm(dP, 1, kBr, Kj, Dp, dq, Dp, n, Dp, nk);
          }
        };
        for (int h = g * p.group(); h < (g + 1) * p.group(); ++h) {
          set_dense_mask(p, a.block_mask.mask, b, h, var);
          const float slope = alibi_slope(p, a.alibi_slopes, b, h);
          const std::uint32_t bh = static_cast<std::uint32_t>(b * p.heads_q + h);
          if (!sparse) {
            // Rows whose key range meets [j0, j1): contiguous, as both range ends grow with i.
            // Whole query tiles are taken; their rows outside that range are masked out entirely.
            // A tile none of whose rows sees these keys (other documents) adds nothing.
            const int ilo = var.row_begin(j0), ihi = var.row_end(j1);
            for (int qb = ilo / kBr; qb * kBr < ihi; ++qb) {
              const int i0 = qb * kBr, n = std::min(kBr, s.sq - i0);
              if (var.visit(i0, i0 + n, j0, j1) == BlockVisit::skip) continue;
              rows.reset();
              for (int r = 0; r < n; ++r) rows.set(r, var, i0 + r, slope, bh);
              rows.finish(n);
              tile(h, qb, false);
            }
            continue;
          }
          // The query blocks that visit this key block: their rows see all of it (full) or the
          // variant's keys of it (partial: only rows the variant lets see this key tile at all);
          // rows of a query tile outside that see nothing.
          sparse->for_each(b, h, ktiling.block_of(kti), [&](int qblk, bool full) {
            int qlo = qblk * p.block_q, qhi = std::min(s.sq, qlo + p.block_q);
            if (!full) qlo = std::max(qlo, var.row_begin(j0)), qhi = std::min(qhi, var.row_end(j1));
            for (int qb = qlo / kBr; qb * kBr < qhi; ++qb) {
              const int i0 = qb * kBr, n = std::min(kBr, s.sq - i0);
              rows.reset();
              for (int r = 0; r < n; ++r) {
                const int i = i0 + r;
                if (i < qlo || i >= qhi)
                  rows.set(r, var, i, slope, bh, 0, 0);
                else if (full)
                  rows.set(r, var, i, slope, bh, j0, j1);
                else
                  rows.set(r, var, i, slope, bh);
              }
              rows.finish(n);
              tile(h, qb, full);
            }
          });
        }
        for (int j = 0; j < nk; ++j) {
          StoreRow(dK + j * Dp, ptr(a.dk, b, s.k0 + j0 + j, g), D);
          StoreRow(dV + j * DVp, ptr(a.dv, b, s.k0 + j0 + j, g), DV);
        }
      }
    }
  });

  // Pass 3.
  parallel_for(qtasks, [&](std::int64_t begin, std::int64_t end) {
    float* acc = flash::thread_tiles(static_cast<std::size_t>(Dp));
    for (std::int64_t t = begin; t < end; ++t) {
      const int qb = static_cast<int>(t % qblocks), h = static_cast<int>(t / qblocks % p.heads_q);
      const int b = static_cast<int>(t / qblocks / p.heads_q);
      const Seq s = sequence(p, a.cu_seqlens_q, a.cu_seqlens_k, b);
      for (int i = qb * kBr; i < std::min(s.sq, (qb + 1) * kBr); ++i) {
        const std::int64_t r = row_index(b, s, i);
        std::memcpy(acc, part(0, h, r), sizeof(float) * Dp);
        for (int g = 1; g < groups; ++g) {
          const float* src = part(g, h, r);
          for (int c = 0; c < Dp; c += N) hn::StoreU(hn::Add(hn::LoadU(df, acc + c), hn::LoadU(df, src + c)), df, acc + c);
        }
        StoreRow(acc, ptr(a.dq, b, s.q0 + i, h), D);
      }
    }
  });
}

void FlashBackward(const Problem& p, const BackwardArgs& a) {
  switch (p.dtype) {
    case DType::f16: return BackwardT<hwy::float16_t>(p, a);
    case DType::bf16: return BackwardT<hwy::bfloat16_t>(p, a);
    default: return BackwardT<float>(p, a);
  }
}

}  // namespace tileattn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tileattn::cpu {

HWY_EXPORT(FlashBackward);

void flash_backward(const Problem& p, const BackwardArgs& a) {
  HWY_DYNAMIC_DISPATCH(FlashBackward)(p, a);
  write_varlen_tails(p, a);
}

std::size_t workspace_size(const Problem& p, const BackwardArgs& a) {
  return flash::reported_bytes(flash::backward_scratch_bytes(p, a));
}

}  // namespace tileattn::cpu
#endif
