// The W4A16 GPU weight layout (ops/w4a16_pack.h) on the CPU: the packed matrix decodes to
// exactly the weights the CPU GEMM uses, and a lane-by-lane simulation of the CUDA kernel's
// loads, lop3 dequantization and mma.sync m16n8k16 fragments (PTX ISA fragment layouts) over
// the packed bytes reproduces cpu::quantized_linear. The GPU harness (tests/gpu) runs the real
// kernel; this catches layout mistakes where CI runs, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "ops/quantized_linear.h"
#include "base/dtype.h"
#include "ops/w4a16_pack.h"
#include "qspec/error.h"

namespace {

std::mt19937& rng() {
  static std::mt19937 generator(std::random_device{}());
  return generator;
}

qspec::QuantizedMatrix random_int4(int64_t rows, int64_t cols, qspec::quant::Format format, int64_t group) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = normal(rng());
  qspec::WeightMatrix matrix;
  matrix.name = "pack.weight";
  matrix.dtype = qspec::DType::F32;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.owned = values;
  matrix.data = matrix.owned.data();
  return qspec::quantize_rtn(matrix, format, group);
}

// f16 arithmetic of the kernel's dequantization, on bit patterns.
float half_lo(uint32_t word) { return qspec::f16_to_f32(static_cast<uint16_t>(word & 0xffff)); }
float half_hi(uint32_t word) { return qspec::f16_to_f32(static_cast<uint16_t>(word >> 16)); }

// One packed word -> the four f16x2 A registers, as values: regs[i][0] low half, [1] high.
void dequant_word(uint32_t q, float (&regs)[4][2]) {
  for (int step = 0; step < 2; ++step) {
    const uint32_t lo = (q & 0x000f000fu) | 0x64006400u;  // lop3(q, 0x000f000f, 0x64006400)
    const uint32_t hi = (q & 0x00f000f0u) | 0x64006400u;
    // hsub2(lo, 1032): exact; hfma2(hi, 1/16, -72): exact in f16.
    regs[2 * step][0] = half_lo(lo) - 1032.0f;
    regs[2 * step][1] = half_hi(lo) - 1032.0f;
    regs[2 * step + 1][0] = half_lo(hi) * 0.0625f - 72.0f;
    regs[2 * step + 1][1] = half_hi(hi) * 0.0625f - 72.0f;
    q >>= 8;
  }
}

// int4-asym (zero points): the unsigned codes of one packed word, as dequant_uint4x8 makes them:
// hsub2(lo, 1024), hfma2(hi, 1/16, -64), exact in f16.
void dequant_word_unsigned(uint32_t q, float (&regs)[4][2]) {
  for (int step = 0; step < 2; ++step) {
    const uint32_t lo = (q & 0x000f000fu) | 0x64006400u;
    const uint32_t hi = (q & 0x00f000f0u) | 0x64006400u;
    regs[2 * step][0] = half_lo(lo) - 1024.0f;
    regs[2 * step][1] = half_hi(lo) - 1024.0f;
    regs[2 * step + 1][0] = half_lo(hi) * 0.0625f - 64.0f;
    regs[2 * step + 1][1] = half_hi(hi) * 0.0625f - 64.0f;
    q >>= 8;
  }
}

// int4-zp: one packed word with its group's zero-point byte, as zero_constants and
// dequant_zero_codes4x8 make it: sub = (byte & 0xf) | 0x6400 (f16 1024 + z_g), add = (byte & 0xf0) |
// 0xd400 (f16 -(64 + z_g8)); hsub2(lo, sub) for row g, hfma2(hi, 1/16, add) for row g + 8, exact.
void dequant_word_zero(uint32_t q, uint8_t zero_byte, float (&regs)[4][2]) {
  const float sub = half_lo((zero_byte & 0xfu) | 0x6400u), add = half_lo((zero_byte & 0xf0u) | 0xd400u);
  for (int step = 0; step < 2; ++step) {
    const uint32_t lo = (q & 0x000f000fu) | 0x64006400u;
    const uint32_t hi = (q & 0x00f000f0u) | 0x64006400u;
    regs[2 * step][0] = half_lo(lo) - sub;
    regs[2 * step][1] = half_hi(lo) - sub;
    regs[2 * step + 1][0] = half_lo(hi) * 0.0625f + add;
    regs[2 * step + 1][1] = half_hi(hi) * 0.0625f + add;
    q >>= 8;
  }
}
// int4-zp: the packed zero-point byte of rows (r, r + 8) of row block rb, group q (ops/w4a16_pack.h).
uint8_t zero_byte_of(const qspec::gemm::W4A16Packed& packed, int64_t rb, int64_t q, int64_t r) {
  return reinterpret_cast<const uint8_t*>(packed.mins.data())[rb * qspec::gemm::zero_point_bytes_per_row_block(packed.groups()) +
                                                              q * 8 + r];
}

// The kernel for one row block and all tokens, simulated per lane with the PTX fragment
// layouts of mma.m16n8k16 (A row-major 16x16: a0a1 (g, 2t..), a2a3 (g+8, 2t..), a4a5 (g, 2t+8..),
// a6a7 (g+8, 2t+8..); B 16x8: b0b1 (k 2t.., n g), b2b3 (k 2t+8.., n g); C: c0c1 (g, 2t..),
// c2c3 (g+8, 2t..)). x holds f16-representable values [m, k].
void simulate_row_block(const qspec::gemm::W4A16Packed& packed, int64_t rb, const std::vector<float>& x, int64_t m,
                        std::vector<float>& y /* [m, n] */) {
  const int64_t k = packed.k, pairs = k / 32, ntiles = (m + 7) / 8;
  const int64_t pairs_per_group = packed.group / 32;
  const uint8_t* block = packed.codes.data() + rb * k * 8;
  // acc[nt][lane][4], group accumulators likewise.
  std::vector<float> acc(static_cast<size_t>(ntiles * 32 * 4), 0.0f), gacc(acc.size(), 0.0f);
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t chunk = pair / 2;
    const bool tail = (k % 64 == 32) && chunk == k / 64;
    // Gather every lane's A and B registers of both k tiles, then apply the mma.
    for (int64_t j = 0; j < 2; ++j) {
      float A[16][16], B[16][64];
      for (int64_t lane = 0; lane < 32; ++lane) {
        const int64_t g = lane / 4, t = lane % 4;
        uint32_t word;
        const int64_t offset = tail ? chunk * 512 + lane * 8 + j * 4 : chunk * 512 + lane * 16 + ((pair & 1) * 2 + j) * 4;
        std::memcpy(&word, block + offset, 4);
        float a[4][2];
        if (packed.zero_codes) {  // ActF16Zc: u - z, then int4's group flush with the scale
          dequant_word_zero(word, zero_byte_of(packed, rb, pair / pairs_per_group, g), a);
        } else if (packed.has_min()) {
          // ActF16Zp: codes, then hfma2(code, s, m) with the group's f16 scale and minimum of rows
          // g (registers 0, 2) and g + 8 (1, 3): one f16 rounding of the exact value.
          dequant_word_unsigned(word, a);
          const size_t group_word = static_cast<size_t>((rb * packed.groups() + pair / pairs_per_group) * 8 + g);
          const uint32_t s = packed.scales[group_word], mn = packed.mins[group_word];
          for (int r = 0; r < 4; ++r)
            for (int h = 0; h < 2; ++h) {
              const float scale = (r & 1) ? half_hi(s) : half_lo(s), min = (r & 1) ? half_hi(mn) : half_lo(mn);
              a[r][h] = qspec::f16_to_f32(qspec::f32_to_f16(std::fma(a[r][h], scale, min)));
            }
        } else {
          dequant_word(word, a);
        }
        A[g][2 * t] = a[0][0], A[g][2 * t + 1] = a[0][1];
        A[g + 8][2 * t] = a[1][0], A[g + 8][2 * t + 1] = a[1][1];
        A[g][2 * t + 8] = a[2][0], A[g][2 * t + 9] = a[2][1];
        A[g + 8][2 * t + 8] = a[3][0], A[g + 8][2 * t + 9] = a[3][1];
        for (int64_t nt = 0; nt < ntiles; ++nt) {
          const int64_t row = std::min(nt * 8 + g, m - 1);
          const float* xv = x.data() + row * k + pair * 32 + t * 8;  // the 16-byte load
          // tile j: b0b1 = halves (4j, 4j+1), b2b3 = halves (4j+2, 4j+3)
          B[2 * t][nt * 8 + g] = xv[4 * j], B[2 * t + 1][nt * 8 + g] = xv[4 * j + 1];
          B[2 * t + 8][nt * 8 + g] = xv[4 * j + 2], B[2 * t + 9][nt * 8 + g] = xv[4 * j + 3];
        }
      }
      for (int64_t nt = 0; nt < ntiles; ++nt)
        for (int64_t lane = 0; lane < 32; ++lane) {
          const int64_t g = lane / 4, t = lane % 4;
          for (int64_t c = 0; c < 4; ++c) {
            const int64_t r = g + (c >= 2 ? 8 : 0), col = nt * 8 + 2 * t + (c & 1);
            float sum = 0;
            for (int64_t kk = 0; kk < 16; ++kk) sum += A[r][kk] * B[kk][col];
            gacc[(nt * 32 + lane) * 4 + c] += sum;
          }
        }
    }
    if ((pair + 1) % pairs_per_group == 0 || pair + 1 == pairs) {
      const int64_t q = pair / pairs_per_group;
      for (int64_t nt = 0; nt < ntiles; ++nt)
        for (int64_t lane = 0; lane < 32; ++lane) {
          const uint32_t s = packed.scales[static_cast<size_t>((rb * packed.groups() + q) * 8 + lane / 4)];
          for (int64_t c = 0; c < 4; ++c) {
            // (zero points: the scales are in the weights already)
            const float scale = packed.has_min() && !packed.zero_codes ? 1.0f : c >= 2 ? half_hi(s) : half_lo(s);
            float& g = gacc[(nt * 32 + lane) * 4 + c];
            acc[(nt * 32 + lane) * 4 + c] += scale * g;
            g = 0;
          }
        }
    }
  }
  for (int64_t nt = 0; nt < ntiles; ++nt)
    for (int64_t lane = 0; lane < 32; ++lane)
      for (int64_t c = 0; c < 4; ++c) {
        const int64_t n = rb * 16 + lane / 4 + (c >= 2 ? 8 : 0), token = nt * 8 + 2 * (lane % 4) + (c & 1);
        if (n < packed.n && token < m) y[static_cast<size_t>(token * packed.n + n)] = acc[(nt * 32 + lane) * 4 + c];
      }
}

}  // namespace

TEST(W4A16Pack, DecodesToTheQuantizedWeights) {
  using qspec::quant::Format;
  struct Case {
    int64_t n, k;
    Format format;
    int64_t group;
    int64_t kernel_group;
  };
  for (const Case& c : {Case{16, 64, Format::int4, 64, 64}, Case{33, 96, Format::int4, 32, 32},
                        Case{7, 256, Format::int4, 128, 128}, Case{40, 704, Format::int4, 64, 64},
                        Case{17, 512, Format::int4, 256, 128}, Case{5, 160, Format::int4_channel, 128, 32},
                        Case{19, 384, Format::int4_channel, 128, 128}}) {
    const qspec::QuantizedMatrix weight = random_int4(c.n, c.k, c.format, c.group);
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    EXPECT_EQ(packed.group, c.kernel_group);
    ASSERT_EQ(packed.codes.size(), static_cast<size_t>((c.n + 15) / 16 * c.k * 8));
    std::vector<float> row(static_cast<size_t>(c.k));
    for (int64_t r = 0; r < packed.row_blocks() * 16; ++r) {
      if (r < c.n) weight.dequantize_row(r, row.data());
      for (int64_t col = 0; col < c.k; ++col) {
        const float expected = r < c.n ? row[col] : 0.0f;
        ASSERT_EQ(packed.value(r, col), expected) << c.n << "x" << c.k << " row " << r << " col " << col;
      }
    }
  }
}

TEST(W4A16Pack, RejectsFormatsTheKernelCannotRun) {
  EXPECT_THROW(qspec::gemm::pack_w4a16(random_int4(4, 64, qspec::quant::Format::nvfp4, 16)), qspec::Error);
  EXPECT_THROW(qspec::gemm::pack_w4a16(random_int4(4, 48, qspec::quant::Format::int4, 16)), qspec::Error);
  EXPECT_THROW(qspec::gemm::pack_w4a16(random_int4(4, 48, qspec::quant::Format::int4_asym, 16)), qspec::Error);
}

// int4-asym: unsigned nibbles and f16 minimums beside the f16 scales; with the blocks rounded to
// f16 first (round_zero_point_blocks_to_f16) the packed matrix decodes to the CPU's weights.
TEST(W4A16Pack, ZeroPointsDecodeToTheRoundedQuantizedWeights) {
  using qspec::quant::Format;
  for (auto [n, k, group, kernel_group] : {std::tuple{16, 64, 64, 64}, {33, 96, 32, 32}, {7, 256, 128, 128},
                                           {40, 704, 64, 64}, {17, 512, 256, 128}}) {
    qspec::QuantizedMatrix weight = random_int4(n, k, Format::int4_asym, group);
    qspec::gemm::round_zero_point_blocks_to_f16(weight);
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    EXPECT_EQ(packed.group, kernel_group);
    ASSERT_TRUE(packed.has_min());
    ASSERT_EQ(packed.mins.size(), packed.scales.size());
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < packed.row_blocks() * 16; ++r) {
      if (r < n) weight.dequantize_row(r, row.data());
      for (int64_t col = 0; col < k; ++col) {
        const float expected = r < n ? row[col] : 0.0f;
        ASSERT_EQ(packed.value(r, col), expected) << n << "x" << k << " row " << r << " col " << col;
      }
    }
  }
  // Symmetric int4 has no minimums, and the rounding leaves it alone.
  qspec::QuantizedMatrix int4 = random_int4(16, 64, Format::int4, 32);
  const std::vector<uint8_t> scales = int4.scales;
  qspec::gemm::round_zero_point_blocks_to_f16(int4);
  EXPECT_EQ(int4.scales, scales);
  EXPECT_FALSE(qspec::gemm::pack_w4a16(int4).has_min());
}

// int4-zp: unsigned nibbles, the f16 scales as int4's and packed zero points beside them; the
// packed matrix decodes to the CPU's weights exactly (an f16 scale times u - z needs no rounding),
// and every zero-point byte holds its two rows' zero points, groups padded to an even count.
TEST(W4A16Pack, ZeroCodesDecodeToTheQuantizedWeights) {
  using qspec::quant::Format;
  for (auto [n, k, group, kernel_group] : {std::tuple{16, 64, 64, 64}, {33, 96, 32, 32}, {7, 256, 128, 128},
                                           {40, 704, 64, 64}, {17, 512, 256, 128}}) {
    const qspec::QuantizedMatrix weight = random_int4(n, k, Format::int4_zp, group);
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    EXPECT_EQ(packed.group, kernel_group);
    ASSERT_TRUE(packed.has_min() && packed.zero_codes);
    ASSERT_EQ(packed.mins.size() * 4,
              static_cast<size_t>(packed.row_blocks() * qspec::gemm::zero_point_bytes_per_row_block(packed.groups())));
    EXPECT_EQ(qspec::gemm::zero_point_bytes_per_row_block(3), 32);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < packed.row_blocks() * 16; ++r) {
      if (r < n) weight.dequantize_row(r, row.data());
      for (int64_t col = 0; col < k; ++col) {
        const float expected = r < n ? row[col] : 0.0f;
        ASSERT_EQ(packed.value(r, col), expected) << n << "x" << k << " row " << r << " col " << col;
      }
    }
    for (int64_t rb = 0; rb < packed.row_blocks(); ++rb)
      for (int64_t q = 0; q < packed.groups(); ++q)
        for (int64_t r = 0; r < 8; ++r) {
          const uint8_t byte = zero_byte_of(packed, rb, q, r);
          // Plain copies: clang 14 (CI's sanitizer build) cannot capture structured bindings.
          auto zero_of = [&, rows = n, zero_group = kernel_group](int64_t row) {
            return row < rows ? qspec::quant::block_zero_point(weight.format, weight.scales.data() + row * weight.format.scale_bytes(),
                                                            q * zero_group / weight.format.block)
                           : 0;
          };
          ASSERT_EQ(byte & 0xf, zero_of(rb * 16 + r));
          ASSERT_EQ(byte >> 4, zero_of(rb * 16 + r + 8));
        }
  }
  // int4-asym's minimums are not zero words.
  EXPECT_FALSE(qspec::gemm::pack_w4a16(random_int4(16, 64, Format::int4_asym, 32)).zero_codes);
}

// A group whose f32 minimum f16 cannot hold is refused, naming the matrix, not uploaded as inf.
TEST(W4A16Pack, ZeroPointsBeyondF16AreRefused) {
  qspec::QuantizedMatrix weight = random_int4(4, 64, qspec::quant::Format::int4_asym, 32);
  qspec::quant::store_asym_block(weight.format, weight.scales.data(), 1, 1.0f, -1e6f);
  weight.prepare();
  try {
    qspec::gemm::pack_w4a16(weight);
    ADD_FAILURE() << "packed a minimum of -1e6 into f16";
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find("pack.weight"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("minimum"), std::string::npos) << error.what();
  }
}

// The simulated tensor-core kernel (simulate_row_block over every row block of the packed weight)
// against the CPU GEMM on the same weights, m random f16 tokens: relative RMS error below `bound`.
void expect_simulation_matches_cpu(const qspec::QuantizedMatrix& weight, int64_t m, double bound, int64_t group) {
  const int64_t n = weight.rows, k = weight.cols();
  const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = qspec::f16_to_f32(qspec::f32_to_f16(normal(rng())));
  std::vector<float> expected(static_cast<size_t>(m * n)), got(expected.size(), NAN);
  qspec::cpu::quantized_linear(x.data(), m, weight, nullptr, expected.data());
  for (int64_t rb = 0; rb < packed.row_blocks(); ++rb) simulate_row_block(packed, rb, x, m, got);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    diff += (got[i] - expected[i]) * (got[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), bound) << m << "x" << n << "x" << k << " g" << group;
}

TEST(W4A16Pack, SimulatedTensorCoreKernelMatchesCpuGemm) {
  using qspec::quant::Format;
  for (auto [m, n, k, group] : {std::tuple{1, 16, 64, 64}, {3, 33, 96, 32}, {9, 20, 256, 128}, {16, 17, 704, 64},
                                {5, 31, 160, 32}}) {
    const qspec::QuantizedMatrix weight = random_int4(n, k, Format::int4, group);
    ASSERT_NO_FATAL_FAILURE(expect_simulation_matches_cpu(weight, m, 1e-5, group));
  }
}

// The simulation of the integer zero-point path (ActF16Zc: u - z from the zero words, int4's group
// flush) against the CPU GEMM on the same int4-zp weights: as close as int4's (exact weights).
TEST(W4A16Pack, SimulatedZeroCodeKernelMatchesCpuGemm) {
  for (auto [m, n, k, group] : {std::tuple{1, 16, 64, 64}, {3, 33, 96, 32}, {9, 20, 256, 128}, {16, 17, 704, 64},
                                {5, 31, 160, 32}, {4, 16, 512, 256}}) {
    const qspec::QuantizedMatrix weight = random_int4(n, k, qspec::quant::Format::int4_zp, group);
    ASSERT_NO_FATAL_FAILURE(expect_simulation_matches_cpu(weight, m, 1e-5, group));
  }
}

// The same simulation of the zero-point path (ActF16Zp: unsigned codes, fma(code, s, m) folded
// into f16 weights before the mma) against the CPU GEMM on the same (f16-rounded) int4-asym
// blocks: within the f16 rounding of the folded weights (the GPU tests' bound for it is 3e-3).
TEST(W4A16Pack, SimulatedZeroPointKernelMatchesCpuGemm) {
  for (auto [m, n, k, group] : {std::tuple{1, 16, 64, 64}, {3, 33, 96, 32}, {9, 20, 256, 128}, {16, 17, 704, 64},
                                {5, 31, 160, 32}, {4, 16, 512, 256}}) {
    qspec::QuantizedMatrix weight = random_int4(n, k, qspec::quant::Format::int4_asym, group);
    qspec::gemm::round_zero_point_blocks_to_f16(weight);
    ASSERT_NO_FATAL_FAILURE(expect_simulation_matches_cpu(weight, m, 2e-3, group));
  }
}

// x in the packed k order (cuda::W4A16TiledConfig::x_packed): a tensor-core B operand read in
// natural order from it meets, at each mma k index of each tile of a pair, the physical k the
// packed codes hold there (the order the simulation above gathers x in with its 16-byte loads).
TEST(W4A16Pack, PackedXOrderIsTheCodesKOrder) {
  constexpr int64_t k = 96, ldx = 104, m = 3;
  std::vector<uint16_t> x(static_cast<size_t>(m * ldx));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i);
  const std::vector<uint16_t> packed = qspec::gemm::w4a16_pack_x_order(x.data(), m, k, ldx);
  for (int64_t r = 0; r < m; ++r) {
    const uint16_t* row = packed.data() + r * ldx;
    const uint16_t* natural = x.data() + r * ldx;
    for (int64_t pair = 0; pair < k / 32; ++pair)
      for (int64_t j = 0; j < 2; ++j)  // the pair's k tile (a wgmma k16 step: 16 natural columns of it)
        for (int64_t t = 0; t < 4; ++t)
          for (int64_t s = 0; s < 2; ++s) {
            const int64_t step = pair * 32 + 16 * j;
            EXPECT_EQ(row[step + 2 * t + s], natural[pair * 32 + 8 * t + 4 * j + s]) << r << " " << pair << j << t << s;
            EXPECT_EQ(row[step + 2 * t + 8 + s], natural[pair * 32 + 8 * t + 4 * j + 2 + s]);
          }
    for (int64_t i = k; i < ldx; ++i) EXPECT_EQ(row[i], natural[i]);  // the pitch's padding as it was
  }
  // A permutation of each 32-k block, its own inverse.
  for (int64_t i = 0; i < k; ++i) {
    EXPECT_EQ(qspec::gemm::w4a16_packed_x_index(qspec::gemm::w4a16_packed_x_index(i)), i);
    EXPECT_EQ(qspec::gemm::w4a16_packed_x_index(i) / 32, i / 32);
  }
  EXPECT_THROW(qspec::gemm::w4a16_pack_x_order(x.data(), m, 80, ldx), qspec::Error);
}
