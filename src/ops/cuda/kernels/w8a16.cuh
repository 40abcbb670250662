// W8A16 GEMM for decode and verify sizes (1-64 tokens a launch): y[m, n] = x[m, k] W[n, k]^T with
// int8-group weights (layout: ops/w8a16_pack.h) streamed from device memory straight into mma.sync
// A fragments, f16 x, f32 accumulation; each group's exact sum times its f32 scale.
//
// Work split as the small-M f16 kernel (kernels/linear_w16_small_m.cuh): a block is 8 warps; each
// warp owns a 16-row block and one of k_slices parts of k, summed in shared memory in k order, so
// there is no workspace and no second pass. Each lane loads 16 bytes of codes a 32-k chunk (its
// fragments of both k tiles: a warp's load is 512 contiguous bytes) and, a token tile of 8, 8 bytes
// of x a k tile (the layout's k permutation makes them 4 consecutive values). The first chunks'
// codes are requested before the programmatic-launch wait (weights are constants).
//
// A word of 4 codes becomes two f16x2 registers: prmt puts each (code ^ 0x80) under a 0x64 high
// byte, f16 1024 + 128 + code, and one sub.f16x2 of 1152 leaves the code (exact). A k tile's mma
// accumulate into the group's partial sums; where a group ends (group % 16 == 0), the partials
// times the rows' scales join the totals (f32 fma) and restart from zero.
#pragma once
#include <cuda_fp16.h>

#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

inline constexpr int kW8A16Warps = 8;
inline constexpr int kW8A16MaxTileTokens = 64;  // token tiles of 8 a launch: 1, 2, 4 or 8

struct W8A16Params {
  const int8_t* codes;  // row_blocks * k * 16 bytes (ops/w8a16_pack.h)
  const float* scales;  // row_blocks * groups * 16
  const uint16_t* x;    // m rows of k f16 values, ldx apart
  uint16_t* y;          // m rows of n f16 values, ldy apart
  int m, n, k, ldx, ldy;
  int chunks_per_group_shift;  // groups of 32 or more: log2(group / 32)
  int groups;                  // k / group
  int k_slices;
};

__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// Codes 0, 1 of a word (bytes 0, 1) and codes 2, 3 as f16x2 registers, exact.
__device__ __forceinline__ void int8x4_to_half2x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  const uint32_t biased = word ^ 0x80808080u;  // code + 128, unsigned
  const uint32_t lo_bits = byte_perm(biased, 0x64646464u, 0x4140u);
  const uint32_t hi_bits = byte_perm(biased, 0x64646464u, 0x4342u);
  const uint32_t bias = 0x64806480u;  // f16 1152, twice
  asm("sub.f16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(lo_bits), "r"(bias));
  asm("sub.f16x2 %0, %1, %2;\n" : "=r"(hi) : "r"(hi_bits), "r"(bias));
}

// Chunks (32 k) a warp's load batch holds: the codes of one batch fly while the previous one
// multiplies. As many as fit 128 registers without spills (two blocks a multiprocessor): the
// token tiles' accumulators and x, and groups of 16's second scale, take the rest.
template <int NT, bool G16>
inline constexpr int kW8A16Unroll = NT == 1 ? (G16 ? 5 : 6) : NT == 2 ? (G16 ? 3 : 4) : 2;

// G16: groups of 16 (GGUF Q6_K), two scales a chunk (one a k tile); else groups of a power of
// two >= 32, one scale a chunk, flushed every chunks_per_group chunks.
template <int NT, bool G16>
__global__ __launch_bounds__(kW8A16Warps * 32, NT <= 4 ? 2 : 1) void w8a16_kernel(const W8A16Params p) {
  constexpr int U = kW8A16Unroll<NT, G16>;
  constexpr int S = G16 ? 2 : 1;  // scales a chunk
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int slice = warp % p.k_slices;
  const int row_blocks = (p.n + 15) / 16;
  const int row_block = blockIdx.x * (kW8A16Warps / p.k_slices) + warp / p.k_slices;
  // Warps past the last row block read the last one (their sums are never stored) and still
  // reach the block's barrier.
  const int rb = min(row_block, row_blocks - 1);
  const int chunks = p.k / 32;
  const int chunk_begin = static_cast<int>(static_cast<int64_t>(slice) * chunks / p.k_slices);
  const int chunk_end = static_cast<int>(static_cast<int64_t>(slice + 1) * chunks / p.k_slices);
  const int8_t* w_lane = p.codes + static_cast<int64_t>(rb) * p.k * 16 + lane * 16;
  // Scale pair (s[g], s[g + 8]) of group q: s_lane[q * 16]. Group of chunk c: 2c (G16: 2c + j for
  // its tile j) or c >> chunks_per_group_shift.
  const float* s_lane = p.scales + static_cast<int64_t>(rb) * p.groups * 16 + 2 * g;
  auto group_of_chunk = [&](int c) { return G16 ? 2 * c : c >> p.chunks_per_group_shift; };

  uint4 w_next[U];
  float2 s_next[U][S];
  auto load_batch = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u;
      const bool in = c < chunk_end;
      w_next[u] = in ? load_stream_16(w_lane + static_cast<int64_t>(c) * 512) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < S; ++j)
        s_next[u][j] = in ? __ldg(reinterpret_cast<const float2*>(s_lane + (group_of_chunk(c) + j) * 16))
                          : make_float2(0.0f, 0.0f);
    }
  };

  grid_launch_dependents();
  load_batch(chunk_begin);  // weights are constants: in flight before the previous kernel ends
  grid_dependency_wait();   // x and y come after this

  const uint16_t* x_rows[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) x_rows[i] = p.x + static_cast<int64_t>(min(8 * i + g, p.m - 1)) * p.ldx + 4 * t;

  float total[NT][4] = {}, part[NT][4] = {};
  auto flush = [&](float2 s) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      total[i][0] = fmaf(s.x, part[i][0], total[i][0]);  // row g, tokens 2t, 2t + 1
      total[i][1] = fmaf(s.x, part[i][1], total[i][1]);
      total[i][2] = fmaf(s.y, part[i][2], total[i][2]);  // row g + 8
      total[i][3] = fmaf(s.y, part[i][3], total[i][3]);
#pragma unroll
      for (int e = 0; e < 4; ++e) part[i][e] = 0.0f;
    }
  };
  // Groups of 32 or more: chunks left in the current group (a slice may start inside one).
  const int chunks_per_group = 1 << p.chunks_per_group_shift;
  int group_left = G16 ? 1 : chunks_per_group - (chunk_begin & (chunks_per_group - 1));
  float2 last_scale = make_float2(0.0f, 0.0f);

  for (int c0 = chunk_begin; c0 < chunk_end; c0 += U) {
    uint4 w_now[U];
    float2 s_now[U][S];
    uint2 x_now[U][2][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      w_now[u] = w_next[u];
#pragma unroll
      for (int j = 0; j < S; ++j) s_now[u][j] = s_next[u][j];
      const int c = min(c0 + u, chunk_end - 1);  // past the slice: a valid address, never used
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < NT; ++i) x_now[u][j][i] = __ldg(reinterpret_cast<const uint2*>(x_rows[i] + c * 32 + 16 * j));
    }
    if (c0 + U < chunk_end) load_batch(c0 + U);  // the next batch flies while this one multiplies
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u >= chunk_end) break;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t a[4];
        int8x4_to_half2x2(j == 0 ? w_now[u].x : w_now[u].z, a[0], a[1]);
        int8x4_to_half2x2(j == 0 ? w_now[u].y : w_now[u].w, a[2], a[3]);
#pragma unroll
        for (int i = 0; i < NT; ++i) mma_f16_16816(part[i], a, x_now[u][j][i].x, x_now[u][j][i].y);
        if constexpr (G16) flush(s_now[u][j]);
      }
      if constexpr (!G16) {
        last_scale = s_now[u][0];
        if (--group_left == 0) {
          flush(last_scale);
          group_left = chunks_per_group;
        }
      }
    }
  }
  if (!G16 && group_left != chunks_per_group) flush(last_scale);  // the slice ended inside a group

  if (p.k_slices > 1) {  // the slices' sums through shared memory, added in k order from zero
    __shared__ float slice_sums[kW8A16Warps][NT][4][32];
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) slice_sums[warp][i][e][lane] = total[i][e];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float sum = 0.0f;
        for (int s = 0; s < p.k_slices; ++s) sum += slice_sums[warp + s][i][e][lane];
        total[i][e] = sum;
      }
  }
  if (row_block >= row_blocks) return;
  // C fragment: e 0, 1 are row g, tokens 2t, 2t + 1 of the tile; e 2, 3 row g + 8.
  const int row0 = row_block * 16;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + g + (e >= 2 ? 8 : 0), token = 8 * i + 2 * t + (e & 1);
      if (row < p.n && token < p.m)
        p.y[static_cast<int64_t>(token) * p.ldy + row] = __half_as_ushort(__float2half_rn(total[i][e]));
    }
}

// The packed weights as f16 [n, k] row-major, f16(code * scale): a thread a lane's 16 bytes of a
// chunk (rows g and g + 8, 4 values each of both k tiles), 8-byte stores.
__global__ void w8a16_dequantize_kernel(const int8_t* codes, const float* scales, int n, int k, int group,
                                        uint16_t* out) {
  const int chunks = k / 32;
  const int64_t pieces = static_cast<int64_t>((n + 15) / 16) * chunks * 32;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= pieces) return;
  const int lane = static_cast<int>(index & 31), g = lane >> 2, t = lane & 3;
  const int64_t rb_chunk = index >> 5;
  const int rb = static_cast<int>(rb_chunk / chunks), chunk = static_cast<int>(rb_chunk % chunks);
  const int8_t* bytes = codes + (static_cast<int64_t>(rb) * chunks + chunk) * 512 + lane * 16;
  int8_t b[16];
  *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(bytes);
#pragma unroll
  for (int high_row = 0; high_row < 2; ++high_row) {
    const int row = rb * 16 + g + 8 * high_row;
    if (row >= n) continue;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = chunk * 32 + 16 * j + 4 * t;
      const float scale = scales[(static_cast<int64_t>(rb) * (k / group) + col / group) * 16 + 2 * g + high_row];
      // Bytes of tile j: 8j + (s / 2) * 4 + high_row * 2 + (s % 2) for the values at col + s.
      uint16_t v[4];
#pragma unroll
      for (int s = 0; s < 4; ++s)
        v[s] = __half_as_ushort(__float2half_rn(static_cast<float>(b[8 * j + (s / 2) * 4 + high_row * 2 + (s % 2)]) * scale));
      *reinterpret_cast<uint2*>(out + static_cast<int64_t>(row) * k + col) =
          make_uint2(v[0] | (static_cast<uint32_t>(v[1]) << 16), v[2] | (static_cast<uint32_t>(v[3]) << 16));
    }
  }
}

}  // namespace qspec::cuda::kernels
