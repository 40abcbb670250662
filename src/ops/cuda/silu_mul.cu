#include "ops/cuda/common.h"
#include "ops/cuda/kernels/elementwise.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void silu_mul(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride, f16_bits* out,
              void* stream, NextKernel next, int64_t out_stride) {
  if (out_stride == 0) out_stride = cols;
  QSPEC_CHECK(rows >= 0 && cols > 0 && in_stride >= cols && out_stride >= cols, "cuda::silu_mul: bad shape rows ",
              rows, " cols ", cols, " in_stride ", in_stride, " out_stride ", out_stride);
  if (rows == 0) return;
  const bool vec = cols % 8 == 0 && in_stride % 8 == 0 && out_stride % 8 == 0 && is_aligned_16(gate) &&
                   is_aligned_16(up) && is_aligned_16(out);
  const int64_t work = rows * (vec ? cols / 8 : cols);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, multiprocessor_count() * 16));
  const auto* g = reinterpret_cast<const __half*>(gate);
  const auto* u = reinterpret_cast<const __half*>(up);
  auto* o = reinterpret_cast<__half*>(out);
  const bool release_first = next == NextKernel::w4a16_gemm;  // pdl_prologue (common.h)
  if (vec)
    launch_pdl(kernels::silu_mul_kernel<8>, dim3(grid), dim3(256), 0, as_stream(stream),
        g, u, rows, cols, in_stride, o, out_stride, release_first);
  else
    launch_pdl(kernels::silu_mul_kernel<1>, dim3(grid), dim3(256), 0, as_stream(stream),
        g, u, rows, cols, in_stride, o, out_stride, release_first);
  QSPEC_CUDA_CHECK_LAUNCH("silu_mul_kernel");
}

}  // namespace qspec::cuda
