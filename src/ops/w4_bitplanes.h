// Bit-plane layout of 4-bit weights for ADAngel's Bitwise strategy (issue 6; DPR: both operands
// decomposed into 1-bit planes, every plane pair one b1 mma.m16n8k256 with and.popc, products
// reconstructed with the planes' two's complement weights). Built from the packed W4A16 layout
// (ops/w4a16_pack.h): on the host by pack_w4_bitplanes (the CPU twin, tested against the packed
// layout's own decoding) and on the GPU by cuda::w4_bitplanes_from_packed; both call
// bitplane_word below, so the two agree by construction and the unit test pins the meaning.
//
// Needs k % 128 == 0 (one weight group of 128 a mma: the group's integer sum is what its scale
// multiplies). Per row block of 16 rows, per group G of 128 k values: 1024 bytes = 2 halves x 32
// lanes x 16 bytes (coalesced 16-byte loads). Lane L = 4g + t of half h holds four words e =
// 0..3 for the row quad q = 2h + e / 2 (rows 4q .. 4q + 3 of the block):
//   e even: the mma's A register a0 (A row g)     = block row 4q + g / 4,     weight plane g % 4
//   e odd:  A register a1 (A row g + 8)           = block row 4q + 2 + g / 4, weight plane g % 4
// bit b of a word = bit `plane` of the weight's 4-bit two's complement value (nibble u - 8, u the
// packed offset-binary nibble) at k = 128 G + 32 t + b. A rows are (weight row, plane) pairs, so
// one mma multiplies 4 weight rows x 4 planes by 8 activation columns (one int8 token's 8 planes,
// or two int4 tokens' 4 planes); plane i weighs 2^i, the sign plane 3 weighs -8.
#pragma once
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define QSPEC_HOST_DEVICE __host__ __device__
#else
#define QSPEC_HOST_DEVICE
#endif

namespace qspec::gemm {

inline constexpr int64_t kBitplaneGroup = 128;

// Byte offset inside a row block of the packed W4A16 layout of the word holding W[16 rb + r16][col],
// and the nibble of that word (the layout comment of ops/w4a16_pack.h).
QSPEC_HOST_DEVICE inline int64_t packed_word_byte(int64_t k, int64_t r16, int64_t col, int* nibble) {
  const int64_t g = r16 % 8, high_row = r16 / 8;
  const int64_t pair = col / 32, within = col % 32, t = within / 8, j = (within % 8) / 4, s = within % 4;
  const int64_t lane = 4 * g + t, chunk = pair / 2;
  // s = 0, 1, 2, 3 -> nibbles (n0, n4, n2, n6) of row g, (n1, n5, n3, n7) of row g + 8.
  *nibble = static_cast<int>((s == 0 ? 0 : s == 1 ? 4 : s == 2 ? 2 : 6) + high_row);
  if (k % 64 == 32 && chunk == k / 64) return chunk * 512 + lane * 8 + j * 4;  // the one-pair tail chunk
  return chunk * 512 + lane * 16 + ((pair & 1) * 2 + j) * 4;
}

// Word e of lane `lane`, half h, group `group` of one row block (block_codes: its packed bytes).
QSPEC_HOST_DEVICE inline uint32_t bitplane_word(const uint8_t* block_codes, int64_t k, int64_t group, int h, int lane,
                                                int e) {
  const int g = lane / 4, t = lane % 4;
  const int quad = 2 * h + e / 2, plane = g % 4;
  const int64_t r16 = 4 * quad + (e % 2 == 0 ? g / 4 : 2 + g / 4);
  const int64_t k0 = group * kBitplaneGroup + 32 * t;
  uint32_t word = 0;
  for (int b = 0; b < 32; ++b) {
    int nibble = 0;
    const int64_t at = packed_word_byte(k, r16, k0 + b, &nibble);
    const uint32_t packed = static_cast<uint32_t>(block_codes[at]) | (static_cast<uint32_t>(block_codes[at + 1]) << 8) |
                            (static_cast<uint32_t>(block_codes[at + 2]) << 16) |
                            (static_cast<uint32_t>(block_codes[at + 3]) << 24);
    const uint32_t twos = ((packed >> (4 * nibble)) & 0xfu) ^ 0x8u;  // u - 8 as a 4-bit two's complement
    word |= ((twos >> plane) & 1u) << b;
  }
  return word;
}

// Bytes of the bit-plane copy (the same as the packed codes: 4 bits a weight).
inline int64_t bitplane_bytes(int64_t n, int64_t k) { return (n + 15) / 16 * k * 8; }

struct W4A16Packed;
// The bit-plane copy of packed weights; throws qspec::Error when k % 128 != 0 or the kernel group
// is not 128.
std::vector<uint8_t> pack_w4_bitplanes(const W4A16Packed& packed);
// Bit `plane` (0..3) of W[row][col]'s two's complement value, read back from a bit-plane copy.
int bitplane_bit(const std::vector<uint8_t>& planes, int64_t k, int64_t row, int64_t col, int plane);

}  // namespace qspec::gemm
