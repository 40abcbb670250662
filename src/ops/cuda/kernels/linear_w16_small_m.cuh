// W16A16 GEMM for few tokens (1-8): y[m, n] = x[m, k] W[n, k]^T with f16 or bf16 weights streamed
// from device memory straight into mma.sync A fragments, f32 accumulation.
//
// Why not cuBLAS at these sizes: a decode step's f16 GEMMs are weight streams (1 GB for Llama-3's
// lm_head, 50-235 MB a layer in W16A16), and cuBLAS reads them at 2.1-2.8 TB/s on the H100 without
// programmatic dependent launch, so its first weights leave HBM only after the previous kernel
// has ended (docs/perf-journal/perf-notes-journal-2026.md, "A small-M f16 GEMM"). Here each warp's first weights are loaded
// before the grid-dependency wait, and the loop keeps the next chunks' loads in flight while it
// multiplies the current ones.
//
// Layout trick: a dot product over k does not care in which order k is summed, so the mma's k
// order need not be the matrix's. Lane (g, t) loads 16 bytes (8 values) of row g and of row g + 8
// at k = 32 c + 8 t, and the matching 16 bytes of token g's x row. The first 4 values of each
// are the A / B fragment halves of one m16n8k16 (the mma's k 2t, 2t + 1 and 2t + 8, 2t + 9), the
// last 4 those of a second: two mma a 32-wide chunk, with no shuffle and no shared memory. A
// warp's load instruction covers 8 rows x 64 contiguous bytes (whole 32-byte sectors).
//
// Work split: a block is 8 warps; each warp owns a 16-row block and one of k_slices parts of k
// (k_slices 1, 2, 4 or 8 warps share a row block); a block's slices are summed in shared memory
// in k order. No split across blocks, so no workspace and no second pass.
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

inline constexpr int kW16SmallMWarps = 8;
inline constexpr int kW16SmallMChunk = 32;  // k values a lane group covers per chunk (two mma)
// Chunks a warp has in flight per load batch (118 registers: 2 blocks a multiprocessor). Two
// versions with a second tile of 8 tokens lost to cuBLAS at 9-16 tokens (2 chunks a batch, as 4
// spilled: +3 % at batch 16 in the decode step; 4 chunks with each chunk's x loaded before its
// mma: up to 19 % slower than cuBLAS alone; docs/perf-journal/perf-notes-journal-2026.md), so the kernel takes one tile.
inline constexpr int kW16SmallMUnroll = 4;

struct W16SmallMParams {
  const uint16_t* x;  // m rows of k values
  const uint16_t* w;  // n rows of k values
  uint16_t* y;        // m rows of n values
  int m, n, k;
  int k_slices;
};

template <bool BF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    mma_f16_16816(d, a, b0, b1);
  }
}

template <bool BF16>
__device__ __forceinline__ uint16_t float_to_bits16(float v) {
  if constexpr (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else return __half_as_ushort(__float2half_rn(v));
}

template <bool BF16>
__global__ __launch_bounds__(kW16SmallMWarps * 32, 2) void linear_w16_small_m_kernel(const W16SmallMParams p) {
  constexpr int U = kW16SmallMUnroll;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int slice = warp % p.k_slices;
  const int row_block = blockIdx.x * (kW16SmallMWarps / p.k_slices) + warp / p.k_slices;
  const int row0 = row_block * 16;
  const int chunks = (p.k + kW16SmallMChunk - 1) / kW16SmallMChunk;
  const int chunk_begin = static_cast<int>(static_cast<int64_t>(slice) * chunks / p.k_slices);
  const int chunk_end = static_cast<int>(static_cast<int64_t>(slice + 1) * chunks / p.k_slices);
  // Rows past n load row n - 1 (their sums are never stored); k past the end loads zeros.
  const uint16_t* w_lo = p.w + static_cast<int64_t>(min(row0 + g, p.n - 1)) * p.k + t * 8;
  const uint16_t* w_hi = p.w + static_cast<int64_t>(min(row0 + g + 8, p.n - 1)) * p.k + t * 8;
  const uint16_t* x_row = p.x + static_cast<int64_t>(min(g, p.m - 1)) * p.k + t * 8;  // token g

  // Whether this lane's 16 bytes of chunk c are inside its slice and the matrix.
  auto chunk_in = [&](int c) { return c < chunk_end && c * kW16SmallMChunk + t * 8 < p.k; };
  uint4 w_next[U][2];
  auto load_weights = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u;
      const bool in = chunk_in(c);
      w_next[u][0] = in ? load_stream_16(w_lo + c * kW16SmallMChunk) : make_uint4(0, 0, 0, 0);
      w_next[u][1] = in ? load_stream_16(w_hi + c * kW16SmallMChunk) : make_uint4(0, 0, 0, 0);
    }
  };

  grid_launch_dependents();
  load_weights(chunk_begin);  // weights are constants: in flight before the previous kernel ends
  grid_dependency_wait();      // x and y come after this

  float acc[2][4] = {};  // two chains (the chunk's two mma), summed at the end
  for (int c0 = chunk_begin; c0 < chunk_end; c0 += U) {
    uint4 w_now[U][2], x_now[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      w_now[u][0] = w_next[u][0];
      w_now[u][1] = w_next[u][1];
      const int c = c0 + u;
      x_now[u] = chunk_in(c) ? __ldg(reinterpret_cast<const uint4*>(x_row + c * kW16SmallMChunk)) : make_uint4(0, 0, 0, 0);
    }
    if (c0 + U < chunk_end) load_weights(c0 + U);  // the next batch flies while this one multiplies
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t a0[4] = {w_now[u][0].x, w_now[u][1].x, w_now[u][0].y, w_now[u][1].y};
      const uint32_t a1[4] = {w_now[u][0].z, w_now[u][1].z, w_now[u][0].w, w_now[u][1].w};
      mma_16816<BF16>(acc[0], a0, x_now[u].x, x_now[u].y);
      mma_16816<BF16>(acc[1], a1, x_now[u].z, x_now[u].w);
    }
  }
  float sum[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) sum[e] = acc[0][e] + acc[1][e];

  if (p.k_slices > 1) {  // the slices' sums through shared memory, added in k order from zero
    __shared__ float slice_sums[kW16SmallMWarps][4][32];
#pragma unroll
    for (int e = 0; e < 4; ++e) slice_sums[warp][e][lane] = sum[e];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float total = 0.0f;
      for (int s = 0; s < p.k_slices; ++s) total += slice_sums[warp + s][e][lane];
      sum[e] = total;
    }
  }
  // C fragment: e 0, 1 are row g, tokens 2t, 2t + 1; e 2, 3 row g + 8.
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = row0 + g + (e >= 2 ? 8 : 0), token = 2 * t + (e & 1);
    if (row < p.n && token < p.m) p.y[static_cast<int64_t>(token) * p.n + row] = float_to_bits16<BF16>(sum[e]);
  }
}

}  // namespace qspec::cuda::kernels
