// 16-bit linear layers on the GPU (f16 / bf16 weights): the small-M kernel and cuBLAS (CPU twin:
// ops/linear.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"

namespace qspec::cuda {

enum class Dtype16 { f16, bf16 };
// Which kernel runs a W16A16 linear. automatic: the small-M kernel where it takes the shape
// (linear_w16_small_m_takes) unless QSPEC_W16_SMALL_M=0, else cuBLAS. small_m: that kernel or an
// error naming why not. cublas: cublasGemmEx always (the benchmarks' baseline).
enum class W16Kernel { automatic, small_m, cublas };
// W16A16: y[m, n] = x[m, k] * W[n, k]^T with f32 accumulation, x, W and y all in `dtype`, rows
// k / k / n apart.
void linear_w16(const Blas& blas, const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                uint16_t* y, Dtype16 dtype, void* stream, W16Kernel kernel = W16Kernel::automatic);
// The small-M kernel (kernels/linear_w16_small_m.cuh) takes 1-8 rows, k a multiple of 8 and
// 16-byte aligned x and W, on sm_80+.
bool linear_w16_small_m_takes(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, const uint16_t* y);
// Whether automatic picks it (QSPEC_W16_SMALL_M, default 1; read once).
bool linear_w16_small_m_default();
// Warps a 16-row block shares (1, 2, 4 or 8; QSPEC_W16_KSLICES forces one, for sweeps).
int linear_w16_small_m_k_slices(int64_t k);
// The small-M kernel itself (an error where it does not take the shape); k_slices 0: the
// launcher's choice.
void linear_w16_small_m(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, uint16_t* y,
                        Dtype16 dtype, void* stream, int k_slices = 0);
// cuBLAS y[m, n] (rows ldy apart) = x[m, k] (rows ldx apart) * W[n, k]^T (rows k apart), f32
// accumulation: linear_w16's cuBLAS path and the dequantize + cuBLAS tails of the 4- and 8-bit
// GEMMs (their weights decoded to f16 first).
void gemm_w16_cublas(const Blas& blas, const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n,
                     int64_t k, uint16_t* y, int64_t ldy, Dtype16 dtype, void* stream);

}  // namespace qspec::cuda
