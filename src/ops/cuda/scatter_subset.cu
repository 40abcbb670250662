// cuda::scatter_subset_logits (ops/cuda/sample.h): a QSpec draft's vocabulary-subset logits
// mapped back to whole rows of token ids.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/scatter_subset.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void scatter_subset_logits(const f16_bits* subset, int64_t rows, int64_t n, const int32_t* ids, int64_t vocab,
                           f16_bits* out, void* stream) {
  QSPEC_CHECK(rows >= 0 && n > 0 && n <= vocab && vocab < (1ll << 31), "cuda::scatter_subset_logits: bad shape rows ",
              rows, " n ", n, " vocab ", vocab);
  if (rows == 0) return;
  QSPEC_CHECK(rows < (1ll << 31), "cuda::scatter_subset_logits: too many rows (", rows, ")");
  launch_pdl(kernels::scatter_subset_logits_kernel, dim3(static_cast<unsigned>(rows)), dim3(1024), 0,
             as_stream(stream), reinterpret_cast<const __half*>(subset), n, ids, vocab, reinterpret_cast<__half*>(out));
  QSPEC_CUDA_CHECK_LAUNCH("scatter_subset_logits_kernel");
}

}  // namespace qspec::cuda
