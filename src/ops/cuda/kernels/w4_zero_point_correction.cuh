// The term zero points add to a 4-bit GEMM on quantized activations: the symmetric kernels' output
// plus, for each token and output row, the groups' constants times the activations' group sums.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/fp_codecs.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"

namespace qspec::cuda::kernels {

// How the activation values are stored (QuantizedActivations): one signed byte each (int8, int4
// codes), e4m3 codes, or f16 values.
enum class ZeroPointActivations : int { bytes = 0, e4m3 = 1, f16 = 2 };

struct ZeroPointCorrectionParams {
  const void* x;           // values, rows ldx elements apart
  int64_t ldx;
  ZeroPointActivations kind;
  const float* scales;     // a token's scale, or [token][scale_ld] for int4 groups
  int64_t scale_ld;
  int act_group;           // int4: k values a scale covers (a multiple of `group`); 0: one a token
  int m, group;
  W4A16Layout w;    // the packed weights (ops/w4a16_pack.h); their minimums or zero points after the scales
  bool zero_codes;  // int4-zp: zero points there (kernels::zero_point_bytes), else int4-asym's minimums
  int row_blocks_a_block;  // 16-row blocks a thread block serves: 1, 2, 4 or 8 (zero_point_row_blocks_a_block)
  // The tokens' group sums made by w4_zero_point_group_sums_kernel ([token][groups] floats), or
  // null: each block of w4_zero_point_correction_kernel sums its tokens' groups itself.
  const float* sums;
  __half* y;
  int64_t ldy;
};

inline constexpr int kZeroPointThreads = 256;    // a block: 8 warps
inline constexpr int kZeroPointMaxTokens = 16;   // tokens a block at most
// w4_zero_point_correction_kernel's TOKENS: 1, 2, 4, 8, and 16 with the group sums made beforehand.
inline constexpr int kZeroPointWarpKernelMaxTokens = 8;
inline constexpr int kZeroPointGroupLanes = 4;   // lanes of a warp over groups (x 8 over a row block's words)
inline constexpr int kZeroPointGroupsAtOnce = 8; // constants' loads a lane in flight

// The row blocks a thread block serves: as many as keep at least two blocks a multiprocessor
// (132 on the H200) busy, the warps of a row block splitting its groups between them otherwise.
inline int zero_point_row_blocks_a_block(int64_t row_blocks, int64_t token_tiles) {
  for (int rbs = 8; rbs > 1; rbs /= 2)
    if ((row_blocks + rbs - 1) / rbs * token_tiles >= 264) return rbs;
  return 1;
}
// The tokens a block of w4_zero_point_correction_kernel: the smallest power of two holding m, up to
// `most` (kZeroPointWarpKernelMaxTokens where blocks sum their groups themselves, else 16).
inline int zero_point_token_tile(int64_t m, int most) {
  int tokens = 1;
  while (tokens < m && tokens < most) tokens *= 2;
  return tokens;
}
// Dynamic shared memory of a block: the group sums of its tokens, reused for the reduction over
// the warps of a row block (8 warps x TOKENS x 16 rows).
inline size_t zero_point_shared_bytes(int tokens, int64_t groups) {
  return static_cast<size_t>(tokens) * sizeof(float) * static_cast<size_t>(groups > 128 ? groups : 128);
}

__device__ __forceinline__ float high_or_low_half(uint32_t pair, bool high) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(high ? pair >> 16 : pair)));
}
// Group g's constants for the rows word and word + 8 of row block rb (both in one scale word):
// c = m + 8 s (weights s u + m) or s (8 - z) (weights s (u - z)), since the symmetric kernels
// computed s (u - 8) for every code u.
__device__ __forceinline__ float2 zero_point_constants(const ZeroPointCorrectionParams& p, int rb, int word, int g) {
  const int64_t index = (static_cast<int64_t>(rb) * p.w.groups + g) * 8 + word;
  const uint32_t scales = __ldg(p.w.scales + index);
  const float s_low = high_or_low_half(scales, false), s_high = high_or_low_half(scales, true);
  if (p.zero_codes) {
    const uint32_t zeros = __ldg(zero_point_bytes(p.w, rb) + g * 8 + word);
    return make_float2(s_low * static_cast<float>(8 - static_cast<int>(zeros & 0xf)),
                       s_high * static_cast<float>(8 - static_cast<int>(zeros >> 4)));
  }
  const uint32_t mins = __ldg(zero_point_mins(p.w) + index);
  return make_float2(fmaf(8.0f, s_low, high_or_low_half(mins, false)), fmaf(8.0f, s_high, high_or_low_half(mins, true)));
}

// The sum of the values in one 16-byte load of activations: 16 signed bytes (int8, int4 codes,
// exact), 16 e4m3 codes or 8 f16 values.
__device__ __forceinline__ float zero_point_chunk_sum(const ZeroPointCorrectionParams& p, uint4 v) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  float sum = 0.0f;
  if (p.kind == ZeroPointActivations::bytes) {
    int codes = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) codes = __dp4a(static_cast<int>(words[i]), 0x01010101, codes);
    return static_cast<float>(codes);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (p.kind == ZeroPointActivations::f16) {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      sum += pair.x + pair.y;
    } else {
#pragma unroll
      for (int b = 0; b < 4; ++b) sum += e4m3_decode((words[i] >> (8 * b)) & 0xffu);
    }
  }
  return sum;
}

// The group sums of the block's tokens into shared memory, [t][groups], each scaled by its
// token's (or int4 group's) activation scale. A group's sum is taken by the adjacent lanes that
// load its 16-byte chunks (group / chunk: at most 16 lanes), then a fixed shuffle tree: the same
// bits on every run.
inline constexpr int kZeroPointLoads = 4;  // 16-byte activation loads a lane in flight
template <int THREADS>
__device__ __forceinline__ void zero_point_group_sums(const ZeroPointCorrectionParams& p, int t0, int tokens,
                                                      float* group_sums) {
  const int chunk = p.kind == ZeroPointActivations::f16 ? 8 : 16;  // values a 16-byte load holds
  const int lanes = p.group / chunk;                                // a power of two, <= 16
  const int chunks_a_token = p.w.k / chunk;  // a multiple of `lanes`: a group's lanes start aligned
  const int total = tokens * chunks_a_token;
  const int elem_bytes = p.kind == ZeroPointActivations::f16 ? 2 : 1;
  const char* x = static_cast<const char*>(p.x);
  for (int base = 0; base < total; base += kZeroPointLoads * THREADS) {  // uniform: every lane shuffles
    uint4 loaded[kZeroPointLoads];
#pragma unroll
    for (int u = 0; u < kZeroPointLoads; ++u) {
      const int i = base + u * THREADS + threadIdx.x;
      loaded[u] = make_uint4(0, 0, 0, 0);
      if (i < total) {
        const int t = i / chunks_a_token, c = i - t * chunks_a_token;
        loaded[u] = __ldg(reinterpret_cast<const uint4*>(
            x + ((static_cast<int64_t>(t0 + t) * p.ldx + static_cast<int64_t>(c) * chunk) * elem_bytes)));
      }
    }
#pragma unroll
    for (int u = 0; u < kZeroPointLoads; ++u) {
      const int i = base + u * THREADS + threadIdx.x;
      float sum = zero_point_chunk_sum(p, loaded[u]);
      for (int offset = lanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      const int t = i / chunks_a_token, c = i - t * chunks_a_token;
      if (i < total && c % lanes == 0) {
        const int g = c / lanes;
        const int64_t token = t0 + t, k0 = static_cast<int64_t>(g) * p.group;
        const float scale = p.act_group > 0 ? p.scales[token * p.scale_ld + k0 / p.act_group] : p.scales[token];
        group_sums[t * p.w.groups + g] = sum * scale;
      }
    }
  }
}

// y[t, n] = f16(y[t, n] + sum_g c(n, g) X(t, g)), X the group's sum of the dequantized activations
// (integer codes summed exactly, then scaled).
// Grid: (ceil(row blocks / row_blocks_a_block), ceil(m / TOKENS)), kZeroPointThreads threads;
// dynamic shared memory zero_point_shared_bytes(TOKENS, groups).
// A warp serves one row block: lane = 8 gl + word takes the rows word and word + 8 (one scale
// word, one zero-point byte) over the groups gl, gl + 4, ... of its warp's share, so a load of the
// constants is 128 contiguous bytes a warp. The first kZeroPointGroupsAtOnce groups' constants are
// loaded before the programmatic-launch wait (they are weights), during the GEMM's drain; sums
// over a row's groups go by a fixed shuffle tree, then over its warps in order: the same bits on
// every run. Its blocks of 128 rows or fewer each sum their tokens' groups again, so without
// p.sums it serves 1-8 tokens: on the H200 the w4a8 int4-zp step of Llama-3-8B took 3.11 / 4.81 ms
// at batch 1 / 8 with it, 4.33 / 5.32 with w4_zero_point_correction_16_tokens_kernel, but 12.13
// ms at batch 64 against its 10.51 (d1592b7). With the sums made once (p.sums, 16 tokens a block)
// it serves 9+ tokens too: 8.28 ms at batch 64, 4.88 at 16 against that kernel's 10.45 / 7.01
// (perf-notes, "4-bit weight quality").
template <int TOKENS>
__global__ __launch_bounds__(kZeroPointThreads) void w4_zero_point_correction_kernel(const ZeroPointCorrectionParams p) {
  extern __shared__ float shared[];
  constexpr int kWarps = kZeroPointThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int word = lane % 8, group_lane = lane / 8;
  const int warps_a_row_block = kWarps / p.row_blocks_a_block;
  const int rb = blockIdx.x * p.row_blocks_a_block + warp / warps_a_row_block;
  const bool rows_here = rb < p.w.row_blocks;
  const int slot = (warp % warps_a_row_block) * kZeroPointGroupLanes + group_lane;
  const int slots = warps_a_row_block * kZeroPointGroupLanes;  // a row block's lanes over groups
  const int groups = p.w.groups;

  float2 c[kZeroPointGroupsAtOnce];
  auto load_constants = [&](int g0) {
#pragma unroll
    for (int j = 0; j < kZeroPointGroupsAtOnce; ++j) {
      const int g = g0 + j * slots;
      c[j] = rows_here && g < groups ? zero_point_constants(p, rb, word, g) : make_float2(0.0f, 0.0f);
    }
  };
  load_constants(slot);  // weights: before the wait

  grid_dependency_wait();
  grid_launch_dependents();
  const int t0 = blockIdx.y * TOKENS;
  const int tokens = min(TOKENS, p.m - t0);
  if (p.sums != nullptr) {  // made by w4_zero_point_group_sums_kernel: [token][groups], contiguous
    for (int i = threadIdx.x; i < tokens * groups; i += kZeroPointThreads)
      shared[i] = p.sums[static_cast<int64_t>(t0) * groups + i];
  } else {
    zero_point_group_sums<kZeroPointThreads>(p, t0, tokens, shared);
  }
  __syncthreads();

  float low[TOKENS], high[TOKENS];
#pragma unroll
  for (int t = 0; t < TOKENS; ++t) low[t] = high[t] = 0.0f;
  for (int g0 = slot;; ) {
#pragma unroll
    for (int j = 0; j < kZeroPointGroupsAtOnce; ++j) {
      const int g = g0 + j * slots;
      if (g >= groups) break;
#pragma unroll
      for (int t = 0; t < TOKENS; ++t) {
        const float sum = t < tokens ? shared[t * groups + g] : 0.0f;
        low[t] = fmaf(c[j].x, sum, low[t]);
        high[t] = fmaf(c[j].y, sum, high[t]);
      }
    }
    g0 += kZeroPointGroupsAtOnce * slots;
    if (g0 - slot >= groups) break;  // uniform over the block: slot < slots
    load_constants(g0);
  }
#pragma unroll
  for (int t = 0; t < TOKENS; ++t)
#pragma unroll
    for (int offset = 8; offset < 32; offset *= 2) {
      low[t] += __shfl_xor_sync(0xffffffffu, low[t], offset);
      high[t] += __shfl_xor_sync(0xffffffffu, high[t], offset);
    }
  __syncthreads();  // the group sums are read: their memory takes the warps' partial sums
  float* partial = shared;  // [warp][t][16 rows]
  if (group_lane == 0)
#pragma unroll
    for (int t = 0; t < TOKENS; ++t) {
      partial[(warp * TOKENS + t) * 16 + word] = low[t];
      partial[(warp * TOKENS + t) * 16 + word + 8] = high[t];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < p.row_blocks_a_block * TOKENS * 16; i += kZeroPointThreads) {
    const int r = i % 16, t = i / 16 % TOKENS, local = i / (16 * TOKENS);
    const int64_t n = (static_cast<int64_t>(blockIdx.x) * p.row_blocks_a_block + local) * 16 + r;
    if (t >= tokens || n >= p.w.n) continue;
    float sum = 0.0f;
    for (int w = 0; w < warps_a_row_block; ++w) sum += partial[((local * warps_a_row_block + w) * TOKENS + t) * 16 + r];
    __half& out = p.y[static_cast<int64_t>(t0 + t) * p.ldy + n];
    out = __float2half_rn(__half2float(out) + sum);
  }
}

// One token's group sums (a block a token) into sums[token][groups], for the correction of many
// tokens: made once, where the blocks of 16 tokens would each make them again (the default for
// 9+ tokens: cuda::w4_zero_point_correction).
__global__ __launch_bounds__(kZeroPointThreads) void w4_zero_point_group_sums_kernel(const ZeroPointCorrectionParams p,
                                                                                     float* sums) {
  pdl_prologue();  // the GEMM before may still use the workspace these sums go to
  zero_point_group_sums<kZeroPointThreads>(p, blockIdx.x, 1, sums + static_cast<int64_t>(blockIdx.x) * p.w.groups);
}

// The correction for more than 8 tokens: blocks of kZeroPointWideRows rows x 16 tokens, each row's
// groups split between kZeroPointSplit adjacent lanes (their sums by a fixed shuffle tree), so a
// block's group sums serve 256 rows. Grid: (ceil(n / kZeroPointWideRows), ceil(m / 16)),
// kZeroPointWideRows * kZeroPointSplit threads; dynamic shared memory 16 x groups floats.
inline constexpr int kZeroPointWideRows = 256;
inline constexpr int kZeroPointSplit = 4;  // adjacent threads a row, each a quarter of its groups
__global__ __launch_bounds__(kZeroPointWideRows * kZeroPointSplit) void w4_zero_point_correction_16_tokens_kernel(
    const ZeroPointCorrectionParams p) {
  extern __shared__ float group_sums[];
  constexpr int kTokens = kZeroPointMaxTokens;
  pdl_prologue();
  const int t0 = blockIdx.y * kTokens;
  const int tokens = min(kTokens, p.m - t0);
  zero_point_group_sums<kZeroPointWideRows * kZeroPointSplit>(p, t0, tokens, group_sums);
  __syncthreads();
  const int quarter = threadIdx.x % kZeroPointSplit;
  const int n = blockIdx.x * kZeroPointWideRows + threadIdx.x / kZeroPointSplit;
  const bool row = n < p.w.n;  // rows past n still take part in the shuffles
  const int rb = n >> 4, word = n & 7;
  const bool high = (n & 15) >= 8;
  float acc[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = 0.0f;
  constexpr int kStride = kZeroPointSplit * kZeroPointGroupsAtOnce;
  for (int g0 = quarter; g0 < p.w.groups; g0 += kStride) {
    float c[kZeroPointGroupsAtOnce];
#pragma unroll
    for (int j = 0; j < kZeroPointGroupsAtOnce; ++j) {
      const int g = g0 + j * kZeroPointSplit;
      if (row && g < p.w.groups) {
        const float2 pair = zero_point_constants(p, rb, word, g);
        c[j] = high ? pair.y : pair.x;
      } else {
        c[j] = 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kZeroPointGroupsAtOnce; ++j) {
      const int g = g0 + j * kZeroPointSplit;
      if (g >= p.w.groups) break;
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        if (t < tokens) acc[t] = fmaf(c[j], group_sums[t * p.w.groups + g], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t)
    for (int offset = kZeroPointSplit / 2; offset > 0; offset >>= 1)
      acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], offset);
  if (!row) return;
#pragma unroll
  for (int t = 0; t < kTokens; ++t)
    if (t < tokens && t % kZeroPointSplit == quarter) {
      __half& out = p.y[static_cast<int64_t>(t0 + t) * p.ldy + n];
      out = __float2half_rn(__half2float(out) + acc[t]);
    }
}

}  // namespace qspec::cuda::kernels
