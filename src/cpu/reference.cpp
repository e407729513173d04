// The oracle: materializes S and P for one (sequence, query head) at a time and applies the
// semantics literally. It shares no mask or score code with the fast paths on purpose, so a bug
// there cannot hide behind the same bug here; only the dropout generator is shared, and that is
// pinned by its known-answer test.
#include "cpu/reference.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/backends.hpp"
#include "cpu/parallel.hpp"
#include "cpu/tensor_io.hpp"
#include "cpu/varlen_tails.hpp"

namespace tileattn::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Rounder {
  DType dtype;
  bool on;
  double operator()(double x) const {
    if (!on) return x;
    switch (dtype) {
      case DType::f16: return f16_to_f32(f32_to_f16(static_cast<float>(x)));
      case DType::bf16: return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
      default: return static_cast<float>(x);
    }
  }
};

// One (sequence, query head): dense operands in fp64 and the literal mask and score rules.
struct Head {
  const Problem* p;
  int sq = 0, sk = 0, d = 0, dv = 0;
  double slope = 0;
  std::uint32_t bh = 0;
  std::vector<double> q, k, v;  // [sq, d], [sk, d], [sk, dv]
  // Block-sparse: the block mask materialized, [query block][key block]: 0 skipped, 1 partly
  // visible (the element rules apply), 2 fully visible. Empty: no block mask.
  std::vector<unsigned char> blocks;
  long kblocks = 0;
  std::vector<std::int32_t> doc_q, doc_k;  // document ids of the rows and keys; empty: none
  TensorView dense;                        // the block mask's dense element mask: [B, H, rows, cols]; absent: none
  std::int64_t dense_b = 0, dense_h = 0;   // this head's indices into its dims 0 and 1
  int prefix = 0;                          // prefix-LM: keys [0, prefix) seen by every row

  long diag(int i) const { return p->bottom_right ? static_cast<long>(i) + sk - sq : i; }
  // The element rules: window (causal folded in) unless the key lies in the prefix, the attention
  // chunk, the documents.
  bool element_visible(int i, int j) const {
    const bool in_prefix = j < prefix;
    if (!in_prefix && p->window_left >= 0 && j < diag(i) - p->window_left) return false;
    if (!in_prefix && p->window_right >= 0 && j > diag(i) + p->window_right) return false;
    if (p->chunk > 0 && std::floor(static_cast<double>(diag(i)) / p->chunk) != std::floor(static_cast<double>(j) / p->chunk))
      return false;
    if (!doc_q.empty() && doc_q[i] != doc_k[j]) return false;
    if (dense.present() && dense.ptr<const unsigned char>()[dense_b * dense.stride[0] + dense_h * dense.stride[1] +
                                                           i * dense.stride[2] + j * dense.stride[3]] == 0)
      return false;
    return true;
  }
  bool visible(int i, int j) const {
    if (blocks.empty()) return element_visible(i, j);
    const unsigned char state = blocks[(i / p->block_q) * kblocks + j / p->block_k];
    return state == 2 || (state == 1 && element_visible(i, j));
  }
  double capped(double qk) const {  // scale and softcap, before ALiBi
    double s = qk * p->scale;
    return p->softcap > 0 ? p->softcap * std::tanh(s / p->softcap) : s;
  }
  double alibi(int i, int j) const {
    const long at = p->alibi_diag_set ? static_cast<long>(i) + p->alibi_diag : diag(i);
    return -slope * std::abs(static_cast<double>(at - j));
  }
  double dot_qk(int i, int j) const {
    double s = 0;
    for (int c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
    return s;
  }
};

// Softmax probabilities P [sq, sk] (before dropout), their row lse, and qk = Q K^T.
void probabilities(const Head& h, const Rounder& r, std::vector<double>& P, std::vector<double>& qk,
                   std::vector<double>& lse) {
  P.assign(static_cast<std::size_t>(h.sq) * h.sk, 0.0);
  qk.assign(P.size(), 0.0);
  lse.assign(h.sq, kNegInf);
  for (int i = 0; i < h.sq; ++i) {
    double m = kNegInf;
    bool nan = false;
    for (int j = 0; j < h.sk; ++j) {
      qk[i * h.sk + j] = r(h.dot_qk(i, j));
      if (!h.visible(i, j)) continue;
      P[i * h.sk + j] = h.capped(qk[i * h.sk + j]) + h.alibi(i, j);
      nan = nan || std::isnan(P[i * h.sk + j]);
      m = std::max(m, P[i * h.sk + j]);
    }
    // A NaN score (a NaN or Inf input the row sees) makes the row's probabilities and lse NaN.
    if (nan) m = std::numeric_limits<double>::quiet_NaN();
    if (m == kNegInf) continue;  // no visible key (or every score -inf): P row stays 0, lse -inf
    double l = 0;
    for (int j = 0; j < h.sk; ++j)
      if (h.visible(i, j)) l += std::exp(P[i * h.sk + j] - m);
    for (int j = 0; j < h.sk; ++j)
      P[i * h.sk + j] = h.visible(i, j) ? r(std::exp(P[i * h.sk + j] - m) / l) : 0.0;
    lse[i] = m + std::log(l);
  }
}

// Dropout multiplier of element (i, j): 0 or 1/(1-p).
struct DropoutMul {
  Dropout gen;
  bool on = false;
  double keep_scale = 1.0;
  double operator()(std::uint32_t bh, int i, int j) const {
    if (!on) return 1.0;
    return gen.keep(bh, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(j)) ? keep_scale : 0.0;
  }
};

DropoutMul dropout_mul(const Problem& p, const Options& o) {
  return DropoutMul{Dropout(p.dropout_p, o.seed, o.offset), p.dropout_p > 0.f,
                    1.0 / (1.0 - static_cast<double>(p.dropout_p))};
}

// Forward of one head: O [sq, dv], lse [sq].
void attend(const Head& h, const Rounder& r, const DropoutMul& drop, std::vector<double>& O,
            std::vector<double>& lse) {
  std::vector<double> P, qk;
  probabilities(h, r, P, qk, lse);
  O.assign(static_cast<std::size_t>(h.sq) * h.dv, 0.0);
  for (int i = 0; i < h.sq; ++i)
    for (int j = 0; j < h.sk; ++j) {
      // Every visible key enters, even with probability 0 (underflow, dropout), as in a matrix
      // product: a NaN or Inf value of a key the row sees reaches its output.
      if (!h.visible(i, j)) continue;
      const double pij = P[i * h.sk + j] * drop(h.bh, i, j);
      for (int c = 0; c < h.dv; ++c) O[i * h.dv + c] += pij * h.v[j * h.dv + c];
    }
}

// Gathers rows [row0, row0 + n) of head hd into a dense [n, width] fp64 matrix.
std::vector<double> gather(const TensorView& t, bool varlen, int b, std::int64_t row0, int n,
                           int hd, int width) {
  std::vector<double> m(static_cast<std::size_t>(n) * width);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < width; ++c) m[i * width + c] = load_f32(t, elem(t, varlen, b, row0 + i, hd, c));
  return m;
}

// Sequence b's document ids, where the call has them.
void gather_documents(const Problem& p, const TensorView& ids_q, const TensorView& ids_k, int b, const Seq& s, Head& hd) {
  if (!p.documents) return;
  auto ids = [&](const TensorView& t, std::int64_t row0, int n) {
    std::vector<std::int32_t> v(n);
    for (int i = 0; i < n; ++i)
      v[i] = p.varlen ? t.ptr<const std::int32_t>()[(row0 + i) * t.stride[0]]
                      : t.ptr<const std::int32_t>()[b * t.stride[0] + i * t.stride[1]];
    return v;
  };
  hd.doc_q = ids(ids_q, s.q0, s.sq);
  hd.doc_k = ids(ids_k, s.k0, s.sk);
}

// Row (b, h) of a block mask as a dense table (see Head::blocks), and its dense element mask.
void materialize_blocks(const Problem& p, const BlockMask& m, int b, int h, Head& hd) {
  if (!m.present()) return;
  const long qblocks = (p.seqlen_q + p.block_q - 1) / p.block_q;
  hd.kblocks = (p.seqlen_k + p.block_k - 1) / p.block_k;
  hd.blocks.assign(static_cast<std::size_t>(qblocks * hd.kblocks), 0);
  const std::int64_t mb = m.kv_num_blocks.shape[0] == 1 ? 0 : b, mh = m.kv_num_blocks.shape[1] == 1 ? 0 : h;
  auto mark = [&](const TensorView& num, const TensorView& idx, unsigned char state) {
    for (long qb = 0; qb < qblocks; ++qb) {
      const std::int32_t n = num.ptr<const std::int32_t>()[mb * num.stride[0] + mh * num.stride[1] + qb * num.stride[2]];
      for (std::int32_t e = 0; e < n; ++e) {
        const std::int32_t kb = idx.ptr<const std::int32_t>()[mb * idx.stride[0] + mh * idx.stride[1] +
                                                              qb * idx.stride[2] + e * idx.stride[3]];
        hd.blocks[qb * hd.kblocks + kb] = state;
      }
    }
  };
  mark(m.kv_num_blocks, m.kv_indices, 1);
  if (m.full_kv_num_blocks.present()) mark(m.full_kv_num_blocks, m.full_kv_indices, 2);
  if (m.mask.present()) {
    hd.dense = m.mask;
    hd.dense_b = m.mask.shape[0] == 1 ? 0 : b;
    hd.dense_h = m.mask.shape[1] == 1 ? 0 : h;
  }
}

Head make_head(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& slopes, int b, int h, const Seq& s) {
  Head hd;
  hd.p = &p;
  hd.sq = s.sq;
  hd.sk = s.sk;
  hd.d = p.hdim_qk;
  hd.dv = p.hdim_v;
  hd.slope = alibi_slope(p, slopes, b, h);
  hd.bh = static_cast<std::uint32_t>(b * p.heads_q + h);
  hd.prefix = p.prefix_len;
  const int g = h / p.group();
  hd.q = gather(q, p.varlen, b, s.q0, s.sq, h, p.hdim_qk);
  hd.k = gather(k, p.varlen, b, s.k0, s.sk, g, p.hdim_qk);
  hd.v = gather(v, p.varlen, b, s.k0, s.sk, g, p.hdim_v);
  return hd;
}

void store_out(const Problem& p, const TensorView& out, const TensorView& lse, int b, int h,
               std::int64_t row0, const std::vector<double>& O, const std::vector<double>& L) {
  const int n = static_cast<int>(L.size());
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < p.hdim_v; ++c)
      store_f32(out, elem(out, p.varlen, b, row0 + i, h, c), static_cast<float>(O[i * p.hdim_v + c]));
    if (lse.present()) store_f32(lse, lse_elem(lse, p.varlen, b, row0 + i, h), static_cast<float>(L[i]));
  }
}

}  // namespace

void reference_forward(const Problem& p, const ForwardArgs& a, RefPrecision prec) {
  const Rounder r{p.dtype, prec == RefPrecision::input_dtype};
  const DropoutMul drop = dropout_mul(p, a.options);
  parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_q, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const int b = static_cast<int>(t / p.heads_q), h = static_cast<int>(t % p.heads_q);
      const Seq s = sequence(p, a.cu_seqlens_q, a.cu_seqlens_k, b);
      Head hd = make_head(p, a.q, a.k, a.v, a.alibi_slopes, b, h, s);
      materialize_blocks(p, a.block_mask, b, h, hd);
      gather_documents(p, a.document_ids_q, a.document_ids_k, b, s, hd);
      if (p.prefix_per_seq) hd.prefix = load_i32(a.prefix_lens, b);
      std::vector<double> O, L;
      attend(hd, r, drop, O, L);
      store_out(p, a.out, a.lse, b, h, s.q0, O, L);
    }
  });
  write_varlen_tails(p, a);
}

void reference_backward(const Problem& p, const BackwardArgs& a, RefPrecision prec) {
  const Rounder r{p.dtype, prec == RefPrecision::input_dtype};
  const DropoutMul drop = dropout_mul(p, a.options);
  // One task per (sequence, KV head): dK and dV sum over the query heads of the group.
  parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_kv, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const int b = static_cast<int>(t / p.heads_kv), g = static_cast<int>(t % p.heads_kv);
      const Seq s = sequence(p, a.cu_seqlens_q, a.cu_seqlens_k, b);
      std::vector<double> dK(static_cast<std::size_t>(s.sk) * p.hdim_qk, 0.0);
      std::vector<double> dV(static_cast<std::size_t>(s.sk) * p.hdim_v, 0.0);
      for (int h = g * p.group(); h < (g + 1) * p.group(); ++h) {
        Head hd = make_head(p, a.q, a.k, a.v, a.alibi_slopes, b, h, s);
        materialize_blocks(p, a.block_mask, b, h, hd);
        gather_documents(p, a.document_ids_q, a.document_ids_k, b, s, hd);
        if (p.prefix_per_seq) hd.prefix = load_i32(a.prefix_lens, b);
        const std::vector<double> dO = gather(a.dout, p.varlen, b, s.q0, s.sq, h, p.hdim_v);
        std::vector<double> P, qk, L;
        probabilities(hd, r, P, qk, L);
        std::vector<double> dQ(static_cast<std::size_t>(s.sq) * p.hdim_qk, 0.0);
        std::vector<double> dS(static_cast<std::size_t>(s.sk));
        for (int i = 0; i < s.sq; ++i) {
          double D = 0;
          for (int j = 0; j < s.sk; ++j) {
            const double mul = drop(hd.bh, i, j);
            const double pd = P[i * s.sk + j] * mul;
            double dpd = 0;  // dO_i . v_j
            for (int c = 0; c < p.hdim_v; ++c) {
              dV[j * p.hdim_v + c] += pd * dO[i * p.hdim_v + c];
              dpd += dO[i * p.hdim_v + c] * hd.v[j * p.hdim_v + c];
            }
            dS[j] = dpd * mul;  // dP_ij
            D += P[i * s.sk + j] * dS[j];
          }
          for (int j = 0; j < s.sk; ++j) {
            const double pij = P[i * s.sk + j];
            if (pij == 0) {
              dS[j] = 0;
              continue;
            }
            // d capped / d qk: scale, times (1 - tanh^2) under the softcap.
            double dmod = p.scale;
            if (p.softcap > 0) {
              const double t = std::tanh(qk[i * s.sk + j] * p.scale / p.softcap);
              dmod *= 1 - t * t;
            }
            dS[j] = r(pij * (dS[j] - D) * dmod);
          }
          for (int j = 0; j < s.sk; ++j) {
            if (dS[j] == 0) continue;
            for (int c = 0; c < p.hdim_qk; ++c) {
              dQ[i * p.hdim_qk + c] += dS[j] * hd.k[j * p.hdim_qk + c];
              dK[j * p.hdim_qk + c] += dS[j] * hd.q[i * p.hdim_qk + c];
            }
          }
        }
        for (int i = 0; i < s.sq; ++i)
          for (int c = 0; c < p.hdim_qk; ++c)
            store_f32(a.dq, elem(a.dq, p.varlen, b, s.q0 + i, h, c), static_cast<float>(dQ[i * p.hdim_qk + c]));
      }
      for (int j = 0; j < s.sk; ++j) {
        for (int c = 0; c < p.hdim_qk; ++c)
          store_f32(a.dk, elem(a.dk, p.varlen, b, s.k0 + j, g, c), static_cast<float>(dK[j * p.hdim_qk + c]));
        for (int c = 0; c < p.hdim_v; ++c)
          store_f32(a.dv, elem(a.dv, p.varlen, b, s.k0 + j, g, c), static_cast<float>(dV[j * p.hdim_v + c]));
      }
    }
  });
  write_varlen_tails(p, a);
}

void reference_decode(const Problem& p, const DecodeArgs& a, RefPrecision prec) {
  const Rounder r{p.dtype, prec == RefPrecision::input_dtype};
  const DropoutMul none{};
  // Element offset of cache row pos of sequence b, KV head g.
  auto cache_elem = [&](const TensorView& c, int b, int pos, int g, int col) -> std::int64_t {
    if (!p.paged) return elem(c, false, b, pos, g, col);
    const std::int64_t page = a.page_table.ptr<const std::int32_t>()[b * a.page_table.stride[0] +
                                                                       (pos / p.page_size) * a.page_table.stride[1]];
    return elem(c, false, static_cast<int>(page), pos % p.page_size, g, col);
  };
  auto cache_len = [&](int b) {
    return a.cache_seqlens.present() ? static_cast<int>(load_i32(a.cache_seqlens, b)) : p.seqlen_k;
  };
  // Rotary embedding of x [hdim_qk] at position pos, on its first rotary_dim features.
  auto rotate = [&](std::vector<double>& x, int pos) {
    const int half = p.rotary_dim / 2;
    for (int c = 0; c < half; ++c) {
      const double cs = load_f32(a.rotary_cos, pos * a.rotary_cos.stride[0] + c);
      const double sn = load_f32(a.rotary_sin, pos * a.rotary_sin.stride[0] + c);
      const int i0 = a.rotary_interleaved ? 2 * c : c, i1 = a.rotary_interleaved ? 2 * c + 1 : c + half;
      const double x0 = x[i0], x1 = x[i1];
      x[i0] = r(x0 * cs - x1 * sn);
      x[i1] = r(x1 * cs + x0 * sn);
    }
  };
  // Append first (the call's contract), then attend over the grown cache.
  for (int b = 0; b < p.batch; ++b)
    for (int n = 0; n < p.seqlen_new; ++n)
      for (int g = 0; g < p.heads_kv; ++g) {
        const int pos = cache_len(b) + n;
        std::vector<double> kn = gather(a.k_new, false, b, n, 1, g, p.hdim_qk);
        if (p.rotary_dim) rotate(kn, pos);
        for (int c = 0; c < p.hdim_qk; ++c)
          store_f32(a.k_cache, cache_elem(a.k_cache, b, pos, g, c), static_cast<float>(kn[c]));
        for (int c = 0; c < p.hdim_v; ++c)
          store_f32(a.v_cache, cache_elem(a.v_cache, b, pos, g, c), load_f32(a.v_new, elem(a.v_new, false, b, n, g, c)));
      }
  parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_q, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const int b = static_cast<int>(t / p.heads_q), h = static_cast<int>(t % p.heads_q);
      const int g = h / p.group();
      Head hd;
      hd.p = &p;
      hd.sq = p.seqlen_q;
      hd.sk = cache_len(b) + p.seqlen_new;
      hd.d = p.hdim_qk;
      hd.dv = p.hdim_v;
      hd.slope = alibi_slope(p, a.alibi_slopes, b, h);
      hd.prefix = p.prefix_len;
      hd.q = gather(a.q, false, b, 0, hd.sq, h, hd.d);
      if (p.rotary_dim) {
        for (int i = 0; i < hd.sq; ++i) {
          std::vector<double> row(hd.q.begin() + i * hd.d, hd.q.begin() + (i + 1) * hd.d);
          rotate(row, cache_len(b) + (p.rotary_per_row ? i : 0));
          std::copy(row.begin(), row.end(), hd.q.begin() + i * hd.d);
        }
      }
      hd.k.resize(static_cast<std::size_t>(hd.sk) * hd.d);
      hd.v.resize(static_cast<std::size_t>(hd.sk) * hd.dv);
      for (int j = 0; j < hd.sk; ++j) {
        for (int c = 0; c < hd.d; ++c) hd.k[j * hd.d + c] = load_f32(a.k_cache, cache_elem(a.k_cache, b, j, g, c));
        for (int c = 0; c < hd.dv; ++c) hd.v[j * hd.dv + c] = load_f32(a.v_cache, cache_elem(a.v_cache, b, j, g, c));
      }
      std::vector<double> O, L;
      attend(hd, r, none, O, L);
      store_out(p, a.out, a.lse, b, h, 0, O, L);
    }
  });
}

void reference_forward(const Problem& p, const ForwardArgs& a) { reference_forward(p, a, RefPrecision::f64); }
void reference_backward(const Problem& p, const BackwardArgs& a) { reference_backward(p, a, RefPrecision::f64); }
void reference_decode(const Problem& p, const DecodeArgs& a) { reference_decode(p, a, RefPrecision::f64); }

}  // namespace tileattn::cpu
