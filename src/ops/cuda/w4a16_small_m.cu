#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/kernels/w4a16_small_m.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace detail {
kernels::W4A16Layout w4a16_layout(const W4A16Weights& w);  // w4a16_gemm.cu
}

namespace {

// Variants (all 128 rows per block): 1 = 4 warps x 2 row blocks, 4 chunks in flight per
// warp; 2 = 8 warps x 1 row block, 8 chunks in flight (4 for 8 n-tiles, to stay in registers).
template <int MT, int RPW, int G, int DEPTH, int WARPS>
void launch(const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream) {
  kernels::w4a16_small_m_kernel<MT, RPW, G, DEPTH, WARPS><<<grid, WARPS * 32, 0, stream>>>(params);
  QSPEC_CUDA_CHECK_LAUNCH("w4a16_small_m_kernel");
}

template <int MT, int G>
void launch_variant(int variant, const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream) {
  if constexpr (MT == 8) {
    launch<8, 1, G, 4, 8>(params, grid, stream);  // 8 n-tiles: one row block per warp only
  } else {
    if (variant == 1) launch<MT, 2, G, 4, 4>(params, grid, stream);
    else launch<MT, 1, G, 8, 8>(params, grid, stream);
  }
}

template <int G>
void launch_group(int mt, int variant, const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream) {
  switch (mt) {
    case 1: launch_variant<1, G>(variant, params, grid, stream); break;
    case 2: launch_variant<2, G>(variant, params, grid, stream); break;
    case 4: launch_variant<4, G>(variant, params, grid, stream); break;
    default: launch_variant<8, G>(variant, params, grid, stream); break;
  }
}

}  // namespace

void w4a16_gemm_small_m(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                        void* workspace, size_t workspace_bytes, void* stream, const W4A16SmallMConfig& config) {
  const kernels::W4A16Layout layout = detail::w4a16_layout(w);
  QSPEC_CHECK(m >= 0 && ldx >= w.k && ldx % 8 == 0 && ldy >= w.n && reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "cuda::w4a16_gemm: x must be 16-byte aligned with ldx >= k and ldx % 8 == 0, ldy >= n (m ", m,
              ", ldx ", ldx, ", ldy ", ldy, ")");
  if (m == 0) return;
  const int64_t row_tiles = (w.n + detail::kW4A16TileRows - 1) / detail::kW4A16TileRows;
  QSPEC_CHECK(row_tiles * 4 <= static_cast<int64_t>(detail::kW4A16CounterBytes), "cuda::w4a16_gemm: n too large");
  const int variant = config.variant != 0 ? config.variant : 1;
  QSPEC_CHECK(variant == 1 || variant == 2, "cuda::w4a16_gemm: unknown small-M variant ", variant);
  const int sms = multiprocessor_count();
  cudaStream_t s = as_stream(stream);
  const auto* xh = reinterpret_cast<const __half*>(x);
  auto* yh = reinterpret_cast<__half*>(y);
  for (int64_t m0 = 0; m0 < m; m0 += detail::kW4A16MaxSliceM) {
    const int64_t slice = std::min(detail::kW4A16MaxSliceM, m - m0);
    const int mt = slice <= 8 ? 1 : slice <= 16 ? 2 : slice <= 32 ? 4 : 8;
    // Split-K: enough blocks for ~3 per multiprocessor, within the traffic bound, the chunk
    // count and the workspace.
    int64_t splits = config.splits > 0
                         ? config.splits
                         : std::min<int64_t>((3 * sms + row_tiles - 1) / row_tiles, detail::w4a16_max_splits(slice, w.k));
    splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, layout.full_chunks));
    while (splits > 1 && (workspace == nullptr ||
                          detail::kW4A16CounterBytes + static_cast<size_t>(splits * slice * w.n) * sizeof(float) >
                              workspace_bytes))
      --splits;
    kernels::W4A16SmallMParams params{};
    params.w = layout;
    params.x = xh + m0 * ldx;
    params.ldx = ldx;
    params.y = yh + m0 * ldy;
    params.ldy = ldy;
    params.m = static_cast<int>(slice);
    params.splits = static_cast<int>(splits);
    params.counters = static_cast<unsigned*>(workspace);
    params.partials = splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(workspace) + detail::kW4A16CounterBytes)
                                 : nullptr;
    const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(splits));
    const int v = mt == 8 ? 2 : variant;
    switch (w.group) {
      case 32: launch_group<32>(mt, v, params, grid, s); break;
      case 64: launch_group<64>(mt, v, params, grid, s); break;
      default: launch_group<128>(mt, v, params, grid, s); break;
    }
  }
}

}  // namespace qspec::cuda
