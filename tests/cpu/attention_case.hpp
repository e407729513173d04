// Random attention problems for the flash-vs-reference sweeps: a configuration drawn from a seed,
// its host tensors, and the argument structs that point at them.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/host_tensor.hpp"
#include "tileattn/attention.hpp"

namespace tileattn::test {

// A block-sparse mask of a case: the state of every (mask batch, mask head, query block, key
// block), 0 skipped, 1 partly visible, 2 fully visible. block_q == 0: no block mask.
struct SparseSpec {
  int block_q = 0, block_k = 0;
  int batches = 1, heads = 1, qblocks = 0, kblocks = 0;
  bool full_lists = true;  // fully visible blocks listed as such (else there are none)
  std::string pattern;
  std::vector<unsigned char> state;  // [batches][heads][qblocks][kblocks]

  unsigned char& at(int b, int h, int q, int k) {
    return state[((static_cast<std::size_t>(b) * heads + h) * qblocks + q) * kblocks + k];
  }
};

// A block mask's dense element mask (BlockMask::mask) of a case: u8 [batches, heads, rows, cols]
// stored in `order` (a permutation of the dims: the mask takes any strides), or with rows
// broadcast (one row in memory, stride 0). Each mask row is all False with probability p_empty,
// else True with probability density, and blocks of the block mask are made all True with
// probability p_true_block (partial blocks whose test passes everywhere). batches == 0: none.
struct DenseSpec {
  int batches = 0, heads = 0, rows = 0, cols = 0;
  std::vector<int> order;
  bool rows_broadcast = false;
  double density = 0.5, p_empty = 0.0, p_true_block = 0.0;
};

struct Case {
  DType dtype = DType::f32;
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, hdim = 8, hdim_v = 8;
  bool varlen = false, bhsd = false, alibi = false, alibi_per_batch = false;
  bool documents = false;  // document ids: runs of random lengths, or (unsorted) random small ids
  std::vector<int> lens_q, lens_k;  // varlen: per-sequence lengths (seqlen_q/k = their maxima)
  std::vector<int> prefix_lens;     // prefix-LM per sequence (ForwardArgs::prefix_lens); empty: none
  Options options;
  SparseSpec sparse;
  DenseSpec dense;

  std::string str() const {
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << " batch=" << batch << " heads=" << heads_q << "/" << heads_kv
       << " seqlen=" << seqlen_q << "x" << seqlen_k << " hdim=" << hdim << "/" << hdim_v
       << (varlen ? " varlen" : "") << (bhsd ? " bhsd" : "") << (options.causal ? " causal" : "")
       << (options.align == MaskAlign::top_left ? " top_left" : "") << " window=(" << options.window_left << ","
       << options.window_right << ") softcap=" << options.softcap << (alibi ? " alibi" : "")
       << (alibi_per_batch ? "/batch" : "") << " dropout=" << options.dropout_p;
    if (options.alibi_diagonal) os << " alibi_diagonal=" << *options.alibi_diagonal;
    if (options.chunk_size) os << " chunk=" << options.chunk_size;
    if (documents) os << " documents";
    if (options.prefix_len) os << " prefix=" << options.prefix_len;
    if (!prefix_lens.empty()) {
      os << " prefix_lens=";
      for (int l : prefix_lens) os << l << ",";
    }
    if (sparse.block_q)
      os << " block_mask=" << sparse.pattern << " " << sparse.block_q << "x" << sparse.block_k << " dims=" << sparse.batches
         << "," << sparse.heads << (sparse.full_lists ? "" : " no-full-lists");
    if (dense.batches)
      os << " dense_mask=" << dense.batches << "," << dense.heads << "," << dense.rows << "," << dense.cols << " order="
         << (dense.order.empty() ? 0 : dense.order[0]) << (dense.order.empty() ? 1 : dense.order[1])
         << (dense.order.empty() ? 2 : dense.order[2]) << (dense.order.empty() ? 3 : dense.order[3])
         << (dense.rows_broadcast ? " rows-broadcast" : "") << " density=" << dense.density << " empty=" << dense.p_empty
         << " true_blocks=" << dense.p_true_block;
    if (options.scale) os << " scale=" << *options.scale;
    if (varlen) {
      os << " lens_q=";
      for (int l : lens_q) os << l << ",";
      os << " lens_k=";
      for (int l : lens_k) os << l << ",";
    }
    return os.str();
  }
};

inline Case random_case(std::mt19937_64& rng, int max_len = 140) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  Case c;
  c.dtype = std::vector<DType>{DType::f32, DType::f16, DType::bf16}[uni(0, 2)];
  c.batch = uni(1, 3);
  c.heads_kv = uni(1, 3);
  c.heads_q = c.heads_kv * std::vector<int>{1, 1, 2, 3, 4}[uni(0, 4)];
  auto len = [&] {
    const int kind = uni(0, 9);
    return kind == 0 ? 1 : kind == 1 ? uni(60, 70) : uni(1, max_len);
  };
  c.seqlen_q = len();
  c.seqlen_k = coin(0.3) ? c.seqlen_q : len();
  // Head dims: mostly small (the oracle is O(N^2 d)), every multiple of 8 up to 256 reachable.
  c.hdim = coin(0.8) ? 8 * uni(1, 12) : 8 * uni(13, 32);
  c.hdim_v = coin(0.6) ? c.hdim : 8 * uni(1, 16);
  if (c.hdim > 128 || c.hdim_v > 128) {
    c.seqlen_q = std::min(c.seqlen_q, 80);
    c.seqlen_k = std::min(c.seqlen_k, 80);
  }
  c.varlen = coin(0.25);
  c.bhsd = !c.varlen && coin(0.3);
  if (c.varlen) {
    for (int b = 0; b < c.batch; ++b) {
      c.lens_q.push_back(coin(0.15) ? 0 : uni(0, c.seqlen_q));
      c.lens_k.push_back(coin(0.15) ? 0 : uni(0, c.seqlen_k));
    }
    c.seqlen_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
    c.seqlen_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  }
  Options& o = c.options;
  o.backend = Backend::cpu_flash;
  o.causal = coin(0.35);
  o.align = coin(0.5) ? MaskAlign::bottom_right : MaskAlign::top_left;
  if (coin(0.2)) {
    o.window_left = uni(0, std::max(1, c.seqlen_k));
    if (!o.causal) o.window_right = coin(0.5) ? -1 : uni(0, std::max(1, c.seqlen_k));
  }
  if (coin(0.2)) o.softcap = std::uniform_real_distribution<float>(2.f, 30.f)(rng);
  if (coin(0.2)) {
    c.alibi = true;
    c.alibi_per_batch = coin(0.3);
    // ALiBi measured from another diagonal, as for a block of a longer sequence.
    if (coin(0.4)) o.alibi_diagonal = uni(-c.seqlen_q - 3, c.seqlen_k + 3);
  }
  if (coin(0.15)) {
    o.dropout_p = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
    o.seed = rng();
    o.offset = rng();
  }
  if (coin(0.15)) o.scale = std::uniform_real_distribution<float>(0.02f, 0.4f)(rng);
  if (coin(0.15)) o.chunk_size = coin(0.3) ? uni(1, 8) : uni(1, std::max(1, c.seqlen_k + 4));
  c.documents = coin(0.12);
  return c;
}

// Gives a case a random block mask: block sizes drawn from `sizes` (by default multiples of 16, 48
// and 80 among them: key blocks that do not start on a multiple of 32 or of the CPU tiles), the
// mask's batch and head dims full or 1, and a pattern: random blocks at a random density, all full,
// all partial, one block, whole query-block rows empty, or causal as blocks (full below the
// diagonal, partial on it).
inline void add_random_block_mask(Case& c, std::mt19937_64& rng,
                                  const std::vector<int>& sizes = {16, 32, 48, 64, 80, 128}) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  SparseSpec& m = c.sparse;
  const int last = static_cast<int>(sizes.size()) - 1;
  m.block_q = sizes[uni(0, last)];
  m.block_k = sizes[uni(0, last)];
  m.batches = coin(0.5) ? 1 : c.batch;
  m.heads = coin(0.5) ? 1 : c.heads_q;
  m.qblocks = (c.seqlen_q + m.block_q - 1) / m.block_q + (coin(0.2) ? 1 : 0);  // extra rows are ignored
  m.kblocks = (c.seqlen_k + m.block_k - 1) / m.block_k;
  m.full_lists = coin(0.8);
  m.state.assign(static_cast<std::size_t>(m.batches) * m.heads * m.qblocks * m.kblocks, 0);
  const int kind = uni(0, 6);
  const double density = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  m.pattern = std::vector<std::string>{"random", "random", "all-full", "all-partial", "one-block", "empty-rows",
                                       "causal-blocks"}[kind];
  for (int b = 0; b < m.batches; ++b)
    for (int h = 0; h < m.heads; ++h)
      for (int q = 0; q < m.qblocks; ++q) {
        const bool empty_row = kind == 5 && coin(0.5);
        for (int k = 0; k < m.kblocks; ++k) {
          unsigned char st = 0;
          switch (kind) {
            case 2: st = 2; break;
            case 3: st = 1; break;
            case 4: st = (q == 0 && k == 0) ? static_cast<unsigned char>(uni(1, 2)) : 0; break;
            case 6: {
              // Block (q, k) against the top-left causal diagonal of its rows and keys.
              const int r0 = q * m.block_q, r1 = r0 + m.block_q - 1, k0 = k * m.block_k, k1 = k0 + m.block_k - 1;
              st = k1 <= r0 ? 2 : k0 <= r1 ? 1 : 0;
              break;
            }
            default: st = empty_row ? 0 : coin(density) ? static_cast<unsigned char>(uni(1, 2)) : 0;
          }
          m.at(b, h, q, k) = m.full_lists ? st : (st ? 1 : 0);
        }
      }
  if (kind == 6) {
    c.options.causal = true;
    c.options.window_right = -1;
    c.options.align = MaskAlign::top_left;
  }
}

// Gives a case with a block mask a random dense element mask (DenseSpec): batch and head dims 1 or
// full, random storage orders, varlen masks a few rows and columns longer than the longest sequence.
inline void add_random_dense_mask(Case& c, std::mt19937_64& rng) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  DenseSpec& d = c.dense;
  d.batches = coin(0.5) ? 1 : c.batch;
  d.heads = coin(0.5) ? 1 : c.heads_q;
  d.rows = c.seqlen_q + (c.varlen ? uni(0, 3) : 0);
  d.cols = c.seqlen_k + (c.varlen ? uni(0, 3) : 0);
  static const std::vector<std::vector<int>> orders = {{}, {}, {0, 1, 3, 2}, {1, 0, 2, 3}, {3, 2, 1, 0}};
  d.order = orders[uni(0, static_cast<int>(orders.size()) - 1)];
  d.rows_broadcast = coin(0.1);
  d.density = std::uniform_real_distribution<double>(0.05, 0.95)(rng);
  d.p_empty = coin(0.5) ? 0.0 : 0.2;
  d.p_true_block = coin(0.5) ? 0.0 : 0.3;
}

// Turns a case into prefix-LM: causal (or a right window) beyond a prefix of random length (0, a
// few keys, past every key), per call or per sequence; no left window or chunks, which prefix-LM
// does not combine with.
inline void add_prefix_lm(Case& c, std::mt19937_64& rng) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Options& o = c.options;
  o.window_left = -1;
  o.chunk_size = 0;
  if (!o.causal && o.window_right < 0) {
    if (uni(0, 3) == 0)
      o.window_right = uni(0, 5);
    else
      o.causal = true;
  }
  auto length = [&] {
    const int kind = uni(0, 5);
    return kind == 0 ? 0 : kind == 1 ? c.seqlen_k + uni(0, 3) : uni(1, std::max(1, c.seqlen_k));
  };
  if (uni(0, 1)) {
    o.prefix_len = std::max(1, length());
  } else {
    for (int b = 0; b < c.batch; ++b) c.prefix_lens.push_back(length());
  }
}

// A random case in bf16 at the head dims models use (over up to max_len keys, several tiles): on a
// CPU with AMX these take the tile-unit paths.
inline Case random_bf16_model_case(std::mt19937_64& rng, int max_len) {
  Case c = random_case(rng, max_len);
  c.dtype = DType::bf16;
  c.hdim = std::vector<int>{32, 64, 64, 96, 128, 128, 256}[std::uniform_int_distribution<int>(0, 6)(rng)];
  if (std::bernoulli_distribution(0.7)(rng)) c.hdim_v = c.hdim;
  return c;
}

// Host tensors of one case, filled with N(0, 1) inputs (slopes in (0, 0.5)).
struct CaseTensors {
  HostTensor q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k, slopes;
  HostTensor kv_num, kv_idx, full_num, full_idx;  // the block mask, when the case has one
  HostTensor doc_q, doc_k;                        // document ids, when the case has them
  HostTensor prefix;                              // prefix-LM lengths per sequence, when the case has them
  HostTensor dense;                               // the block mask's dense element mask, when the case has one

  explicit CaseTensors(const Case& c, std::mt19937_64& rng) {
    const DType t = c.dtype;
    const std::vector<int> order = c.bhsd ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{};
    if (c.varlen) {
      std::vector<std::int32_t> cq{0}, ck{0};
      for (int b = 0; b < c.batch; ++b) {
        cq.push_back(cq.back() + c.lens_q[b]);
        ck.push_back(ck.back() + c.lens_k[b]);
      }
      const std::int64_t tq = cq.back(), tk = ck.back();
      q = HostTensor(t, {tq, c.heads_q, c.hdim});
      k = HostTensor(t, {tk, c.heads_kv, c.hdim});
      v = HostTensor(t, {tk, c.heads_kv, c.hdim_v});
      out = HostTensor(t, {tq, c.heads_q, c.hdim_v});
      lse = HostTensor(DType::f32, {c.heads_q, tq});
      cu_q = int_tensor(cq);
      cu_k = int_tensor(ck);
    } else {
      q = HostTensor(t, {c.batch, c.seqlen_q, c.heads_q, c.hdim}, order);
      k = HostTensor(t, {c.batch, c.seqlen_k, c.heads_kv, c.hdim}, order);
      v = HostTensor(t, {c.batch, c.seqlen_k, c.heads_kv, c.hdim_v}, order);
      out = HostTensor(t, {c.batch, c.seqlen_q, c.heads_q, c.hdim_v}, order);
      lse = HostTensor(DType::f32, {c.batch, c.heads_q, c.seqlen_q});
    }
    dout = HostTensor(t, out.shape(), c.varlen ? std::vector<int>{} : order);
    dq = HostTensor(t, q.shape(), c.varlen ? std::vector<int>{} : order);
    dk = HostTensor(t, k.shape(), c.varlen ? std::vector<int>{} : order);
    dv = HostTensor(t, v.shape(), c.varlen ? std::vector<int>{} : order);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    dout.fill_normal(rng);
    if (c.alibi) {
      slopes = c.alibi_per_batch ? HostTensor(DType::f32, {c.batch, c.heads_q}) : HostTensor(DType::f32, {c.heads_q});
      std::uniform_real_distribution<double> u(0.0, 0.5);
      for (std::int64_t i = 0; i < slopes.numel(); ++i) slopes.set(i, u(rng));
    }
    if (c.sparse.block_q) block_mask_tensors(c.sparse, rng);
    if (c.dense.batches) dense_mask_tensor(c, rng);
    if (c.documents) document_tensors(c, rng);
    if (!c.prefix_lens.empty()) prefix = int_tensor(std::vector<std::int32_t>(c.prefix_lens.begin(), c.prefix_lens.end()));
  }

  // Per sequence, ids in runs of random lengths (packed documents) or, a third of the time, random
  // ids from {0, 1, 2} (any equality pattern).
  void document_tensors(const Case& c, std::mt19937_64& rng) {
    auto ids = [&](int len) {
      std::vector<int> v(len);
      const bool runs = std::bernoulli_distribution(0.67)(rng);
      int id = 0;
      for (int i = 0; i < len; ++i) {
        if (runs) {
          if (i > 0 && std::bernoulli_distribution(0.06)(rng)) ++id;
          v[i] = id;
        } else {
          v[i] = std::uniform_int_distribution<int>(0, 2)(rng);
        }
      }
      return v;
    };
    auto fill = [&](HostTensor& t, const std::vector<int>& lens, int len) {
      if (c.varlen) {
        std::int64_t total = 0;
        for (int l : lens) total += l;
        t = HostTensor(DType::i32, {total});
        std::int64_t at = 0;
        for (int l : lens)
          for (int x : ids(l)) t.set(at++, x);
      } else {
        t = HostTensor(DType::i32, {c.batch, len});
        for (int b = 0; b < c.batch; ++b) {
          const std::vector<int> v = ids(len);
          for (int i = 0; i < len; ++i) t.set(static_cast<std::int64_t>(b) * len + i, v[i]);
        }
      }
    };
    fill(doc_q, c.lens_q, c.seqlen_q);
    fill(doc_k, c.lens_k, c.seqlen_k);
  }

  // The block lists of a SparseSpec, each row's blocks in random order, the entries past a row's
  // count filled with junk (never read).
  void block_mask_tensors(SparseSpec m, std::mt19937_64& rng) {
    const std::int64_t B = m.batches, H = m.heads, Q = m.qblocks;
    auto lists = [&](unsigned char want, HostTensor& num, HostTensor& idx) {
      std::vector<std::vector<int>> rows;
      std::size_t width = 0;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int q = 0; q < Q; ++q) {
            std::vector<int> r;
            for (int k = 0; k < m.kblocks; ++k)
              if (m.at(b, h, q, k) == want) r.push_back(k);
            std::shuffle(r.begin(), r.end(), rng);
            width = std::max(width, r.size());
            rows.push_back(r);
          }
      width += std::uniform_int_distribution<int>(0, 2)(rng);
      num = HostTensor(DType::i32, {B, H, Q});
      idx = HostTensor(DType::i32, {B, H, Q, static_cast<std::int64_t>(width)});
      for (std::size_t r = 0; r < rows.size(); ++r) {
        num.set(static_cast<std::int64_t>(r), static_cast<double>(rows[r].size()));
        for (std::size_t e = 0; e < width; ++e)
          idx.set(static_cast<std::int64_t>(r * width + e), e < rows[r].size() ? rows[r][e] : -7 - static_cast<int>(e));
      }
    };
    lists(1, kv_num, kv_idx);
    if (m.full_lists) lists(2, full_num, full_idx);
  }

  // DenseSpec's mask: rows_broadcast stores one row (the view repeats it with stride 0).
  void dense_mask_tensor(const Case& c, std::mt19937_64& rng) {
    const DenseSpec& d = c.dense;
    const int rows = d.rows_broadcast ? 1 : d.rows;
    dense = HostTensor(DType::u8, {d.batches, d.heads, rows, d.cols}, d.order);
    std::bernoulli_distribution on(d.density), empty(d.p_empty), whole(d.p_true_block);
    const int bq = std::max(1, c.sparse.block_q), bk = std::max(1, c.sparse.block_k);
    for (int b = 0; b < d.batches; ++b)
      for (int h = 0; h < d.heads; ++h) {
        const std::int64_t base = (static_cast<std::int64_t>(b) * d.heads + h) * rows * d.cols;
        for (int i = 0; i < rows; ++i) {
          const bool none = empty(rng);
          for (int j = 0; j < d.cols; ++j) dense.set(base + static_cast<std::int64_t>(i) * d.cols + j, !none && on(rng));
        }
        for (int q0 = 0; q0 < rows; q0 += bq)
          for (int k0 = 0; k0 < d.cols; k0 += bk) {
            if (!whole(rng)) continue;
            for (int i = q0; i < std::min(rows, q0 + bq); ++i)
              for (int j = k0; j < std::min(d.cols, k0 + bk); ++j) dense.set(base + static_cast<std::int64_t>(i) * d.cols + j, 1);
          }
      }
  }

  // v (dense's view, or a device copy's) as the case's mask: rows repeated where rows_broadcast.
  static TensorView dense_view(const Case& c, TensorView v) {
    if (c.dense.rows_broadcast) {
      v.shape[2] = c.dense.rows;
      v.stride[2] = 0;
    }
    return v;
  }

  BlockMask block_mask(const Case& c) const {
    BlockMask m;
    if (!c.sparse.block_q) return m;
    if (c.dense.batches) m.mask = dense_view(c, dense.view());
    m.kv_num_blocks = kv_num.view();
    m.kv_indices = kv_idx.view();
    if (c.sparse.full_lists) {
      m.full_kv_num_blocks = full_num.view();
      m.full_kv_indices = full_idx.view();
    }
    m.block_q = c.sparse.block_q;
    m.block_k = c.sparse.block_k;
    return m;
  }

  ForwardArgs forward(const Case& c) const {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    if (c.varlen) {
      a.cu_seqlens_q = cu_q.view();
      a.cu_seqlens_k = cu_k.view();
      a.max_seqlen_q = c.seqlen_q;
      a.max_seqlen_k = c.seqlen_k;
    }
    if (c.alibi) a.alibi_slopes = slopes.view();
    a.block_mask = block_mask(c);
    if (c.documents) {
      a.document_ids_q = doc_q.view();
      a.document_ids_k = doc_k.view();
    }
    if (!c.prefix_lens.empty()) a.prefix_lens = prefix.view();
    a.options = c.options;
    return a;
  }

  BackwardArgs backward(const Case& c) const {
    const ForwardArgs f = forward(c);
    BackwardArgs a;
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.out = f.out;
    a.lse = f.lse;
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.cu_seqlens_q = f.cu_seqlens_q;
    a.cu_seqlens_k = f.cu_seqlens_k;
    a.max_seqlen_q = f.max_seqlen_q;
    a.max_seqlen_k = f.max_seqlen_k;
    a.alibi_slopes = f.alibi_slopes;
    a.block_mask = f.block_mask;
    a.document_ids_q = f.document_ids_q;
    a.document_ids_k = f.document_ids_k;
    a.prefix_lens = f.prefix_lens;
    a.options = c.options;
    return a;
  }
};

struct Grads {
  std::vector<double> dq, dk, dv;
};

// Keys past the last sequence of a packed batch belong to no sequence; neither backend writes
// their gradients, so they are left out of the comparison.
inline std::vector<double> used_rows(const Case& c, const std::vector<double>& x, std::int64_t row_elems) {
  if (!c.varlen) return x;
  std::int64_t n = 0;
  for (int l : c.lens_k) n += l;
  return std::vector<double>(x.begin(), x.begin() + n * row_elems);
}

// f32 paths: l2 error relative to the oracle's norm, or to an entry size of 1e-2 where the oracle is
// nearly zero (a gradient that cancels exactly leaves only rounding noise).
inline double f32_error(const std::vector<double>& x, const std::vector<double>& ref) {
  if (ref.empty()) return 0;
  double norm = 0;
  for (double r : ref)
    if (std::isfinite(r)) norm += r * r;
  const double floor = 1e-2 * std::sqrt(static_cast<double>(ref.size()));
  return rel_error(x, ref) * std::max(std::sqrt(norm), 1e-30) / std::max(std::sqrt(norm), floor);
}

// Unit roundoff of a dtype.
inline double unit_roundoff(DType t) {
  return t == DType::bf16 ? 1.0 / 256 : t == DType::f16 ? 1.0 / 2048 : 1.0 / (1 << 24);
}

// The absolute floor of the tolerance rule: one ulp of the dtype at the oracle's magnitude (the
// oracle is stored in the dtype too, so a correctly rounded result may sit one ulp off it), plus
// `extra` for errors the algorithm cannot avoid (see backward_floor).
inline double rule_floor(DType t, const std::vector<double>& oracle, double extra = 0) {
  double m = 0;
  for (double x : oracle)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return 2 * unit_roundoff(t) * std::max(m, 1e-3) + extra;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

// The backward takes D = rowsum(dO * O) from the stored O (FlashAttention's definition), so O's
// rounding to the dtype, and the fp32 summation order of dO.O against dO.V, move every dS_ij by
// P_ij * dD_i, which the same-precision baseline (D = rowsum(P * dP)) never sees. Where the
// gradient cancels (a row with a single visible key) that is all that is left. Bound on |dD_i|
// times the largest factor each gradient multiplies it by.
struct BackwardFloors {
  double dq = 0, dk = 0;
};
inline BackwardFloors backward_floors(const Case& c, const CaseTensors& t) {
  const std::vector<double> o = t.out.to_f64(), dout = t.dout.to_f64();
  double g = 0;
  for (std::size_t r = 0; r + c.hdim_v <= o.size(); r += c.hdim_v) {
    double s = 0;
    for (int col = 0; col < c.hdim_v; ++col) s += std::abs(o[r + col] * dout[r + col]);
    g = std::max(g, s);
  }
  g *= unit_roundoff(c.dtype) + c.hdim_v * unit_roundoff(DType::f32);
  const double scale = c.options.scale ? *c.options.scale : 1.0 / std::sqrt(static_cast<double>(c.hdim));
  const double rows = std::sqrt(static_cast<double>(std::max(c.seqlen_q, 1))) * (c.heads_q / c.heads_kv);
  const double keep = c.options.dropout_p > 0 ? 1.0 / (1.0 - c.options.dropout_p) : 1.0;
  return {keep * g * scale * max_abs(t.k.to_f64()), keep * g * scale * max_abs(t.q.to_f64()) * rows};
}

// f32: within 1e-5 relative, or, where the result cancels to near zero and only rounding noise is
// left, by the tolerance rule against fp32 standard attention. f16/bf16: by the tolerance rule.
// baseline() runs the same-precision standard attention; it is called only when needed.
template <class Baseline>
::testing::AssertionResult close_to_oracle(DType dtype, const std::vector<double>& x, const std::vector<double>& oracle,
                                           Baseline baseline, double extra_floor = 0) {
  std::ostringstream os;
  if (dtype == DType::f32) {
    const double e = f32_error(x, oracle);
    if (e <= 1e-5) return ::testing::AssertionSuccess();
    os << "rel l2 error " << e << "; ";
  }
  const RuleResult r = check_rule(x, baseline(), oracle, rule_floor(dtype, oracle, extra_floor));
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << os.str() << r.message;
}

}  // namespace tileattn::test
