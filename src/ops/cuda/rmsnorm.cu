#include "ops/cuda/common.h"
#include "ops/cuda/kernels/rmsnorm.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace {
template <bool FUSED>
void launch_rmsnorm(__half* x, const __half* delta, const float* weight, int64_t rows, int64_t dim, float eps,
                    __half* y, void* stream, bool y_packed) {
  QSPEC_CHECK(rows >= 0 && dim > 0, "cuda::rmsnorm: bad shape rows ", rows, " dim ", dim);
  if (rows == 0) return;
  QSPEC_CHECK(rows < (1ll << 31), "cuda::rmsnorm: too many rows (", rows, ")");
  const bool vec = dim % 8 == 0 && is_aligned_16(x) && is_aligned_16(y) && is_aligned_16(weight) &&
                   (!FUSED || is_aligned_16(delta));
  const int64_t work = vec ? dim / 8 : dim;
  const int threads = kernels::rmsnorm_block_threads(work);
  const unsigned grid = static_cast<unsigned>(rows);
  if (y_packed) {
    // Packed rows are written out of order: y must not be the x a later vector still reads.
    QSPEC_CHECK(vec && dim % 32 == 0 && y != x, "cuda::rmsnorm: a packed y needs dim % 32 == 0 (dim ", dim,
                "), 16-byte aligned rows and y apart from x");
    launch_pdl(kernels::rmsnorm_kernel<8, FUSED, true>, dim3(grid), dim3(threads), 0, as_stream(stream),
        x, delta, weight, dim, eps, y);
  } else if (vec)
    launch_pdl(kernels::rmsnorm_kernel<8, FUSED>, dim3(grid), dim3(threads), 0, as_stream(stream),
        x, delta, weight, dim, eps, y);
  else
    launch_pdl(kernels::rmsnorm_kernel<1, FUSED>, dim3(grid), dim3(threads), 0, as_stream(stream),
        x, delta, weight, dim, eps, y);
  QSPEC_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}
template <bool FUSED>
void launch_rmsnorm_int8(__half* x, const __half* delta, const float* weight, int64_t rows, int64_t dim, float eps,
                         int8_t* codes, int64_t ldc, float* scales, void* stream) {
  QSPEC_CHECK(rows >= 0 && dim > 0 && dim % 8 == 0 && ldc >= dim && ldc % 8 == 0, "cuda::rmsnorm_int8: bad shape rows ",
              rows, " dim ", dim, " ldc ", ldc, " (dim and ldc multiples of 8)");
  QSPEC_CHECK(is_aligned_16(x) && is_aligned_16(weight) && (!FUSED || is_aligned_16(delta)) &&
                  reinterpret_cast<uintptr_t>(codes) % 8 == 0,
              "cuda::rmsnorm_int8: x, delta and weight must be 16-byte and codes 8-byte aligned");
  if (rows == 0) return;
  QSPEC_CHECK(rows < (1ll << 31), "cuda::rmsnorm_int8: too many rows (", rows, ")");
  const int threads = kernels::rmsnorm_block_threads(dim / 8);
  launch_pdl(kernels::rmsnorm_int8_kernel<FUSED>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0,
             as_stream(stream), x, delta, weight, dim, eps, codes, ldc, scales);
  QSPEC_CUDA_CHECK_LAUNCH("rmsnorm_int8_kernel");
}
}  // namespace

void rmsnorm_int8(const f16_bits* x, const float* weight, int64_t rows, int64_t dim, float eps, int8_t* codes,
                  int64_t ldc, float* scales, void* stream) {
  launch_rmsnorm_int8<false>(const_cast<__half*>(reinterpret_cast<const __half*>(x)), nullptr, weight, rows, dim, eps,
                             codes, ldc, scales, stream);
}

void add_rmsnorm_int8(f16_bits* residual, const f16_bits* delta, const float* weight, int64_t rows, int64_t dim,
                      float eps, int8_t* codes, int64_t ldc, float* scales, void* stream) {
  launch_rmsnorm_int8<true>(reinterpret_cast<__half*>(residual), reinterpret_cast<const __half*>(delta), weight, rows,
                            dim, eps, codes, ldc, scales, stream);
}

void rmsnorm(const f16_bits* x, const float* weight, int64_t rows, int64_t dim, float eps, f16_bits* y, void* stream,
             bool y_packed) {
  // The plain variant only reads x (FUSED = false never writes through it).
  launch_rmsnorm<false>(const_cast<__half*>(reinterpret_cast<const __half*>(x)), nullptr, weight, rows, dim, eps,
                        reinterpret_cast<__half*>(y), stream, y_packed);
}

void add_rmsnorm(f16_bits* residual, const f16_bits* delta, const float* weight, int64_t rows, int64_t dim, float eps,
                 f16_bits* y, void* stream, bool y_packed) {
  QSPEC_CHECK(static_cast<const void*>(y) != static_cast<const void*>(residual) &&
                  static_cast<const void*>(y) != static_cast<const void*>(delta),
              "cuda::add_rmsnorm: y must not alias residual or delta");
  launch_rmsnorm<true>(reinterpret_cast<__half*>(residual), reinterpret_cast<const __half*>(delta), weight, rows, dim,
                       eps, reinterpret_cast<__half*>(y), stream, y_packed);
}

}  // namespace qspec::cuda
