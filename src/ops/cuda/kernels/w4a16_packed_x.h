// Where the wgmma W4A16 kernel's producer warps put x when they write it in the packed k order
// (kernels/w4a16_wgmma.cuh, XP): plain C++ shared by the kernel and its CPU test.
//
// The 4-bit weights' one layout (ops/w4a16_pack.h) gives lane 4g + t of a warp, for each 32-k
// block, physical k 8t .. 8t + 7 of rows g and g + 8 in two words, which mma.sync takes as the A
// fragments of its two k16 steps with x's physical k 8t .. 8t + 7 as B: logical pair L = 4j + t
// of the block (k 2L, 2L + 1: j = 0, 1 the first step's low and high k, 2, 3 the second's) is
// physical pair P = 4t + j. The wgmma kernel reads x from shared memory in logical order (its
// descriptor), so x is stored permuted: logical 16-byte chunk j of a block holds physical words
// (4-byte pairs) j, 4 + j, 8 + j, 12 + j, in a 64-k box row of 128 bytes under the 128-byte
// swizzle (16-byte chunk c of row r at c ^ r % 8 in each 1024-byte atom of 8 rows).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define QSPEC_PACKED_X_FN __host__ __device__ constexpr
#else
#define QSPEC_PACKED_X_FN constexpr
#endif

namespace qspec::cuda::kernels {

// The byte offset in a box of logical 16-byte chunk `chunk` (0..7: k 8 chunk .. + 7 of the box's
// 64 k) of token row `row`; boxes are 1024-aligned.
QSPEC_PACKED_X_FN uint32_t packed_x_chunk_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) * 16));
}
// The physical word (0..15, a 4-byte pair of x) of a 32-k block that its logical word `word` holds.
QSPEC_PACKED_X_FN int packed_x_source_word(int word) { return 4 * (word & 3) + (word >> 2); }

}  // namespace qspec::cuda::kernels

#undef QSPEC_PACKED_X_FN
