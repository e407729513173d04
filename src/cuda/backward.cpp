// The cuda backend's backward entry point: D = rowsum(dO * O), the dK/dV kernel (adding dQ into
// fp32 rows; in the deterministic mode in a fixed order on Hopper, by its own kernel elsewhere),
// then dQ converted to the output dtype. Scratch, all O(N): D per (head, query row), the fp32 dQ
// rows where dQ is summed, the Hopper kernel's turn counters per (head, query tile), and fp32
// dK, dV rows per (KV head, key row) where a group's heads are split over blocks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "core/backends.hpp"
#include "cuda/attn_params.hpp"
#include "cuda/block_state.hpp"
#include "cuda/bwd_launch.hpp"
#include "cuda/instance_table.hpp"
#include "cuda/runtime.hpp"
#include "cuda/scratch_align.hpp"
#include "cuda/varlen_tails.hpp"

namespace tileattn::cuda {
namespace {

struct BwdInstance {
  DType dtype;
  int hdim;
  void (*launch)(const BwdParams&, const BwdGrid&);
  bool (*runs_sm90)(const BwdGrid&);
  int (*key_tile_sm90)();
};

constexpr BwdInstance kInstances[] = {
#define TA_INSTANCE(dtype, hdim)                                                               \
  {DType::dtype, hdim, &launch_bwd<DType::dtype, hdim>, &bwd_runs_sm90<DType::dtype, hdim>, \
   &bwd_sm90_key_tile<DType::dtype, hdim>},
#include "instances.inc"
#undef TA_INSTANCE
};

const BwdInstance* find_instance(DType dtype, int hdim) { return smallest_instance(kInstances, dtype, hdim); }

std::int64_t rows_total(const Problem& p, const BackwardArgs& a) {
  return p.varlen ? a.q.shape[0] : std::int64_t(p.batch) * p.seqlen_q;
}

std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

// Chunks, document ids, block masks and prefixes run on the Hopper kernel's variant instantiation,
// except in the deterministic mode (its ordered dQ sums count the key blocks that visit a query tile
// as a range), which runs them on the portable kernels. Modifiers: softcap, ALiBi, dropout, a
// non-positive scale.
BwdGrid grid(const Problem& pr, const BackwardArgs& a) {
  const bool mods = pr.softcap > 0.f || pr.has_alibi || pr.dropout_p > 0.f || !(pr.scale > 0.f);
  const bool variant = takes_variant(pr);
  const bool deterministic = a.options.deterministic;
  return {pr.batch, pr.heads_q, pr.heads_kv, pr.seqlen_q, pr.seqlen_k, mods, variant, deterministic,
          device_runs_sm90a() && !(variant && deterministic), static_cast<cudaStream_t>(a.options.stream)};
}

std::int64_t rows_k_total(const Problem& p, const BackwardArgs& a) {
  return p.varlen ? a.k.shape[0] : std::int64_t(p.batch) * p.seqlen_k;
}

// The Hopper kernel splits a GQA group over several blocks per key tile, which add their dK, dV
// into fp32 rows (converted after), in two cases. Groups of 8 or more heads under a mask (causal,
// window) from 2k query rows: the key blocks' work is uneven and the group makes the longest blocks
// long, so two blocks each; measured 3-12% faster there, while with groups of 4 or at 512 rows the
// extra additions and conversion cost more than the shorter tail gains (bench/notes/backward.md).
// And grids under one wave of blocks (a small batch of short sequences with few KV heads, as in
// training a small model): the fewest parts that fill the SMs, up to one head per block, since
// idle SMs cost more than the additions. The deterministic mode splits the same groups, its parts
// adding in turn (BwdParams::dkv_turns); it launches each head's longest block last (bwd_block),
// so where the first key block walks the most rows (causal, a window bounded on the right only) a
// long block sets the call's tail (bench/bwd_det_model.py), and the mode splits further there:
// groups of 4 in two, groups of 8 in four. Under a sliding window the blocks walk about equally
// far and the extra parts only added traffic (bench/notes/backward.md).
int group_parts(const Problem& p, const BackwardArgs& a, const BwdInstance* in) {
  const int group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  if (!in || group < 2 || !in->runs_sm90(grid(p, a))) return 1;
  const bool long_uneven = (p.window_left >= 0 || p.window_right >= 0) && p.seqlen_q >= 2048;
  const bool det_tail = a.options.deterministic && p.window_right >= 0 && p.window_left < 0;
  int parts = 1;
  if (long_uneven && group % 2 == 0 && group >= (det_tail ? 4 : 8))
    parts = det_tail && group >= 8 && group % 4 == 0 ? 4 : 2;
  const int tile = in->key_tile_sm90();
  const std::int64_t blocks = std::int64_t((p.seqlen_k + tile - 1) / tile) * p.batch * p.heads_kv;
  const int sms = device_sm_count();
  if (blocks * parts < sms) {
    parts = group;
    for (int d = 2; d < group; ++d)
      if (group % d == 0 && blocks * d >= sms) {
        parts = d;
        break;
      }
  }
  return parts;
}

// The deterministic mode's chain (BwdParams::det_chain). Blocks taken 8 key blocks at a time over
// many heads wait down short chains, which pays while the heads in flight (about SMs / 8 of them)
// keep the Q, dO and fp32 dQ rows a block walks in L2. Past a fifth of L2 per block most grid rows
// ran slower so, and a head's whole row of key blocks at a time keeps one head's rows in flight
// (bench/notes/backward.md).
int det_chain(const Problem& p, int parts) {
  const std::size_t head_bytes = std::size_t(p.seqlen_q) * (p.group() / parts) *
                                 (dtype_size(p.dtype) * (p.hdim_qk + p.hdim_v) + sizeof(float) * p.hdim());
  return head_bytes * 5 <= device_l2_bytes() ? 8 : std::max(1, p.seqlen_k);
}

// The default mode's launch groups (BwdParams::group_blocks). Under a causal or windowed mask the
// key blocks' walks differ in length (under causal the first block's is the whole sequence), and
// each head's key blocks launched in turn leave the last heads' longest blocks running alone at the
// end (bench/notes/backward.md, bench/bwd_schedule_model.py). Launched longest first over groups of
// heads instead, the tail is short blocks. A group holds about as many blocks as there are SMs: the
// heads whose blocks run together either way, so that as many rows are read through L2 as before
// (key blocks first over every head ran causal calls at half speed). Only where a block walks 1024
// query rows or more: over shorter walks the tail is short anyway, and blocks of one length started
// together ran slower than each head's in turn.
int group_blocks(const Problem& p, int parts) {
  const bool uneven = p.window_left >= 0 || p.window_right >= 0;
  return uneven && std::int64_t(p.seqlen_q) * p.group() / parts >= 1024 ? device_sm_count() : 0;
}

struct Scratch {
  int parts;                   // group_parts
  std::int64_t dkv_turns;      // the dK, dV turns' offset in the turns (0: none)
  std::size_t dsum_bytes, dq_bytes, turn_bytes, block_bytes, dkv_bytes;
  std::size_t total() const { return dsum_bytes + dq_bytes + turn_bytes + block_bytes + 2 * dkv_bytes; }
};

Scratch scratch(const Problem& p, const BackwardArgs& a) {
  const std::int64_t rows_all = rows_total(p, a);
  const std::size_t rows = std::size_t(rows_all) * p.heads_q;
  const BwdInstance* in = find_instance(p.dtype, p.hdim());
  const std::size_t cols = in ? in->hdim : 0;
  const bool sm90 = in && in->runs_sm90(grid(p, a));
  const bool ordered = a.options.deterministic && sm90;
  const bool summed = !a.options.deterministic || ordered;
  const std::int64_t rows_k = rows_k_total(p, a);
  const std::size_t key_rows = std::size_t(rows_k) * p.heads_kv;
  const int parts = group_parts(p, a, in);
  const std::int64_t dq_turns = sm90 ? turn_count(rows_all, p.heads_q, p.batch) : 0;
  const std::int64_t dkv_turns = ordered && parts > 1 ? turn_count(rows_k, p.heads_kv, p.batch) : 0;
  return {parts, dkv_turns ? dq_turns : 0, round_up(rows * sizeof(float)),
          summed ? round_up(rows * cols * sizeof(float)) : 0, round_up(std::size_t(dq_turns + dkv_turns) * sizeof(int)),
          block_state_bytes(p, a.block_mask), parts > 1 ? round_up(key_rows * cols * sizeof(float)) : 0};
}

}  // namespace

int backward_instance_hdim(DType dtype, int hdim) {
  const BwdInstance* in = find_instance(dtype, hdim);
  return in ? in->hdim : 0;
}

std::size_t workspace_size(const Problem& p, const BackwardArgs& a) {
  DeviceGuard device(a.q.device.index);  // the scratch depends on the kernels the call's device runs
  return reported_bytes(scratch(p, a).total());
}

namespace {

void run(const Problem& pr, const BackwardArgs& a, cudaStream_t stream) {
  const BwdInstance* in = find_instance(pr.dtype, pr.hdim());

  BwdParams p{};
  p.fwd = attn_params(pr, {a.q, a.k, a.v, a.out, a.lse, a.cu_seqlens_q, a.cu_seqlens_k, a.alibi_slopes,
                           a.document_ids_q, a.document_ids_k, a.prefix_lens, a.block_mask.mask, a.options});
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  row_strides(pr, a.dout, p.do_batch, p.do_row, p.do_head);
  row_strides(pr, a.dq, p.dq_batch, p.dq_row, p.dq_head);
  row_strides(pr, a.dk, p.dk_batch, p.dk_row, p.dk_head);
  row_strides(pr, a.dv, p.dv_batch, p.dv_row, p.dv_head);
  p.rows_total = rows_total(pr, a);
  p.dq_cols = in->hdim;
  p.batch = pr.batch;

  const Scratch sc = scratch(pr, a);
  Workspace ws(a.options, sc.total(), stream);
  p.dsum = reinterpret_cast<float*>(ws.data());
  p.dq_accum = sc.dq_bytes ? reinterpret_cast<float*>(ws.data() + sc.dsum_bytes) : nullptr;
  p.dq_turns = sc.turn_bytes ? reinterpret_cast<int*>(ws.data() + sc.dsum_bytes + sc.dq_bytes) : nullptr;
  // The D kernel zeroes the turns where it runs (query rows), a stream operation fewer.
  if (p.dq_turns && p.rows_total == 0)
    check(cudaMemsetAsync(p.dq_turns, 0, sc.turn_bytes, stream), "cudaMemsetAsync (dQ turns)");
  p.turn_slots = p.dq_turns ? std::int64_t(sc.turn_bytes / sizeof(int)) : 0;
  char* const blocks = ws.data() + sc.dsum_bytes + sc.dq_bytes + sc.turn_bytes;
  if (pr.block_sparse()) p.fwd.blocks = make_block_state(pr, a.block_mask, reinterpret_cast<unsigned char*>(blocks), stream);
  p.rows_k_total = rows_k_total(pr, a);
  p.group_parts = sc.dkv_bytes ? sc.parts : 1;
  p.det_chain = det_chain(pr, p.group_parts);
  if (sc.dkv_bytes) {
    p.dkv_turns = sc.dkv_turns ? p.dq_turns + sc.dkv_turns : nullptr;
    p.dk_accum = reinterpret_cast<float*>(blocks + sc.block_bytes);
    p.dv_accum = reinterpret_cast<float*>(blocks + sc.block_bytes + sc.dkv_bytes);
    check(cudaMemsetAsync(p.dk_accum, 0, 2 * sc.dkv_bytes, stream), "cudaMemsetAsync (dK, dV rows)");
  }
  p.group_blocks = group_blocks(pr, p.group_parts);
  // The D kernel writes the varlen tails; dq's only where no conversion pass writes every row of it.
  p.key_tails = key_tails(pr, a);
  if (!p.dq_accum) p.query_tails = query_tails(pr, a);

  launch_bwd_dsum(pr.dtype, p, stream);
  if (p.rows_total == 0) launch_varlen_tails(p.key_tails, stream);  // no D kernel ran
  const BwdGrid g = grid(pr, a);
  in->launch(p, g);
  if (p.dq_accum) launch_bwd_dq_convert(pr.dtype, p, stream);
  if (p.dk_accum) launch_bwd_dkv_convert(pr.dtype, p, stream);
}

}  // namespace

void backward(const Problem& pr, const BackwardArgs& a) {
  if (pr.heads_q == 0) return;
  DeviceGuard device(a.q.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.options.stream);
  if (pr.batch > 0) {
    run(pr, a, stream);
    return;
  }
  launch_varlen_tails(key_tails(pr, a), stream);  // no kernel to write them
  launch_varlen_tails(query_tails(pr, a), stream);
}

}  // namespace tileattn::cuda
