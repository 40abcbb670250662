#include "ops/cuda/common.h"
#include "ops/cuda/kernels/argmax.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace {
template <typename T>
void launch_argmax(const T* logits, int64_t rows, int64_t vocab, int32_t* ids, void* stream) {
  QSPEC_CHECK(rows >= 0 && vocab > 0 && vocab < (1ll << 31), "cuda::argmax: bad shape rows ", rows, " vocab ", vocab);
  if (rows == 0) return;
  QSPEC_CHECK(rows < (1ll << 31), "cuda::argmax: too many rows (", rows, ")");
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vocab % kVec == 0 && is_aligned_16(logits);
  const dim3 grid(static_cast<unsigned>(rows)), block(1024);
  if (vec) launch_pdl(kernels::argmax_kernel<T, kVec>, grid, block, 0, as_stream(stream), logits, vocab, ids);
  else launch_pdl(kernels::argmax_kernel<T, 1>, grid, block, 0, as_stream(stream), logits, vocab, ids);
  QSPEC_CUDA_CHECK_LAUNCH("argmax_kernel");
}
}  // namespace

void argmax_f32(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, void* stream) {
  launch_argmax(logits, rows, vocab, ids, stream);
}
void argmax_f16(const f16_bits* logits, int64_t rows, int64_t vocab, int32_t* ids, void* stream) {
  launch_argmax(reinterpret_cast<const __half*>(logits), rows, vocab, ids, stream);
}

}  // namespace qspec::cuda
