// The validated problem: every derived scalar of a call, resolved once in the core and handed to a
// backend together with the caller's argument struct. Backends trust it and never re-validate.
#pragma once

#include "common/mask.hpp"
#include "common/philox.hpp"
#include "common/score_mod.hpp"
#include "common/variant.hpp"
#include "tileattn/attention.hpp"

namespace tileattn {

struct Problem {
  Backend backend = Backend::cpu_flash;  // resolved: never automatic
  DType dtype = DType::f32;              // of q, k, v, out (and dout, dq, dk, dv)
  int batch = 0, heads_q = 0, heads_kv = 0, hdim_qk = 0, hdim_v = 0;
  // Batched: the lengths. Varlen: the caller's max_seqlen bounds. Decode: seqlen_q is the query
  // rows per sequence and seqlen_k the cache capacity per sequence.
  int seqlen_q = 0, seqlen_k = 0;
  bool varlen = false;
  float scale = 1.f;
  bool bottom_right = true;
  int window_left = -1, window_right = -1;  // causal folded in: window_right = 0
  int chunk = 0;                            // chunked-local attention; 0 = off
  float softcap = 0.f;
  float dropout_p = 0.f;
  bool has_alibi = false;
  bool alibi_per_batch = false;  // slopes [batch, heads_q] rather than [heads_q]
  bool alibi_diag_set = false;    // Options::alibi_diagonal given: alibi_diag, not the causal diagonal
  int alibi_diag = 0;
  bool documents = false;  // forward/backward: document ids given
  // Prefix-LM: keys [0, prefix_len) visible to every row; per sequence from the call's prefix_lens
  // where prefix_per_seq (forward and backward).
  int prefix_len = 0;
  bool prefix_per_seq = false;
  // Block-sparse (forward and backward): the block mask's block sizes; 0 = no block mask.
  int block_q = 0, block_k = 0;
  bool dense_mask = false;  // the block mask has a dense element mask for its partial blocks
  // Decode only.
  bool paged = false;
  int page_size = 0;
  // The most keys any sequence attends (its cache length plus the appended rows) where the host
  // holds cache_seqlens, else the capacity: split counts and scratch are bounded by it.
  int decode_keys = 0;
  int seqlen_new = 0;  // rows appended to the cache before attending
  int rotary_dim = 0;  // 0 = no rotary embedding
  bool rotary_per_row = false;  // query row i at cache length + i (causal or windowed call)

  int group() const { return heads_q / heads_kv; }
  int hdim() const { return hdim_qk > hdim_v ? hdim_qk : hdim_v; }  // the larger head dim: what a kernel must hold
  Mask mask(int sq, int sk) const {
    return Mask(sq, sk, bottom_right, window_left, window_right).with_alibi_diag(alibi_diag_set, alibi_diag);
  }
  ScoreMod score_mod(float alibi_slope) const { return ScoreMod{scale, softcap, alibi_slope}; }
  Dropout dropout(const Options& o) const { return Dropout(dropout_p, o.seed, o.offset); }
  bool block_sparse() const { return block_q > 0; }
  bool prefix_lm() const { return prefix_len > 0 || prefix_per_seq; }
  // The variant of one sequence of sq query rows and sk keys; ALiBi's slope is set per head.
  Variant variant(int sq, int sk, const Options& o) const {
    Variant v;
    v.mask = mask(sq, sk);
    v.chunk = chunk;
    v.score = score_mod(0.f);
    v.alibi = has_alibi;
    v.dropout = dropout_p > 0.f;
    v.drop = dropout(o);
    v.prefix = prefix_len;
    return v;
  }
};

Problem validate(const ForwardArgs& a);
Problem validate(const BackwardArgs& a);
Problem validate(const DecodeArgs& a);
Problem validate(const CombineArgs& a);

}  // namespace tileattn
