// Per-token int8 quantization of f16 activation rows (W4A8's activation side), bit for bit
// quant::quantize_row(Format::int8, Role::activation) on the f32 value of each f16 element:
//   scale = amax / 127 (f32, rounded once), code = clamp(round_half_even(x / scale), -127, 127),
//   a zero row gets scale 0 and zero codes.
// IEEE division (__fdiv_rn) and rintf, never fast-math, so the quotients are the CPU's.
// One block per row, 16-byte loads of 8 halves; the row is read twice (amax, then codes), the
// second time from L1/L2. A row holding a NaN or an infinity gets a NaN scale: the GPU cannot
// throw mid-graph, and a NaN scale makes every output of that token NaN, which argmax never picks.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/reduce.cuh"

namespace qspec::cuda::kernels {

__device__ __forceinline__ uint32_t quantize_int8x4(const float* v, float scale) {
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float q = scale == 0.0f ? 0.0f : fminf(fmaxf(rintf(__fdiv_rn(v[e], scale)), -127.0f), 127.0f);
    packed |= (static_cast<uint32_t>(static_cast<int>(q)) & 0xffu) << (8 * e);
  }
  return packed;
}

// One row quantized by one block: load(i, v) yields the row's 8-value vector i (called twice a
// vector: the amax pass and the codes pass, so it must give the same values both times).
// Writes vectors x 8 codes and the row's scale (a NaN scale when a value is not finite).
template <class Load>
__device__ __forceinline__ void quantize_int8_row(const Load& load, int64_t vectors, int8_t* __restrict__ codes,
                                                  float* __restrict__ scale_out, float* scratch) {
  bool all_finite = true;
  const float amax = row_abs_max(load, vectors, scratch, &all_finite);
  const float scale = all_finite ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fc00000);
  if (threadIdx.x == 0) *scale_out = scale;
  uint2* out = reinterpret_cast<uint2*>(codes);
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    float v[8];
    load(i, v);
    out[i] = make_uint2(quantize_int8x4(v, scale), quantize_int8x4(v + 4, scale));
  }
}

// k % 8 == 0; x rows ldx halves apart, codes rows ldc bytes apart (both 16-byte / 8-byte aligned).
// VEC: values a load (8; a template so that this header can be included by several .cu files).
template <int VEC>
__global__ void quantize_int8_rows_kernel(const __half* __restrict__ x, int64_t ldx, int64_t k,
                                          int8_t* __restrict__ codes, int64_t ldc, float* __restrict__ scales) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint4* in = reinterpret_cast<const uint4*>(x + row * ldx);
  static_assert(VEC == 8, "16-byte loads of 8 halves");
  quantize_int8_row([&](int64_t i, float (&v)[8]) { half8_to_float(in[i], v); }, k / VEC, codes + row * ldc,
                    scales + row, scratch);
}

}  // namespace qspec::cuda::kernels
