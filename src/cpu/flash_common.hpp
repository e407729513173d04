// Target-independent pieces of the CPU flash kernels: tile sizes, per-thread tiles, the call's
// workspace, and the split counts that decide how much workspace a call needs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/problem.hpp"
#include "core/scratch.hpp"
#include "core/workspace.hpp"
#include "cpu/amx.hpp"
#include "cpu/tensor_io.hpp"

namespace tileattn::cpu::flash {

// Query rows per tile (the vector lanes of every softmax step) and keys per tile. 64 x 64 fp32
// score tiles and head dims up to 128 keep a tile's working set in L2; Br is a multiple of two
// vectors on every target (16 lanes with AVX-512).
inline constexpr int kBr = 64;
inline constexpr int kBc = 64;

// Head dims rounded up to 16 floats, so a row-major tile of them is whole vectors on any target.
inline int padded(int d) { return (d + 15) / 16 * 16; }

// Per-thread tile memory: grown on demand and kept for the thread's life (a few hundred KiB,
// independent of the sequence length), counted in memory_stats like all host scratch.
inline float* thread_tiles(std::size_t floats) {
  thread_local Scratch tiles;
  if (tiles.bytes() < floats * sizeof(float)) tiles = Scratch(floats * sizeof(float));
  return tiles.as<float>();
}

// A call's scratch starts on a 64-byte boundary wherever the caller's buffer does: the AMX
// products read their operands in 64-byte rows, and rows of a copy that straddle two cache lines
// cost the bf16 BSHD forward 6% (up to 15% on a shape; a 16-core Xeon, lent a std::vector's buffer,
// 16 bytes past a boundary).
inline constexpr std::size_t kWorkspaceAlign = 64;

// Bytes of the caller's workspace from its first aligned byte on.
inline std::size_t usable_bytes(const Options& o) {
  const std::size_t skip = align_skip(o.workspace, kWorkspaceAlign);
  return o.workspace != nullptr && o.workspace_bytes > skip ? o.workspace_bytes - skip : 0;
}

// What workspace_size reports for a call that needs `bytes`.
inline std::size_t reported_bytes(std::size_t bytes) { return with_align_slack(bytes, kWorkspaceAlign); }

// The call's O(N) workspace: the caller's when given and large enough, else allocated here (as
// much as workspace_size reports, so the extra memory of a call is exactly that).
class Workspace {
 public:
  Workspace(const Options& o, std::size_t bytes) {
    if (bytes == 0) return;
    if (usable_bytes(o) >= bytes) {
      base_ = static_cast<char*>(o.workspace) + align_skip(o.workspace, kWorkspaceAlign);
    } else {
      own_ = Scratch(reported_bytes(bytes));
      base_ = own_.as<char>();
    }
  }
  // Carves the next n floats.
  float* floats(std::size_t n) {
    float* f = reinterpret_cast<float*>(base_ + used_);
    used_ += n * sizeof(float);
    return f;
  }

 private:
  Scratch own_;
  char* base_ = nullptr;
  std::size_t used_ = 0;
};

// Query rows of the packed (varlen) or batched layout: where row i of sequence b lives in the
// backward's fp32 buffers.
inline std::int64_t total_q_rows(const Problem& p, const BackwardArgs& a) {
  return p.varlen ? a.q.shape[0] : static_cast<std::int64_t>(p.batch) * p.seqlen_q;
}

// Lanes a query tile of `rows` rows computes: its rows rounded up to whole groups of `align` (16:
// whole vectors on every target), at most kBr.
inline int tile_lanes(int rows, int align = 16) { return std::min(kBr, (rows + align - 1) / align * align); }

// Backward: the packed query tiles of all sequences. A tile is as wide as its rows rounded up to
// `align` (16, whole vectors on every target; 32 where the tile unit multiplies over them), so a
// sequence of 1 to 16 rows packs and computes 16 lanes, not kBr: sequence b's tiles take
// padded_rows(sq_b) rows from first(b) on, tile qb at first(b) + qb * kBr.
struct QueryTiles {
  int align = 16;
  std::vector<std::int64_t> start;  // varlen: first padded row of each sequence (batch + 1 entries)
  std::int64_t per_seq = 0;         // batched: padded rows of every sequence
  std::int64_t total = 0;           // padded rows of all sequences
  std::int64_t first(int b) const { return start.empty() ? b * per_seq : start[b]; }
  // Lanes of the tile whose first row is i0 in a sequence of sq rows.
  int width(int sq, int i0) const { return tile_lanes(sq - i0, align); }
  std::int64_t padded_rows(std::int64_t sq) const {
    return sq / kBr * kBr + (sq % kBr + align - 1) / align * align;
  }
};

inline QueryTiles backward_query_tiles(const Problem& p, const BackwardArgs& a) {
  QueryTiles t;
  t.align = p.dtype == DType::bf16 && amx::available() ? 32 : 16;
  if (!p.varlen) {
    t.per_seq = t.padded_rows(p.seqlen_q);
    t.total = t.per_seq * p.batch;
    return t;
  }
  t.start.resize(static_cast<std::size_t>(p.batch) + 1, 0);
  for (int b = 0; b < p.batch; ++b) {
    const std::int64_t sq = load_i32(a.cu_seqlens_q, b + 1) - load_i32(a.cu_seqlens_q, b);
    t.start[b + 1] = t.start[b] + t.padded_rows(sq);
  }
  t.total = t.start[p.batch];
  return t;
}

// Backward: floats per query row of a packed tile: Q^T, dO^T, Q and dO padded, LSE and D.
inline std::size_t backward_tile_floats(const Problem& p) {
  return static_cast<std::size_t>(p.hdim_qk) + p.hdim_v + padded(p.hdim_qk) + padded(p.hdim_v) + 2;
}

// Backward: the key blocks of each (sequence, KV head) are dealt round-robin to this many tasks,
// each with its own fp32 dQ partial, summed in a fixed order at the end. It depends on the problem
// shape only, never on the thread count, so results are bitwise reproducible everywhere.
inline int backward_key_groups(const Problem& p) {
  const std::int64_t heads = static_cast<std::int64_t>(p.batch) * p.heads_kv;
  const int blocks = std::max(1, (p.seqlen_k + kBc - 1) / kBc);
  const std::int64_t want = (64 + heads - 1) / std::max<std::int64_t>(heads, 1);
  return static_cast<int>(std::clamp<std::int64_t>(want, 1, std::min(8, blocks)));
}

// Backward: bytes of scratch, the packed query tiles of every head and one fp32 dQ partial per
// key group: O(N).
inline std::size_t backward_scratch_bytes(const Problem& p, const BackwardArgs& a) {
  const std::size_t packed =
      static_cast<std::size_t>(backward_query_tiles(p, a).total) * p.heads_q * backward_tile_floats(p);
  const std::size_t partials =
      static_cast<std::size_t>(total_q_rows(p, a)) * p.heads_q * backward_key_groups(p) * padded(p.hdim_qk);
  return sizeof(float) * (packed + partials);
}

// Decode: KV splits per (sequence, KV head). Enough tasks to fill a large machine, but no split
// shorter than a few tiles. A caller's count is capped by the key tiles of the longest sequence
// (decode_keys): a split holds whole tiles, so more splits would only be empty ones, each with
// its own partial in scratch.
inline int decode_splits(const Problem& p, const Options& o) {
  const int tiles = std::max(1, (p.decode_keys + kBc - 1) / kBc);
  if (o.num_splits > 0) return std::min(o.num_splits, tiles);
  const std::int64_t heads = static_cast<std::int64_t>(p.batch) * p.heads_kv;
  const std::int64_t want = (64 + heads - 1) / std::max<std::int64_t>(heads, 1);
  const int by_len = std::max(1, p.decode_keys / (4 * kBc));
  return static_cast<int>(std::clamp<std::int64_t>(want, 1, by_len));
}

// Decode: bytes of scratch, the splits' partial outputs and LSEs when the keys are split.
inline std::size_t decode_scratch_bytes(const Problem& p, const DecodeArgs& a) {
  const int splits = decode_splits(p, a.options);
  if (splits == 1) return 0;
  return sizeof(float) * static_cast<std::size_t>(splits) * p.batch * p.heads_q * p.seqlen_q * (p.hdim_v + 1);
}

}  // namespace tileattn::cpu::flash
