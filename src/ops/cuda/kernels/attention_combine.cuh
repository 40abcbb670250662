// Merges split-K attention partials: out = sum_i o_i 2^(m_i - M) / sum_i l_i 2^(m_i - M).
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

inline constexpr int kCombineMaxSplits = 32;  // a lane per split (attention_split.h caps splits at 32)

// Partials of split s, query row r (= token * num_heads + head): o at part_o[(s * rows + r) * D],
// (m, l) at part_ml[s * rows + r], m in log2 units, o unnormalised. An empty split has l = 0.
// Called by a whole warp for one row; lane i owns outputs i * D / 32 .. + D / 32 - 1 (one vector
// load a split). Latency-bound (every load is an L2 round trip, right after other blocks wrote
// the partials), so the statistics' load and the o loads of the first 8 splits are in flight
// together: one round trip up to 8 splits (the decode kernel at batch 1 runs 9 at 568 keys; 4 a
// batch, after the statistics, took three). The sums run in split order. Loads go through L2
// (__ldcg).
template <int D>
__device__ __forceinline__ void combine_attention_row(const float* __restrict__ part_o,
                                                      const float2* __restrict__ part_ml, int splits, int64_t rows,
                                                      int64_t row, __half* __restrict__ out_row) {
  constexpr int kPerLane = D / 32;
  static_assert(kPerLane == 1 || kPerLane == 2 || kPerLane == 4 || kPerLane == 8, "head_dim 32, 64, 128 or 256");
  constexpr int kBatch = 8;  // splits whose o loads are in flight at once
  const int lane = threadIdx.x & 31;
  const float* lane_o = part_o + row * D + lane * kPerLane;  // split s: + s * rows * D
  float o[kBatch][kPerLane];
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const float* at = lane_o + static_cast<int64_t>(s0 + u) * rows * D;
      if (s0 + u >= splits) {
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) o[u][j] = 0.0f;
      } else if constexpr (kPerLane == 8) {  // head_dim 256: two 16-byte loads
        const float4 v = __ldcg(reinterpret_cast<const float4*>(at));
        const float4 w = __ldcg(reinterpret_cast<const float4*>(at) + 1);
        o[u][0] = v.x, o[u][1] = v.y, o[u][2] = v.z, o[u][3] = v.w;
        o[u][4] = w.x, o[u][5] = w.y, o[u][6] = w.z, o[u][7] = w.w;
      } else if constexpr (kPerLane == 4) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(at));
        o[u][0] = v.x, o[u][1] = v.y, o[u][2] = v.z, o[u][3] = v.w;
      } else if constexpr (kPerLane == 2) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(at));
        o[u][0] = v.x, o[u][1] = v.y;
      } else {
        o[u][0] = __ldcg(at);
      }
    }
  };
  load_batch(0);
  const float2 ml = lane < splits ? __ldcg(part_ml + lane * rows + row) : make_float2(-INFINITY, 0.0f);
  float global_max = ml.y > 0.0f ? ml.x : -INFINITY;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    global_max = fmaxf(global_max, __shfl_xor_sync(0xffffffffu, global_max, offset));
  const bool used = ml.y > 0.0f;  // lane s: split s has keys
  const float weight = used ? exp2f(ml.x - global_max) : 0.0f;
  const unsigned used_mask = __ballot_sync(0xffffffffu, used);
  float denominator = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float l_weighted = __shfl_sync(0xffffffffu, ml.y * weight, s);
    if (used_mask >> s & 1u) denominator += l_weighted;
  }
  float sum[kPerLane] = {};
  for (int s0 = 0; s0 < splits; s0 += kBatch) {
    if (s0 > 0) load_batch(s0);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u;
      const float w = __shfl_sync(0xffffffffu, weight, s & 31);
      if (s < splits && (used_mask >> s & 1u))
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) sum[j] += o[u][j] * w;
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    out_row[lane * kPerLane + j] = __float2half_rn(denominator > 0.0f ? sum[j] / denominator : 0.0f);
}

// A warp per row, 4 rows a block (the prefill path; decode merges in its last block). Static:
// the decode kernel's header includes this one for combine_attention_row (a non-template
// kernel defined in two .cu files would clash at link time).
template <int D>
static __global__ void attention_combine_kernel(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                                                int splits, int64_t rows, int num_heads, __half* __restrict__ out,
                                                int64_t out_stride) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t token = row / num_heads, head = row % num_heads;
  combine_attention_row<D>(part_o, part_ml, splits, rows, row, out + token * out_stride + head * D);
}

}  // namespace qspec::cuda::kernels
