// The bf16 forward's tile products on Intel AMX (Sapphire Rapids and later): S^T = K Q^T and
// O += P V from bf16 operands with fp32 accumulation, on the tile unit instead of widening to fp32
// and running AVX-512 FMAs. Highway has no AMX, so these few routines use the compiler's AMX and
// AVX-512 intrinsics, each built for that target alone; nothing here runs unless available().
//
// Layouts are the flash forward's: scores transposed (S^T [keys][kBr], a query row per lane), the
// output row-major (O [kBr][dvp]). The tile unit multiplies A [16][32 bf16] by B [16][16 pairs],
// B holding for each pair of A's columns the two values side by side; `pairs` below means that
// form: X2[p][2c + e] = X[2p + e][c].
#pragma once

#include <cstddef>
#include <cstdint>

namespace tileattn::cpu::amx {

// Whether this CPU runs AMX bf16 tiles and the OS grants this process the tile state (asked once),
// and TILEATTN_CPU_AMX is not "0".
bool available();

// Head dims padded for the tiles: the products run over 32 bf16 at a time, outputs 16 fp32 wide.
inline int dim_pad(int d) { return (d + 31) / 32 * 32; }
inline int dv_pad(int dv) { return (dv + 15) / 16 * 16; }

// Turns the tile unit on for this thread for the life of the object (one query tile's products).
class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

// The query tile as the scores' B operand: qt[p][r] = the pair (q_r[2p], q_r[2p + 1]) as one
// 32-bit word, p < dim_pad(d) / 2, r < kBr; rows past `rows` and dims past d zero. Row r of the
// query lies at q + r * q_stride (bytes).
void pack_query(const std::uint16_t* q, std::ptrdiff_t q_stride, int rows, int d, std::uint32_t* qt);

// S^T[j][r] = k_j . q_r (fp32, raw products) for keys j < nk <= kBc, rows rounded up to 16; key j
// lies at k + j * k_stride (bytes). K is read in place when d is a multiple of 32 and nk of 16,
// else through `stage` (kBc * dim_pad(d) bf16).
void scores(const std::uint16_t* k, std::ptrdiff_t k_stride, int nk, int d, const std::uint32_t* qt,
            std::uint16_t* stage, float* st);

// O[r][c] = (first ? 0 : O[r][c]) + sum_{j < nk} P^T[j][r] v_j[c], P rounded to bf16 as the
// product's operand; O is [kBr][dv_pad(dv)], v_j lies at v + j * v_stride (bytes). `pb` (kBr * kBc
// bf16) and `vv` (kBc * dv_pad(dv) bf16) hold the operands in the unit's layout.
void accumulate(const float* pt, int nk, const std::uint16_t* v, std::ptrdiff_t v_stride, int dv,
                std::uint16_t* pb, std::uint16_t* vv, float* o, bool first);

}  // namespace tileattn::cpu::amx
