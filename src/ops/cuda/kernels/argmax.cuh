// Greedy argmax over logit rows, lowest id on ties (Sampler::argmax).
#pragma once
#include <cfloat>

#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// (value, id) pairs: a beats b when larger, or equal with a lower id. NaN never wins.
__device__ __forceinline__ void argmax_merge(float& value, int& id, float other_value, int other_id) {
  if (other_value > value || (other_value == value && other_id < id)) {
    value = other_value;
    id = other_id;
  }
}

// One block per row. VEC > 1: the row is read as 16-byte vectors of VEC values (vocab % VEC == 0,
// 16-byte aligned rows), U loads in flight per thread, so a 128k-entry row costs a few L2 round
// trips rather than vocab / 1024 dependent 2-byte loads. Each thread visits its ids in
// ascending order, so `>` keeps the lowest id of a tie.
template <typename T, int VEC>
__global__ void argmax_kernel(const T* __restrict__ logits, int64_t vocab, int32_t* __restrict__ ids) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  __shared__ float values[32];
  __shared__ int positions[32];
  const T* row = logits + blockIdx.x * vocab;
  float best = -INFINITY;
  int best_id = INT_MAX;
  if constexpr (VEC > 1) {
    static_assert(VEC * sizeof(T) == 16, "VEC values make one 16-byte vector");
    constexpr int U = 4;
    const int64_t vectors = vocab / VEC;
    const auto* row_vectors = reinterpret_cast<const uint4*>(row);
    for (int64_t base = threadIdx.x; base < vectors; base += U * static_cast<int64_t>(blockDim.x)) {
      uint4 chunk[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t v = base + u * static_cast<int64_t>(blockDim.x);
        if (v < vectors) chunk[u] = row_vectors[v];
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t v = base + u * static_cast<int64_t>(blockDim.x);
        if (v >= vectors) break;
        const T* chunk_values = reinterpret_cast<const T*>(&chunk[u]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float value = to_float(chunk_values[e]);
          if (value > best) {
            best = value;
            best_id = static_cast<int>(v * VEC + e);
          }
        }
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = to_float(row[i]);
      if (v > best) {  // ascending ids per thread: a tie keeps the earlier id
        best = v;
        best_id = static_cast<int>(i);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    argmax_merge(best, best_id, other, other_id);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    values[warp] = best;
    positions[warp] = best_id;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    best = lane < warps ? values[lane] : -INFINITY;
    best_id = lane < warps ? positions[lane] : INT_MAX;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      argmax_merge(best, best_id, other, other_id);
    }
    if (lane == 0) ids[blockIdx.x] = best_id == INT_MAX ? 0 : best_id;
  }
}

}  // namespace qspec::cuda::kernels
