// The gated MLP activations (SwiGLU silu(gate) * up, GeGLU gelu_tanh(gate) * up), the residual
// add and logit soft-capping on f16 tensors.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/packed_x.cuh"

namespace qspec::cuda::kernels {

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
// PyTorch's gelu(approximate="tanh"), as cpu::gelu_tanh_mul spells it (accurate tanhf: no fast math).
__device__ __forceinline__ float gelu_tanh(float g) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
  return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + kCubic * g * g * g)));
}

// Which activation a gated MLP kernel applies to the gate.
enum class Gate { silu, gelu_tanh };
template <Gate G>
__device__ __forceinline__ float gate_activation(float g) {
  if constexpr (G == Gate::silu) return silu(g);
  else return gelu_tanh(g);
}

// silu_mul's output from a GEMM's f32 sums of gate and up, each rounded to f16 first as the GEMM
// stores them: the bits of the GEMM then silu_mul (the SwiGLU epilogues of the 4-bit GEMMs).
__device__ __forceinline__ __half swiglu_of_sums(float gate_sum, float up_sum) {
  const float gate = __half2float(__float2half_rn(gate_sum));
  const float up = __half2float(__float2half_rn(up_sum));
  return __float2half_rn(silu(gate) * up);
}

// Grid-stride over rows x (cols / VEC); VEC 8 needs cols and in_stride multiples of 8. G: the
// gate's activation (SwiGLU or GeGLU). PACKED (VEC 8, cols % 32 == 0): out in the W4A16 packed k
// order (kernels/rmsnorm.cuh, store_packed_x8), for a GEMM that reads it so.
template <int VEC, Gate G = Gate::silu, bool PACKED = false>
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
      for (int e = 0; e < 8; ++e) g[e] = gate_activation<G>(g[e]) * u[e];
      if constexpr (PACKED) store_packed_x8(out + r * out_stride, c / 8, float8_to_half(g));
      else *reinterpret_cast<uint4*>(out + r * out_stride + c) = float8_to_half(g);
    } else {
      out[r * out_stride + c] =
          __float2half_rn(gate_activation<G>(__half2float(gate[r * in_stride + c])) * __half2float(up[r * in_stride + c]));
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

// x <- cap * tanh(x / cap) (cpu::soft_cap) in f32, one f16 rounding; grid-stride. Static: this
// header is included by several .cu files (a non-template kernel defined in each would clash).
static __global__ void soft_cap_kernel(__half* x, int64_t count, float cap) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __float2half_rn(cap * tanhf(__half2float(x[i]) / cap));
}

}  // namespace qspec::cuda::kernels
