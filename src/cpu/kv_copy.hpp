// The forward's key and value rows, copied side by side where they lie apart. Every query tile of
// a (sequence, KV head) streams all of its keys; rows heads * d apart (BSHD, packed varlen) put a
// few rows on each page and in a few cache sets, and each of those tiles paid for that again.
// Such pairs are copied once, in waves of whole pairs through a bounded workspace, and the query
// tiles read the copy. For bf16 on AMX the values are laid out again, transposed in blocks of keys
// (the A operand of O^T += V^T P^T), where they are copied anyway or enough query tiles read them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/problem.hpp"
#include "cpu/amx.hpp"

namespace tileattn::cpu {

// Keys per block of the transposed values, and per step of the AMX forward that reads them.
inline constexpr int kVTKeys = 128;

// Values already dense are transposed once only where at least this many query tiles read each
// pair; fewer, and each tile's steps transpose their own rows. The pass over all pairs is a fixed
// cost of the call (measured on a 16-core Xeon, dense bf16: with 16 readers per pair the steps'
// own transposes took 0.83-0.97x the time, with 32 0.97-1.05x, at 128 the pass won by 6-9%).
inline constexpr int kVTReaders = 32;

// Pair u = b * heads_kv + g's key rows at k (ks bytes apart) and value rows at v (vs apart); vt,
// where not null, its values transposed: block i (keys from i * kVTKeys) at vt + i *
// vt_block_bytes(dv), bf16 [pad16(dv)][kVTKeys], zero past dv and, in the last block, from the last
// key to the next multiple of 32 (the keys a product over that block reads).
struct KVRows {
  const char* k;
  std::ptrdiff_t ks;
  const char* v;
  std::ptrdiff_t vs;
  const char* vt = nullptr;
};

inline std::size_t vt_block_bytes(int dv) { return static_cast<std::size_t>(amx::pad16(dv)) * kVTKeys * 2; }

// Bytes of copies held at once unless the caller's workspace says otherwise: a wave of pairs
// gives every thread many query tiles long before this on the shapes that need copies.
inline constexpr std::size_t kKVCopyBudget = std::size_t{64} << 20;

class KVCopy {
 public:
  // Waves of as many pairs as fit in budget bytes (at least one).
  KVCopy(const Problem& p, const ForwardArgs& a, std::size_t budget);

  // Workspace the copies need: 0 where each pair is read once anyway, or its rows are dense already
  // and no transposed values are wanted.
  std::size_t bytes() const { return static_cast<std::size_t>(slots_) * slot_bytes_; }
  // Pairs per wave: copy those (KVFill), then attend their query tiles.
  std::int64_t wave() const { return wave_; }
  // Chunks each pair's copy is made in (0 where nothing is copied).
  int chunks() const { return slots_ == 0 ? 0 : chunks_; }
  // Copies chunk c of pair u into the slot of the wave starting at u0.
  void fill_chunk(char* ws, std::int64_t u0, std::int64_t u, int c) const;
  // Pair u's rows, from ws when the wave holding u (which starts at u0) was copied there.
  KVRows rows(const char* ws, std::int64_t u0, std::int64_t u) const;

 private:
  KVRows source(std::int64_t u) const;  // pair u's rows in the caller's tensors

  const Problem& p_;
  const ForwardArgs& a_;
  bool copy_k_ = false, copy_v_ = false, vt_ = false;  // what a slot holds: K's rows, V's rows or V^T
  std::size_t es_ = 0, k_bytes_ = 0, slot_bytes_ = 0;
  std::int64_t ks_ = 0, vs_ = 0;  // the caller's row strides, bytes
  std::int64_t slots_ = 0, wave_ = 1;
  int chunks_ = 0;
};

// One wave's copies, made while the query tiles of earlier pairs are attended: a copy streams its
// rows from memory, the tiles compute from cache, so the two overlap instead of taking turns.
// Chunks are claimed by whoever gets to them first: a fill item scheduled a pair ahead of its
// readers (help), or a reader that finds its pair unfinished (await). A reader waits only on
// chunks another thread has started, so no order of running a parallel_for's ranges can deadlock.
class KVFill {
 public:
  KVFill(const KVCopy& kv, char* ws, std::int64_t u0, std::int64_t u1);
  // Copies one unclaimed chunk of pair u, if any is left; returns whether it did.
  bool help(std::int64_t u);
  // Returns once pair u is copied, copying unclaimed chunks itself.
  void await(std::int64_t u);

 private:
  struct alignas(64) Progress {
    std::atomic<int> claimed{0}, done{0};
  };
  const KVCopy& kv_;
  char* ws_;
  std::int64_t u0_;
  int chunks_;
  std::unique_ptr<Progress[]> pairs_;
};

}  // namespace tileattn::cpu
