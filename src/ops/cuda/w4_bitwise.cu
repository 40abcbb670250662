// Launchers of ADAngel's Bitwise strategy (kernels/w4_bitwise.cuh) and of the GPU twin of
// gemm::pack_w4_bitplanes (one thread a bit-plane word, ops/w4_bitplanes.h's bitplane_word).
#include "ops/w4_bitplanes.h"
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_bitwise.cuh"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 8;   // 128 rows a block, as the small-M kernel (its counters region)
constexpr int kDepth = 4;   // weight groups in flight a warp (4 KB)
constexpr size_t kSmemMax = 96 * 1024;
constexpr int64_t kSliceM = 8;  // tokens a launch

__global__ void bitplanes_from_packed_kernel(const uint8_t* __restrict__ codes, uint32_t* __restrict__ planes,
                                             int64_t k, int64_t words) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= words) return;
  // i = ((rb * groups + group) * 2 + h) * 128 + lane * 4 + e
  const int e = static_cast<int>(i & 3), lane = static_cast<int>((i >> 2) & 31), h = static_cast<int>((i >> 7) & 1);
  const int64_t block_group = i >> 8, groups = k / gemm::kBitplaneGroup;
  const int64_t rb = block_group / groups, group = block_group % groups;
  planes[i] = gemm::bitplane_word(codes + rb * k * 8, k, group, h, lane, e);
}

template <int ACT_BITS, int TILES>
void launch(const kernels::W4A16SmallMParams& params, dim3 grid, size_t smem, cudaStream_t stream) {
  auto* kernel = kernels::w4_bitwise_kernel<ACT_BITS, TILES, kDepth, kWarps>;
  static const bool configured = [&] {
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemMax));
    return true;
  }();
  (void)configured;
  launch_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, params);
  QSPEC_CUDA_CHECK_LAUNCH("w4_bitwise_kernel");
}

template <int ACT_BITS>
void launch_tiles(int tiles, const kernels::W4A16SmallMParams& params, dim3 grid, size_t smem, cudaStream_t stream) {
  if (tiles <= 1) launch<ACT_BITS, 1>(params, grid, smem, stream);
  else if (tiles <= 2) launch<ACT_BITS, 2>(params, grid, smem, stream);
  else if (tiles <= 4) launch<ACT_BITS, 4>(params, grid, smem, stream);
  else if constexpr (ACT_BITS == 8) launch<ACT_BITS, 8>(params, grid, smem, stream);  // int4: 4 tiles hold 8 tokens
}

}  // namespace

bool w4_bitwise_supports(const W4A16Weights& w, quant::Format format) {
  return (format == quant::Format::int8 || format == quant::Format::int4) && w.group == gemm::kBitplaneGroup &&
         w.k % gemm::kBitplaneGroup == 0 && !w.has_min();  // no int4-asym variant
}

void w4_bitplanes_from_packed(const W4A16Weights& w, void* bitplanes, void* stream) {
  QSPEC_CHECK(w.k % gemm::kBitplaneGroup == 0 && w.group == gemm::kBitplaneGroup,
              "cuda::w4_bitplanes_from_packed: the Bitwise strategy needs k % 128 == 0 and weight groups of 128 (k ",
              w.k, ", group ", w.group, ")");
  QSPEC_CHECK(bitplanes != nullptr && is_aligned_16(bitplanes), "cuda::w4_bitplanes_from_packed: 16-byte aligned output");
  const int64_t words = gemm::bitplane_bytes(w.n, w.k) / 4;
  if (words == 0) return;
  const int threads = 256;
  bitplanes_from_packed_kernel<<<static_cast<unsigned>((words + threads - 1) / threads), threads, 0,
                                 as_stream(stream)>>>(static_cast<const uint8_t*>(w.codes),
                                                      static_cast<uint32_t*>(bitplanes), w.k, words);
  QSPEC_CUDA_CHECK_LAUNCH("bitplanes_from_packed_kernel");
}

void w4_quantized_gemm_bitwise(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, const void* bitplanes,
                               f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream) {
  const char* who = "cuda::w4_quantized_gemm_bitwise";
  QSPEC_CHECK(w4_bitwise_supports(w, x.format), who, ": needs int8 or int4 activations (got ", kernels::format_label(x.format),
              "), weight groups of 128 and k % 128 == 0 (k ", w.k, ", group ", w.group, ")");
  QSPEC_CHECK(bitplanes != nullptr && is_aligned_16(bitplanes), who,
              ": no bit-plane copy of the weights (cuda::w4_bitplanes_from_packed)");
  const kernels::ActivationRows rows = detail::activation_rows(x, m, w, who);
  QSPEC_CHECK(ldy >= w.n, who, ": ldy ", ldy, " < n ", w.n);
  if (m == 0) return;
  kernels::W4A16Layout layout = detail::w4a16_layout(w);
  layout.codes = static_cast<const uint8_t*>(bitplanes);
  const int act_bits = x.format == quant::Format::int8 ? 8 : 4;
  const int64_t row_tiles = (layout.row_blocks + kWarps - 1) / kWarps;
  QSPEC_CHECK(row_tiles * 4 <= static_cast<int64_t>(detail::kW4A16SplitKCounterBytes), who, ": n ", w.n, " too large");
  const int64_t groups = w.k / gemm::kBitplaneGroup;
  const int sms = multiprocessor_count();
  cudaStream_t s = as_stream(stream);
  auto* yh = reinterpret_cast<__half*>(y);
  for (int64_t m0 = 0; m0 < m; m0 += kSliceM) {
    const int64_t slice = std::min(kSliceM, m - m0);
    const int tokens_per_tile = 8 / act_bits;
    const int needed = static_cast<int>((slice + tokens_per_tile - 1) / tokens_per_tile);
    const int tiles = needed <= 1 ? 1 : needed <= 2 ? 2 : needed <= 4 ? 4 : 8;
    // Split-K: ~3 blocks a multiprocessor, within the small-M kernel's bound (so its workspace
    // suffices), then more if the block's x codes and planes exceed the shared memory.
    int64_t splits = std::min<int64_t>({(3 * sms + row_tiles - 1) / row_tiles, groups,
                                        detail::w4a16_max_splits(slice, w.k)});
    splits = std::max<int64_t>(splits, 1);
    auto smem_for = [&](int64_t sp) {
      const int64_t per_split = (groups + sp - 1) / sp;
      return kernels::W4BitwiseSmem{static_cast<int>(std::min<int64_t>(slice, tiles * tokens_per_tile)),
                                    static_cast<int>(per_split * 128), tiles, static_cast<int>(per_split)}
          .bytes();
    };
    while (static_cast<size_t>(smem_for(splits)) > kSmemMax && splits < groups) ++splits;
    splits = detail::splits_that_fit(splits, slice, w.n, workspace, workspace_bytes);
    QSPEC_CHECK(static_cast<size_t>(smem_for(splits)) <= kSmemMax, who, ": k ", w.k,
                " needs more split-K workspace than given (", workspace_bytes, " bytes)");
    kernels::W4A16SmallMParams params{};
    params.w = layout;
    params.a = detail::activation_rows_from(rows, x, m0);
    kernels::set_output_slice(params, yh + m0 * ldy, ldy, slice, splits, workspace);
    const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(splits));
    const size_t smem = static_cast<size_t>(smem_for(splits));
    if (act_bits == 8) launch_tiles<8>(tiles, params, grid, smem, s);
    else launch_tiles<4>(tiles, params, grid, smem, s);
  }
}

}  // namespace qspec::cuda
