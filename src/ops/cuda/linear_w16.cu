// W16A16 linear: the small-M kernel (kernels/linear_w16_small_m.cuh) for 1-8 tokens, cuBLAS
// (f16 or bf16 operands, f32 accumulation) for the rest and for shapes the kernel does not take.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/linear_w16_small_m.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace {

template <bool BF16>
void launch_small_m(const kernels::W16SmallMParams& params, int blocks, void* stream) {
  launch_pdl(kernels::linear_w16_small_m_kernel<BF16>, dim3(static_cast<unsigned>(blocks)),
             dim3(kernels::kW16SmallMWarps * 32), 0, as_stream(stream), params);
  QSPEC_CUDA_CHECK_LAUNCH("linear_w16_small_m_kernel");
}

}  // namespace

void gemm_w16_cublas(const Blas& blas, const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n,
                     int64_t k, uint16_t* y, int64_t ldy, Dtype16 dtype, void* stream) {
  QSPEC_CHECK(m >= 0 && n > 0 && k > 0 && ldx >= k && ldy >= n && m < (1ll << 31) && n < (1ll << 31) &&
                  k < (1ll << 31) && ldx < (1ll << 31) && ldy < (1ll << 31),
              "cuda::gemm_w16_cublas: bad shape m ", m, " n ", n, " k ", k, " ldx ", ldx, " ldy ", ldy);
  if (m == 0) return;
  const cudaDataType_t type = dtype == Dtype16::f16 ? CUDA_R_16F : CUDA_R_16BF;
  cublasHandle_t handle = static_cast<cublasHandle_t>(blas.handle());
  QSPEC_CUBLAS_CHECK(cublasSetStream(handle, as_stream(stream)));
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[m, n] = x[m, k] W[n, k]^T is column-major y^T (n x m) = W (k x n)^T x^T.
  QSPEC_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, w, type, static_cast<int>(k), x, type,
                                  static_cast<int>(ldx), &beta, y, type, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

bool linear_w16_small_m_takes(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, const uint16_t* y) {
  return m >= 1 && m <= 8 && k % 8 == 0 && is_aligned_16(x) && is_aligned_16(w) && y != nullptr &&
         compute_capability() >= 80;
}

int linear_w16_small_m_k_slices(int64_t k) {
  static const int forced = env_int("QSPEC_W16_KSLICES", 0, 0, 8);
  if (forced == 1 || forced == 2 || forced == 4 || forced == 8) return forced;
  // The most slices that keep >= 256 k a warp: on the H100 8 slices were the fastest or within
  // 0.5 % on every Llama-3-8B shape at 1 and 8 tokens (2 and 4 up to 29 % slower, down at 2;
  // docs/perf-journal/perf-notes-journal-2026.md), also where 8 needs a second wave of blocks.
  const int64_t chunks = (k + kernels::kW16SmallMChunk - 1) / kernels::kW16SmallMChunk;
  int slices = 8;
  while (slices > 1 && chunks / slices < 8) slices /= 2;
  return slices;
}

void linear_w16_small_m(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, uint16_t* y,
                        Dtype16 dtype, void* stream, int k_slices) {
  QSPEC_CHECK(n > 0 && n < (1ll << 31) && k > 0 && k < (1ll << 31) && linear_w16_small_m_takes(x, m, k, w, y),
              "cuda::linear_w16_small_m: takes 1-8 rows, k a multiple of 8 and 16-byte aligned operands on sm_80+ (m ",
              m, " n ", n, " k ", k, ")");
  QSPEC_CHECK(k_slices == 0 || k_slices == 1 || k_slices == 2 || k_slices == 4 || k_slices == 8,
              "cuda::linear_w16_small_m: k_slices ", k_slices, " is not 1, 2, 4 or 8");
  kernels::W16SmallMParams params{};
  params.x = x;
  params.w = w;
  params.y = y;
  params.m = static_cast<int>(m);
  params.n = static_cast<int>(n);
  params.k = static_cast<int>(k);
  params.k_slices = k_slices > 0 ? k_slices : linear_w16_small_m_k_slices(k);
  const int64_t row_blocks = (n + 15) / 16, per_block = kernels::kW16SmallMWarps / params.k_slices;
  const int blocks = static_cast<int>((row_blocks + per_block - 1) / per_block);
  const bool bf16 = dtype == Dtype16::bf16;
  bf16 ? launch_small_m<true>(params, blocks, stream) : launch_small_m<false>(params, blocks, stream);
}

void linear_w16(const Blas& blas, const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, uint16_t* y,
                Dtype16 dtype, void* stream, W16Kernel kernel) {
  QSPEC_CHECK(m >= 0 && n > 0 && k > 0 && m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31),
              "cuda::linear_w16: bad shape m ", m, " n ", n, " k ", k);
  if (m == 0) return;
  if (kernel == W16Kernel::automatic)
    kernel = linear_w16_small_m_default() && linear_w16_small_m_takes(x, m, k, w, y) ? W16Kernel::small_m
                                                                                     : W16Kernel::cublas;
  if (kernel == W16Kernel::small_m) {  // an error where it does not take the shape
    linear_w16_small_m(x, m, k, w, n, y, dtype, stream);
    return;
  }
  gemm_w16_cublas(blas, x, m, k, w, n, k, y, n, dtype, stream);
}

bool linear_w16_small_m_default() {
  static const bool on = env_int("QSPEC_W16_SMALL_M", 1, 0, 1) != 0;
  return on;
}

}  // namespace qspec::cuda
