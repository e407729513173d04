#include "cpu/amx.hpp"

#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define TILEATTN_HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tileattn::cpu::amx {

#if TILEATTN_HAVE_AMX

// GCC 12's AVX-512 headers build results from _mm512_undefined_*() and warn about it once inlined.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

bool detect() {
  if (const char* e = std::getenv("TILEATTN_CPU_AMX"); e != nullptr && std::string_view(e) == "0") return false;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));  // F, BW, VL
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

#define TILEATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

// Every tile is 16 rows of 64 bytes: tmm0-3 accumulate, tmm4-5 hold A, tmm6-7 B.

// GCC's _tile_loadconfig tells the compiler it reads 8 bytes of the configuration, and its
// _tile_loadd reads no memory at all: the stores those instructions depend on could be dropped or
// moved past them. Hence our own ldtilecfg with the whole struct as its operand, and a compiler
// barrier ahead of every product's tile loads.
inline void stores_before_tile_loads() { __asm__ volatile("" ::: "memory"); }

TILEATTN_AMX_TARGET void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

TILEATTN_AMX_TARGET void release_tiles() { _tile_release(); }

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

// Pairs word i of a with word i of b: a's at even words, b's at odd ones (permutex2var indices; the
// next 16 words of each with 16 added).
TILEATTN_AMX_TARGET inline __m512i pair_words() {
  alignas(64) std::uint16_t idx[32];
  for (int i = 0; i < 16; ++i) idx[2 * i] = static_cast<std::uint16_t>(i), idx[2 * i + 1] = static_cast<std::uint16_t>(32 + i);
  return _mm512_load_si512(idx);
}

}  // namespace

bool available() {
  static const bool ok = detect();
  return ok;
}

Session::Session() { configure_tiles(); }
Session::~Session() { release_tiles(); }

// Steps (a 32 x 32 block of C, 32 of K) run in sequence, each register's next operand loaded
// right after the step's last product reading it. What counts is the block boundary: the next
// block's first operands load before this block's C is stored, not queued behind its stores. In a
// micro-benchmark of the forward's two products the order within a block changed nothing and this
// took 8-10% off a product on one thread; 6% off the bf16 forward on the Xeon of bench/notes/cpu.md.
TILEATTN_AMX_TARGET void product(const void* a, std::ptrdiff_t as, const void* b, std::ptrdiff_t bs, float* c,
                                 std::ptrdiff_t cs, int m, int n, int k, bool acc) {
  stores_before_tile_loads();
  const char* ab = static_cast<const char*>(a);
  const char* bb = static_cast<const char*>(b);
  char* cb = reinterpret_cast<char*>(c);
  const int ksteps = k / 32, nblocks = (n + 31) / 32, steps = (m + 31) / 32 * nblocks * ksteps;
  struct Step {
    const char *a0, *b0;
    char* c0;
    bool two_m, two_n, last;
  };
  auto step = [&](int s) {
    const int blk = s / ksteps, kk = s % ksteps, i = blk / nblocks * 32, j = blk % nblocks * 32;
    return Step{ab + i * as + 64 * kk, bb + kk * 16 * bs + 4 * j, cb + i * cs + 4 * j, i + 16 < m, j + 16 < n,
                kk == ksteps - 1};
  };
  auto load_c = [&](const Step& t) {
    if (!acc) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      return;
    }
    _tile_loadd(0, t.c0, cs);
    if (t.two_n) _tile_loadd(1, t.c0 + 64, cs);
    if (t.two_m) _tile_loadd(2, t.c0 + 16 * cs, cs);
    if (t.two_m && t.two_n) _tile_loadd(3, t.c0 + 16 * cs + 64, cs);
  };
  Step t = step(0);
  _tile_loadd(4, t.a0, as);
  _tile_loadd(6, t.b0, bs);
  if (t.two_n) _tile_loadd(7, t.b0 + 64, bs);
  if (t.two_m) _tile_loadd(5, t.a0 + 16 * as, as);
  load_c(t);
  for (int s = 0; s < steps; ++s) {
    const bool more = s + 1 < steps;
    const Step next = more ? step(s + 1) : t;
    _tile_dpbf16ps(0, 4, 6);
    if (t.two_n) _tile_dpbf16ps(1, 4, 7);
    if (more) _tile_loadd(4, next.a0, as);
    if (t.two_m) _tile_dpbf16ps(2, 5, 6);
    if (more) _tile_loadd(6, next.b0, bs);
    if (t.two_m && t.two_n) _tile_dpbf16ps(3, 5, 7);
    if (more && next.two_m) _tile_loadd(5, next.a0 + 16 * as, as);
    if (more && next.two_n) _tile_loadd(7, next.b0 + 64, bs);
    if (t.last) {
      _tile_stored(0, t.c0, cs);
      if (t.two_n) _tile_stored(1, t.c0 + 64, cs);
      if (t.two_m) _tile_stored(2, t.c0 + 16 * cs, cs);
      if (t.two_m && t.two_n) _tile_stored(3, t.c0 + 16 * cs + 64, cs);
      if (more) load_c(next);
    }
    t = next;
  }
}

const void* rows_operand(const void* src, std::ptrdiff_t& stride, int rows, int cols, std::uint16_t* stage) {
  const int w = pad32(cols), rows_pad = pad16(rows);
  if (w == cols && rows_pad == rows) return src;
  for (int j = 0; j < rows_pad; ++j) {
    const int n = j < rows ? cols : 0;
    if (n > 0) std::memcpy(stage + j * w, static_cast<const char*>(src) + j * stride, n * sizeof(std::uint16_t));
    std::memset(stage + j * w + n, 0, (w - n) * sizeof(std::uint16_t));
  }
  stride = w * static_cast<std::ptrdiff_t>(sizeof(std::uint16_t));
  return stage;
}

TILEATTN_AMX_TARGET void pack_column_pairs(const void* src, std::ptrdiff_t stride, int rows, int cols, int width,
                                           std::uint32_t* dst) {
  // 16 x 16 blocks of 32-bit words (pairs of values), transposed; the words move as they are.
  const int pairs = pad32(cols) / 2, words = cols / 2;
  const char* base = static_cast<const char*>(src);
  for (int p0 = 0; p0 < pairs; p0 += 16) {
    const int left = words - p0;
    const __mmask16 mask = left >= 16 ? 0xffff : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1u);
    for (int r0 = 0; r0 < width; r0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = r0 + i < rows ? _mm512_maskz_loadu_ps(mask, base + (r0 + i) * stride + 4 * p0) : _mm512_setzero_ps();
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (p0 + i) * width + r0), r[i]);
    }
  }
}

TILEATTN_AMX_TARGET void pack_row_pairs(const void* src, std::ptrdiff_t stride, int rows, int rows_pad, int cols,
                                        std::uint16_t* dst) {
  const int w = pad16(cols);
  const __m512i lo_i = pair_words(), hi_i = _mm512_add_epi16(lo_i, _mm512_set1_epi16(16));
  const char* base = static_cast<const char*>(src);
  for (int p = 0; p < rows_pad / 2; ++p) {
    const auto* x0 = reinterpret_cast<const std::uint16_t*>(base + (2 * p) * stride);
    const auto* x1 = reinterpret_cast<const std::uint16_t*>(base + (2 * p + 1) * stride);
    std::uint16_t* d = dst + static_cast<std::ptrdiff_t>(p) * 2 * w;
    for (int c = 0; c < w; c += 32) {
      const int left = cols - c;
      const __mmask32 mask = left >= 32 ? ~0u : left <= 0 ? 0u : (1u << left) - 1u;
      const __m512i a = 2 * p < rows ? _mm512_maskz_loadu_epi16(mask, x0 + c) : _mm512_setzero_si512();
      const __m512i b = 2 * p + 1 < rows ? _mm512_maskz_loadu_epi16(mask, x1 + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(d + 2 * c, _mm512_permutex2var_epi16(a, lo_i, b));
      if (c + 16 < w) _mm512_storeu_si512(d + 2 * c + 32, _mm512_permutex2var_epi16(a, hi_i, b));
    }
  }
}

// Row j's 16 values from column c0 (masked to the columns that exist; zero past `rows`), in the
// low half of a vector.
TILEATTN_AMX_TARGET inline __m512i row16(const char* base, std::ptrdiff_t stride, int rows, int j, int c0,
                                         __mmask16 mask) {
  return j < rows ? _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, base + j * stride + 2 * c0))
                  : _mm512_setzero_si512();
}

TILEATTN_AMX_TARGET void transpose_rows(const void* src, std::ptrdiff_t stride, int rows, int rows_pad, int cols,
                                        std::uint16_t* dst, int pitch) {
  const __m512i idx = pair_words();
  const char* base = static_cast<const char*>(src);
  // Blocks of 32 rows, each read whole before the next: a stream the prefetchers follow.
  for (int j0 = 0; j0 < rows_pad; j0 += 32) {
    for (int c0 = 0; c0 < cols; c0 += 16) {
      const __mmask16 mask = cols - c0 >= 16 ? 0xffff : static_cast<__mmask16>((1u << (cols - c0)) - 1u);
      // Word c of r[p]: (x_{j0+2p}[c0+c], x_{j0+2p+1}[c0+c]). Transposed, r[c] is column c0 + c's 32 rows.
      __m512 r[16];
      for (int p = 0; p < 16; ++p)
        r[p] = _mm512_castsi512_ps(_mm512_permutex2var_epi16(row16(base, stride, rows, j0 + 2 * p, c0, mask), idx,
                                                             row16(base, stride, rows, j0 + 2 * p + 1, c0, mask)));
      transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(dst + (c0 + c) * pitch + j0, _mm512_castps_si512(r[c]));
    }
  }
}

TILEATTN_AMX_TARGET void pair_round(const float* t, int keys, int keys_pad, std::uint32_t* dst) {
  // cvtne2ps(b, a) holds a's 16 values in words 0-15 and b's in 16-31: pair word i with word 16 + i.
  alignas(64) std::uint16_t idx_w[32];
  for (int i = 0; i < 16; ++i) idx_w[2 * i] = static_cast<std::uint16_t>(i), idx_w[2 * i + 1] = static_cast<std::uint16_t>(16 + i);
  const __m512i idx = _mm512_load_si512(idx_w);
  for (int p = 0; p < keys_pad / 2; ++p) {
    const int j = 2 * p;
    for (int r = 0; r < 64; r += 16) {
      const __m512 a = j < keys ? _mm512_loadu_ps(t + j * 64 + r) : _mm512_setzero_ps();
      const __m512 b = j + 1 < keys ? _mm512_loadu_ps(t + (j + 1) * 64 + r) : _mm512_setzero_ps();
      const __m512i ab = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
      _mm512_storeu_si512(dst + p * 64 + r, _mm512_permutexvar_epi16(idx, ab));
    }
  }
}

TILEATTN_AMX_TARGET void transpose(const float* src, int rows, int cols, float* dst) {
  for (int r0 = 0; r0 < rows; r0 += 16)
    for (int c0 = 0; c0 < cols; c0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + (r0 + i) * cols + c0);
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + (c0 + i) * rows + r0, r[i]);
    }
}

TILEATTN_AMX_TARGET void transpose_round(const float* t, int keys, int keys_pad, std::uint16_t* dst) {
  for (int rb = 0; rb < 64; rb += 16) {
    for (int j0 = 0; j0 < keys_pad; j0 += 32) {
      __m512 lo[16], hi[16];
      for (int i = 0; i < 16; ++i) {
        lo[i] = j0 + i < keys ? _mm512_loadu_ps(t + (j0 + i) * 64 + rb) : _mm512_setzero_ps();
        hi[i] = j0 + 16 + i < keys ? _mm512_loadu_ps(t + (j0 + 16 + i) * 64 + rb) : _mm512_setzero_ps();
      }
      transpose16(lo);
      transpose16(hi);
      for (int r = 0; r < 16; ++r)
        _mm512_storeu_si512(dst + (rb + r) * keys_pad + j0, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi[r], lo[r])));
    }
  }
}

TILEATTN_AMX_TARGET void round(const float* src, int n, std::uint16_t* dst) {
  for (int i = 0; i < n; i += 32)
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16),
                                                                                _mm512_loadu_ps(src + i))));
}

#else  // no AMX on this platform: available() is false and nothing else is ever called.

bool available() { return false; }
Session::Session() {}
Session::~Session() {}
void product(const void*, std::ptrdiff_t, const void*, std::ptrdiff_t, float*, std::ptrdiff_t, int, int, int, bool) {}
const void* rows_operand(const void* src, std::ptrdiff_t&, int, int, std::uint16_t*) { return src; }
void pack_column_pairs(const void*, std::ptrdiff_t, int, int, int, std::uint32_t*) {}
void pack_row_pairs(const void*, std::ptrdiff_t, int, int, int, std::uint16_t*) {}
void transpose_rows(const void*, std::ptrdiff_t, int, int, int, std::uint16_t*, int) {}
void pair_round(const float*, int, int, std::uint32_t*) {}
void transpose(const float*, int, int, float*) {}
void transpose_round(const float*, int, int, std::uint16_t*) {}
void round(const float*, int, std::uint16_t*) {}

#endif

}  // namespace tileattn::cpu::amx
