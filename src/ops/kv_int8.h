// The number format of the 8-bit KV cache (`--kv-cache int8`, issue 50's diet 2), one rule for
// the CPU and the GPU so that their caches hold the same codes and the same scales:
//
// * one scale a (token, KV head) row of head_dim values: the row's largest |x| over 127, rounded
//   to f16 (kept as f16 in the cache; a row of zeros has scale 0 and codes 0);
// * a value's code: x / scale rounded to nearest even, clamped to [-127, 127] (int8);
// * the verify, and every mode that is not a 4-bit-view draft, reads code * scale;
// * a draft with the 4-bit view (`/k4`) reads only the code's high nibble, hi = code >> 4
//   (arithmetic shift, -8..7), as the middle of its 16 codes: (16 hi + 8) * scale. A backend stores
//   the high and low nibbles in separate planes so that such a draft reads half the code bytes.
//
// Layouts are each backend's own; only these functions fix the values. Both backends quantize the
// K row after RoPE (and the q/k norms) and the V row as they write them.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#if defined(__CUDACC__)
#define QSPEC_KV8_HD __host__ __device__
#else
#define QSPEC_KV8_HD
#endif

namespace qspec {

// What a KV cache stores: f16, each backend's full-precision rows (f32 on the CPU, f16 on the
// GPU), or int8, the format below. `--kv-cache f16|int8`; every mode of a run shares one cache.
enum class KvCacheFormat : uint8_t { f16, int8 };
// What a pass reads of an int8 cache: every bit (the verify, plain steps, full-view drafts) or the
// high nibbles only (a draft with the `/k4` diet). A full-precision cache has only the full view.
enum class KvView : uint8_t { full, high_nibble };

inline const char* kv_cache_format_name(KvCacheFormat format) {
  return format == KvCacheFormat::int8 ? "int8" : "f16";
}
inline std::optional<KvCacheFormat> parse_kv_cache_format(std::string_view text) {
  if (text == "f16") return KvCacheFormat::f16;
  if (text == "int8") return KvCacheFormat::int8;
  return std::nullopt;
}

}  // namespace qspec

namespace qspec::kv8 {

inline constexpr int kMaxCode = 127;

// The f32 value of the f16 the scale is stored as: amax / 127 rounded to f16 (round to nearest
// even, as a float -> half conversion does). Backends store the f16 bits of this value.
QSPEC_KV8_HD inline float row_scale_f32(float amax);

// x's code under `scale` (the value row_scale_f32 returned): rint(x / scale) clamped to +-127.
QSPEC_KV8_HD inline int8_t encode(float x, float scale) {
  if (scale == 0.0f) return 0;
  float q = rintf(x / scale);
  q = q > kMaxCode ? kMaxCode : (q < -kMaxCode ? -kMaxCode : q);
  return static_cast<int8_t>(q);
}

// What the verify (and every full-view mode) reads.
QSPEC_KV8_HD inline float decode(int8_t code, float scale) { return static_cast<float>(code) * scale; }

// The high nibble of a code, -8..7, and what a 4-bit-view draft reads.
QSPEC_KV8_HD inline int high_nibble(int8_t code) { return static_cast<int>(code) >> 4; }
QSPEC_KV8_HD inline int low_nibble(int8_t code) { return static_cast<int>(code) & 15; }
QSPEC_KV8_HD inline int8_t join_nibbles(int high, int low) { return static_cast<int8_t>(high * 16 + low); }
QSPEC_KV8_HD inline float decode_high(int8_t code, float scale) {
  return static_cast<float>(16 * high_nibble(code) + 8) * scale;
}

// Round-to-nearest-even f32 -> f16 -> f32 without a half type (host and device alike): the
// scales are positive and far from f16's overflow (|x| <= 65504 * 127 would be needed).
QSPEC_KV8_HD inline float round_to_f16(float x) {
  if (!(x > 0.0f)) return 0.0f;
  int exponent = 0;
  const float mantissa = frexpf(x, &exponent);  // x = mantissa * 2^exponent, mantissa in [0.5, 1)
  // f16 keeps 11 significant bits for normal values (exponent >= -13), fewer below.
  if (exponent < -24) return 0.0f;  // below half of f16's smallest subnormal, 2^-24
  const int bits = exponent >= -13 ? 11 : 11 - (-13 - exponent);  // subnormals keep fewer
  const float scaled = ldexpf(mantissa, bits);
  return ldexpf(rintf(scaled), exponent - bits);
}

QSPEC_KV8_HD inline float row_scale_f32(float amax) { return round_to_f16(amax / static_cast<float>(kMaxCode)); }

}  // namespace qspec::kv8
