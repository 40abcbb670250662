// Quantized number formats: the CPU reference that every CUDA quantizer must match bit for
// bit. Scalar codecs (E2M1, E4M3, E8M0), row quantizers for each weight / activation format,
// and ARCQuant's augmented residual channels.
//
// Arithmetic: every step is one IEEE f32 operation rounded to nearest even, never fused
// (formats.cpp turns FMA contraction off). A CUDA twin uses __fdiv_rn / __fmul_rn /
// __fsub_rn (never contracted) and rint-style rounding, in the order written here.
//
// Rounding rules (s = a block's scale, amax = the largest |x| it covers):
//   int4        s = f16(amax / 7) for weights, f32 amax / 7 for activations;
//               code = clamp(round_half_even(x / s), -8, 7); s == 0 gives code 0.
//   int4-channel the same with one f16 scale for the whole row (weights only).
//   int4-asym   weights only, groups along K with a scale and a minimum: lo / hi = the
//               group's smallest / largest value, s = (hi - lo) / 15, m = lo (both f32);
//               code = clamp(round_half_even((x - m) / s), 0, 15); s == 0 gives code 0.
//               value = fma(code, s, m): one rounding, the one exception to the "never
//               fused" rule above (an explicit std::fma / _mm256_fmadd_ps / __fmaf_rn in
//               every implementation, so no compiler contraction can change it; for GGUF
//               blocks code * s is exact and fma equals ggml's mul then add).
//   int4-zp     weights only, groups along K with a scale and an integer zero point (GPTQ /
//               AWQ style): lo = min(group, 0), hi = max(group, 0), s = f16(hi - lo) / 15),
//               z = clamp(round_half_even(-lo / s), 0, 15);
//               code = clamp(round_half_even(x / s) + z, 0, 15); s == 0 gives code 0, z 0.
//               value = s * (code - z), exact in f32 (an f16 s times an integer of 5 bits).
//               Stored as int4-asym's pair with m = -s * z (exact too), so fma(code, s, m) is
//               the same value and every int4-asym kernel runs it; the GPU's W4A16 kernels
//               subtract z where int4's subtract 8 (ops/w4a16_pack.h), at int4's cost.
//   int8        s = amax / 127 (f32); code = clamp(round_half_even(x / s), -127, 127).
//   int8-group  weights only: int8's rule in groups along K (one f32 scale a group), value =
//               code * s. Importers may store any code -128..127 and any finite scale
//               (store_block_scale): a GGUF Q8_0, Q5_0 or Q6_K block is exactly code * s with
//               s = d, d or d * sc (f32: an f16 d times an 8-bit sc has 19 significant bits),
//               so those tensors keep their file's values at 8 bits (qspec convert gguf
//               --keep-4bit).
//   fp8         s = amax / 448 (f32); code = f32_to_e4m3(x / s).
//   nvfp4       t = tensor scale (FP32; see nvfp4_tensor_scale); block scale code
//               b = f32_to_e4m3(amax / (6 * t)); code = f32_to_e2m1(x / (e4m3(b) * t)).
//   mxfp4       shared exponent e = floor(log2(amax)) - 2 clamped to [-127, 127], stored as
//               E8M0 e + 127 (0 for an all-zero block); code = f32_to_e2m1(x * 2^-e).
// A block whose scale is zero (all-zero block, or a scale that underflows its own format)
// stores zero codes that keep the sign of each input. Dequantization is always
//   value = (element_value * block_scale) * row_tensor_scale  [+ block_min for int4-asym]
// where the inner product is exact and row_tensor_scale is 1 except for nvfp4; int4-asym's
// element value is its code 0..15 and its tensor scale 1, so value = fma(code, s, m) as above.
//
// Storage of one row of k values (k is the reduction dimension: a weight row is one output
// channel, an activation row is one token):
//   codes   4-bit formats: two per byte, element 2i in the low nibble, 2i+1 in the high one;
//           int4 nibbles are two's complement, int4-asym nibbles unsigned (0..15), E2M1
//           nibbles sign-magnitude (bit 3 = sign).
//           8-bit formats: one byte per element (int8 two's complement, or E4M3).
//   scales  little-endian, one per block, in block order: f16 (int4 / int4-channel weights),
//           f32 (int4 activations, int8, int8-group, fp8), E4M3 (nvfp4), E8M0 (mxfp4), and for int4-asym
//           one f32 pair per group, scale then minimum (8 bytes). f32 rather than f16: a
//           GGUF Q4_K sub-block scale d * sc (f16 d times a 6-bit sc) has up to 17
//           significant bits, and Q4_0 / Q4_1 / Q4_K decode exactly as code * s + m only
//           with s and m held to f32 (see kInt4AsymScaleBytes). An nvfp4
//           activation row appends its own f32 tensor scale after the block scales.
// Quantizers reject NaN and infinite inputs with qspec::Error before writing anything; the
// other errors (an nvfp4 weight tensor scale too small for the row, an int4 weight scale
// beyond f16) are found block by block and can leave the buffers partly written.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace qspec::quant {

// ---- Scalar codecs ------------------------------------------------------------------------

// E2M1 (FP4), values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}: round to nearest, ties to the even code,
// saturating beyond ±6 (infinities included), keeping the sign of zero (-0.1 -> code 0x8).
// NaN has no E2M1 encoding and throws qspec::Error.
uint8_t f32_to_e2m1(float value);
float e2m1_to_f32(uint8_t code);  // low nibble only

// OCP E4M3FN: bias 7, max ±448, subnormals down to 2^-9, no infinity, 0x7f / 0xff are NaN.
// Round to nearest even with saturation to ±448 (PTX cvt.rn.satfinite.e4m3x2.f32): anything
// beyond 448, infinities included, becomes ±448; NaN stays NaN (0x7f, or 0xff if negative).
uint8_t f32_to_e4m3(float value);
float e4m3_to_f32(uint8_t code);

// E8M0: 2^(code - 127) for codes 0..254 (2^-127 is an f32 subnormal, exact); 0xff is NaN.
float e8m0_to_f32(uint8_t code);
// OCP MX shared scale of a block: floor(log2(block_amax)) - element_emax, clamped to the E8M0
// range [-127, 127], as an E8M0 code; an all-zero block gets code 0. element_emax is 2 for
// E2M1, 8 for E4M3. Throws on a negative or non-finite amax.
uint8_t e8m0_shared_scale(float block_amax, int element_emax);

// ---- Formats ------------------------------------------------------------------------------

enum class Format : uint8_t {
  int4,          // symmetric int4 in groups along K (weights and activations)
  int4_channel,  // symmetric int4, one scale per row (weights only)
  nvfp4,         // E2M1, block 16, E4M3 block scale, FP32 tensor scale
  mxfp4,         // E2M1, block 32, E8M0 shared scale
  int8,          // symmetric int8, one scale per token (activations only)
  fp8,           // E4M3, one scale per token (activations only)
  int4_asym,     // unsigned int4 in groups along K, f32 scale + f32 minimum per group (weights)
  int4_zp,       // unsigned int4 in groups along K, f16 scale + integer zero point per group (weights)
  int8_group,    // symmetric int8 in groups along K, f32 scale per group (weights: 8-bit tensors of a GGUF)
};
// Which side of a GEMM a row is: the scale encodings differ (see the table above).
enum class Role : uint8_t { weight, activation };

inline constexpr int64_t kDefaultGroupSize = 128;  // int4 groups along K
// The weight format `qspec quantize` and `--weights` use when none is named.
inline constexpr Format kDefaultWeightFormat = Format::int4;
// The one format a projection may have beside its checkpoint's own (the manifest's
// "tensor_formats"): the 8-bit tensors of a GGUF kept exactly (qspec convert gguf --keep-4bit).
inline constexpr Format kSideWeightFormat = Format::int8_group;
// int4-asym / int4-zp: the bytes of one group's (scale, minimum) pair, and its largest code.
inline constexpr int64_t kInt4AsymScaleBytes = 8;
inline constexpr int kInt4AsymMaxCode = 15;

// Names as users type them: "int4", "int4-channel", "int4-asym", "int4-zp", "int8-group", "nvfp4",
// "mxfp4", "int8", "fp8".
// Unknown names throw qspec::Error listing the known ones.
Format parse_format(std::string_view name);
std::string_view format_name(Format format);
// The names of the weight formats, joined by `separator` ("int4|int4-channel|..."): the one list
// that help texts and errors print.
std::string weight_format_names(std::string_view separator = "|");
bool format_supports(Format format, Role role);
// Formats whose block is a user-chosen group along K (int4, int4-asym, int4-zp, int8-group): the
// ones a group size applies to.
bool format_has_groups(Format format);
// Formats whose blocks carry a minimum beside the scale, value = fma(code, s, m) with unsigned
// codes (int4-asym; int4-zp, whose minimum is -s * z).
bool format_has_min(Format format);
// Values that share one block scale: the group size for int4 / int4-asym / int4-zp / int8-group,
// 16 for nvfp4, 32 for mxfp4,
// the whole row (k) for int4-channel, int8 and fp8.
int64_t block_size(Format format, int64_t k, int64_t group_size = kDefaultGroupSize);

// Everything that fixes how one row is stored. Build it with make_row_format.
struct RowFormat {
  Format format;
  Role role;
  int64_t k;      // values per row
  int64_t block;  // values per block scale
  // nvfp4 weights only: the matrix's FP32 tensor scale, nvfp4_tensor_scale(amax of the whole
  // matrix); set it before quantizing. Activation rows carry their own, per token.
  float tensor_scale = 0.0f;

  int64_t blocks() const { return k / block; }
  int64_t code_bytes() const;
  int64_t scale_bytes() const;
};

// Validates the combination: the role must use the format, k must be a positive multiple of
// the block (every layer shape qspec supports is; others are rejected with the sizes named),
// and an int4 / int4-asym group size must be positive and even.
RowFormat make_row_format(Format format, Role role, int64_t k,
                          int64_t group_size = kDefaultGroupSize);

// Largest |value|; throws qspec::Error naming the index of the first NaN or infinity.
float abs_max(const float* values, int64_t count);
// NVFP4 second-level scale: amax / (448 * 6), so the largest block scale lands on E4M3's 448.
// Weights use one for the whole matrix. Activations use one per token (computed inside the
// quantizers): a token's quantized values then never depend on which other tokens share its
// batch, which QSpec's draft/verify equivalence needs.
float nvfp4_tensor_scale(float amax);

// How a block's scale (and int4-asym minimum) is chosen from the block's values.
//   range: from the amax (int4-asym: from the minimum and maximum), so every value lies within
//     half a step of its code. The rule for activations, and round to nearest (RTN).
//   mse: the grid with the least squared error over the block's values: clipped ranges are
//     searched (int4: the amax times 1, 0.98, ..., 0.6; int4-asym: 21 step counts around 15
//     over the range, each refit by least squares), the range's own grid among them, so it is
//     never worse than range in squared error. A few outliers are clipped so that the rest
//     resolve finer (llama.cpp's make_qkx2_quants, GPTQ's mse option do the same). int4,
//     int4-channel and int4-asym only: the other formats keep their range rule.
enum class BlockFit { range, mse };
std::string_view block_fit_name(BlockFit fit);
BlockFit parse_block_fit(std::string_view name);  // "range" or "mse"; throws naming the value

// Per-row work, no allocation: buffers are caller-provided, sized by code_bytes() and
// scale_bytes(). fake_quantize_row replaces x by dequantize_row(quantize_row(x)), bit for bit.
void quantize_row(const RowFormat& format, const float* x, uint8_t* codes, uint8_t* scales,
                  BlockFit fit = BlockFit::range);
void dequantize_row(const RowFormat& format, const uint8_t* codes, const uint8_t* scales,
                    float* out);
void fake_quantize_row(const RowFormat& format, float* x);

// Pieces of a quantized row for GEMMs that work on the codes:
// dequantized[i] = (element_value(i) * block_scale(i / block)) * row_tensor_scale, and for
// int4-asym (tensor scale 1) dequantized[i] = fma(element_value(i), block_scale, block_min).
float element_value(const RowFormat& format, const uint8_t* codes, int64_t index);
float block_scale(const RowFormat& format, const uint8_t* scales, int64_t block);
float block_min(const RowFormat& format, const uint8_t* scales, int64_t block);  // 0 unless format_has_min
// int4-zp: block `block`'s integer zero point z (0..15); its minimum is -scale * z.
int block_zero_point(const RowFormat& format, const uint8_t* scales, int64_t block);
// int4-asym: stores block `block`'s (scale, minimum) as given (importers of other 4-bit
// formats, e.g. GGUF Q4_0 / Q4_1 / Q4_K, whose values are code * scale + minimum exactly).
// The scale may be negative (ggml's Q4_0 stores d = max / -8; the quantizers here never do).
// Throws on a non-finite scale or minimum.
void store_asym_block(const RowFormat& format, uint8_t* scales, int64_t block, float scale, float min);
// int8-group: stores block `block`'s scale as given (importers of GGUF Q8_0 / Q5_0 / Q6_K blocks,
// whose values are code * scale exactly; the scale may be negative). Throws on a non-finite scale.
void store_block_scale(const RowFormat& format, uint8_t* scales, int64_t block, float scale);
float row_tensor_scale(const RowFormat& format, const uint8_t* scales);

// Pieces for quantizers that choose values one element at a time (GPTQ). Together they give
// what quantize_row gives when every block's values are known up front.
// quantize_block_scale: block `block`'s scale from its format.block values (its first value at
// values[0]) by the format's rule, stored in scales. One difference from quantize_row, for
// nvfp4 weights only: a block amax beyond what the matrix's tensor scale covers
// (2688 * tensor_scale; GPTQ's updated values can outgrow the original matrix) saturates the
// block scale at E4M3's 448 instead of throwing. Throws on NaN or infinite values.
void quantize_block_scale(const RowFormat& format, const float* values, int64_t block,
                          uint8_t* scales, BlockFit fit = BlockFit::range);
// x encoded under the stored scale of block `block`: its code (4-bit formats: the low nibble)
// and exactly the value dequantize_row decodes from that code and scale. Throws on NaN or
// infinite x.
struct QuantizedElement {
  uint8_t code;
  float value;
};
QuantizedElement quantize_element(const RowFormat& format, const uint8_t* scales, int64_t block,
                                  float x);

// ---- ARCQuant augmented residual channels ---------------------------------------------------
//
// The activation row x has k channels already reordered so that its S outlier channels are
// the LAST S (Atom's reorder puts outliers at the end). The augmented row has k + S values:
// Q(X) for all k channels plus Q(R) for R = X_o - dequant(Q(X_o)), quantized in the same format
// (nvfp4: under the token's tensor scale of X, so the augmented row is one ordinary nvfp4
// activation row of k + S values and dequantize_row(augmented) decodes it). S must be a
// multiple of the block, so every block is all-primary or all-residual.
enum class ArcLayout : uint8_t {
  // [Q(X) | Q(R)]: the first k values are the plain quantized row, so modes without ARC read
  // a prefix of the same augmented weights.
  concatenated,
  // Paper appendix D: the k - S plain channels, then each outlier block immediately followed
  // by its residual block (what a fused quantize kernel writes in one pass).
  interleaved,
};

struct ArcRow {
  RowFormat augmented;  // activation format of the k + S row
  int64_t k;            // channels of the reordered input
  int64_t outliers;     // S, the last S of the k channels
  ArcLayout layout;

  // Input channel behind augmented position j (for a residual position: the outlier channel
  // whose residual sits there). Weights are augmented by gathering columns with it,
  // W_aug[:, j] = W[:, source_channel(j)], then quantized as rows of k + S: with K and S
  // multiples of the weight format's block this equals [Q_W | Q_W_o] block for block.
  int64_t source_channel(int64_t j) const;
  bool is_residual(int64_t j) const;
};

// format: int4 (group_size), nvfp4 or mxfp4; outliers: a multiple of the block, at most k.
ArcRow make_arc_row(Format format, int64_t k, int64_t outliers,
                    ArcLayout layout = ArcLayout::concatenated,
                    int64_t group_size = kDefaultGroupSize);
// x: k values. codes / scales: sized by arc.augmented.
void arc_quantize_row(const ArcRow& arc, const float* x, uint8_t* codes, uint8_t* scales);
// x: k values; out: k + S dequantized values of the augmented row (out must not alias x).
void arc_fake_quantize_row(const ArcRow& arc, const float* x, float* out);

}  // namespace qspec::quant
