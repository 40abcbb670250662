// RoPE on a token's q and k heads, then its rotated K and its V into the paged pool: the two
// per-layer ops before attention in one launch (each a few microseconds of latency at small
// batch, so the second launch cost as much as the work). Same arithmetic as rope_kernel and
// paged_kv_write_kernel, so the results are bitwise theirs.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/paged_kv_write.cuh"
#include "ops/cuda/kernels/rope.cuh"

namespace qspec::cuda::kernels {

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
};

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
