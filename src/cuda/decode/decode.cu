// Host side of GPU decoding: append (+ rotary) and the split-KV pass (whose last block per KV
// head merges the splits), all stream-ordered with no host synchronization, so the call can be
// captured in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/backends.hpp"
#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/combine_kernel.cuh"
#include "cuda/decode/decode_kernel.hpp"
#include "cuda/dependent_launch.cuh"
#include "cuda/instance_table.hpp"
#include "cuda/runtime.hpp"
#include "cuda/scratch_align.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cuda {
namespace {

using decoding::AppendParams;
using decoding::CombineParams;
using decoding::Kernel;
using decoding::Params;

constexpr int kMinKeysPerSplit = 256;

struct DecodeInstance {
  DType dtype;
  int hdim;
  Kernel (*pick)(int rows, bool per_key);
};

constexpr DecodeInstance kInstances[] = {
#define TA_DECODE_INSTANCE(dtype, hdim) {DType::dtype, hdim, &decoding::pick_kernel<DType::dtype, hdim>},
#include "decode_instances.inc"
#undef TA_DECODE_INSTANCE
};

const DecodeInstance* find_instance(DType dtype, int hdim) { return smallest_instance(kInstances, dtype, hdim); }

// Validation has made sure an instance exists (check_decode_head_dim).
Kernel select_kernel(const Problem& p) {
  const int rows = p.seqlen_q * p.group();
  const bool per_key = p.paged && p.page_size % decoding::kTileKeys != 0;  // a tile may span pages
  return find_instance(p.dtype, p.hdim())->pick(rows, per_key);
}

// Splits of the KV sequence. The heuristic takes as many as fill one wave of resident blocks (the
// kernel's occupancy times the SM count) without spilling into a second, but never splits shorter
// than kMinKeysPerSplit keys, whose partials would cost more to merge than they save; no split
// when the (batch, KV head, row chunk) grid already fills the GPU. A caller's count is capped
// twice, so that scratch follows the data and the machine, not the option: by the key tiles of
// the longest sequence (decode_keys: the real lengths where the host holds them; a split holds
// whole tiles, more would be empty ones, each with its own partial), and at two waves of
// resident blocks over the whole grid (past that, more splits add merge work and scratch only).
int choose_splits(const Problem& p, const Options& o) {
  const Kernel k = select_kernel(p);
  const long rows = static_cast<long>(p.seqlen_q) * p.group();
  const long base = static_cast<long>(p.batch) * p.heads_kv * ((rows + k.rows - 1) / k.rows);
  const long wave = static_cast<long>(k.per_sm) * device_sm_count();
  const long keys = std::max(1, p.decode_keys);
  if (o.num_splits > 0) {
    const long tiles = (keys + decoding::kTileKeys - 1) / decoding::kTileKeys;
    const long waves2 = std::max<long>(1, 2 * wave / std::max<long>(base, 1));
    return static_cast<int>(std::min<long>({o.num_splits, tiles, waves2}));
  }
  if (base == 0 || base >= wave) return 1;
  const long max_splits = (keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return static_cast<int>(std::max<long>(1, std::min<long>(max_splits, wave / base)));
}

struct Layout {
  int splits;
  int groups;  // blocks per split: (batch, row chunk, KV head)
  std::size_t out_partial, lse_partial, q_rot, group_state, total;  // byte offsets and size
};

Layout layout(const Problem& p, const Options& o) {
  Layout w{};
  w.splits = choose_splits(p, o);
  const int chunk_rows = select_kernel(p).rows;
  w.groups = p.batch * ((p.seqlen_q * p.group() + chunk_rows - 1) / chunk_rows) * p.heads_kv;
  const std::size_t rows = static_cast<std::size_t>(p.batch) * p.seqlen_q * p.heads_q;
  auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
  std::size_t at = 0;
  w.out_partial = at;
  if (w.splits > 1) at += align(w.splits * rows * p.hdim_v * sizeof(float));
  w.lse_partial = at;
  if (w.splits > 1) at += align(w.splits * rows * sizeof(float));
  w.q_rot = at;
  if (p.rotary_dim) at += align(rows * p.hdim_qk * 2);
  w.group_state = at;
  if (w.splits > 1) at += align(static_cast<std::size_t>(w.groups) * sizeof(unsigned long long));
  w.total = at;
  return w;
}

// The split kernel; with splits, after the kernel that zeroes its arrival counters, both as
// dependent launches (dependent_launch.cuh) whose blocks start while the work before them ends
// and wait on the device before their first read: on the H100 that took 0.7 us off a 1x32k call
// (graph replay), the two launches' latency behind the call before. A single launch (no split)
// gained nothing that way: 16x8k ran 0.5% slower as a dependent launch.
void launch_split(const Kernel& k, dim3 grid, const Params& prm, const Layout& w, cudaStream_t s) {
  raise_smem_limit(reinterpret_cast<const void*>(k.fn), static_cast<int>(k.smem),
                   "cudaFuncSetAttribute (decode shared memory)");  // on this device
  if (w.splits > 1) return launch_after_clearing(prm.group_state, w.groups, true, k.fn, grid, dim3(k.threads), k.smem, s, prm);
  k.fn<<<grid, k.threads, k.smem, s>>>(prm);
  check_launch("decode split-kv launch");
}

template <class T>
void run_decode(const Problem& p, const DecodeArgs& a, const Layout& w, char* ws, cudaStream_t s) {
  AppendParams ap{};
  ap.k = a.k_cache.data;
  ap.v = a.v_cache.data;
  ap.k_b = a.k_cache.stride[0], ap.k_s = a.k_cache.stride[1], ap.k_h = a.k_cache.stride[2];
  ap.v_b = a.v_cache.stride[0], ap.v_s = a.v_cache.stride[1], ap.v_h = a.v_cache.stride[2];
  if (p.paged) {
    ap.page_table = a.page_table.ptr<const int>();
    ap.pt_b = a.page_table.stride[0], ap.pt_p = a.page_table.stride[1];
    ap.page_size = p.page_size;
    ap.num_pages = static_cast<int>(a.k_cache.shape[0]);
  }
  ap.cache_seqlens = a.cache_seqlens.present() ? a.cache_seqlens.ptr<const int>() : nullptr;
  ap.capacity = p.seqlen_k;
  ap.seqlen_new = p.seqlen_new;
  ap.heads_kv = p.heads_kv, ap.hdim_qk = p.hdim_qk, ap.hdim_v = p.hdim_v;
  ap.rotary_dim = p.rotary_dim;
  if (p.rotary_dim) {
    ap.cos = a.rotary_cos.data, ap.sin = a.rotary_sin.data;
    ap.cos_s = a.rotary_cos.stride[0], ap.sin_s = a.rotary_sin.stride[0];
    ap.interleaved = a.rotary_interleaved;
  }
  const int pair_threads = (p.hdim() / 2 + 31) / 32 * 32;
  if (p.seqlen_new > 0 && p.batch > 0) {
    ap.k_new = a.k_new.data, ap.v_new = a.v_new.data;
    ap.kn_b = a.k_new.stride[0], ap.kn_s = a.k_new.stride[1], ap.kn_h = a.k_new.stride[2];
    ap.vn_b = a.v_new.stride[0], ap.vn_s = a.v_new.stride[1], ap.vn_h = a.v_new.stride[2];
    decoding::append_kernel<T><<<p.batch * p.seqlen_new * p.heads_kv, pair_threads, 0, s>>>(ap);
    check_launch("decode append");
  }

  Params prm{};
  prm.q = a.q.data;
  prm.q_b = a.q.stride[0], prm.q_i = a.q.stride[1], prm.q_h = a.q.stride[2];
  if (p.rotary_dim && p.batch * p.seqlen_q > 0) {
    ap.q = a.q.data;
    ap.q_b = a.q.stride[0], ap.q_i = a.q.stride[1], ap.q_h = a.q.stride[2];
    ap.q_rot = ws + w.q_rot;
    ap.seqlen_q = p.seqlen_q, ap.heads_q = p.heads_q;
    ap.q_per_row = p.rotary_per_row;
    decoding::rotate_q_kernel<T><<<p.batch * p.seqlen_q * p.heads_q, pair_threads, 0, s>>>(ap);
    check_launch("decode rotary q");
    prm.q = ws + w.q_rot;
    prm.q_h = p.hdim_qk, prm.q_i = static_cast<std::int64_t>(p.heads_q) * p.hdim_qk, prm.q_b = prm.q_i * p.seqlen_q;
  }
  prm.k = a.k_cache.data, prm.v = a.v_cache.data;
  prm.k_b = ap.k_b, prm.k_s = ap.k_s, prm.k_h = ap.k_h;
  prm.v_b = ap.v_b, prm.v_s = ap.v_s, prm.v_h = ap.v_h;
  prm.page_table = ap.page_table, prm.pt_b = ap.pt_b, prm.pt_p = ap.pt_p;
  prm.page_size = ap.page_size, prm.num_pages = ap.num_pages;
  prm.cache_seqlens = ap.cache_seqlens;
  prm.capacity = p.seqlen_k, prm.seqlen_new = p.seqlen_new;
  prm.out = a.out.data;
  prm.o_b = a.out.stride[0], prm.o_i = a.out.stride[1], prm.o_h = a.out.stride[2];
  if (a.lse.present()) {
    prm.lse = a.lse.ptr<float>();
    prm.l_b = a.lse.stride[0], prm.l_h = a.lse.stride[1], prm.l_i = a.lse.stride[2];
  }
  prm.out_partial = reinterpret_cast<float*>(ws + w.out_partial);
  prm.lse_partial = reinterpret_cast<float*>(ws + w.lse_partial);
  if (w.splits > 1) prm.group_state = reinterpret_cast<unsigned long long*>(ws + w.group_state);
  if (p.has_alibi) {
    prm.alibi = a.alibi_slopes.ptr<const float>();
    prm.alibi_b = p.alibi_per_batch ? a.alibi_slopes.stride[0] : 0;
    prm.alibi_h = a.alibi_slopes.stride[p.alibi_per_batch ? 1 : 0];
  }
  prm.batch = p.batch, prm.seqlen_q = p.seqlen_q, prm.heads_q = p.heads_q, prm.heads_kv = p.heads_kv;
  prm.hdim_qk = p.hdim_qk, prm.hdim_v = p.hdim_v;
  prm.splits = w.splits;
  // Splits start on tiles and cover the longest sequence's keys (decode_keys), not the capacity:
  // a cache filled to a tenth is split over its keys, not over its empty tail.
  constexpr int kTile = decoding::kTileKeys;
  const int keys = std::max(1, p.decode_keys);
  prm.keys_per_split = ((keys + w.splits - 1) / w.splits + kTile - 1) / kTile * kTile;
  prm.scale = p.scale, prm.softcap = p.softcap;
  prm.window_left = p.window_left, prm.window_right = p.window_right, prm.bottom_right = p.bottom_right;
  prm.chunk = p.chunk;
  prm.prefix = p.prefix_len;

  const dim3 grid(w.groups, 1, w.splits);  // see decoding::block_at
  if (grid.x == 0) return;
  launch_split(select_kernel(p), grid, prm, w, s);
}

}  // namespace

int decode_instance_hdim(DType dtype, int hdim) {
  const DecodeInstance* in = find_instance(dtype, hdim);
  return in ? in->hdim : 0;
}

std::size_t workspace_size(const Problem& p, const DecodeArgs& a) { return reported_bytes(layout(p, a.options).total); }

void decode(const Problem& p, const DecodeArgs& a) {
  DeviceGuard device(a.q.device.index);
  const cudaStream_t s = static_cast<cudaStream_t>(a.options.stream);
  if (p.dtype == DType::f32) throw Error("tileattn::decode: the cuda backend decodes f16 and bf16 caches; got f32");
  const Layout w = layout(p, a.options);
  Workspace ws(a.options, w.total, s);
  if (p.dtype == DType::f16)
    run_decode<__half>(p, a, w, ws.data(), s);
  else
    run_decode<__nv_bfloat16>(p, a, w, ws.data(), s);
}

void combine(const Problem& p, const CombineArgs& a) {
  DeviceGuard device(a.out.device.index);
  const cudaStream_t s = static_cast<cudaStream_t>(a.options.stream);
  CombineParams cp{};
  const TensorView &op = a.out_partial, &lp = a.lse_partial;
  cp.out_partial = op.ptr<const float>();
  cp.op_s = op.stride[0], cp.op_b = op.stride[1], cp.op_i = op.stride[2], cp.op_h = op.stride[3];
  cp.lse_partial = lp.ptr<const float>();
  cp.lp_s = lp.stride[0], cp.lp_b = lp.stride[1], cp.lp_h = lp.stride[2], cp.lp_i = lp.stride[3];
  cp.out = a.out.data, cp.o_b = a.out.stride[0], cp.o_i = a.out.stride[1], cp.o_h = a.out.stride[2];
  if (a.lse.present()) {
    cp.lse = a.lse.ptr<float>();
    cp.l_b = a.lse.stride[0], cp.l_h = a.lse.stride[1], cp.l_i = a.lse.stride[2];
  }
  cp.splits = static_cast<int>(op.shape[0]), cp.seqlen_q = p.seqlen_q, cp.heads = p.heads_q, cp.hdim_v = p.hdim_v;
  const unsigned rows = static_cast<unsigned>(p.batch * p.seqlen_q * p.heads_q);
  if (rows == 0) return;
  if (p.dtype == DType::f16)
    decoding::combine_kernel<__half><<<rows, decoding::kCombineThreads, 0, s>>>(cp);
  else if (p.dtype == DType::bf16)
    decoding::combine_kernel<__nv_bfloat16><<<rows, decoding::kCombineThreads, 0, s>>>(cp);
  else
    decoding::combine_kernel<float><<<rows, decoding::kCombineThreads, 0, s>>>(cp);
  check_launch("combine");
}

}  // namespace tileattn::cuda
