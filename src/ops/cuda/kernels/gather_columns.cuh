// ARCQuant's channel reorder of activation rows: out[r, j] = x[r, order[j]], zeros in the
// augmented columns past k. One thread per output element (a grid over rows x width / 256): the
// gather reads are scattered within a row that the block's neighbours also read (L1 / L2).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

template <int THREADS>
__global__ __launch_bounds__(THREADS) void gather_columns_kernel(const __half* __restrict__ x, int64_t ldx, int64_t k,
                                                                 const int32_t* __restrict__ order, int64_t width,
                                                                 __half* __restrict__ out, int64_t ldo) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int64_t row = blockIdx.y, j = static_cast<int64_t>(blockIdx.x) * THREADS + threadIdx.x;
  if (j >= width) return;
  out[row * ldo + j] = j < k ? x[row * ldx + __ldg(order + j)] : __float2half_rn(0.0f);
}

}  // namespace qspec::cuda::kernels
