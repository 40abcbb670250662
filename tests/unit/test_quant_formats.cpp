// Quantized formats: scalar codecs against hand-computed tables, row quantizers (packed bytes,
// error bounds, zeros, signs, extreme magnitudes, rejected inputs, determinism) and ARCQuant's
// augmented residual channels (GEMM equivalence, the paper's MXFP8-level error bound, and
// lower error than plain quantization on outlier-heavy rows).

// The library's rule here too: expected values computed in this file round as the reference does.
#include "base/exact_f32.h"  // first

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "qspec/error.h"
#include "quant/formats.h"

using namespace qspec::quant;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Bitwise equality of float arrays (distinguishes -0 from +0).
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i]))
      return ::testing::AssertionFailure() << "index " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

std::vector<float> gaussian_row(uint32_t seed, int64_t count, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> row(count);
  for (auto& value : row) value = normal(rng);
  return row;
}

// One (format, role, group size) combination to run row tests over.
struct Case {
  Format format;
  Role role;
  int64_t group_size;
};
const Case kAllCases[] = {
    {Format::int4, Role::weight, 128},       {Format::int4, Role::weight, 32},
    {Format::int4, Role::activation, 128},   {Format::int4, Role::activation, 64},
    {Format::int4_channel, Role::weight, 0}, {Format::nvfp4, Role::weight, 0},
    {Format::nvfp4, Role::activation, 0},    {Format::mxfp4, Role::weight, 0},
    {Format::mxfp4, Role::activation, 0},    {Format::int8, Role::activation, 0},
    {Format::fp8, Role::activation, 0},      {Format::int4_asym, Role::weight, 128},
    {Format::int4_asym, Role::weight, 32},   {Format::int4_zp, Role::weight, 64},
    {Format::int4_zp, Role::weight, 32},
};

std::string describe(const Case& c) {
  return std::string(format_name(c.format)) + (c.role == Role::weight ? " weight" : " activation") +
         " group " + std::to_string(c.group_size);
}

RowFormat format_for(const Case& c, int64_t k) {
  return make_row_format(c.format, c.role, k, c.group_size > 0 ? c.group_size : kDefaultGroupSize);
}

// A quantized row with its buffers; an nvfp4 weight row without a tensor scale takes the row
// itself as the whole matrix.
struct Quantized {
  RowFormat format;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
  std::vector<float> dequantized;
};

Quantized quantize(RowFormat format, const std::vector<float>& x) {
  if (format.format == Format::nvfp4 && format.role == Role::weight && format.tensor_scale == 0.0f)
    format.tensor_scale = nvfp4_tensor_scale(abs_max(x.data(), static_cast<int64_t>(x.size())));
  Quantized q{format, std::vector<uint8_t>(format.code_bytes()),
              std::vector<uint8_t>(format.scale_bytes()), std::vector<float>(format.k)};
  quantize_row(format, x.data(), q.codes.data(), q.scales.data());
  dequantize_row(format, q.codes.data(), q.scales.data(), q.dequantized.data());
  return q;
}

// Per-element error bound of each format, given the row's own stored scales (see formats.h).
void expect_within_bounds(const Quantized& q, const std::vector<float>& x,
                          const std::string& what) {
  const RowFormat& f = q.format;
  for (int64_t b = 0; b < f.blocks(); ++b) {
    float block_amax = 0.0f;
    for (int64_t i = b * f.block; i < (b + 1) * f.block; ++i)
      block_amax = std::max(block_amax, std::fabs(x[i]));
    float scale = block_scale(f, q.scales.data(), b);
    for (int64_t i = b * f.block; i < (b + 1) * f.block; ++i) {
      double error = std::fabs(static_cast<double>(x[i]) - q.dequantized[i]);
      double bound = 0.0;
      switch (f.format) {
        case Format::int4:
        case Format::int4_channel:
        case Format::int8:  // round to nearest: half a step, plus f32 rounding of x / s and c * s
          bound = scale * (0.5 + 1e-6);
          break;
        case Format::fp8:  // E4M3 keeps 3 mantissa bits; subnormal steps are 2^-9 * s
          bound = (std::fabs(x[i]) * 0.0625 + scale * (1.0 / 1024)) * (1 + 1e-6);
          break;
        case Format::nvfp4: {  // E2M1's widest half-step (4..6) is one block-scale unit
          double divisor = static_cast<double>(scale) * row_tensor_scale(f, q.scales.data());
          bound = std::min(divisor, block_amax * 17.0 / 96.0) * (1 + 1e-5);
          break;
        }
        case Format::mxfp4:  // 2^e in (amax/8, amax/4]: rounding <= 2^e, saturation < amax/4
          bound = std::min(block_amax * 0.25, 2.0 * scale) * (1 + 1e-6);
          break;
        case Format::int4_asym:  // half a step, plus f32 rounding of x - m, / s and the fma
          bound = scale * (0.5 + 1e-5) + block_amax * 1e-6;
          break;
        case Format::int4_zp:  // half a step, another half where the zero point's rounding shifts the
          // grid, and the f16 rounding of the scale over 15 steps
          bound = scale * (1.0 + 15.0 / 2048 + 1e-5);
          break;
      }
      ASSERT_LE(error, bound) << what << ": element " << i << " x=" << x[i]
                              << " dequantized=" << q.dequantized[i];
    }
  }
}

// ---- MXFP8 (E4M3 elements, block 32, E8M0 scale) for the error-bound comparison ----
void mxfp8_fake_quantize(float* x, int64_t count) {
  for (int64_t start = 0; start < count; start += 32) {
    float amax = 0.0f;
    for (int64_t i = start; i < start + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    int exponent = static_cast<int>(e8m0_shared_scale(amax, 8)) - 127;
    for (int64_t i = start; i < start + 32; ++i)
      x[i] = std::ldexp(e4m3_to_f32(f32_to_e4m3(std::ldexp(x[i], -exponent))), exponent);
  }
}

}  // namespace

// ============================== scalar codecs ==============================

TEST(QuantFormatsE2M1, EveryCodeDecodesAndReencodes) {
  const float expected[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    EXPECT_EQ(bits_of(e2m1_to_f32(code)), bits_of(expected[code])) << int(code);
    EXPECT_EQ(f32_to_e2m1(expected[code]), code) << int(code);
  }
  EXPECT_EQ(e2m1_to_f32(0xf7), 6.0f);  // only the low nibble counts
}

TEST(QuantFormatsE2M1, RoundsToNearestTiesToEvenCode) {
  struct Row {
    float input;
    uint8_t code;
  };
  // Each tie goes to the neighbour with the even code; one float either side goes to the
  // nearer value.
  const Row rows[] = {
      {0.1f, 0},
      {0.25f, 0},  // tie 0 | 0.5
      {std::nextafter(0.25f, 1.0f), 1},
      {0.5f, 1},
      {std::nextafter(0.75f, 0.0f), 1},
      {0.75f, 2},  // tie 0.5 | 1
      {1.25f, 2},  // tie 1 | 1.5
      {std::nextafter(1.25f, 2.0f), 3},
      {std::nextafter(1.75f, 0.0f), 3},
      {1.75f, 4},  // tie 1.5 | 2
      {2.5f, 4},   // tie 2 | 3
      {std::nextafter(2.5f, 3.0f), 5},
      {std::nextafter(3.5f, 0.0f), 5},
      {3.5f, 6},  // tie 3 | 4
      {5.0f, 6},  // tie 4 | 6
      {std::nextafter(5.0f, 6.0f), 7},
      {6.0f, 7},
      {6.5f, 7},  // saturation from here on
      {1e30f, 7},
      {kInf, 7},
  };

  for (const auto& row : rows) {
    EXPECT_EQ(f32_to_e2m1(row.input), row.code) << row.input;
    EXPECT_EQ(f32_to_e2m1(-row.input), row.code | 0x8) << -row.input;
  }
}

TEST(QuantFormatsE2M1, KeepsSignOfZeroAndRejectsNaN) {
  EXPECT_EQ(f32_to_e2m1(0.0f), 0x0);
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(f32_to_e2m1(-0.2f), 0x8);  // rounds to zero, keeps the sign
  EXPECT_EQ(f32_to_e2m1(-1e-45f), 0x8);
  EXPECT_TRUE(std::signbit(e2m1_to_f32(0x8)));
  EXPECT_THROW(f32_to_e2m1(kNaN), qspec::Error);
}

// The 128 non-negative E4M3 values, worked out from the OCP definition (bias 7, subnormals
// m * 2^-9, 0x7f NaN), one row per exponent field.
// clang-format off
const double kE4M3Positive[128] = {
    0.0, 0.001953125, 0.00390625, 0.005859375, 0.0078125, 0.009765625, 0.01171875, 0.013671875,
    0.015625, 0.017578125, 0.01953125, 0.021484375, 0.0234375, 0.025390625, 0.02734375, 0.029296875,
    0.03125, 0.03515625, 0.0390625, 0.04296875, 0.046875, 0.05078125, 0.0546875, 0.05859375,
    0.0625, 0.0703125, 0.078125, 0.0859375, 0.09375, 0.1015625, 0.109375, 0.1171875,
    0.125, 0.140625, 0.15625, 0.171875, 0.1875, 0.203125, 0.21875, 0.234375,
    0.25, 0.28125, 0.3125, 0.34375, 0.375, 0.40625, 0.4375, 0.46875,
    0.5, 0.5625, 0.625, 0.6875, 0.75, 0.8125, 0.875, 0.9375,
    1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
    2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75,
    4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5,
    8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    16.0, 18.0, 20.0, 22.0, 24.0, 26.0, 28.0, 30.0,
    32.0, 36.0, 40.0, 44.0, 48.0, 52.0, 56.0, 60.0,
    64.0, 72.0, 80.0, 88.0, 96.0, 104.0, 112.0, 120.0,
    128.0, 144.0, 160.0, 176.0, 192.0, 208.0, 224.0, 240.0,
    256.0, 288.0, 320.0, 352.0, 384.0, 416.0, 448.0, NAN,
};
// clang-format on

TEST(QuantFormatsE4M3, All256CodesDecodeAndReencode) {
  for (int code = 0; code < 256; ++code) {
    float value = e4m3_to_f32(static_cast<uint8_t>(code));
    double expected = kE4M3Positive[code & 0x7f];
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    if (code & 0x80) expected = -expected;
    EXPECT_EQ(static_cast<double>(value), expected) << code;
    EXPECT_EQ(std::signbit(value), (code & 0x80) != 0) << code;
    EXPECT_EQ(f32_to_e4m3(value), code) << code;
  }
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0xff);
}

TEST(QuantFormatsE4M3, MidpointsGoToEvenCodeAndNeighboursToNearest) {
  for (int code = 0; code < 0x7e; ++code) {
    float low = static_cast<float>(kE4M3Positive[code]);
    float high = static_cast<float>(kE4M3Positive[code + 1]);
    float mid = (low + high) / 2;  // exact: E4M3 values have few bits
    ASSERT_EQ(static_cast<double>(mid), (kE4M3Positive[code] + kE4M3Positive[code + 1]) / 2);
    int even = (code % 2 == 0) ? code : code + 1;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "tie between codes " << code << " and " << code + 1;
    EXPECT_EQ(f32_to_e4m3(-mid), even | 0x80);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), code);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.0f)), code + 1);
    EXPECT_EQ(f32_to_e4m3(-std::nextafter(mid, 1000.0f)), (code + 1) | 0x80);
  }
}

TEST(QuantFormatsE4M3, SubnormalBoundary) {
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie 0 | 2^-9: 0
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02);   // tie 1 | 2 units: 2
  EXPECT_EQ(f32_to_e4m3(std::ldexp(15.0f, -10)), 0x08);  // tie 7*2^-9 | 2^-6
  EXPECT_EQ(f32_to_e4m3(std::ldexp(7.0f, -9)), 0x07);    // largest subnormal
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -6)), 0x08);    // smallest normal
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -6), 0.0f)), 0x08);
  EXPECT_EQ(f32_to_e4m3(1e-40f), 0x00);   // f32 subnormal
  EXPECT_EQ(f32_to_e4m3(-1e-40f), 0x80);  // keeps the sign
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
}

TEST(QuantFormatsE4M3, SaturatesToMaxFinite) {
  for (float value : {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 1e10f, 3.4e38f, kInf}) {
    EXPECT_EQ(f32_to_e4m3(value), 0x7e) << value;
    EXPECT_EQ(f32_to_e4m3(-value), 0xfe) << value;
  }
  EXPECT_EQ(f32_to_e4m3(432.0f), 0x7e);  // tie 416 | 448: 448 (even)
  EXPECT_EQ(f32_to_e4m3(431.0f), 0x7d);
}

TEST(QuantFormatsE8M0, DecodeEdges) {
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_f32(126), 0.5f);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(QuantFormatsE8M0, SharedScaleIsFloorLog2MinusEmax) {
  EXPECT_EQ(e8m0_shared_scale(6.0f, 2), 127);  // floor(log2 6) = 2
  EXPECT_EQ(e8m0_shared_scale(4.0f, 2), 127);
  EXPECT_EQ(e8m0_shared_scale(std::nextafter(8.0f, 0.0f), 2), 127);
  EXPECT_EQ(e8m0_shared_scale(8.0f, 2), 128);
  EXPECT_EQ(e8m0_shared_scale(std::nextafter(4.0f, 0.0f), 2), 126);
  EXPECT_EQ(e8m0_shared_scale(448.0f, 8), 127);  // floor(log2 448) = 8
  EXPECT_EQ(e8m0_shared_scale(1.0f, 8), 119);
  EXPECT_EQ(e8m0_shared_scale(0.0f, 2), 0);                                 // zero block
  EXPECT_EQ(e8m0_shared_scale(std::numeric_limits<float>::max(), 2), 252);  // 127 - 2
  EXPECT_EQ(e8m0_shared_scale(std::ldexp(1.0f, -125), 2), 0);               // -127: lowest
  EXPECT_EQ(e8m0_shared_scale(std::ldexp(1.0f, -124), 2), 1);
  EXPECT_EQ(e8m0_shared_scale(std::ldexp(1.0f, -126), 2), 0);  // clamped
  EXPECT_EQ(e8m0_shared_scale(1e-45f, 2), 0);                  // subnormal
  EXPECT_THROW(e8m0_shared_scale(kNaN, 2), qspec::Error);
  EXPECT_THROW(e8m0_shared_scale(kInf, 2), qspec::Error);
  EXPECT_THROW(e8m0_shared_scale(-1.0f, 2), qspec::Error);
}

// ============================== names and shapes ==============================

TEST(QuantFormatsNames, ParseAndNameRoundTrip) {
  for (auto name : {"int4", "int4-channel", "int4-asym", "nvfp4", "mxfp4", "int8", "fp8"})
    EXPECT_EQ(format_name(parse_format(name)), name);
  EXPECT_EQ(parse_format("int4-channel"), Format::int4_channel);
  for (auto bad : {"int3", "", "NVFP4", "fp4", "int4 "}) {
    try {
      parse_format(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const qspec::Error& error) {
      std::string message = error.what();
      EXPECT_NE(message.find("unknown quantization format"), std::string::npos) << message;
      EXPECT_NE(message.find("int4-channel"), std::string::npos) << message;
    }
  }
}

TEST(QuantFormatsNames, RolesBlocksAndSizes) {
  EXPECT_TRUE(format_supports(Format::int4, Role::activation));
  EXPECT_FALSE(format_supports(Format::int4_channel, Role::activation));
  EXPECT_FALSE(format_supports(Format::int8, Role::weight));
  EXPECT_FALSE(format_supports(Format::fp8, Role::weight));
  EXPECT_TRUE(format_supports(Format::int4_asym, Role::weight));
  EXPECT_FALSE(format_supports(Format::int4_asym, Role::activation));
  EXPECT_EQ(block_size(Format::int4_asym, 4096, 32), 32);
  EXPECT_TRUE(format_has_groups(Format::int4_asym) && format_has_groups(Format::int4));
  EXPECT_FALSE(format_has_groups(Format::int4_channel) || format_has_groups(Format::nvfp4));
  EXPECT_TRUE(format_has_min(Format::int4_asym));
  EXPECT_FALSE(format_has_min(Format::int4));
  EXPECT_EQ(block_size(Format::int4, 4096), 128);
  EXPECT_EQ(block_size(Format::int4, 4096, 64), 64);
  EXPECT_EQ(block_size(Format::nvfp4, 4096), 16);
  EXPECT_EQ(block_size(Format::mxfp4, 4096), 32);
  EXPECT_EQ(block_size(Format::int4_channel, 4096), 4096);
  EXPECT_EQ(block_size(Format::int8, 4096), 4096);

  struct Expected {
    Format format;
    Role role;
    int64_t code_bytes, scale_bytes;
  };
  const Expected table[] = {
      {Format::int4, Role::weight, 2048, 64},        {Format::int4, Role::activation, 2048, 128},
      {Format::int4_channel, Role::weight, 2048, 2}, {Format::nvfp4, Role::weight, 2048, 256},
      {Format::nvfp4, Role::activation, 2048, 260},  {Format::mxfp4, Role::weight, 2048, 128},
      {Format::int8, Role::activation, 4096, 4},     {Format::fp8, Role::activation, 4096, 4},
      {Format::int4_asym, Role::weight, 2048, 256},  // 32 groups x (f32 scale, f32 minimum)
  };
  for (const auto& row : table) {
    RowFormat f = make_row_format(row.format, row.role, 4096);
    EXPECT_EQ(f.code_bytes(), row.code_bytes) << format_name(row.format);
    EXPECT_EQ(f.scale_bytes(), row.scale_bytes) << format_name(row.format);
  }
}

TEST(QuantFormatsNames, BadShapesAndRolesNameTheSizes) {
  auto message_of = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const qspec::Error& error) {
      return error.what();
    }
    return "<no error>";
  };
  std::string m = message_of([] { make_row_format(Format::nvfp4, Role::activation, 100); });
  EXPECT_NE(m.find("K=100"), std::string::npos) << m;
  EXPECT_NE(m.find("block of 16"), std::string::npos) << m;
  EXPECT_NE(m.find("layer shapes"), std::string::npos) << m;
  m = message_of([] { make_row_format(Format::int4, Role::weight, 200); });
  EXPECT_NE(m.find("K=200"), std::string::npos) << m;
  EXPECT_NE(m.find("128"), std::string::npos) << m;
  m = message_of([] { make_row_format(Format::mxfp4, Role::weight, 48); });
  EXPECT_NE(m.find("block of 32"), std::string::npos) << m;
  m = message_of([] { make_row_format(Format::int4_channel, Role::weight, 5); });
  EXPECT_NE(m.find("odd"), std::string::npos) << m;
  m = message_of([] { make_row_format(Format::int8, Role::weight, 64); });
  EXPECT_NE(m.find("activation format"), std::string::npos) << m;
  m = message_of([] { make_row_format(Format::int4_channel, Role::activation, 64); });
  EXPECT_NE(m.find("weight format"), std::string::npos) << m;
  EXPECT_THROW(make_row_format(Format::int4, Role::weight, 0), qspec::Error);
  EXPECT_THROW(make_row_format(Format::int4, Role::weight, 128, 0), qspec::Error);
  EXPECT_THROW(make_row_format(Format::int4, Role::weight, 129, 3), qspec::Error);
  EXPECT_NO_THROW(make_row_format(Format::int4, Role::weight, 96, 32));
}

// ============================== packed layouts ==============================

TEST(QuantFormatsPacking, Int4GroupsWeightAndActivation) {
  std::vector<float> x(32, 0.0f);
  // Group 0, absmax 7 -> scale 1: codes 7 -7 1 -1 0 3 -4 2 0 0 2 6 (ties to even).
  const float group0[12] = {7, -7, 1, -1, 0, 3.4f, -3.5f, 2.5f, 0.5f, -0.5f, 1.5f, 6};
  std::copy(group0, group0 + 12, x.begin());
  // Group 1, absmax 3.5 -> scale 0.5: codes 7 -7 0 2.
  x[16] = 3.5f, x[17] = -3.5f, x[18] = 0.25f, x[19] = 0.75f;
  const std::vector<uint8_t> codes = {0x97, 0xf1, 0x30, 0x2c, 0x00, 0x62, 0x00, 0x00,
                                      0x97, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

  Quantized weight = quantize(make_row_format(Format::int4, Role::weight, 32, 16), x);
  EXPECT_EQ(weight.codes, codes);
  EXPECT_EQ(weight.scales, (std::vector<uint8_t>{0x00, 0x3c, 0x00, 0x38}));  // f16 1.0, 0.5

  Quantized activation = quantize(make_row_format(Format::int4, Role::activation, 32, 16), x);
  EXPECT_EQ(activation.codes, codes);
  EXPECT_EQ(activation.scales,
            (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x3f}));  // f32
  EXPECT_EQ(activation.dequantized[6], -4.0f);
  EXPECT_EQ(activation.dequantized[17], -3.5f);

  Quantized channel =
      quantize(make_row_format(Format::int4_channel, Role::weight, 4), {7, -7, 1, 0});
  EXPECT_EQ(channel.codes, (std::vector<uint8_t>{0x97, 0x01}));
  EXPECT_EQ(channel.scales, (std::vector<uint8_t>{0x00, 0x3c}));
}

TEST(QuantFormatsPacking, Int4AsymGroupsHoldScaleAndMinimum) {
  // Group 0: lo 1, hi 16 -> scale 1, minimum 1; codes 0, 2 (1.5 ties to even), 3, 15.
  // Group 1: lo -2, hi 1 -> scale 0.2, minimum -2; codes 15, 0, 5 (-1 -> 1 / 0.2), 10 (0).
  const std::vector<float> x = {1, 2.5f, 4, 16, 1, -2, -1, 0};
  Quantized q = quantize(make_row_format(Format::int4_asym, Role::weight, 8, 4), x);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x20, 0xf3, 0x0f, 0xa5}));
  ASSERT_EQ(q.scales.size(), 16u);
  const float expected_scales[4] = {1.0f, 1.0f, 3.0f / 15.0f, -2.0f};  // scale, min per group
  for (int i = 0; i < 4; ++i) {
    float stored;
    std::memcpy(&stored, q.scales.data() + 4 * i, 4);
    EXPECT_EQ(bits_of(stored), bits_of(expected_scales[i])) << "field " << i;
  }
  EXPECT_EQ(block_scale(q.format, q.scales.data(), 1), 3.0f / 15.0f);
  EXPECT_EQ(block_min(q.format, q.scales.data(), 1), -2.0f);
  EXPECT_EQ(block_min(make_row_format(Format::int4, Role::weight, 8, 4), q.scales.data(), 0), 0.0f);
  EXPECT_EQ(q.dequantized[0], 1.0f);
  EXPECT_EQ(q.dequantized[3], 16.0f);
  EXPECT_EQ(q.dequantized[4], std::fma(15.0f, 3.0f / 15.0f, -2.0f));
  EXPECT_EQ(q.dequantized[5], -2.0f);
  // A constant group: scale 0, every code 0, the value is the minimum.
  Quantized flat = quantize(make_row_format(Format::int4_asym, Role::weight, 4, 4), {-3, -3, -3, -3});
  EXPECT_EQ(flat.dequantized, (std::vector<float>{-3, -3, -3, -3}));
}

TEST(QuantFormatsPacking, Int4ZpGroupsHoldAnF16ScaleAndAnIntegerZeroPoint) {
  // Group 0: lo 0 (the grid holds 0), hi 15 -> scale 1, zero 0; codes 1, 2 (2.5 ties to even), 4, 15.
  // Group 1: lo -2, hi 1 -> scale 0.2 (f16), zero 10; codes 0, 15, 5, 10.
  const std::vector<float> x = {1, 2.5f, 4, 15, -2, 1, -1, 0};
  Quantized q = quantize(make_row_format(Format::int4_zp, Role::weight, 8, 4), x);
  const float s1 = qspec::f16_to_f32(qspec::f32_to_f16(0.2f));
  EXPECT_EQ(block_scale(q.format, q.scales.data(), 0), 1.0f);
  EXPECT_EQ(block_zero_point(q.format, q.scales.data(), 0), 0);
  EXPECT_EQ(block_scale(q.format, q.scales.data(), 1), s1);
  EXPECT_EQ(block_zero_point(q.format, q.scales.data(), 1), 10);
  EXPECT_EQ(block_min(q.format, q.scales.data(), 1), -10.0f * s1);  // stored as int4-asym's pair
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x21, 0xf4, 0xf0, 0xa5}));
  // value = s * (code - z), exact, and the same as int4-asym's fma(code, s, -s z).
  for (int i = 0; i < 8; ++i) {
    const int code = (q.codes[i / 2] >> (4 * (i % 2))) & 0xf;
    const float s = i < 4 ? 1.0f : s1;
    const int z = i < 4 ? 0 : 10;
    EXPECT_EQ(bits_of(q.dequantized[i]), bits_of(s * static_cast<float>(code - z))) << i;
    EXPECT_EQ(bits_of(q.dequantized[i]), bits_of(std::fma(static_cast<float>(code), s, -s * static_cast<float>(z)))) << i;
  }
  // An all-negative group keeps 0 on its grid (z = 15); a zero group decodes to zeros.
  Quantized negative = quantize(make_row_format(Format::int4_zp, Role::weight, 4, 4), {-3, -1.5f, -0.2f, -0.1f});
  EXPECT_EQ(block_zero_point(negative.format, negative.scales.data(), 0), 15);
  Quantized zero = quantize(make_row_format(Format::int4_zp, Role::weight, 4, 4), {0, 0, 0, 0});
  EXPECT_EQ(zero.dequantized, (std::vector<float>{0, 0, 0, 0}));
  EXPECT_THROW(block_zero_point(make_row_format(Format::int4_asym, Role::weight, 8, 4), q.scales.data(), 0),
               qspec::Error);
  // Pairs that are not int4-zp's are refused when decoding: a minimum off the -s z grid, a scale
  // that is no f16 value, a zero point past 15.
  auto corrupt = [&](int field, float value) {
    std::vector<uint8_t> scales = q.scales;
    std::memcpy(scales.data() + 4 * field, &value, 4);
    std::vector<float> out(8);
    EXPECT_THROW(dequantize_row(q.format, q.codes.data(), scales.data(), out.data()), qspec::Error) << field << " " << value;
  };
  corrupt(3, -9.5f * s1);
  corrupt(2, 0.2f);  // not f16-exact
  corrupt(3, -16.0f * s1);
  corrupt(1, 1.0f);  // a positive minimum: z < 0
  EXPECT_EQ(parse_format("int4-zp"), Format::int4_zp);
  EXPECT_TRUE(format_has_min(Format::int4_zp) && format_has_groups(Format::int4_zp));
  EXPECT_FALSE(format_supports(Format::int4_zp, Role::activation));
}

// BlockFit::mse: per block never more squared error than the range grid (which it searches
// among its candidates), less where an outlier stretches the range, none where the values lie on
// a 4-bit grid already; the other formats keep their range rule.
TEST(QuantFormatsBlockFit, MseGridsNeverLoseToTheRangeAndWinOnOutliers) {
  std::mt19937 rng(55);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  auto block_errors = [](const RowFormat& f, const std::vector<float>& x, BlockFit fit) {
    std::vector<uint8_t> codes(f.code_bytes()), scales(f.scale_bytes());
    std::vector<float> y(f.k);
    quantize_row(f, x.data(), codes.data(), scales.data(), fit);
    dequantize_row(f, codes.data(), scales.data(), y.data());
    std::vector<double> errors(f.blocks(), 0.0);
    for (int64_t i = 0; i < f.k; ++i) errors[i / f.block] += std::pow(static_cast<double>(x[i]) - y[i], 2);
    return errors;
  };
  for (Format format : {Format::int4, Format::int4_asym, Format::int4_zp, Format::int4_channel}) {
    for (int64_t group : {32, 64, 128}) {
      const RowFormat f = make_row_format(format, Role::weight, 512, group);
      SCOPED_TRACE(std::string(format_name(format)) + " g" + std::to_string(f.block));
      double range_total = 0, mse_total = 0;
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> x(512);
        for (float& v : x) v = normal(rng);
        x[(trial * 37) % 512] = 0.2f * (trial % 2 ? 1.0f : -1.0f);  // one outlier a row
        const std::vector<double> range = block_errors(f, x, BlockFit::range), mse = block_errors(f, x, BlockFit::mse);
        for (size_t b = 0; b < range.size(); ++b) {
          ASSERT_LE(mse[b], range[b]) << "trial " << trial << " block " << b;
          range_total += range[b];
          mse_total += mse[b];
        }
      }
      // int4-zp's grids keep an integer zero point, so its search gains less (8-9 % here).
      EXPECT_LT(mse_total, (format == Format::int4_zp ? 0.95 : 0.9) * range_total);
    }
  }
  // Values on an int4-asym grid (a Q4_1 block: code * 0.01 - 0.07) come back exactly.
  const RowFormat asym = make_row_format(Format::int4_asym, Role::weight, 32, 32);
  std::vector<float> on_grid(32);
  for (int i = 0; i < 32; ++i) on_grid[i] = std::fma(static_cast<float>((i * 7) % 16), 0.01f, -0.07f);
  EXPECT_EQ(block_errors(asym, on_grid, BlockFit::mse)[0], 0.0);
  // nvfp4 / mxfp4: the fit changes nothing.
  for (Format format : {Format::nvfp4, Format::mxfp4}) {
    RowFormat f = make_row_format(format, Role::weight, 64, 0);
    std::vector<float> x(64);
    for (float& v : x) v = normal(rng);
    f.tensor_scale = nvfp4_tensor_scale(abs_max(x.data(), 64));
    std::vector<uint8_t> a(f.code_bytes()), b(f.code_bytes()), sa(f.scale_bytes()), sb(f.scale_bytes());
    quantize_row(f, x.data(), a.data(), sa.data(), BlockFit::range);
    quantize_row(f, x.data(), b.data(), sb.data(), BlockFit::mse);
    EXPECT_EQ(a, b);
    EXPECT_EQ(sa, sb);
  }
  EXPECT_EQ(parse_block_fit("mse"), BlockFit::mse);
  EXPECT_EQ(block_fit_name(parse_block_fit("range")), "range");
  EXPECT_THROW(parse_block_fit("minmax"), qspec::Error);
}

TEST(QuantFormatsPacking, Int4AsymStoredBlocksDecodeAsCodeTimesScalePlusMinimum) {
  // What an importer of GGUF blocks does: store (scale, minimum) as given, then decode.
  RowFormat f = make_row_format(Format::int4_asym, Role::weight, 64, 32);
  std::vector<uint8_t> codes(32), scales(f.scale_bytes());
  for (int i = 0; i < 32; ++i) codes[i] = static_cast<uint8_t>(i * 37 + 5);
  store_asym_block(f, scales.data(), 0, 0.0123f, -0.1f);
  store_asym_block(f, scales.data(), 1, 3.0f, 0.5f);
  std::vector<float> out(64);
  dequantize_row(f, codes.data(), scales.data(), out.data());
  for (int e = 0; e < 64; ++e) {
    const float code = static_cast<float>((codes[e / 2] >> (4 * (e % 2))) & 0xf);
    ASSERT_EQ(bits_of(out[e]), bits_of(e < 32 ? std::fma(code, 0.0123f, -0.1f) : std::fma(code, 3.0f, 0.5f))) << e;
  }
  EXPECT_THROW(store_asym_block(f, scales.data(), 2, 1.0f, 0.0f), qspec::Error);   // no block 2
  EXPECT_THROW(store_asym_block(f, scales.data(), 0, kInf, 0.0f), qspec::Error);
  EXPECT_THROW(store_asym_block(f, scales.data(), 0, 1.0f, kNaN), qspec::Error);
  EXPECT_THROW(store_asym_block(make_row_format(Format::int4, Role::weight, 64, 32), scales.data(), 0, 1.0f, 0.0f),
               qspec::Error);
  // A corrupt minimum is found when decoding.
  const float nan = kNaN;
  std::memcpy(scales.data() + 12, &nan, 4);
  EXPECT_THROW(dequantize_row(f, codes.data(), scales.data(), out.data()), qspec::Error);
  // A range that overflows f32 is refused, naming the format.
  std::vector<float> wide = {-3e38f, 3e38f, 0, 0};
  std::vector<uint8_t> c2(2), s2(8);
  try {
    quantize_row(make_row_format(Format::int4_asym, Role::weight, 4, 4), wide.data(), c2.data(), s2.data());
    ADD_FAILURE() << "accepted an f32-overflowing range";
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find("int4-asym"), std::string::npos) << error.what();
  }
}

TEST(QuantFormatsPacking, Int4ClampIsAsymmetricUnderASubnormalF16Scale) {
  // amax/7 = 1.4 * 2^-24 rounds to the f16 subnormal 2^-24, so x/s = +-9.8: clamp to 7 / -8.
  float big = std::ldexp(9.8f, -24);
  Quantized q = quantize(make_row_format(Format::int4, Role::weight, 2, 2), {big, -big});
  EXPECT_EQ(q.scales, (std::vector<uint8_t>{0x01, 0x00}));
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x87}));
  EXPECT_EQ(q.dequantized[0], std::ldexp(7.0f, -24));
  EXPECT_EQ(q.dequantized[1], std::ldexp(-8.0f, -24));
}

TEST(QuantFormatsPacking, Nvfp4WeightAndActivation) {
  // Tensor amax 10.5 makes the tensor scale exactly 2^-8; block 0 then gets scale 448 (0x7e),
  // so elements are divided by 1.75; block 1 (amax 6 * 2^-8) gets scale 1.0 (0x38).
  const float units0[16] = {6, -6, 0.5f, -0.5f, 1,     1.5f,  2, 3,
                            4, -4, 0,    -0.0f, 0.25f, 0.75f, 5, 2.5f};
  std::vector<float> x(32, 0.0f);
  for (int i = 0; i < 16; ++i) x[i] = 1.75f * units0[i];
  x[16] = std::ldexp(6.0f, -8), x[17] = std::ldexp(3.0f, -8), x[18] = -std::ldexp(1.0f, -8);
  const std::vector<uint8_t> codes = {0xf7, 0x91, 0x32, 0x54, 0xe6, 0x80, 0x20, 0x46,
                                      0x57, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

  RowFormat weight_format = make_row_format(Format::nvfp4, Role::weight, 32);
  EXPECT_EQ(nvfp4_tensor_scale(10.5f), std::ldexp(1.0f, -8));
  Quantized weight = quantize(weight_format, x);
  EXPECT_EQ(weight.codes, codes);
  EXPECT_EQ(weight.scales, (std::vector<uint8_t>{0x7e, 0x38}));
  EXPECT_EQ(weight.dequantized[0], 10.5f);
  EXPECT_EQ(weight.dequantized[12], 0.0f);   // 0.25 units: tie to 0
  EXPECT_EQ(weight.dequantized[13], 1.75f);  // 0.75 units: tie to 1
  EXPECT_EQ(weight.dequantized[14], 7.0f);   // 5 units: tie to 4

  Quantized activation = quantize(make_row_format(Format::nvfp4, Role::activation, 32), x);
  EXPECT_EQ(activation.codes, codes);
  EXPECT_EQ(activation.scales, (std::vector<uint8_t>{0x7e, 0x38, 0x00, 0x00, 0x80, 0x3b}));
  EXPECT_TRUE(same_bits(activation.dequantized, weight.dequantized));
}

TEST(QuantFormatsPacking, Mxfp4) {
  std::vector<float> x(32, 0.0f);
  x[0] = 6, x[1] = -7, x[2] = 0.3f, x[3] = 5.5f;  // amax 7: shared exponent 0, 7 saturates
  Quantized q = quantize(make_row_format(Format::mxfp4, Role::activation, 32), x);
  EXPECT_EQ(q.scales, (std::vector<uint8_t>{0x7f}));
  std::vector<uint8_t> codes(16, 0);
  codes[0] = 0xf7, codes[1] = 0x71;
  EXPECT_EQ(q.codes, codes);
  EXPECT_EQ(q.dequantized[1], -6.0f);

  x[0] = 8, x[1] = -1, x[2] = 0, x[3] = 0;  // amax 8: exponent 1, elements halved
  q = quantize(make_row_format(Format::mxfp4, Role::weight, 32), x);
  EXPECT_EQ(q.scales, (std::vector<uint8_t>{0x80}));
  EXPECT_EQ(q.codes[0], 0x96);
  EXPECT_EQ(q.codes[1], 0x00);
}

TEST(QuantFormatsPacking, Int8AndFp8) {
  Quantized q =
      quantize(make_row_format(Format::int8, Role::activation, 4), {127, -127, 0.5f, -63.5f});
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x7f, 0x81, 0x00, 0xc0}));
  EXPECT_EQ(q.scales, (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3f}));
  q = quantize(make_row_format(Format::fp8, Role::activation, 4),
               {448, -1, std::ldexp(1.0f, -10), 3.1f});
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x7e, 0xb8, 0x00, 0x44}));
  EXPECT_EQ(q.scales, (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3f}));
  // The int8 clamp is symmetric (+-127): reachable when the f32 scale amax / 127 is subnormal
  // and rounds down (180 * 2^-149 / 127 -> 2^-149, so x / s = +-180).
  const float tiny = std::ldexp(180.0f, -149);
  q = quantize(make_row_format(Format::int8, Role::activation, 2), {tiny, -tiny});
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x7f, 0x81}));
  EXPECT_EQ(q.dequantized[1], -std::ldexp(127.0f, -149));
}

// Inputs where the documented order of f32 operations matters: a kernel computing
// amax / 6 / t, x / b / t, or multiplying by a reciprocal instead of dividing, gets a different
// code on these. Found by search and checked with numpy float32 arithmetic.
TEST(QuantFormatsPacking, ArithmeticOrderIsPinned) {
  auto nvfp4_row = [](float tensor_scale, float block_amax, float x) {
    RowFormat f = make_row_format(Format::nvfp4, Role::weight, 16);
    f.tensor_scale = tensor_scale;
    std::vector<float> row(16, 0.0f);
    row[0] = block_amax, row[1] = x;
    return quantize(f, row);
  };
  // Block scale code = e4m3(amax / (6 * t)).
  struct Target {
    float amax, tensor_scale;
    uint8_t code;
  };
  for (Target t :
       {Target{0x1.14ed9ep-1f, 0x1.d89fc6p-6f, 0x44}, Target{0x1.189fdp+5f, 0x1.044a08p-5f, 0x74},
        Target{0x1.1dd7dap-1f, 0x1.896b28p-6f, 0x47}, Target{0x1.0b516cp+0f, 0x1.6febfp-6f, 0x50}})
    EXPECT_EQ(nvfp4_row(t.tensor_scale, t.amax, 0.0f).scales[0], t.code) << t.amax;
  // Element code = e2m1(x / (e4m3_value(b) * t)).
  struct Element {
    float block_amax, x, tensor_scale;
    uint8_t block_code, code;
  };
  for (Element e : {Element{0x1.0313dap+6f, 0x1.f7163ep+2f, 0x1.0c5022p-5f, 0x7a, 2},
                    Element{0x1.7f71c4p+5f, 0x1.cea19cp+3f, 0x1.607b22p-6f, 0x7c, 3},
                    Element{0x1.61f18cp+6f, 0x1.1e37d6p+5f, 0x1.19d092p-5f, 0x7d, 5},
                    Element{0x1.b15c82p+5f, 0x1.fc6078p+4f, 0x1.d0cd3cp-6f, 0x7a, 5}}) {
    Quantized q = nvfp4_row(e.tensor_scale, e.block_amax, e.x);
    EXPECT_EQ(q.scales[0], e.block_code) << e.x;
    EXPECT_EQ(q.codes[0] >> 4, e.code) << e.x;
  }
  auto scale_bits = [](const Quantized& q) {
    uint32_t bits;
    std::memcpy(&bits, q.scales.data(), 4);
    return bits;
  };
  // Integer and fp8 scales are amax / 127, amax / 7, amax / 448 (divisions), and elements are
  // divided by the scale.
  RowFormat int8 = make_row_format(Format::int8, Role::activation, 2);
  EXPECT_EQ(scale_bits(quantize(int8, {0x1.bd0a6cp+2f, 0})), bits_of(0x1.c08b84p-5f));
  EXPECT_EQ(quantize(int8, {0x1.c3adecp+2f, 0x1.38f984p-2f}).codes[1], 6);
  RowFormat int4 = make_row_format(Format::int4, Role::activation, 2, 2);
  EXPECT_EQ(scale_bits(quantize(int4, {0x1.462a88p+2f, 0})), bits_of(0x1.74c2e4p-1f));
  EXPECT_EQ(quantize(int4, {0x1.a0f84p+2f, 0x1.832faap+2f}).codes[0], 0x67);
  RowFormat fp8 = make_row_format(Format::fp8, Role::activation, 2);
  EXPECT_EQ(scale_bits(quantize(fp8, {0x1.94704p+2f, 0})), bits_of(0x1.ce3724p-7f));
  EXPECT_EQ(quantize(fp8, {0x1.9994f6p+2f, 0x1.15ee38p-7f}).codes[1], 0x32);
  // int4 weights: f16(f32(amax / 7)).
  Quantized weight = quantize(make_row_format(Format::int4, Role::weight, 2, 2), {0x1.4bbcp+2f, 0});
  EXPECT_EQ(weight.scales, (std::vector<uint8_t>{0xec, 0x39}));
}

// ============================== row behaviour ==============================

TEST(QuantFormatsRows, RoundTripErrorBounds) {
  for (const Case& c : kAllCases) {
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      std::vector<float> x = gaussian_row(seed, 1024, seed % 2 ? 1.0f : 0.02f);
      x[seed * 37 % 1024] *= 40.0f;  // an outlier in some block
      Quantized q = quantize(format_for(c, 1024), x);
      expect_within_bounds(q, x, describe(c) + " seed " + std::to_string(seed));
    }
  }
}

TEST(QuantFormatsRows, FakeQuantizeEqualsDequantizeOfQuantizeAndIsDeterministic) {
  for (const Case& c : kAllCases) {
    std::vector<float> x = gaussian_row(7, 512);
    x[3] = -0.0f, x[100] = 0.0f;
    Quantized first = quantize(format_for(c, 512), x);
    Quantized second = quantize(format_for(c, 512), x);
    EXPECT_EQ(first.codes, second.codes) << describe(c);
    EXPECT_EQ(first.scales, second.scales) << describe(c);
    std::vector<float> fake = x;
    fake_quantize_row(first.format, fake.data());
    EXPECT_TRUE(same_bits(fake, first.dequantized)) << describe(c);
  }
}

TEST(QuantFormatsRows, DequantizedIsElementTimesBlockScaleTimesTensorScale) {
  for (const Case& c : kAllCases) {
    Quantized q = quantize(format_for(c, 256), gaussian_row(11, 256, 3.0f));
    for (int64_t i = 0; i < 256; ++i) {
      float value = (element_value(q.format, q.codes.data(), i) *
                     block_scale(q.format, q.scales.data(), i / q.format.block)) *
                    row_tensor_scale(q.format, q.scales.data());
      if (format_has_min(c.format))  // int4-asym: fma(code, scale, min), tensor scale 1
        value = std::fma(element_value(q.format, q.codes.data(), i),
                         block_scale(q.format, q.scales.data(), i / q.format.block),
                         block_min(q.format, q.scales.data(), i / q.format.block));
      ASSERT_EQ(bits_of(value), bits_of(q.dequantized[i])) << describe(c) << " element " << i;
    }
  }
}

TEST(QuantFormatsRows, Nvfp4ActivationUsesItsOwnTokenScale) {
  // Per-token tensor scale: the same codes as a weight row whose matrix is this one row.
  std::vector<float> x = gaussian_row(5, 256, 0.3f);
  Quantized activation = quantize(make_row_format(Format::nvfp4, Role::activation, 256), x);
  RowFormat weight_format = make_row_format(Format::nvfp4, Role::weight, 256);
  weight_format.tensor_scale = nvfp4_tensor_scale(abs_max(x.data(), 256));
  Quantized weight = quantize(weight_format, x);
  EXPECT_EQ(activation.codes, weight.codes);
  EXPECT_TRUE(std::equal(weight.scales.begin(), weight.scales.end(), activation.scales.begin()));
  EXPECT_EQ(row_tensor_scale(activation.format, activation.scales.data()),
            weight_format.tensor_scale);
  EXPECT_TRUE(same_bits(activation.dequantized, weight.dequantized));
}

TEST(QuantFormatsRows, ZeroRowsAndZeroBlocks) {
  for (const Case& c : kAllCases) {
    Quantized q = quantize(format_for(c, 256), std::vector<float>(256, 0.0f));
    EXPECT_TRUE(std::all_of(q.codes.begin(), q.codes.end(), [](uint8_t b) { return b == 0; }))
        << describe(c);
    EXPECT_TRUE(std::all_of(q.scales.begin(), q.scales.end(), [](uint8_t b) { return b == 0; }))
        << describe(c);
    EXPECT_TRUE(same_bits(q.dequantized, std::vector<float>(256, 0.0f))) << describe(c);
  }
  // A zero block inside a non-zero row: scale code 0, zero codes.
  std::vector<float> x = gaussian_row(3, 64);
  std::fill(x.begin() + 16, x.begin() + 32, 0.0f);
  Quantized nv = quantize(make_row_format(Format::nvfp4, Role::activation, 64), x);
  EXPECT_EQ(nv.scales[1], 0x00);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(nv.codes[i], 0x00);
  std::fill(x.begin(), x.begin() + 32, 0.0f);
  Quantized mx = quantize(make_row_format(Format::mxfp4, Role::activation, 64), x);
  EXPECT_EQ(mx.scales[0], 0x00);
  // An nvfp4 weight row of zeros under a non-zero matrix scale.
  RowFormat weight_format = make_row_format(Format::nvfp4, Role::weight, 32);
  weight_format.tensor_scale = 0.5f;
  std::vector<uint8_t> codes(16, 0xab), scales(2, 0xab);
  std::vector<float> zeros(32, 0.0f);
  quantize_row(weight_format, zeros.data(), codes.data(), scales.data());
  EXPECT_EQ(codes, std::vector<uint8_t>(16, 0));
  EXPECT_EQ(scales, std::vector<uint8_t>(2, 0));
}

TEST(QuantFormatsRows, NegativeZeroKeepsItsSignInFloatFormats) {
  for (const Case& c : kAllCases) {
    Quantized q = quantize(format_for(c, 256), std::vector<float>(256, -0.0f));
    bool float_codes =
        c.format == Format::nvfp4 || c.format == Format::mxfp4 || c.format == Format::fp8;
    uint8_t expected_code = c.format == Format::fp8 ? 0x80 : (float_codes ? 0x88 : 0x00);
    EXPECT_TRUE(std::all_of(q.codes.begin(), q.codes.end(), [&](uint8_t b) {
      return b == expected_code;
    })) << describe(c);
    for (float value : q.dequantized) {
      ASSERT_EQ(value, 0.0f) << describe(c);
      ASSERT_EQ(std::signbit(value), float_codes) << describe(c);  // integers have no -0
    }
  }
}

TEST(QuantFormatsRows, HugeAndTinyMagnitudes) {
  for (const Case& c : kAllCases) {
    bool f16_scales = c.role == Role::weight &&
                      (c.format == Format::int4 || c.format == Format::int4_channel || c.format == Format::int4_zp);
    for (float magnitude : {1e-30f, 1e-20f, 1e20f, 1e37f}) {
      std::vector<float> x = gaussian_row(9, 256);
      for (auto& value : x) value *= magnitude;
      std::string what = describe(c) + " at " + std::to_string(magnitude);
      if (f16_scales) {
        if (magnitude > 1.0f) {  // beyond 7 * 65504: an error, not an infinite scale
          try {
            quantize(format_for(c, 256), x);
            ADD_FAILURE() << what << " accepted";
          } catch (const qspec::Error& error) {
            EXPECT_NE(std::string(error.what()).find("f16"), std::string::npos) << error.what();
          }
        } else {  // scale amax/7 below half the smallest f16 subnormal: flushed to zero
          Quantized q = quantize(format_for(c, 256), x);
          EXPECT_TRUE(same_bits(q.dequantized, std::vector<float>(256, 0.0f))) << what;
        }
        continue;
      }
      Quantized q = quantize(format_for(c, 256), x);
      for (float value : q.dequantized) ASSERT_TRUE(std::isfinite(value)) << what;
      expect_within_bounds(q, x, what);
    }
  }
}

TEST(QuantFormatsRows, RejectsNaNAndInfinityWithoutWriting) {
  for (const Case& c : kAllCases) {
    for (float bad : {kNaN, kInf, -kInf}) {
      std::vector<float> x = gaussian_row(2, 256);
      x[37] = bad;
      RowFormat f = format_for(c, 256);
      f.tensor_scale = 1.0f;  // nvfp4 weights: a valid matrix scale, so only x is at fault
      std::vector<uint8_t> codes(f.code_bytes(), 0xab), scales(f.scale_bytes(), 0xcd);
      try {
        quantize_row(f, x.data(), codes.data(), scales.data());
        ADD_FAILURE() << describe(c) << " accepted " << bad;
      } catch (const qspec::Error& error) {
        EXPECT_NE(std::string(error.what()).find("value 37"), std::string::npos) << error.what();
      }
      EXPECT_EQ(codes, std::vector<uint8_t>(codes.size(), 0xab)) << describe(c);
      EXPECT_EQ(scales, std::vector<uint8_t>(scales.size(), 0xcd)) << describe(c);
      std::vector<float> fake = x;
      EXPECT_THROW(fake_quantize_row(f, fake.data()), qspec::Error) << describe(c);
      EXPECT_EQ(bits_of(fake[0]), bits_of(x[0])) << describe(c);
    }
  }
  EXPECT_THROW(abs_max(std::vector<float>{1, kNaN}.data(), 2), qspec::Error);
  EXPECT_THROW(nvfp4_tensor_scale(kInf), qspec::Error);
  EXPECT_THROW(nvfp4_tensor_scale(-1.0f), qspec::Error);
}

TEST(QuantFormatsRows, Nvfp4WeightNeedsAMatrixTensorScale) {
  std::vector<float> x = gaussian_row(4, 64);
  RowFormat f = make_row_format(Format::nvfp4, Role::weight, 64);
  std::vector<uint8_t> codes(f.code_bytes()), scales(f.scale_bytes());
  EXPECT_THROW(quantize_row(f, x.data(), codes.data(), scales.data()), qspec::Error);  // forgot it
  f.tensor_scale = nvfp4_tensor_scale(abs_max(x.data(), 64) / 2);  // from a smaller matrix
  EXPECT_THROW(quantize_row(f, x.data(), codes.data(), scales.data()), qspec::Error);
  f.tensor_scale = kNaN;
  EXPECT_THROW(quantize_row(f, x.data(), codes.data(), scales.data()), qspec::Error);
  f.tensor_scale = nvfp4_tensor_scale(abs_max(x.data(), 64) * 4);  // a larger matrix: fine
  EXPECT_NO_THROW(quantize_row(f, x.data(), codes.data(), scales.data()));
}

TEST(QuantFormatsRows, DequantizeRejectsCorruptScales) {
  std::vector<float> out(32);
  std::vector<uint8_t> codes(16, 0x11);
  std::vector<uint8_t> mx_scales = {0xff};
  EXPECT_THROW(dequantize_row(make_row_format(Format::mxfp4, Role::weight, 32), codes.data(),
                              mx_scales.data(), out.data()),
               qspec::Error);
  RowFormat nv = make_row_format(Format::nvfp4, Role::weight, 32);
  nv.tensor_scale = 1.0f;
  std::vector<uint8_t> nv_scales = {0x38, 0x7f};
  EXPECT_THROW(dequantize_row(nv, codes.data(), nv_scales.data(), out.data()), qspec::Error);
  std::vector<uint8_t> f16_scales = {0x00, 0x7c};  // +inf
  EXPECT_THROW(dequantize_row(make_row_format(Format::int4, Role::weight, 32, 32), codes.data(),
                              f16_scales.data(), out.data()),
               qspec::Error);
  RowFormat nv_act = make_row_format(Format::nvfp4, Role::activation, 32);
  std::vector<uint8_t> act_scales = {0x38, 0x38, 0x00, 0x00, 0xc0, 0x7f};  // NaN token scale
  EXPECT_THROW(dequantize_row(nv_act, codes.data(), act_scales.data(), out.data()), qspec::Error);
}

// ============================== ARCQuant ==============================

TEST(QuantFormatsArc, SourceChannelsOfBothLayouts) {
  ArcRow concatenated = make_arc_row(Format::nvfp4, 64, 32, ArcLayout::concatenated);
  ArcRow interleaved = make_arc_row(Format::nvfp4, 64, 32, ArcLayout::interleaved);
  EXPECT_EQ(concatenated.augmented.k, 96);
  for (int64_t j = 0; j < 96; ++j) {
    // [X(0..63) | R(32..63)]
    EXPECT_EQ(concatenated.source_channel(j), j < 64 ? j : j - 32) << j;
    EXPECT_EQ(concatenated.is_residual(j), j >= 64) << j;
    // X(0..31), X(32..47), R(32..47), X(48..63), R(48..63)
    int64_t expected = j < 48 ? j : (j < 64 ? j - 16 : (j < 80 ? j - 16 : j - 32));
    EXPECT_EQ(interleaved.source_channel(j), expected) << j;
    EXPECT_EQ(interleaved.is_residual(j), (j >= 48 && j < 64) || j >= 80) << j;
  }
}

TEST(QuantFormatsArc, RejectsBadShapesFormatsAndInputs) {
  EXPECT_THROW(make_arc_row(Format::nvfp4, 64, 10), qspec::Error);
  EXPECT_THROW(make_arc_row(Format::mxfp4, 64, 16), qspec::Error);
  EXPECT_THROW(make_arc_row(Format::int4, 256, 64, ArcLayout::concatenated, 128), qspec::Error);
  EXPECT_THROW(make_arc_row(Format::nvfp4, 64, 80), qspec::Error);
  EXPECT_THROW(make_arc_row(Format::nvfp4, 64, -16), qspec::Error);
  EXPECT_THROW(make_arc_row(Format::int8, 64, 0), qspec::Error);
  EXPECT_THROW(make_arc_row(Format::fp8, 64, 0), qspec::Error);
  EXPECT_THROW(make_arc_row(Format::int4_channel, 64, 0), qspec::Error);
  try {
    make_arc_row(Format::nvfp4, 64, 10);
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find("S=10"), std::string::npos) << error.what();
  }
  ArcRow arc = make_arc_row(Format::nvfp4, 64, 16);
  std::vector<float> x = gaussian_row(1, 64), out(80);
  x[60] = kNaN;
  std::vector<uint8_t> codes(arc.augmented.code_bytes()), scales(arc.augmented.scale_bytes());
  EXPECT_THROW(arc_quantize_row(arc, x.data(), codes.data(), scales.data()), qspec::Error);
  EXPECT_THROW(arc_fake_quantize_row(arc, x.data(), out.data()), qspec::Error);
}

TEST(QuantFormatsArc, NoOutliersIsThePlainRow) {
  for (Format format : {Format::int4, Format::nvfp4, Format::mxfp4}) {
    std::vector<float> x = gaussian_row(8, 256);
    ArcRow arc = make_arc_row(format, 256, 0, ArcLayout::concatenated, 64);
    std::vector<uint8_t> codes(arc.augmented.code_bytes()), scales(arc.augmented.scale_bytes());
    arc_quantize_row(arc, x.data(), codes.data(), scales.data());
    Quantized plain = quantize(make_row_format(format, Role::activation, 256, 64), x);
    EXPECT_EQ(codes, plain.codes) << format_name(format);
    EXPECT_EQ(scales, plain.scales) << format_name(format);
  }
}

// (a) The augmented row is [Q(X) | Q(R)] and the augmented dot product over K+S equals
// Q(X)Q(W)^T + Q(R)Q(W_o)^T; weights augmented by gathering columns are [Q_W | Q_W_o].
TEST(QuantFormatsArc, AugmentedGemmEqualsPrimaryPlusResidualGemm) {
  constexpr int64_t K = 256, S = 64, N = 8, kGroup = 32;
  for (Format format : {Format::nvfp4, Format::mxfp4, Format::int4}) {
    for (ArcLayout layout : {ArcLayout::concatenated, ArcLayout::interleaved}) {
      std::string what = std::string(format_name(format)) +
                         (layout == ArcLayout::concatenated ? " concatenated" : " interleaved");
      // Several rows: a contracted (FMA) residual x - c * s changes int4's f32 residual scale
      // in about 4 rows of 10; this catches it.
      for (uint32_t seed = 21; seed < 37; ++seed) {
        std::vector<float> x = gaussian_row(seed, K);
        for (int64_t c = K - S; c < K; ++c) x[c] *= 25.0f;  // the outliers
        ArcRow arc = make_arc_row(format, K, S, layout, kGroup);
        const RowFormat& aug = arc.augmented;

        std::vector<uint8_t> codes(aug.code_bytes()), scales(aug.scale_bytes());
        arc_quantize_row(arc, x.data(), codes.data(), scales.data());
        std::vector<float> xa(K + S), xa_fake(K + S);
        dequantize_row(aug, codes.data(), scales.data(), xa.data());
        arc_fake_quantize_row(arc, x.data(), xa_fake.data());
        ASSERT_TRUE(same_bits(xa, xa_fake)) << what;

        // Q(X), then R = X_o - dequant(Q(X_o)) and Q(R), computed separately. nvfp4 quantizes R
        // under the token scale of X: a weight-role row with that tensor scale does exactly that.
        Quantized qx = quantize(make_row_format(format, Role::activation, K, kGroup), x);
        std::vector<float> residual(S);
        for (int64_t i = 0; i < S; ++i) residual[i] = x[K - S + i] - qx.dequantized[K - S + i];
        RowFormat residual_format = make_row_format(format, Role::activation, S, kGroup);
        if (format == Format::nvfp4) {
          residual_format = make_row_format(format, Role::weight, S);
          residual_format.tensor_scale = nvfp4_tensor_scale(abs_max(x.data(), K));
        }
        std::vector<float> qr = residual;
        fake_quantize_row(residual_format, qr.data());
        for (int64_t j = 0; j < K + S; ++j) {
          int64_t c = arc.source_channel(j);
          float expected = arc.is_residual(j) ? qr[c - (K - S)] : qx.dequantized[c];
          ASSERT_EQ(bits_of(xa[j]), bits_of(expected)) << what << " position " << j;
        }
        if (layout == ArcLayout::concatenated) {  // the packed prefix is the plain row's
          EXPECT_TRUE(std::equal(qx.codes.begin(), qx.codes.end(), codes.begin())) << what;
          EXPECT_TRUE(
              std::equal(qx.scales.begin(),
                         qx.scales.begin() + qx.format.blocks() * (format == Format::int4 ? 4 : 1),
                         scales.begin()))
              << what;
        }

        // Weights: Q(W) over K, and the gathered [W | W_o] quantized as rows of K+S.
        std::vector<std::vector<float>> w(N), wq(N), waq(N);
        RowFormat w_format = make_row_format(format, Role::weight, K, kGroup);
        RowFormat wa_format = make_row_format(format, Role::weight, K + S, kGroup);
        float w_amax = 0.0f;
        for (int64_t n = 0; n < N; ++n) {
          w[n] = gaussian_row(100 + n, K, 0.05f);
          w_amax = std::max(w_amax, abs_max(w[n].data(), K));
        }
        w_format.tensor_scale = wa_format.tensor_scale = nvfp4_tensor_scale(w_amax);
        for (int64_t n = 0; n < N; ++n) {
          wq[n] = w[n];
          fake_quantize_row(w_format, wq[n].data());
          waq[n].resize(K + S);
          for (int64_t j = 0; j < K + S; ++j) waq[n][j] = w[n][arc.source_channel(j)];
          fake_quantize_row(wa_format, waq[n].data());
          for (int64_t j = 0; j < K + S; ++j)
            ASSERT_EQ(bits_of(waq[n][j]), bits_of(wq[n][arc.source_channel(j)]))
                << what << " " << j;

          double augmented = 0.0, magnitude = 0.0;
          for (int64_t j = 0; j < K + S; ++j) {
            augmented += static_cast<double>(xa[j]) * waq[n][j];
            magnitude += std::fabs(static_cast<double>(xa[j]) * waq[n][j]);
          }
          double primary = 0.0, correction = 0.0;
          for (int64_t c = 0; c < K; ++c)
            primary += static_cast<double>(qx.dequantized[c]) * wq[n][c];
          for (int64_t i = 0; i < S; ++i)
            correction += static_cast<double>(qr[i]) * wq[n][K - S + i];
          // Products of floats are exact in double; only the summation order differs.
          EXPECT_NEAR(augmented, primary + correction, 1e-13 * magnitude) << what << " row " << n;
        }
      }
    }
  }
  // int4-channel weights: one scale per row; the duplicated columns do not change it.
  std::vector<float> w = gaussian_row(5, 256);
  ArcRow arc = make_arc_row(Format::int4, 256, 64, ArcLayout::concatenated, 32);
  std::vector<float> wq = w, wa(320);
  fake_quantize_row(make_row_format(Format::int4_channel, Role::weight, 256), wq.data());
  for (int64_t j = 0; j < 320; ++j) wa[j] = w[arc.source_channel(j)];
  fake_quantize_row(make_row_format(Format::int4_channel, Role::weight, 320), wa.data());
  for (int64_t j = 0; j < 320; ++j) ASSERT_EQ(bits_of(wa[j]), bits_of(wq[arc.source_channel(j)]));
}

// (b) Paper section 3.4: on compensated channels, dual-stage NVFP4's worst-case error is within
// MXFP8's bound 2 * M * eps8 (eps8 = 2^-4, M the block's amax), and in fact within the paper's
// own B_arc = 1.125^2 * M * eps8.
TEST(QuantFormatsArc, DualStageNvfp4ErrorIsWithinTheMxfp8Bound) {
  constexpr int64_t K = 512, S = 128;
  constexpr double kEps8 = 1.0 / 16;
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst_arc = 0.0, worst_mxfp8 = 0.0, arc_squared = 0.0, mxfp8_squared = 0.0;
  ArcRow arc = make_arc_row(Format::nvfp4, K, S);
  for (int row = 0; row < 400; ++row) {
    float peak = std::ldexp(1.0f, static_cast<int>(uniform(rng) * 40) - 20) * (1 + uniform(rng));
    std::vector<float> x(K);
    for (int64_t c = 0; c < K - S; ++c) x[c] = normal(rng) * peak / 64;
    for (int64_t c = K - S; c < K; ++c) {
      // Channels above the paper's threshold tau = M / 8: log-uniform in [M/8, M], or
      // Gaussian outliers for half of the rows.
      float magnitude = row % 2 ? peak * std::exp2(-3.0f * uniform(rng)) : normal(rng) * peak / 3;
      x[c] = uniform(rng) < 0.5f ? -magnitude : magnitude;
    }
    std::vector<float> augmented(K + S);
    arc_fake_quantize_row(arc, x.data(), augmented.data());
    std::vector<float> mxfp8(x.begin() + (K - S), x.end());
    mxfp8_fake_quantize(mxfp8.data(), S);
    for (int64_t start = 0; start < S; start += 16) {
      double block_amax = 0.0, block32_amax = 0.0, arc_error = 0.0, mx_error = 0.0;
      for (int64_t i = start; i < start + 16; ++i)
        block_amax = std::max(block_amax, static_cast<double>(std::fabs(x[K - S + i])));
      for (int64_t i = start / 32 * 32; i < start / 32 * 32 + 32; ++i)
        block32_amax = std::max(block32_amax, static_cast<double>(std::fabs(x[K - S + i])));
      for (int64_t i = start; i < start + 16; ++i) {
        double value = x[K - S + i];
        double compensated = static_cast<double>(augmented[K - S + i]) + augmented[K + i];
        arc_error = std::max(arc_error, std::fabs(value - compensated));
        mx_error = std::max(mx_error, std::fabs(value - mxfp8[i]));
        arc_squared += (value - compensated) * (value - compensated);
        mxfp8_squared += (value - mxfp8[i]) * (value - mxfp8[i]);
      }
      if (block_amax == 0.0) continue;
      ASSERT_LE(arc_error, 2 * block_amax * kEps8) << "row " << row << " block " << start;
      ASSERT_LE(arc_error, 1.125 * 1.125 * block_amax * kEps8) << "row " << row;
      ASSERT_LE(mx_error, 2 * block32_amax * kEps8) << "MXFP8 bound itself, row " << row;
      worst_arc = std::max(worst_arc, arc_error / block_amax);
      worst_mxfp8 = std::max(worst_mxfp8, mx_error / block32_amax);
    }
  }
  std::printf(
      "[ARC bound] worst |err|/M: dual-stage NVFP4 %.5f, MXFP8 %.5f (bound 2*eps8 = %.5f);"
      " MSE ratio ARC/MXFP8 %.3f\n",
      worst_arc, worst_mxfp8, 2 * kEps8, arc_squared / mxfp8_squared);
}

// (c) On outlier-heavy rows ARC lowers the error of int4, nvfp4 and mxfp4, both of the
// activations themselves and of a GEMM against full-precision weights.
TEST(QuantFormatsArc, LowersErrorOnOutlierHeavyRows) {
  constexpr int64_t K = 1024, N = 16;
  struct Setting {
    Format format;
    int64_t outliers;
  };
  for (Setting setting :
       {Setting{Format::int4, 128}, Setting{Format::nvfp4, 64}, Setting{Format::mxfp4, 64}}) {
    const int64_t S = setting.outliers;
    ArcRow arc = make_arc_row(setting.format, K, S, ArcLayout::concatenated, 128);
    RowFormat plain = make_row_format(setting.format, Role::activation, K, 128);
    std::vector<std::vector<float>> w(N);
    for (int64_t n = 0; n < N; ++n) w[n] = gaussian_row(500 + n, K, 0.05f);
    double plain_x = 0.0, arc_x = 0.0, plain_y = 0.0, arc_y = 0.0;
    for (uint32_t row = 0; row < 32; ++row) {
      std::vector<float> x = gaussian_row(900 + row, K);
      std::mt19937 rng(row);
      std::uniform_real_distribution<float> spread(10.0f, 100.0f);
      for (int64_t c = K - S; c < K; ++c) x[c] *= spread(rng);
      std::vector<float> quantized = x, augmented(K + S);
      fake_quantize_row(plain, quantized.data());
      arc_fake_quantize_row(arc, x.data(), augmented.data());
      for (int64_t c = 0; c < K; ++c) {
        double compensated = augmented[c] + (c >= K - S ? augmented[K + c - (K - S)] : 0.0f);
        plain_x += std::pow(x[c] - quantized[c], 2);
        arc_x += std::pow(x[c] - compensated, 2);
      }
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0.0, y_plain = 0.0, y_arc = 0.0;
        for (int64_t c = 0; c < K; ++c) {
          exact += static_cast<double>(x[c]) * w[n][c];
          y_plain += static_cast<double>(quantized[c]) * w[n][c];
        }
        for (int64_t j = 0; j < K + S; ++j)
          y_arc += static_cast<double>(augmented[j]) * w[n][arc.source_channel(j)];
        plain_y += std::pow(exact - y_plain, 2);
        arc_y += std::pow(exact - y_arc, 2);
      }
    }
    std::printf("[ARC gain] %s S=%lld: activation MSE ratio ARC/plain %.4f, GEMM MSE ratio %.4f\n",
                std::string(format_name(setting.format)).c_str(), static_cast<long long>(S),
                arc_x / plain_x, arc_y / plain_y);
    EXPECT_LT(arc_x, 0.5 * plain_x) << format_name(setting.format);
    EXPECT_LT(arc_y, 0.5 * plain_y) << format_name(setting.format);
  }
}

TEST(QuantFormatsPacking, Int8GroupsHoldAnF32ScaleAGroupAndOneByteACode) {
  // Groups of 4: amax 127 -> scale 1, codes as the values; amax 254 -> scale 2, 127 -> 63.5 -> 64
  // (ties to even), -1 -> -0.5 -> 0 (ties to even).
  const std::vector<float> x = {127, -3, 0.4f, -127, 254, 127, -1, 0};
  const RowFormat format = make_row_format(Format::int8_group, Role::weight, 8, 4);
  EXPECT_EQ(format.block, 4);
  EXPECT_EQ(format.code_bytes(), 8);
  EXPECT_EQ(format.scale_bytes(), 8);
  Quantized q = quantize(format, x);
  EXPECT_EQ(block_scale(q.format, q.scales.data(), 0), 1.0f);
  EXPECT_EQ(block_scale(q.format, q.scales.data(), 1), 2.0f);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{127, 0xfd, 0, 0x81, 127, 64, 0, 0}));
  for (int i = 0; i < 8; ++i) {
    const float s = block_scale(q.format, q.scales.data(), i / 4);
    EXPECT_EQ(bits_of(q.dequantized[i]), bits_of(static_cast<float>(static_cast<int8_t>(q.codes[i])) * s)) << i;
    EXPECT_EQ(element_value(q.format, q.codes.data(), i), static_cast<float>(static_cast<int8_t>(q.codes[i]))) << i;
  }
  // An importer stores any finite scale (a negative one too) and any code, -128 included.
  std::vector<uint8_t> scales(8), codes = {0x80, 1, 2, 3, 4, 5, 6, 7};
  store_block_scale(format, scales.data(), 0, -0.5f);
  store_block_scale(format, scales.data(), 1, 0.25f);
  std::vector<float> out(8);
  dequantize_row(format, codes.data(), scales.data(), out.data());
  EXPECT_EQ(out, (std::vector<float>{64, -0.5f, -1, -1.5f, 1, 1.25f, 1.5f, 1.75f}));
  EXPECT_THROW(store_block_scale(format, scales.data(), 0, NAN), qspec::Error);
  EXPECT_THROW(store_block_scale(format, scales.data(), 2, 1.0f), qspec::Error);
  EXPECT_THROW(store_block_scale(make_row_format(Format::int4, Role::weight, 8, 4), scales.data(), 0, 1.0f),
               qspec::Error);
  // A weight format with groups, never an activation one.
  EXPECT_EQ(parse_format("int8-group"), Format::int8_group);
  EXPECT_EQ(format_name(Format::int8_group), "int8-group");
  EXPECT_TRUE(format_has_groups(Format::int8_group));
  EXPECT_FALSE(format_has_min(Format::int8_group));
  EXPECT_TRUE(format_supports(Format::int8_group, Role::weight));
  EXPECT_FALSE(format_supports(Format::int8_group, Role::activation));
  EXPECT_THROW(make_row_format(Format::int8_group, Role::activation, 8, 4), qspec::Error);
  EXPECT_THROW(make_row_format(Format::int8_group, Role::weight, 12, 8), qspec::Error);  // K not a multiple
}
