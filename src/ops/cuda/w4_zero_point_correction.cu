// The zero-point term of 4-bit GEMMs on quantized activations (launcher; the kernel is
// kernels/w4_zero_point_correction.cuh).
#include "ops/cuda/common.h"
#include "ops/cuda/gemm_w4_lowbit.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4_zero_point_correction.cuh"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {

namespace {
// A block's shared memory at most (no opt-in past 48 KB): one token's group sums for k up to
// 393,216 in groups of 32, sixteen tokens' for k up to 24,576.
constexpr size_t kMaxSharedBytes = 48 * 1024;

// Where the tokens' group sums go (ZeroPointSums::global): the workspace past the W4A16 kernels'
// counters (which must stay zero), null when it is too small.
float* group_sums_in(void* workspace, size_t workspace_bytes, int64_t m, int64_t groups) {
  const size_t need = detail::kW4A16CounterBytes + static_cast<size_t>(m * groups) * sizeof(float);
  if (workspace == nullptr || workspace_bytes < need) return nullptr;
  return reinterpret_cast<float*>(static_cast<char*>(workspace) + detail::kW4A16CounterBytes);
}
}  // namespace

size_t w4_zero_point_correction_workspace_bytes(int64_t m, const W4A16Weights& w) {
  return detail::kW4A16CounterBytes + static_cast<size_t>(m * (w.k / w.group)) * sizeof(float);
}

void w4_zero_point_correction(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                              int64_t ldy, void* stream, void* workspace, size_t workspace_bytes, ZeroPointSums sums) {
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
  // The group sums made once, by a kernel of their own, for 9+ tokens where the workspace holds
  // them (each block of the 16-token kernel sums its tokens' groups again: on the H200 the sums
  // made once took a Llama-3-8B w4a8 int4-zp step 7.01 -> 4.88 ms at batch 16, 10.45 -> 8.28 at
  // 64, a 512-token prefill 41.0 -> 27.5 ms; QSPEC_ZP_CORRECTION_GLOBAL_SUMS=0 for the A/B), or
  // when asked.
  static const bool global_sums_switch = env_int("QSPEC_ZP_CORRECTION_GLOBAL_SUMS", 1, 0, 1) == 1;
  float* global_sums = group_sums_in(workspace, workspace_bytes, m, layout.groups);
  QSPEC_CHECK(sums != ZeroPointSums::global || global_sums != nullptr,
              "cuda::w4_zero_point_correction: the group sums of ", m, " tokens need a workspace of ",
              w4_zero_point_correction_workspace_bytes(m, w), " bytes (got ", workspace_bytes, ")");
  const bool made_once = sums == ZeroPointSums::global ||
                         (sums == ZeroPointSums::automatic && global_sums_switch && global_sums != nullptr &&
                          m > kernels::kZeroPointWarpKernelMaxTokens);
  if (made_once) {
    launch_pdl(kernels::w4_zero_point_group_sums_kernel, dim3(static_cast<unsigned>(m)), dim3(kernels::kZeroPointThreads),
               0, s, p, global_sums);
    QSPEC_CUDA_CHECK_LAUNCH("w4_zero_point_group_sums_kernel");
    p.sums = global_sums;
  } else if (m > kernels::kZeroPointWarpKernelMaxTokens) {
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
  // m's power of two tokens a block (up to 8 where the blocks sum their groups, else 16), fewer
  // where their group sums would not fit.
  int tokens = kernels::zero_point_token_tile(m, made_once ? kernels::kZeroPointMaxTokens
                                                           : kernels::kZeroPointWarpKernelMaxTokens);
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
    case 8: launch_pdl(kernels::w4_zero_point_correction_kernel<8>, grid, block, smem, s, p); break;
    default: launch_pdl(kernels::w4_zero_point_correction_kernel<16>, grid, block, smem, s, p); break;
  }
  QSPEC_CUDA_CHECK_LAUNCH("w4_zero_point_correction_kernel");
}

}  // namespace qspec::cuda
