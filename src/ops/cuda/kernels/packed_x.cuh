// Activations stored in the W4A16 packed k order, by the kernels that make a 4-bit GEMM's x.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace qspec::cuda::kernels {

// Vector i (8 values: 4 pieces of 2) of a row stored in the W4A16 packed k order
// (ops/w4a16_pack.h, w4a16_packed_x_index; cuda::W4A16TiledConfig::x_packed): piece q of the
// vector, piece 4 (i % 4) + q of its 32-value block, goes to piece 4 q + i % 4 of that block.
__device__ __forceinline__ void store_packed_x8(__half* row, int64_t i, uint4 v) {
  uint32_t* block = reinterpret_cast<uint32_t*>(row) + 16 * (i / 4);
  const int t = static_cast<int>(i % 4);
  block[t] = v.x;
  block[4 + t] = v.y;
  block[8 + t] = v.z;
  block[12 + t] = v.w;
}

}  // namespace qspec::cuda::kernels
