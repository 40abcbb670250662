// ADAngel's Bitwise strategy (issue 6) for 4-bit weights and integer activations (int8, or int4
// codes in int8 bytes), few tokens: y = x W^T with both operands split into 1-bit planes (DPR:
// the partition {1,1,1,1} x {1,...,1}, each plane promoted to b1), every plane pair one
// popcount(AND) on b1 mma.m16n8k256, the products reconstructed with the planes' two's
// complement weights: sum_k x w = sum_i sum_j c_i c_j popc(W_i & X_j), c_i = 2^i, the sign plane
// -2^(bits-1). Integer sums are exact; each weight group's sum is scaled in f32 as in the
// Padding kernels.
//
// Operands (ops/w4_bitplanes.h): an mma's A is 16 rows = 4 weight rows x 4 weight planes
// (the bit-plane copy of the weights, one 16-byte load per lane gives two row quads); its B is 8
// columns = one int8 token's 8 planes or two int4 tokens' 4 planes, built once per block in
// shared memory from the codes with warp ballots. Of the mma's 256 k bits only the first 128 are
// used (a1/a3 and b1 zero), so one mma is one weight group of 128 and its sum takes that group's
// scale: Hopper has no b1 shape with k 128.
//
// A thread's C fragment holds rows g, g + 8 (quad rows g / 4 and 2 + g / 4 of plane g % 4) x
// columns 2t, 2t + 1 (planes of one token). It folds its four products into two weighted integer
// sums, scales them by the weight group scale into f32 partials, and at the end the lanes of one
// (quad row, token) add their partials with shuffles (16 lanes for int8, 8 for int4).
// Split-K over blocks, last-block fix-up and programmatic dependent launch as w4a16_small_m.cuh.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/kernels/w4a16_small_m.cuh"  // W4A16SmallMParams

namespace qspec::cuda::kernels {

__device__ __forceinline__ void mma_b1_and_popc_k128(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(0u), "r"(0u), "r"(b0), "r"(0u), "r"(0));
}

// Shared memory a block needs: the x codes of its k range (rows x range bytes) and their planes
// (tiles x groups x 32 words, the same bytes for int8, half for int4 with two tokens a tile).
struct W4BitwiseSmem {
  int rows, range, tiles, groups;
  __host__ __device__ int x_bytes() const { return (rows * range + 15) / 16 * 16; }
  __host__ __device__ int bytes() const { return x_bytes() + tiles * groups * 128; }
};

template <int ACT_BITS, int TILES, int DEPTH, int WARPS>
__global__ __launch_bounds__(WARPS * 32) void w4_bitwise_kernel(const W4A16SmallMParams p) {
  constexpr int TPT = 8 / ACT_BITS;  // tokens an n8 tile holds
  constexpr int ROWS = WARPS * 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y;
  const int groups = p.w.k / 128;
  const int group_begin = static_cast<int>(static_cast<int64_t>(split) * groups / p.splits);
  const int group_end = static_cast<int>(static_cast<int64_t>(split + 1) * groups / p.splits);
  const int n_groups = group_end - group_begin;
  const int rb = min(tile * WARPS + warp, p.w.row_blocks - 1);
  const uint8_t* w_base = p.w.codes + static_cast<int64_t>(rb) * p.w.k * 8 + lane * 16;
  // This lane's weight scales: rows 4q + g/4 and 4q + 2 + g/4 of the block, q = 0..3 = scale
  // words g/4, 2 + g/4, 4 + g/4, 6 + g/4 (low halves rows < 8, high halves rows 8..15).
  const uint32_t* s_base = p.w.scales + static_cast<int64_t>(rb) * p.w.groups * 8 + (g >> 2);

  uint4 w_ring[DEPTH][2];
  uint32_t s_ring[DEPTH][4];
  auto fetch = [&](int slot, int group) {
    w_ring[slot][0] = load_stream_16(w_base + static_cast<int64_t>(group) * 1024);
    w_ring[slot][1] = load_stream_16(w_base + static_cast<int64_t>(group) * 1024 + 512);
#pragma unroll
    for (int i = 0; i < 4; ++i) s_ring[slot][i] = __ldg(s_base + group * 8 + 2 * i);
  };
  grid_launch_dependents();
#pragma unroll
  for (int i = 0; i < DEPTH; ++i)
    if (i < n_groups) fetch(i, group_begin + i);
  grid_dependency_wait();  // weights are in flight; x and every global write come after this

  // x codes of the block's k range into shared memory, then their planes: word (tile, group, col,
  // t) = bit `plane` of x[token][128 group + 32 t + 0..31], col = (token - TPT tile) ACT_BITS + plane.
  extern __shared__ __align__(16) uint8_t smem[];
  const int k_begin = group_begin * 128, range = n_groups * 128;
  const W4BitwiseSmem layout{min(p.m, TILES * TPT), range, TILES, n_groups};
  const int8_t* x = static_cast<const int8_t*>(p.a.x);
  {
    const int pieces = range / 16;
    for (int i = threadIdx.x; i < layout.rows * pieces; i += WARPS * 32) {
      const int row = i / pieces, piece = i % pieces;
      *reinterpret_cast<uint4*>(smem + row * range + piece * 16) =
          __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * p.a.ldx + k_begin + piece * 16));
    }
  }
  __syncthreads();
  uint32_t* planes = reinterpret_cast<uint32_t*>(smem + layout.x_bytes());
  for (int i = warp; i < TILES * n_groups * 4; i += WARPS) {  // one 32-k piece of one tile a warp
    const int tt = i / (n_groups * 4), gl = (i / 4) % n_groups, piece = i % 4;
#pragma unroll
    for (int u = 0; u < TPT; ++u) {
      const int token = tt * TPT + u;
      const int v = token < layout.rows ? static_cast<int8_t>(smem[token * range + gl * 128 + piece * 32 + lane]) : 0;
#pragma unroll
      for (int plane = 0; plane < ACT_BITS; ++plane) {
        const uint32_t bits = __ballot_sync(0xffffffffu, (v >> plane) & 1);
        if (lane == 0) planes[((tt * n_groups + gl) * 8 + u * ACT_BITS + plane) * 4 + piece] = bits;
      }
    }
  }
  __syncthreads();

  // Plane weights of this thread's A rows and B columns.
  const int w_plane = g & 3;
  const int w_coef = w_plane == 3 ? -8 : 1 << w_plane;
  const int x_plane0 = (2 * t) % ACT_BITS, x_plane1 = (2 * t + 1) % ACT_BITS;
  const int x_coef0 = (x_plane0 == ACT_BITS - 1 ? -1 : 1) * (1 << x_plane0);
  const int x_coef1 = (x_plane1 == ACT_BITS - 1 ? -1 : 1) * (1 << x_plane1);
  const int token_in_tile = ACT_BITS == 4 ? t >> 1 : 0;

  float acc[4][TILES][2];  // [quad][tile][quad row g/4 (0) or 2 + g/4 (1)]
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int tt = 0; tt < TILES; ++tt) acc[q][tt][0] = acc[q][tt][1] = 0.0f;

  for (int c0 = 0; c0 < n_groups; c0 += DEPTH) {
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
      const int c = c0 + i;
      if (c < n_groups) {
        const uint4 w0 = w_ring[i][0], w1 = w_ring[i][1];
        uint32_t s[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) s[j] = s_ring[i][j];
        if (c + DEPTH < n_groups) fetch(i, group_begin + c + DEPTH);
        const int group = group_begin + c;
        float x_scale[TILES];
#pragma unroll
        for (int tt = 0; tt < TILES; ++tt) {
          x_scale[tt] = 1.0f;
          if (ACT_BITS == 4) {  // int4 activations: the group scale of this thread's token
            const int token = min(tt * TPT + token_in_tile, p.m - 1);
            x_scale[tt] = __ldg(p.a.scales + static_cast<int64_t>(token) * p.a.scale_ld + (group * 128) / p.a.group);
          }
        }
        const uint32_t a[4][2] = {{w0.x, w0.y}, {w0.z, w0.w}, {w1.x, w1.y}, {w1.z, w1.w}};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          // Quad q's rows sit in scale word 2q' + g/4 (q' = q % 2), low half for q < 2.
          const float2 sw = unpack_half2(s[2 * (q & 1)]);
          const float2 sw_hi = unpack_half2(s[2 * (q & 1) + 1]);
          const float s_lo = q < 2 ? sw.x : sw.y, s_hi = q < 2 ? sw_hi.x : sw_hi.y;
#pragma unroll
          for (int tt = 0; tt < TILES; ++tt) {
            int d[4];
            mma_b1_and_popc_k128(d, a[q][0], a[q][1], planes[((tt * n_groups + c) * 8 + g) * 4 + t]);
            const int lo = w_coef * (x_coef0 * d[0] + x_coef1 * d[1]);
            const int hi = w_coef * (x_coef0 * d[2] + x_coef1 * d[3]);
            acc[q][tt][0] = fmaf(s_lo * x_scale[tt], static_cast<float>(lo), acc[q][tt][0]);
            acc[q][tt][1] = fmaf(s_hi * x_scale[tt], static_cast<float>(hi), acc[q][tt][1]);
          }
        }
      }
    }
  }

  // Lanes of one (quad row, token) add their partials (int8: every lane with the same g / 4, lane
  // bit 4; int4 also the same t / 2, lane bit 1); one lane of each writes the sum.
  const bool writer = (g & 3) == 0 && (t & 1) == 0 && (ACT_BITS == 4 || t == 0) && tile * WARPS + warp < p.w.row_blocks;
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int tt = 0; tt < TILES; ++tt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = acc[q][tt][h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        if (ACT_BITS == 8) v += __shfl_xor_sync(0xffffffffu, v, 2);
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        const int row = rb * 16 + 4 * q + 2 * h + (g >> 2);
        const int token = tt * TPT + token_in_tile;
        if (!writer || row >= p.w.n || token >= p.m) continue;
        if (ACT_BITS == 8) v *= __ldg(p.a.scales + token);
        if (p.splits == 1) p.y[static_cast<int64_t>(token) * p.ldy + row] = __float2half_rn(v);
        else p.partials[(static_cast<int64_t>(split) * p.m + token) * p.w.n + row] = v;
      }
  if (p.splits == 1) return;

  const int row_begin = tile * ROWS;
  splitk_finish<WARPS * 32>(p.counters, tile, p.splits, p.partials, p.y, p.ldy, p.m, p.w.n, row_begin,
                            min(ROWS, p.w.n - row_begin));
}

}  // namespace qspec::cuda::kernels
