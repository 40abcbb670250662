// The decode attention over an int8 KV cache: the tiles kernel's INT8 instances (the kernel
// DecodeAttention::automatic runs: tensor cores at head_dim 64 and up, the f32 tiles at 32), in a
// file of their own so that they compile beside the f16 instances rather than after them.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/paged_attention_decode_tiles.cuh"

namespace qspec::cuda::detail {
namespace {
template <int D>
void launch_decode_int8_d(const kernels::DecodeParams& params, int heads_per_block, dim3 grid, cudaStream_t stream) {
  constexpr bool kMma = D >= 64;  // automatic's choice (paged_attention_decode.cu)
  void (*kernel)(kernels::DecodeParams) =
      heads_per_block == 1   ? kernels::paged_attention_decode_tiles_kernel<D, 1, kMma, true>
      : heads_per_block == 2 ? kernels::paged_attention_decode_tiles_kernel<D, 2, kMma, true>
      : heads_per_block == 4 ? kernels::paged_attention_decode_tiles_kernel<D, 4, kMma, true>
                             : kernels::paged_attention_decode_tiles_kernel<D, 8, kMma, true>;
  launch_pdl(kernel, grid, dim3(kernels::kDecodeWarps * 32), 0, stream, params);
  QSPEC_CUDA_CHECK_LAUNCH("paged_attention_decode_tiles_kernel (int8 cache)");
}
}  // namespace

void launch_decode_int8(const kernels::DecodeParams& params, int64_t head_dim, int heads_per_block, dim3 grid,
                        cudaStream_t stream) {
  if (head_dim == 32) launch_decode_int8_d<32>(params, heads_per_block, grid, stream);
  else if (head_dim == 64) launch_decode_int8_d<64>(params, heads_per_block, grid, stream);
  else if (head_dim == 128) launch_decode_int8_d<128>(params, heads_per_block, grid, stream);
  else launch_decode_int8_d<256>(params, heads_per_block, grid, stream);
}

}  // namespace qspec::cuda::detail
