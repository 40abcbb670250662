// Element types of tensors in checkpoints and in memory, with scalar conversions.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace qspec {

// Every dtype the safetensors format defines (plus our own sub-byte formats later).
enum class DType : uint8_t {
  F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0,
  I64, I32, I16, I8, U64, U32, U16, U8, BOOL,
};

// Bytes per element.
size_t dtype_size(DType dtype);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors spelling; returns false when unknown.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Round to nearest even, NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);  // round to nearest even, saturates to inf

}  // namespace qspec
