// Packed W4A16 weights (ops/w4a16_pack.h) -> f16 [n, k] row-major, for the cuBLAS path.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_common.cuh"

namespace qspec::cuda::kernels {

// One block per (row block, TILE_CHUNKS x 64 k): a pure streaming kernel (n k / 2 bytes in,
// 2 n k out), so it is built for bytes in flight and whole-line writes:
//  - each warp issues the loads of all its CPW chunks (16 bytes a lane each) and their scales
//    before using any, so a multiprocessor keeps ~6 blocks x 8 KB of codes in flight;
//  - the packed layout gives lane 4g+t 8 values of rows g and g + 8 per k pair, so a direct
//    store would touch 16 rows (8 KB apart for k 4096) per warp; instead the tile is
//    dequantized into shared memory and written back row by row, 512 contiguous bytes per warp
//    store. Rows are padded by 64 bytes (stride = 64 mod 128 bytes), so the 16-byte
//    shared stores of rows g, g + 1 land in distinct bank groups.
// out = f16(code * scale), correctly rounded (code is an exact f16 integer); with kHasMin
// (int4-asym: unsigned codes, zero_point_mins) out = f16(fma(code, scale, min)), one rounding;
// with kZeroCodes (int4-zp: packed zero points there) out = f16((u - z) * scale).
template <int TILE_CHUNKS, int WARPS, bool kHasMin = false, bool kZeroCodes = false>
__global__ __launch_bounds__(WARPS * 32) void w4a16_dequant_kernel(const W4A16Layout w, int group,
                                                                    __half* __restrict__ out) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  constexpr int CPW = TILE_CHUNKS / WARPS;  // chunks per warp
  static_assert(TILE_CHUNKS % WARPS == 0, "whole chunks per warp");
  constexpr int TILE_K = TILE_CHUNKS * 64;
  constexpr int ROW_HALVES = TILE_K + 32;
  constexpr int THREADS = WARPS * 32;
  __shared__ __align__(16) __half tile[16 * ROW_HALVES];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int chunks = w.full_chunks + w.tail, k_tiles = (chunks + TILE_CHUNKS - 1) / TILE_CHUNKS;
  const int rb = static_cast<int>(blockIdx.x / k_tiles), chunk0 = static_cast<int>(blockIdx.x % k_tiles) * TILE_CHUNKS;
  const int pairs = 2 * w.full_chunks + w.tail, pairs_per_group = group / 32;
  const uint8_t* codes = w.codes + static_cast<int64_t>(rb) * w.k * 8;
  const uint32_t* scales = w.scales + static_cast<int64_t>(rb) * w.groups * 8 + g;
  constexpr bool kWords = kHasMin || kZeroCodes;
  const uint32_t* mins = kHasMin ? zero_point_mins(w) + static_cast<int64_t>(rb) * w.groups * 8 + g : nullptr;
  const uint8_t* zeros = kZeroCodes ? zero_point_bytes(w, rb) : nullptr;

  uint4 q[CPW];
  uint32_t s[CPW][2];
  uint32_t mn[CPW][kWords ? 2 : 1];
#pragma unroll
  for (int i = 0; i < CPW; ++i) {
    const int c = chunk0 + warp * CPW + i;
    if (c < w.full_chunks) {
      q[i] = load_stream_16(codes + static_cast<int64_t>(c) * 512 + lane * 16);
    } else if (c < chunks) {  // k % 64 == 32: the last chunk holds one pair, 8 bytes a lane
      const uint2 v = load_stream_8(codes + static_cast<int64_t>(c) * 512 + lane * 8);
      q[i] = make_uint4(v.x, v.y, 0u, 0u);
    } else {
      q[i] = make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int hp = 0; hp < 2; ++hp) {
      const int pair = 2 * c + hp;
      s[i][hp] = pair < pairs ? __ldg(scales + (pair / pairs_per_group) * 8) : 0u;
      if constexpr (kHasMin) mn[i][hp] = pair < pairs ? __ldg(mins + (pair / pairs_per_group) * 8) : 0u;
      if constexpr (kZeroCodes) mn[i][hp] = pair < pairs ? zero_point_word(zeros, pair / pairs_per_group, g) : 0u;
    }
  }

  // code * scale (int4), fma(code, scale, min) (int4-asym): one instruction either way.
  auto scaled = [](uint32_t v, __half2 scale, __half2 min) {
    __half2 r;
    if constexpr (kHasMin)
      r = __hfma2(*reinterpret_cast<__half2*>(&v), scale, min);
    else
      r = __hmul2(*reinterpret_cast<__half2*>(&v), scale);
    return *reinterpret_cast<uint32_t*>(&r);
  };
#pragma unroll
  for (int i = 0; i < CPW; ++i)
#pragma unroll
    for (int hp = 0; hp < 2; ++hp) {
      const __half2 pair_scale = *reinterpret_cast<const __half2*>(&s[i][hp]);
      const __half2 s_low = __low2half2(pair_scale), s_high = __high2half2(pair_scale);
      __half2 m_low = s_low, m_high = s_high;  // unused without minimums
      if constexpr (kHasMin) {
        const __half2 pair_min = *reinterpret_cast<const __half2*>(&mn[i][hp]);
        m_low = __low2half2(pair_min);
        m_high = __high2half2(pair_min);
      }
      uint32_t a[4], b[4];
      if constexpr (kZeroCodes) {
        const ZeroConstants zc = zero_constants(mn[i][hp], zero_byte_selector(g));
        dequant_zero_codes4x8(hp ? q[i].z : q[i].x, zc, a);
        dequant_zero_codes4x8(hp ? q[i].w : q[i].y, zc, b);
      } else {
        dequant_codes4x8<kHasMin>(hp ? q[i].z : q[i].x, a);
        dequant_codes4x8<kHasMin>(hp ? q[i].w : q[i].y, b);
      }
      const int col = ((warp * CPW + i) * 2 + hp) * 32 + t * 8;
      *reinterpret_cast<uint4*>(tile + g * ROW_HALVES + col) = make_uint4(
          scaled(a[0], s_low, m_low), scaled(a[2], s_low, m_low), scaled(b[0], s_low, m_low), scaled(b[2], s_low, m_low));
      *reinterpret_cast<uint4*>(tile + (g + 8) * ROW_HALVES + col) =
          make_uint4(scaled(a[1], s_high, m_high), scaled(a[3], s_high, m_high), scaled(b[1], s_high, m_high),
                     scaled(b[3], s_high, m_high));
    }
  __syncthreads();

  // Write back: 16 rows x TILE_K halves, 16 bytes a thread, consecutive threads along a row.
  const int k0 = chunk0 * 64, k_valid = min(TILE_K, w.k - k0);
  constexpr int PIECES_PER_ROW = TILE_K / 8;
#pragma unroll
  for (int it = 0; it < 16 * PIECES_PER_ROW / THREADS; ++it) {
    const int i = it * THREADS + threadIdx.x;
    const int r = i / PIECES_PER_ROW, piece = i % PIECES_PER_ROW;
    const int row = rb * 16 + r;
    if (row < w.n && piece * 8 < k_valid)
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(row) * w.k + k0 + piece * 8) =
          *reinterpret_cast<const uint4*>(tile + r * ROW_HALVES + piece * 8);
  }
}

}  // namespace qspec::cuda::kernels
