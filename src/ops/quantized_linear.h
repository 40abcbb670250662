// The CPU 4-bit-weight GEMM: y = x W^T with W a QuantizedMatrix (quant/quantized_linear.h),
// and the activation modes applied to x before it (the CPU twin of ops/cuda/gemm_*.h).
//
// The weights stay packed (two 4-bit codes a byte) and are decoded inside the kernels, in SIMD
// registers, a row block at a time for every token of the call. Kernels are chosen at run time
// from what the CPU supports (cpuid), so one binary runs on any x86-64: AVX2 + FMA, AVX-512
// VNNI (with AVX-512 VL), AVX-VNNI, or portable C++ elsewhere. Every kernel gives the same
// bits as the portable one (tests/unit/test_cpu_q4_kernels.cpp), so the choice changes speed,
// never an output.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "quant/quantized_linear.h"

namespace qspec::cpu {

// Applies an activation mode to tokens x [tokens, k] in place (per token; f32 is a no-op).
void apply_activation_mode(const ActivationMode& mode, float* x, int64_t tokens, int64_t k);
// x[i] = f16_to_f32(f32_to_f16(x[i])) (mode f16's rounding), 8 at a time with F16C when the
// build has it; the same values (a NaN may come back with another payload).
void round_to_f16(float* x, int64_t n);

// y[m, n] = sum_k x[m, k] * W[n, k] + bias[n] with W the dequantized 4-bit weights and x as
// given (apply the activation mode first). Each (token, row) sum is one 8-lane FMA chain over K
// and one horizontal sum, over the weights dequantized as QuantizedMatrix::dequantize_row does:
// the order of cpu::linear's AVX2 path, so the result is that of dequantizing W and calling it,
// bit for bit, and never depends on the other tokens of the call. bias may be null.
void quantized_linear(const float* x, int64_t tokens, const QuantizedMatrix& weight,
                      const float* bias, float* y);

// Activations in int8 (mode w4a8), the way the integer kernels read them: each token's codes and
// scale exactly as quant::quantize_row gives them for Format::int8 (x[i] ~ codes[i] * scale).
struct Int8Activations {
  int64_t tokens = 0;
  int64_t k = 0;
  // [tokens, k]. When k % 64 == 0 (interleaved), each 64-value chunk holds its 32 even-indexed
  // codes, then its 32 odd-indexed ones: the order of the weights' low and high nibbles, so a
  // kernel pairs them without shuffling. Otherwise in plain order.
  bool interleaved = false;
  std::vector<int8_t> codes;
  std::vector<float> scales;        // [tokens]
  std::vector<int32_t> chunk_sums;  // [tokens, k / 64] the sum of each 64-value chunk's codes
  std::vector<int32_t> half_chunk_sums;  // [tokens, k / 32] the same for each half chunk (groups of 32)
};
// Quantizes x [tokens, k] per token (threaded over tokens). Reuses out's buffers.
void quantize_activations_int8(const float* x, int64_t tokens, int64_t k, Int8Activations& out);

// W4A8: y[m, n] = fma(sum over blocks b of s_w[n, b] * S[m, n, b] (one fma a block, in block
// order), s_x[m], bias[n]) with S the exact integer sum of the block's codes times the weights'
// int4 values: the CPU twin of cuda::w4_quantized_gemm for int8 activations. For int4 and
// int4-channel weights, int8-group (W8A8: the weights' int8 codes), and int4-asym, whose minimum
// adds fma(m[n, b], Q[m, b], ...) after each block's scale term, Q the exact sum of the token's
// codes over the block (the per-group activation sum; the sums stay exact integers). Other
// weight formats (E2M1) get x's dequantized values (codes * scale, what fake quantization gives)
// through the float GEMM above. bias may be null.
void quantized_linear(const Int8Activations& x, const QuantizedMatrix& weight, const float* bias,
                      float* y);

// One matrix of a fused call: y = x W^T + bias, W sharing x with the call's other matrices.
struct LinearOutput {
  const QuantizedMatrix* weight;
  const float* bias;  // may be null
  float* y;           // [tokens, weight->rows]
};
// quantized_linear on each of up to four matrices that read the same x (q/k/v, gate/up), their
// rows split over the threads together: one parallel region instead of one each. The same bits
// as the separate calls. Every matrix's K must be x's.
void quantized_linear(const float* x, int64_t tokens, std::span<const LinearOutput> outputs);
void quantized_linear(const Int8Activations& x, std::span<const LinearOutput> outputs);

// The instruction sets the 4-bit kernels can use, best last.
enum class KernelIsa : uint8_t {
  portable,     // C++ only (auto-vectorized as the build's flags allow)
  avx2,         // AVX2 + FMA: maddubs / madd integer dots
  avx_vnni,     // AVX2 + AVX-VNNI (VEX vpdpbusd)
  avx512_vnni,  // AVX-512 VNNI + VL (EVEX vpdpbusd on 256-bit vectors)
};
std::string_view kernel_isa_name(KernelIsa isa);
// Whether this CPU (and OS) can run it.
bool kernel_isa_supported(KernelIsa isa);
// The kernels in use: the best supported, or QSPEC_CPU_KERNELS (portable, avx2, avx-vnni,
// avx512-vnni) when set; an unknown or unsupported name there throws qspec::Error.
KernelIsa kernel_isa();
// Forces a kernel set (tests, benchmarks); throws qspec::Error when the CPU lacks it.
void set_kernel_isa(KernelIsa isa);

}  // namespace qspec::cpu
