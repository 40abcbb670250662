// Rotary position embedding in place, Hugging Face rotate_half convention (cpu::rope).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

// The rotation of pair i at `position`: f32 angle as on the CPU, then accurate sincosf (no
// fast-math: angles reach thousands), both scaled. Shared with the decode attention that folds
// RoPE in (paged_attention_decode_tiles.cuh), so the two give the same bits.
__device__ __forceinline__ void rope_cos_sin(float position, float inv_freq_i, float attention_scaling, float& cosine,
                                             float& sine) {
  sincosf(__fmul_rn(position, inv_freq_i), &sine, &cosine);
  cosine = __fmul_rn(cosine, attention_scaling);
  sine = __fmul_rn(sine, attention_scaling);
}
// A rotated pair (first = element i, second = element i + head_dim / 2) in f32; the callers round
// each to f16 once (__float2half_rn here, float8_to_half's pack in the decode attention: same bits).
__device__ __forceinline__ float rope_first(float first, float second, float cosine, float sine) {
  return __fsub_rn(__fmul_rn(first, cosine), __fmul_rn(second, sine));
}
__device__ __forceinline__ float rope_second(float first, float second, float cosine, float sine) {
  return __fadd_rn(__fmul_rn(second, cosine), __fmul_rn(first, sine));
}

// Rotates the `heads` heads of one token's row: items (head, i < head_dim / 2) from `first_item`
// on, `stride` apart, from thread `thread` (the whole row: threadIdx.x, blockDim.x). With k_out,
// heads from `first_k_head` on are also stored there (head - first_k_head) * head_dim apart:
// rope_kv_write writes the rotated K to the cache without a barrier and a re-read.
__device__ __forceinline__ void rope_row(__half* row, int64_t heads, int64_t head_dim, float position,
                                         const float* __restrict__ inv_freq, float attention_scaling,
                                         int64_t first_item, int64_t stride, int64_t first_k_head = 0,
                                         __half* __restrict__ k_out = nullptr) {
  const int64_t half = head_dim / 2;
  for (int64_t item = first_item; item < heads * half; item += stride) {
    const int64_t head = item / half, i = item % half;
    float cosine, sine;
    rope_cos_sin(position, inv_freq[i], attention_scaling, cosine, sine);
    __half* pair = row + head * head_dim + i;
    const float first = __half2float(pair[0]), second = __half2float(pair[half]);
    const __half rotated_first = __float2half_rn(rope_first(first, second, cosine, sine));
    const __half rotated_second = __float2half_rn(rope_second(first, second, cosine, sine));
    pair[0] = rotated_first;
    pair[half] = rotated_second;
    if (k_out != nullptr && head >= first_k_head) {
      __half* k_pair = k_out + (head - first_k_head) * head_dim + i;
      k_pair[0] = rotated_first;
      k_pair[half] = rotated_second;
    }
  }
}

// One block per token. Static: this header is included by rope.cu and rope_kv_write.cu (a
// non-template kernel defined in both would clash at link time).
static __global__ void rope_kernel(__half* x, int64_t heads, int64_t head_dim, int64_t row_stride,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                            float attention_scaling) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int64_t token = blockIdx.x;
  rope_row(x + token * row_stride, heads, head_dim, static_cast<float>(positions[token]), inv_freq, attention_scaling,
           threadIdx.x, blockDim.x);
}

}  // namespace qspec::cuda::kernels
