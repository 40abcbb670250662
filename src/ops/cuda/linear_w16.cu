// W16A16 linear through cuBLAS (f16 or bf16 operands, f32 accumulation).
#include "ops/cuda/common.h"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void linear_w16(const Blas& blas, const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, uint16_t* y,
                Dtype16 dtype, void* stream) {
  QSPEC_CHECK(m >= 0 && n > 0 && k > 0 && m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31),
              "cuda::linear_w16: bad shape m ", m, " n ", n, " k ", k);
  if (m == 0) return;
  const cudaDataType_t type = dtype == Dtype16::f16 ? CUDA_R_16F : CUDA_R_16BF;
  cublasHandle_t handle = static_cast<cublasHandle_t>(blas.handle());
  QSPEC_CUBLAS_CHECK(cublasSetStream(handle, as_stream(stream)));
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[m, n] = x[m, k] W[n, k]^T is column-major y^T (n x m) = W (k x n)^T x^T.
  QSPEC_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, w, type, static_cast<int>(k), x, type,
                                  static_cast<int>(k), &beta, y, type, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

}  // namespace qspec::cuda
