// A vocabulary subset's logits as whole rows (cuda::scatter_subset_logits, CPU twin
// cpu::scatter_subset_logits): -inf everywhere, then each subset logit at its token id.
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

// One block per row: the block fills its row, syncs, then scatters (so no other block's fill can
// land after a scattered value). ids are distinct, so the scatter writes never collide.
__global__ void scatter_subset_logits_kernel(const __half* __restrict__ subset, int64_t n,
                                             const int32_t* __restrict__ ids, int64_t vocab,
                                             __half* __restrict__ out) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  __half* row = out + static_cast<int64_t>(blockIdx.x) * vocab;
  const __half* values = subset + static_cast<int64_t>(blockIdx.x) * n;
  const __half minus_infinity = __ushort_as_half(0xFC00);
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) row[i] = minus_infinity;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) row[ids[j]] = values[j];
}

}  // namespace qspec::cuda::kernels
