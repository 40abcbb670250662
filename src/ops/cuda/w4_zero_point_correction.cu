// The zero-point term of 4-bit GEMMs on quantized activations (launcher; the kernel is
// kernels/w4_zero_point_correction.cuh).
#include "ops/cuda/common.h"
#include "ops/cuda/gemm_w4_lowbit.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4_zero_point_correction.cuh"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {

namespace {
// A block's shared memory at most (no opt-in past 48 KB): one token's group sums for k up to
// 393,216 in groups of 32, sixteen tokens' for k up to 24,576.
constexpr size_t kMaxSharedBytes = 48 * 1024;
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
  const cudaStream_t s = as_stream(stream);
  if (m > kernels::kZeroPointWarpKernelMaxTokens) {
    // Blocks of 16 tokens x 256 rows (kernels/w4_zero_point_correction.cuh says why two kernels).
    const size_t smem = static_cast<size_t>(kernels::kZeroPointMaxTokens) * layout.groups * sizeof(float);
    QSPEC_CHECK(smem <= kMaxSharedBytes, "cuda::w4_zero_point_correction: k ", w.k, " in groups of ", w.group,
                " is more groups than a block holds (", kMaxSharedBytes / (sizeof(float) * kernels::kZeroPointMaxTokens),
                ")");
    const dim3 grid(static_cast<unsigned>((w.n + kernels::kZeroPointWideRows - 1) / kernels::kZeroPointWideRows),
                    static_cast<unsigned>((m + kernels::kZeroPointMaxTokens - 1) / kernels::kZeroPointMaxTokens));
    const dim3 block(kernels::kZeroPointWideRows * kernels::kZeroPointSplit);
    launch_pdl(kernels::w4_zero_point_correction_16_tokens_kernel, grid, block, smem, s, p);
    QSPEC_CUDA_CHECK_LAUNCH("w4_zero_point_correction_16_tokens_kernel");
    return;
  }
  // 1-8 tokens: m's power of two tokens a block, fewer where their group sums would not fit.
  int tokens = kernels::zero_point_token_tile(m);
  while (tokens > 1 && kernels::zero_point_shared_bytes(tokens, layout.groups) > kMaxSharedBytes) tokens /= 2;
  const size_t smem = kernels::zero_point_shared_bytes(tokens, layout.groups);
  QSPEC_CHECK(smem <= kMaxSharedBytes, "cuda::w4_zero_point_correction: k ", w.k, " in groups of ", w.group,
              " is more groups than a block holds (", kMaxSharedBytes / sizeof(float), ")");
  const int64_t token_tiles = (m + tokens - 1) / tokens;
  p.row_blocks_a_block = kernels::zero_point_row_blocks_a_block(layout.row_blocks, token_tiles);
  const dim3 grid(static_cast<unsigned>((layout.row_blocks + p.row_blocks_a_block - 1) / p.row_blocks_a_block),
                  static_cast<unsigned>(token_tiles));
  const dim3 block(kernels::kZeroPointThreads);
  switch (tokens) {
    case 1: launch_pdl(kernels::w4_zero_point_correction_kernel<1>, grid, block, smem, s, p); break;
    case 2: launch_pdl(kernels::w4_zero_point_correction_kernel<2>, grid, block, smem, s, p); break;
    case 4: launch_pdl(kernels::w4_zero_point_correction_kernel<4>, grid, block, smem, s, p); break;
    default: launch_pdl(kernels::w4_zero_point_correction_kernel<8>, grid, block, smem, s, p); break;
  }
  QSPEC_CUDA_CHECK_LAUNCH("w4_zero_point_correction_kernel");
}

}  // namespace qspec::cuda
