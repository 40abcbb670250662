// Paged multi-query attention (prefill, QSpec verify): FlashAttention-2 tiling on f16
// mma.sync m16n8k16 with f32 accumulators. A block owns 64 query rows of one KV head, where a
// row is (token, query head of the GQA group): row r of sequence s is token r / group, head
// kv_head * group + r % group. So a short run (verify: gamma + 1 tokens) still fills the tile
// with the group's heads, and every K/V tile is read once for all of them. K/V tiles of 64
// keys are gathered from the paged pool with cp.async into a double-buffered, XOR-swizzled
// shared-memory ring; S = Q K^T and O += P V use ldmatrix (.trans for V). Optional split-K
// over the key range writes unnormalised partials for attention_combine_kernel.
//
// An int8 cache (INT8; attention.h Kv8Planes): the two stages hold each key's row of plane bytes
// (K high, K low, V high, V low; 16-byte cp.async pieces, no low planes in a high-nibble pass) and
// the rows' scale pair words; after a stage lands, the block turns it into one f16 K tile (codes)
// and one f16 V tile (value * scale) in the same swizzled layout, in registers chunk by chunk
// (kernels/kv_int8.cuh), and the mma loop runs as for an f16 cache, each score multiplied by its
// key's K scale (paged_attention_decode_tiles.cuh says why V is scaled and K is not). Same shared
// memory: the f16 tiles take the f16 cache's K stages, the byte stages its V stages.
#pragma once
#include "ops/cuda/attention.h"
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/kv_int8.cuh"

namespace qspec::cuda::kernels {

struct PrefillParams {
  const __half* q;
  int64_t q_stride;
  const int32_t* query_start;
  const int32_t* positions;
  const __half* k_pool;
  const __half* v_pool;
  const int32_t* block_tables;
  int64_t max_blocks;
  int num_heads, num_kv_heads, group;
  int window;        // 0: off
  int sinks;         // with a window: positions 0 .. sinks - 1 stay visible (read as whole tiles)
  float scale_log2;  // log2(e) times the shape's scale (1 / sqrt(head_dim) unless set: detail::attention_scale_log2)
  int splits;
  int64_t rows;      // num_tokens * num_heads (partials)
  __half* out;
  int64_t out_stride;
  float* part_o;
  float2* part_ml;
  // An int8 cache (INT8 instances): its planes and scales, and whether the pass reads the high
  // nibbles only.
  Kv8Planes k8, v8;
  bool high_only;
};

inline constexpr int kPrefillRows = 64;  // query rows per block at most (4 warps x 16)
inline constexpr int kPrefillKeys = 64;  // keys per tile

// KW: warps that share a 16-row group and split each tile's keys (1, 2, 4); the block holds 4 / KW
// row groups, 64 / KW query rows. A QSpec verify has few rows per KV head ((gamma + 1) x the GQA
// group: 16 for Llama-3-8B at gamma 3), so with KW = 1 three of four warps multiplied padding;
// with KW = 4 every warp works on the 16 real rows, a quarter of the keys each, and the warps'
// softmax partials merge in shared memory at the end. K/V bytes read are the same.
template <int KW>
inline constexpr int kPrefillBlockRows = 16 * (4 / KW);

template <int D>
struct PrefillSmem {
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kTileHalves = 64 * D;
  // Q + 2 x (K, V): 80 KB at head_dim 128, 160 KB at 256 (one block a multiprocessor there).
  static constexpr size_t kBytes = static_cast<size_t>(5 * kTileHalves) * sizeof(__half);
  // Half offset of (row, 16-byte chunk) in a 64 x D tile, XOR-swizzled so that the 8 rows an
  // ldmatrix phase touches hit distinct banks.
  __device__ static __forceinline__ int offset(int row, int chunk) {
    const int swizzle = kChunks >= 8 ? (row & 7) : ((row >> 1) & (kChunks - 1));
    return row * D + ((chunk ^ swizzle) * 8);
  }
};

template <int D, int KW = 1, bool INT8 = false>
__global__ __launch_bounds__(128) void paged_attention_prefill_kernel(const PrefillParams p) {
  static_assert(KW == 1 || KW == 2 || KW == 4, "key warps: 1, 2 or 4");
  constexpr int ROWS = kPrefillBlockRows<KW>;  // query rows of the block
  constexpr int KEYS_W = kPrefillKeys / KW;    // keys of a tile per warp
  constexpr int NT = KEYS_W / 8;               // score n-tiles (8 keys) per warp
  pdl_prologue();  // launched with launch_pdl (common.h)
  using Smem = PrefillSmem<D>;
  constexpr int C = Smem::kChunks;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __half* q_tile = reinterpret_cast<__half*>(smem_raw);
  __half* k_tiles = q_tile + Smem::kTileHalves;          // [2][64 * D]
  __half* v_tiles = k_tiles + 2 * Smem::kTileHalves;     // [2][64 * D]
  // INT8: the f16 K and V tiles over the f16 cache's K stages, the byte stages over its V stages
  // (64 keys x 2D bytes each: a stage of V's size), the scale pair words, the tile's K scales.
  __half* const kv8_k_tile = k_tiles;
  __half* const kv8_v_tile = k_tiles + Smem::kTileHalves;
  uint8_t* const kv8_rows = reinterpret_cast<uint8_t*>(v_tiles);  // stage s at s * 128 * D bytes
  __shared__ uint32_t kv8_scale_pairs[INT8 ? 2 : 1][2][INT8 ? kPrefillKeys : 1];
  __shared__ float key_scales[INT8 ? kPrefillKeys : 1];
  __shared__ int row_position[kPrefillRows];
  __shared__ int warp_max[2], warp_min[2];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int seq = blockIdx.y;
  const int kv_head = blockIdx.z / p.splits, split = blockIdx.z % p.splits;
  const int q_begin = p.query_start[seq];
  const int run = p.query_start[seq + 1] - q_begin;
  const int total_rows = run * p.group;
  const int row0 = blockIdx.x * ROWS;
  if (row0 >= total_rows) return;
  const int64_t kv_stride = static_cast<int64_t>(p.num_kv_heads) * D;
  const int32_t* table = p.block_tables + seq * p.max_blocks;

  // Row positions and the key range the tile needs.
  if (tid < kPrefillRows) {  // warps 0 and 1 (whole warps for the reductions)
    const int r = row0 + tid;
    const int position = tid < ROWS && r < total_rows ? p.positions[q_begin + r / p.group] : -1;
    row_position[tid] = position;
    const int lowest =
        position < 0 ? INT_MAX : (p.window > 0 && p.sinks == 0 ? max(0, position - p.window + 1) : 0);
    const int high = __reduce_max_sync(0xffffffffu, position);
    const int low = __reduce_min_sync(0xffffffffu, lowest);
    if (lane == 0) {
      warp_max[warp] = high;
      warp_min[warp] = low;
    }
  }
  // Q tile (zeros for rows past the run).
  for (int i = tid; i < ROWS * C; i += 128) {
    const int r = i / C, c = i % C, row = row0 + r;
    const bool valid = row < total_rows;
    const __half* src = p.q;
    if (valid)
      src = p.q + static_cast<int64_t>(q_begin + row / p.group) * p.q_stride +
            static_cast<int64_t>(kv_head * p.group + row % p.group) * D + c * 8;
    cp_async_16(smem_address(q_tile + Smem::offset(r, c)), src, valid ? 16 : 0);
  }
  cp_async_commit();
  __syncthreads();
  const int key_max = max(warp_max[0], warp_max[1]);
  const int key_min = min(warp_min[0], warp_min[1]);
  const int first_tile = key_min / kPrefillKeys, last_tile = key_max / kPrefillKeys;
  const int tiles = last_tile - first_tile + 1;
  const int per_split = (tiles + p.splits - 1) / p.splits;
  const int tile_begin = first_tile + split * per_split;
  const int tile_end = min(last_tile + 1, tile_begin + per_split);

  auto load_kv = [&](int tile, int stage) {
    if constexpr (INT8) {
      constexpr int kPieces = D / 32;  // 16-byte pieces of a plane row; C a key's 4 rows
      for (int i = tid; i < kPrefillKeys * C; i += 128) {
        const int r = i / C, c = i % C, key = tile * kPrefillKeys + r, plane = c / kPieces;
        if (p.high_only && (plane & 1)) continue;  // no low plane in a high-nibble pass
        const bool valid = key >= key_min && key <= key_max;
        const int64_t row = valid ? kv8_row(table[key >> 4], kv_head, key & 15, p.num_kv_heads) : 0;
        const uint8_t* src = plane == 0 ? p.k8.high : plane == 1 ? p.k8.low : plane == 2 ? p.v8.high : p.v8.low;
        cp_async_16(smem_address(kv8_rows + stage * 128 * D + r * 2 * D + c * 16),
                    src + row * (D / 2) + (c % kPieces) * 16, valid ? 16 : 0);
      }
      {  // threads 0-63 the K scale pairs, 64-127 the V ones
        const int r = tid % kPrefillKeys, which = tid / kPrefillKeys, key = tile * kPrefillKeys + r;
        const bool valid = key >= key_min && key <= key_max;
        const int64_t row = valid ? kv8_row(table[key >> 4], kv_head, key & 15, p.num_kv_heads) : 0;
        cp_async_4(smem_address(&kv8_scale_pairs[stage][which][r]),
                   (which == 0 ? p.k8.scales : p.v8.scales) + (row & ~int64_t{1}), valid ? 4 : 0);
      }
      return;
    }
    __half* k_dst = k_tiles + stage * Smem::kTileHalves;
    __half* v_dst = v_tiles + stage * Smem::kTileHalves;
    for (int i = tid; i < kPrefillKeys * C; i += 128) {
      const int r = i / C, c = i % C, key = tile * kPrefillKeys + r;
      const bool valid = key >= key_min && key <= key_max;
      const __half* k_src = p.k_pool;
      const __half* v_src = p.v_pool;
      if (valid) {
        const int64_t slot = static_cast<int64_t>(table[key >> 4]) * 16 + (key & 15);
        const int64_t offset = slot * kv_stride + kv_head * D + c * 8;
        k_src = p.k_pool + offset;
        v_src = p.v_pool + offset;
      }
      cp_async_16(smem_address(k_dst + Smem::offset(r, c)), k_src, valid ? 16 : 0);
      cp_async_16(smem_address(v_dst + Smem::offset(r, c)), v_src, valid ? 16 : 0);
    }
  };

  const int g = lane >> 2, tq = lane & 3;
  const int rw = warp / KW, kw = warp % KW;  // this warp's row group, and its part of each tile's keys
  const int row_a = rw * 16 + g, row_b = row_a + 8;
  const int pos_a = row_position[row_a], pos_b = row_position[row_b];
  float o_acc[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[nd][e] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;

  if (tile_begin < tile_end) {
    load_kv(tile_begin, 0);
    cp_async_commit();
    cp_async_wait<1>();  // the Q tile
    __syncthreads();
    // Q's A fragments of this warp's 16 rows, held in registers up to head_dim 128; at 256 they
    // would take 64 registers a thread beside O's 128 and S's, so each k step of S = Q K^T reads
    // its fragments again from the Q tile (which stays in shared memory).
    constexpr bool kQInRegisters = D <= 128;
    uint32_t q_frag[kQInRegisters ? D / 16 : 1][4];
    if constexpr (kQInRegisters) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const int m = lane >> 3;
        const int r = rw * 16 + (m & 1) * 8 + (lane & 7);
        ldmatrix_x4(q_frag[kk], smem_address(q_tile + Smem::offset(r, kk * 2 + (m >> 1))));
      }
    }

    for (int tile = tile_begin; tile < tile_end; ++tile) {
      const int stage = (tile - tile_begin) & 1;
      if (tile + 1 < tile_end) load_kv(tile + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      if constexpr (INT8) {  // the stage's bytes into the f16 tiles (the previous tile's readers are past
                             // the barrier that ends each iteration)
#pragma unroll 1  // O's accumulators stay live across it: at head_dim 256 an unrolled loop spills
        for (int i = tid; i < kPrefillKeys * C; i += 128) {
          const int r = i / C, c = i % C, key = tile * kPrefillKeys + r;
          const uint8_t* bytes = kv8_rows + stage * 128 * D + r * 2 * D + c * 4;
          const Kv8Chunk k_chunk{*reinterpret_cast<const uint32_t*>(bytes),
                                 p.high_only ? 0u : *reinterpret_cast<const uint32_t*>(bytes + D / 2)};
          const Kv8Chunk v_chunk{*reinterpret_cast<const uint32_t*>(bytes + D),
                                 p.high_only ? 0u : *reinterpret_cast<const uint32_t*>(bytes + 3 * D / 2)};
          const __half k_scale = kv8_scale_of(kv8_scale_pairs[stage][0][r], key);  // key = position
          const __half v_scale = kv8_scale_of(kv8_scale_pairs[stage][1][r], key);
          *reinterpret_cast<uint4*>(kv8_k_tile + Smem::offset(r, c)) = kv8_chunk_to_half(k_chunk, p.high_only);
          *reinterpret_cast<uint4*>(kv8_v_tile + Smem::offset(r, c)) =
              kv8_scale_half8(kv8_chunk_to_half(v_chunk, p.high_only), v_scale);
          if (c == 0) key_scales[r] = __half2float(k_scale);
        }
        __syncthreads();
      }
      const __half* k_tile = INT8 ? kv8_k_tile : k_tiles + stage * Smem::kTileHalves;
      const __half* v_tile = INT8 ? kv8_v_tile : v_tiles + stage * Smem::kTileHalves;

      // S = Q K^T for this warp's 16 rows x its KEYS_W keys of the tile.
      float s_acc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[nt][e] = 0.0f;
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            const int m = lane >> 3;
            const int r = kw * KEYS_W + np * 16 + (m >> 1) * 8 + (lane & 7);
            uint32_t b[4];
            ldmatrix_x4(b, smem_address(k_tile + Smem::offset(r, kk * 2 + (m & 1))));
            mma_f16_16816(s_acc[2 * np], q_frag[kk], b[0], b[1]);
            mma_f16_16816(s_acc[2 * np + 1], q_frag[kk], b[2], b[3]);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t a[4];
          {
            const int m = lane >> 3;
            const int r = rw * 16 + (m & 1) * 8 + (lane & 7);
            ldmatrix_x4(a, smem_address(q_tile + Smem::offset(r, kk * 2 + (m >> 1))));
          }
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            const int m = lane >> 3;
            const int r = kw * KEYS_W + np * 16 + (m >> 1) * 8 + (lane & 7);
            uint32_t b[4];
            ldmatrix_x4(b, smem_address(k_tile + Smem::offset(r, kk * 2 + (m & 1))));
            mma_f16_16816(s_acc[2 * np], a, b[0], b[1]);
            mma_f16_16816(s_acc[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
      // Mask, online softmax (log2 domain).
      float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tile * kPrefillKeys + kw * KEYS_W + nt * 8 + 2 * tq + (e & 1);
          const int position = e < 2 ? pos_a : pos_b;
          const bool visible = key <= position && (p.window <= 0 || key > position - p.window || key < p.sinks);
          float s;
          if constexpr (INT8)
            s = visible ? s_acc[nt][e] * p.scale_log2 * key_scales[kw * KEYS_W + nt * 8 + 2 * tq + (e & 1)] : -INFINITY;
          else
            s = visible ? s_acc[nt][e] * p.scale_log2 : -INFINITY;
          s_acc[nt][e] = s;
          if (e < 2) tile_max_a = fmaxf(tile_max_a, s);
          else tile_max_b = fmaxf(tile_max_b, s);
        }
#pragma unroll
      for (int offset = 1; offset < 4; offset <<= 1) {
        tile_max_a = fmaxf(tile_max_a, __shfl_xor_sync(0xffffffffu, tile_max_a, offset));
        tile_max_b = fmaxf(tile_max_b, __shfl_xor_sync(0xffffffffu, tile_max_b, offset));
      }
      const float new_max_a = fmaxf(max_a, tile_max_a), new_max_b = fmaxf(max_b, tile_max_b);
      const float base_a = new_max_a == -INFINITY ? 0.0f : new_max_a;
      const float base_b = new_max_b == -INFINITY ? 0.0f : new_max_b;
      const float alpha_a = exp2f(max_a - base_a), alpha_b = exp2f(max_b - base_b);
      max_a = new_max_a;
      max_b = new_max_b;
      float row_sum_a = 0.0f, row_sum_b = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s_acc[nt][0] = exp2f(s_acc[nt][0] - base_a);
        s_acc[nt][1] = exp2f(s_acc[nt][1] - base_a);
        s_acc[nt][2] = exp2f(s_acc[nt][2] - base_b);
        s_acc[nt][3] = exp2f(s_acc[nt][3] - base_b);
        row_sum_a += s_acc[nt][0] + s_acc[nt][1];
        row_sum_b += s_acc[nt][2] + s_acc[nt][3];
      }
      sum_a = sum_a * alpha_a + row_sum_a;
      sum_b = sum_b * alpha_b + row_sum_b;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o_acc[nd][0] *= alpha_a;
        o_acc[nd][1] *= alpha_a;
        o_acc[nd][2] *= alpha_b;
        o_acc[nd][3] *= alpha_b;
      }
      // O += P V: P from the S accumulators (C layout -> A layout), V via ldmatrix.trans.
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        uint32_t p_frag[4];
        p_frag[0] = pack_half2(s_acc[2 * kk][0], s_acc[2 * kk][1]);
        p_frag[1] = pack_half2(s_acc[2 * kk][2], s_acc[2 * kk][3]);
        p_frag[2] = pack_half2(s_acc[2 * kk + 1][0], s_acc[2 * kk + 1][1]);
        p_frag[3] = pack_half2(s_acc[2 * kk + 1][2], s_acc[2 * kk + 1][3]);
#pragma unroll
        for (int nd2 = 0; nd2 < D / 16; ++nd2) {
          const int m = lane >> 3;
          const int r = kw * KEYS_W + kk * 16 + (m & 1) * 8 + (lane & 7);
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_address(v_tile + Smem::offset(r, nd2 * 2 + (m >> 1))));
          mma_f16_16816(o_acc[2 * nd2], p_frag, b[0], b[1]);
          mma_f16_16816(o_acc[2 * nd2 + 1], p_frag, b[2], b[3]);
        }
      }
      __syncthreads();  // this stage is reloaded two tiles later
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    sum_a += __shfl_xor_sync(0xffffffffu, sum_a, offset);
    sum_b += __shfl_xor_sync(0xffffffffu, sum_b, offset);
  }
  if constexpr (KW > 1) {
    // The KW warps of a row group saw different keys: each leaves its rows' (max, sum) and
    // unnormalised O in shared memory (over the K tiles, free now), and the group's first warp
    // merges them as split-K partials merge (weights exp2(max_w - max)).
    __shared__ float2 part_ml[4][16];
    float* part_o = reinterpret_cast<float*>(k_tiles);  // [warp][16 rows][D]: 4 * 16 * D floats
    static_assert(4 * 16 * D * sizeof(float) <= 2 * Smem::kTileHalves * sizeof(__half), "merge fits the K tiles");
    __syncthreads();  // every warp is done with the tiles
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int d = nd * 8 + 2 * tq;
      *reinterpret_cast<float2*>(part_o + (warp * 16 + g) * D + d) = make_float2(o_acc[nd][0], o_acc[nd][1]);
      *reinterpret_cast<float2*>(part_o + (warp * 16 + g + 8) * D + d) = make_float2(o_acc[nd][2], o_acc[nd][3]);
    }
    if (tq == 0) {
      part_ml[warp][g] = make_float2(max_a, sum_a);
      part_ml[warp][g + 8] = make_float2(max_b, sum_b);
    }
    __syncthreads();
    if (kw != 0) return;
    float weight_a[KW], weight_b[KW];
    max_a = -INFINITY, max_b = -INFINITY;
#pragma unroll
    for (int w = 0; w < KW; ++w) {
      max_a = fmaxf(max_a, part_ml[warp + w][g].x);
      max_b = fmaxf(max_b, part_ml[warp + w][g + 8].x);
    }
    sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int w = 0; w < KW; ++w) {
      const float2 ml_a = part_ml[warp + w][g], ml_b = part_ml[warp + w][g + 8];
      weight_a[w] = ml_a.x == -INFINITY ? 0.0f : exp2f(ml_a.x - max_a);
      weight_b[w] = ml_b.x == -INFINITY ? 0.0f : exp2f(ml_b.x - max_b);
      sum_a += ml_a.y * weight_a[w];
      sum_b += ml_b.y * weight_b[w];
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int d = nd * 8 + 2 * tq;
      float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < KW; ++w) {
        const float2 a = *reinterpret_cast<const float2*>(part_o + ((warp + w) * 16 + g) * D + d);
        const float2 b = *reinterpret_cast<const float2*>(part_o + ((warp + w) * 16 + g + 8) * D + d);
        o.x += a.x * weight_a[w], o.y += a.y * weight_a[w], o.z += b.x * weight_b[w], o.w += b.y * weight_b[w];
      }
      o_acc[nd][0] = o.x, o_acc[nd][1] = o.y, o_acc[nd][2] = o.z, o_acc[nd][3] = o.w;
    }
  }
  // Write rows a and b of this warp (of its row group).
#pragma unroll
  for (int half_index = 0; half_index < 2; ++half_index) {
    const int r = half_index == 0 ? row_a : row_b;
    const int row = row0 + r;
    if (row >= total_rows) continue;
    const int64_t token = q_begin + row / p.group;
    const int head = kv_head * p.group + row % p.group;
    const float sum = half_index == 0 ? sum_a : sum_b;
    const float maximum = half_index == 0 ? max_a : max_b;
    if (p.splits == 1) {
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      __half* dst = p.out + token * p.out_stride + static_cast<int64_t>(head) * D;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        const int d = nd * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(dst + d) =
            pack_half2(o_acc[nd][2 * half_index] * inverse, o_acc[nd][2 * half_index + 1] * inverse);
      }
    } else {
      const int64_t prow = static_cast<int64_t>(split) * p.rows + token * p.num_heads + head;
      float* dst = p.part_o + prow * D;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        const int d = nd * 8 + 2 * tq;
        *reinterpret_cast<float2*>(dst + d) = make_float2(o_acc[nd][2 * half_index], o_acc[nd][2 * half_index + 1]);
      }
      if (tq == 0) p.part_ml[prow] = make_float2(sum > 0.0f ? maximum : -INFINITY, sum);
    }
  }
}

}  // namespace qspec::cuda::kernels

namespace qspec::cuda::detail {

// The launch of one instance: its dynamic shared memory opted into once (check_attention_runs_here
// first: the opt-in fails on a device without that much), then the kernel with PDL.
template <int D, int KW, bool INT8>
void launch_prefill_d(const kernels::PrefillParams& params, dim3 grid, cudaStream_t stream) {
  constexpr size_t bytes = kernels::PrefillSmem<D>::kBytes;
  static bool configured = false;  // per instantiation; attribute setting is idempotent
  if (!configured) {
    check_attention_runs_here(D);
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(kernels::paged_attention_prefill_kernel<D, KW, INT8>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    configured = true;
  }
  launch_pdl(kernels::paged_attention_prefill_kernel<D, KW, INT8>, dim3(grid), dim3(128), bytes, stream, params);
  QSPEC_CUDA_CHECK_LAUNCH("paged_attention_prefill_kernel");
}

// One instance's blocks resident a multiprocessor (its dynamic shared memory opted into first, as
// the launch does), asked of the runtime once an instance.
template <int D, int KW, bool INT8>
int prefill_resident_per_multiprocessor() {
  static const int resident = [] {
    constexpr size_t bytes = kernels::PrefillSmem<D>::kBytes;
    check_attention_runs_here(D);
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(kernels::paged_attention_prefill_kernel<D, KW, INT8>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    int blocks = 0;
    QSPEC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, kernels::paged_attention_prefill_kernel<D, KW, INT8>, 128, bytes));
    return std::max(blocks, 1);
  }();
  return resident;
}

template <int D, bool INT8>
int prefill_resident_kw(int key_warps) {
  return key_warps == 4   ? prefill_resident_per_multiprocessor<D, 4, INT8>()
         : key_warps == 2 ? prefill_resident_per_multiprocessor<D, 2, INT8>()
                          : prefill_resident_per_multiprocessor<D, 1, INT8>();
}

template <int D, bool INT8>
void launch_prefill_kw(int key_warps, const kernels::PrefillParams& params, dim3 grid, cudaStream_t stream) {
  if (key_warps == 4) launch_prefill_d<D, 4, INT8>(params, grid, stream);
  else if (key_warps == 2) launch_prefill_d<D, 2, INT8>(params, grid, stream);
  else launch_prefill_d<D, 1, INT8>(params, grid, stream);
}

}  // namespace qspec::cuda::detail
