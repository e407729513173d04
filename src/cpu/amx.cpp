#include "cpu/amx.hpp"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "cpu/flash_common.hpp"

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define TILEATTN_HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tileattn::cpu::amx {

using flash::kBc;
using flash::kBr;

#if TILEATTN_HAVE_AMX

// GCC 12's AVX-512 headers build results from _mm512_undefined_*() and warn about it once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

bool detect() {
  if (const char* e = std::getenv("TILEATTN_CPU_AMX"); e != nullptr && std::string_view(e) == "0") return false;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 30));  // F, BW
  const bool tiles = (d & (1u << 24)) && (d & (1u << 22));   // AMX-TILE, AMX-BF16
  if (!avx512 || !tiles || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;  // AVX512-BF16
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  // The OS saves SSE, AVX, the AVX-512 state and the tile state.
  constexpr unsigned long long kState = 0x6 | 0xe0 | (3ull << 17);
  if (((static_cast<unsigned long long>(hi) << 32 | lo) & kState) != kState) return false;
  // Linux hands out the 8 KB tile data state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
  constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
}

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

#define TILEATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))

// Every tile is 16 rows of 64 bytes: tmm0-3 accumulate, tmm4-5 hold A, tmm6-7 B.
constexpr std::ptrdiff_t kSRow = kBr * sizeof(float);  // bytes per key row of S^T, and per pair row of qt

// The 16 x 16 transpose of r (rows in, columns out), by the usual three rounds of shuffles.
TILEATTN_AMX_TARGET inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  __m512 u[16];
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // u[4g + e], 128-bit lane L: rows 4g..4g+3 of column 4L + e.
  for (int e = 0; e < 4; ++e) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xee);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xee);
    r[e] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + e] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
    r[8 + e] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + e] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
  }
}

// pb[r][j] = bf16(P^T[j][r]) for j < 32 * chunks (zero from nk on), r < kBr.
TILEATTN_AMX_TARGET void pack_probs(const float* pt, int nk, int chunks, std::uint16_t* pb) {
  for (int rb = 0; rb < kBr; rb += 16) {
    for (int j0 = 0; j0 < 32 * chunks; j0 += 32) {
      __m512 lo[16], hi[16];
      for (int i = 0; i < 16; ++i) {
        lo[i] = j0 + i < nk ? _mm512_loadu_ps(pt + (j0 + i) * kBr + rb) : _mm512_setzero_ps();
        hi[i] = j0 + 16 + i < nk ? _mm512_loadu_ps(pt + (j0 + 16 + i) * kBr + rb) : _mm512_setzero_ps();
      }
      transpose16(lo);
      transpose16(hi);
      for (int r = 0; r < 16; ++r)
        _mm512_storeu_si512(pb + (rb + r) * kBc + j0, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi[r], lo[r])));
    }
  }
}

// vv[p][2c + e] = v_{2p+e}[c] for p < 16 * chunks, c < dvp (zero past nk and dv).
TILEATTN_AMX_TARGET void pack_values(const std::uint16_t* v, std::ptrdiff_t v_stride, int nk, int chunks, int dv,
                                     std::uint16_t* vv) {
  const int dvp = dv_pad(dv);
  alignas(64) std::uint16_t lo_idx[32], hi_idx[32];
  for (int i = 0; i < 16; ++i) {
    lo_idx[2 * i] = static_cast<std::uint16_t>(i), lo_idx[2 * i + 1] = static_cast<std::uint16_t>(32 + i);
    hi_idx[2 * i] = static_cast<std::uint16_t>(16 + i), hi_idx[2 * i + 1] = static_cast<std::uint16_t>(48 + i);
  }
  const __m512i lo_i = _mm512_load_si512(lo_idx), hi_i = _mm512_load_si512(hi_idx);
  const char* base = reinterpret_cast<const char*>(v);
  for (int p = 0; p < 16 * chunks; ++p) {
    const std::uint16_t* v0 = reinterpret_cast<const std::uint16_t*>(base + (2 * p) * v_stride);
    const std::uint16_t* v1 = reinterpret_cast<const std::uint16_t*>(base + (2 * p + 1) * v_stride);
    std::uint16_t* dst = vv + static_cast<std::ptrdiff_t>(p) * 2 * dvp;
    for (int c = 0; c < dvp; c += 32) {
      const int left = dv - c;
      const __mmask32 m = left >= 32 ? ~0u : left <= 0 ? 0u : (1u << left) - 1u;
      const __m512i a = 2 * p < nk ? _mm512_maskz_loadu_epi16(m, v0 + c) : _mm512_setzero_si512();
      const __m512i b = 2 * p + 1 < nk ? _mm512_maskz_loadu_epi16(m, v1 + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * c, _mm512_permutex2var_epi16(a, lo_i, b));
      if (c + 16 < dvp) _mm512_storeu_si512(dst + 2 * c + 32, _mm512_permutex2var_epi16(a, hi_i, b));
    }
  }
}

// GCC's _tile_loadconfig tells the compiler it reads 8 bytes of the configuration, and its
// _tile_loadd reads no memory at all: the stores those instructions depend on could be dropped or
// moved past them. Hence our own ldtilecfg with the whole struct as its operand, and a compiler
// barrier between packing an operand with ordinary stores and loading it into a tile.
inline void stores_before_tile_loads() { __asm__ volatile("" ::: "memory"); }

TILEATTN_AMX_TARGET void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

TILEATTN_AMX_TARGET void release_tiles() { _tile_release(); }

}  // namespace

bool available() {
  static const bool ok = detect();
  return ok;
}

Session::Session() { configure_tiles(); }
Session::~Session() { release_tiles(); }

void pack_query(const std::uint16_t* q, std::ptrdiff_t q_stride, int rows, int d, std::uint32_t* qt) {
  const int pairs = dim_pad(d) / 2;
  std::memset(qt, 0, static_cast<std::size_t>(pairs) * kBr * sizeof(std::uint32_t));
  const char* base = reinterpret_cast<const char*>(q);
  for (int r = 0; r < rows; ++r) {
    const char* row = base + r * q_stride;
    for (int p = 0; p < d / 2; ++p) std::memcpy(qt + p * kBr + r, row + 4 * p, 4);
  }
}

TILEATTN_AMX_TARGET void scores(const std::uint16_t* k, std::ptrdiff_t k_stride, int nk, int d,
                                const std::uint32_t* qt, std::uint16_t* stage, float* st) {
  const int dp = dim_pad(d), blocks = (nk + 15) / 16;
  const char* kb = reinterpret_cast<const char*>(k);
  std::ptrdiff_t ks = k_stride;
  if (d != dp || nk != 16 * blocks) {
    for (int j = 0; j < 16 * blocks; ++j) {
      std::uint16_t* dst = stage + j * dp;
      const int n = j < nk ? d : 0;
      if (n > 0) std::memcpy(dst, kb + j * ks, n * sizeof(std::uint16_t));
      std::memset(dst + n, 0, (dp - n) * sizeof(std::uint16_t));
    }
    kb = reinterpret_cast<const char*>(stage);
    ks = dp * static_cast<std::ptrdiff_t>(sizeof(std::uint16_t));
    stores_before_tile_loads();
  }
  const char* qb = reinterpret_cast<const char*>(qt);
  for (int b = 0; b < blocks; b += 2) {
    const bool two = b + 1 < blocks;
    const char* k0 = kb + b * 16 * ks;
    for (int rb = 0; rb < kBr / 16; rb += 2) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int c = 0; c < dp; c += 32) {
        const char* q0 = qb + (c / 2) * kSRow + rb * 64;
        _tile_loadd(4, k0 + 2 * c, ks);
        _tile_loadd(6, q0, kSRow);
        _tile_loadd(7, q0 + 64, kSRow);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, k0 + 16 * ks + 2 * c, ks);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      float* s = st + b * 16 * kBr + rb * 16;
      _tile_stored(0, s, kSRow);
      _tile_stored(1, s + 16, kSRow);
      if (two) {
        _tile_stored(2, s + 16 * kBr, kSRow);
        _tile_stored(3, s + 16 * kBr + 16, kSRow);
      }
    }
  }
}

TILEATTN_AMX_TARGET void accumulate(const float* pt, int nk, const std::uint16_t* v, std::ptrdiff_t v_stride, int dv,
                                    std::uint16_t* pb, std::uint16_t* vv, float* o, bool first) {
  const int chunks = (nk + 31) / 32, dvp = dv_pad(dv), cols = dvp / 16;
  pack_probs(pt, nk, chunks, pb);
  pack_values(v, v_stride, nk, chunks, dv, vv);
  stores_before_tile_loads();
  const std::ptrdiff_t os = dvp * sizeof(float), ps = kBc * sizeof(std::uint16_t), vs = 2 * dvp * sizeof(std::uint16_t);
  const char* pbb = reinterpret_cast<const char*>(pb);
  const char* vvb = reinterpret_cast<const char*>(vv);
  for (int rb = 0; rb < kBr / 16; rb += 2) {
    for (int cb = 0; cb < cols; cb += 2) {
      const bool two = cb + 1 < cols;
      float* o0 = o + rb * 16 * dvp + cb * 16;
      float* o1 = o0 + 16 * dvp;
      if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      } else {
        _tile_loadd(0, o0, os);
        _tile_loadd(2, o1, os);
        if (two) {
          _tile_loadd(1, o0 + 16, os);
          _tile_loadd(3, o1 + 16, os);
        }
      }
      for (int ch = 0; ch < chunks; ++ch) {
        const char* v0 = vvb + ch * 16 * vs + cb * 64;
        _tile_loadd(4, pbb + rb * 16 * ps + ch * 64, ps);
        _tile_loadd(5, pbb + (rb + 1) * 16 * ps + ch * 64, ps);
        _tile_loadd(6, v0, vs);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (two) {
          _tile_loadd(7, v0 + 64, vs);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, o0, os);
      _tile_stored(2, o1, os);
      if (two) {
        _tile_stored(1, o0 + 16, os);
        _tile_stored(3, o1 + 16, os);
      }
    }
  }
}

#else  // no AMX on this platform: available() is false and nothing else is ever called.

bool available() { return false; }
Session::Session() {}
Session::~Session() {}
void pack_query(const std::uint16_t*, std::ptrdiff_t, int, int, std::uint32_t*) {}
void scores(const std::uint16_t*, std::ptrdiff_t, int, int, const std::uint32_t*, std::uint16_t*, float*) {}
void accumulate(const float*, int, const std::uint16_t*, std::ptrdiff_t, int, std::uint16_t*, std::uint16_t*, float*,
                bool) {}

#endif

}  // namespace tileattn::cpu::amx
