// The DPR reference (gemm/dpr.h): promotion, exact reconstruction for random partitions, the
// W4A8 strategy costs, and the 4-bit-weight GEMM against cpu::quantized_linear.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <random>

#include "ops/quantized_linear.h"
#include "random_weights.h"
#include "gemm/dpr.h"
#include "qspec/error.h"

namespace dpr = qspec::gemm::dpr;
using dpr::HwType;

namespace {

void expect_error(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error (expected one naming '" << needle << "')";
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

// Random values of an operand, its extremes and 0 first.
std::vector<int32_t> operand_values(std::mt19937& rng, const dpr::Operand& op, size_t count) {
  const int32_t lo = op.is_signed ? -(1 << (op.bits - 1)) : 0;
  const int32_t hi = op.is_signed ? (1 << (op.bits - 1)) - 1 : (1 << op.bits) - 1;
  std::uniform_int_distribution<int32_t> pick(lo, hi);
  std::vector<int32_t> values(count);
  for (int32_t& v : values) v = pick(rng);
  const int32_t edges[] = {lo, hi, 0, lo, hi};
  for (size_t i = 0; i < std::min<size_t>(count, 5); ++i) values[i] = edges[i];
  return values;
}

using qspec::test::random_int4_matrix;

}  // namespace

TEST(DprPromotion, NativeTypesOnSm80AndSm90) {
  EXPECT_EQ(dpr::promote(1, false, 80), HwType::b1);
  EXPECT_EQ(dpr::promote(1, false, 90), HwType::b1);
  EXPECT_EQ(dpr::promote(1, true, 80), HwType::s4);  // b1 holds only unsigned bits
  EXPECT_EQ(dpr::promote(1, true, 90), HwType::s8);
  EXPECT_EQ(dpr::promote(4, true, 80), HwType::s4);
  EXPECT_EQ(dpr::promote(4, true, 86), HwType::s4);
  EXPECT_EQ(dpr::promote(4, false, 80), HwType::s8);  // 0..15 does not fit s4
  EXPECT_EQ(dpr::promote(3, false, 89), HwType::s4);
  EXPECT_EQ(dpr::promote(2, true, 90), HwType::s8);  // Hopper: no native s4
  EXPECT_EQ(dpr::promote(4, true, 90), HwType::s8);
  EXPECT_EQ(dpr::promote(8, true, 80), HwType::s8);
  EXPECT_EQ(dpr::promote(7, false, 90), HwType::s8);
  EXPECT_EQ(dpr::hw_type_name(HwType::s4), "s4");
  expect_error([] { dpr::promote(0, false, 90); }, "width 0");
  expect_error([] { dpr::promote(9, true, 80); }, "width 9");
  expect_error([] { dpr::promote(8, false, 90); }, "unsigned 8-bit");
}

TEST(DprDecomposition, SlicesOfW4A8) {
  const auto x = dpr::decompose(dpr::split(8, 4), 8, true, 80);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(x[0].hw, HwType::s8);  // unsigned low nibble
  EXPECT_FALSE(x[0].is_signed);
  EXPECT_EQ(x[1].hw, HwType::s4);  // signed high nibble, sign-extended
  EXPECT_TRUE(x[1].is_signed);
  EXPECT_EQ(x[1].coefficient, 16);
  EXPECT_EQ(dpr::slice_value(-128, x[1]), -8);
  EXPECT_EQ(dpr::slice_value(-128, x[0]), 0);
  const auto bits = dpr::decompose(dpr::bitwise(4), 4, true, 90);
  EXPECT_EQ(bits.back().hw, HwType::b1);  // the sign bit stays b1, with a negative weight
  EXPECT_EQ(bits.back().coefficient, -8);
  EXPECT_EQ(dpr::slice_value(-8, bits.back()), 1);
  EXPECT_EQ(dpr::split(8, 3).widths, (std::vector<int>{3, 3, 2}));
}

TEST(DprReferenceGemm, RandomPartitionsEqualTheDirectProduct) {
  std::mt19937 rng(2024);
  auto random_operand = [&](int bits, bool is_signed) {
    dpr::Operand op{bits, is_signed, {}};
    for (int left = bits; left > 0;) {
      int width = std::uniform_int_distribution<int>(1, left)(rng);
      if (width == 8 && !is_signed) width = 4;  // an unsigned 8-bit slice has no native type
      op.partition.widths.push_back(width);
      left -= width;
    }
    return op;
  };
  const int64_t ks[] = {1, 64, 70, 131};
  for (int trial = 0; trial < 200; ++trial) {
    dpr::StrategyDpr s{"random", random_operand(trial % 2 ? 8 : 4, trial % 3 != 0),
                       random_operand(trial % 4 < 2 ? 4 : 8, trial % 5 != 0), trial % 2 ? 80 : 90};
    const int64_t m = 3, n = 4, k = ks[trial % 4];
    const auto x = operand_values(rng, s.x, static_cast<size_t>(m * k));
    const auto w = operand_values(rng, s.w, static_cast<size_t>(n * k));
    const auto y = dpr::reference_gemm(s, x.data(), m, w.data(), n, k);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        int64_t direct = 0;
        for (int64_t kk = 0; kk < k; ++kk) direct += int64_t{x[i * k + kk]} * w[j * k + kk];
        ASSERT_EQ(y[i * n + j], direct) << "trial " << trial << " [" << i << "," << j << "]";
      }
  }
}

TEST(DprCost, PaddingBitwiseSplitForW4A8) {
  using Pair = std::pair<HwType, HwType>;
  const auto padding = dpr::cost(dpr::w4_strategy("padding", 8));
  EXPECT_EQ(padding.partial_products, 1);
  EXPECT_EQ(padding.products, (std::vector<Pair>{{HwType::s8, HwType::s8}}));
  const auto bitwise = dpr::cost(dpr::w4_strategy("bitwise", 8));
  EXPECT_EQ(bitwise.partial_products, 32);
  EXPECT_EQ(bitwise.mma_ops_per_mac, 32);
  EXPECT_EQ(bitwise.products, std::vector<Pair>(32, {HwType::b1, HwType::b1}));
  const auto split90 = dpr::cost(dpr::w4_strategy("split", 8, 90));
  EXPECT_EQ(split90.partial_products, 2);
  EXPECT_EQ(split90.products, std::vector<Pair>(2, {HwType::s8, HwType::s8}));
  // sm 80: the unsigned low nibble needs s8; the signed high nibble times int4 runs s4 x s4.
  const auto split80 = dpr::cost(dpr::w4_strategy("split", 8, 80));
  EXPECT_EQ(split80.products, (std::vector<Pair>{{HwType::s8, HwType::s8}, {HwType::s4, HwType::s4}}));
  EXPECT_EQ(dpr::cost(dpr::w4_strategy("padding", 4, 80)).products, (std::vector<Pair>{{HwType::s4, HwType::s4}}));
  EXPECT_EQ(dpr::cost(dpr::w4_strategy("split", 4, 80)).products, std::vector<Pair>(2, {HwType::s4, HwType::s4}));
  EXPECT_EQ(dpr::cost(dpr::w4_strategy("bitwise", 4)).partial_products, 16);
}

TEST(DprQuantizedGemm, StrategiesAgreeAndMatchQuantizedLinear) {
  std::mt19937 rng(7);
  const int64_t m = 3, n = 6, k = 256;
  struct Case { int bits; int64_t x_group, w_group; };
  for (const Case c : {Case{8, k, 64}, Case{8, k, 128}, Case{4, 32, 128}, Case{4, 128, 64}, Case{4, 128, 128}}) {
    const auto w = random_int4_matrix(rng, n, k, c.w_group);
    const auto x_codes = operand_values(rng, {c.bits, true, {}}, static_cast<size_t>(m * k));
    std::vector<float> x_scales(static_cast<size_t>(m * (k / c.x_group)));
    for (float& s : x_scales) s = std::uniform_real_distribution<float>(0.001f, 0.02f)(rng);
    std::vector<float> x(static_cast<size_t>(m * k)), expected(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m * k; ++i)
      x[i] = static_cast<float>(x_codes[i]) * x_scales[(i / k) * (k / c.x_group) + (i % k) / c.x_group];
    qspec::cpu::quantized_linear(x.data(), m, w, nullptr, expected.data());

    const auto padding = dpr::quantized_gemm(dpr::w4_strategy("padding", c.bits), x_codes.data(), x_scales.data(),
                                             c.x_group, m, w);
    for (const char* name : {"padding", "bitwise", "split"})
      for (int sm : {80, 90}) {
        const auto y = dpr::quantized_gemm(dpr::w4_strategy(name, c.bits, sm), x_codes.data(), x_scales.data(),
                                           c.x_group, m, w);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(padding[i])) << name << " sm " << sm;
      }
    for (int64_t i = 0; i < m; ++i) {
      float row_max = 0.0f;
      for (int64_t j = 0; j < n; ++j) row_max = std::max(row_max, std::fabs(expected[i * n + j]));
      ASSERT_GT(row_max, 0.0f);
      for (int64_t j = 0; j < n; ++j)
        EXPECT_NEAR(padding[i * n + j], expected[i * n + j], 1e-4f * row_max)
            << "A" << c.bits << " x_group " << c.x_group << " w_group " << c.w_group << " [" << i << "," << j << "]";
    }
  }
}

TEST(DprErrors, NameTheFieldAtFault) {
  expect_error([] { dpr::decompose({{4, 3}}, 8, true, 90); }, "sum to 7");
  expect_error([] { dpr::decompose({{4, 0, 4}}, 8, true, 90); }, "width 0");
  const auto padding = dpr::w4_strategy("padding", 8);
  const std::vector<int32_t> x = {1, 128}, w = {1, 1};
  expect_error([&] { dpr::reference_gemm(padding, x.data(), 1, w.data(), 1, 2); }, "x[0,1] = 128");
  const std::vector<int32_t> w_bad = {1, -9};
  expect_error([&] { dpr::reference_gemm(padding, w.data(), 1, w_bad.data(), 1, 2); }, "w[0,1] = -9");
  expect_error([] { dpr::w4_strategy("lut", 8); }, "lut");
  expect_error([] { dpr::w4_strategy("split", 6); }, "activation_bits 6");

  std::mt19937 rng(3);
  const int64_t k = 192;
  const std::vector<int32_t> codes(static_cast<size_t>(k), 1);
  const std::vector<float> scales(4, 1.0f);
  qspec::WeightMatrix matrix;
  matrix.name = "layers.0.wq";
  matrix.dtype = qspec::DType::F32;
  matrix.rows = 2;
  matrix.cols = k;
  matrix.owned.assign(static_cast<size_t>(2 * k), 0.5f);
  matrix.data = matrix.owned.data();
  const auto nvfp4 = qspec::quantize_rtn(matrix, qspec::quant::Format::nvfp4);
  expect_error([&] { dpr::quantized_gemm(padding, codes.data(), scales.data(), k, 1, nvfp4); }, "nvfp4, not int4");
  const auto int4 = random_int4_matrix(rng, 2, k, 64);
  expect_error([&] { dpr::quantized_gemm(padding, codes.data(), scales.data(), 48, 1, int4); }, "do not nest");
  expect_error([&] { dpr::quantized_gemm(padding, codes.data(), scales.data(), 7, 1, int4); }, "x_group 7");
}
