// The decode attention over an int8 KV cache: the tiles kernel's INT8 instances (the kernel
// DecodeAttention::automatic runs: tensor cores at head_dim 64 and up, the f32 tiles at 32), in a
// file of their own so that they compile beside the f16 instances rather than after them.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/paged_attention_decode_tiles.cuh"

namespace qspec::cuda::detail {
using DecodeKernel = void (*)(kernels::DecodeParams);
}  // namespace qspec::cuda::detail

namespace qspec::cuda::detail {
namespace {
template <int D>
DecodeKernel decode_kernel_int8_d(int heads_per_block) {
  constexpr bool kMma = D >= 64;  // automatic's choice (paged_attention_decode.cu)
  return heads_per_block == 1   ? kernels::paged_attention_decode_tiles_kernel<D, 1, kMma, true>
         : heads_per_block == 2 ? kernels::paged_attention_decode_tiles_kernel<D, 2, kMma, true>
         : heads_per_block == 4 ? kernels::paged_attention_decode_tiles_kernel<D, 4, kMma, true>
                                : kernels::paged_attention_decode_tiles_kernel<D, 8, kMma, true>;
}
}  // namespace

DecodeKernel decode_kernel_int8(int64_t head_dim, int heads_per_block) {
  return head_dim == 32    ? decode_kernel_int8_d<32>(heads_per_block)
         : head_dim == 64  ? decode_kernel_int8_d<64>(heads_per_block)
         : head_dim == 128 ? decode_kernel_int8_d<128>(heads_per_block)
                           : decode_kernel_int8_d<256>(heads_per_block);
}

}  // namespace qspec::cuda::detail
