#include "cpu/kv_copy.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "cpu/flash_common.hpp"
#include "cpu/tensor_io.hpp"

namespace tileattn::cpu {
namespace {

// Rows per chunk of a pair's copy: whole blocks of transposed values.
constexpr int kChunkRows = 2 * kVTKeys;

std::size_t round64(std::size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

KVCopy::KVCopy(const Problem& p, const ForwardArgs& a, std::size_t budget) : p_(p), a_(a), es_(dtype_size(p.dtype)) {
  ks_ = (p.varlen ? a.k.stride[0] : a.k.stride[1]) * static_cast<std::int64_t>(es_);
  vs_ = (p.varlen ? a.v.stride[0] : a.v.stride[1]) * static_cast<std::int64_t>(es_);
  const std::int64_t pairs = static_cast<std::int64_t>(p.batch) * p.heads_kv;
  wave_ = std::max<std::int64_t>(pairs, 1);
  const std::int64_t readers = static_cast<std::int64_t>(p.group()) * ((p.seqlen_q + flash::kBr - 1) / flash::kBr);
  if (readers < 2 || p.seqlen_k == 0 || pairs == 0) return;
  copy_k_ = ks_ != static_cast<std::int64_t>(p.hdim_qk * es_);
  const bool dense_v = vs_ == static_cast<std::int64_t>(p.hdim_v * es_);
  vt_ = p.dtype == DType::bf16 && amx::available() && (!dense_v || readers >= kVTReaders);
  copy_v_ = !vt_ && !dense_v;
  if (copy_k_) k_bytes_ = round64(static_cast<std::size_t>(p.seqlen_k) * p.hdim_qk * es_);
  slot_bytes_ = k_bytes_;
  if (copy_v_) slot_bytes_ += round64(static_cast<std::size_t>(p.seqlen_k) * p.hdim_v * es_);
  if (vt_) slot_bytes_ += static_cast<std::size_t>((p.seqlen_k + kVTKeys - 1) / kVTKeys) * vt_block_bytes(p.hdim_v);
  if (slot_bytes_ == 0) return;
  slots_ = static_cast<std::int64_t>(std::clamp<std::size_t>(budget / slot_bytes_, 1, static_cast<std::size_t>(pairs)));
  wave_ = slots_;
  chunks_ = (p.seqlen_k + kChunkRows - 1) / kChunkRows;
}

KVRows KVCopy::source(std::int64_t u) const {
  const int b = static_cast<int>(u / p_.heads_kv), g = static_cast<int>(u % p_.heads_kv);
  const Seq s = sequence(p_, a_.cu_seqlens_q, a_.cu_seqlens_k, b);
  return {static_cast<const char*>(a_.k.data) + elem(a_.k, p_.varlen, b, s.k0, g) * es_, ks_,
          static_cast<const char*>(a_.v.data) + elem(a_.v, p_.varlen, b, s.k0, g) * es_, vs_};
}

void KVCopy::fill_chunk(char* ws, std::int64_t u0, std::int64_t u, int c) const {
  const int sk = sequence(p_, a_.cu_seqlens_q, a_.cu_seqlens_k, static_cast<int>(u / p_.heads_kv)).sk;
  const int j0 = c * kChunkRows, j1 = std::min(sk, j0 + kChunkRows);
  const std::size_t krow = p_.hdim_qk * es_, vrow = p_.hdim_v * es_;
  const KVRows from = source(u);
  char* slot = ws + static_cast<std::size_t>(u - u0) * slot_bytes_;
  if (copy_k_)
    for (int j = j0; j < j1; ++j) std::memcpy(slot + j * krow, from.k + j * ks_, krow);
  if (copy_v_)
    for (int j = j0; j < j1; ++j) std::memcpy(slot + k_bytes_ + j * vrow, from.v + j * vs_, vrow);
  if (vt_)
    for (int b0 = j0; b0 < j1; b0 += kVTKeys) {
      const int n = std::min(kVTKeys, j1 - b0);
      amx::transpose_rows(from.v + b0 * vs_, vs_, n, amx::pad32(n), p_.hdim_v,
                          reinterpret_cast<std::uint16_t*>(slot + k_bytes_ + b0 / kVTKeys * vt_block_bytes(p_.hdim_v)),
                          kVTKeys);
    }
}

KVFill::KVFill(const KVCopy& kv, char* ws, std::int64_t u0, std::int64_t u1)
    : kv_(kv), ws_(ws), u0_(u0), chunks_(kv.chunks()), pairs_(new Progress[u1 - u0]) {}

bool KVFill::help(std::int64_t u) {
  Progress& pr = pairs_[u - u0_];
  // A plain load first: once a pair is claimed whole, its readers stop bumping the counter.
  if (pr.claimed.load(std::memory_order_relaxed) >= chunks_) return false;
  const int c = pr.claimed.fetch_add(1, std::memory_order_relaxed);
  if (c >= chunks_) return false;
  kv_.fill_chunk(ws_, u0_, u, c);
  pr.done.fetch_add(1, std::memory_order_release);
  return true;
}

void KVFill::await(std::int64_t u) {
  while (help(u)) {
  }
  const Progress& pr = pairs_[u - u0_];
  while (pr.done.load(std::memory_order_acquire) < chunks_) std::this_thread::yield();
}

KVRows KVCopy::rows(const char* ws, std::int64_t u0, std::int64_t u) const {
  if (slots_ == 0) return source(u);
  const char* slot = ws + static_cast<std::size_t>(u - u0) * slot_bytes_;
  KVRows r = source(u);
  if (copy_k_) r.k = slot, r.ks = static_cast<std::ptrdiff_t>(p_.hdim_qk * es_);
  if (copy_v_) r.v = slot + k_bytes_, r.vs = static_cast<std::ptrdiff_t>(p_.hdim_v * es_);
  if (vt_) r.vt = slot + k_bytes_;
  return r;
}

}  // namespace tileattn::cpu
