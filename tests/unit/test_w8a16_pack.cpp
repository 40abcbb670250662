// The W8A16 GPU weight layout (ops/w8a16_pack.h) on the CPU: the packed matrix decodes to exactly
// the int8-group weights the CPU GEMM uses, and a lane-by-lane simulation of the CUDA kernel's
// loads (16 bytes of codes, 8 bytes of x a k tile), its code -> f16 conversion, the mma.sync
// m16n8k16 fragments (PTX ISA layouts) and the per-group scale flush reproduces
// cpu::quantized_linear. The GPU harness (tests/gpu) runs the real kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/dtype.h"
#include "ops/quantized_linear.h"
#include "ops/w8a16_pack.h"
#include "qspec/error.h"

namespace {

qspec::QuantizedMatrix random_int8_group(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  qspec::WeightMatrix matrix;
  matrix.name = "pack.int8";
  matrix.dtype = qspec::DType::F32;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.owned.resize(static_cast<size_t>(rows * cols));
  for (float& v : matrix.owned) v = normal(rng);
  matrix.data = matrix.owned.data();
  return qspec::quantize_rtn(matrix, qspec::quant::Format::int8_group, group);
}

// The kernel's conversion of one code byte: f16 bits 0x6400 | (code ^ 0x80) = 1152 + code, minus
// 1152 in f16 (exact: both are integers below 2048).
float code_as_kernel_converts(int8_t code) {
  const uint16_t bits = static_cast<uint16_t>(0x6400 | (static_cast<uint8_t>(code) ^ 0x80));
  return qspec::f16_to_f32(bits) - 1152.0f;
}

}  // namespace

TEST(W8A16Pack, PackedWeightsDecodeToTheCpuWeights) {
  for (auto [n, k, group] : {std::tuple{33, 96, 32}, {16, 64, 16}, {7, 256, 64}, {130, 160, 32}, {40, 512, 128}}) {
    const qspec::QuantizedMatrix weight = random_int8_group(n, k, group, static_cast<uint32_t>(n * k + group));
    const qspec::gemm::W8A16Packed packed = qspec::gemm::pack_w8a16(weight);
    ASSERT_EQ(packed.codes.size(), static_cast<size_t>((n + 15) / 16 * k * 16));
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < packed.row_blocks() * 16; ++r) {
      if (r < n) weight.dequantize_row(r, row.data());
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(packed.value(r, c), r < n ? row[c] : 0.0f) << n << "x" << k << " g" << group << " " << r << "," << c;
    }
  }
}

TEST(W8A16Pack, KernelFragmentSimulationEqualsCpuGemm) {
  for (auto [n, k, group, m] : {std::tuple{48, 128, 16, 3}, {33, 96, 32, 8}, {20, 256, 64, 5}}) {
    const qspec::QuantizedMatrix weight = random_int8_group(n, k, group, static_cast<uint32_t>(7 * n + k));
    const qspec::gemm::W8A16Packed packed = qspec::gemm::pack_w8a16(weight);
    std::mt19937 rng(static_cast<uint32_t>(m));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = qspec::f16_to_f32(qspec::f32_to_f16(uniform(rng)));  // f16 activations
    std::vector<float> expected(static_cast<size_t>(m * n));
    qspec::cpu::quantized_linear(x.data(), m, weight, nullptr, expected.data());

    for (int64_t rb = 0; rb < packed.row_blocks(); ++rb) {
      // D[16 rows][8 tokens] per group, flushed into total with each lane's two row scales.
      std::vector<double> total(16 * 8, 0.0), part(16 * 8, 0.0);
      for (int64_t chunk = 0; chunk < k / 32; ++chunk)
        for (int64_t j = 0; j < 2; ++j) {
          float a[16][16] = {}, b[16][8] = {};  // A [row][mma k], B [mma k][token]
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, t = lane % 4;
            int8_t bytes[8];
            std::memcpy(bytes, packed.codes.data() + rb * k * 16 + chunk * 512 + lane * 16 + j * 8, 8);
            // a0 a1: row g, k 2t, 2t + 1; a2 a3: row g + 8; a4 a5: row g, k 2t + 8, 2t + 9; a6 a7: row g + 8.
            a[g][2 * t] = code_as_kernel_converts(bytes[0]);
            a[g][2 * t + 1] = code_as_kernel_converts(bytes[1]);
            a[g + 8][2 * t] = code_as_kernel_converts(bytes[2]);
            a[g + 8][2 * t + 1] = code_as_kernel_converts(bytes[3]);
            a[g][2 * t + 8] = code_as_kernel_converts(bytes[4]);
            a[g][2 * t + 9] = code_as_kernel_converts(bytes[5]);
            a[g + 8][2 * t + 8] = code_as_kernel_converts(bytes[6]);
            a[g + 8][2 * t + 9] = code_as_kernel_converts(bytes[7]);
            // b0 b1: k 2t, 2t + 1 of token g = x[g][p], x[g][p + 1]; b2 b3: k 2t + 8, 2t + 9 = x[g][p + 2 ..].
            const int64_t p = 32 * chunk + 16 * j + 4 * t, token = std::min<int64_t>(g, m - 1);
            for (int s = 0; s < 2; ++s) {
              b[2 * t + s][g] = x[static_cast<size_t>(token * k + p + s)];
              b[2 * t + 8 + s][g] = x[static_cast<size_t>(token * k + p + 2 + s)];
            }
          }
          for (int r = 0; r < 16; ++r)
            for (int c = 0; c < 8; ++c)
              for (int i = 0; i < 16; ++i) part[r * 8 + c] += static_cast<double>(a[r][i]) * b[i][c];
          const int64_t k_end = 32 * chunk + 16 * j + 16;
          if (k_end % group == 0) {
            const int64_t q = k_end / group - 1;
            for (int r = 0; r < 16; ++r) {
              const float scale = packed.scales[static_cast<size_t>((rb * packed.groups() + q) * 16 + 2 * (r % 8) + r / 8)];
              for (int c = 0; c < 8; ++c) total[r * 8 + c] += scale * part[r * 8 + c];
            }
            std::fill(part.begin(), part.end(), 0.0);
          }
        }
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) {
          const int64_t row = rb * 16 + r;
          if (row >= n || c >= m) continue;
          const double want = expected[static_cast<size_t>(c * n + row)];
          ASSERT_NEAR(total[r * 8 + c], want, 1e-4 * (1.0 + std::fabs(want)))
              << n << "x" << k << " g" << group << " row " << row << " token " << c;
        }
    }
  }
}

TEST(W8A16Pack, RefusesWhatTheKernelDoesNotTake) {
  auto message = [](const qspec::QuantizedMatrix& w) {
    try {
      (void)qspec::gemm::pack_w8a16(w);
    } catch (const qspec::Error& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_NE(message(random_int8_group(16, 48, 16, 1)).find("k a multiple of 32"), std::string::npos);
  EXPECT_NE(message(random_int8_group(16, 96, 48, 3)).find("groups of 16 or a power of two"), std::string::npos);
  qspec::QuantizedMatrix four_bit = random_int8_group(16, 64, 32, 2);
  four_bit.format.format = qspec::quant::Format::int4;
  EXPECT_NE(message(four_bit).find("takes int8-group"), std::string::npos);
}
