// The entry points: forward, backward, KV-cache decode and the LSE combine.
//
// Layouts (element strides are free except a contiguous last dimension):
//   batched  q [batch, seqlen_q, heads_q, hdim_qk], k [batch, seqlen_k, heads_kv, hdim_qk],
//            v [batch, seqlen_k, heads_kv, hdim_v], out [batch, seqlen_q, heads_q, hdim_v],
//            lse [batch, heads_q, seqlen_q] (fp32)
//   varlen   q [total_q, heads_q, hdim_qk] ... with cu_seqlens_q/k int32 [batch + 1] prefix sums,
//            lse [heads_q, total_q]
// heads_q % heads_kv == 0; query head h reads KV head h / (heads_q / heads_kv).
// A query row that sees no key gets out = 0 and lse = -inf.
#pragma once

#include <cstddef>
#include <functional>

#include "tileattn/options.hpp"
#include "tileattn/tensor.hpp"

namespace tileattn {

// Block-sparse attention, in the shape of PyTorch FlexAttention's BlockMask. The query rows of a
// sequence are cut into blocks of block_q rows and its keys into blocks of block_k keys (block
// sizes positive multiples of 16; FlexAttention's default 128 x 128). For each (batch, query head,
// query block) the mask lists
//   kv_num_blocks[b, h, qb] key blocks kv_indices[b, h, qb, 0 .. n) that are partly visible: there
//     the element mask of the call applies (options' causal, window, chunk_size and prefix-LM,
//     document ids, and `mask` below; none of them set: every element of the block is visible), and
//   full_kv_num_blocks[b, h, qb] key blocks full_kv_indices[b, h, qb, 0 .. n) that are fully
//     visible: no element mask at all (optional, both or neither);
// every other key block is skipped. Entries past a row's count are ignored; a key block may appear
// at most once per row across both lists, in any order. All int32 on q's device; dims 0 and 1 may be
// 1 (shared by every sequence or head). Batch index b is the sequence index (varlen included);
// q_blocks >= ceil(seqlen_q / block_q) (max_seqlen_q for varlen), and indices < ceil(seqlen_k /
// block_k). The cuda backend takes block sizes that are multiples of 128. Score modifications (scale, softcap, ALiBi) and dropout apply to every visited element.
// Rows that see no key get out = 0, lse = -inf.
//
// mask (optional): a dense boolean element mask, u8 (non-zero = visible) [B, H, rows, cols] with
// B 1 or batch, H 1 or heads_q, any strides (a broadcast dim may have stride 0), on q's device.
// Element (i, j) of a partly visible block is visible iff mask[b, h, i, j] != 0 and the call's other
// rules hold; fully visible blocks never read it, so its memory traffic is that of the partial
// blocks alone. Indexed by positions within a sequence: batched, rows = seqlen_q and cols =
// seqlen_k; varlen, rows and cols at least max_seqlen_q and max_seqlen_k (with cu_seqlens on the
// host, the longest sequences suffice), sequence b reading mask[b or 0, h or 0, 0 .. its seqlen_q,
// 0 .. its seqlen_k]. Without kv_num_blocks and kv_indices it is an error: list every block as
// partial to apply the mask everywhere.
struct BlockMask {
  TensorView kv_num_blocks;       // int32 [B, H, q_blocks]
  TensorView kv_indices;          // int32 [B, H, q_blocks, max_blocks]
  TensorView full_kv_num_blocks;  // optional int32 [B, H, q_blocks]
  TensorView full_kv_indices;     // optional int32 [B, H, q_blocks, max_full_blocks]
  TensorView mask;                // optional u8 [B, H, rows, cols]: the partial blocks' element mask
  int block_q = 128, block_k = 128;

  bool present() const { return kv_num_blocks.present(); }
};

struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;
  TensorView lse;                          // optional
  TensorView cu_seqlens_q, cu_seqlens_k;   // optional: both or neither (varlen)
  int max_seqlen_q = 0, max_seqlen_k = 0;  // varlen only: bounds on the per-sequence lengths
  TensorView alibi_slopes;                 // optional fp32 [heads_q] or [batch, heads_q]
  // Optional document ids of packed sequences (both or neither), int32 [batch, seqlen_q] and
  // [batch, seqlen_k] (varlen: [total_q], [total_k]): query row i sees key j only where their ids
  // are equal, besides the other mask rules.
  TensorView document_ids_q, document_ids_k;
  BlockMask block_mask;                    // optional: block-sparse attention
  // Optional prefix-LM lengths per sequence, int32 [batch] on q's device: options.prefix_len's rule
  // with sequence b's own prefix (0: plain causal). Not together with options.prefix_len.
  TensorView prefix_lens;
  Options options;
};

struct BackwardArgs {
  TensorView q, k, v, out, dout;
  TensorView lse;                          // required: the forward's lse
  TensorView dq, dk, dv;                   // outputs, shaped like q, k, v
  TensorView cu_seqlens_q, cu_seqlens_k;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  TensorView alibi_slopes;
  TensorView document_ids_q, document_ids_k;
  BlockMask block_mask;                    // must match the forward's
  TensorView prefix_lens;                  // must match the forward's
  Options options;                         // must match the forward's (dropout seed/offset included)
};

// Decoding against a KV cache. Query rows of sequence b are aligned to the bottom-right of its
// keys: the cache's cache_seqlens[b] tokens plus the appended ones.
struct DecodeArgs {
  TensorView q;                  // [batch, seqlen_q, heads_q, hdim_qk]
  TensorView k_cache, v_cache;   // contiguous [batch, capacity, heads_kv, d] or
                                 // paged [num_pages, page_size, heads_kv, d] with page_table
  TensorView page_table;         // optional int32 [batch, max_pages_per_seq]
  TensorView cache_seqlens;      // optional int32 [batch]; default: the full capacity (contiguous only)
  TensorView k_new, v_new;       // optional [batch, seqlen_new, heads_kv, d]: written into the cache at
                                 // positions cache_seqlens[b].. before attending
  // Optional rotary embedding, [rotary_positions, rotary_dim / 2] in q's dtype (rotary_dim even,
  // <= hdim_qk): applied to the first rotary_dim features of k_new before it is written and of q
  // (q itself is not modified). Row n of k_new sits at position cache_seqlens[b] + n; query row i at
  // cache_seqlens[b] + i when the call is causal or windowed, else every query row at
  // cache_seqlens[b] (flash_attn_with_kvcache's rule).
  TensorView rotary_cos, rotary_sin;
  bool rotary_interleaved = false;  // rotate pairs (2c, 2c+1) rather than (c, c + rotary_dim/2)
  TensorView out;                // [batch, seqlen_q, heads_q, hdim_v]
  TensorView lse;                // optional fp32 [batch, heads_q, seqlen_q]
  TensorView alibi_slopes;
  Options options;               // dropout must be 0
};

// Merges partial attention results over disjoint key sets by their log-sum-exp:
//   out = sum_s exp(lse_s - lse) * out_s, lse = log(sum_s exp(lse_s)).
struct CombineArgs {
  TensorView out_partial;  // fp32 [splits, batch, seqlen_q, heads, hdim_v]
  TensorView lse_partial;  // fp32 [splits, batch, heads, seqlen_q]
  TensorView out;          // [batch, seqlen_q, heads, hdim_v]
  TensorView lse;          // optional fp32 [batch, heads, seqlen_q]
  Options options;
};

void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);
void decode(const DecodeArgs& args);
void combine(const CombineArgs& args);

// Bytes of scratch a call needs beyond its inputs and outputs (O(N): lse, D, an fp32 dQ
// accumulator, split partials). Pass options.workspace of at least this size to avoid
// allocation inside the call; otherwise a CUDA call takes its scratch from a stream-ordered pool
// that tileattn keeps per device, holding up to the largest scratch in use at once for later calls.
// The CPU forward's scratch is a copy of K's and V's rows where they lie apart (BSHD: heads
// interleaved), and for bf16 on AMX V transposed in blocks of keys (unless V is dense and few query
// tiles read it), by whole (sequence, KV head) pairs; given less than workspace_size, it holds as
// many pairs as fit at once and works in more rounds (with room for none, it allocates one). A
// workspace may start at any address: a call starts its scratch at the buffer's first 64-byte
// (CPU) or 256-byte (CUDA) boundary, and workspace_size includes the bytes that can cost.
std::size_t workspace_size(const ForwardArgs& args);
std::size_t workspace_size(const BackwardArgs& args);
std::size_t workspace_size(const DecodeArgs& args);

// Host memory the library itself allocated (scratch, per-thread tiles), for tests and benchmarks.
struct MemoryStats {
  std::size_t current_bytes = 0;
  std::size_t peak_bytes = 0;
};
MemoryStats memory_stats();
void reset_peak_memory();

// CPU threading: the library's own persistent pool, or a caller's.
// parallel_for(n, body) must call body(begin, end) on disjoint ranges covering [0, n) and return
// when all are done.
using ParallelFor =
    std::function<void(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body)>;
// n >= 1 threads, or 0 for the hardware concurrency; throws Error for n < 0, and where the system
// cannot start n threads (the pool then keeps its size).
void set_num_threads(int n);
int num_threads();
void set_parallel_for(ParallelFor fn);  // empty function = the library's pool

}  // namespace tileattn
