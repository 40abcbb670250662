// Paged attention for decode, latency-first: the chunked kernel (paged_attention_decode.cuh)
// waits on four dependent memory round trips a 32-key step (the block table, then the keys;
// the table again, then the values), so a batch-1 split of 64 keys took ~11 us where its bytes
// need well under 1. Here a block reads the block-table entries of its first two tiles before
// the grid-dependency wait (the host writes tables before a step; no kernel does), then after
// the wait takes one round trip for q and the context length and one for the keys and values
// of two tiles (cp.async into shared memory, a group a tile), then computes on one tile while
// the copies of the tile after it are in flight (two stages; a tile is 32 keys at head_dim 128).
// Each thread reads back only what it copied, so the copies need no block barrier of their
// own, and they hold no registers (a first version loaded tiles into registers: 168 a thread,
// 3 blocks a multiprocessor instead of 4, a second wave at batch 32-64). Same blocks, same split
// merge and the same arithmetic order within a key as the chunked kernel; the softmax runs a
// tile at a time, so its results differ from the chunked kernel's by rounding only.
//
// RoPE folded in (p.rope.positions set: decode steps through paged_attention_decode_rope): each
// block rotates its query heads from the unrotated qkv row, and the new token's key (this lane's
// slice of 8 elements: the slice head_dim / 2 away is a second 16-byte load, so no shuffle), with
// rope_kv_write's arithmetic. The block whose split holds the new key stores it and its value
// into the cache, and the thread that copied that key's (stale) slot into a tile overwrites its
// own copy from registers. Since no other kernel of the step writes what the tiles copy, the
// first two tiles' copies then issue before the grid-dependency wait, during the QKV GEMM's
// drain. Measured on the H100 (docs/perf-notes.md): the folding alone gained nothing (the
// rotation's round trips move into this kernel); the early copies make the step 0.8 / 2.5 /
// 1.6 % shorter at batch 8 / 16 / 64, and batch 1 is unchanged.
#pragma once
#include "ops/cuda/kernels/paged_attention_decode.cuh"
#include "ops/cuda/kernels/paged_kv_write.cuh"  // kv_pool_row
#include "ops/cuda/kernels/rope.cuh"

namespace qspec::cuda::kernels {

// RoPE on a lane's slice of a head: `own` holds elements li * 8 .. + 7, `partner` the 8 elements
// head_dim / 2 away; cosine / sine of the slice's 8 pairs. Bitwise rope_row's result.
template <int D>
__device__ __forceinline__ uint4 rope_slice(const uint4& own, const uint4& partner, int li, const float (&cosine)[8],
                                            const float (&sine)[8]) {
  float x[8], y[8];
  half8_to_float(own, x);
  half8_to_float(partner, y);
  const bool first_half = li < D / 16;  // elements below head_dim / 2: the pair's first
  float rotated[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    rotated[e] = first_half ? rope_first(x[e], y[e], cosine[e], sine[e]) : rope_second(y[e], x[e], cosine[e], sine[e]);
  return float8_to_half(rotated);
}

// A stage holds one tile's keys and values: 16 KB (8 KB with 8 query heads a block, whose
// reduce buffer takes 16 KB; static shared memory stops at 48). Two stages: the next tile's
// copies are in flight while the block computes on this one. Tile keys: 32 at head_dim 128.
template <int D, int GM>
inline constexpr int kDecodeTileKeys = (GM >= 8 ? 2048 : 4096) / D;
inline constexpr int kDecodeStages = 2;

// D: head_dim (32, 64, 128); GM: query heads per block (1, 2, 4, 8).
template <int D, int GM>
__global__ __launch_bounds__(kDecodeWarps * 32) void paged_attention_decode_tiles_kernel(const DecodeParams p) {
  constexpr int LPK = D / 8;     // lanes per key (16 bytes each)
  constexpr int KPW = 32 / LPK;  // keys per warp per step
  constexpr int STEP = kDecodeWarps * KPW;
  constexpr int TILE = kDecodeTileKeys<D, GM>;
  constexpr int U = TILE / STEP;  // keys a lane copies a tile (K and V each)
  static_assert(U >= 1 && U * STEP == TILE, "a tile is whole steps");
  __shared__ __align__(16) __half k_tiles[kDecodeStages][TILE * D];  // a tile's key j at j * D
  __shared__ __align__(16) __half v_tiles[kDecodeStages][TILE * D];
  __shared__ float logits[GM][TILE];
  __shared__ float reduce[kDecodeWarps][GM][D];
  __shared__ float running_max[GM], running_sum[GM], rescale[GM];
  __shared__ float rope_cosine[D / 2], rope_sine[D / 2];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lg = lane / LPK, li = lane % LPK;
  const int kv_head = blockIdx.x / p.head_chunks, chunk_of_heads = blockIdx.x % p.head_chunks;
  const int seq = blockIdx.y, split = blockIdx.z;
  const int head0 = kv_head * p.group + chunk_of_heads * GM;
  const int heads_here = min(GM, p.group - chunk_of_heads * GM);
  const int64_t kv_stride = static_cast<int64_t>(p.num_kv_heads) * D;
  const int32_t* table = p.block_tables + seq * p.max_blocks;
  // Lane's key u of the tile at `tile_begin`: tile_begin + key_offset(u).
  auto key_offset = [&](int u) { return (u * kDecodeWarps + warp) * KPW + lg; };
  // Block-table entries of this lane's keys (clamped into the row: entries past the context
  // are read, never used).
  auto load_blocks = [&](int tile_begin, int (&blocks)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      blocks[u] = __ldg(table + min(static_cast<int64_t>((tile_begin + key_offset(u)) >> 4), p.max_blocks - 1));
  };

  // Without a window the split's first keys do not depend on the context: the table entries of
  // its first two tiles load while the previous kernel still runs.
  int blocks0[U], blocks1[U];
  int begin = split * p.split_len, context = 0, end = 0;
  if (p.window == 0) {
    load_blocks(begin, blocks0);
    load_blocks(begin + TILE, blocks1);
  }
  // Copies this lane's keys and values of the tile at tile_begin into `stage`, as one cp.async
  // group (empty past the end; keys past the end are zero-filled from the pool's start, since
  // the table entry there may be no block).
  auto issue_tile = [&](int tile_begin, int stage, const int (&blocks)[U]) {
    if (tile_begin < end) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = tile_begin + key_offset(u);
        const int64_t at =
            j < end ? (static_cast<int64_t>(blocks[u]) * 16 + (j & 15)) * kv_stride + kv_head * D + li * 8 : 0;
        const int bytes = j < end ? 16 : 0;
        cp_async_16(smem_address(k_tiles[stage] + key_offset(u) * D + li * 8), p.k_pool + at, bytes);
        cp_async_16(smem_address(v_tiles[stage] + key_offset(u) * D + li * 8), p.v_pool + at, bytes);
      }
    }
    cp_async_commit();
  };
  auto context_range = [&] {
    context = p.context_lens[seq];
    if (p.window > 0) {
      begin += max(0, context - p.window);
      load_blocks(begin, blocks0);
      load_blocks(begin + TILE, blocks1);
    }
    end = min(context, begin + p.split_len);
  };
  // RoPE folded in: only this launch writes this step's key (below, from registers), so every
  // key the tiles copy was written by an earlier step, as were the context lengths and tables
  // (the host's, or the chain's input update, which completes before the step's first layer):
  // the first two tiles' copies issue before the wait, while the QKV GEMM drains.
  const bool rope = p.rope.positions != nullptr;
  if (rope) {
    context_range();
    if (begin < end) {
      issue_tile(begin, 0, blocks0);
      issue_tile(begin + TILE, 1, blocks1);
    }
  }
  pdl_prologue();  // launched with launch_pdl (common.h)
  // This lane's slice of each query head, pre-scaled into log2 units (loads beside the context's).
  float qr[GM][8];
  // RoPE folded in: the new token's position, this lane's slices of its query heads, key and value
  // (and the slices head_dim / 2 away), unrotated.
  int new_key = -1;
  uint4 q_own[GM], q_partner[GM], k_own, k_partner, new_v;
  if (rope) {
    new_key = p.rope.positions[seq];
    const __half* row = p.q + seq * p.q_stride;
    const int partner_li = li ^ (LPK / 2);
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      const __half* q_head = row + (head0 + min(g, heads_here - 1)) * D;
      q_own[g] = *reinterpret_cast<const uint4*>(q_head + li * 8);
      q_partner[g] = *reinterpret_cast<const uint4*>(q_head + partner_li * 8);
    }
    const __half* k_head = row + static_cast<int64_t>(p.num_heads) * D + kv_head * D;
    k_own = *reinterpret_cast<const uint4*>(k_head + li * 8);
    k_partner = *reinterpret_cast<const uint4*>(k_head + partner_li * 8);
    new_v = *reinterpret_cast<const uint4*>(k_head + kv_stride + li * 8);
  } else {
    context_range();
    load_scaled_query<D, GM>(p, seq, head0, heads_here, li, qr);
  }

  if (begin >= end) {  // nothing to attend to in this split (no copies were issued)
    finish_empty_split<D>(p, seq, split, head0, heads_here);
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

  if (!rope) {
    issue_tile(begin, 0, blocks0);
    issue_tile(begin + TILE, 1, blocks1);
  }
  if (begin + 2 * TILE < end) load_blocks(begin + 2 * TILE, blocks0);  // the table entries of tile 2

  // RoPE folded in, while the first tiles' copies fly: the new key's slot in them is stale (the
  // cache gets the key below), and the thread that copied it overwrites its own copy once the
  // tile is in (only that thread reads it back, so no barrier). Each pair's angle once a block.
  uint4 new_k = make_uint4(0, 0, 0, 0);
  if (rope) {
    if (threadIdx.x < D / 2)
      rope_cos_sin(static_cast<float>(new_key), __ldg(p.rope.inv_freq + threadIdx.x), p.rope.attention_scaling,
                   rope_cosine[threadIdx.x], rope_sine[threadIdx.x]);
    const bool holds_new_key = new_key >= begin && new_key < end;
    __syncthreads();  // the angles
    float cosine[8], sine[8];
    const int pair0 = (li % (LPK / 2)) * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      cosine[e] = rope_cosine[pair0 + e];
      sine[e] = rope_sine[pair0 + e];
    }
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      // Through f16, as rope_kv_write stores q and load_scaled_query reads it.
      scale_query(rope_slice<D>(q_own[g], q_partner[g], li, cosine, sine), g < heads_here, p.scale_log2, qr[g]);
    }
    if (holds_new_key) {
      new_k = rope_slice<D>(k_own, k_partner, li, cosine, sine);
      // The cache gets it from one block of the head chunks (warp 0's first key lanes, a slice each).
      if (chunk_of_heads == 0 && warp == 0 && lg == 0) {
        const int64_t at = kv_pool_row(p.block_tables, p.max_blocks, seq, new_key) * kv_stride + kv_head * D + li * 8;
        *reinterpret_cast<uint4*>(p.k_pool + at) = new_k;
        *reinterpret_cast<uint4*>(p.v_pool + at) = new_v;
      }
    } else {
      new_key = -1;  // not in this split's tiles
    }
  }
  for (int tile_begin = begin, stage = 0; tile_begin < end; tile_begin += TILE, stage ^= 1) {
    // 1. This tile's copies are in (every group but the newest, the next tile's, is complete).
    cp_async_wait<1>();
    const __half* k_tile = k_tiles[stage];
    const __half* v_tile = v_tiles[stage];
    if (static_cast<unsigned>(new_key - tile_begin) < static_cast<unsigned>(TILE)) {  // RoPE folded in
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (tile_begin + key_offset(u) == new_key) {
          *reinterpret_cast<uint4*>(k_tiles[stage] + key_offset(u) * D + li * 8) = new_k;
          *reinterpret_cast<uint4*>(v_tiles[stage] + key_offset(u) * D + li * 8) = new_v;
        }
    }
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
    // 3. Softmax statistics per head.
    update_softmax(logits, min(end - tile_begin, TILE), heads_here, running_max, running_sum, rescale);
    __syncthreads();
    // 4. acc = acc * alpha + P V over this tile.
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
    __syncthreads();  // logits are rewritten by the next tile
    // 5. The tile after next into the stage just read (each thread overwrites only its own
    // copies, read above; the barrier also keeps the compiler from moving those reads past
    // the copies), then the table entries of the one after it.
    issue_tile(tile_begin + 2 * TILE, stage, blocks0);
    if (tile_begin + 3 * TILE < end) load_blocks(tile_begin + 3 * TILE, blocks0);
  }
  cp_async_wait<0>();  // no copy outlives the block (the last groups are empty)

  finish_split<D, GM>(p, acc, reduce, running_max, running_sum, seq, split, head0, heads_here);
}

}  // namespace qspec::cuda::kernels
