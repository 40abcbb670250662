#include "ops/cuda/common.h"
#include "ops/cuda/kernels/quantize_int8.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void quantize_int8_rows(const f16_bits* x, int64_t rows, int64_t k, int64_t ldx, int8_t* codes, int64_t ldc,
                        float* scales, void* stream) {
  QSPEC_CHECK(rows >= 0 && k > 0 && k % 8 == 0 && ldx >= k && ldx % 8 == 0 && ldc >= k && ldc % 8 == 0,
              "cuda::quantize_int8_rows: bad shape rows ", rows, " k ", k, " ldx ", ldx, " ldc ", ldc,
              " (k, ldx and ldc must be multiples of 8)");
  QSPEC_CHECK(is_aligned_16(x) && reinterpret_cast<uintptr_t>(codes) % 8 == 0,
              "cuda::quantize_int8_rows: x must be 16-byte and codes 8-byte aligned");
  if (rows == 0) return;
  QSPEC_CHECK(rows < (1ll << 31), "cuda::quantize_int8_rows: too many rows (", rows, ")");
  const int threads = static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(32, (k / 8 + 31) / 32 * 32)));
  launch_pdl(kernels::quantize_int8_rows_kernel<8>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0,
             as_stream(stream), reinterpret_cast<const __half*>(x), ldx, k, codes, ldc, scales);
  QSPEC_CUDA_CHECK_LAUNCH("quantize_int8_rows_kernel");
}

}  // namespace qspec::cuda
