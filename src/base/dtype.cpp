#include "base/dtype.h"

#include <bit>
#include <cmath>

namespace qspec {

namespace {
struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::F64, "F64", 8},         {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E8M0, "F8_E8M0", 1}, {DType::I64, "I64", 8},         {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},         {DType::I8, "I8", 1},           {DType::U64, "U64", 8},
    {DType::U32, "U32", 4},         {DType::U16, "U16", 2},         {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry.size;
  return 0;
}

std::string_view dtype_name(DType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry.name;
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) {
      *out = entry.dtype;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // subnormal: value = mantissa * 2^-24
      out = std::bit_cast<uint32_t>(std::ldexp(static_cast<float>(mantissa), -24)) | sign;
    }
  } else if (exponent == 31) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(out);
}

uint16_t f32_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;           // rounds to >= 65520: inf
  if (magnitude < 0x38800000u) {                                 // below 2^-14: subnormal or zero
    float scaled = std::fabs(value) * 16777216.0f;                // units of 2^-24
    auto units = static_cast<uint32_t>(std::nearbyint(scaled));  // ties to even (default mode)
    return sign | static_cast<uint16_t>(units);
  }
  uint32_t rounding = 0xfffu + ((magnitude >> 13) & 1u);
  magnitude += rounding;
  return sign | static_cast<uint16_t>(((magnitude >> 13) - (112u << 10)) & 0xffffu);
}

}  // namespace qspec
