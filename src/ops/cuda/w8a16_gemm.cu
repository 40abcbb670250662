// W8A16 dispatch: the streaming kernel (kernels/w8a16.cuh) for decode and verify sizes, or
// dequantize to f16 + cuBLAS for prefill sizes.

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w8a16.cuh"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/ops.h"
#include "ops/w8a16_pack.h"

namespace qspec::cuda {
namespace {

void check_weights(const W8A16Weights& w) {
  QSPEC_CHECK(w.codes != nullptr && w.scales != nullptr, "cuda::w8a16: null weights");
  QSPEC_CHECK(w.n > 0 && w.k > 0 && w.n < (1ll << 31) && w.k < (1ll << 26) && w.k % 32 == 0 &&
                  gemm::w8a16_group_supported(w.group) && w.k % w.group == 0,
              "cuda::w8a16: bad weight shape ", w.n, " x ", w.k, " group ", w.group,
              " (k a multiple of 32 and of the group; the group 16 or a power of two from 32)");
  QSPEC_CHECK(is_aligned_16(w.codes) && reinterpret_cast<uintptr_t>(w.scales) % 8 == 0,
              "cuda::w8a16: misaligned packed weights");
}

// The most k slices (warps sharing a row block) that keep >= 8 chunks a warp, as the small-M f16
// kernel's rule (kernels/linear_w16_small_m.cuh).
int k_slices_for(int64_t k) {
  const int64_t chunks = k / 32;
  int slices = kernels::kW8A16Warps;
  while (slices > 1 && chunks / slices < 8) slices /= 2;
  return slices;
}

template <int NT>
void launch(const kernels::W8A16Params& params, bool group16, int blocks, void* stream) {
  const auto kernel = group16 ? kernels::w8a16_kernel<NT, true> : kernels::w8a16_kernel<NT, false>;
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kernels::kW8A16Warps * 32), 0, as_stream(stream),
             params);
  QSPEC_CUDA_CHECK_LAUNCH("w8a16_kernel");
}

// The kernel over every token, 64 a launch.
void run_kernel(const f16_bits* x, int64_t m, int64_t ldx, const W8A16Weights& w, f16_bits* y, int64_t ldy,
                void* stream) {
  kernels::W8A16Params params{};
  params.codes = static_cast<const int8_t*>(w.codes);
  params.scales = w.scales;
  params.n = static_cast<int>(w.n);
  params.k = static_cast<int>(w.k);
  params.ldx = static_cast<int>(ldx);
  params.ldy = static_cast<int>(ldy);
  const bool group16 = w.group == 16;
  params.chunks_per_group_shift = 0;
  while (!group16 && (int64_t{32} << params.chunks_per_group_shift) < w.group) ++params.chunks_per_group_shift;
  params.groups = static_cast<int>(w.k / w.group);
  params.k_slices = k_slices_for(w.k);
  const int64_t row_blocks = (w.n + 15) / 16, per_block = kernels::kW8A16Warps / params.k_slices;
  const int blocks = static_cast<int>((row_blocks + per_block - 1) / per_block);
  for (int64_t first = 0; first < m; first += kernels::kW8A16MaxTileTokens) {
    const int64_t tokens = std::min<int64_t>(m - first, kernels::kW8A16MaxTileTokens);
    params.x = x + first * ldx;
    params.y = y + first * ldy;
    params.m = static_cast<int>(tokens);
    if (tokens <= 8) launch<1>(params, group16, blocks, stream);
    else if (tokens <= 16) launch<2>(params, group16, blocks, stream);
    else if (tokens <= 32) launch<4>(params, group16, blocks, stream);
    else launch<8>(params, group16, blocks, stream);
  }
}

}  // namespace

W8A16Path w8a16_choose_path(int64_t m) {
  return m <= kW8A16KernelMaxTokens ? W8A16Path::kernel : W8A16Path::dequant_cublas;
}

size_t w8a16_workspace_bytes(int64_t m, int64_t n, int64_t k, W8A16Path path) {
  if (path == W8A16Path::automatic) path = w8a16_choose_path(m);
  // The f16 weights go after the W4A16 split-K counters a model's shared workspace starts with
  // (they must stay zero for the next W4A16 launch).
  return path == W8A16Path::dequant_cublas ? detail::kW4A16CounterBytes + static_cast<size_t>(n * k) * 2 : 0;
}

void w8a16_dequantize(const W8A16Weights& w, f16_bits* out, void* stream) {
  check_weights(w);
  const int64_t pieces = (w.n + 15) / 16 * (w.k / 32) * 32;  // a lane's 16 bytes of a chunk
  constexpr int kThreads = 256;
  kernels::w8a16_dequantize_kernel<<<static_cast<unsigned>((pieces + kThreads - 1) / kThreads), kThreads, 0,
                                     as_stream(stream)>>>(static_cast<const int8_t*>(w.codes), w.scales,
                                                          static_cast<int>(w.n), static_cast<int>(w.k),
                                                          static_cast<int>(w.group), out);
  QSPEC_CUDA_CHECK_LAUNCH("w8a16_dequantize_kernel");
}

void w8a16_gemm(const Blas& blas, const f16_bits* x, int64_t m, int64_t ldx, const W8A16Weights& w, f16_bits* y,
                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream, W8A16Path path) {
  check_weights(w);
  QSPEC_CHECK(m >= 0 && m < (1ll << 31) && ldx >= w.k && ldx % 4 == 0 && ldx < (1ll << 31) && ldy >= w.n &&
                  ldy < (1ll << 31) && reinterpret_cast<uintptr_t>(x) % 8 == 0 && y != nullptr,
              "cuda::w8a16_gemm: x must be 8-byte aligned with ldx >= k (", w.k, ") and ldx % 4 == 0, ldy >= n (",
              w.n, "); got m ", m, " ldx ", ldx, " ldy ", ldy);
  if (m == 0) return;
  if (path == W8A16Path::automatic) path = w8a16_choose_path(m);
  if (path == W8A16Path::dequant_cublas && workspace != nullptr &&
      workspace_bytes >= w8a16_workspace_bytes(m, w.n, w.k, path)) {
    auto* w16 = reinterpret_cast<f16_bits*>(static_cast<char*>(workspace) + detail::kW4A16CounterBytes);
    w8a16_dequantize(w, w16, stream);
    gemm_w16_cublas(blas, x, m, ldx, w16, w.n, w.k, y, ldy, Dtype16::f16, stream);
    return;
  }
  run_kernel(x, m, ldx, w, y, ldy, stream);
}

}  // namespace qspec::cuda
