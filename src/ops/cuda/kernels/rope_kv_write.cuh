// RoPE on a token's q and k heads, then its rotated K and its V into the paged pool: the two
// per-layer ops before attention in one launch (each a few microseconds of latency at small
// batch, so the second launch cost as much as the work). Same arithmetic as rope_kernel and
// paged_kv_write_kernel, so the results are bitwise theirs. With a family's q/k/v biases and
// q/k norms (QkvPrologue) a second kernel does those first, in the same launch.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/paged_kv_write.cuh"
#include "ops/cuda/kernels/rope.cuh"

namespace qspec::cuda::kernels {

// Up to 256 values a head (4 RoPE pairs a lane) in the prologue kernel.
inline constexpr int kPrologueMaxPairsPerLane = 4;

struct RopeKvWriteParams {
  __half* qkv;
  int64_t row_stride;
  int64_t num_heads, num_kv_heads, head_dim;
  const int32_t* query_start;
  const int32_t* positions;
  const float* inv_freq;
  float attention_scaling;
  const int32_t* block_tables;
  int64_t max_blocks;
  __half* k_pool;
  __half* v_pool;
  // The prologue kernel's (QkvPrologue, attention.h): null where absent.
  const float* bias;
  const float* q_norm;
  const float* k_norm;
  float eps;
};

// x + bias rounded to f16: a biased GEMM output as its epilogue would store it. Shared with the
// decode attention that folds the bias in (paged_attention_decode_tiles.cuh): the same bits.
__device__ __forceinline__ float add_bias_f16(__half x, float bias) {
  return __half2float(__float2half_rn(__fadd_rn(__half2float(x), bias)));
}

// grid (max_query_len, num_seqs, parts): a token's row is spread over `parts` blocks (one item
// a thread: at batch 1 a single block looped over the 40 heads, one dependent load per turn).
// V is copied as it is while q and k are rotated; each rotated k pair goes to the row and the
// cache from the thread that computed it, so no barrier and no re-read separate the two.
template <int VEC>
__global__ void rope_kv_write_kernel(const RopeKvWriteParams p) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int seq = blockIdx.y;
  const int64_t token = p.query_start[seq] + blockIdx.x;
  if (token >= p.query_start[seq + 1]) return;
  const int32_t position = p.positions[token];
  const int64_t width = p.num_kv_heads * p.head_dim, q_dim = p.num_heads * p.head_dim;
  const int64_t pool_row = kv_pool_row(p.block_tables, p.max_blocks, seq, position);
  __half* row = p.qkv + token * p.row_stride;
  const int64_t thread = static_cast<int64_t>(blockIdx.z) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.z) * blockDim.x;
  copy_row<VEC>(row + q_dim + width, p.v_pool + pool_row * width, width, thread, threads);
  rope_row(row, p.num_heads + p.num_kv_heads, p.head_dim, static_cast<float>(position), p.inv_freq,
           p.attention_scaling, thread, threads, p.num_heads, p.k_pool + pool_row * width);
}

}  // namespace qspec::cuda::kernels

namespace qspec::cuda::kernels {

// With a QkvPrologue: a warp a head (q heads, k heads, then v heads of the token's row), the
// grid as rope_kv_write_kernel's. A v head gets its bias and goes to the row and the cache; a q or
// k head gets its bias, then (with norms) its RMSNorm from a warp-wide sum of squares, then its
// rotation, rounded to f16 once, into the row (and a k head into the cache). Lane l holds pairs
// l, l + 32, ... of the head, so the sum needs no shared memory and no barrier.
// Static: this header is included by rope_kv_write.cu and the decode attention (as rope.cuh's
// rope_kernel is). kCache false: the rows only (an int8 cache's write quantizes them after).
template <bool kCache = true>
static __global__ void rope_kv_write_prologue_kernel(const RopeKvWriteParams p) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int seq = blockIdx.y;
  const int64_t token = p.query_start[seq] + blockIdx.x;
  if (token >= p.query_start[seq + 1]) return;
  const int32_t position = p.positions[token];
  const int64_t D = p.head_dim, half = D / 2, width = p.num_kv_heads * D;
  const int64_t pool_row = kv_pool_row(p.block_tables, p.max_blocks, seq, position);
  __half* row = p.qkv + token * p.row_stride;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.z) * (blockDim.x / 32);
  const int64_t qk_heads = p.num_heads + p.num_kv_heads, heads = qk_heads + p.num_kv_heads;
  for (int64_t head = static_cast<int64_t>(blockIdx.z) * (blockDim.x / 32) + threadIdx.x / 32; head < heads;
       head += warps) {
    __half* x = row + head * D;
    const float* bias = p.bias != nullptr ? p.bias + head * D : nullptr;
    if (head >= qk_heads) {  // a v head: bias only
      __half* cached = p.v_pool + pool_row * width + (head - qk_heads) * D;
      for (int64_t i = lane; i < D; i += 32) {
        const __half v = bias != nullptr ? __float2half_rn(add_bias_f16(x[i], bias[i])) : x[i];
        x[i] = v;
        if constexpr (kCache) cached[i] = v;
      }
      continue;
    }
    float first[kPrologueMaxPairsPerLane], second[kPrologueMaxPairsPerLane];
    float sum_squares = 0.0f;
#pragma unroll
    for (int j = 0; j < kPrologueMaxPairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      first[j] = second[j] = 0.0f;
      if (i >= half) continue;
      first[j] = bias != nullptr ? add_bias_f16(x[i], bias[i]) : __half2float(x[i]);
      second[j] = bias != nullptr ? add_bias_f16(x[i + half], bias[i + half]) : __half2float(x[i + half]);
      sum_squares = __fmaf_rn(first[j], first[j], __fmaf_rn(second[j], second[j], sum_squares));
    }
    const float* norm = head < p.num_heads ? p.q_norm : p.k_norm;
    float inverse_rms = 1.0f;
    if (norm != nullptr) {
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) sum_squares += __shfl_xor_sync(0xffffffffu, sum_squares, offset);
      inverse_rms = rsqrtf(__fadd_rn(__fdiv_rn(sum_squares, static_cast<float>(D)), p.eps));
    }
    __half* cached = kCache && head >= p.num_heads ? p.k_pool + pool_row * width + (head - p.num_heads) * D : nullptr;
#pragma unroll
    for (int j = 0; j < kPrologueMaxPairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      if (i >= half) continue;
      float a = first[j], b = second[j];
      if (norm != nullptr) {  // transformers: (x * rsqrt(mean(x^2) + eps)) * w
        a = __fmul_rn(__fmul_rn(a, inverse_rms), norm[i]);
        b = __fmul_rn(__fmul_rn(b, inverse_rms), norm[i + half]);
      }
      float cosine, sine;
      rope_cos_sin(static_cast<float>(position), p.inv_freq[i], p.attention_scaling, cosine, sine);
      const __half rotated_first = __float2half_rn(rope_first(a, b, cosine, sine));
      const __half rotated_second = __float2half_rn(rope_second(a, b, cosine, sine));
      x[i] = rotated_first;
      x[i + half] = rotated_second;
      if (cached != nullptr) {
        cached[i] = rotated_first;
        cached[i + half] = rotated_second;
      }
    }
  }
}

}  // namespace qspec::cuda::kernels
