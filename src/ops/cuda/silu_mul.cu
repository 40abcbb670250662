#include "ops/cuda/common.h"
#include "ops/cuda/kernels/elementwise.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void silu_mul(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride, f16_bits* out,
              void* stream) {
  QSPEC_CHECK(rows >= 0 && cols > 0 && in_stride >= cols, "cuda::silu_mul: bad shape rows ", rows, " cols ", cols,
              " in_stride ", in_stride);
  if (rows == 0) return;
  const bool vec =
      cols % 8 == 0 && in_stride % 8 == 0 && is_aligned_16(gate) && is_aligned_16(up) && is_aligned_16(out);
  const int64_t work = rows * (vec ? cols / 8 : cols);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, multiprocessor_count() * 16));
  const auto* g = reinterpret_cast<const __half*>(gate);
  const auto* u = reinterpret_cast<const __half*>(up);
  auto* o = reinterpret_cast<__half*>(out);
  if (vec)
    launch_pdl(kernels::silu_mul_kernel<8>, dim3(grid), dim3(256), 0, as_stream(stream),
        g, u, rows, cols, in_stride, o);
  else
    launch_pdl(kernels::silu_mul_kernel<1>, dim3(grid), dim3(256), 0, as_stream(stream),
        g, u, rows, cols, in_stride, o);
  QSPEC_CUDA_CHECK_LAUNCH("silu_mul_kernel");
}

void silu_mul_int8(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride,
                   int8_t* codes, int64_t ldc, float* scales, void* stream) {
  QSPEC_CHECK(rows >= 0 && cols > 0 && cols % 8 == 0 && in_stride >= cols && in_stride % 8 == 0 && ldc >= cols &&
                  ldc % 8 == 0,
              "cuda::silu_mul_int8: bad shape rows ", rows, " cols ", cols, " in_stride ", in_stride, " ldc ", ldc,
              " (cols, in_stride and ldc multiples of 8)");
  QSPEC_CHECK(is_aligned_16(gate) && is_aligned_16(up) && reinterpret_cast<uintptr_t>(codes) % 8 == 0,
              "cuda::silu_mul_int8: gate and up must be 16-byte and codes 8-byte aligned");
  if (rows == 0) return;
  QSPEC_CHECK(rows < (1ll << 31), "cuda::silu_mul_int8: too many rows (", rows, ")");
  const int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (cols / 8 + 31) / 32 * 32)));
  launch_pdl(kernels::silu_mul_int8_kernel<8>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, as_stream(stream),
             reinterpret_cast<const __half*>(gate), reinterpret_cast<const __half*>(up), cols, in_stride, codes, ldc,
             scales);
  QSPEC_CUDA_CHECK_LAUNCH("silu_mul_int8_kernel");
}

}  // namespace qspec::cuda
