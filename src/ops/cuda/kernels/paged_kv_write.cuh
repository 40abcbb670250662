// Writes K/V rows of new tokens into the paged pool at their positions.
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

// Copies `width` values from src to dst, VEC at a time: pieces from `first` on, `stride` apart.
template <int VEC>
__device__ __forceinline__ void copy_row(const __half* src, __half* dst, int64_t width, int64_t first,
                                         int64_t stride) {
  using Vec = typename std::conditional<VEC == 8, uint4, __half>::type;
  const Vec* from = reinterpret_cast<const Vec*>(src);
  Vec* to = reinterpret_cast<Vec*>(dst);
  for (int64_t i = first; i < width / VEC; i += stride) to[i] = from[i];
}

// Copies one token's K and V rows (width values) to pool row `row` (threads of the block over
// width / VEC).
template <int VEC>
__device__ __forceinline__ void kv_row_write(const __half* k, const __half* v, int64_t row, int64_t width,
                                             __half* k_pool, __half* v_pool) {
  copy_row<VEC>(k, k_pool + row * width, width, threadIdx.x, blockDim.x);
  copy_row<VEC>(v, v_pool + row * width, width, threadIdx.x, blockDim.x);
}

// The pool row of position `position` of sequence `seq` (16 positions a block).
__device__ __forceinline__ int64_t kv_pool_row(const int32_t* block_tables, int64_t max_blocks, int seq,
                                               int32_t position) {
  return static_cast<int64_t>(block_tables[seq * max_blocks + position / 16]) * 16 + position % 16;
}

// grid (max_query_len, num_seqs); threads over the row's width / VEC.
template <int VEC>
__global__ void paged_kv_write_kernel(const __half* __restrict__ k, const __half* __restrict__ v, int64_t row_stride,
                                      const int32_t* __restrict__ query_start, const int32_t* __restrict__ positions,
                                      const int32_t* __restrict__ block_tables, int64_t max_blocks, int64_t width,
                                      __half* __restrict__ k_pool, __half* __restrict__ v_pool) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int seq = blockIdx.y;
  const int64_t token = query_start[seq] + blockIdx.x;
  if (token >= query_start[seq + 1]) return;
  const int64_t row = kv_pool_row(block_tables, max_blocks, seq, positions[token]);
  kv_row_write<VEC>(k + token * row_stride, v + token * row_stride, row, width, k_pool, v_pool);
}

}  // namespace qspec::cuda::kernels

#include "ops/cuda/kernels/kv_int8.cuh"

namespace qspec::cuda::kernels {

// The int8 cache's write (attention.h Kv8Planes): grid (max_query_len, num_seqs, parts), 128
// threads; a (token, K or V head) row a group of D / 8 lanes (a lane's 16-byte chunk of 8
// values), rows K heads first, then V heads, spread over the blocks of z. Each row is quantized
// whole (kv8: amax over the group, f16 scale, codes) and overwrites both planes and the scale, so a
// QSpec verify that rewrites a draft's positions leaves nothing of the draft's row behind.
template <int D>
__global__ void paged_kv_write_int8_kernel(const __half* __restrict__ k, const __half* __restrict__ v,
                                           int64_t row_stride, const int32_t* __restrict__ query_start,
                                           const int32_t* __restrict__ positions,
                                           const int32_t* __restrict__ block_tables, int64_t max_blocks,
                                           int num_kv_heads, Kv8Planes k_pool, Kv8Planes v_pool) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  constexpr int LPK = D / 8;                // lanes a row
  constexpr int kRowsPerBlock = 128 / LPK;  // 128 threads
  const int seq = blockIdx.y;
  const int64_t token = query_start[seq] + blockIdx.x;
  if (token >= query_start[seq + 1]) return;
  const int32_t position = positions[token];
  const int block = block_tables[seq * max_blocks + position / kKvBlockSize];
  const int r = blockIdx.z * kRowsPerBlock + threadIdx.x / LPK, li = threadIdx.x % LPK;
  const bool valid = r < 2 * num_kv_heads;  // whole groups: every lane of a warp reaches the shuffles
  const bool is_k = r < num_kv_heads;
  const int head = is_k ? r : r - num_kv_heads;
  uint4 values = make_uint4(0, 0, 0, 0);
  if (valid) values = reinterpret_cast<const uint4*>((is_k ? k : v) + token * row_stride + head * D)[li];  // else zeros
  float scale;
  kv8_quantize_store<D>(values, valid, is_k ? k_pool : v_pool,
                        kv8_row(block, head, position % kKvBlockSize, num_kv_heads), li, scale);
}

}  // namespace qspec::cuda::kernels
