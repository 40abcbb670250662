// SwiGLU (silu(gate) * up) and the residual add on f16 tensors.
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// silu_mul's output from a GEMM's f32 sums of gate and up, each rounded to f16 first as the GEMM
// stores them: the bits of the GEMM then silu_mul (the SwiGLU epilogues of the 4-bit GEMMs).
__device__ __forceinline__ __half swiglu_of_sums(float gate_sum, float up_sum) {
  const float gate = __half2float(__float2half_rn(gate_sum));
  const float up = __half2float(__float2half_rn(up_sum));
  return __float2half_rn(silu(gate) * up);
}

// Grid-stride over rows x (cols / VEC); VEC 8 needs cols and in_stride multiples of 8.
template <int VEC>
__global__ void silu_mul_kernel(const __half* __restrict__ gate, const __half* __restrict__ up, int64_t rows,
                                int64_t cols, int64_t in_stride, __half* __restrict__ out, int64_t out_stride,
                                bool release_first) {
  pdl_prologue(release_first);  // launched with launch_pdl (common.h)
  const int64_t per_row = cols / VEC, total = rows * per_row;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; item < total;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = item / per_row, c = (item % per_row) * VEC;
    if constexpr (VEC == 8) {
      float g[8], u[8];
      half8_to_float(*reinterpret_cast<const uint4*>(gate + r * in_stride + c), g);
      half8_to_float(*reinterpret_cast<const uint4*>(up + r * in_stride + c), u);
#pragma unroll
      for (int e = 0; e < 8; ++e) g[e] = silu(g[e]) * u[e];
      *reinterpret_cast<uint4*>(out + r * out_stride + c) = float8_to_half(g);
    } else {
      out[r * out_stride + c] =
          __float2half_rn(silu(__half2float(gate[r * in_stride + c])) * __half2float(up[r * in_stride + c]));
    }
  }
}

template <int VEC>
__global__ void add_kernel(const __half* a, const __half* b, int64_t count, __half* out) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; item < count / VEC;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (VEC == 8) {
      float x[8], y[8];
      half8_to_float(reinterpret_cast<const uint4*>(a)[item], x);
      half8_to_float(reinterpret_cast<const uint4*>(b)[item], y);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] += y[e];
      reinterpret_cast<uint4*>(out)[item] = float8_to_half(x);
    } else {
      out[item] = __float2half_rn(__half2float(a[item]) + __half2float(b[item]));
    }
  }
}

}  // namespace qspec::cuda::kernels
