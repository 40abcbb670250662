// Quantized number formats (see formats.h for the rules). Every block format is one "codec"
// (block scale from an amax, element encode/decode, scale storage); one templated block loop
// serves plain rows, fake quantization and ARC-augmented rows, so they cannot drift apart.

#include "base/exact_f32.h"  // first: no FMA contraction in this file (see there)

#include "quant/formats.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "base/dtype.h"
#include "qspec/error.h"

namespace qspec::quant {

namespace {

uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }
float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

// 2^exponent for exponent in [-149, 127], built exactly (subnormal below -126).
float exact_power_of_two(int exponent) {
  if (exponent >= -126) return float_of(static_cast<uint32_t>(exponent + 127) << 23);
  return float_of(1u << (exponent + 149));
}

// ---- scalar codecs, inline for the block loops ----

constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline uint8_t encode_e2m1(float value) {
  if (std::isnan(value)) fail("E2M1 has no NaN: refusing to encode NaN");
  uint8_t sign = std::signbit(value) ? 0x8 : 0x0;
  float magnitude = std::fabs(value);
  // Thresholds are the midpoints between neighbours; at a midpoint the even code (mantissa
  // bit 0) wins, so "<=" keeps ties on even codes and "<" sends them up to the even code.
  uint8_t code;
  // clang-format off
  if (magnitude <= 0.25f) code = 0;
  else if (magnitude < 0.75f) code = 1;
  else if (magnitude <= 1.25f) code = 2;
  else if (magnitude < 1.75f) code = 3;
  else if (magnitude <= 2.5f) code = 4;
  else if (magnitude < 3.5f) code = 5;
  else if (magnitude <= 5.0f) code = 6;
  else code = 7;  // (5, inf]: 6 and saturation
  // clang-format on
  return sign | code;
}

inline float decode_e2m1(uint8_t code) {
  float magnitude = kE2M1Values[code & 0x7];
  return (code & 0x8) ? -magnitude : magnitude;
}

inline uint8_t encode_e4m3(float value) {
  uint32_t bits = bits_of(value);
  auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7f;   // NaN stays NaN
  if (magnitude >= 0x43e00000u) return sign | 0x7e;  // >= 448, infinity included: saturate
  if (magnitude < 0x3c800000u) {
    // Below 2^-6: the subnormal grid of 2^-9. Scaling by 2^9 is exact; nearbyint rounds half
    // to even; 8 units is 2^-6, whose code 0x08 is exactly the smallest normal.
    return sign | static_cast<uint8_t>(std::nearbyint(std::fabs(value) * 512.0f));
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding half to even (a carry moves into the
  // exponent, which is right), then rebias the exponent from 127 to 7.
  uint32_t rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(rounded - (120u << 3));
}

inline float decode_e4m3(uint8_t code) {
  uint32_t exponent = (code >> 3) & 0xfu;
  uint32_t mantissa = code & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);
  } else {
    magnitude = float_of(((exponent + 120u) << 23) | (mantissa << 20));
  }
  return (code & 0x80) ? -magnitude : magnitude;
}

inline float decode_e8m0(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return exact_power_of_two(static_cast<int>(code) - 127);
}

inline uint8_t signed_zero_code(float value, uint8_t negative_zero) {
  return std::signbit(value) ? negative_zero : 0;
}

template <typename T>
void store_le(uint8_t* destination, T value) {
  std::memcpy(destination, &value, sizeof value);  // qspec runs on little-endian hosts only
}

template <typename T>
T load_le(const uint8_t* source) {
  T value;
  std::memcpy(&value, source, sizeof value);
  return value;
}

float checked_scale(float value, Format format, int64_t block) {
  if (!std::isfinite(value))
    fail(format_name(format), " scale of block ", block, " is not finite (corrupt scales)");
  return value;
}

// ---- codecs: one per format ----
// Each has Block (a block's scale as stored and as used), from_amax, encode (the element's
// 4- or 8-bit code), decode, store and load.

// Symmetric integer codes with a per-block scale: int4 groups / per row, int8 per token.
struct IntegerCodec {
  Format format;
  int min_code;
  int max_code;
  float divisor_of_amax;  // 7 or 127
  bool f16_scale;         // int4 weights store f16 scales; everything else f32

  struct Block {
    float scale;
  };

  Block from_amax(float amax) const {
    float scale = amax / divisor_of_amax;
    if (!f16_scale) return {scale};
    uint16_t half = f32_to_f16(scale);
    if ((half & 0x7c00u) == 0x7c00u)
      fail(format_name(format), " weight scale amax/7 = ", scale,
           " exceeds the f16 range (weights up to 7 * 65504 in magnitude are supported)");
    return {f16_to_f32(half)};
  }
  uint8_t encode(float x, const Block& block) const {
    if (block.scale == 0.0f) return 0;
    float rounded = std::nearbyint(x / block.scale);  // ties to even
    rounded = std::clamp(rounded, static_cast<float>(min_code), static_cast<float>(max_code));
    return static_cast<uint8_t>(static_cast<int>(rounded)) & (max_code == 7 ? 0x0f : 0xff);
  }
  float decode(uint8_t code, const Block& block) const {
    int value = max_code == 7 ? (code >= 8 ? code - 16 : code) : static_cast<int8_t>(code);
    return static_cast<float>(value) * block.scale;
  }
  void store(uint8_t* scales, int64_t index, const Block& block) const {
    if (f16_scale)
      store_le(scales + 2 * index, f32_to_f16(block.scale));
    else
      store_le(scales + 4 * index, block.scale);
  }
  Block load(const uint8_t* scales, int64_t index) const {
    float scale = f16_scale ? f16_to_f32(load_le<uint16_t>(scales + 2 * index))
                            : load_le<float>(scales + 4 * index);
    return {checked_scale(scale, format, index)};
  }
};

// int4-asym weights: unsigned codes 0..15, value = fma(code, scale, min), f32 scale and min.
// Blocks come from the group's range (from_range), not from an amax.
struct AsymCodec {
  struct Block {
    float scale;
    float min;
  };
  Block from_range(float lo, float hi) const {
    const float scale = (hi - lo) / static_cast<float>(kInt4AsymMaxCode);
    if (!std::isfinite(scale))
      fail("int4-asym: group range [", lo, ", ", hi, "] overflows f32 (scale (hi - lo) / 15 is ", scale, ")");
    return {scale, lo};
  }
  uint8_t encode(float x, const Block& block) const {
    if (block.scale == 0.0f) return 0;
    float rounded = std::nearbyint((x - block.min) / block.scale);  // ties to even
    rounded = std::clamp(rounded, 0.0f, static_cast<float>(kInt4AsymMaxCode));
    return static_cast<uint8_t>(rounded);
  }
  float decode(uint8_t code, const Block& block) const {
    return std::fma(static_cast<float>(code & 0xf), block.scale, block.min);  // one rounding (formats.h)
  }
  void store(uint8_t* scales, int64_t index, const Block& block) const {
    store_le(scales + kInt4AsymScaleBytes * index, block.scale);
    store_le(scales + kInt4AsymScaleBytes * index + 4, block.min);
  }
  Block load(const uint8_t* scales, int64_t index) const {
    const float scale = checked_scale(load_le<float>(scales + kInt4AsymScaleBytes * index), Format::int4_asym, index);
    const float min = load_le<float>(scales + kInt4AsymScaleBytes * index + 4);
    if (!std::isfinite(min)) fail("int4-asym minimum of block ", index, " is not finite (corrupt scales)");
    return {scale, min};
  }
};

// int4-zp weights: unsigned codes 0..15, value = scale * (code - zero), an f16-valued scale and an
// integer zero point; stored as AsymCodec's (scale, minimum = -scale * zero) pair, both exact.
struct ZpCodec {
  struct Block {
    float scale;
    int zero;
  };
  // The grid over [min(lo, 0), max(hi, 0)]: zero lies on it, so an all-positive or all-negative
  // group keeps a code for 0 (as GPTQ's and AWQ's asymmetric grids do).
  Block from_range(float lo, float hi) const {
    lo = std::min(lo, 0.0f);
    hi = std::max(hi, 0.0f);
    const float range = (hi - lo) / static_cast<float>(kInt4AsymMaxCode);
    const uint16_t half = f32_to_f16(range);
    if (!std::isfinite(range) || (half & 0x7c00u) == 0x7c00u)
      fail("int4-zp: group range [", lo, ", ", hi, "] needs a scale (hi - lo) / 15 = ", range,
           " beyond the f16 range");
    const float scale = f16_to_f32(half);
    if (scale == 0.0f) return {0.0f, 0};
    const float zero = std::clamp(std::nearbyint(-lo / scale), 0.0f, static_cast<float>(kInt4AsymMaxCode));
    return {scale, static_cast<int>(zero)};
  }
  uint8_t encode(float x, const Block& block) const {
    if (block.scale == 0.0f) return static_cast<uint8_t>(block.zero);
    float rounded = std::nearbyint(x / block.scale) + static_cast<float>(block.zero);  // ties to even
    rounded = std::clamp(rounded, 0.0f, static_cast<float>(kInt4AsymMaxCode));
    return static_cast<uint8_t>(rounded);
  }
  float decode(uint8_t code, const Block& block) const {
    return block.scale * static_cast<float>(static_cast<int>(code & 0xf) - block.zero);  // exact
  }
  void store(uint8_t* scales, int64_t index, const Block& block) const {
    store_le(scales + kInt4AsymScaleBytes * index, block.scale);
    store_le(scales + kInt4AsymScaleBytes * index + 4, block.zero == 0 ? 0.0f : -block.scale * static_cast<float>(block.zero));
  }
  // Refuses a pair that is not this format's: a scale that is no finite, non-negative f16 value,
  // or a minimum that is not -scale times an integer 0..15.
  Block load(const uint8_t* scales, int64_t index) const {
    const float scale = checked_scale(load_le<float>(scales + kInt4AsymScaleBytes * index), Format::int4_zp, index);
    const float min = load_le<float>(scales + kInt4AsymScaleBytes * index + 4);
    if (!(scale >= 0.0f) || f16_to_f32(f32_to_f16(scale)) != scale)
      fail("int4-zp scale of block ", index, " is ", scale, ", not a non-negative f16 value (corrupt scales)");
    const float zero = scale == 0.0f ? 0.0f : -min / scale;
    if (!(zero >= 0.0f && zero <= static_cast<float>(kInt4AsymMaxCode)) || std::nearbyint(zero) != zero ||
        (scale == 0.0f && min != 0.0f))
      fail("int4-zp minimum of block ", index, " is ", min, ", not -scale x an integer zero point 0..15 (scale ",
           scale, "; corrupt scales)");
    return {scale, static_cast<int>(zero)};
  }
};

// fp8 activations: E4M3 elements under one f32 scale amax / 448.
struct Fp8Codec {
  struct Block {
    float scale;
  };
  Block from_amax(float amax) const { return {amax / 448.0f}; }
  uint8_t encode(float x, const Block& block) const {
    if (block.scale == 0.0f) return signed_zero_code(x, 0x80);
    return encode_e4m3(x / block.scale);
  }
  float decode(uint8_t code, const Block& block) const { return decode_e4m3(code) * block.scale; }
  void store(uint8_t* scales, int64_t index, const Block& block) const {
    store_le(scales + 4 * index, block.scale);
  }
  Block load(const uint8_t* scales, int64_t index) const {
    return {checked_scale(load_le<float>(scales + 4 * index), Format::fp8, index)};
  }
};

// NVFP4: E2M1 elements, E4M3 block scale, FP32 tensor scale (per matrix or per token).
struct Nvfp4Codec {
  float tensor_scale;

  struct Block {
    uint8_t code;   // E4M3 block scale
    float value;    // its value
    float divisor;  // value * tensor_scale: what elements are divided by
  };

  Block from_amax(float amax) const {
    if (tensor_scale == 0.0f) {
      if (amax != 0.0f)
        fail("nvfp4: the tensor scale is 0 but a block has amax ", amax,
             "; set RowFormat::tensor_scale = nvfp4_tensor_scale(amax of the whole matrix)");
      return {0, 0.0f, 0.0f};
    }
    float target = amax / (6.0f * tensor_scale);
    // A scale computed from the matrix amax gives at most 448 plus a few ulps.
    if (target > 449.0f)
      fail("nvfp4: block amax ", amax, " is too large for the tensor scale ", tensor_scale,
           " (at most 2688 * tensor scale); compute the tensor scale from the whole matrix");
    uint8_t code = encode_e4m3(target);
    float value = decode_e4m3(code);
    return {code, value, value * tensor_scale};
  }
  uint8_t encode(float x, const Block& block) const {
    if (block.divisor == 0.0f) return signed_zero_code(x, 0x8);
    return encode_e2m1(x / block.divisor);
  }
  float decode(uint8_t code, const Block& block) const {
    return (decode_e2m1(code) * block.value) * tensor_scale;  // inner product exact
  }
  void store(uint8_t* scales, int64_t index, const Block& block) const {
    scales[index] = block.code;
  }
  Block load(const uint8_t* scales, int64_t index) const {
    float value = checked_scale(decode_e4m3(scales[index]), Format::nvfp4, index);
    return {scales[index], value, value * tensor_scale};
  }
};

// MXFP4: E2M1 elements, E8M0 shared scale.
struct Mxfp4Codec {
  struct Block {
    uint8_t code;      // E8M0
    float value;       // 2^e
    float multiplier;  // 2^-e: exact, so x * 2^-e == x / 2^e
  };
  static Block from_code(uint8_t code) {
    int exponent = static_cast<int>(code) - 127;
    return {code, exact_power_of_two(exponent), exact_power_of_two(-exponent)};
  }
  Block from_amax(float amax) const { return from_code(e8m0_shared_scale(amax, 2)); }
  uint8_t encode(float x, const Block& block) const { return encode_e2m1(x * block.multiplier); }
  float decode(uint8_t code, const Block& block) const { return decode_e2m1(code) * block.value; }
  void store(uint8_t* scales, int64_t index, const Block& block) const {
    scales[index] = block.code;
  }
  Block load(const uint8_t* scales, int64_t index) const {
    if (scales[index] == 0xff) fail("mxfp4 scale of block ", index, " is NaN (corrupt scales)");
    return from_code(scales[index]);
  }
};

bool is_four_bit(Format format) {
  return format != Format::int8 && format != Format::fp8 && format != Format::int8_group;
}

// Calls fn with the codec of `format`; nvfp4 uses `nvfp4_scale` as its tensor scale.
template <typename Fn>
void with_codec(const RowFormat& format, float nvfp4_scale, Fn&& fn) {
  switch (format.format) {
    case Format::int4:
    case Format::int4_channel:
      fn(IntegerCodec{format.format, -8, 7, 7.0f, format.role == Role::weight});
      return;
    case Format::int8:
    case Format::int8_group:
      fn(IntegerCodec{format.format, -127, 127, 127.0f, false});
      return;
    case Format::fp8:
      fn(Fp8Codec{});
      return;
    case Format::nvfp4:
      fn(Nvfp4Codec{nvfp4_scale});
      return;
    case Format::mxfp4:
      fn(Mxfp4Codec{});
      return;
    case Format::int4_asym:
      fn(AsymCodec{});
      return;
    case Format::int4_zp:
      fn(ZpCodec{});
      return;
  }
  fail("unknown quantization format ", static_cast<int>(format.format));
}

// The squared error of a block's values on the grid of `block`.
template <typename Codec, typename Values>
double block_squared_error(const Codec& codec, const typename Codec::Block& block, int64_t count, Values& values) {
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double error = static_cast<double>(values(i)) - codec.decode(codec.encode(values(i), block), block);
    sum += error * error;
  }
  return sum;
}

// The range searches' candidate grids: step `step` (0 .. kRangeFitSteps) divides [lo, hi] into
// 14 + 0.1 step steps, which give each value a code 0..15, and the codes their least-squares
// (scale, minimum). False where the codes are all one (no fit).
constexpr int kRangeFitSteps = 20;
template <typename Values>
bool least_squares_grid(int64_t count, Values& values, float lo, float hi, int step, double& scale, double& minimum) {
  const double inverse = (14.0 + 0.1 * step) / (static_cast<double>(hi) - lo);
  double n = 0, sum_l = 0, sum_ll = 0, sum_x = 0, sum_lx = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = values(i);
    const double l = std::clamp(std::nearbyint((x - lo) * inverse), 0.0, static_cast<double>(kInt4AsymMaxCode));
    n += 1;
    sum_l += l;
    sum_ll += l * l;
    sum_x += x;
    sum_lx += l * x;
  }
  const double determinant = n * sum_ll - sum_l * sum_l;
  if (!(determinant > 0)) return false;
  scale = (n * sum_lx - sum_l * sum_x) / determinant;
  minimum = (sum_ll * sum_x - sum_l * sum_lx) / determinant;
  return true;
}

// BlockFit::mse for int4-asym: step counts 14.0, 14.1, ..., 16.0 over the range [lo, hi] give
// codes, and each set of codes its least-squares (scale, minimum); the candidate with the least
// squared error wins, the range's own grid (`best`) unless one beats it.
template <typename Values>
AsymCodec::Block searched_range_block(const AsymCodec& codec, int64_t count, Values& values, float lo, float hi,
                                     AsymCodec::Block best) {
  if (!(hi > lo)) return best;
  double best_error = block_squared_error(codec, best, count, values);
  for (int step = 0; step <= kRangeFitSteps; ++step) {
    double scale, minimum;
    if (!least_squares_grid(count, values, lo, hi, step, scale, minimum)) continue;
    const AsymCodec::Block candidate{static_cast<float>(scale), static_cast<float>(minimum)};
    if (!(candidate.scale > 0.0f) || !std::isfinite(candidate.scale) || !std::isfinite(candidate.min)) continue;
    const double error = block_squared_error(codec, candidate, count, values);
    if (error < best_error) {
      best_error = error;
      best = candidate;
    }
  }
  return best;
}

// BlockFit::mse for int4-zp: the int4-asym search's step counts over the range (widened to hold 0)
// give codes and each set of codes its least-squares (scale, minimum); the zero point is then the
// nearest integer to -minimum / scale, and the scale the least-squares one for the codes that grid
// gives, rounded to f16. The candidate with the least squared error wins, the range's own grid
// (`best`) unless one beats it.
template <typename Values>
ZpCodec::Block searched_range_block(const ZpCodec& codec, int64_t count, Values& values, float lo, float hi,
                                 ZpCodec::Block best) {
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  if (!(hi > lo) || !(best.scale > 0.0f)) return best;
  double best_error = block_squared_error(codec, best, count, values);
  auto consider = [&](const ZpCodec::Block& candidate) {
    if (!(candidate.scale > 0.0f) || !std::isfinite(candidate.scale)) return;
    const double error = block_squared_error(codec, candidate, count, values);
    if (error < best_error) {
      best_error = error;
      best = candidate;
    }
  };
  auto f16_scale = [](double scale) {
    const uint16_t half = f32_to_f16(static_cast<float>(scale));
    return (half & 0x7c00u) == 0x7c00u ? 0.0f : f16_to_f32(half);
  };
  for (int step = 0; step <= kRangeFitSteps; ++step) {
    double scale, minimum;
    if (!least_squares_grid(count, values, lo, hi, step, scale, minimum)) continue;
    if (!(scale > 0) || !std::isfinite(scale) || !std::isfinite(minimum)) continue;
    ZpCodec::Block candidate{f16_scale(scale),
                             static_cast<int>(std::clamp(std::nearbyint(-minimum / scale), 0.0,
                                                         static_cast<double>(kInt4AsymMaxCode)))};
    if (!(candidate.scale > 0.0f)) continue;
    consider(candidate);
    // The scale refit to the codes this grid gives, its zero point kept.
    double sum_cc = 0, sum_cx = 0;
    for (int64_t i = 0; i < count; ++i) {
      const double c = static_cast<double>(codec.encode(values(i), candidate)) - candidate.zero;
      sum_cc += c * c;
      sum_cx += c * values(i);
    }
    if (sum_cc > 0) consider({f16_scale(sum_cx / sum_cc), candidate.zero});
  }
  return best;
}

// A block's scale from its `count` values: from the range for int4-asym / int4-zp, else from the amax;
// BlockFit::mse searches clipped grids of the 4-bit integer formats (formats.h).
template <typename Codec, typename Values>
typename Codec::Block block_from_values(const Codec& codec, int64_t count, Values&& values,
                                        BlockFit fit = BlockFit::range) {
  if constexpr (std::is_same_v<Codec, AsymCodec> || std::is_same_v<Codec, ZpCodec>) {
    float lo = values(0), hi = values(0);
    for (int64_t i = 1; i < count; ++i) {
      lo = std::min(lo, values(i));
      hi = std::max(hi, values(i));
    }
    const typename Codec::Block range = codec.from_range(lo, hi);
    return fit == BlockFit::mse ? searched_range_block(codec, count, values, lo, hi, range) : range;
  } else {
    float amax = 0.0f;
    for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(values(i)));
    typename Codec::Block best = codec.from_amax(amax);
    if constexpr (std::is_same_v<Codec, IntegerCodec>) {
      if (fit == BlockFit::mse && codec.max_code == 7 && amax > 0.0f) {
        double best_error = block_squared_error(codec, best, count, values);
        for (int shrink = 1; shrink <= 20; ++shrink) {
          const typename Codec::Block candidate = codec.from_amax(amax * (1.0f - 0.02f * static_cast<float>(shrink)));
          const double error = block_squared_error(codec, candidate, count, values);
          if (error < best_error) {
            best_error = error;
            best = candidate;
          }
        }
      }
    }
    return best;
  }
}

// Where augmented block p comes from: a block of x, as itself or as its residual.
struct BlockSource {
  int64_t block;
  bool residual;
};

// Block-level geometry of an augmented row; a plain row is the case outlier_blocks == 0.
struct BlockPlan {
  int64_t input_blocks;    // k / block
  int64_t outlier_blocks;  // S / block
  ArcLayout layout;

  int64_t augmented_blocks() const { return input_blocks + outlier_blocks; }
  BlockSource source(int64_t position) const {
    int64_t plain = input_blocks - outlier_blocks;
    if (layout == ArcLayout::concatenated) {
      if (position < input_blocks) return {position, false};
      return {plain + (position - input_blocks), true};
    }
    if (position < plain) return {position, false};
    int64_t offset = position - plain;
    return {plain + offset / 2, offset % 2 == 1};
  }
};

float block_abs_max(const float* x, int64_t count) {
  float amax = 0.0f;
  for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// Writes packed codes and block scales.
struct PackSink {
  uint8_t* codes;
  uint8_t* scales;
  int64_t block;
  bool four_bit;

  template <typename Codec, typename Values>
  void put(int64_t position, const Codec& codec, const typename Codec::Block& scale,
           Values&& values) {
    codec.store(scales, position, scale);
    if (four_bit) {
      uint8_t* out = codes + position * block / 2;
      for (int64_t i = 0; i < block; i += 2) {
        out[i / 2] = static_cast<uint8_t>(codec.encode(values(i), scale) |
                                          (codec.encode(values(i + 1), scale) << 4));
      }
    } else {
      uint8_t* out = codes + position * block;
      for (int64_t i = 0; i < block; ++i) out[i] = codec.encode(values(i), scale);
    }
  }
};

// Writes dequantized values. values(i) is read before out[i] is written, so in place is fine.
struct DequantSink {
  float* out;
  int64_t block;

  template <typename Codec, typename Values>
  void put(int64_t position, const Codec& codec, const typename Codec::Block& scale,
           Values&& values) {
    float* destination = out + position * block;
    for (int64_t i = 0; i < block; ++i)
      destination[i] = codec.decode(codec.encode(values(i), scale), scale);
  }
};

// The one block loop: every augmented block is quantized from its source block of x, either
// directly or as the residual of that block's own quantization.
template <typename Codec, typename Sink>
void quantize_blocks(const Codec& codec, const BlockPlan& plan, int64_t block, const float* x,
                     Sink& sink, BlockFit fit = BlockFit::range) {
  for (int64_t position = 0; position < plan.augmented_blocks(); ++position) {
    BlockSource source = plan.source(position);
    const float* input = x + source.block * block;
    auto primary = block_from_values(codec, block, [input](int64_t i) { return input[i]; }, fit);
    if (!source.residual) {
      sink.put(position, codec, primary, [input](int64_t i) { return input[i]; });
      continue;
    }
    // Recomputed rather than buffered: the residual is a pure function of x and the primary
    // scale, and this keeps the per-row functions free of allocations.
    auto residual = [&codec, &primary, input](int64_t i) {
      return input[i] - codec.decode(codec.encode(input[i], primary), primary);
    };
    sink.put(position, codec, block_from_values(codec, block, residual, fit), residual);
  }
}

float checked_abs_max(const RowFormat& format, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(x[i]))
      fail(format_name(format.format), " quantizer: value ", i, " of the row (", count,
           " values) is ", x[i], "; refusing to quantize NaN or infinity");
  }
  return block_abs_max(x, count);
}

void check_tensor_scale(float tensor_scale) {
  if (!(std::isfinite(tensor_scale) && tensor_scale >= 0.0f))
    fail("nvfp4 tensor scale must be finite and >= 0, got ", tensor_scale);
}

// The nvfp4 tensor scale a row is quantized under: the matrix's for weights, the token's own
// (from its k input values) for activations.
float nvfp4_row_scale(const RowFormat& format, float row_amax) {
  if (format.format != Format::nvfp4) return 0.0f;
  if (format.role == Role::weight) {
    check_tensor_scale(format.tensor_scale);
    return format.tensor_scale;
  }
  return nvfp4_tensor_scale(row_amax);
}

int64_t nvfp4_token_scale_offset(const RowFormat& format) { return format.blocks(); }

// Shared by the plain and ARC entry points.
void quantize_planned(const RowFormat& format, const BlockPlan& plan, const float* x,
                      int64_t input_count, uint8_t* codes, uint8_t* scales, BlockFit fit = BlockFit::range) {
  float row_amax = checked_abs_max(format, x, input_count);
  float tensor_scale = nvfp4_row_scale(format, row_amax);
  with_codec(format, tensor_scale, [&](const auto& codec) {
    PackSink sink{codes, scales, format.block, is_four_bit(format.format)};
    quantize_blocks(codec, plan, format.block, x, sink, fit);
  });
  if (format.format == Format::nvfp4 && format.role == Role::activation)
    store_le(scales + nvfp4_token_scale_offset(format), tensor_scale);
}

void fake_quantize_planned(const RowFormat& format, const BlockPlan& plan, const float* x,
                           int64_t input_count, float* out) {
  float row_amax = checked_abs_max(format, x, input_count);
  float tensor_scale = nvfp4_row_scale(format, row_amax);
  with_codec(format, tensor_scale, [&](const auto& codec) {
    DequantSink sink{out, format.block};
    quantize_blocks(codec, plan, format.block, x, sink);
  });
}

struct FormatName {
  Format format;
  std::string_view name;
};
constexpr FormatName kFormatNames[] = {
    {Format::int4, "int4"},   {Format::int4_channel, "int4-channel"},
    {Format::nvfp4, "nvfp4"}, {Format::mxfp4, "mxfp4"},
    {Format::int8, "int8"},   {Format::fp8, "fp8"},
    {Format::int4_asym, "int4-asym"}, {Format::int4_zp, "int4-zp"},
    {Format::int8_group, "int8-group"},
};

}  // namespace

// ---- scalar codecs ----

uint8_t f32_to_e2m1(float value) { return encode_e2m1(value); }
float e2m1_to_f32(uint8_t code) { return decode_e2m1(code); }
uint8_t f32_to_e4m3(float value) { return encode_e4m3(value); }
float e4m3_to_f32(uint8_t code) { return decode_e4m3(code); }
float e8m0_to_f32(uint8_t code) { return decode_e8m0(code); }

uint8_t e8m0_shared_scale(float block_amax, int element_emax) {
  if (!(std::isfinite(block_amax) && block_amax >= 0.0f))
    fail("MX shared scale: block amax must be finite and >= 0, got ", block_amax);
  if (block_amax == 0.0f) return 0;
  // ilogb is floor(log2) exactly, subnormals included.
  int exponent = std::ilogb(block_amax) - element_emax;
  return static_cast<uint8_t>(std::clamp(exponent, -127, 127) + 127);
}

// ---- formats ----

Format parse_format(std::string_view name) {
  for (const auto& entry : kFormatNames)
    if (entry.name == name) return entry.format;
  fail("unknown quantization format '", name,
       "' (known: int4, int4-channel, int4-asym, int4-zp, int8-group, nvfp4, mxfp4, int8, fp8)");
}

std::string weight_format_names(std::string_view separator) {
  // Users' order: the symmetric default first, then its variants, then the FP4 formats.
  std::string names;
  for (Format format : {Format::int4, Format::int4_asym, Format::int4_zp, Format::int4_channel, Format::int8_group,
                        Format::nvfp4, Format::mxfp4}) {
    if (!names.empty()) names += separator;
    names += format_name(format);
  }
  return names;
}

std::string_view format_name(Format format) {
  for (const auto& entry : kFormatNames)
    if (entry.format == format) return entry.name;
  return "?";
}

bool format_supports(Format format, Role role) {
  switch (format) {
    case Format::int4:
    case Format::nvfp4:
    case Format::mxfp4:
      return true;
    case Format::int4_channel:
    case Format::int4_asym:
    case Format::int4_zp:
    case Format::int8_group:
      return role == Role::weight;
    case Format::int8:
    case Format::fp8:
      return role == Role::activation;
  }
  return false;
}

bool format_has_groups(Format format) {
  return format == Format::int4 || format == Format::int4_asym || format == Format::int4_zp ||
         format == Format::int8_group;
}

bool format_has_min(Format format) { return format == Format::int4_asym || format == Format::int4_zp; }

int64_t block_size(Format format, int64_t k, int64_t group_size) {
  switch (format) {
    case Format::int4:
    case Format::int4_asym:
    case Format::int4_zp:
    case Format::int8_group:
      return group_size;
    case Format::nvfp4:
      return 16;
    case Format::mxfp4:
      return 32;
    case Format::int4_channel:
    case Format::int8:
    case Format::fp8:
      return k;
  }
  return k;
}

int64_t RowFormat::code_bytes() const { return is_four_bit(format) ? k / 2 : k; }

int64_t RowFormat::scale_bytes() const {
  switch (format) {
    case Format::int4:
    case Format::int4_channel:
      return blocks() * (role == Role::weight ? 2 : 4);
    case Format::int4_asym:
    case Format::int4_zp:
      return blocks() * kInt4AsymScaleBytes;
    case Format::nvfp4:
      return blocks() + (role == Role::activation ? 4 : 0);
    case Format::mxfp4:
      return blocks();
    case Format::int8_group:
      return blocks() * 4;
    case Format::int8:
    case Format::fp8:
      return 4;
  }
  return 0;
}

RowFormat make_row_format(Format format, Role role, int64_t k, int64_t group_size) {
  std::string_view name = format_name(format);
  if (!format_supports(format, role)) {
    if (role == Role::weight)
      fail(name, " is an activation format; weights use ", weight_format_names(", "));
    fail(name, " is a weight format; activations use int4, nvfp4, mxfp4, int8 or fp8");
  }
  QSPEC_CHECK(k > 0, name, ": a row needs at least one value, got K=", k);
  if (format_has_groups(format))
    QSPEC_CHECK(group_size > 0 && group_size % 2 == 0, name,
                " group size must be positive and even"
                " (two codes per byte), got ",
                group_size);
  int64_t block = block_size(format, k, group_size);
  if (k % block != 0)
    fail(name, ": K=", k, " is not a multiple of the block of ", block,
         " values; qspec supports only layer shapes whose K is a multiple of the format's"
         " block (every supported model's are)");
  if (is_four_bit(format) && k % 2 != 0)
    fail(name, ": K=", k, " is odd; 4-bit codes are packed two per byte and need an even K");
  return RowFormat{format, role, k, block};
}

float abs_max(const float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(values[i]))
      fail("value ", i, " of ", count, " is ", values[i], "; expected finite values");
  return block_abs_max(values, count);
}

float nvfp4_tensor_scale(float amax) {
  if (!(std::isfinite(amax) && amax >= 0.0f))
    fail("nvfp4 tensor scale: amax must be finite and >= 0, got ", amax);
  return amax / (448.0f * 6.0f);
}

std::string_view block_fit_name(BlockFit fit) { return fit == BlockFit::mse ? "mse" : "range"; }

BlockFit parse_block_fit(std::string_view name) {
  if (name == "range") return BlockFit::range;
  if (name == "mse") return BlockFit::mse;
  fail("unknown block fit '", name, "' (known: range, mse)");
}

void quantize_row(const RowFormat& format, const float* x, uint8_t* codes, uint8_t* scales, BlockFit fit) {
  quantize_planned(format, BlockPlan{format.blocks(), 0, ArcLayout::concatenated}, x, format.k,
                   codes, scales, fit);
}

void fake_quantize_row(const RowFormat& format, float* x) {
  fake_quantize_planned(format, BlockPlan{format.blocks(), 0, ArcLayout::concatenated}, x, format.k,
                        x);
}

float row_tensor_scale(const RowFormat& format, const uint8_t* scales) {
  if (format.format != Format::nvfp4) return 1.0f;
  if (format.role == Role::weight) return format.tensor_scale;
  return load_le<float>(scales + nvfp4_token_scale_offset(format));
}

void dequantize_row(const RowFormat& format, const uint8_t* codes, const uint8_t* scales,
                    float* out) {
  float tensor_scale = 0.0f;
  if (format.format == Format::nvfp4) {
    tensor_scale = row_tensor_scale(format, scales);
    check_tensor_scale(tensor_scale);
  }
  bool four_bit = is_four_bit(format.format);
  with_codec(format, tensor_scale, [&](const auto& codec) {
    for (int64_t b = 0; b < format.blocks(); ++b) {
      auto scale = codec.load(scales, b);
      for (int64_t i = b * format.block; i < (b + 1) * format.block; ++i) {
        uint8_t code =
            four_bit ? static_cast<uint8_t>((codes[i / 2] >> (4 * (i % 2))) & 0xf) : codes[i];
        out[i] = codec.decode(code, scale);
      }
    }
  });
}

float element_value(const RowFormat& format, const uint8_t* codes, int64_t index) {
  switch (format.format) {
    case Format::int4:
    case Format::int4_channel: {
      int nibble = (codes[index / 2] >> (4 * (index % 2))) & 0xf;
      return static_cast<float>(nibble >= 8 ? nibble - 16 : nibble);
    }
    case Format::int4_asym:
    case Format::int4_zp:
      return static_cast<float>((codes[index / 2] >> (4 * (index % 2))) & 0xf);
    case Format::nvfp4:
    case Format::mxfp4:
      return decode_e2m1(static_cast<uint8_t>(codes[index / 2] >> (4 * (index % 2))));
    case Format::int8:
    case Format::int8_group:
      return static_cast<float>(static_cast<int8_t>(codes[index]));
    case Format::fp8:
      return decode_e4m3(codes[index]);
  }
  return 0.0f;
}

float block_scale(const RowFormat& format, const uint8_t* scales, int64_t block) {
  float value = 0.0f;
  with_codec(format, 0.0f, [&](const auto& codec) {
    using Codec = std::decay_t<decltype(codec)>;
    if constexpr (std::is_same_v<Codec, IntegerCodec> || std::is_same_v<Codec, Fp8Codec> ||
                  std::is_same_v<Codec, AsymCodec> || std::is_same_v<Codec, ZpCodec>) {
      value = codec.load(scales, block).scale;
    } else {
      value = codec.load(scales, block).value;
    }
  });
  return value;
}

float block_min(const RowFormat& format, const uint8_t* scales, int64_t block) {
  if (!format_has_min(format.format)) return 0.0f;
  if (format.format == Format::int4_zp) ZpCodec{}.load(scales, block);  // checks the pair is int4-zp's
  return AsymCodec{}.load(scales, block).min;
}

int block_zero_point(const RowFormat& format, const uint8_t* scales, int64_t block) {
  QSPEC_CHECK(format.format == Format::int4_zp, "block_zero_point: ", format_name(format.format),
              " has no integer zero point (int4-zp only)");
  return ZpCodec{}.load(scales, block).zero;
}

void store_asym_block(const RowFormat& format, uint8_t* scales, int64_t block, float scale, float min) {
  QSPEC_CHECK(format.format == Format::int4_asym, "store_asym_block: ", format_name(format.format),
              " has no minimum (int4-asym only)");
  QSPEC_CHECK(block >= 0 && block < format.blocks(), "store_asym_block: block ", block, " of ", format.blocks());
  QSPEC_CHECK(std::isfinite(scale) && std::isfinite(min), "int4-asym block ", block, ": scale ", scale,
              " and minimum ", min, " must be finite");
  AsymCodec{}.store(scales, block, {scale, min});
}

void store_block_scale(const RowFormat& format, uint8_t* scales, int64_t block, float scale) {
  QSPEC_CHECK(format.format == Format::int8_group, "store_block_scale: ", format_name(format.format),
              " (int8-group only)");
  QSPEC_CHECK(block >= 0 && block < format.blocks(), "store_block_scale: block ", block, " of ", format.blocks());
  QSPEC_CHECK(std::isfinite(scale), "int8-group block ", block, ": scale ", scale, " must be finite");
  store_le(scales + 4 * block, scale);
}

void quantize_block_scale(const RowFormat& format, const float* values, int64_t block,
                          uint8_t* scales, BlockFit fit) {
  float amax = checked_abs_max(format, values, format.block);
  if (format.format == Format::int4_asym) {
    AsymCodec codec;
    codec.store(scales, block, block_from_values(codec, format.block, [values](int64_t i) { return values[i]; }, fit));
    return;
  }
  if (format.format == Format::int4_zp) {
    ZpCodec codec;
    codec.store(scales, block, block_from_values(codec, format.block, [values](int64_t i) { return values[i]; }, fit));
    return;
  }
  if (fit == BlockFit::mse && (format.format == Format::int4 || format.format == Format::int4_channel)) {
    with_codec(format, 0.0f, [&](const auto& codec) {
      if constexpr (std::is_same_v<std::decay_t<decltype(codec)>, IntegerCodec>)
        codec.store(scales, block, block_from_values(codec, format.block, [values](int64_t i) { return values[i]; }, fit));
    });
    return;
  }
  float tensor_scale = 0.0f;
  if (format.format == Format::nvfp4) {
    tensor_scale = row_tensor_scale(format, scales);
    check_tensor_scale(tensor_scale);
    // 2688 * t / (6 * t) lands within a few ulps of 448: encode_e4m3 saturates it to 448.
    if (tensor_scale > 0.0f) amax = std::min(amax, 2688.0f * tensor_scale);
  }
  with_codec(format, tensor_scale, [&](const auto& codec) {
    if constexpr (!std::is_same_v<std::decay_t<decltype(codec)>, AsymCodec> &&
                  !std::is_same_v<std::decay_t<decltype(codec)>, ZpCodec>)  // handled above
      codec.store(scales, block, codec.from_amax(amax));
  });
}

QuantizedElement quantize_element(const RowFormat& format, const uint8_t* scales, int64_t block,
                                  float x) {
  if (!std::isfinite(x))
    fail(format_name(format.format), " quantizer: value ", x, " in block ", block,
         "; refusing to quantize NaN or infinity");
  float tensor_scale = 0.0f;
  if (format.format == Format::nvfp4) {
    tensor_scale = row_tensor_scale(format, scales);
    check_tensor_scale(tensor_scale);
  }
  QuantizedElement out{0, 0.0f};
  with_codec(format, tensor_scale, [&](const auto& codec) {
    auto scale = codec.load(scales, block);
    out.code = codec.encode(x, scale);
    out.value = codec.decode(out.code, scale);
  });
  return out;
}

// ---- ARC ----

int64_t ArcRow::source_channel(int64_t j) const {
  int64_t block = augmented.block;
  BlockPlan plan{k / block, outliers / block, layout};
  return plan.source(j / block).block * block + j % block;
}

bool ArcRow::is_residual(int64_t j) const {
  int64_t block = augmented.block;
  BlockPlan plan{k / block, outliers / block, layout};
  return plan.source(j / block).residual;
}

ArcRow make_arc_row(Format format, int64_t k, int64_t outliers, ArcLayout layout,
                    int64_t group_size) {
  std::string_view name = format_name(format);
  if (format != Format::int4 && format != Format::nvfp4 && format != Format::mxfp4)
    fail("ARC residual channels need a 4-bit block activation format (int4, nvfp4, mxfp4), not ",
         name);
  RowFormat input = make_row_format(format, Role::activation, k, group_size);
  if (outliers < 0 || outliers > k || outliers % input.block != 0)
    fail("ARC with ", name, ": S=", outliers,
         " outlier channels must be a multiple of the block"
         " of ",
         input.block, " values and at most K=", k, " (round S up to the block)");
  RowFormat augmented = make_row_format(format, Role::activation, k + outliers, group_size);
  return ArcRow{augmented, k, outliers, layout};
}

void arc_quantize_row(const ArcRow& arc, const float* x, uint8_t* codes, uint8_t* scales) {
  int64_t block = arc.augmented.block;
  quantize_planned(arc.augmented, BlockPlan{arc.k / block, arc.outliers / block, arc.layout}, x,
                   arc.k, codes, scales);
}

void arc_fake_quantize_row(const ArcRow& arc, const float* x, float* out) {
  int64_t block = arc.augmented.block;
  fake_quantize_planned(arc.augmented, BlockPlan{arc.k / block, arc.outliers / block, arc.layout},
                        x, arc.k, out);
}

}  // namespace qspec::quant
