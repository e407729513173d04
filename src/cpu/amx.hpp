// The bf16 tile products of the CPU flash kernels on Intel AMX (Sapphire Rapids and later): bf16
// operands, fp32 accumulation, on the tile unit instead of widening to fp32 for AVX-512 FMAs.
// Highway has no AMX, so these few routines use the compiler's AMX and AVX-512 intrinsics, each
// built for that target alone; nothing here runs unless available().
//
// The unit multiplies A [16][32 bf16] by B [16][16 pairs]: B holds, for each pair of A's columns,
// the two values side by side. `Pairs` below names that form of a matrix X: X2[p][2c + e] =
// X[2p + e][c]. A product here is C (+)= A B over whole tiles, so the callers pad: M and N to 16,
// K to 32, with zeros where the padding meets K.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tileattn::cpu::amx {

// Whether this CPU runs AMX bf16 tiles and the OS grants this process the tile state (asked once),
// and TILEATTN_CPU_AMX is not "0".
bool available();

inline int pad16(int n) { return (n + 15) / 16 * 16; }
inline int pad32(int n) { return (n + 31) / 32 * 32; }

// Turns the tile unit on for this thread for the life of the object.
class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

// C[m][n] = (acc ? C[m][n] : 0) + sum_k A[m][k] B[k][n] for m < M, n < N, k < K (M and N multiples
// of 16, K of 32): A row-major bf16, B in pairs, C fp32; the strides are bytes between rows.
void product(const void* a, std::ptrdiff_t a_stride, const void* b, std::ptrdiff_t b_stride, float* c,
             std::ptrdiff_t c_stride, int m, int n, int k, bool acc);

// `rows` rows of `cols` bf16 (row j at src + j * stride bytes) as an A operand of pad16(rows) rows
// and pad32(cols) columns: src itself where those are whole tiles, else a zero-padded copy in
// `stage` (room for pad16(rows) * pad32(cols) bf16). Returns the operand; stride becomes its row
// stride.
const void* rows_operand(const void* src, std::ptrdiff_t& stride, int rows, int cols, std::uint16_t* stage);

// The columns of `rows` rows (row r at src + r * stride bytes) as the B operand of a product over
// them: dst[p][r] = (x_r[2p], x_r[2p + 1]) as one 32-bit word, p < pad32(cols) / 2, r < width (a
// multiple of 16); rows past `rows` and columns past `cols` zero.
void pack_column_pairs(const void* src, std::ptrdiff_t stride, int rows, int cols, int width, std::uint32_t* dst);

// Rows x_j (at src + j * stride bytes, j < rows) in pairs as a B operand: dst[p][2c + e] =
// x_{2p+e}[c] for p < rows_pad / 2, c < pad16(cols), zero past `rows` and `cols`; dst rows are
// 2 * pad16(cols) bf16 apart.
void pack_row_pairs(const void* src, std::ptrdiff_t stride, int rows, int rows_pad, int cols, std::uint16_t* dst);

// Rows x_j (at src + j * stride bytes, j < rows) transposed: dst[c][j] = x_j[c] for c < pad16(cols),
// j < rows_pad (a multiple of 32), zero past `rows` and `cols`; dst rows `pitch` bf16 apart. The A
// operand of a product over the rows.
void transpose_rows(const void* src, std::ptrdiff_t stride, int rows, int rows_pad, int cols, std::uint16_t* dst,
                    int pitch);

// A tile T [keys][64] fp32 (rows 64 floats apart) rounded in pairs of rows: dst[p][r] =
// (bf16(T[2p][r]), bf16(T[2p + 1][r])) as one 32-bit word, r < 64, p < keys_pad / 2 (keys_pad a
// multiple of 32; zero from `keys` on). The B operand of a product over the keys.
void pair_round(const float* t, int keys, int keys_pad, std::uint32_t* dst);

// dst[c][r] = src[r][c] for r < rows, c < cols (multiples of 16); fp32, rows cols and rows floats apart.
void transpose(const float* src, int rows, int cols, float* dst);

// A tile T [keys][64] fp32 (rows 64 floats apart) transposed and rounded: dst[r][j] = bf16(T[j][r])
// for r < 64, j < keys_pad (a multiple of 32; zero from `keys` on); dst rows keys_pad bf16 apart.
void transpose_round(const float* t, int keys, int keys_pad, std::uint16_t* dst);

// dst[i] = bf16(src[i]) for i < n (a multiple of 32).
void round(const float* src, int n, std::uint16_t* dst);

}  // namespace tileattn::cpu::amx
