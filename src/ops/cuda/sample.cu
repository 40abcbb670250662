#include "ops/cuda/common.h"
#include "ops/cuda/kernels/sample.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void sample_logits_f16(const f16_bits* logits, int64_t vocab, const SampleRowParams* params, int64_t count,
                       const int32_t* penalty_ids, int32_t* ids, void* stream) {
  QSPEC_CHECK(vocab > 0 && vocab < (1ll << 31), "cuda::sample_logits: bad vocab ", vocab);
  QSPEC_CHECK(count >= 0 && count < (1ll << 31), "cuda::sample_logits: bad row count ", count);
  if (count == 0) return;
  // The penalty bitmap lives in shared memory (one bit an id): room for every id of any
  // vocabulary up to 393k in the default 48 KB.
  const int bitmap_words = penalty_ids != nullptr ? static_cast<int>((vocab + 31) / 32) : 0;
  const size_t smem = static_cast<size_t>(bitmap_words) * 4;
  QSPEC_CHECK(smem <= 48 * 1024, "cuda::sample_logits: a vocabulary of ", vocab,
              " ids is too large for the repetition-penalty bitmap (at most 393216)");
  launch_pdl(kernels::sample_logits_kernel<SampleRowParams>, dim3(static_cast<unsigned>(count)),
             dim3(kernels::kSampleThreads), smem, as_stream(stream), reinterpret_cast<const __half*>(logits),
             static_cast<int>(vocab), params, penalty_ids, bitmap_words, ids);
  QSPEC_CUDA_CHECK_LAUNCH("sample_logits_kernel");
}

}  // namespace qspec::cuda
