// The W4A16 dequantize kernel's launcher (kernels/w4a16_dequant.cuh): packed 4-bit weights to f16 for cuBLAS.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_dequant.cuh"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {
void w4a16_dequantize(const W4A16Weights& w, f16_bits* out, void* stream) {
  const kernels::W4A16Layout layout = detail::w4a16_layout(w, /*zero_points=*/true);
  QSPEC_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "cuda::w4a16_dequantize: out must be 16-byte aligned");
  // One block per (row block, 1024-k tile): 8 warps x 2 chunks (kernels/w4a16_dequant.cuh).
  constexpr int kTileChunks = 16, kWarps = 8;
  const int64_t chunks = layout.full_chunks + layout.tail;
  const int64_t blocks = static_cast<int64_t>(layout.row_blocks) * ((chunks + kTileChunks - 1) / kTileChunks);
  QSPEC_CHECK(blocks < (1ll << 31), "cuda::w4a16_dequantize: matrix too large");
  // int4-asym: the same kernel with fma(code, scale, min); int4-zp: with (u - z) * scale (their own
  // instantiations: int4's code is unchanged).
  auto* kernel = w.zero_codes  ? kernels::w4a16_dequant_kernel<kTileChunks, kWarps, false, true>
                 : w.has_min() ? kernels::w4a16_dequant_kernel<kTileChunks, kWarps, true>
                               : kernels::w4a16_dequant_kernel<kTileChunks, kWarps, false>;
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, as_stream(stream),
      layout, static_cast<int>(w.group), reinterpret_cast<__half*>(out));
  QSPEC_CUDA_CHECK_LAUNCH("w4a16_dequant_kernel");
}

}  // namespace qspec::cuda
