#include "ops/cuda/common.h"
#include "ops/cuda/kernels/gather_columns.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void gather_columns(const f16_bits* x, int64_t rows, int64_t k, int64_t ldx, const int32_t* order, int64_t width,
                    f16_bits* out, int64_t ldo, void* stream) {
  QSPEC_CHECK(rows >= 0 && rows < 65536 && k > 0 && width >= k && ldx >= k && ldo >= width && order != nullptr,
              "cuda::gather_columns: bad shape rows ", rows, " k ", k, " width ", width, " ldx ", ldx, " ldo ", ldo);
  if (rows == 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((width + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
  launch_pdl(kernels::gather_columns_kernel<kThreads>, grid, dim3(kThreads), 0, as_stream(stream),
             reinterpret_cast<const __half*>(x), ldx, k, order, width, reinterpret_cast<__half*>(out), ldo);
  QSPEC_CUDA_CHECK_LAUNCH("gather_columns_kernel");
}

}  // namespace qspec::cuda
