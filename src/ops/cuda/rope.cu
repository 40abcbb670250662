#include "ops/cuda/common.h"
#include "ops/cuda/kernels/rope.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void rope(f16_bits* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
          const float* inv_freq, float attention_scaling, void* stream) {
  QSPEC_CHECK(tokens >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0 && row_stride >= heads * head_dim,
              "cuda::rope: bad shape tokens ", tokens, " heads ", heads, " head_dim ", head_dim, " row_stride ",
              row_stride);
  if (tokens == 0) return;
  QSPEC_CHECK(tokens < (1ll << 31), "cuda::rope: too many tokens (", tokens, ")");
  const int64_t work = heads * head_dim / 2;
  const int threads = static_cast<int>(std::min<int64_t>(512, (work + 31) / 32 * 32));
  launch_pdl(kernels::rope_kernel, dim3(static_cast<unsigned>(tokens)), dim3(threads), 0, as_stream(stream),
      reinterpret_cast<__half*>(x), heads, head_dim, row_stride, positions, inv_freq, attention_scaling);
  QSPEC_CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace qspec::cuda
