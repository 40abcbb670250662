#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_s8_wide.cuh"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {
namespace {

// The tiles (w4_quantized_gemm_s8_wide's `tile`): 1 = 128 rows x 128 tokens, 4 stages, one block a
// multiprocessor; 2 = 128 x 64, 3 stages, two blocks a multiprocessor.
using WideTile128 = kernels::W4S8WideTile<8, 4, 1>;
using WideTile64 = kernels::W4S8WideTile<4, 3, 2>;

template <class Tile, int G>
void launch_wide(const kernels::W4S8WideParams& params, int64_t m, int64_t n, cudaStream_t stream) {
  constexpr int kSmemBytes = Tile::template smem_bytes<G>();
  static const bool configured = [] {
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(kernels::w4_s8_wide_kernel<Tile, G>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)configured;
  const int64_t m_tiles = ceil_div(m, Tile::kTokens), row_tiles = ceil_div(n, Tile::kRows);
  QSPEC_CHECK(row_tiles <= 65535, "cuda::w4_quantized_gemm_s8_wide: n ", n, " too large");
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(row_tiles));
  launch_pdl(kernels::w4_s8_wide_kernel<Tile, G>, grid, dim3(Tile::kThreads), kSmemBytes, stream, params);
  QSPEC_CUDA_CHECK_LAUNCH("w4_s8_wide_kernel");
}

template <class Tile>
void launch_wide_for_group(const kernels::W4S8WideParams& params, int64_t m, int64_t n, int64_t group,
                           cudaStream_t stream) {
  switch (group) {
    case 32: launch_wide<Tile, 32>(params, m, n, stream); break;
    case 64: launch_wide<Tile, 64>(params, m, n, stream); break;
    default: launch_wide<Tile, 128>(params, m, n, stream); break;
  }
}

}  // namespace

bool w4_s8_wide_supports(const W4A16Weights& w, quant::Format format) {
  return format == quant::Format::int8 && w.k % WideTile128::kStageK == 0 &&
         (w.group == 32 || w.group == 64 || w.group == 128) && !w.has_min();  // no int4-asym variant
}

void w4_quantized_gemm_s8_wide(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                               int64_t ldy, void* stream, int tile) {
  const char* who = "cuda::w4_quantized_gemm_s8_wide";
  QSPEC_CHECK(w4_s8_wide_supports(w, x.format), who, ": needs int8 activations (got ", kernels::format_label(x.format),
              "), k % 128 == 0 and weight groups of 32, 64 or 128 (k ", w.k, ", group ", w.group, ")");
  const kernels::ActivationRows rows = detail::activation_rows(x, m, w, who);
  QSPEC_CHECK(ldy >= w.n, who, ": ldy ", ldy, " < n ", w.n);
  if (m == 0) return;
  kernels::W4S8WideParams params{};
  params.w = detail::w4a16_layout(w);
  params.a = rows;
  params.y = reinterpret_cast<__half*>(y);
  params.ldy = ldy;
  params.m = static_cast<int>(m);
  QSPEC_CHECK(tile == 1 || tile == 2, who, ": unknown tile ", tile);
  if (tile == 1) launch_wide_for_group<WideTile128>(params, m, w.n, w.group, as_stream(stream));
  else launch_wide_for_group<WideTile64>(params, m, w.n, w.group, as_stream(stream));
}

}  // namespace qspec::cuda
