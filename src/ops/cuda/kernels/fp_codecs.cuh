// Scalar codecs of quant/formats.h on the device, bit for bit the CPU's (formats.cpp): the same
// integer tricks and IEEE operations, never contracted or fast-math.
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

// floor(log2 |a|) of a nonzero finite f32, subnormals included (std::ilogb).
__device__ __forceinline__ int floor_log2(float a) {
  const uint32_t bits = __float_as_uint(a) & 0x7fffffffu;
  const int exponent = static_cast<int>(bits >> 23);
  if (exponent != 0) return exponent - 127;
  return -118 - __clz(bits);  // m x 2^-149: floor(log2 m) - 149 = 31 - clz(m) - 149
}

// 2^e exactly for e in [-149, 127] (subnormal below -126).
__device__ __forceinline__ float power_of_two(int e) {
  if (e >= -126) return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
  return __uint_as_float(1u << (e + 149));
}

// E2M1: nearest, ties to the even code, saturating; keeps the sign of zero. NaN is never passed
// (the quantizers check rows first).
__device__ __forceinline__ uint32_t e2m1_encode(float value) {
  const uint32_t sign = (__float_as_uint(value) >> 28) & 0x8u;
  const float m = fabsf(value);
  uint32_t code;
  if (m <= 0.25f) code = 0;
  else if (m < 0.75f) code = 1;
  else if (m <= 1.25f) code = 2;
  else if (m < 1.75f) code = 3;
  else if (m <= 2.5f) code = 4;
  else if (m < 3.5f) code = 5;
  else if (m <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

__device__ __forceinline__ float e2m1_decode(uint32_t code) {
  const uint32_t c = code & 7u;
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6: exponent and mantissa from the 3 bits (c >= 2: 2^((c >> 1) - 1) x (1 + (c & 1) / 2)).
  const float magnitude = c < 2 ? 0.5f * static_cast<float>(c)
                                : __uint_as_float(((static_cast<uint32_t>(c >> 1) + 126u) << 23) | ((c & 1u) << 22));
  return (code & 8u) ? -magnitude : magnitude;
}

// OCP E4M3FN, round to nearest even, saturating to 448 (formats.cpp encode_e4m3).
__device__ __forceinline__ uint32_t e4m3_encode(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7fu;
  if (magnitude >= 0x43e00000u) return sign | 0x7eu;
  if (magnitude < 0x3c800000u) return sign | static_cast<uint32_t>(rintf(__fmul_rn(fabsf(value), 512.0f)));
  const uint32_t rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
  return sign | (rounded - (120u << 3));
}

__device__ __forceinline__ float e4m3_decode(uint32_t code) {
  const uint32_t exponent = (code >> 3) & 0xfu, mantissa = code & 7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) magnitude = __uint_as_float(0x7fc00000u);
  else if (exponent == 0) magnitude = __fmul_rn(static_cast<float>(mantissa), 1.0f / 512.0f);
  else magnitude = __uint_as_float(((exponent + 120u) << 23) | (mantissa << 20));
  return (code & 0x80u) ? -magnitude : magnitude;
}

}  // namespace qspec::cuda::kernels
