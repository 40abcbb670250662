// Tensor-core ceilings measured on this GPU (benchmarks), and cuBLAS's int8 GEMM as a reference.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"

namespace qspec::cuda {

// ---- tensor-core ceilings (benchmarks) ----------------------------------------------------

// The measured mma.sync throughput of one operand type over the whole GPU, TOP/s (s8:
// m16n8k32 s8 -> s32; f16: m16n8k16 f16 -> f32), from a kernel that keeps 8 independent mma
// chains a warp and 8 blocks of 256 threads a multiprocessor busy; median of 9 timed launches.
enum class MmaType { s8, f16, e4m3 };  // e4m3: m16n8k32 e4m3 -> f32, compute capability 8.9+
double mma_sync_peak_tops(MmaType type, void* stream);
// The same for Hopper's warpgroup mma (m64n128k32 s8 -> s32, operands in shared memory, two
// warpgroups a block, two blocks a multiprocessor). sm_90a builds on compute capability 9.0 only.
double wgmma_s8_peak_tops(void* stream);

// cuBLAS's int8 GEMM, c[m, n] = a[m, k] b[n, k]^T in int32 (row-major, k % 4 == 0): the library
// baseline of the W4A8 GEMM at large M (it has no group scales, so it bounds what an int8
// tensor-core GEMM of the shape costs on this GPU).
void gemm_s8_cublas(const Blas& blas, const int8_t* a, int64_t m, int64_t k, const int8_t* b, int64_t n, int32_t* c,
                    void* stream);

}  // namespace qspec::cuda
