// Merges split-K attention partials: out = sum_i o_i 2^(m_i - M) / sum_i l_i 2^(m_i - M).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

// Partials of split s, query row r (= token * num_heads + head): o at part_o[(s * rows + r) * D],
// (m, l) at part_ml[s * rows + r], m in log2 units, o unnormalised. An empty split has l = 0.
// One block per row, threads over head_dim.
__global__ void attention_combine_kernel(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                                         int splits, int64_t rows, int num_heads, int head_dim,
                                         __half* __restrict__ out, int64_t out_stride) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int64_t row = blockIdx.x;
  float global_max = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    const float2 ml = part_ml[s * rows + row];
    if (ml.y > 0.0f) global_max = fmaxf(global_max, ml.x);
  }
  float denominator = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float2 ml = part_ml[s * rows + row];
    if (ml.y > 0.0f) denominator += ml.y * exp2f(ml.x - global_max);
  }
  const int64_t token = row / num_heads, head = row % num_heads;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float2 ml = part_ml[s * rows + row];
      if (ml.y > 0.0f) sum += part_o[(s * rows + row) * head_dim + d] * exp2f(ml.x - global_max);
    }
    out[token * out_stride + head * head_dim + d] = __float2half_rn(denominator > 0.0f ? sum / denominator : 0.0f);
  }
}

}  // namespace qspec::cuda::kernels
