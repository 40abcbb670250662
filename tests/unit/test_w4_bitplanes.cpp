// The Bitwise strategy's bit-plane weight copy (ops/w4_bitplanes.h) on the CPU: read back plane by
// plane it reconstructs every 4-bit two's complement weight of the matrix (zero rows past n), so the
// layout the b1 kernel streams holds exactly the packed weights; shapes it cannot hold are refused.
// The GPU harness checks the GPU conversion against this one byte for byte.
#include <gtest/gtest.h>

#include <random>

#include "random_weights.h"
#include "ops/w4_bitplanes.h"
#include "ops/w4a16_pack.h"
#include "qspec/error.h"

namespace {

qspec::QuantizedMatrix random_int4(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
  std::mt19937 generator(seed);
  return qspec::test::random_int4_matrix(generator, rows, cols, group, 1.0f);
}

}  // namespace

TEST(W4Bitplanes, PlanesReconstructEveryWeight) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 384}, {16, 128}, {130, 256}}) {
    const qspec::QuantizedMatrix weight = random_int4(rows, cols, 128, static_cast<uint32_t>(rows * 7 + cols));
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    const std::vector<uint8_t> planes = qspec::gemm::pack_w4_bitplanes(packed);
    ASSERT_EQ(static_cast<int64_t>(planes.size()), qspec::gemm::bitplane_bytes(rows, cols));
    for (int64_t r = 0; r < packed.row_blocks() * 16; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        int value = -8 * qspec::gemm::bitplane_bit(planes, cols, r, c, 3);
        for (int plane = 0; plane < 3; ++plane) value += (1 << plane) * qspec::gemm::bitplane_bit(planes, cols, r, c, plane);
        int expected = 0;
        if (r < rows) {
          const uint8_t byte = weight.codes[static_cast<size_t>(r * weight.format.code_bytes() + c / 2)];
          const int nibble = (c & 1) ? byte >> 4 : byte & 0xf;
          expected = nibble >= 8 ? nibble - 16 : nibble;
        }
        ASSERT_EQ(value, expected) << rows << "x" << cols << " at " << r << "," << c;
      }
  }
}

TEST(W4Bitplanes, RefusesShapesTheBitwiseKernelCannotRun) {
  const qspec::gemm::W4A16Packed g64 = qspec::gemm::pack_w4a16(random_int4(16, 256, 64, 3));
  try {
    qspec::gemm::pack_w4_bitplanes(g64);
    FAIL() << "a group-64 matrix was accepted";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups of 128"), std::string::npos) << e.what();
  }
}
