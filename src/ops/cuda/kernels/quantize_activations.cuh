// Per-token quantization of f16 activation rows in a block format, bit for bit
// quant::quantize_row(format, Role::activation) on the f32 value of each element (the rules of
// quant/formats.h, the codecs of fp_codecs.cuh), written the way the 4-bit GEMMs read it
// (ops.h QuantizedActivations):
//   int4   codes as int8 bytes, s = amax / 7 per group of GROUP values (f32 scales [row][scale_ld]);
//   fp8    f16 values e4m3(x / s), or (CODES) their e4m3 codes as bytes; token scale s = amax / 448;
//   nvfp4  f16 values e2m1 x e4m3 block scale (exact in f16: at most 6 significant bits, within
//          2^-10 .. 2688), token scale = the token's tensor scale amax / 2688;
//   mxfp4  f16 values e2m1 x 2^(e_block - E) with E = e_row - 13 (so the largest is 6 x 2^13,
//          below f16's 65504; exact down to blocks 36 binades below the row's largest), token
//          scale 2^E.
// So f32(value) x token scale is the CPU's dequantized value, exactly (tests/gpu compares bits;
// fp8: e4m3_decode(code) x s).
// ARCQuant (quant::arc_quantize_row, concatenated layout): with S = arc_outliers > 0 the last S
// output positions hold the quantized residual R = X_o - dequant(Q(X_o)) of input channels
// arc_k - S .. arc_k - 1 (a multiple of the block, so residual blocks map one to one onto the
// outlier blocks), quantized in the same format (nvfp4 under the token's tensor scale of X). The
// input row is the reordered row (ops.h gather_columns: zeros past arc_k).
// One block per row; thread i handles the 8-value vectors i, i + blockDim.x, ... (a multiple of
// 32 threads), so the VPB vectors of a scale block sit in VPB adjacent lanes of one warp and
// their amax is a shuffle reduction. A row with a NaN or infinity gets NaN scales and zero values.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/fp_codecs.cuh"
#include "ops/cuda/kernels/reduce.cuh"
#include "quant/formats.h"

namespace qspec::cuda::kernels {

// One format's block rule on the device (formats.cpp's codecs): scale from a block amax, the
// element's code, its dequantized value (exactly the CPU's decode), and what the GEMM reads.
// `row` carries the per-token quantities (fp8 / nvfp4 token scale, mxfp4's E).
struct RowScale {
  float token_scale;
  int offset;  // mxfp4: E
};

template <quant::Format F>
struct DeviceCodec;

template <>
struct DeviceCodec<quant::Format::int4> {
  struct Block {
    float scale;
  };
  __device__ static Block from_amax(float amax, const RowScale&) { return {__fdiv_rn(amax, 7.0f)}; }
  __device__ static float encode(float x, const Block& b) {  // the code as a float in [-8, 7]
    return b.scale == 0.0f ? 0.0f : fminf(fmaxf(rintf(__fdiv_rn(x, b.scale)), -8.0f), 7.0f);
  }
  __device__ static float decode(float code, const Block& b, const RowScale&) { return __fmul_rn(code, b.scale); }
};

template <>
struct DeviceCodec<quant::Format::fp8> {
  struct Block {
    float scale;
  };
  __device__ static Block from_amax(float, const RowScale& row) { return {row.token_scale}; }
  __device__ static float encode(float x, const Block& b) {  // the E4M3 value (signed zero when s = 0)
    return b.scale == 0.0f ? copysignf(0.0f, x) : e4m3_decode(e4m3_encode(__fdiv_rn(x, b.scale)));
  }
  __device__ static float decode(float code, const Block& b, const RowScale&) { return __fmul_rn(code, b.scale); }
  __device__ static float gemm_value(float code, const Block&, const RowScale&) { return code; }
};

template <>
struct DeviceCodec<quant::Format::nvfp4> {
  struct Block {
    float value, divisor;  // the E4M3 block scale's value, value x tensor scale
  };
  __device__ static Block from_amax(float amax, const RowScale& row) {
    if (row.token_scale == 0.0f) return {0.0f, 0.0f};
    const float value = e4m3_decode(e4m3_encode(__fdiv_rn(amax, __fmul_rn(6.0f, row.token_scale))));
    return {value, __fmul_rn(value, row.token_scale)};
  }
  __device__ static float encode(float x, const Block& b) {  // the E2M1 value
    return b.divisor == 0.0f ? copysignf(0.0f, x) : e2m1_decode(e2m1_encode(__fdiv_rn(x, b.divisor)));
  }
  __device__ static float decode(float code, const Block& b, const RowScale& row) {
    return __fmul_rn(__fmul_rn(code, b.value), row.token_scale);
  }
  __device__ static float gemm_value(float code, const Block& b, const RowScale&) { return __fmul_rn(code, b.value); }
};

template <>
struct DeviceCodec<quant::Format::mxfp4> {
  struct Block {
    int exponent;
  };
  __device__ static Block from_amax(float amax, const RowScale&) {
    return {amax == 0.0f ? -127 : min(max(floor_log2(amax) - 2, -127), 127)};
  }
  __device__ static float encode(float x, const Block& b) {  // the E2M1 value
    return e2m1_decode(e2m1_encode(__fmul_rn(x, power_of_two(-b.exponent))));
  }
  __device__ static float decode(float code, const Block& b, const RowScale&) {
    return __fmul_rn(code, power_of_two(b.exponent));
  }
  __device__ static float gemm_value(float code, const Block& b, const RowScale& row) {
    const int shift = b.exponent - row.offset;  // <= 13
    return shift >= -149 ? __fmul_rn(code, power_of_two(shift)) : 0.0f;
  }
};

// One row quantized by one block (a multiple of 32 threads): load(i, v) yields the input row's
// 8-value vector i (called for the amax pass and again for the codes, so it must give the same
// values both times; vectors past the input give zeros if the loader says so). k: output values
// (the augmented width with ARC). values_row: the row's output; scales_row: the token's scale
// (int4: the row's group scales). scratch: 32 floats of shared memory.
// VPB: 8-value vectors per scale block (1 for fp8, whose only scale is the row's).
// CODES (fp8 only): e4m3 codes, one byte each, instead of f16 values.
template <quant::Format F, int VPB, bool CODES, class Load>
__device__ __forceinline__ void quantize_block_row(const Load& load, int64_t k, void* __restrict__ values_row,
                                                   float* __restrict__ scales_row, int64_t arc_k,
                                                   int64_t arc_outliers, float* scratch) {
  static_assert(VPB >= 1 && VPB <= 32 && (VPB & (VPB - 1)) == 0, "a scale block is 1..32 vectors, a power of two");
  using Codec = DeviceCodec<F>;
  const int64_t vectors = k / 8;
  // Output vectors from residual_begin on hold residuals of input vectors from source_begin on.
  const int64_t residual_begin = arc_outliers > 0 ? (k - arc_outliers) / 8 : vectors;
  const int64_t source_begin = (arc_k - arc_outliers) / 8;

  bool all_finite = true;
  const float amax = row_abs_max(load, min(vectors, residual_begin), scratch, &all_finite);
  const float nan = __uint_as_float(0x7fc00000u);

  RowScale row_scale{1.0f, 0};
  if constexpr (F == quant::Format::fp8) row_scale.token_scale = __fdiv_rn(amax, 448.0f);
  if constexpr (F == quant::Format::nvfp4) row_scale.token_scale = __fdiv_rn(amax, 2688.0f);  // 448 x 6, as the CPU folds it
  if constexpr (F == quant::Format::mxfp4) {
    row_scale.offset = DeviceCodec<F>::from_amax(amax, row_scale).exponent - 13;
    row_scale.token_scale = power_of_two(row_scale.offset);
  }
  if constexpr (F != quant::Format::int4) {
    if (threadIdx.x == 0) *scales_row = all_finite ? row_scale.token_scale : nan;
  }

  for (int64_t base = 0; base < vectors; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool valid = i < vectors;  // whole scale blocks are valid or not (VPB divides 32)
    const bool residual = i >= residual_begin;  // whole scale blocks too (S is a multiple of the block)
    float v[8];
    if (valid) load(residual ? source_begin + (i - residual_begin) : i, v);
    else
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    const typename Codec::Block primary = Codec::from_amax(block_abs_max8<VPB>(v), row_scale);
    // Residual lanes: replace v by R = v - dequant(Q(v)) and take R's block scale (every lane
    // shuffles, so the reduction stays warp-uniform).
    float r[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) r[e] = residual ? __fsub_rn(v[e], Codec::decode(Codec::encode(v[e], primary), primary, row_scale)) : 0.0f;
    const typename Codec::Block residual_block = Codec::from_amax(block_abs_max8<VPB>(r), row_scale);
    if (!valid) continue;
    const typename Codec::Block& block = residual ? residual_block : primary;
    const float(&src)[8] = residual ? r : v;

    if constexpr (F == quant::Format::int4) {
      uint32_t packed[2] = {0, 0};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float q = all_finite ? Codec::encode(src[e], block) : 0.0f;
        packed[e / 4] |= (static_cast<uint32_t>(static_cast<int>(q)) & 0xffu) << (8 * (e % 4));
      }
      reinterpret_cast<uint2*>(values_row)[i] = make_uint2(packed[0], packed[1]);
      if (i % VPB == 0) scales_row[i / VPB] = all_finite ? block.scale : nan;
    } else if constexpr (F == quant::Format::fp8 && CODES) {
      // e4m3 codes (the wgmma kernel's operand): the code of x / s, signed zero when s = 0.
      uint32_t packed[2] = {0, 0};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t code = !all_finite ? 0u
                              : block.scale == 0.0f ? (__float_as_uint(src[e]) >> 24) & 0x80u
                                                    : e4m3_encode(__fdiv_rn(src[e], block.scale));
        packed[e / 4] |= code << (8 * (e % 4));
      }
      reinterpret_cast<uint2*>(values_row)[i] = make_uint2(packed[0], packed[1]);
    } else {
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) out[e] = all_finite ? Codec::gemm_value(Codec::encode(src[e], block), block, row_scale) : 0.0f;
      reinterpret_cast<uint4*>(values_row)[i] = float8_to_half(out);
    }
  }
}

// Element size of the quantized values a format's GEMMs read (f16 values for fp8 without CODES
// and the emulated fp4 formats; int8 / int4 / e4m3 codes one byte).
template <quant::Format F, bool CODES>
constexpr int quantized_value_bytes() {
  return F == quant::Format::nvfp4 || F == quant::Format::mxfp4 || (F == quant::Format::fp8 && !CODES) ? 2 : 1;
}

// f16 rows [rows][ldx] -> quantized rows; one block a row.
template <quant::Format F, int VPB, bool CODES>
__global__ void quantize_block_rows_kernel(const __half* __restrict__ x, int64_t ldx, int64_t k, void* __restrict__ values,
                                           int64_t ldv, float* __restrict__ scales, int64_t scale_ld, int64_t arc_k,
                                           int64_t arc_outliers) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint4* in = reinterpret_cast<const uint4*>(x + row * ldx);
  quantize_block_row<F, VPB, CODES>([&](int64_t i, float (&v)[8]) { half8_to_float(in[i], v); }, k,
                             static_cast<char*>(values) + row * ldv * quantized_value_bytes<F, CODES>(),
                             scales + row * (F == quant::Format::int4 ? scale_ld : 1), arc_k, arc_outliers, scratch);
}

}  // namespace qspec::cuda::kernels
