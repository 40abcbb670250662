#include "ops/cuda/common.h"
#include "ops/cuda/kernels/embedding.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void embedding(const int32_t* ids, int64_t tokens, const f16_bits* table, int64_t vocab, int64_t dim, f16_bits* out,
               void* stream) {
  QSPEC_CHECK(tokens >= 0 && vocab > 0 && dim > 0, "cuda::embedding: bad shape tokens ", tokens, " vocab ", vocab,
              " dim ", dim);
  if (tokens == 0) return;
  QSPEC_CHECK(tokens < (1ll << 31), "cuda::embedding: too many tokens (", tokens, ")");
  const auto* t = reinterpret_cast<const __half*>(table);
  auto* o = reinterpret_cast<__half*>(out);
  const bool vec = dim % 8 == 0 && is_aligned_16(table) && is_aligned_16(out);
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, vec ? dim / 8 : dim)));
  if (vec)
    launch_pdl(kernels::embedding_kernel<8>, dim3(static_cast<unsigned>(tokens)), dim3(threads), 0, as_stream(stream),
        ids, t, vocab, dim, o);
  else
    launch_pdl(kernels::embedding_kernel<1>, dim3(static_cast<unsigned>(tokens)), dim3(threads), 0, as_stream(stream),
        ids, t, vocab, dim, o);
  QSPEC_CUDA_CHECK_LAUNCH("embedding_kernel");
}

}  // namespace qspec::cuda
