// Tensor-core ceilings for the roofline of compute-bound kernels, measured rather than taken
// from a data sheet: the mma.sync throughput of the operand types the GEMMs use, and cuBLAS's
// plain int8 GEMM (the library baseline the W4A8 kernel is compared with at large M).
#include <cublas_v2.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/wgmma.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace {

constexpr int kPeakChains = 8;  // independent accumulators a warp: enough to cover the mma latency

// kPeakChains independent accumulators a thread, each fed `iterations` mma by mma(acc); their sums
// reach `sink` only when an impossible value appears (int: xor, float: sum).
template <class Acc, class Mma>
__device__ __forceinline__ void mma_chains(int iterations, uint32_t* sink, Mma&& mma) {
  Acc acc[kPeakChains][4] = {};
  for (int i = 0; i < iterations; ++i)
#pragma unroll
    for (int c = 0; c < kPeakChains; ++c) mma(acc[c]);
  Acc x = 0;
#pragma unroll
  for (int c = 0; c < kPeakChains; ++c) {
    if constexpr (std::is_integral_v<Acc>) x ^= acc[c][0] ^ acc[c][1] ^ acc[c][2] ^ acc[c][3];
    else x += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  }
  if (x == (std::is_integral_v<Acc> ? Acc(0x7fffffff) : Acc(-1))) *sink = 1;
}

// Every warp issues `iterations` x kPeakChains mma on register operands. The operands depend on
// the thread (nothing folds) and the sums go to `sink` only when an impossible value appears,
// so the mma stay live without a store per warp.
template <MmaType TYPE>
__global__ __launch_bounds__(256) void mma_peak_kernel(int iterations, uint32_t* sink) {
  const uint32_t seed = threadIdx.x * 0x9e3779b9u + blockIdx.x;
  uint32_t a[4] = {seed, seed ^ 0x55555555u, seed + 7u, seed * 3u};
  const uint32_t b0 = seed ^ 0x0f0f0f0fu, b1 = seed + 0x01010101u;
  if constexpr (TYPE == MmaType::e4m3) {
    // e4m3 bytes with exponent fields below 8: finite, never NaN.
    for (uint32_t& v : a) v &= 0x3f3f3f3fu;
    const uint32_t e0 = b0 & 0x3f3f3f3fu, e1 = b1 & 0x3f3f3f3fu;
    mma_chains<float>(iterations, sink, [&](float (&d)[4]) { kernels::mma_e4m3_16832(d, a, e0, e1); });
  } else if constexpr (TYPE == MmaType::s8) {
    mma_chains<int>(iterations, sink, [&](int (&d)[4]) { kernels::mma_s8_16832(d, a, b0, b1); });
  } else {
    // f16 operands kept finite and small: a = b = 2^-14-ish patterns would be denormal; use ~1.
    for (uint32_t& v : a) v = (v & 0x03ff03ffu) | 0x3c003c00u;
    const uint32_t h0 = (b0 & 0x03ff03ffu) | 0x3c003c00u, h1 = (b1 & 0x03ff03ffu) | 0x3c003c00u;
    mma_chains<float>(iterations, sink, [&](float (&d)[4]) { mma_f16_16816(d, a, h0, h1); });
  }
}

// Two warpgroups a block, each issuing m64n128k32 s8 wgmma on one 64 x 128 / 128 x 128 operand
// pair in shared memory (zeros: the data does not change the rate), 4 a commit group, at most
// two groups in flight; the sums go to `sink` only when an impossible value appears.
__global__ __launch_bounds__(256) void wgmma_peak_kernel(int iterations, uint32_t* sink) {
  __shared__ __align__(1024) uint8_t operands[64 * 128 * 2 + 128 * 128];
  for (int i = threadIdx.x; i < static_cast<int>(sizeof(operands)) / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(operands)[i] = make_uint4(0, 0, 0, 0);
  kernels::fence_proxy_async_shared();
  __syncthreads();
  const int warpgroup = threadIdx.x / 128;
  const uint64_t a_desc = kernels::wgmma_descriptor_128b(operands + warpgroup * 64 * 128);
  const uint64_t b_desc = kernels::wgmma_descriptor_128b(operands + 2 * 64 * 128);
  int acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0;
  for (int it = 0; it < iterations; ++it) {
    kernels::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) kernels::wgmma_s8_m64n128k32(acc, a_desc + 2 * kk, b_desc + 2 * kk, 1);
    kernels::wgmma_commit();
    kernels::wgmma_wait<1>();
  }
  kernels::wgmma_wait<0>();
  kernels::wgmma_fence_operands(acc);
  int x = 0;
#pragma unroll
  for (int i = 0; i < 64; ++i) x ^= acc[i];
  if (x == 0x7fffffff) *sink = static_cast<uint32_t>(x);
}

// Median seconds of 9 timed runs of `launch` (after one warm-up run that brings the clocks up).
template <class Launch>
double median_launch_seconds(Launch&& launch, void* stream) {
  launch();
  const ReplayTimes t = time_replays([&](void*, int) { launch(); }, 1, 2, 9, stream);
  std::vector<float> ms = t.ms;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e-3;
}

}  // namespace

double wgmma_s8_peak_tops(void* stream_handle) {
  QSPEC_CHECK(compute_capability() == 90, "cuda::wgmma_s8_peak_tops: wgmma needs a compute capability 9.0 GPU (this one: ",
              compute_capability(), ")");
  cudaStream_t stream = as_stream(stream_handle);
  DeviceMemory sink(16);
  const int blocks = multiprocessor_count() * 2, threads = 256, iterations = 2048;
  auto launch = [&] {
    wgmma_peak_kernel<<<blocks, threads, 0, stream>>>(iterations, sink.as<uint32_t>());
    QSPEC_CUDA_CHECK_LAUNCH("wgmma_peak_kernel");
  };
  const double seconds = median_launch_seconds(launch, stream_handle);
  const double wgmmas = static_cast<double>(blocks) * 2 * iterations * 4;
  return wgmmas * 2.0 * 64 * 128 * 32 / seconds / 1e12;
}

double mma_sync_peak_tops(MmaType type, void* stream_handle) {
  cudaStream_t stream = as_stream(stream_handle);
  DeviceMemory sink(16);
  QSPEC_CHECK(type != MmaType::e4m3 || compute_capability() >= 89,
              "cuda::mma_sync_peak_tops: e4m3 mma needs compute capability 8.9 or newer (this GPU: ",
              compute_capability(), ")");
  const int blocks = multiprocessor_count() * 8, threads = 256, iterations = 4096;
  auto launch = [&] {
    if (type == MmaType::s8) mma_peak_kernel<MmaType::s8><<<blocks, threads, 0, stream>>>(iterations, sink.as<uint32_t>());
    else if (type == MmaType::e4m3)
      mma_peak_kernel<MmaType::e4m3><<<blocks, threads, 0, stream>>>(iterations, sink.as<uint32_t>());
    else mma_peak_kernel<MmaType::f16><<<blocks, threads, 0, stream>>>(iterations, sink.as<uint32_t>());
    QSPEC_CUDA_CHECK_LAUNCH("mma_peak_kernel");
  };
  const double seconds = median_launch_seconds(launch, stream_handle);
  // m16n8k32 s8 / e4m3: 16 * 8 * 32 multiply-adds; m16n8k16 f16: 16 * 8 * 16. Two ops each.
  const double ops_per_mma = type == MmaType::f16 ? 2.0 * 16 * 8 * 16 : 2.0 * 16 * 8 * 32;
  const double mmas = static_cast<double>(blocks) * (threads / 32) * iterations * kPeakChains;
  return mmas * ops_per_mma / seconds / 1e12;
}

void gemm_s8_cublas(const Blas& blas, const int8_t* a, int64_t m, int64_t k, const int8_t* b, int64_t n, int32_t* c,
                    void* stream) {
  QSPEC_CHECK(m > 0 && n > 0 && k > 0 && m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31) && k % 4 == 0,
              "cuda::gemm_s8_cublas: bad shape m ", m, " n ", n, " k ", k, " (k % 4 == 0)");
  cublasHandle_t handle = static_cast<cublasHandle_t>(blas.handle());
  QSPEC_CUBLAS_CHECK(cublasSetStream(handle, as_stream(stream)));
  const int32_t alpha = 1, beta = 0;
  // Row-major c[m, n] = a[m, k] b[n, k]^T is column-major c^T (n x m) = b (k x n)^T a^T: the
  // "TN" form cuBLAS's int8 tensor-core kernels need.
  QSPEC_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, b, CUDA_R_8I, static_cast<int>(k), a, CUDA_R_8I,
                                  static_cast<int>(k), &beta, c, CUDA_R_32I, static_cast<int>(n), CUBLAS_COMPUTE_32I,
                                  CUBLAS_GEMM_DEFAULT));
}

}  // namespace qspec::cuda
