// RMSNorm (and the fused residual add + RMSNorm) on f16 rows with f32 statistics.
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/cuda/common.h"
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

// The RMSNorm of one row in 16-byte vectors (dim % 8 == 0) by one block; FUSED: residual =
// f16(residual + delta) first, stored back. store(i, v) receives the f16 output vector i. A
// thread's first 8 values stay in registers across the reduction and their weights are loaded
// before it (launched with rmsnorm_block_threads, every thread has one vector up to dim 8192):
// the second pass then waits on no memory. rmsnorm_kernel writes the vectors to global memory,
// rmsnorm_quantize_kernel to shared memory: the same f16 values.
template <bool FUSED, class Store>
__device__ __forceinline__ void rmsnorm_row8(__half* x, const __half* __restrict__ delta_row,
                                             const float* __restrict__ weight, int64_t dim, float eps,
                                             float* scratch, const Store& store) {
  const int64_t vectors = dim / 8;
  const bool has_first = threadIdx.x < vectors;
  float first[8] = {}, first_weight[8] = {};
  float sum_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    float v[8];
    load_residual8<FUSED>(x, delta_row, i, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_squares += v[e] * v[e];
    if (i == threadIdx.x) {
      load_weights8(weight, i, first_weight);
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

// add_rmsnorm's bits (rmsnorm_kernel<8, true>) for `rows` rows (dim % 8 == 0, dim <= 8192),
// computed by one block of BLOCK_WARPS warps of another kernel: the last block of the GEMM whose
// output is delta (kernels/w4a16_preload.cuh, ADD_NORM). residual = f16(residual + delta) in
// place, normed = rmsnorm(residual) * weight. The sums keep rmsnorm_kernel's order: its
// norm_threads threads (rmsnorm_block_threads(dim / 8), one vector each up to dim 8192) are
// played as virtual warps, each reduced by warp_sum, and the warps' sums are added as
// block_reduce adds them. delta (rows ld_delta apart) is read through L2: other blocks wrote it.
// A thread's (row, virtual warp) items go 4 at a time, their loads issued together; pass 2 reads
// back only the thread's own residual stores. scratch: 33 * rows floats of shared memory.
template <int BLOCK_WARPS>
__device__ __forceinline__ void add_rmsnorm_rows_in_block(__half* residual, const __half* delta, int64_t ld_delta,
                                                          const float* __restrict__ weight, __half* normed, int rows,
                                                          int64_t dim, float eps, int norm_threads, float* scratch) {
  constexpr int kBatch = 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int vectors = static_cast<int>(dim / 8), norm_warps = norm_threads / 32;
  const int per_row = (norm_warps - warp + BLOCK_WARPS - 1) / BLOCK_WARPS, items = rows * per_row;
  float* inverse_rms = scratch + 32 * rows;
  // Item u of this warp: row r, virtual warp vw, vector i (of virtual thread vw * 32 + lane).
  auto item_at = [&](int item, int& r, int& vw, int& i) {
    r = item / per_row;
    vw = warp + (item % per_row) * BLOCK_WARPS;
    i = vw * 32 + lane;
  };
  for (int base = 0; base < items; base += kBatch) {
    uint4 x[kBatch], d[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      int r, vw, i;
      item_at(base + u, r, vw, i);
      if (base + u < items && i < vectors) {
        x[u] = reinterpret_cast<const uint4*>(residual + r * dim)[i];
        d[u] = __ldcg(reinterpret_cast<const uint4*>(delta + r * ld_delta) + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      int r, vw, i;
      item_at(base + u, r, vw, i);
      if (base + u >= items) break;  // uniform across the warp
      float sum_squares = 0.0f;
      if (i < vectors) {
        float v[8], dv[8];
        half8_to_float(x[u], v);
        half8_to_float(d[u], dv);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = __half2float(__float2half_rn(v[e] + dv[e]));
#pragma unroll
        for (int e = 0; e < 8; ++e) sum_squares += v[e] * v[e];
        reinterpret_cast<uint4*>(residual + r * dim)[i] = float8_to_half(v);
      }
      sum_squares = warp_sum(sum_squares);
      if (lane == 0) scratch[32 * r + vw] = sum_squares;
    }
  }
  __syncthreads();
  // block_reduce's second step, a row a warp.
  for (int r = warp; r < rows; r += BLOCK_WARPS) {
    const float sum_squares = warp_sum(lane < norm_warps ? scratch[32 * r + lane] : 0.0f);
    if (lane == 0) inverse_rms[r] = 1.0f / sqrtf(sum_squares / static_cast<float>(dim) + eps);
  }
  __syncthreads();
  // Pass 2: (x * inverse_rms) * weight, as rmsnorm_row8 rounds it.
  for (int base = 0; base < items; base += kBatch) {
    uint4 x[kBatch];
    float w[kBatch][8];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      int r, vw, i;
      item_at(base + u, r, vw, i);
      if (base + u < items && i < vectors) {
        x[u] = reinterpret_cast<const uint4*>(residual + r * dim)[i];  // this thread's own store
        load_weights8(weight, i, w[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      int r, vw, i;
      item_at(base + u, r, vw, i);
      if (base + u >= items || i >= vectors) continue;
      float v[8];
      half8_to_float(x[u], v);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = (v[e] * inverse_rms[r]) * w[u][e];
      reinterpret_cast<uint4*>(normed + r * dim)[i] = float8_to_half(v);
    }
  }
}

// One block per row. FUSED: residual = f16(residual + delta), stored back, then normalized.
// VEC 8: 16-byte accesses (dim % 8 == 0, rmsnorm_row8), else 1.
template <int VEC, bool FUSED>
__global__ void rmsnorm_kernel(__half* residual_or_x, const __half* __restrict__ delta,
                               const float* __restrict__ weight, int64_t dim, float eps, __half* y) {
  pdl_prologue(/*release_first=*/true);  // launched with launch_pdl; its consumer is a GEMM (common.h)
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  __half* x = residual_or_x + row * dim;
  __half* out = y + row * dim;
  if constexpr (VEC == 8) {
    rmsnorm_row8<FUSED>(x, FUSED ? delta + row * dim : nullptr, weight, dim, eps, scratch,
                        [&](int64_t i, uint4 v) { reinterpret_cast<uint4*>(out)[i] = v; });
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
