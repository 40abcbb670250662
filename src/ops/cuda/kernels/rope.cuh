// Rotary position embedding in place, Hugging Face rotate_half convention (cpu::rope).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

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
    // f32 angle as on the CPU, then accurate sincosf (no fast-math: angles reach thousands).
    const float angle = __fmul_rn(position, inv_freq[i]);
    float sine, cosine;
    sincosf(angle, &sine, &cosine);
    cosine = __fmul_rn(cosine, attention_scaling);
    sine = __fmul_rn(sine, attention_scaling);
    __half* pair = row + head * head_dim + i;
    const float first = __half2float(pair[0]), second = __half2float(pair[half]);
    const __half rotated_first = __float2half_rn(__fsub_rn(__fmul_rn(first, cosine), __fmul_rn(second, sine)));
    const __half rotated_second = __float2half_rn(__fadd_rn(__fmul_rn(second, cosine), __fmul_rn(first, sine)));
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
