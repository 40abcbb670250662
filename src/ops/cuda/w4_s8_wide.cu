#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_s8_wide.cuh"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {
namespace {

template <int G>
void launch_wide(const kernels::W4S8WideParams& params, dim3 grid, cudaStream_t stream) {
  constexpr int kSmemBytes = kernels::W4S8WideTile::smem_bytes<G>();
  static const bool configured = [] {
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(kernels::w4_s8_wide_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          kSmemBytes));
    return true;
  }();
  (void)configured;
  launch_pdl(kernels::w4_s8_wide_kernel<G>, grid, dim3(kernels::W4S8WideTile::kThreads), kSmemBytes, stream, params);
  QSPEC_CUDA_CHECK_LAUNCH("w4_s8_wide_kernel");
}

}  // namespace

bool w4_s8_wide_supports(const W4A16Weights& w, quant::Format format) {
  return format == quant::Format::int8 && w.k % kernels::W4S8WideTile::kStageK == 0 &&
         (w.group == 32 || w.group == 64 || w.group == 128);
}

void w4_quantized_gemm_s8_wide(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                               int64_t ldy, void* stream) {
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
  const int64_t m_tiles = ceil_div(m, kernels::W4S8WideTile::kTokens);
  const int64_t row_tiles = ceil_div(w.n, kernels::W4S8WideTile::kRows);
  QSPEC_CHECK(row_tiles <= 65535, who, ": n ", w.n, " too large");
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(row_tiles));
  switch (w.group) {
    case 32: launch_wide<32>(params, grid, as_stream(stream)); break;
    case 64: launch_wide<64>(params, grid, as_stream(stream)); break;
    default: launch_wide<128>(params, grid, as_stream(stream)); break;
  }
}

}  // namespace qspec::cuda
