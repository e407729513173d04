// Split-KV decoding on the CPU (flash-decoding): new keys and values are appended to the cache,
// then each (sequence, KV head, key split, query tile) task attends with AttendTile, and the
// splits' partial outputs are merged by their LSE. A query tile packs every query head of the
// GQA group with every query row, so each cached key and value is read once per group.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_decode.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "core/backends.hpp"
#include "cpu/flash_simd-inl.h"
#include "cpu/lse_merge.hpp"
#include "cpu/parallel.hpp"
#include "cpu/tensor_io.hpp"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tileattn::cpu::HWY_NAMESPACE {

template <class T>
void DecodeT(const Problem& p, const DecodeArgs& a) {
  const int D = p.hdim_qk, DV = p.hdim_v, sq = p.seqlen_q, group = p.group();
  const std::size_t es = sizeof(T);
  auto cache_len = [&](int b) { return a.cache_seqlens.present() ? static_cast<int>(load_i32(a.cache_seqlens, b)) : p.seqlen_k; };
  // Address of cache row pos of sequence b, KV head g.
  auto cache_row = [&](const TensorView& c, int b, int pos, int g) {
    std::int64_t off;
    if (p.paged) {
      const std::int64_t page = a.page_table.ptr<const std::int32_t>()[b * a.page_table.stride[0] + (pos / p.page_size) * a.page_table.stride[1]];
      off = elem(c, false, static_cast<int>(page), pos % p.page_size, g);
    } else {
      off = elem(c, false, b, pos, g);
    }
    return reinterpret_cast<T*>(static_cast<char*>(c.data) + off * es);
  };
  // Rotary embedding of the first rotary_dim features of x (fp32) at position pos.
  auto rotate = [&](float* x, int pos) {
    const int half = p.rotary_dim / 2;
    for (int c = 0; c < half; ++c) {
      const float cs = load_f32(a.rotary_cos, pos * a.rotary_cos.stride[0] + c);
      const float sn = load_f32(a.rotary_sin, pos * a.rotary_sin.stride[0] + c);
      const int i0 = a.rotary_interleaved ? 2 * c : c, i1 = a.rotary_interleaved ? 2 * c + 1 : c + half;
      const float x0 = x[i0], x1 = x[i1];
      x[i0] = x0 * cs - x1 * sn;
      x[i1] = x1 * cs + x0 * sn;
    }
  };

  // Append, before any task reads the cache.
  if (p.seqlen_new > 0) {
    parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_kv, [&](std::int64_t begin, std::int64_t end) {
      float* row = flash::thread_tiles(static_cast<std::size_t>(D));
      for (std::int64_t t = begin; t < end; ++t) {
        const int b = static_cast<int>(t / p.heads_kv), g = static_cast<int>(t % p.heads_kv);
        for (int n = 0; n < p.seqlen_new; ++n) {
          const int pos = cache_len(b) + n;
          const char* kn = static_cast<const char*>(a.k_new.data) + elem(a.k_new, false, b, n, g) * es;
          const char* vn = static_cast<const char*>(a.v_new.data) + elem(a.v_new, false, b, n, g) * es;
          if (p.rotary_dim > 0) {
            LoadRow(reinterpret_cast<const T*>(kn), row, D);
            rotate(row, pos);
            StoreRow(row, cache_row(a.k_cache, b, pos, g), D);
          } else {
            std::memcpy(cache_row(a.k_cache, b, pos, g), kn, D * es);
          }
          std::memcpy(cache_row(a.v_cache, b, pos, g), vn, DV * es);
        }
      }
    });
  }

  const int splits = flash::decode_splits(p, a.options);
  const int rows_per_group = group * sq;
  const int qtiles = (rows_per_group + kBr - 1) / kBr;
  flash::Workspace ws(a.options, flash::decode_scratch_bytes(p, a));
  const std::int64_t out_rows = static_cast<std::int64_t>(p.batch) * p.heads_q * sq;  // [b][h][i]
  float* Opart = splits > 1 ? ws.floats(static_cast<std::size_t>(splits) * out_rows * DV) : nullptr;
  float* Lpart = splits > 1 ? ws.floats(static_cast<std::size_t>(splits) * out_rows) : nullptr;
  // Every query row at the cache length, or at consecutive positions when the mask is causal or
  // windowed (flash_attn_with_kvcache's rule, as the API documents).

  parallel_for(static_cast<std::int64_t>(p.batch) * p.heads_kv * splits * qtiles, [&](std::int64_t begin, std::int64_t end) {
    float* tiles = flash::thread_tiles(attend_tile_floats(D, DV));
    TileRows rows;
    for (std::int64_t t = begin; t < end; ++t) {
      const int qt = static_cast<int>(t % qtiles), split = static_cast<int>(t / qtiles % splits);
      const int g = static_cast<int>(t / qtiles / splits % p.heads_kv);
      const int b = static_cast<int>(t / qtiles / splits / p.heads_kv);
      const int len = cache_len(b), sk = len + p.seqlen_new;
      const int chunk = ((sk + splits - 1) / splits + kBc - 1) / kBc * kBc;
      const int lo = std::min(sk, split * chunk), hi = std::min(sk, lo + chunk);
      AttendShape sh;
      sh.d = D;
      sh.dv = DV;
      sh.var = p.variant(sq, sk, a.options);
      const int r0 = qt * kBr, n = std::min(kBr, rows_per_group - r0);
      rows.reset();
      for (int r = 0; r < n; ++r) {
        const int h = g * group + (r0 + r) / sq, i = (r0 + r) % sq;
        rows.set(r, sh.var, i, alibi_slope(p, a.alibi_slopes, b, h), 0);
      }
      rows.finish(n, flash::tile_lanes(n));  // a few rows (decode) take 16 lanes, not kBr
      auto emit = [&](int r, const float* o, float lse) {
        const int h = g * group + (r0 + r) / sq, i = (r0 + r) % sq;
        if (splits == 1) {
          StoreRow(o, reinterpret_cast<T*>(static_cast<char*>(a.out.data) + elem(a.out, false, b, i, h) * es), DV);
          if (a.lse.present()) a.lse.ptr<float>()[lse_elem(a.lse, false, b, i, h)] = lse;
          return;
        }
        const std::int64_t orow = static_cast<std::int64_t>(split) * out_rows + (static_cast<std::int64_t>(b) * p.heads_q + h) * sq + i;
        std::memcpy(Opart + orow * DV, o, sizeof(float) * DV);
        Lpart[orow] = lse;
      };
      AttendTile<T>(
          sh, rows,
          [&](int r, float* dst) {
            const int h = g * group + (r0 + r) / sq, i = (r0 + r) % sq;
            LoadRow(reinterpret_cast<const T*>(static_cast<const char*>(a.q.data) + elem(a.q, false, b, i, h) * es), dst, D);
            if (p.rotary_dim > 0) rotate(dst, len + (p.rotary_per_row ? i : 0));
          },
          [&](int j) { return static_cast<const T*>(cache_row(a.k_cache, b, j, g)); },
          [&](int j) { return static_cast<const T*>(cache_row(a.v_cache, b, j, g)); }, 0, 0, DenseKeys{lo, hi}, tiles, emit);
    }
  });
  if (splits == 1) return;

  parallel_for(out_rows, [&](std::int64_t begin, std::int64_t end) {
    float* w = flash::thread_tiles(static_cast<std::size_t>(splits) + DV);
    float* acc = w + splits;
    for (std::int64_t r = begin; r < end; ++r) {
      for (int s = 0; s < splits; ++s) w[s] = Lpart[s * out_rows + r];
      const float lse = lse_merge_weights(w, splits);
      std::fill(acc, acc + DV, 0.f);
      for (int s = 0; s < splits; ++s) {
        if (w[s] == 0.f) continue;
        const float* src = Opart + (s * out_rows + r) * DV;
        for (int c = 0; c < DV; ++c) acc[c] += w[s] * src[c];
      }
      const int i = static_cast<int>(r % sq), h = static_cast<int>(r / sq % p.heads_q), b = static_cast<int>(r / sq / p.heads_q);
      StoreRow(acc, reinterpret_cast<T*>(static_cast<char*>(a.out.data) + elem(a.out, false, b, i, h) * es), DV);
      if (a.lse.present()) a.lse.ptr<float>()[lse_elem(a.lse, false, b, i, h)] = lse;
    }
  });
}

void FlashDecode(const Problem& p, const DecodeArgs& a) {
  switch (p.dtype) {
    case DType::f16: return DecodeT<hwy::float16_t>(p, a);
    case DType::bf16: return DecodeT<hwy::bfloat16_t>(p, a);
    default: return DecodeT<float>(p, a);
  }
}

}  // namespace tileattn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tileattn::cpu {

HWY_EXPORT(FlashDecode);

void flash_decode(const Problem& p, const DecodeArgs& a) { HWY_DYNAMIC_DISPATCH(FlashDecode)(p, a); }

std::size_t workspace_size(const Problem& p, const DecodeArgs& a) {
  return flash::reported_bytes(flash::decode_scratch_bytes(p, a));
}

}  // namespace tileattn::cpu
#endif
