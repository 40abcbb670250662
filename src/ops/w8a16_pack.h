// Offline repack of int8-group weights (quant/formats.h: the 8-bit tensors a GGUF keeps beside
// its 4-bit ones) into the layout the CUDA W8A16 kernel streams: plain C++, runs on the host,
// tested on the CPU (tests/unit/test_w8a16_pack.cpp).
//
// The kernel (ops/cuda/kernels/w8a16.cuh) computes y^T = W x^T with mma.sync m16n8k16: 16 weight
// rows are the A operand, 8 tokens the B operand, and every m16n8k16 covers 16 consecutive k
// values, so a group of 16 (GGUF Q6_K) or of a power of two from 32 (Q8_0, Q5_0: 32) ends on an
// mma boundary and the group's scale is applied to that group's exact sum (f32), never folded into
// f16 weights.
//
// Layout, per row block of 16 rows (rows past n are zero codes with zero scales), 16 * k bytes:
//   chunk c (32 k values: k tiles j = 0, 1 of 16): 512 bytes = 32 lanes x 16 bytes; lane L = 4g + t
//   holds 8 bytes a tile, tile j's at byte 8j. Inside tile j the mma k order is permuted so that
//   lane (g, t) needs x's 4 consecutive values at p = 32c + 16j + 4t (one 8-byte load of x): mma k
//   index 2t + s is physical k p + s, and 2t + 8 + s is p + 2 + s. The 8 bytes, as int8 codes:
//     W[g][p], W[g][p+1], W[g+8][p], W[g+8][p+1]        (the f16x2 registers a0a1, a2a3)
//     W[g][p+2], W[g][p+3], W[g+8][p+2], W[g+8][p+3]    (a4a5, a6a7)
//   The kernel turns a word of 4 codes into two f16x2 registers without a table: (code ^ 0x80)
//   under a 0x64 high byte is f16 1024 + 128 + code, exact; subtracting 1152 leaves the code.
// Scales: per row block, per group of `group` k values, 16 f32: word 2r = s[r], 2r + 1 = s[r + 8]
// (r < 8), so lane 4g + t reads one 8-byte pair for its two rows. The format's f32 scales are kept
// as they are (GGUF Q6_K's d * sc has more bits than f16 holds).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quant/quantized_linear.h"

namespace qspec::gemm {

struct W8A16Packed {
  int64_t n = 0, k = 0;
  int64_t group = 0;             // the format's group (w8a16_group_supported), dividing k
  std::vector<int8_t> codes;     // row_blocks() * k * 16 bytes
  std::vector<float> scales;     // row_blocks() * groups() * 16 (pairs s[r], s[r + 8])

  int64_t row_blocks() const { return (n + 15) / 16; }
  int64_t groups() const { return k / group; }
  // The weight W[row][col] this layout encodes: code * scale (f32, exact as the CPU decodes it).
  float value(int64_t row, int64_t col) const;
};

// The groups the W8A16 kernel takes: 16 (a scale a k tile) or a power of two from 32 (a scale
// every 2^s chunks of 32), which every GGUF 8-bit block and every usual RTN group is.
inline bool w8a16_group_supported(int64_t group) {
  return group == 16 || (group >= 32 && (group & (group - 1)) == 0);
}
// Whether the W8A16 kernel takes this matrix: int8-group with a supported group, k a multiple of
// 32 (a chunk) and of the group. The reason it does not, else "".
std::string w8a16_unsupported_reason(const QuantizedMatrix& weight);
// Throws qspec::Error naming the matrix where w8a16_unsupported_reason says why not.
W8A16Packed pack_w8a16(const QuantizedMatrix& weight);

}  // namespace qspec::gemm
