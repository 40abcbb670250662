// dtype table and the bf16 / f16 scalar conversions. Rounding is checked against an
// independent oracle: the nearest representable value found by search over every value of
// the format, ties going to the even bit pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "base/dtype.h"

using qspec::DType;

namespace {

float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// The positive half of a 16-bit float format, in increasing order, as (value, bits) pairs,
// followed by infinity standing in at 2^(max exponent + 1): that is where round-to-nearest
// overflows, and infinity's bit pattern is even, as the IEEE overflow rule needs.
struct Format {
  std::vector<double> values;
  std::vector<uint16_t> bits;
};

Format positive_values(float (*decode)(uint16_t), uint16_t infinity_bits, double overflow_point) {
  Format format;
  for (uint32_t bits = 0; bits < infinity_bits; ++bits) {
    format.values.push_back(decode(static_cast<uint16_t>(bits)));
    format.bits.push_back(static_cast<uint16_t>(bits));
  }
  format.values.push_back(overflow_point);
  format.bits.push_back(infinity_bits);
  return format;
}

// Round-to-nearest-even by search: what a correct f32 -> 16-bit conversion must return.
uint16_t nearest_even(const Format& format, float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude >= format.values.back()) return sign | format.bits.back();
  auto above = std::lower_bound(format.values.begin(), format.values.end(), magnitude);
  const size_t high = static_cast<size_t>(above - format.values.begin());
  if (format.values[high] == magnitude) return sign | format.bits[high];
  const size_t low = high - 1;
  const double to_low = magnitude - format.values[low];
  const double to_high = format.values[high] - magnitude;
  size_t pick;
  if (to_low < to_high) pick = low;
  else if (to_high < to_low) pick = high;
  else pick = (format.bits[low] & 1) == 0 ? low : high;
  return sign | format.bits[pick];
}

const Format& bf16_format() {
  static const Format format = positive_values(qspec::bf16_to_f32, 0x7f80, std::ldexp(1.0, 128));
  return format;
}

const Format& f16_format() {
  static const Format format = positive_values(qspec::f16_to_f32, 0x7c00, 65536.0);
  return format;
}

bool is_bf16_nan(uint16_t bits) { return (bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0; }
bool is_f16_nan(uint16_t bits) { return (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0; }

// f32 inputs worth checking: a stride over every bit pattern, plus the neighbourhood of each
// 16-bit value and of each midpoint between neighbours (where rounding decides).
std::vector<float> probe_values(const Format& format) {
  std::vector<float> probes;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 40503) probes.push_back(float_of(static_cast<uint32_t>(bits)));
  for (size_t i = 0; i + 1 < format.values.size(); ++i) {
    const float exact = static_cast<float>(format.values[i]);
    const float midpoint = static_cast<float>((format.values[i] + format.values[i + 1]) / 2);
    for (float centre : {exact, midpoint}) {
      probes.push_back(centre);
      probes.push_back(std::nextafter(centre, 0.0f));
      probes.push_back(std::nextafter(centre, std::numeric_limits<float>::infinity()));
    }
  }
  return probes;
}

}  // namespace

TEST(DType, TableIsConsistent) {
  const DType all[] = {DType::F64,  DType::F32,  DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
                       DType::F8_E8M0, DType::I64, DType::I32, DType::I16, DType::I8, DType::U64,
                       DType::U32, DType::U16, DType::U8, DType::BOOL};
  const size_t sizes[] = {8, 4, 2, 2, 1, 1, 1, 8, 4, 2, 1, 8, 4, 2, 1, 1};
  for (size_t i = 0; i < std::size(all); ++i) {
    SCOPED_TRACE(std::string(qspec::dtype_name(all[i])));
    EXPECT_EQ(qspec::dtype_size(all[i]), sizes[i]);
    DType parsed = DType::U8;
    ASSERT_TRUE(qspec::parse_dtype(qspec::dtype_name(all[i]), &parsed));
    EXPECT_EQ(parsed, all[i]);
  }
  EXPECT_EQ(qspec::dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(qspec::dtype_name(DType::F8_E4M3), "F8_E4M3");
  DType untouched = DType::I8;
  EXPECT_FALSE(qspec::parse_dtype("bf16", &untouched));
  EXPECT_FALSE(qspec::parse_dtype("", &untouched));
  EXPECT_FALSE(qspec::parse_dtype("F32 ", &untouched));
  EXPECT_EQ(untouched, DType::I8);
}

TEST(DType, Bf16DecodeIsTheHighHalfOfF32) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits)
    ASSERT_EQ(bits_of(qspec::bf16_to_f32(static_cast<uint16_t>(bits))), bits << 16) << bits;
}

TEST(DType, Bf16RoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const uint16_t again = qspec::f32_to_bf16(qspec::bf16_to_f32(b));
    if (is_bf16_nan(b)) ASSERT_TRUE(is_bf16_nan(again)) << std::hex << bits;
    else ASSERT_EQ(again, b) << std::hex << bits;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  const Format& format = bf16_format();
  for (float value : probe_values(format)) {
    if (std::isnan(value)) continue;
    ASSERT_EQ(qspec::f32_to_bf16(value), nearest_even(format, value))
        << std::hexfloat << value << " bits " << std::hex << bits_of(value);
  }
}

TEST(DType, Bf16EdgeCases) {
  // Ties: 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7 (odd).
  EXPECT_EQ(qspec::f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(qspec::f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie, up to even
  EXPECT_EQ(qspec::f32_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(qspec::f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(qspec::f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(qspec::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(qspec::f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(qspec::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(qspec::f32_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
  // f32 subnormals keep their top bits; the smallest rounds to zero.
  EXPECT_EQ(qspec::f32_to_bf16(float_of(0x00400000)), 0x0040);
  EXPECT_EQ(qspec::f32_to_bf16(float_of(0x00000001)), 0x0000);
  EXPECT_EQ(qspec::f32_to_bf16(float_of(0x80008000)), 0x8000);  // tie down to even zero
  EXPECT_EQ(qspec::f32_to_bf16(float_of(0x00018000)), 0x0002);  // tie up to even
  // A NaN whose payload sits only in the low half must not truncate to infinity.
  EXPECT_TRUE(is_bf16_nan(qspec::f32_to_bf16(float_of(0x7f800001))));
  EXPECT_TRUE(is_bf16_nan(qspec::f32_to_bf16(float_of(0xff800001))));
  EXPECT_EQ(qspec::f32_to_bf16(float_of(0xff800001)) & 0x8000, 0x8000);
  EXPECT_TRUE(is_bf16_nan(qspec::f32_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(qspec::bf16_to_f32(0x7fc0)));
  EXPECT_TRUE(std::isinf(qspec::bf16_to_f32(0xff80)));
}

TEST(DType, F16DecodeMatchesTheDefinition) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const int exponent = (h >> 10) & 0x1f;
    const int mantissa = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const float value = qspec::f16_to_f32(h);
    if (exponent == 31) {
      if (mantissa == 0) ASSERT_EQ(value, static_cast<float>(sign * INFINITY)) << bits;
      else ASSERT_TRUE(std::isnan(value)) << bits;
      continue;
    }
    const double expected = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                          : sign * std::ldexp(1024 + mantissa, exponent - 25);
    ASSERT_EQ(static_cast<double>(value), expected) << std::hex << bits;
    ASSERT_EQ(std::signbit(value), (h & 0x8000) != 0) << std::hex << bits;
  }
}

TEST(DType, F16RoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const uint16_t again = qspec::f32_to_f16(qspec::f16_to_f32(h));
    if (is_f16_nan(h)) ASSERT_TRUE(is_f16_nan(again)) << std::hex << bits;
    else ASSERT_EQ(again, h) << std::hex << bits;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  const Format& format = f16_format();
  for (float value : probe_values(format)) {
    if (std::isnan(value)) continue;
    ASSERT_EQ(qspec::f32_to_f16(value), nearest_even(format, value))
        << std::hexfloat << value << " bits " << std::hex << bits_of(value);
  }
}

TEST(DType, F16EdgeCases) {
  EXPECT_EQ(qspec::f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(qspec::f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie, down to even
  EXPECT_EQ(qspec::f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie, up to even
  EXPECT_EQ(qspec::f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(qspec::f32_to_f16(-0.0f), 0x8000);
  // Overflow: 65504 is the largest finite; 65520 is the midpoint to 65536 and ties to inf.
  EXPECT_EQ(qspec::f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(qspec::f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(qspec::f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(qspec::f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(qspec::f32_to_f16(-1e30f), 0xfc00);
  EXPECT_EQ(qspec::f32_to_f16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(qspec::f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(qspec::f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormals: units of 2^-24.
  EXPECT_EQ(qspec::f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(qspec::f32_to_f16(0x1p-25f), 0x0000);                  // tie, down to even zero
  EXPECT_EQ(qspec::f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(qspec::f32_to_f16(3 * 0x1p-25f), 0x0002);              // tie, up to even
  EXPECT_EQ(qspec::f32_to_f16(-5 * 0x1p-25f), 0x8002);             // tie, down to even
  EXPECT_EQ(qspec::f32_to_f16(1023 * 0x1p-24f), 0x03ff);           // largest subnormal
  EXPECT_EQ(qspec::f32_to_f16(1023.5f * 0x1p-24f), 0x0400);        // tie into the normals
  EXPECT_EQ(qspec::f32_to_f16(0x1p-14f), 0x0400);                  // smallest normal
  EXPECT_EQ(qspec::f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(qspec::f32_to_f16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(qspec::f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(qspec::f16_to_f32(0x83ff), -1023 * 0x1p-24f);
  EXPECT_EQ(qspec::f16_to_f32(0x7bff), 65504.0f);
  // NaN stays NaN, sign kept, whatever the payload.
  EXPECT_TRUE(is_f16_nan(qspec::f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_f16_nan(qspec::f32_to_f16(float_of(0x7f800001))));
  EXPECT_EQ(qspec::f32_to_f16(float_of(0xff800001)) & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(qspec::f16_to_f32(0x7c01)));
  EXPECT_TRUE(std::isnan(qspec::f16_to_f32(0xfe00)));
  EXPECT_TRUE(std::signbit(qspec::f16_to_f32(0xfe00)));
  EXPECT_TRUE(std::isinf(qspec::f16_to_f32(0x7c00)));
}
