// Host helpers the 4-bit GEMM launchers share (defined in w4a16_gemm.cu): the kernels' view of the
// packed weights, and the checked activation rows of quantized inputs.
#pragma once
#include <cstdint>

#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda::detail {

kernels::W4A16Layout w4a16_layout(const W4A16Weights& w);
// Throws naming `who` when x does not fit w (alignment, ldx, int4 groups) or lacks scales.
kernels::ActivationRows activation_rows(const QuantizedActivations& x, int64_t m, const W4A16Weights& w,
                                        const char* who);
// `rows` advanced to token first_token.
kernels::ActivationRows activation_rows_from(const kernels::ActivationRows& rows, const QuantizedActivations& x,
                                             int64_t first_token);

}  // namespace qspec::cuda::detail
