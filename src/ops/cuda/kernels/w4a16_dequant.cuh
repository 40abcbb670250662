// Packed W4A16 weights (gemm/w4a16_pack.h) -> f16 [n, k] row-major, for the cuBLAS path.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_common.cuh"

namespace qspec::cuda::kernels {

// One warp per (row block, chunk), grid-stride. Lane 4g+t writes 8 consecutive values of rows
// g and g + 8 per k pair (16-byte stores). out = f16(code * scale), correctly rounded.
__global__ void w4a16_dequant_kernel(const W4A16Layout w, int group, __half* __restrict__ out) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int chunks = w.full_chunks + w.tail;
  const int64_t items = static_cast<int64_t>(w.row_blocks) * chunks;
  const int pairs_per_group = group / 32;
  for (int64_t item = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    const int rb = static_cast<int>(item / chunks), chunk = static_cast<int>(item % chunks);
    const uint8_t* base = w.codes + static_cast<int64_t>(rb) * w.k * 8 + static_cast<int64_t>(chunk) * 512;
    uint32_t words[4];
    int pairs;
    if (chunk < w.full_chunks) {
      const uint4 v = load_stream_16(base + lane * 16);
      words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
      pairs = 2;
    } else {
      const uint2 v = load_stream_8(base + lane * 8);
      words[0] = v.x, words[1] = v.y, words[2] = words[3] = 0;
      pairs = 1;
    }
    for (int hp = 0; hp < pairs; ++hp) {
      const int pair = 2 * chunk + hp;
      const uint32_t scale_word = __ldg(w.scales + (static_cast<int64_t>(rb) * w.groups + pair / pairs_per_group) * 8 + g);
      const __half2 pair_scale = *reinterpret_cast<const __half2*>(&scale_word);
      const __half2 s_low = __low2half2(pair_scale), s_high = __high2half2(pair_scale);
      uint32_t a[4], b[4];
      dequant_int4x8(words[2 * hp], a);
      dequant_int4x8(words[2 * hp + 1], b);
      auto scaled = [](uint32_t v, __half2 s) {
        __half2 r = __hmul2(*reinterpret_cast<__half2*>(&v), s);
        return *reinterpret_cast<uint32_t*>(&r);
      };
      const int row0 = rb * 16 + g, row1 = row0 + 8;
      const int64_t col = static_cast<int64_t>(pair) * 32 + t * 8;
      if (row0 < w.n)
        *reinterpret_cast<uint4*>(out + row0 * static_cast<int64_t>(w.k) + col) =
            make_uint4(scaled(a[0], s_low), scaled(a[2], s_low), scaled(b[0], s_low), scaled(b[2], s_low));
      if (row1 < w.n)
        *reinterpret_cast<uint4*>(out + row1 * static_cast<int64_t>(w.k) + col) =
            make_uint4(scaled(a[1], s_high), scaled(a[3], s_high), scaled(b[1], s_high), scaled(b[3], s_high));
    }
  }
}

}  // namespace qspec::cuda::kernels
