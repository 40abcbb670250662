// Merges split-K attention partials: out = sum_i o_i 2^(m_i - M) / sum_i l_i 2^(m_i - M).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

// Partials of split s, query row r (= token * num_heads + head): o at part_o[(s * rows + r) * D],
// (m, l) at part_ml[s * rows + r], m in log2 units, o unnormalised. An empty split has l = 0.
// The threads of a block (thread, threads) share row `row`'s head_dim outputs. Loads go through
// L2 (__ldcg): the decode kernel calls this in the block that finished last, right after other
// blocks wrote the partials. One function for both callers keeps their results bitwise equal.
__device__ __forceinline__ void combine_attention_row(const float* __restrict__ part_o,
                                                      const float2* __restrict__ part_ml, int splits, int64_t rows,
                                                      int64_t row, int head_dim, __half* __restrict__ out_row,
                                                      int thread, int threads) {
  float global_max = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    const float2 ml = __ldcg(part_ml + s * rows + row);
    if (ml.y > 0.0f) global_max = fmaxf(global_max, ml.x);
  }
  float denominator = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float2 ml = __ldcg(part_ml + s * rows + row);
    if (ml.y > 0.0f) denominator += ml.y * exp2f(ml.x - global_max);
  }
  for (int d = thread; d < head_dim; d += threads) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float2 ml = __ldcg(part_ml + s * rows + row);
      if (ml.y > 0.0f) sum += __ldcg(part_o + (s * rows + row) * head_dim + d) * exp2f(ml.x - global_max);
    }
    out_row[d] = __float2half_rn(denominator > 0.0f ? sum / denominator : 0.0f);
  }
}

// One block per row, threads over head_dim (the prefill path; decode merges in its last block).
// Static: the decode kernel's header includes this one for combine_attention_row (a non-template
// kernel defined in two .cu files would clash at link time).
static __global__ void attention_combine_kernel(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                                         int splits, int64_t rows, int num_heads, int head_dim,
                                         __half* __restrict__ out, int64_t out_stride) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int64_t row = blockIdx.x;
  const int64_t token = row / num_heads, head = row % num_heads;
  combine_attention_row(part_o, part_ml, splits, rows, row, head_dim, out + token * out_stride + head * head_dim,
                        threadIdx.x, blockDim.x);
}

}  // namespace qspec::cuda::kernels
