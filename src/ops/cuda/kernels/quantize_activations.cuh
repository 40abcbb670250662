// Per-token quantization of f16 activation rows in a block format, bit for bit
// quant::quantize_row(format, Role::activation) on the f32 value of each element (the rules of
// quant/formats.h, the codecs of fp_codecs.cuh), written the way the 4-bit GEMMs read it
// (ops.h QuantizedActivations):
//   int4   codes as int8 bytes, s = amax / 7 per group of GROUP values (f32 scales [row][scale_ld]);
//   fp8    f16 values e4m3(x / s), token scale s = amax / 448;
//   nvfp4  f16 values e2m1 x e4m3 block scale (exact in f16: at most 6 significant bits, within
//          2^-10 .. 2688), token scale = the token's tensor scale amax / 2688;
//   mxfp4  f16 values e2m1 x 2^(e_block - E) with E = e_row - 13 (so the largest is 6 x 2^13,
//          below f16's 65504; exact down to blocks 36 binades below the row's largest), token
//          scale 2^E.
// So f32(value) x token scale is the CPU's dequantized value, exactly (tests/gpu compares bits).
// One block per row; thread i handles the 8-value vectors i, i + blockDim.x, ... (a multiple of
// 32 threads), so the VPB vectors of a scale block sit in VPB adjacent lanes of one warp and
// their amax is a shuffle reduction. A row with a NaN or infinity gets NaN scales and zero values.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/fp_codecs.cuh"
#include "ops/cuda/kernels/reduce.cuh"
#include "quant/formats.h"

namespace qspec::cuda::kernels {

// VPB: 8-value vectors per scale block (1 for fp8, whose only scale is the row's).
template <quant::Format F, int VPB>
__global__ void quantize_block_rows_kernel(const __half* __restrict__ x, int64_t ldx, int64_t k, void* __restrict__ values,
                                           int64_t ldv, float* __restrict__ scales, int64_t scale_ld) {
  static_assert(VPB >= 1 && VPB <= 32 && (VPB & (VPB - 1)) == 0, "a scale block is 1..32 vectors, a power of two");
  pdl_prologue();  // launched with launch_pdl (common.h)
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x, vectors = k / 8;
  const uint4* in = reinterpret_cast<const uint4*>(x + row * ldx);

  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    float v[8];
    half8_to_float(in[i], v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      amax = fmaxf(amax, fabsf(v[e]));
      finite = finite && isfinite(v[e]);
    }
  }
  const bool all_finite = __syncthreads_and(finite);
  amax = block_max(amax, scratch);
  const float nan = __uint_as_float(0x7fc00000u);

  // Row-level scales.
  float token_scale = 1.0f;
  int row_offset = 0;  // mxfp4: E
  if constexpr (F == quant::Format::fp8) token_scale = __fdiv_rn(amax, 448.0f);
  if constexpr (F == quant::Format::nvfp4) token_scale = __fdiv_rn(amax, 2688.0f);  // 448 x 6, as the CPU folds it
  if constexpr (F == quant::Format::mxfp4) {
    const int e_row = amax == 0.0f ? -127 : min(max(floor_log2(amax) - 2, -127), 127);
    row_offset = e_row - 13;
    token_scale = power_of_two(row_offset);
  }
  if constexpr (F != quant::Format::int4) {
    if (threadIdx.x == 0) scales[row] = all_finite ? token_scale : nan;
  }

  for (int64_t base = 0; base < vectors; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool valid = i < vectors;  // whole scale blocks are valid or not (VPB divides 32)
    float v[8];
    if (valid) half8_to_float(in[i], v);
    else
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    float block_amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) block_amax = fmaxf(block_amax, fabsf(v[e]));
#pragma unroll
    for (int offset = 1; offset < VPB; offset <<= 1)
      block_amax = fmaxf(block_amax, __shfl_xor_sync(0xffffffffu, block_amax, offset));
    if (!valid) continue;

    if constexpr (F == quant::Format::int4) {
      const float s = __fdiv_rn(block_amax, 7.0f);
      uint32_t packed[2] = {0, 0};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float q = s == 0.0f || !all_finite ? 0.0f : fminf(fmaxf(rintf(__fdiv_rn(v[e], s)), -8.0f), 7.0f);
        packed[e / 4] |= (static_cast<uint32_t>(static_cast<int>(q)) & 0xffu) << (8 * (e % 4));
      }
      reinterpret_cast<uint2*>(static_cast<int8_t*>(values) + row * ldv)[i] = make_uint2(packed[0], packed[1]);
      if (i % VPB == 0) scales[row * scale_ld + i / VPB] = all_finite ? s : nan;
    } else {
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) out[e] = 0.0f;
      if (all_finite) {
        if constexpr (F == quant::Format::fp8) {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            out[e] = token_scale == 0.0f ? copysignf(0.0f, v[e]) : e4m3_decode(e4m3_encode(__fdiv_rn(v[e], token_scale)));
        } else if constexpr (F == quant::Format::nvfp4) {
          float block_value = 0.0f, divisor = 0.0f;
          if (token_scale != 0.0f) {
            block_value = e4m3_decode(e4m3_encode(__fdiv_rn(block_amax, __fmul_rn(6.0f, token_scale))));
            divisor = __fmul_rn(block_value, token_scale);
          }
#pragma unroll
          for (int e = 0; e < 8; ++e)
            out[e] = divisor == 0.0f ? copysignf(0.0f, v[e])
                                     : __fmul_rn(e2m1_decode(e2m1_encode(__fdiv_rn(v[e], divisor))), block_value);
        } else {  // mxfp4
          const int e_block = block_amax == 0.0f ? -127 : min(max(floor_log2(block_amax) - 2, -127), 127);
          const float multiplier = power_of_two(-e_block);
          const int shift = e_block - row_offset;  // <= 13
          const float relative = shift >= -149 ? power_of_two(shift) : 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) out[e] = __fmul_rn(e2m1_decode(e2m1_encode(__fmul_rn(v[e], multiplier))), relative);
        }
      }
      reinterpret_cast<uint4*>(static_cast<__half*>(values) + row * ldv)[i] = float8_to_half(out);
    }
  }
}

}  // namespace qspec::cuda::kernels
