// RMSNorm (and the fused residual add + RMSNorm) on f16 rows with f32 statistics.
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/packed_x.cuh"
#include "ops/cuda/kernels/quantize_int8.cuh"
#include "ops/cuda/kernels/reduce.cuh"

namespace qspec::cuda::kernels {

// Threads of a row's block for `work` vectors (or values): one each, a whole number of warps,
// 32..1024. The f32 sum of squares depends on it, so every kernel that must reproduce
// rmsnorm_kernel's output bit for bit (rmsnorm_int8_kernel, rmsnorm_quantize_kernel) launches with it.
inline int rmsnorm_block_threads(int64_t work) {
  return static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (work + 31) / 32 * 32)));
}

// The 8 f32 weights of vector i.
__device__ __forceinline__ void load_weights8(const float* __restrict__ weight, int64_t i, float (&w)[8]) {
  const float4 w0 = reinterpret_cast<const float4*>(weight)[2 * i];
  const float4 w1 = reinterpret_cast<const float4*>(weight)[2 * i + 1];
  w[0] = w0.x, w[1] = w0.y, w[2] = w0.z, w[3] = w0.w, w[4] = w1.x, w[5] = w1.y, w[6] = w1.z, w[7] = w1.w;
}

// Vector i of the row as f32; FUSED: residual + delta rounded to f16, stored back to the residual.
template <bool FUSED>
__device__ __forceinline__ void load_residual8(__half* x, const __half* __restrict__ delta_row, int64_t i,
                                               float (&v)[8]) {
  half8_to_float(reinterpret_cast<const uint4*>(x)[i], v);
  if constexpr (FUSED) {
    float d[8];
    half8_to_float(reinterpret_cast<const uint4*>(delta_row)[i], d);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __half2float(__float2half_rn(v[e] + d[e]));
    reinterpret_cast<uint4*>(x)[i] = float8_to_half(v);
  }
}

// The 8 f32 weights of this thread's first vector (zeros past the row): constants, which the
// kernels load before their grid-dependency wait. Measured against loading them after it (H100,
// W4A16 decode at batch 1-16): no difference beyond noise; the load was not on the chain, but
// this order cannot put it there (docs/perf-journal/perf-notes-journal-2026.md, "RMSNorm weights before the wait").
__device__ __forceinline__ void load_first_weights8(const float* __restrict__ weight, int64_t dim, float (&w)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) w[e] = 0.0f;
  if (threadIdx.x < dim / 8) load_weights8(weight, threadIdx.x, w);
}

// The RMSNorm of one row in 16-byte vectors (dim % 8 == 0) by one block; FUSED: residual =
// f16(residual + delta) first, stored back. store(i, v) receives the f16 output vector i. A
// thread's first 8 values stay in registers across the reduction and their weights come loaded
// (first_weight, load_first_weights8; launched with rmsnorm_block_threads, every thread has one
// vector up to dim 8192): the second pass then waits on no memory. rmsnorm_kernel writes the
// vectors to global memory, rmsnorm_quantize_kernel to shared memory: the same f16 values.
template <bool FUSED, class Store>
__device__ __forceinline__ void rmsnorm_row8(__half* x, const __half* __restrict__ delta_row,
                                             const float* __restrict__ weight, const float (&first_weight)[8],
                                             int64_t dim, float eps, float* scratch, const Store& store) {
  const int64_t vectors = dim / 8;
  const bool has_first = threadIdx.x < vectors;
  float first[8] = {};
  float sum_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    float v[8];
    load_residual8<FUSED>(x, delta_row, i, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_squares += v[e] * v[e];
    if (i == threadIdx.x) {
#pragma unroll
      for (int e = 0; e < 8; ++e) first[e] = v[e];
    }
  }
  sum_squares = block_sum(sum_squares, scratch);
  // cpu::rmsnorm: 1 / sqrt(mean + eps) in f32, then (x * inverse_rms) * weight.
  const float inverse_rms = 1.0f / sqrtf(sum_squares / static_cast<float>(dim) + eps);
  if (has_first) {
#pragma unroll
    for (int e = 0; e < 8; ++e) first[e] = (first[e] * inverse_rms) * first_weight[e];
    store(static_cast<int64_t>(threadIdx.x), float8_to_half(first));
  }
  for (int64_t i = threadIdx.x + blockDim.x; i < vectors; i += blockDim.x) {
    float v[8];
    half8_to_float(reinterpret_cast<const uint4*>(x)[i], v);  // this thread's own (stored) values
    float w[8];
    load_weights8(weight, i, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = (v[e] * inverse_rms) * w[e];
    store(i, float8_to_half(v));
  }
}

// One block per row. FUSED: residual = f16(residual + delta), stored back, then normalized.
// VEC 8: 16-byte accesses (dim % 8 == 0, rmsnorm_row8), else 1. PACKED (VEC 8, dim % 32 == 0):
// y in the W4A16 packed k order (store_packed_x8), for a GEMM that reads it so.
template <int VEC, bool FUSED, bool PACKED = false>
__global__ void rmsnorm_kernel(__half* residual_or_x, const __half* __restrict__ delta,
                               const float* __restrict__ weight, int64_t dim, float eps, __half* y) {
  float first_weight[8];
  if constexpr (VEC == 8) load_first_weights8(weight, dim, first_weight);  // constants: before the wait
  pdl_prologue(/*release_first=*/true);  // launched with launch_pdl; its consumer is a GEMM (common.h)
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  __half* x = residual_or_x + row * dim;
  __half* out = y + row * dim;
  if constexpr (VEC == 8) {
    rmsnorm_row8<FUSED>(x, FUSED ? delta + row * dim : nullptr, weight, first_weight, dim, eps, scratch,
                        [&](int64_t i, uint4 v) {
                          if constexpr (PACKED) store_packed_x8(out, i, v);
                          else reinterpret_cast<uint4*>(out)[i] = v;
                        });
  } else {
    float sum_squares = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      float v = __half2float(x[i]);
      if constexpr (FUSED) {
        const __half r = __float2half_rn(v + __half2float(delta[row * dim + i]));
        x[i] = r;
        v = __half2float(r);
      }
      sum_squares += v * v;
    }
    sum_squares = block_sum(sum_squares, scratch);
    const float inverse_rms = 1.0f / sqrtf(sum_squares / static_cast<float>(dim) + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      out[i] = __float2half_rn((__half2float(x[i]) * inverse_rms) * weight[i]);
  }
}

// RMSNorm (FUSED: with the residual add) whose output goes straight to per-token int8 codes:
// exactly rmsnorm_kernel's f16 output quantized by quantize_int8_rows (kernels/quantize_int8.cuh),
// without writing or re-reading the f16 row (the W4A8 GEMM's input). VEC 8 only (dim % 8 == 0).
// The normalized values are computed twice (amax pass, codes pass) from the stored row:
// deterministic, so both passes see the same f16 values.
template <bool FUSED>
__global__ void rmsnorm_int8_kernel(__half* residual_or_x, const __half* __restrict__ delta,
                                    const float* __restrict__ weight, int64_t dim, float eps,
                                    int8_t* __restrict__ codes, int64_t ldc, float* __restrict__ scales) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  __half* x = residual_or_x + row * dim;
  const int64_t vectors = dim / 8;
  float sum_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    float v[8];
    load_residual8<FUSED>(x, FUSED ? delta + row * dim : nullptr, i, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_squares += v[e] * v[e];
  }
  sum_squares = block_sum(sum_squares, scratch);
  const float inverse_rms = 1.0f / sqrtf(sum_squares / static_cast<float>(dim) + eps);
  // The f16 outputs rmsnorm_kernel would write, as f32.
  auto normalized = [&](int64_t i, float (&v)[8]) {
    half8_to_float(reinterpret_cast<const uint4*>(x)[i], v);  // this thread's own (stored) values
    float w[8];
    load_weights8(weight, i, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __half2float(__float2half_rn((v[e] * inverse_rms) * w[e]));
  };
  quantize_int8_row(normalized, vectors, codes + row * ldc, scales + row, scratch);
}

}  // namespace qspec::cuda::kernels
