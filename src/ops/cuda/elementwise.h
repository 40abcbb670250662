// Elementwise and normalisation ops on the GPU: embedding, RMSNorm (+ residual add), RoPE, SiLU *
// up, add (CPU twins: ops/rmsnorm.h, ops/rope.h, ops/activation.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"

namespace qspec::cuda {

// ---- elementwise ops ------------------------------------------------------------------

// out[t, :] = table[ids[t], :], table [vocab, dim] f16. An id outside [0, vocab) gives a row
// of zeros (the host validates token ids; the kernel never reads out of bounds).
void embedding(const int32_t* ids, int64_t tokens, const f16_bits* table, int64_t vocab, int64_t dim,
               f16_bits* out, void* stream);

// y = x / sqrt(mean(x^2) + eps) * weight per row: x, y f16 [rows, dim]; weight f32 [dim];
// statistics in f32 (cpu::rmsnorm). y may alias x (not with y_packed). y_packed: y in the W4A16
// packed k order (gemm::w4a16_packed_x_index; a GEMM with W4A16TiledConfig::x_packed reads it),
// dim % 32 == 0 and 16-byte aligned rows.
void rmsnorm(const f16_bits* x, const float* weight, int64_t rows, int64_t dim, float eps, f16_bits* y,
             void* stream, bool y_packed = false);
// Fused residual add + RMSNorm: residual = f16(residual + delta) (stored back), then
// y = rmsnorm(residual). One pass over both inputs.
void add_rmsnorm(f16_bits* residual, const f16_bits* delta, const float* weight, int64_t rows, int64_t dim,
                 float eps, f16_bits* y, void* stream, bool y_packed = false);

// Rotary embedding in place, cpu::rope's convention (rotate_half: pair (i, i + head_dim/2)
// rotated by positions[t] * inv_freq[i], cos and sin times attention_scaling). x: f16
// [tokens, row_stride] holding `heads` heads of head_dim from its start (row_stride lets q and
// k be rotated inside a fused qkv row). inv_freq: f32 [head_dim / 2], device.
void rope(f16_bits* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
          const int32_t* positions, const float* inv_freq, float attention_scaling, void* stream);

// What the caller launches next on the stream, when that changes how a small kernel is best
// launched: before a W4A16 GEMM it lets the GEMM launch before it waits on its own predecessor
// (pdl_prologue in common.h), so the GEMM's weight loads start earlier. Outputs are the same.
enum class NextKernel { other, w4a16_gemm };

// out[r, i] = silu(gate[r, i]) * up[r, i] for i < cols, gate/up rows `in_stride` apart (a fused
// gate_up row: gate = row, up = row + cols, in_stride = 2 * cols); out rows `out_stride` apart
// (0: cols; columns cols .. out_stride - 1 are not written), f16.
// out_packed: out in the W4A16 packed k order (as rmsnorm's y_packed; cols % 32 == 0).
void silu_mul(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride,
              f16_bits* out, void* stream, NextKernel next = NextKernel::other, int64_t out_stride = 0,
              bool out_packed = false);

// The same with GELU's tanh approximation on the gate (GeGLU, Gemma): cpu::gelu_tanh_mul's twin.
void gelu_tanh_mul(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride,
                   f16_bits* out, void* stream, NextKernel next = NextKernel::other, int64_t out_stride = 0);

// x <- cap * tanh(x / cap) in place, f32 math, one f16 rounding (final_logit_softcapping on the
// logits): cpu::soft_cap's twin.
void soft_cap(f16_bits* x, int64_t count, float cap, void* stream);

// out = a + b elementwise (f16, f32 add, one rounding). out may alias a or b.
void add(const f16_bits* a, const f16_bits* b, int64_t count, f16_bits* out, void* stream);

}  // namespace qspec::cuda
