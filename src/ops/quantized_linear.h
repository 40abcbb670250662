// The CPU 4-bit-weight GEMM: y = x W^T with W a QuantizedMatrix (quant/quantized_linear.h),
// and the activation modes applied to x before it (the CPU twin of ops/cuda/gemm_*.h).
#pragma once
#include <cstdint>

#include "quant/quantized_linear.h"

namespace qspec::cpu {

// Applies an activation mode to tokens x [tokens, k] in place (per token; f32 is a no-op).
void apply_activation_mode(const ActivationMode& mode, float* x, int64_t tokens, int64_t k);

// y[m, n] = sum_k x[m, k] * W[n, k] + bias[n] with W the dequantized 4-bit weights and x as
// given (apply the activation mode first). Weight rows are dequantized block by block on the
// fly, so memory holds only the 4-bit codes. bias may be null.
void quantized_linear(const float* x, int64_t tokens, const QuantizedMatrix& weight,
                      const float* bias, float* y);

}  // namespace qspec::cpu
