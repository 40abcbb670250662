// Paged attention for decode at short contexts: one block a (sequence, KV head, chunk of query
// heads), the context split across the block's warps instead of across blocks.
//
// Why: at batch 1 the tiles kernel (paged_attention_decode_tiles.cuh) splits a 150-key context
// into blocks of 64 keys, each running two 32-key tiles with four block barriers a tile, and the
// last block to arrive merges the partials through global memory. A clock64 probe on the H100
// (docs/perf-notes.md, "Decode attention on tensor cores") put that block's arrival and merge at
// ~5700-6300 cycles and each tile at ~2100, of a ~7.3 us exposed kernel a layer. Here each warp
// owns whole KV blocks of 16 keys (one page, one block-table entry), copies them into its own
// shared memory, and runs the scores, an online softmax and P V on tensor cores with only
// __syncwarp between the steps: warps never wait for one another until the end, where they merge
// their (max, sum, P V) through shared memory after one block barrier. No partials go to global
// memory and nothing arrives on a counter.
//
// A warp's 16-key row tile is the tiles kernel's MMA step (mma_tile_scores, mma_tile_pv over all
// of head_dim), with the same swizzled rows. The softmax runs per warp: lane l holds head l / 4
// and a quarter of the tile's keys; each lane keeps its own part of the running sum (the heads'
// factors are the same on the four lanes), summed once at the end.
//
// RoPE folded in as in the tiles kernel (the same rope_slice arithmetic, so the cache and the
// query rows get the same bits): warp w rotates query heads w and w + 4; the new key is rotated by the lanes
// that copied its (stale) slot, which overwrite their copy and, in the first head chunk, store it
// and its value into the cache. Each lane computes its own slice's angles before the
// grid-dependency wait, so no barrier is spent on them after it.
//
// The launcher runs it (DecodeAttention::automatic) where its blocks fit in one wave and the
// context is short: each warp then has one or two tiles. Longer contexts would serialize many
// tiles a warp, where the tiles kernel's splits spread them over the GPU.
#pragma once
#include "ops/cuda/kernels/paged_attention_decode_tiles.cuh"

namespace qspec::cuda::kernels {

inline constexpr int kWarpSplitWarps = 4;  // 128 threads: one fits beside a GEMM block (8 did not)
inline constexpr int kWarpSplitStages = 2;  // a warp's next tile's copies fly while it computes
inline constexpr int kWarpTileKeys = 16;    // one KV block (kKvBlockSize), one table entry

// Dynamic shared memory: each warp's stages of K and V rows (32 KB at head_dim 128).
template <int D>
constexpr size_t warp_split_smem_bytes() {
  return static_cast<size_t>(kWarpSplitWarps) * kWarpSplitStages * 2 * kWarpTileKeys * D * sizeof(__half);
}

// D: head_dim (64, 128); GM: query heads a block (1, 2, 4, 8).
template <int D, int GM>
__global__ __launch_bounds__(kWarpSplitWarps * 32) void paged_attention_decode_warps_kernel(const DecodeParams p) {
  constexpr int NW = kWarpSplitWarps, KEYS = kWarpTileKeys, STAGES = kWarpSplitStages;
  constexpr int LPK = D / 8;       // lanes a key row (16 bytes each)
  constexpr int KPI = 32 / LPK;    // key rows a copy instruction of the warp
  constexpr int U = KEYS / KPI;    // copy instructions a tile (K and V each)
  constexpr int STAGE_HALVES = 2 * KEYS * D;  // K rows, then V rows
  static_assert(D == 64 || D == 128, "head_dim 64 or 128 (8 chunks a key row for the swizzle)");
  static_assert(8 % NW == 0, "warp w stages query heads w, w + NW, ...: the mma's 8 head columns");
  static_assert(STAGES * STAGE_HALVES * sizeof(__half) >= 8 * D * sizeof(float), "a warp's stages hold its P V");
  extern __shared__ __align__(128) uint8_t warp_stages[];
  __shared__ __align__(16) __half q_heads[8][D];  // the mma's 8 head columns; zeros past heads_here
  __shared__ float logits[NW][GM][KEYS];
  __shared__ float rescale[NW][8];
  __shared__ float warp_max[NW][8], warp_sum[NW][8];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lg = lane / LPK, li = lane % LPK;
  const int group_id = lane >> 2, in_group = lane & 3;
  const int kv_head = blockIdx.x / p.head_chunks, chunk_of_heads = blockIdx.x % p.head_chunks;
  const int seq = blockIdx.y;
  const int head0 = kv_head * p.group + chunk_of_heads * GM;
  const int heads_here = min(GM, p.group - chunk_of_heads * GM);
  const int64_t kv_stride = static_cast<int64_t>(p.num_kv_heads) * D;
  const int32_t* table = p.block_tables + seq * p.max_blocks;
  __half* stages = reinterpret_cast<__half*>(warp_stages) + warp * STAGES * STAGE_HALVES;

  int begin = 0, end = 0;  // the keys attended to: [begin, end)
  auto context_range = [&] {
    end = p.context_lens[seq];
    begin = p.window > 0 ? max(0, end - p.window) : 0;
  };
  // KV block `block` of the sequence into `stage`, one cp.async group (empty past the context).
  // Keys outside [begin, end) are zero-filled without a read: a weight of 0 times a stale NaN
  // would still poison P V.
  auto issue_tile = [&](int block, int stage) {
    const int key0 = block * KEYS;
    if (key0 < end) {
      const int64_t page = __ldg(table + block);
      __half* k_tile = stages + stage * STAGE_HALVES;
      __half* v_tile = k_tile + KEYS * D;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int key = u * KPI + lg, j = key0 + key;
        const bool inside = j >= begin && j < end;
        const int64_t at = inside ? (page * KEYS + key) * kv_stride + kv_head * D + li * 8 : 0;
        cp_async_16(smem_address(k_tile + decode_tile_at<D, true>(key, li)), p.k_pool + at, inside ? 16 : 0);
        cp_async_16(smem_address(v_tile + decode_tile_at<D, true>(key, li)), p.v_pool + at, inside ? 16 : 0);
      }
    }
    cp_async_commit();
  };

  // RoPE folded in: every key the tiles copy was written by an earlier step, as were the context
  // lengths, tables and positions, so the first copies and the angles come before the wait (see
  // paged_attention_decode_tiles.cuh).
  const bool rope = p.rope.positions != nullptr;
  int new_key = -1;
  float cosine[8], sine[8];
  if (rope) {
    context_range();
    issue_tile(begin / KEYS + warp, 0);
    issue_tile(begin / KEYS + warp + NW, 1);
    new_key = p.rope.positions[seq];
    const int pair0 = (li % (LPK / 2)) * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      rope_cos_sin(static_cast<float>(new_key), __ldg(p.rope.inv_freq + pair0 + e), p.rope.attention_scaling,
                   cosine[e], sine[e]);
  }
  pdl_prologue();  // launched with launch_pdl (common.h)

  // The new key's block, and whether this lane copied (part of) its row: the lanes of one key
  // row in the warp that owns the block.
  const int new_block = new_key / KEYS;
  const bool new_key_lane = rope && new_key >= begin && (new_block - begin / KEYS) % NW == warp &&
                            lg == (new_key % KEYS) % KPI;
  uint4 new_k = make_uint4(0, 0, 0, 0), new_v = make_uint4(0, 0, 0, 0);
  if (rope) {
    const __half* row = p.q + seq * p.q_stride;
    const int partner_li = li ^ (LPK / 2);
    if (lg == 0) {  // warp w rotates query heads w, w + NW, ... (through f16, as rope_kv_write stores q)
#pragma unroll
      for (int g = warp; g < 8; g += NW) {
        uint4 rotated = make_uint4(0, 0, 0, 0);
        if (g < heads_here) {
          const __half* q_head = row + (head0 + g) * D;
          rotated = rope_slice<D>(*reinterpret_cast<const uint4*>(q_head + li * 8),
                                  *reinterpret_cast<const uint4*>(q_head + partner_li * 8), li, cosine, sine);
        }
        *reinterpret_cast<uint4*>(&q_heads[g][li * 8]) = rotated;
      }
    }
    if (new_key_lane) {
      const __half* k_head = row + static_cast<int64_t>(p.num_heads) * D + kv_head * D;
      new_k = rope_slice<D>(*reinterpret_cast<const uint4*>(k_head + li * 8),
                            *reinterpret_cast<const uint4*>(k_head + partner_li * 8), li, cosine, sine);
      new_v = *reinterpret_cast<const uint4*>(k_head + kv_stride + li * 8);
      if (chunk_of_heads == 0) {  // the cache gets it from one block of the head chunks
        const int64_t at = kv_pool_row(p.block_tables, p.max_blocks, seq, new_key) * kv_stride + kv_head * D + li * 8;
        *reinterpret_cast<uint4*>(p.k_pool + at) = new_k;
        *reinterpret_cast<uint4*>(p.v_pool + at) = new_v;
      }
    }
  } else {
    context_range();
    if (lg == 0)  // the f16 query rows as they are (the scores are scaled instead)
#pragma unroll
      for (int g = warp; g < 8; g += NW)
        *reinterpret_cast<uint4*>(&q_heads[g][li * 8]) =
            g < heads_here ? *reinterpret_cast<const uint4*>(p.q + seq * p.q_stride + (head0 + g) * D + li * 8)
                           : make_uint4(0, 0, 0, 0);
    issue_tile(begin / KEYS + warp, 0);
    issue_tile(begin / KEYS + warp + NW, 1);
  }
  __syncthreads();  // q_heads
  uint32_t q_frag[D / 16][2];  // the scores' B fragments: Q^T (dims x heads)
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    q_frag[ks][0] = *reinterpret_cast<const uint32_t*>(&q_heads[group_id][ks * 16 + 2 * in_group]);
    q_frag[ks][1] = *reinterpret_cast<const uint32_t*>(&q_heads[group_id][ks * 16 + 2 * in_group + 8]);
  }

  // The softmax lanes: head lane / 4 (past heads_here: idle), keys quarter * 4 .. + 3 of a tile.
  const int soft_head = lane >> 2, quarter = lane & 3;
  const bool soft_lane = soft_head < heads_here;
  float running_max = -INFINITY, running_sum = 0.0f;  // running_sum: this lane's keys only
  float pv[D / 16][4] = {}, pv_lo[D / 16][4] = {};
  int stage = 0;
  for (int block = begin / KEYS + warp; block * KEYS < end; block += NW, stage ^= 1) {
    cp_async_wait<1>();  // this tile's copies (the newest group is the next tile's)
    __half* k_tile = stages + stage * STAGE_HALVES;
    __half* v_tile = k_tile + KEYS * D;
    if (new_key_lane && block == new_block) {  // this lane's copy of the new key's slot is stale
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (u * KPI + lg == new_key % KEYS) {
          *reinterpret_cast<uint4*>(k_tile + decode_tile_at<D, true>(u * KPI + lg, li)) = new_k;
          *reinterpret_cast<uint4*>(v_tile + decode_tile_at<D, true>(u * KPI + lg, li)) = new_v;
        }
    }
    __syncwarp();  // ldmatrix reads rows the other lanes copied
    mma_tile_scores<D, GM, KEYS>(k_tile, 0, q_frag, p.scale_log2, logits[warp]);
    __syncwarp();
    if (soft_lane) {
      const int key0 = block * KEYS + quarter * 4;
      float score[4], tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = key0 + i;
        score[i] = j >= begin && j < end ? logits[warp][soft_head][quarter * 4 + i] : -INFINITY;
        tile_max = fmaxf(tile_max, score[i]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(running_max, tile_max);  // finite: a tile has keys
      const float alpha = exp2f(running_max - new_max);    // 0 on the warp's first tile
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float weight = exp2f(score[i] - new_max);
        logits[warp][soft_head][quarter * 4 + i] = weight;
        sum += weight;
      }
      running_sum = running_sum * alpha + sum;
      running_max = new_max;
      if (quarter == 0) rescale[warp][soft_head] = alpha;
    } else {
      // Lanes of absent heads still take part in the shuffles above (full mask), with nothing.
      float idle = -INFINITY;
      idle = __shfl_xor_sync(0xffffffffu, idle, 1);
      idle = __shfl_xor_sync(0xffffffffu, idle, 2);
    }
    __syncwarp();
    mma_tile_pv<D, GM, KEYS, D>(v_tile, logits[warp], KEYS, heads_here, rescale[warp], 0, pv, pv_lo);
    __syncwarp();  // every lane's reads of this stage before its refill
    issue_tile(block + 2 * NW, stage);
  }
  cp_async_wait<0>();  // no copy outlives the block (the last groups are empty)

  // Each warp's (max, sum) a head and its P V (f32, [head][dim]) into its own stages, whose
  // copies are all done; then the block merges the warps. A warp without keys has max -inf, sum
  // 0 and zero P V, so its factor exp2(-inf - max) is 0.
  running_sum += __shfl_xor_sync(0xffffffffu, running_sum, 1);
  running_sum += __shfl_xor_sync(0xffffffffu, running_sum, 2);
  if (quarter == 0) {
    warp_max[warp][soft_head] = running_max;
    warp_sum[warp][soft_head] = running_sum;
  }
  float* warp_o = reinterpret_cast<float*>(stages);
  __syncwarp();  // every lane's ldmatrix reads of the stages
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int head = 2 * in_group + (c & 1), dim = mt * 16 + group_id + (c >> 1) * 8;
      if (head < heads_here) warp_o[head * D + dim] = pv[mt][c] + pv_lo[mt][c];
    }
  __syncthreads();
  __half* out = p.out + seq * p.out_stride + head0 * D;
  for (int i = threadIdx.x; i < heads_here * D; i += NW * 32) {
    const int head = i / D;
    float block_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) block_max = fmaxf(block_max, warp_max[w][head]);
    float sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float factor = exp2f(warp_max[w][head] - block_max);
      sum += warp_sum[w][head] * factor;
      o += reinterpret_cast<const float*>(reinterpret_cast<const __half*>(warp_stages) + w * STAGES * STAGE_HALVES)[i] *
           factor;
    }
    out[i] = __float2half_rn(o / sum);
  }
}

}  // namespace qspec::cuda::kernels
