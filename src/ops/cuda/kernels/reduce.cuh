// Block-wide reductions for the row kernels (sum of squares, absolute maxima, argmax).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

struct SumOp {
  __device__ static float apply(float a, float b) { return a + b; }
  static constexpr float kIdentity = 0.0f;
};
struct MaxOp {
  __device__ static float apply(float a, float b) { return fmaxf(a, b); }
  static constexpr float kIdentity = -INFINITY;
};

// The largest |v| of a block of 8 values a lane over groups of LANES lanes (a power of two <= 32,
// the groups aligned): the activation quantizers' scale blocks, the int8 KV cache's rows. Every
// lane of the warp must call it. fmaxf is exact, so the order of the shuffles changes no bit.
template <int LANES>
__device__ __forceinline__ float block_abs_max8(const float (&v)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
#pragma unroll
  for (int offset = 1; offset < LANES; offset <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  return amax;
}

template <class Op>
__device__ __forceinline__ float warp_reduce(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = Op::apply(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Reduction over the block; every thread gets the result. scratch: 32 floats of shared memory.
template <class Op>
__device__ __forceinline__ float block_reduce(float value, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  value = warp_reduce<Op>(value);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < warps ? scratch[lane] : Op::kIdentity;
  return warp_reduce<Op>(value);
}

__device__ __forceinline__ float warp_sum(float value) { return warp_reduce<SumOp>(value); }
__device__ __forceinline__ float warp_max(float value) { return warp_reduce<MaxOp>(value); }
__device__ __forceinline__ float block_sum(float value, float* scratch) { return block_reduce<SumOp>(value, scratch); }
__device__ __forceinline__ float block_max(float value, float* scratch) { return block_reduce<MaxOp>(value, scratch); }

// The largest |value| over a row of `vectors` 8-value vectors (load(i, v) yields vector i), and
// whether every value is finite; every thread of the block gets both (the quantizers' first pass).
template <class Load>
__device__ __forceinline__ float row_abs_max(const Load& load, int64_t vectors, float* scratch, bool* all_finite) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    float v[8];
    load(i, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      amax = fmaxf(amax, fabsf(v[e]));
      finite = finite && isfinite(v[e]);
    }
  }
  *all_finite = __syncthreads_and(finite);
  return block_max(amax, scratch);
}

}  // namespace qspec::cuda::kernels
