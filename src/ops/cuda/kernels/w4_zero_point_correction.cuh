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
  // Where the kernel lets the next one start (programmatic dependent launch): right after its own
  // wait (false), or only at its end (true; an A/B switch, QSPEC_ZP_CORRECTION_RELEASE_AT_END).
  bool release_at_end;
  __half* y;
  int64_t ldy;
};

inline constexpr int kZeroPointTokens = 16;  // tokens a block (their group sums in shared memory)
inline constexpr int kZeroPointRows = 256;   // output rows a block, by default (ROWS below)
inline constexpr int kZeroPointSplit = 4;    // adjacent threads a row, each a quarter of its groups

__device__ __forceinline__ float high_or_low_half(uint32_t pair, bool high) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(high ? pair >> 16 : pair)));
}
// Group g's constant for output row n: c = m + 8 s (weights s u + m) or s (8 - z) (weights s (u - z)),
// since the symmetric kernels computed s (u - 8) for every code u.
__device__ __forceinline__ float zero_point_constant(const ZeroPointCorrectionParams& p, int n, int g) {
  const int rb = n >> 4, r = n & 15;  // word r % 8 of a row block's group: rows r % 8 (low half), r % 8 + 8 (high)
  const int64_t word = (static_cast<int64_t>(rb) * p.w.groups + g) * 8 + (r & 7);
  const float s = high_or_low_half(__ldg(p.w.scales + word), r >= 8);
  if (p.zero_codes) {
    const uint8_t zeros = __ldg(zero_point_bytes(p.w, rb) + g * 8 + (r & 7));
    return s * static_cast<float>(8 - (r < 8 ? (zeros & 0xf) : (zeros >> 4)));
  }
  return fmaf(8.0f, s, high_or_low_half(__ldg(zero_point_mins(p.w) + word), r >= 8));
}

// The sum of the values in one 16-byte load of activations: 16 signed bytes (int8 / int4 codes,
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

// Grid: (ceil(n / ROWS), ceil(m / kZeroPointTokens)), ROWS * kZeroPointSplit threads; dynamic
// shared memory: the block's tokens' group sums, kZeroPointTokens x groups floats. ROWS 256 (the
// default) makes blocks of 1,024 threads that hold a whole multiprocessor's registers, so none can
// start beside another kernel's block (which programmatic dependent launch counts on); ROWS 64
// blocks of 256 threads can, each summing its tokens' groups again (an A/B switch until measured,
// QSPEC_ZP_CORRECTION_ROWS).
// y[t, n] = f16(y[t, n] + sum_g c(n, g) X(t, g)), X the group's sum of the dequantized activations
// (integer codes summed exactly, then scaled). A group's sum is taken by the adjacent lanes that
// load its 16-byte chunks (group / chunk: at most 16 lanes), then a fixed shuffle tree; a row's
// groups by kZeroPointSplit adjacent lanes, then another: the same bits on every run. Loads go
// out in batches (the kernel is latency-bound): with one thread a row a Llama-3-8B correction
// took ~20 us at one token on the H200, this layout ~13 (still far above its bytes; perf-notes,
// "4-bit weight quality").
inline constexpr int kZeroPointLoads = 4;        // 16-byte activation loads a lane in flight
inline constexpr int kZeroPointGroupsAtOnce = 8;  // constants' loads a lane in flight
template <int ROWS>
__global__ __launch_bounds__(ROWS * kZeroPointSplit) void w4_zero_point_correction_kernel(const ZeroPointCorrectionParams p) {
  extern __shared__ float group_sums[];
  if (p.release_at_end) grid_dependency_wait();
  else pdl_prologue();
  const int t0 = blockIdx.y * kZeroPointTokens;
  const int tokens = min(kZeroPointTokens, p.m - t0);
  const int chunk = p.kind == ZeroPointActivations::f16 ? 8 : 16;  // values a 16-byte load holds
  const int lanes = p.group / chunk;                                // a power of two, <= 16
  const int chunks_a_token = p.w.k / chunk;  // a multiple of `lanes`: a group's lanes start aligned
  const int total = tokens * chunks_a_token;
  const int elem_bytes = p.kind == ZeroPointActivations::f16 ? 2 : 1;
  const char* x = static_cast<const char*>(p.x);
  for (int base = 0; base < total; base += kZeroPointLoads * blockDim.x) {  // uniform: every lane shuffles
    uint4 loaded[kZeroPointLoads];
#pragma unroll
    for (int u = 0; u < kZeroPointLoads; ++u) {
      const int i = base + u * blockDim.x + threadIdx.x;
      loaded[u] = make_uint4(0, 0, 0, 0);
      if (i < total) {
        const int t = i / chunks_a_token, c = i - t * chunks_a_token;
        loaded[u] = __ldg(reinterpret_cast<const uint4*>(
            x + ((static_cast<int64_t>(t0 + t) * p.ldx + static_cast<int64_t>(c) * chunk) * elem_bytes)));
      }
    }
#pragma unroll
    for (int u = 0; u < kZeroPointLoads; ++u) {
      const int i = base + u * blockDim.x + threadIdx.x;
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
  __syncthreads();
  const int quarter = threadIdx.x % kZeroPointSplit;
  const int n = blockIdx.x * ROWS + threadIdx.x / kZeroPointSplit;
  const bool row = n < p.w.n;  // rows past n still take part in the shuffles
  float acc[kZeroPointTokens];
#pragma unroll
  for (int t = 0; t < kZeroPointTokens; ++t) acc[t] = 0.0f;
  constexpr int kStride = kZeroPointSplit * kZeroPointGroupsAtOnce;
  for (int g0 = quarter; g0 < p.w.groups; g0 += kStride) {
    float c[kZeroPointGroupsAtOnce];
#pragma unroll
    for (int j = 0; j < kZeroPointGroupsAtOnce; ++j) {
      const int g = g0 + j * kZeroPointSplit;
      c[j] = row && g < p.w.groups ? zero_point_constant(p, n, g) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kZeroPointGroupsAtOnce; ++j) {
      const int g = g0 + j * kZeroPointSplit;
      if (g >= p.w.groups) break;
#pragma unroll
      for (int t = 0; t < kZeroPointTokens; ++t)
        if (t < tokens) acc[t] = fmaf(c[j], group_sums[t * p.w.groups + g], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kZeroPointTokens; ++t)
    for (int offset = kZeroPointSplit / 2; offset > 0; offset >>= 1)
      acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], offset);
  if (!row) return;
#pragma unroll
  for (int t = 0; t < kZeroPointTokens; ++t)
    if (t < tokens && t % kZeroPointSplit == quarter) {
      __half& out = p.y[static_cast<int64_t>(t0 + t) * p.ldy + n];
      out = __float2half_rn(__half2float(out) + acc[t]);
    }
}

}  // namespace qspec::cuda::kernels
