// The wgmma W4A16 kernel's x in the packed k order (ops/cuda/kernels/w4a16_packed_x.h), checked on
// the CPU: what its descriptor reads at each logical k is the x value each lane's weight words
// multiply in mma.sync's fragment layout, and the swizzled chunks tile each row exactly.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "ops/cuda/kernels/w4a16_packed_x.h"

namespace {

using qspec::cuda::kernels::packed_x_chunk_offset;
using qspec::cuda::kernels::packed_x_source_word;

constexpr int kTokens = 24;  // rows of a box (a multiple of 8, as the kernel's tiles)
constexpr int kBoxBytes = kTokens * 128;

// A stage's x (kTokens rows x 128 k, 16-bit values) written as the producer warps write it: each
// row's four 32-k blocks, logical word 4j + i of a block from physical word packed_x_source_word.
std::vector<uint8_t> write_stage(const std::vector<uint16_t>& x) {
  std::vector<uint8_t> smem(2 * kBoxBytes, 0xee);
  for (int row = 0; row < kTokens; ++row)
    for (int block = 0; block < 4; ++block) {
      const uint16_t* physical = x.data() + row * 128 + block * 32;
      for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 4; ++i) {
          const size_t at = (block / 2) * kBoxBytes + packed_x_chunk_offset(row, (block % 2) * 4 + j) + 4 * i;
          std::memcpy(smem.data() + at, physical + 2 * packed_x_source_word(4 * j + i), 4);
        }
    }
  return smem;
}

// The value the wgmma descriptor (128-byte swizzle, K-major rows of 64 k a box) reads at logical k.
uint16_t read_logical(const std::vector<uint8_t>& smem, int row, int k) {
  const size_t at = (k / 64) * kBoxBytes + packed_x_chunk_offset(row, (k % 64) / 8) + (k % 8) * 2;
  uint16_t value;
  std::memcpy(&value, smem.data() + at, 2);
  return value;
}

TEST(W4A16PackedX, TheDescriptorReadsWhatEachLanesWeightWordsMultiply) {
  std::mt19937 generator(7);
  std::vector<uint16_t> x(kTokens * 128);
  for (auto& v : x) v = static_cast<uint16_t>(generator());
  const std::vector<uint8_t> smem = write_stage(x);
  // Lane t's word s of a 32-k block holds physical k 8t + 4s .. + 3 (ops/w4a16_pack.h); as an A
  // fragment its k 8t + 4s, + 1 sit at logical 16s + 2t, + 1 and its k 8t + 4s + 2, + 3 at logical
  // 16s + 8 + 2t, + 1 (mma.sync's layout, which the mma.sync kernels feed with x's k 8t .. 8t + 7).
  int checked = 0;
  for (int row = 0; row < kTokens; ++row)
    for (int block = 0; block < 4; ++block)
      for (int t = 0; t < 4; ++t)
        for (int s = 0; s < 2; ++s)
          for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
              const int logical = block * 32 + 16 * s + 8 * h + 2 * t + e;
              const int physical = block * 32 + 8 * t + 4 * s + 2 * h + e;
              ASSERT_EQ(read_logical(smem, row, logical), x[row * 128 + physical])
                  << "row " << row << " logical k " << logical;
              ++checked;
            }
  EXPECT_EQ(checked, kTokens * 128);  // every k of every row, once
}

TEST(W4A16PackedX, SwizzledChunksTileEachRow) {
  std::set<uint32_t> seen;
  for (int row = 0; row < kTokens; ++row)
    for (int chunk = 0; chunk < 8; ++chunk) {
      const uint32_t at = packed_x_chunk_offset(row, chunk);
      EXPECT_EQ(at % 16, 0u);
      EXPECT_GE(at, static_cast<uint32_t>(row * 128));
      EXPECT_LT(at, static_cast<uint32_t>(row * 128 + 128));
      EXPECT_TRUE(seen.insert(at).second) << "row " << row << " chunk " << chunk;
    }
  // A 4 x 4 transpose of 4-byte pairs: each physical word is some logical word's, once.
  std::set<int> sources;
  for (int word = 0; word < 16; ++word) sources.insert(packed_x_source_word(word));
  EXPECT_EQ(sources.size(), 16u);
}

}  // namespace
