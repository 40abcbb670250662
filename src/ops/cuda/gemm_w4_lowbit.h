// 4-bit-weight GEMMs with low-precision activations (W4A8, W4A4) on the GPU: every strategy the
// policy map dispatches (CPU twin: ops/quantized_linear.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"
#include "ops/cuda/gemm_w4a16.h"
#include "ops/cuda/quantize.h"
#include "quant/formats.h"

namespace qspec::cuda {

// y[m, n] = f16(sum over groups of s_w[n, group] * s_x * (sum over the group of x[m, k] q_w[n, k]))
// with the W4A16 packed weights (one 4-bit weight set for every mode) and quantized activations:
// each group's sum exact on s8 mma (s32) for int8 / int4 codes, f32 on f16 mma for the f16
// values (fp8, nvfp4, mxfp4), f32 on e4m3 mma for fp8's e4m3 codes (f16 mma before sm_89; on
// Hopper the weights' e4m3 conversion makes this slower than the f16 values: docs/perf-journal/perf-notes-journal-2026.md);
// s_x the token or group scale. The kernels of the W4A16 paths: automatic takes small_m
// up to 8 tokens and tiled beyond (there is no dequantize + cuBLAS path); the workspace is the
// W4A16 path's (w4a16_workspace_bytes with that path).
void w4_quantized_gemm(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                       void* workspace, size_t workspace_bytes, void* stream, W4A16Path path = W4A16Path::automatic);
// Weights with zero points (int4-asym minimums, int4-zp zero points; W4A16Weights::mins) under
// quantized activations: the kernels above (and the wide, wgmma and bitwise ones) have no zero-point
// variants, so they run on the codes as int4's (a view without `mins`: s (u - 8) for each code u),
// and this adds what the zero points add, y[t, i] = f16(y[t, i] + sum_g c(i, g) X(t, g)), with
// c = m + 8 s (int4-asym) or s (8 - z) (int4-zp) and X(t, g) the sum over group g of token t's
// dequantized activations (x's codes or values times their scale). dispatch_w4_gemm
// (gemm/cuda/gemm_dispatch.h) runs the two for such weights. y is rounded to f16 twice (the GEMM's
// output, then the sum); the CPU's quantized_linear rounds once.
// The tokens' group sums X: made by each block that needs them (in_block), or once by a kernel of
// their own into the workspace past the W4A16 counters (global; needs
// w4_zero_point_correction_workspace_bytes), or (automatic) once where m > 8 and the workspace
// holds them (QSPEC_ZP_CORRECTION_GLOBAL_SUMS=0 turns that off, for the A/B), else in blocks.
enum class ZeroPointSums { automatic, in_block, global };
size_t w4_zero_point_correction_workspace_bytes(int64_t m, const W4A16Weights& w);
void w4_zero_point_correction(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                              int64_t ldy, void* stream, void* workspace = nullptr, size_t workspace_bytes = 0,
                              ZeroPointSums sums = ZeroPointSums::automatic);
// The small-M kernel (variants 1 / 2 of W4A16SmallMConfig), in slices of 64 tokens.
void w4_quantized_gemm_small_m(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                               int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                               const W4A16SmallMConfig& config = {});
// The tiled kernel (every tile of W4A16TiledConfig), any m.
void w4_quantized_gemm_tiled(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                             int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                             const W4A16TiledConfig& config = {});

// ADAngel's Bitwise strategy (kernels/w4_bitwise.cuh): int8 or int4 activations, weight groups of
// 128, k % 128 == 0 (w4_bitwise_supports), over the weights' bit-plane copy (ops/w4_bitplanes.h;
// gemm::bitplane_bytes(n, k) bytes, made by w4_bitplanes_from_packed). Any m, in slices of 8 tokens;
// the workspace is the small-M path's.
bool w4_bitwise_supports(const W4A16Weights& w, quant::Format format);
void w4_bitplanes_from_packed(const W4A16Weights& w, void* bitplanes, void* stream);
void w4_quantized_gemm_bitwise(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, const void* bitplanes,
                               f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream);

// W4A8 for many tokens (kernels/w4_s8_wide.cuh): int8 activations, k % 128 == 0, weight groups
// of 32 / 64 / 128 (w4_s8_wide_supports); the weights unpacked once per block into shared
// memory. tile 1: 128 rows x 128 tokens a block; 2: 128 x 64, two blocks a multiprocessor. Any m
// (no split-K, no workspace); bitwise the tiled kernel without split-K.
bool w4_s8_wide_supports(const W4A16Weights& w, quant::Format format);
void w4_quantized_gemm_s8_wide(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                               int64_t ldy, void* stream, int tile = 1);

// W4A8 for many tokens on Hopper's warpgroup mma, 128 x 128 tiles. int8: the register-A kernel
// (w4_s8_gemm_registers below: the packed weights unpacked in the mma threads' registers; 1.15-1.24x
// the unpack kernel + GEMM at 1024 tokens, docs/perf-journal/perf-notes-journal-2026.md), or with QSPEC_W4S8_REGISTERS=0
// (a benchmark knob) and for fp8 (kernels/w4_s8_wgmma.cuh): the packed weights unpacked to 8 bits
// in the workspace (w4_s8_wgmma_workspace_bytes: the split-K counters, then n x k bytes), then the
// GEMM on them. The workspace is required either way. Needs the sm_90a build on a compute
// capability 9.0 GPU, int8 or fp8 activations, k % 128 == 0 and weight groups of 128
// (w4_s8_wgmma_supports). int8: bit for bit the tiled kernel's output without split-K. fp8
// (W4A8-fp8, as e4m3 codes: QuantizedActivations::e4m3): the weights unpacked to e4m3 codes and
// e4m3 wgmma with f32 group sums (equal to the tiled kernel's up to the tensor cores' f32
// summation order).
bool w4_s8_wgmma_supports(const W4A16Weights& w, quant::Format format);
size_t w4_s8_wgmma_workspace_bytes(int64_t n, int64_t k);
void w4_quantized_gemm_s8_wgmma(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream);
// Its two halves (benchmarks time the GEMM alone): the weights as int8 u - 8, [ceil(n / 16) * 16][k]
// row-major; the GEMM on them. variant (benchmarks): 0 = the default, (5 ring stages, 2 groups an
// unrolled iteration, 3 of every 8 group sums converted by I2F); 1..kW4S8WgmmaVariants = (5, 2, no
// I2F), (5, 4, none), (5, 2, 2 of 8), (5, 2, 3 of 8). The unroll of 4 spills (255 registers) and runs 10-15 % slower
// (docs/perf-journal/perf-notes-journal-2026.md); (5, 8) serialized the wgmma. 5: the fused kernel's warp-specialized loop (a
// producer warpgroup for the copies, no block barrier a stage) on these weights: measured equal.
inline constexpr int kW4S8WgmmaVariants = 5;
void w4_unpack_s8(const W4A16Weights& w, int8_t* out, void* stream);
// The same as e4m3 codes of u - 8 (for fp8 activations; same layout).
void w4_unpack_e4m3(const W4A16Weights& w, uint8_t* out, void* stream);
// w8: w4_unpack_s8's output for int8 activations, w4_unpack_e4m3's for fp8 (variant 0 only).
void w4_s8_gemm_unpacked(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, const int8_t* w8, f16_bits* y,
                         int64_t ldy, void* stream, int variant = 0);
// The same GEMM with the unpack inside (kernels/w4_s8_wgmma_fused.cuh: a producer warpgroup turns
// the packed weights into the int8 / e4m3 tile in shared memory): no scratch buffer, the same bits;
// measured slower than the unpack kernel + GEMM, so w4_quantized_gemm_s8_wgmma runs it only with
// QSPEC_W4S8_FUSED=1.
// variant (benchmarks): 0 = (4 operand slots, 8 packed-weight slots, 2 groups an iteration, 3 of 8
// sums by I2F, 4 pieces a producer lane in flight); 1 = 2 pieces in flight; 2 = the mma
// warpgroups a stage out of step (int8 only); 3 = 5 operand slots (int8 only).
inline constexpr int kW4S8FusedVariants = 3;
void w4_s8_gemm_fused(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                      void* stream, int variant = 0);
// The same GEMM with the weights' A fragments built in registers (kernels/w4_s8_wgmma_rs.cuh: the
// packed weights by TMA into shared memory, each mma thread unpacks its own fragment, wgmma with
// A from registers): no scratch buffer, no int8 weight tile, the same bits; int8 activations only.
// variant (benchmarks): 0 = (4 ring stages of 24 KB, 2 groups an iteration, 3 of 8 sums by I2F);
// 1 / 2 / 3 = 3 / 5 / 6 stages; 4 / 5 / 6 = 4 / 2 / 0 of 8 sums by I2F (4 groups an iteration
// spills: 255 registers).
inline constexpr int kW4S8RegisterVariants = 6;
void w4_s8_gemm_registers(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                          void* stream, int variant = 0);
// The same GEMM with the unpack spread over the GEMM's own blocks: the blocks of a row tile unpack
// its weights into the workspace (w4_s8_wgmma_workspace_bytes, as the unpack kernel's) once,
// stage by stage, each stage by the first block to claim it, and read them by TMA when its flag
// says it is there (kernels/w4_s8_wgmma_fused.cuh, kSourceCooperative): the same bits, no separate
// unpack launch, the unpack overlapped with the mma. The flags live in the second half of the
// workspace's counter region and hold launch epochs (w4_s8_cooperative_supports: ceil(n / 128)
// (k / 128) flags must fit). Measured slower than
// the unpack kernel + GEMM (each block waits for its row tile's first stages; perf-notes), so
// w4_quantized_gemm_s8_wgmma runs it only with QSPEC_W4S8_COOPERATIVE=1.
bool w4_s8_cooperative_supports(const W4A16Weights& w);
void w4_s8_gemm_cooperative(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                            void* workspace, size_t workspace_bytes, void* stream);

// W4A8 (int8 codes rows ldx bytes apart, token scales): w4_quantized_gemm* with format int8.
inline QuantizedActivations int8_activations(const int8_t* xq, const float* x_scales, int64_t ldx) {
  return QuantizedActivations{quant::Format::int8, xq, ldx, x_scales, 0, 0};
}
inline void w4a8_gemm(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx, const W4A16Weights& w,
                      f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                      W4A16Path path = W4A16Path::automatic) {
  w4_quantized_gemm(int8_activations(xq, x_scales, ldx), m, w, y, ldy, workspace, workspace_bytes, stream, path);
}
inline void w4a8_gemm_small_m(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx, const W4A16Weights& w,
                              f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                              const W4A16SmallMConfig& config = {}) {
  w4_quantized_gemm_small_m(int8_activations(xq, x_scales, ldx), m, w, y, ldy, workspace, workspace_bytes, stream,
                            config);
}
inline void w4a8_gemm_tiled(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx, const W4A16Weights& w,
                            f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                            const W4A16TiledConfig& config = {}) {
  w4_quantized_gemm_tiled(int8_activations(xq, x_scales, ldx), m, w, y, ldy, workspace, workspace_bytes, stream,
                          config);
}

}  // namespace qspec::cuda
