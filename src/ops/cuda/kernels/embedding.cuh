// Embedding gather: out[t, :] = table[ids[t], :] (zeros for an id outside the table).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

// One block per token; VEC halves per access (8: 16-byte accesses, needs dim % 8 == 0).
template <int VEC>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const __half* __restrict__ table, int64_t vocab,
                                 int64_t dim, __half* __restrict__ out) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  using Vec = typename std::conditional<VEC == 8, uint4, __half>::type;
  const int64_t token = blockIdx.x;
  const int32_t id = ids[token];
  const bool valid = id >= 0 && id < vocab;
  const Vec* src = reinterpret_cast<const Vec*>(table + (valid ? id : 0) * dim);
  Vec* dst = reinterpret_cast<Vec*>(out + token * dim);
  for (int64_t i = threadIdx.x; i < dim / VEC; i += blockDim.x) {
    Vec value;
    if (valid) {
      value = src[i];
    } else {
      if constexpr (VEC == 8) value = make_uint4(0, 0, 0, 0);
      else value = __float2half(0.0f);
    }
    dst[i] = value;
  }
}

}  // namespace qspec::cuda::kernels
