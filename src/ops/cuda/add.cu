#include "ops/cuda/common.h"
#include "ops/cuda/kernels/elementwise.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void add(const f16_bits* a, const f16_bits* b, int64_t count, f16_bits* out, void* stream) {
  QSPEC_CHECK(count >= 0, "cuda::add: negative count ", count);
  if (count == 0) return;
  const auto* x = reinterpret_cast<const __half*>(a);
  const auto* y = reinterpret_cast<const __half*>(b);
  auto* o = reinterpret_cast<__half*>(out);
  const bool vec = is_aligned_16(a) && is_aligned_16(b) && is_aligned_16(out);
  const int64_t vec_count = vec ? count / 8 * 8 : 0;
  if (vec_count > 0) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((vec_count / 8 + 255) / 256, multiprocessor_count() * 16));
    launch_pdl(kernels::add_kernel<8>, dim3(grid), dim3(256), 0, as_stream(stream), x, y, vec_count, o);
    QSPEC_CUDA_CHECK_LAUNCH("add_kernel<8>");
  }
  if (count > vec_count) {
    const int64_t rest = count - vec_count;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((rest + 255) / 256, multiprocessor_count() * 16));
    launch_pdl(kernels::add_kernel<1>, dim3(grid), dim3(256), 0, as_stream(stream),
        x + vec_count, y + vec_count, rest, o + vec_count);
    QSPEC_CUDA_CHECK_LAUNCH("add_kernel<1>");
  }
}

}  // namespace qspec::cuda
