// Paged attention for decode, latency-first: the chunked kernel (paged_attention_decode.cuh)
// waits on four dependent memory round trips a 32-key step (the block table, then the keys;
// the table again, then the values), so a batch-1 split of 64 keys took ~11 us where its bytes
// need well under 1. Here a block reads its block-table entries before the grid-dependency
// wait (the host wrote them before the step began, no kernel does), then copies the keys and
// the values of a whole tile of 64 keys at once into shared memory (cp.async, two groups: the
// scores start when the keys are in): after the wait, one round trip for q and the context
// length, one for the tile, then arithmetic. Each thread reads back only what it copied, so
// the copies need no block barrier, and they hold no registers (the first version loaded the
// tile into registers: 168 a thread, 3 blocks a multiprocessor instead of 4, and a second wave
// at batch 32-64). Same blocks, same split merge and the same arithmetic order within a key as
// the chunked kernel; the softmax runs a tile at a time, so its results differ from the chunked
// kernel's by rounding only.
#pragma once
#include "ops/cuda/kernels/paged_attention_decode.cuh"

namespace qspec::cuda::kernels {

// Keys a tile: 64 (32 KB of keys and values in shared memory at head_dim 128), 32 for 8 query
// heads a block (their reduce buffer takes 16 KB; static shared memory stops at 48).
template <int GM>
inline constexpr int kDecodeTileKeys = GM >= 8 ? 32 : 64;

// D: head_dim (32, 64, 128); GM: query heads per block (1, 2, 4, 8).
template <int D, int GM>
__global__ __launch_bounds__(kDecodeWarps * 32) void paged_attention_decode_tiles_kernel(const DecodeParams p) {
  constexpr int LPK = D / 8;     // lanes per key (16 bytes each)
  constexpr int KPW = 32 / LPK;  // keys per warp per step
  constexpr int STEP = kDecodeWarps * KPW;
  constexpr int TILE = kDecodeTileKeys<GM>;
  constexpr int U = TILE / STEP;  // keys a lane loads a tile (K and V each)
  static_assert(U >= 1 && U * STEP == TILE, "a tile is whole steps");
  __shared__ __align__(16) __half k_tile[TILE * D];  // the tile's key j at j * D
  __shared__ __align__(16) __half v_tile[TILE * D];
  __shared__ float logits[GM][TILE];
  __shared__ float reduce[kDecodeWarps][GM][D];
  __shared__ float running_max[GM], running_sum[GM], rescale[GM];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lg = lane / LPK, li = lane % LPK;
  const int kv_head = blockIdx.x / p.head_chunks, chunk_of_heads = blockIdx.x % p.head_chunks;
  const int seq = blockIdx.y, split = blockIdx.z;
  const int head0 = kv_head * p.group + chunk_of_heads * GM;
  const int heads_here = min(GM, p.group - chunk_of_heads * GM);
  const int64_t kv_stride = static_cast<int64_t>(p.num_kv_heads) * D;
  const int32_t* table = p.block_tables + seq * p.max_blocks;
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;
  // Lane's key u of the tile at `tile_begin`: tile_begin + key_offset(u).
  auto key_offset = [&](int u) { return (u * kDecodeWarps + warp) * KPW + lg; };
  // Block-table entries of this lane's keys (clamped into the row: entries past the context
  // are read, never used).
  auto load_blocks = [&](int tile_begin, int (&blocks)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      blocks[u] = __ldg(table + min(static_cast<int64_t>((tile_begin + key_offset(u)) >> 4), p.max_blocks - 1));
  };

  // Without a window the split's first key does not depend on the context: its table entries
  // load while the previous kernel still runs.
  int blocks[U];
  int begin = split * p.split_len;
  if (p.window == 0) load_blocks(begin, blocks);
  pdl_prologue();  // launched with launch_pdl (common.h)
  const int context = p.context_lens[seq];
  // This lane's slice of each query head, pre-scaled into log2 units (loads beside the context's).
  float qr[GM][8];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g < heads_here) {
      half8_to_float(*reinterpret_cast<const uint4*>(p.q + seq * p.q_stride + (head0 + g) * D + li * 8), qr[g]);
#pragma unroll
      for (int e = 0; e < 8; ++e) qr[g][e] *= p.scale_log2;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) qr[g][e] = 0.0f;
    }
  }
  if (p.window > 0) {
    begin += max(0, context - p.window);
    load_blocks(begin, blocks);
  }
  const int end = min(context, begin + p.split_len);

  if (begin >= end) {  // nothing to attend to in this split
    for (int i = threadIdx.x; i < heads_here * D; i += blockDim.x) {
      const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head0 + i / D;
      if (p.splits > 1) {
        p.part_o[(split * rows + row) * D + i % D] = 0.0f;
        if (i % D == 0) p.part_ml[split * rows + row] = make_float2(-INFINITY, 0.0f);
      } else {
        p.out[seq * p.out_stride + (head0 + i / D) * D + i % D] = __float2half(0.0f);
      }
    }
    merge_splits<D>(p, seq, head0, heads_here);
    return;
  }

  if (threadIdx.x < GM) {
    running_max[threadIdx.x] = -INFINITY;
    running_sum[threadIdx.x] = 0.0f;
  }
  float acc[GM][8];
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;

  for (int tile_begin = begin; tile_begin < end; tile_begin += TILE) {
    // 1. This tile's keys, then its values, all in flight at once (keys past the end are
    // zero-filled, not read); then the next tile's table entries.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = tile_begin + key_offset(u);
      // Past the end: zero-filled from the pool's start (the table entry there may be no block).
      const int64_t slot =
          j < end ? (static_cast<int64_t>(blocks[u]) * 16 + (j & 15)) * kv_stride + kv_head * D + li * 8 : 0;
      cp_async_16(smem_address(k_tile + key_offset(u) * D + li * 8), p.k_pool + slot, j < end ? 16 : 0);
    }
    cp_async_commit();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = tile_begin + key_offset(u);
      const int64_t slot =
          j < end ? (static_cast<int64_t>(blocks[u]) * 16 + (j & 15)) * kv_stride + kv_head * D + li * 8 : 0;
      cp_async_16(smem_address(v_tile + key_offset(u) * D + li * 8), p.v_pool + slot, j < end ? 16 : 0);
    }
    cp_async_commit();
    if (tile_begin + TILE < end) load_blocks(tile_begin + TILE, blocks);
    cp_async_wait<1>();  // this thread's keys
    // 2. Scores.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = tile_begin + key_offset(u);
      float kf[8];
      half8_to_float(*reinterpret_cast<const uint4*>(k_tile + key_offset(u) * D + li * 8), kf);
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(qr[g][e], kf[e], dot);
#pragma unroll
        for (int offset = LPK / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (li == 0 && j < end) logits[g][j - tile_begin] = dot;
      }
    }
    __syncthreads();
    // 3. Softmax statistics per head (warp w owns heads w, w + 4).
    const int n = min(end - tile_begin, TILE);
    for (int g = warp; g < heads_here; g += kDecodeWarps) {
      float tile_max = -INFINITY;
      for (int i = lane; i < n; i += 32) tile_max = fmaxf(tile_max, logits[g][i]);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      const float old_max = running_max[g];
      const float new_max = fmaxf(old_max, tile_max);  // finite: the tile has keys
      float sum = 0.0f;
      for (int i = lane; i < n; i += 32) {
        const float e = exp2f(logits[g][i] - new_max);
        logits[g][i] = e;
        sum += e;
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) {
        const float alpha = exp2f(old_max - new_max);  // 0 on the first tile
        rescale[g] = alpha;
        running_sum[g] = running_sum[g] * alpha + sum;
        running_max[g] = new_max;
      }
    }
    __syncthreads();
    // 4. acc = acc * alpha + P V over this tile (this thread's values arrived by now).
    cp_async_wait<0>();
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      const float alpha = g < heads_here ? rescale[g] : 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = tile_begin + key_offset(u);
      if (j < end) {
        float vf[8];
        half8_to_float(*reinterpret_cast<const uint4*>(v_tile + key_offset(u) * D + li * 8), vf);
#pragma unroll
        for (int g = 0; g < GM; ++g) {
          const float weight = g < heads_here ? logits[g][j - tile_begin] : 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(weight, vf[e], acc[g][e]);
        }
      }
    }
    __syncthreads();  // logits are rewritten by the next tile (each thread rewrites only its own tile slots)
  }

  // Sum the KPW key lanes of each warp, then the warps through shared memory.
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int offset = LPK; offset < 32; offset <<= 1) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
  if (lg == 0) {
#pragma unroll
    for (int g = 0; g < GM; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) reduce[warp][g][li * 8 + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < heads_here * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) o += reduce[w][g][d];
    const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head0 + g;
    if (p.splits > 1) {
      p.part_o[(split * rows + row) * D + d] = o;
      if (d == 0) p.part_ml[split * rows + row] = make_float2(running_max[g], running_sum[g]);
    } else {
      p.out[seq * p.out_stride + (head0 + g) * D + d] = __float2half_rn(o / running_sum[g]);
    }
  }
  merge_splits<D>(p, seq, head0, heads_here);
}

}  // namespace qspec::cuda::kernels
