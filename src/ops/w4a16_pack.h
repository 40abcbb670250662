// Offline repack of int4 weights (quant/quantized_linear.h) into the layout the CUDA W4A16
// kernels stream: plain C++, runs on the host, tested on the CPU (tests/unit/test_w4a16_pack.cpp
// also simulates the kernel's tensor-core fragments on it).
//
// The kernel computes y^T = W x^T with mma.sync m16n8k16: 16 weight rows are the A operand
// (16 x 16 per k tile), 8 tokens the B operand. Layout, per row block of 16 rows (rows past n
// are zero with zero scales), k*8 bytes each:
//
//   chunk c (64 k values, k pairs P = 2c, 2c+1 of 32 values): 512 bytes = 32 lanes x 16 bytes;
//   lane L = 4g + t holds four 32-bit words, word 2*(P&1) + j = A fragment of k tile j of pair P.
//   When k % 64 == 32 the last chunk holds one pair: 32 lanes x 8 bytes (words j = 0, 1).
//
// Inside a pair the tensor-core k order is permuted so that one 16-byte load of x (8
// consecutive values at 32P + 8t) feeds both k tiles: mma k index 2t+s (s = 0, 1) of tile j is
// physical k = 32P + 8t + 4j + s, and mma k index 2t+8+s is 32P + 8t + 4j + 2 + s. With
// p = 32P + 8t + 4j, the word's nibbles (nibble i = bits 4i..4i+3) are
//   n0 = W[g][p]   n4 = W[g][p+1]     (the f16x2 register a0a1)
//   n1 = W[g+8][p] n5 = W[g+8][p+1]   (a2a3)
//   n2 = W[g][p+2] n6 = W[g][p+3]     (a4a5)
//   n3 = W[g+8][p+2] n7 = W[g+8][p+3] (a6a7)
// each as offset binary u = code + 8 (value u - 8), so the lop3 / 0x6400 f16 trick turns a
// word into four f16x2 registers without a table: (q & 0x000f000f) | 0x64006400 = 1024 + u.
//
// Scales: per row block, per kernel group of `group` k values (32, 64 or 128), 8 words: word
// r = f16 pair (s[r], s[r+8]) (low half s[r]), so lane 4g+t reads word g for its two rows.
// A format group larger than 128 (int4-channel: one scale per row) repeats its scale.
//
// int4-asym (zero points, issue 55): the nibbles are the unsigned codes 0..15 themselves (value
// fma(code, s, m)), and `mins` holds an f16 minimum per group in the scales' layout (word r =
// (m[r], m[r+8])), a separate array so the symmetric kernels' scale loads stay as they are (the
// GPU keeps it right after the scales in their buffer, cuda::W4A16Weights::mins). The
// format's f32 scale and minimum are rounded to f16 here (the GPU's one weight set); the
// kernels turn (q & 0x000f000f) | 0x64006400 into 1024 + code and subtract 1024.
//
// int4-zp (integer zero points): the unsigned codes as int4-asym's, the f16 scales as int4's, and
// in `mins` (flagged zero_codes) the zero points, 4 bits each: per row block, per group, 8 bytes,
// byte r = z[r] | z[r + 8] << 4, a row block's groups padded to an even count (16 bytes a group
// pair, so copies stay 16-byte aligned; zero_point_bytes_per_row_block). Lane 4g + t takes byte g
// and makes from it the two constants the dequantization subtracts or adds where int4's are 1032
// and -72: (byte & 0xf) | 0x6400 is f16 1024 + z[g] and (byte & 0xf0) | 0xd400 is f16 -(64 + z[g
// + 8]) (a word's low nibbles are row g's, (1024 + u) - (1024 + z); its high ones row g + 8's,
// (1024 + 16 u) / 16 - 64 - z), so the kernels run int4's loop and group flush with s * (u - z),
// exactly. A quarter of the bytes f16 minimums take: +0.8 / 1.5 / 2.9 % over int4's codes and
// scales at groups of 128 / 64 / 32.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/quantized_linear.h"

namespace qspec::gemm {

struct W4A16Packed {
  int64_t n = 0, k = 0;
  int64_t group = 0;              // kernel group: 32, 64 or 128
  std::vector<uint8_t> codes;     // row_blocks() * k * 8 bytes
  std::vector<uint32_t> scales;   // row_blocks() * (k / group) * 8 f16 pairs
  std::vector<uint32_t> mins;     // int4-asym: as scales, the f16 group minimums; int4-zp: zero points (above)
  bool zero_codes = false;        // int4-zp: mins holds packed zero points, not minimums

  int64_t row_blocks() const { return (n + 15) / 16; }
  int64_t groups() const { return k / group; }
  bool has_min() const { return !mins.empty(); }
  // The weight W[row][col] this layout encodes (reference decoding, f32).
  float value(int64_t row, int64_t col) const;
};

// int4-zp: the bytes of a row block's packed zero points (8 a group, groups padded to even).
inline int64_t zero_point_bytes_per_row_block(int64_t groups) { return 8 * (groups + (groups & 1)); }

// Largest kernel group (128, 64, 32) that divides the format's block, or 0 when the matrix
// cannot be packed (not int4 / int4-channel / int4-asym, or a block not a multiple of 32).
int64_t w4a16_kernel_group(const QuantizedMatrix& weight);
// Throws qspec::Error naming the matrix when w4a16_kernel_group is 0.
W4A16Packed pack_w4a16(const QuantizedMatrix& weight);
// int4-asym: rounds every group's f32 scale and minimum to the f16 values pack_w4a16 keeps (the
// codes unchanged), so that the CPU then decodes exactly the GPU's weights (tests compare the two
// this way). No-op for the other formats (int4-zp's values are the GPU's already).
void round_zero_point_blocks_to_f16(QuantizedMatrix& weight);

// x in the packed k order (cuda::W4A16TiledConfig::x_packed): where x's element k goes. Inside a
// pair, mma k index 2t + s of tile j is physical k 8t + 4j + s and 2t + 8 + s is 8t + 4j + 2 + s
// (above), so a tensor-core B operand read in natural order from memory (the wgmma kernel's x, by
// TMA) meets the codes' order when each 32-k block holds, at 4-byte piece 4q + t, x's piece 4t + q
// (q = 2j + h, h the half of the tile): the 4 x 4 transpose of the block's 4-byte pieces. Its own
// inverse. k % 32 == 0 is the caller's (every packed matrix's k is).
inline int64_t w4a16_packed_x_index(int64_t k) {
  const int64_t block = k & ~int64_t{31}, piece = (k & 31) >> 1;
  return block + 2 * (4 * (piece & 3) + (piece >> 2)) + (k & 1);
}
// Rows of x (m rows of k values at pitch ldx, f16 bits or any 16-bit type) in that order.
std::vector<uint16_t> w4a16_pack_x_order(const uint16_t* x, int64_t m, int64_t k, int64_t ldx);

}  // namespace qspec::gemm
