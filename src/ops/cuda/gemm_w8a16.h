// 8-bit-weight GEMMs with f16 activations (W8A16) on the GPU: int8-group weights (quant/formats.h,
// the 8-bit tensors a GGUF keeps beside its 4-bit ones) in the layout of ops/w8a16_pack.h.
// CPU twin: cpu::quantized_linear on the same int8-group matrix (ops/quantized_linear.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/cuda/device.h"

namespace qspec::cuda {

// Packed int8-group weights on the device (ops/w8a16_pack.h), viewed.
struct W8A16Weights {
  const void* codes = nullptr;    // ceil(n/16) * k * 16 bytes, 16-byte aligned
  const float* scales = nullptr;  // ceil(n/16) * (k/group) * 16 f32
  int64_t n = 0, k = 0;
  int64_t group = 0;  // 16 or a power of two from 32 (gemm::w8a16_group_supported), dividing k; k % 32 == 0
};

// kernel: kernels/w8a16.cuh (64 tokens a launch, launches of up to 64 beyond); dequant_cublas:
// the weights dequantized to f16 scratch, then cuBLAS.
enum class W8A16Path { automatic, kernel, dequant_cublas };
// Up to how many tokens `automatic` takes the kernel. Measured on the H200 over Llama-3-8B's
// shapes (bench/results/gpu-w8a16-gemm-llama3-8b-h200-b86b165.log): at 32 tokens the kernel
// beats dequantize + cuBLAS on all four (gate_up 99 against 163 us, down 43 against 87), at 64
// it loses on all four (gate_up 246 against 164, down 100 against 90): a GEMV-shaped kernel, each
// warp all its tokens, fewer warps as they grow.
inline constexpr int64_t kW8A16KernelMaxTokens = 32;
W8A16Path w8a16_choose_path(int64_t m);
// Workspace a W8A16 GEMM of this size may use: none for the kernel; for dequant_cublas the
// dequantized f16 weights (n * k * 2 bytes) after the W4A16 split-K counters that a shared
// workspace starts with (w4a16_workspace_bytes; left untouched). With less, it runs the kernel.
size_t w8a16_workspace_bytes(int64_t m, int64_t n, int64_t k, W8A16Path path = W8A16Path::automatic);
// y[m, n] = x[m, k] (f16, rows ldx apart, 8-byte aligned, ldx % 4 == 0) * W^T, f16 out (rows ldy
// apart), f32 accumulation: each group's sum of code * x times its scale (kernel), or the cuBLAS
// product of f16(code * scale) weights.
void w8a16_gemm(const Blas& blas, const f16_bits* x, int64_t m, int64_t ldx, const W8A16Weights& w, f16_bits* y,
                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                W8A16Path path = W8A16Path::automatic);
// The packed weights as f16 [n, k] row-major, f16(code * scale) (the cuBLAS path's first half).
void w8a16_dequantize(const W8A16Weights& w, f16_bits* out, void* stream);

}  // namespace qspec::cuda
