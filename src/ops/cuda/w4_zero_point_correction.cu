// The zero-point term of 4-bit GEMMs on quantized activations (launcher; the kernel is
// kernels/w4_zero_point_correction.cuh).
#include "ops/cuda/common.h"
#include "ops/cuda/gemm_w4_lowbit.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4_zero_point_correction.cuh"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {

namespace {
// The group sums of a block's tokens take this much shared memory at most (an opt-in past 48 KB):
// groups of 32 over k up to 24,576.
constexpr size_t kMaxGroupSumBytes = 48 * 1024;
}  // namespace

void w4_zero_point_correction(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                              int64_t ldy, void* stream) {
  QSPEC_CHECK(w.has_min(), "cuda::w4_zero_point_correction: weights without zero points (int4) need no correction");
  QSPEC_CHECK(m >= 0 && ldy >= w.n, "cuda::w4_zero_point_correction: bad shape m ", m, " n ", w.n, " ldy ", ldy);
  const kernels::W4A16Layout layout = detail::w4a16_layout(w, /*zero_points=*/true);  // checks the weights
  QSPEC_CHECK(x.values != nullptr && x.scales != nullptr && x.ldx >= w.k,
              "cuda::w4_zero_point_correction: activations without values or scales, or rows shorter than k ", w.k);
  if (m == 0) return;
  kernels::ZeroPointCorrectionParams p{};
  p.x = x.values;
  p.ldx = x.ldx;
  p.kind = quantized_values_are_f16(x)                      ? kernels::ZeroPointActivations::f16
           : x.format == quant::Format::fp8 && x.e4m3        ? kernels::ZeroPointActivations::e4m3
                                                             : kernels::ZeroPointActivations::bytes;
  QSPEC_CHECK(p.kind != kernels::ZeroPointActivations::bytes || x.format == quant::Format::int8 ||
                  x.format == quant::Format::int4,
              "cuda::w4_zero_point_correction: activations in ", kernels::format_label(x.format), " as bytes");
  const int64_t elem_bytes = p.kind == kernels::ZeroPointActivations::f16 ? 2 : 1;
  QSPEC_CHECK(reinterpret_cast<uintptr_t>(x.values) % 16 == 0 && x.ldx * elem_bytes % 16 == 0,
              "cuda::w4_zero_point_correction: activation rows must start 16-byte aligned (ldx ", x.ldx, ")");
  p.scales = x.scales;
  if (x.format == quant::Format::int4) {
    QSPEC_CHECK(x.group > 0 && x.group % w.group == 0 && w.k % x.group == 0 && x.scale_ld >= w.k / x.group,
                "cuda::w4_zero_point_correction: int4 activation groups of ", x.group,
                " must be a multiple of the weight group ", w.group, " and divide k ", w.k);
    p.act_group = static_cast<int>(x.group);
    p.scale_ld = x.scale_ld;
  }
  p.m = static_cast<int>(m);
  p.group = static_cast<int>(w.group);
  p.w = layout;
  p.zero_codes = w.zero_codes;
  p.y = reinterpret_cast<__half*>(y);
  p.ldy = ldy;
  const size_t smem = static_cast<size_t>(kernels::kZeroPointTokens) * layout.groups * sizeof(float);
  QSPEC_CHECK(smem <= kMaxGroupSumBytes, "cuda::w4_zero_point_correction: k ", w.k, " in groups of ", w.group,
              " is more groups than a block holds (", kMaxGroupSumBytes / (4 * kernels::kZeroPointTokens), ")");
  // A/B switches until an H200 run decides (kernels/w4_zero_point_correction.cuh says why):
  // QSPEC_ZP_CORRECTION_ROWS=64 (blocks of 256 threads) or 256 (the default, 1,024 threads), and
  // QSPEC_ZP_CORRECTION_RELEASE_AT_END=1 (the next kernel starts only when this one ends).
  static const int rows = env_int("QSPEC_ZP_CORRECTION_ROWS", kernels::kZeroPointRows, 64, 256);
  static const bool release_at_end = env_int("QSPEC_ZP_CORRECTION_RELEASE_AT_END", 0, 0, 1) == 1;
  QSPEC_CHECK(rows == 64 || rows == 256, "QSPEC_ZP_CORRECTION_ROWS: 64 or 256, not ", rows);
  p.release_at_end = release_at_end;
  const dim3 grid(static_cast<unsigned>((w.n + rows - 1) / rows),
                  static_cast<unsigned>((m + kernels::kZeroPointTokens - 1) / kernels::kZeroPointTokens));
  const dim3 block(static_cast<unsigned>(rows * kernels::kZeroPointSplit));
  if (rows == 64) launch_pdl(kernels::w4_zero_point_correction_kernel<64>, grid, block, smem, as_stream(stream), p);
  else launch_pdl(kernels::w4_zero_point_correction_kernel<256>, grid, block, smem, as_stream(stream), p);
  QSPEC_CUDA_CHECK_LAUNCH("w4_zero_point_correction_kernel");
}

}  // namespace qspec::cuda
