// Host helpers the 4-bit GEMM launchers share (defined in w4a16_gemm.cu): the kernels' view of the
// packed weights, the checked activation rows of quantized inputs, and whether an sm_90a-only
// kernel runs here.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda::detail {

// The kernels' view of w, checked. Weights with minimums (int4-asym) are refused unless the
// calling kernel runs them (zero_points: it reads kernels::zero_point_mins): every kernel without a
// zero-point variant throws here rather than compute int4 values from unsigned codes.
kernels::W4A16Layout w4a16_layout(const W4A16Weights& w, bool zero_points = false);
// Throws naming `who` when x does not fit w (alignment, ldx, int4 groups) or lacks scales.
kernels::ActivationRows activation_rows(const QuantizedActivations& x, int64_t m, const W4A16Weights& w,
                                        const char* who);
// `rows` advanced to token first_token.
kernels::ActivationRows activation_rows_from(const kernels::ActivationRows& rows, const QuantizedActivations& x,
                                             int64_t first_token);

// Whether the code of `kernel` that would run on this device is its sm_90a build: compute
// capability 9.0 and a binary for it (a build's sm_80 pass compiles sm_90a-only kernels to a
// trap). Callers keep the answer in a static: it does not change within a process.
template <class Kernel>
bool sm90a_build_runs(Kernel* kernel) {
  if (compute_capability() != 90) return false;
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.binaryVersion == 90;
}

// A tensor map of `rank` (2 or 3) dimensions, innermost first: dims in elements, the byte strides of
// dimensions 1 .. rank - 1, the box in elements; boxes past the tensor read as zeros; throws naming
// `who` when the driver refuses it (defined in w4_s8_wgmma.cu).
CUtensorMap tiled_tensor_map(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                             const uint64_t* strides, const uint32_t* box, CUtensorMapSwizzle swizzle, const char* who);
// A row-major f16 matrix [rows][cols] (rows `pitch_bytes` apart, 16-byte aligned) as boxes of
// box_cols x box_rows in the 128-byte swizzle the wgmma descriptors read (box_cols * 2 == 128);
// rows and columns outside the matrix read as zeros (defined in w4_s8_wgmma.cu).
CUtensorMap f16_box_map(const void* base, int64_t rows, int64_t cols, int64_t pitch_bytes, int box_cols, int box_rows,
                        const char* who);

}  // namespace qspec::cuda::detail
