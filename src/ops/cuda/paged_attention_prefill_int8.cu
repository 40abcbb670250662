// The prefill / verify attention over an int8 KV cache: the prefill kernel's INT8 instances, in a
// file of their own so that they compile beside the f16 ones.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/paged_attention_prefill.cuh"

namespace qspec::cuda::detail {

void launch_prefill_int8(const kernels::PrefillParams& params, int64_t head_dim, int key_warps, dim3 grid,
                         cudaStream_t stream) {
  if (head_dim == 32) launch_prefill_kw<32, true>(key_warps, params, grid, stream);
  else if (head_dim == 64) launch_prefill_kw<64, true>(key_warps, params, grid, stream);
  else if (head_dim == 128) launch_prefill_kw<128, true>(key_warps, params, grid, stream);
  else launch_prefill_kw<256, true>(key_warps, params, grid, stream);
}

int prefill_resident_int8(int64_t head_dim, int key_warps) {
  return head_dim == 32    ? prefill_resident_kw<32, true>(key_warps)
         : head_dim == 64  ? prefill_resident_kw<64, true>(key_warps)
         : head_dim == 128 ? prefill_resident_kw<128, true>(key_warps)
                           : prefill_resident_kw<256, true>(key_warps);
}

}  // namespace qspec::cuda::detail
