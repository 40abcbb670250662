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
// drain. Measured on the H100 (docs/perf-journal/perf-notes-journal-2026.md): the folding alone gained nothing (the
// rotation's round trips move into this kernel); the early copies make the step 0.8 / 2.5 /
// 1.6 % shorter at batch 8 / 16 / 64, and batch 1 is unchanged.
//
// MMA (DecodeAttention::mma, head_dim 64 and up): ncu put the f32 kernel at one warp a scheduler
// issuing every 5.4 cycles, ~970 instructions a warp a 32-key tile (16-lane shuffle sums a key a
// head, then 8 FMAs a key a head for P V): a chain of instructions, not of bytes. Here the
// scores are one mma row tile of 16 keys a warp against the 8 query-head columns (D / 16 steps),
// and P V is V^T (a warp's D / 4 dimensions, ldmatrix.trans) against P^T, with P in two f16
// parts (hi + lo) so the weights keep ~22 bits: ~455 instructions a tile. Tiles rows are
// XOR-swizzled for ldmatrix; the query heads go through shared memory in f16 and the scores are
// scaled after the mma. Each warp's P V accumulators are whole for its dimensions, so the block
// needs no reduction at the end.
#pragma once
#include "ops/cuda/kernels/kv_int8.cuh"
#include "ops/cuda/kernels/paged_attention_decode.cuh"
#include "ops/cuda/kernels/paged_kv_write.cuh"  // kv_pool_row
#include "ops/cuda/kernels/rope.cuh"
#include "ops/cuda/kernels/rope_kv_write.cuh"  // add_bias_f16
#include "ops/cuda/kernels/wgmma.cuh"          // mbarriers, bulk copies, QSPEC_WGMMA

namespace qspec::cuda::kernels {

// A lane's slice of 8 values with their biases added (add_bias_f16: rope_kv_write's bits); bias
// null: the slice as it is. The sums are f16 values, so the repacking rounds nothing.
__device__ __forceinline__ uint4 add_bias_slice(const uint4& slice, const float* bias) {
  if (bias == nullptr) return slice;
  const __half* values = reinterpret_cast<const __half*>(&slice);
  const float4 low = __ldg(reinterpret_cast<const float4*>(bias)), high = __ldg(reinterpret_cast<const float4*>(bias) + 1);
  const float b[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
  float sums[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) sums[e] = add_bias_f16(values[e], b[e]);
  return float8_to_half(sums);
}

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

// A stage holds one tile's keys and values: 16 KB (8 KB with 8 query heads a block in f32 FMAs,
// whose reduce buffer takes 16 KB; static shared memory stops at 48; MMA has no reduce buffer and
// keeps 16 KB at 8 heads). Two stages: the next tile's copies are in flight while the block
// computes on this one. Tile keys: 32 at head_dim 128.
// head_dim 256 (Gemma 3) keeps 16 keys a tile (a stage of 16 KB) wherever the f32 reduce buffer
// ([warps][GM][256] f32: 4 KB a head) leaves room, and under MMA, which has no reduce buffer and
// needs whole 16-key row tiles; the f32 tiles take 8 keys at 4 heads a block and 4 at 8 (static
// shared memory 34 and 42 KB; 38-42 KB for the others).
// An int8 cache under MMA (no f16 tile; a stage of plane bytes is half an f16 stage's size) takes
// twice the keys, up to 64 (a 16-key score row tile for each of the 4 warps): the same bytes in
// flight as the f16 cache's stages.
template <int D, int GM, bool MMA>
inline constexpr int kDecodeTileKeysF16 = D == 256 ? (MMA || GM <= 2 ? 16 : 32 / GM) : (GM >= 8 && !MMA ? 2048 : 4096) / D;
template <int D, int GM, bool MMA, bool INT8 = false>
inline constexpr int kDecodeTileKeys =
    INT8 && MMA ? (2 * kDecodeTileKeysF16<D, GM, MMA> < 64 ? 2 * kDecodeTileKeysF16<D, GM, MMA> : 64)
                : kDecodeTileKeysF16<D, GM, MMA>;
inline constexpr int kDecodeStages = 2;

// ---- the tensor-core (MMA) tile steps ----------------------------------------------------
// Fragment names follow mma.m16n8k16: lane = 4 * group_id + in_group; C element c of a lane is
// row group_id (+ 8 for c >= 2), column 2 * in_group (+ 1 for odd c).

// Where a tile row's (key's) 16-byte chunk sits: XOR-swizzled by the key's low 3 bits under MMA,
// so the 8 rows an ldmatrix phase reads (8 keys, one chunk) fall in 8 distinct bank groups.
template <int D, bool MMA>
__device__ __forceinline__ int decode_tile_at(int key, int chunk) {
  return key * D + (MMA ? chunk ^ (key & 7) : chunk) * 8;
}

// A per-head value (x[h]) for the two head columns of this lane's C fragment (2 * in_group, + 1);
// `absent` for a column past the block's heads.
__device__ __forceinline__ float2 column_pair(const float* x, int in_group, int heads_here, float absent) {
  return make_float2(2 * in_group < heads_here ? x[2 * in_group] : absent,
                     2 * in_group + 1 < heads_here ? x[2 * in_group + 1] : absent);
}

// A score row tile's two accumulator chains summed, scaled into log2 units (times each key's K
// scale for an int8 cache: rows group_id and group_id + 8 of the tile, scale_g / scale_g8) into
// logits[head][key].
template <int GM, int TILE>
__device__ __forceinline__ void store_tile_scores(const float (&scores)[4], const float (&scores_odd)[4], int key0,
                                                  float scale_log2, float (&logits)[GM][TILE], float scale_g = 1.0f,
                                                  float scale_g8 = 1.0f) {
  const int lane = threadIdx.x & 31, group_id = lane >> 2, in_group = lane & 3;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int h = 2 * in_group + (c & 1);  // scores[c]: key key0 + group_id (+ 8), head h
    const int key = key0 + group_id + (c >> 1) * 8;
    if (h < GM) logits[h][key] = (scores[c] + scores_odd[c]) * scale_log2 * (c >> 1 ? scale_g8 : scale_g);
  }
}

// Scores of a 16-key row tile (keys key0 .. key0 + 15 of the tile) against the 8 query-head
// columns (q_frag: Q^T's B fragments, D / 16 k steps), in two accumulator chains (even and odd k
// steps: half the dependent mma latency), scaled into log2 units into logits[head][key].
template <int D, int GM, int TILE>
__device__ __forceinline__ void mma_tile_scores(const __half* k_tile, int key0, const uint32_t (&q_frag)[D / 16][2],
                                                float scale_log2, float (&logits)[GM][TILE]) {
  const int lane = threadIdx.x & 31;
  float scores[4] = {0.0f, 0.0f, 0.0f, 0.0f}, scores_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int key = key0 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, smem_address(k_tile + decode_tile_at<D, true>(key, ks * 2 + (lane >> 4))));
    mma_f16_16816(ks % 2 ? scores_odd : scores, a, q_frag[ks][0], q_frag[ks][1]);
  }
  store_tile_scores<GM, TILE>(scores, scores_odd, key0, scale_log2, logits);
}

// mma_tile_scores over an int8 stage (kv_int8.cuh, "plane words straight into mma fragments"):
// the A fragments come from the plane words in registers, the k order permuted as
// kv8_score_word says (q_frag follows it), and each key's score is multiplied by its K scale (the
// codes are exact in f16 whatever the scale: q . code in f32, then one multiply). key_scale(k):
// the f32 K scale of the tile's key k.
template <int D, int GM, int TILE, bool HIGH_ONLY, typename KeyScale>
__device__ __forceinline__ void mma_tile_scores_int8(const uint8_t* stage, int key0, const uint32_t (&q_frag)[D / 16][2],
                                                     float scale_log2, float (&logits)[GM][TILE],
                                                     const KeyScale& key_scale) {
  const int lane = threadIdx.x & 31, group_id = lane >> 2, in_group = lane & 3;
  constexpr int kWords = D == 64 ? 2 : 4;  // lane words a load gives (per plane and key)
  float scores[4] = {0.0f, 0.0f, 0.0f, 0.0f}, scores_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int q = 0; q < D / 32 / kWords; ++q) {
    uint32_t high[2][4], low[2][4] = {};  // rows group_id and group_id + 8
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      kv8_load_score_words<D, TILE>(stage, key0 + group_id + 8 * r, 0, in_group, q, high[r]);
      if constexpr (!HIGH_ONLY) kv8_load_score_words<D, TILE>(stage, key0 + group_id + 8 * r, 1, in_group, q, low[r]);
    }
#pragma unroll
    for (int u = 0; u < kWords; ++u)
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {  // k step 2 (q kWords + u) + odd: pairs 2 odd, 2 odd + 1
        const int ks = 2 * (q * kWords + u) + odd;
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t h = high[r][u] >> (8 * odd), l = low[r][u] >> (8 * odd);
          a[r] = kv8_fragment<0, HIGH_ONLY>(h, l);
          a[r + 2] = kv8_fragment<1, HIGH_ONLY>(h, l);
        }
        mma_f16_16816(ks % 2 ? scores_odd : scores, a, q_frag[ks][0], q_frag[ks][1]);
      }
  }
  store_tile_scores<GM, TILE>(scores, scores_odd, key0, scale_log2, logits, key_scale(key0 + group_id),
                              key_scale(key0 + group_id + 8));
}

// The P V accumulators times each head's rescale factor (the softmax's new maximum).
template <int D>
__device__ __forceinline__ void rescale_pv(const float* rescale, int heads_here, float (&pv)[D / 64][4],
                                           float (&pv_lo)[D / 64][4]) {
  const int in_group = threadIdx.x & 3;
  const float2 alpha = column_pair(rescale, in_group, heads_here, 0.0f);
#pragma unroll
  for (int mt = 0; mt < D / 64; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      pv[mt][c] *= (c & 1) ? alpha.y : alpha.x;
      pv_lo[mt][c] *= (c & 1) ? alpha.y : alpha.x;
    }
}

// P^T's B fragments for k step ks (keys ks * 16 ..): the softmax weights in two f16 parts, hi and
// the residual lo. P^T's column group_id is head group_id; logits past n are raw scores: weight 0.
// k rows (2 in_group, + 1) are keys (ks * 16 + 2 in_group, + 1), or with PAIRS_4_APART (the int8
// path's order, mma_tile_pv_int8) keys (ks * 16 + in_group, + 4); rows 8 on are keys 8 on.
template <int GM, int TILE, bool PAIRS_4_APART = false>
__device__ __forceinline__ void pv_weight_fragments(const float (&logits)[GM][TILE], int ks, int n, int heads_here,
                                                    uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  const int lane = threadIdx.x & 31, group_id = lane >> 2, in_group = lane & 3;
  auto weight = [&](int i) { return group_id < heads_here && i < n ? logits[min(group_id, GM - 1)][i] : 0.0f; };
  const int k0 = ks * 16 + (PAIRS_4_APART ? in_group : 2 * in_group), second = PAIRS_4_APART ? 4 : 1;
  const float w0 = weight(k0), w1 = weight(k0 + second), w2 = weight(k0 + 8), w3 = weight(k0 + 8 + second);
  hi[0] = pack_half2(w0, w1);
  hi[1] = pack_half2(w2, w3);
  const float2 r0 = unpack_half2(hi[0]), r1 = unpack_half2(hi[1]);
  lo[0] = pack_half2(w0 - r0.x, w1 - r0.y);
  lo[1] = pack_half2(w2 - r1.x, w3 - r1.y);
}

// acc = acc * alpha + V^T P^T over a tile's first n keys, for this warp's D / 4 dimensions
// (16-dim row tiles) and the 8 head columns: P (the softmax weights in logits) in two f16 parts,
// hi into pv and the residual lo into pv_lo (~22 bits of weight; two chains).
template <int D, int GM, int TILE>
__device__ __forceinline__ void mma_tile_pv(const __half* v_tile, const float (&logits)[GM][TILE], int n,
                                            int heads_here, const float* rescale, float (&pv)[D / 64][4],
                                            float (&pv_lo)[D / 64][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  rescale_pv<D>(rescale, heads_here, pv, pv_lo);
#pragma unroll
  for (int ks = 0; ks < TILE / 16; ++ks) {
    uint32_t hi[2], lo[2];
    pv_weight_fragments<GM, TILE>(logits, ks, n, heads_here, hi, lo);
    const int key = ks * 16 + (lane & 7) + (lane >> 4) * 8;
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt) {
      const int chunk = (warp * (D / 4) + mt * 16) / 8 + ((lane >> 3) & 1);
      uint32_t a[4];
      ldmatrix_x4_trans(a, smem_address(v_tile + decode_tile_at<D, true>(key, chunk)));
      mma_f16_16816(pv[mt], a, hi[0], hi[1]);
      mma_f16_16816(pv_lo[mt], a, lo[0], lo[1]);
    }
  }
}

// mma_tile_pv over an int8 stage: V^T's A fragments from the V plane words, two keys' fields a
// register (kv8_value_byte: mt tile b's rows are this lane's byte b's two fields, so the rows are
// the dimensions kv8_value_dim names), times the two keys' V scales in f16: value * scale rounded
// once, as the f16 cache would hold it (P cannot take the scale: P * scale falls into f16's
// subnormals for small scales). A register pairs keys k and k + 4 (k = ks * 16 + in_group, + 8):
// the four in_group lanes then read four consecutive rows of a plane, two bank halves (rows of
// 64 bytes at head_dim 128) where keys k, k + 2, k + 4, k + 6 would all fall in one.
// pair_scale(k): the f16x2 V scales of the tile's keys k, k + 4.
template <int D, int GM, int TILE, bool HIGH_ONLY, typename PairScale>
__device__ __forceinline__ void mma_tile_pv_int8(const uint8_t* stage, const float (&logits)[GM][TILE], int n,
                                                 int heads_here, const float* rescale, float (&pv)[D / 64][4],
                                                 float (&pv_lo)[D / 64][4], const PairScale& pair_scale) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group_id = lane >> 2, in_group = lane & 3;
  rescale_pv<D>(rescale, heads_here, pv, pv_lo);
  const int byte0 = kv8_value_byte<D>(warp, group_id, 0);  // this lane's bytes lie in one plane word
  const int word_offset = byte0 / 4 * 4, first = byte0 % 4;
#pragma unroll
  for (int ks = 0; ks < TILE / 16; ++ks) {
    uint32_t hi[2], lo[2];
    pv_weight_fragments<GM, TILE, true>(logits, ks, n, heads_here, hi, lo);
    uint32_t a[D / 64][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // keys (in_group, + 4), then the pair 8 keys on
      const int key = ks * 16 + in_group + 8 * half;
      auto word = [&](int k, int plane) {
        return *reinterpret_cast<const uint32_t*>(stage + kv8_stage_row<D, TILE>(plane, k) + word_offset);
      };
      const uint32_t high_a = word(key, 2), high_b = word(key + 4, 2);
      const uint32_t low_a = HIGH_ONLY ? 0u : word(key, 3), low_b = HIGH_ONLY ? 0u : word(key + 4, 3);
      const uint32_t scale_bits = pair_scale(key);
      const __half2 scale = *reinterpret_cast<const __half2*>(&scale_bits);
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
        const uint32_t h = kv8_pair_bytes(high_a, high_b, first + b);
        const uint32_t l = HIGH_ONLY ? 0u : kv8_pair_bytes(low_a, low_b, first + b);
        const uint32_t field0 = kv8_fragment<0, HIGH_ONLY>(h, l), field1 = kv8_fragment<1, HIGH_ONLY>(h, l);
        const __half2 row_g = __hmul2(*reinterpret_cast<const __half2*>(&field0), scale);
        const __half2 row_g8 = __hmul2(*reinterpret_cast<const __half2*>(&field1), scale);
        a[b][2 * half] = *reinterpret_cast<const uint32_t*>(&row_g);       // a0 / a2: row group_id
        a[b][2 * half + 1] = *reinterpret_cast<const uint32_t*>(&row_g8);  // a1 / a3: row group_id + 8
      }
    }
#pragma unroll
    for (int b = 0; b < D / 64; ++b) {
      mma_f16_16816(pv[b], a[b], hi[0], hi[1]);
      mma_f16_16816(pv_lo[b], a[b], lo[0], lo[1]);
    }
  }
}

// The MMA block's result (finish_split's twin): each warp's accumulators are whole for its
// dimensions, so they are written as they are (no reduction) as this split's partials with its
// (max, sum), or normalised into out when the context is not split; then the merge.
template <int D, bool INT8>
__device__ __forceinline__ void finish_split_mma(const DecodeParams& p, const float (&pv)[D / 64][4],
                                                 const float* running_max, const float* running_sum, int seq,
                                                 int split, int head0, int heads_here) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group_id = lane >> 2, in_group = lane & 3;
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;
  const int64_t row0 = static_cast<int64_t>(seq) * p.num_heads + head0;  // the block's first head's row
  // pv[mt][c]: dimension dim0 + mt * 16 (+ 8 for c >= 2), head 2 * in_group (+ 1 for odd c); an
  // int8 cache's rows are the dimensions kv8_value_dim names.
  const int dim0 = warp * (D / 4) + group_id;
  auto at = [&](int mt, int c) {
    const int dim = INT8 ? kv8_value_dim<D>(warp, group_id, mt, c >> 1) : dim0 + mt * 16 + (c >> 1) * 8;
    return (2 * in_group + (c & 1)) * D + dim;
  };
  if (p.splits > 1) {
    float* part = p.part_o + (split * rows + row0) * D;
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (2 * in_group + (c & 1) < heads_here) part[at(mt, c)] = pv[mt][c];
    if (threadIdx.x < heads_here)
      p.part_ml[split * rows + row0 + threadIdx.x] = make_float2(running_max[threadIdx.x], running_sum[threadIdx.x]);
  } else {
    __half* out = p.out + seq * p.out_stride + head0 * D;
    const float2 sum = column_pair(running_sum, in_group, heads_here, 1.0f);
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (2 * in_group + (c & 1) < heads_here) out[at(mt, c)] = __float2half_rn(pv[mt][c] / ((c & 1) ? sum.y : sum.x));
  }
  merge_splits<D>(p, seq, head0, heads_here);
}

// A per-phase clock of the tiles kernel (a measurement build only: -DQSPEC_ATTENTION_STAMPS=N
// prints, from thread 0 of every MMA block, the global timer at each phase of launches N .. N + 3;
// a block reads the launch number at its entry and block (0, 0, 0) advances it at its end, so
// launches that overlap can mix; tools/attention_stamps.py summarizes, docs/perf-journal/perf-notes-journal-2026.md "Where
// the batch-1 attention's time goes"). Without the macro the kernel's code is unchanged.
#ifdef QSPEC_ATTENTION_STAMPS
__device__ unsigned g_attention_stamp_launch;
__device__ __forceinline__ unsigned long long attention_stamp_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
#define QSPEC_ATTENTION_STAMP(slot) \
  do {                              \
    if (threadIdx.x == 0) stamps[slot] = attention_stamp_ns(); \
  } while (0)
// The ends of the first two tiles (slots 3, 4).
#define QSPEC_ATTENTION_STAMP_TILE()                     \
  do {                                                   \
    if (stamp_tile < 5) QSPEC_ATTENTION_STAMP(stamp_tile); \
    ++stamp_tile;                                        \
  } while (0)
#else
#define QSPEC_ATTENTION_STAMP(slot) \
  do {                              \
  } while (0)
#define QSPEC_ATTENTION_STAMP_TILE() \
  do {                               \
  } while (0)
#endif

// INT8 (an int8 cache, attention.h Kv8Planes; the instances automatic runs: MMA at head_dim 64 and
// up, the f32 tiles at 32): a stage holds each key's row of bytes (K high, K low, V high, V low
// plane rows, head_dim / 2 bytes each; a lane copies one 16-byte piece of it, the low planes'
// lanes none in a high-nibble pass) and the two scales (4-byte copies of the slot pair's word).
// K stays codes, exact in f16 whatever the scale, and its scale multiplies the f32 score; V is
// taken as value * scale in f16 (what an f16 cache would hold). Under MMA the score and P V warps
// turn the stage's plane words into their mma fragments in registers (kv_int8.cuh: a LOP3 a plane
// and two f16 operations a register, a byte permute first for V, whose registers pair two keys):
// no f16 tile and no barrier of its own, and a tile takes twice the f16 cache's keys (the same
// bytes a stage). A first version turned each stage into an f16 tile in shared memory: a step at
// 8 K context 1.45-1.50x the f16 cache's, its DRAM 29 % busy (ncu). The f32 tiles (head_dim 32)
// still convert into an f16 tile. The new token's row (RoPE folded in) is quantized from
// registers as paged_kv_write quantizes it (a row's amax over its D / 8 lanes); under MMA its
// words overwrite the stale copy in the stage and its scales replace the copied ones where they
// are read (tile_scale), otherwise its chunk replaces it at conversion.
// D: head_dim (32, 64, 128, 256; MMA: 64 and up); GM: query heads per block (1, 2, 4, 8); MMA: the
// scores and P V on tensor cores (see the top of this file).
// Blocks a multiprocessor must hold: the int8 MMA instances up to head_dim 128 at 128 registers
// a thread, 4 blocks (their shared memory allows 5); left alone they take 139 at head_dim 128.
// The others 0, which compiles as no minimum at all (the SASS of a bare __launch_bounds__(128)):
// an explicit 1 let the f16 instance at head_dim 128 take 137 registers, 3 blocks, and its
// batch-64 step at 8 K went from 19.6 to 25.4 ms (H200, 9a18355).
template <int D, bool MMA, bool INT8>
inline constexpr int kDecodeMinBlocks = INT8 && MMA && D <= 128 ? 4 : 0;
template <int D, int GM, bool MMA = false, bool INT8 = false>
__global__ __launch_bounds__(kDecodeWarps * 32, (kDecodeMinBlocks<D, MMA, INT8>)) void paged_attention_decode_tiles_kernel(
    const DecodeParams p) {
  static_assert(!MMA || D >= 64, "tensor-core tiles: head_dim 64 and up (8 chunks a key row for the swizzle)");
  constexpr int LPK = D / 8;     // lanes per key (16 bytes each)
  constexpr int KPW = 32 / LPK;  // keys per warp per step
  constexpr int STEP = kDecodeWarps * KPW;
  constexpr int TILE = kDecodeTileKeys<D, GM, MMA, INT8>;
  constexpr int U = TILE / STEP;  // keys a lane copies a tile (K and V each)
  static_assert(U >= 1 && U * STEP == TILE, "a tile is whole steps");
  static_assert(!MMA || (TILE % 16 == 0 && TILE / 16 <= kDecodeWarps),
                "MMA: a tile is whole 16-key row tiles, a score warp each");
  // INT8 under MMA on sm_90a: without a window every tile is whole cache blocks (16 positions,
  // splits and tiles multiples of 16), and the cache holds a block's rows of one plane as one
  // run of bytes, which one bulk copy moves (a lane a run, spread over the warps: 4 planes and 2
  // scale runs a block, 24 copies a 64-key tile). Key by key, each lane of a key copied one
  // 16-byte piece of its row and lanes 0 and 1 its scales (ncu, batch 64 at 8 K: ~490 of ~1340
  // instructions a warp a tile). With a window (sinks + recent) positions are not whole blocks:
  // key by key, as then.
  constexpr bool kBulk = INT8 && MMA && QSPEC_WGMMA;
  // INT8: the stages in kv8_rows; without MMA one f16 tile converted from them, under MMA none.
  constexpr int kF16Stages = INT8 ? 1 : kDecodeStages;
  constexpr int kF16Tile = INT8 && MMA ? 8 : TILE * D;
  __shared__ __align__(16) __half k_tiles[kF16Stages][kF16Tile];  // a tile's key j at j * D
  __shared__ __align__(16) __half v_tiles[kF16Stages][kF16Tile];
  // INT8 only (absent from the f16 instances: unused shared arrays are not allocated): key j's
  // plane rows (at j * 2D; under MMA plane by plane, kv8_stage_row), its K and V scale pair words
  // (copied key by key) or, from bulk copies, the scales themselves (16 a block).
  __shared__ __align__(128) uint8_t kv8_rows[INT8 ? kDecodeStages : 1][INT8 ? TILE * 2 * D : 16];
  __shared__ uint32_t kv8_scale_pairs[INT8 ? kDecodeStages : 1][2][INT8 ? TILE : 1];
  __shared__ __align__(16) __half kv8_scale_halves[kBulk ? kDecodeStages : 1][2][kBulk ? TILE : 8];
  // INT8 under MMA: the tile's V scales, out of their copies once a tile (P V reads two keys' at
  // once), and the bulk copies' barrier a stage.
  __shared__ __align__(4) __half kv8_value_scales[INT8 && MMA ? TILE : 2];
  __shared__ __align__(8) uint64_t kv8_full[kBulk ? kDecodeStages : 1];
  __shared__ float logits[GM][TILE];
  __shared__ float reduce[kDecodeWarps][GM][D];
  __shared__ float running_max[GM], running_sum[GM], rescale[GM];
  __shared__ float rope_cosine[D / 2], rope_sine[D / 2];
  // MMA: the block's query heads in f16 (8 rows, the mma's n; zeros past heads_here).
  __shared__ __align__(16) __half q_heads[MMA ? 8 : 1][MMA ? D : 8];

#ifdef QSPEC_ATTENTION_STAMPS
  unsigned long long stamps[8] = {};
  const unsigned stamp_launch = *static_cast<volatile unsigned*>(&g_attention_stamp_launch);
  int stamp_tile = 3;
#endif
  QSPEC_ATTENTION_STAMP(0);
  const DecodeThread t = decode_thread<D, GM>(p);  // plain copies: lambdas below capture them
  const int warp = t.warp, lg = t.lg, li = t.li, kv_head = t.kv_head, chunk_of_heads = t.chunk_of_heads;
  const int seq = t.seq, split = t.split, head0 = t.head0, heads_here = t.heads_here;
  const int lane = threadIdx.x & 31;
  const int64_t kv_stride = static_cast<int64_t>(p.num_kv_heads) * D;
  const int32_t* table = p.block_tables + seq * p.max_blocks;
  // Lane's key u of the tile at `tile_begin`: tile_begin + key_offset(u).
  auto key_offset = [&](int u) { return (u * kDecodeWarps + warp) * KPW + lg; };
  auto tile_at = [](int key, int chunk) { return decode_tile_at<D, MMA>(key, chunk); };
  // Block-table entries of this lane's keys (clamped into the row: entries past the context
  // are read, never used).
  // Keys are numbered in the view (KeyView: every position, or a window with its sinks); only the
  // cache reads map them to positions.
  KeyView view{0, 0, 0};  // the identity until context_range() reads the context
  auto load_blocks = [&](int tile_begin, int (&blocks)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      blocks[u] = __ldg(table + min(static_cast<int64_t>(view.position(tile_begin + key_offset(u)) >> 4),
                                    p.max_blocks - 1));
  };

  // Without a window the split's first keys do not depend on the context: the table entries of
  // its first two tiles load while the previous kernel still runs.
  int blocks0[U], blocks1[U];
  int begin = split * p.split_len, end = 0;
  if (p.window == 0) {
    load_blocks(begin, blocks0);
    load_blocks(begin + TILE, blocks1);
  }
  // Copies this lane's keys and values of the tile at tile_begin into `stage`, as one cp.async
  // group (empty past the end; keys past the end are zero-filled from the pool's start, since
  // the table entry there may be no block).
  // INT8, key by key: lane li copies piece li % (D / 32) of plane li / (D / 32) (K high, K low, V
  // high, V low) of each of its keys' rows, lanes 0 and 1 the K and V scale pair words. Its plane
  // piece and its scales at this KV head's rows of block 0; a block's rows lie block_bytes
  // (block_halves) further on (attention.h kv8_row: (block, head)-major, 16 slots).
  constexpr int kPieces = D / 32;  // 16-byte pieces of a plane row
  const int kv8_plane = li / kPieces;
  const uint8_t* const kv8_source =
      (kv8_plane == 0 ? p.k8.high : kv8_plane == 1 ? p.k8.low : kv8_plane == 2 ? p.v8.high : p.v8.low) +
      static_cast<int64_t>(kv_head) * 16 * (D / 2) + (li % kPieces) * 16;
  const uint16_t* const kv8_scales =
      reinterpret_cast<const uint16_t*>(li == 0 ? p.k8.scales : p.v8.scales) + static_cast<int64_t>(kv_head) * 16;
  const uint32_t kv8_block_bytes = p.num_kv_heads * 16 * (D / 2), kv8_block_halves = p.num_kv_heads * 16;
  const bool kv8_copies = INT8 && !(p.high_only && (kv8_plane & 1));  // a high-nibble pass reads no low plane
  // Where the lane's piece of its key u lands in a stage (under MMA: plane by plane).
  auto kv8_stage_piece = [&](int u) {
    if constexpr (!MMA) return key_offset(u) * 2 * D + li * 16;
    else return kv8_stage_row<D, TILE>(kv8_plane, key_offset(u)) + (li % kPieces) * 16;
  };
  const bool bulk = kBulk && p.window == 0;
  if constexpr (kBulk) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kDecodeStages; ++s) mbarrier_init(&kv8_full[s], 1);
      fence_proxy_async_shared();  // the barriers' initialization, seen by the copy engine
    }
    __syncthreads();  // every warp issues copies that complete on them
  }
  uint32_t kv8_phases = 0;  // bit s: the parity of stage s's next completion
  auto issue_tile = [&](int tile_begin, int stage, const int (&blocks)[U]) {
    if constexpr (kBulk) {
      if (bulk) {
        // Copy c = warp + 4 lane (lanes 0-5 of each warp at 64 keys: the work spread, or the other
        // warps wait at the next barrier for the issuing one): run c / (TILE / 16) (plane 0-3, then
        // the K and V scales) of block m = c % (TILE / 16) (blocks[u] at u = 16 m / STEP is its
        // entry, in every warp). One arrival a phase, warp 0's lane 0: a copy may complete before it
        // (the barrier's tx-count goes below zero, and the phase waits for the arrival).
        constexpr int kBlocks = TILE / 16;
        if (tile_begin >= end) return;
        const int blocks_here = min(kBlocks, (end - tile_begin + 15) / 16);
        const int planes = p.high_only ? 2 : 4, c = warp + kDecodeWarps * lane, run = c / kBlocks, m = c % kBlocks;
        if (threadIdx.x == 0)
          mbarrier_arrive_expect_tx(&kv8_full[stage],
                                    static_cast<uint32_t>(blocks_here * (planes * 16 * (D / 2) + 2 * 32)));
        const int plane = run < 4 && p.high_only ? 2 * run : run;  // a high-nibble pass: K high, V high
        if (m >= blocks_here || run >= planes + 2) return;
        int block = 0;
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (u == 16 * m / STEP) block = blocks[u];
        const int64_t rows = (static_cast<int64_t>(block) * p.num_kv_heads + kv_head) * 16;  // attention.h kv8_row
        if (run < planes) {
          const uint8_t* source = plane == 0 ? p.k8.high : plane == 1 ? p.k8.low : plane == 2 ? p.v8.high : p.v8.low;
          bulk_copy_to_shared(kv8_rows[stage] + kv8_stage_row<D, TILE>(plane, 16 * m), source + rows * (D / 2),
                              16 * (D / 2), &kv8_full[stage]);
        } else {
          const int which = run - planes;
          bulk_copy_to_shared(&kv8_scale_halves[stage][which][16 * m], (which ? p.v8.scales : p.k8.scales) + rows,
                              32, &kv8_full[stage]);
        }
        return;
      }
    }
    if constexpr (INT8) {
      if (tile_begin < end) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int j = tile_begin + key_offset(u), slot = view.position(j) & 15;
          const bool valid = j < end;
          const uint64_t block = static_cast<uint32_t>(blocks[u]);  // a pool block: non-negative
          const uint8_t* source = kv8_source + block * kv8_block_bytes + slot * (D / 2);
          if (kv8_copies)
            cp_async_16(smem_address(kv8_rows[stage] + kv8_stage_piece(u)), valid ? source : kv8_source, valid ? 16 : 0);
          if (li < 2) {
            const uint16_t* pair = kv8_scales + block * kv8_block_halves + (slot & ~1);
            cp_async_4(smem_address(&kv8_scale_pairs[stage][li][key_offset(u)]), valid ? pair : kv8_scales,
                       valid ? 4 : 0);
          }
        }
      }
      cp_async_commit();
      return;
    }
    if (tile_begin < end) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = tile_begin + key_offset(u);
        const int64_t at =
            j < end ? (static_cast<int64_t>(blocks[u]) * 16 + (view.position(j) & 15)) * kv_stride + kv_head * D + li * 8
                    : 0;
        const int bytes = j < end ? 16 : 0;
        cp_async_16(smem_address(k_tiles[stage] + tile_at(key_offset(u), li)), p.k_pool + at, bytes);
        cp_async_16(smem_address(v_tiles[stage] + tile_at(key_offset(u), li)), p.v_pool + at, bytes);
      }
    }
    cp_async_commit();
  };
  auto context_range = [&] {
    view = key_view(p, p.context_lens[seq]);
    if (p.window > 0) {
      load_blocks(begin, blocks0);
      load_blocks(begin + TILE, blocks1);
    }
    end = min(view.visible, begin + p.split_len);
  };
  // RoPE folded in: only this launch writes this step's key (below, from registers), so every
  // key the tiles copy was written by an earlier step, as were the context lengths and tables
  // (the host's, or the chain's input update, which completes before the step's first layer):
  // the first two tiles' copies issue before the wait, while the QKV GEMM drains.
  // The new token's position is the host's (or the input update's) too, so its angles are
  // computed before the wait as well: each pair's once a block, into shared memory.
  const bool rope = p.rope.positions != nullptr;
  int new_key = -1, new_position = -1;  // the new token's key: its number in the view, its position
  if (rope) {
    context_range();
    if (begin < end) {
      issue_tile(begin, 0, blocks0);
      issue_tile(begin + TILE, 1, blocks1);
    }
    new_position = p.rope.positions[seq];
    new_key = view.index(new_position);  // the last position: always in the view
    if (threadIdx.x < D / 2)
      rope_cos_sin(static_cast<float>(new_position), __ldg(p.rope.inv_freq + threadIdx.x), p.rope.attention_scaling,
                   rope_cosine[threadIdx.x], rope_sine[threadIdx.x]);
    if (p.rope.bias != nullptr) {
      // The biases are weights, not the QKV GEMM's output: pulled into L2 before the wait, so that
      // adding them after it (below) costs an L2 hit instead of a DRAM round trip on the step's
      // critical path (the step's weight stream has evicted them since the last layer).
      const int partner_li = li ^ (LPK / 2);
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        if (MMA && g % kDecodeWarps != warp) continue;
        const float* q_bias = p.rope.bias + (head0 + min(g, heads_here - 1)) * D;
        prefetch_l2(q_bias + li * 8);
        prefetch_l2(q_bias + partner_li * 8);
      }
      const float* k_bias = p.rope.bias + static_cast<int64_t>(p.num_heads) * D + kv_head * D;
      prefetch_l2(k_bias + li * 8);
      prefetch_l2(k_bias + partner_li * 8);
      prefetch_l2(k_bias + kv_stride + li * 8);
    }
  }
  pdl_prologue();  // launched with launch_pdl (common.h)
  QSPEC_ATTENTION_STAMP(1);
  // This lane's slice of each query head, pre-scaled into log2 units (loads beside the context's).
  float qr[GM][8];
  // RoPE folded in: the new token's position, this lane's slices of its query heads, key and value
  // (and the slices head_dim / 2 away), unrotated.
  uint4 q_own[GM], q_partner[GM], k_own, k_partner, new_v;
  if (rope) {
    const __half* row = p.q + seq * p.q_stride;
    const int partner_li = li ^ (LPK / 2);
    // The biases of the row's values (bias[i] for row element i), or null.
    auto bias_at = [&](const __half* element) -> const float* {
      return p.rope.bias != nullptr ? p.rope.bias + (element - row) : nullptr;
    };
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      if (MMA && g % kDecodeWarps != warp) continue;  // MMA: warp w rotates heads w, w + 4
      const __half* q_head = row + (head0 + min(g, heads_here - 1)) * D;
      q_own[g] = add_bias_slice(*reinterpret_cast<const uint4*>(q_head + li * 8), bias_at(q_head + li * 8));
      q_partner[g] =
          add_bias_slice(*reinterpret_cast<const uint4*>(q_head + partner_li * 8), bias_at(q_head + partner_li * 8));
    }
    const __half* k_head = row + static_cast<int64_t>(p.num_heads) * D + kv_head * D;
    k_own = add_bias_slice(*reinterpret_cast<const uint4*>(k_head + li * 8), bias_at(k_head + li * 8));
    k_partner = add_bias_slice(*reinterpret_cast<const uint4*>(k_head + partner_li * 8), bias_at(k_head + partner_li * 8));
    new_v = add_bias_slice(*reinterpret_cast<const uint4*>(k_head + kv_stride + li * 8),
                           bias_at(k_head + kv_stride + li * 8));
  } else {
    context_range();
    if constexpr (MMA) {
      if (warp == 0 && lg == 0) {  // the f16 query rows as they are (the scores are scaled instead)
#pragma unroll
        for (int g = 0; g < 8; ++g)
          *reinterpret_cast<uint4*>(&q_heads[g][li * 8]) =
              g < heads_here ? *reinterpret_cast<const uint4*>(p.q + seq * p.q_stride + (head0 + g) * D + li * 8)
                             : make_uint4(0, 0, 0, 0);
      }
    } else {
      load_scaled_query<D, GM>(p, seq, head0, heads_here, li, qr);
    }
  }

  if (begin >= end) {  // nothing to attend to in this split (no copies were issued)
    finish_empty_split<D>(p, seq, split, head0, heads_here);
    return;
  }

  float acc[GM][8];
  start_softmax(running_max, running_sum, acc);

  if (!rope) {
    issue_tile(begin, 0, blocks0);
    issue_tile(begin + TILE, 1, blocks1);
  }
  if (begin + 2 * TILE < end) load_blocks(begin + 2 * TILE, blocks0);  // the table entries of tile 2

  // RoPE folded in, while the first tiles' copies fly: the new key's slot in them is stale (the
  // cache gets the key below), and the thread that copied it overwrites its own copy once the
  // tile is in (only that thread reads it back, so no barrier). Each pair's angle once a block.
  uint4 new_k = make_uint4(0, 0, 0, 0);
  Kv8Chunk new_k8{0u, 0u}, new_v8{0u, 0u};  // INT8: the new row's chunks as the cache holds them, and scales
  float new_k_scale = 0.0f, new_v_scale = 0.0f;
  if (rope) {
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
    for (int g = 0; g < 8; ++g) {
      if constexpr (MMA) {
        // Warp w's first key lanes store heads w, w + 4 (through f16, as rope_kv_write stores q);
        // rows past heads_here are zeros.
        if (g % kDecodeWarps != warp || lg != 0) continue;
        uint4 rotated = make_uint4(0, 0, 0, 0);
        if (g < GM && g < heads_here) {
          const int own = min(g, GM - 1);
          rotated = rope_slice<D>(q_own[own], q_partner[own], li, cosine, sine);
        }
        *reinterpret_cast<uint4*>(&q_heads[g][li * 8]) = rotated;
      } else if (g < GM) {
        // Through f16, as rope_kv_write stores q and load_scaled_query reads it.
        scale_query(rope_slice<D>(q_own[g], q_partner[g], li, cosine, sine), g < heads_here, p.scale_log2, qr[g]);
      }
    }
    if (holds_new_key) {
      new_k = rope_slice<D>(k_own, k_partner, li, cosine, sine);
      // The cache gets it from one block of the head chunks (warp 0's first key lanes, a slice each).
      const bool writer = chunk_of_heads == 0 && warp == 0 && lg == 0;
      if constexpr (INT8) {  // every lane group quantizes (the row's amax), the writer stores
        const int64_t row = kv8_row(p.block_tables[seq * p.max_blocks + new_position / 16], kv_head,
                                    new_position % 16, p.num_kv_heads);
        new_k8 = kv8_quantize_store<D>(new_k, writer, p.k8, row, li, new_k_scale);
        new_v8 = kv8_quantize_store<D>(new_v, writer, p.v8, row, li, new_v_scale);
      } else if (writer) {
        const int64_t at = kv_pool_row(p.block_tables, p.max_blocks, seq, new_position) * kv_stride + kv_head * D + li * 8;
        *reinterpret_cast<uint4*>(p.k_pool + at) = new_k;
        *reinterpret_cast<uint4*>(p.v_pool + at) = new_v;
      }
    } else {
      new_key = -1;  // not in this split's tiles
    }
  }
  // MMA: each tile's scores come from warps 0 .. TILE / 16 - 1, a 16-key mma row tile each against
  // the 8 query-head columns; P V from every warp, D / 4 dimensions each (16-dim row tiles of
  // V^T against P^T), with P split into an f16 pair (hi + lo), so the weights keep ~22 bits.
  constexpr int kSteps = MMA ? D / 16 : 1;      // mma k steps over head_dim
  constexpr int kScoreWarps = TILE / 16;
  constexpr int kPvTiles = MMA ? D / 64 : 1;    // 16-dim row tiles a warp in P V
  const int group_id = lane >> 2, in_group = lane & 3;  // an mma fragment's row, column pair
  uint32_t q_frag[kSteps][2];  // the scores' B fragments: Q^T (dims x heads)
  float pv[kPvTiles][4] = {};     // (dims x heads) accumulators of P's f16 part
  float pv_lo[kPvTiles][4] = {};  // and of its residual (a second chain, summed at the end)
  if constexpr (MMA) {
    __syncthreads();  // q_heads
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      // INT8: k step ks holds pairs 2 (ks % 2) and 2 (ks % 2) + 1 of the plane word the lane's A
      // fragments take (kv8_score_word), elements 4 (ks % 2) .. + 3 of its 8.
      const int k0 = INT8 ? kv8_score_word<D>(in_group, ks / 2) * 8 + 4 * (ks % 2) : ks * 16 + 2 * in_group;
      const int k1 = INT8 ? k0 + 2 : k0 + 8;
      q_frag[ks][0] = *reinterpret_cast<const uint32_t*>(&q_heads[group_id][k0]);
      q_frag[ks][1] = *reinterpret_cast<const uint32_t*>(&q_heads[group_id][k1]);
    }
  }
  QSPEC_ATTENTION_STAMP(2);
  for (int tile_begin = begin, stage = 0; tile_begin < end; tile_begin += TILE, stage ^= 1) {
    // 1. This tile's copies are in (every group but the newest, the next tile's, is complete; with
    // bulk copies, the stage's barrier phase).
    if (kBulk && bulk) {
      mbarrier_wait(&kv8_full[stage], (kv8_phases >> stage) & 1u);
      kv8_phases ^= 1u << stage;
    } else {
      cp_async_wait<1>();
    }
    const __half* k_tile = k_tiles[INT8 ? 0 : stage];
    const __half* v_tile = v_tiles[INT8 ? 0 : stage];
    float kv8_key_scale[U] = {};  // INT8 without MMA: this lane's keys' K scales
    // INT8 under MMA: the f16 K (which 0) or V (1) scale of the tile's key k: the new row's (its
    // copy is stale), zero past the split (V is code * scale, and a P weight of 0 must meet a
    // finite value: a bulk copy brings a block's slots past the context too), else the copy's.
    auto tile_scale = [&](int which, int k) -> __half {
      const int j = tile_begin + k;
      if (j == new_key) return __float2half_rn(which ? new_v_scale : new_k_scale);
      if (j >= end) return __ushort_as_half(0);
      if (kBulk && bulk) return kv8_scale_halves[stage][which][k];
      return kv8_scale_of(kv8_scale_pairs[stage][which][k], view.position(j));
    };
    auto key_scale = [&](int k) { return __half2float(tile_scale(0, k)); };
    // kv8_value_scales holds key k's at kv8_value_scale_at(k): keys k and k + 4 side by side.
    auto kv8_value_scale_at = [](int k) { return (k & ~7) + 2 * (k & 3) + ((k >> 2) & 1); };
    auto pair_scale = [&](int k) { return *reinterpret_cast<const uint32_t*>(&kv8_value_scales[kv8_value_scale_at(k)]); };
    if constexpr (INT8 && MMA) {
      if (!bulk) __syncthreads();  // the fragments take words that other lanes copied
      if (static_cast<unsigned>(new_key - tile_begin) < static_cast<unsigned>(TILE)) {  // RoPE folded in
        // The new row's words over its stale copy (the writers' own wait above saw it land).
        const int k = new_key - tile_begin;
        if (warp == 0 && lg == 0) {  // lane li holds word li of each plane row
          auto put = [&](int plane, uint32_t word) {
            *reinterpret_cast<uint32_t*>(kv8_rows[stage] + kv8_stage_row<D, TILE>(plane, k) + li * 4) = word;
          };
          put(0, new_k8.high);
          put(1, new_k8.low);
          put(2, new_v8.high);
          put(3, new_v8.low);
          if (bulk) fence_proxy_async_shared();  // these writes before a later bulk copy into the stage
        }
        __syncthreads();
      }
      if (threadIdx.x < TILE)  // read by P V, two barriers on
        kv8_value_scales[kv8_value_scale_at(threadIdx.x)] = tile_scale(1, threadIdx.x);
    } else if constexpr (INT8) {
      __syncthreads();  // a lane converts bytes that other lanes copied
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = key_offset(u), j = tile_begin + k;
        Kv8Chunk key = new_k8, value = new_v8;
        __half k_scale = __float2half_rn(new_k_scale), v_scale = __float2half_rn(new_v_scale);
        if (j != new_key) {  // the cache's row; the new key's (stale there) comes from registers
          const uint8_t* bytes = kv8_rows[stage] + k * 2 * D + li * 4;
          key.high = *reinterpret_cast<const uint32_t*>(bytes);
          key.low = p.high_only ? 0u : *reinterpret_cast<const uint32_t*>(bytes + D / 2);
          value.high = *reinterpret_cast<const uint32_t*>(bytes + D);
          value.low = p.high_only ? 0u : *reinterpret_cast<const uint32_t*>(bytes + 3 * D / 2);
          const int position = view.position(j);  // its parity picks the half of the slot pair's word
          k_scale = kv8_scale_of(kv8_scale_pairs[stage][0][k], position);
          v_scale = kv8_scale_of(kv8_scale_pairs[stage][1][k], position);
        }
        *reinterpret_cast<uint4*>(k_tiles[0] + tile_at(k, li)) = kv8_chunk_to_half(key, p.high_only);
        *reinterpret_cast<uint4*>(v_tiles[0] + tile_at(k, li)) =
            kv8_scale_half8(kv8_chunk_to_half(value, p.high_only), v_scale);
        kv8_key_scale[u] = __half2float(k_scale);
      }
    } else if (static_cast<unsigned>(new_key - tile_begin) < static_cast<unsigned>(TILE)) {  // RoPE folded in
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (tile_begin + key_offset(u) == new_key) {
          *reinterpret_cast<uint4*>(k_tiles[stage] + tile_at(key_offset(u), li)) = new_k;
          *reinterpret_cast<uint4*>(v_tiles[stage] + tile_at(key_offset(u), li)) = new_v;
        }
    }
    // 2. Scores.
    if constexpr (MMA && INT8) {
      if (warp < kScoreWarps) {
        if (p.high_only)
          mma_tile_scores_int8<D, GM, TILE, true>(kv8_rows[stage], warp * 16, q_frag, p.scale_log2, logits, key_scale);
        else
          mma_tile_scores_int8<D, GM, TILE, false>(kv8_rows[stage], warp * 16, q_frag, p.scale_log2, logits, key_scale);
      }
    } else if constexpr (MMA) {
      __syncthreads();  // every thread's copies (ldmatrix reads rows other threads copied)
      if (warp < kScoreWarps) mma_tile_scores<D, GM, TILE>(k_tile, warp * 16, q_frag, p.scale_log2, logits);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = tile_begin + key_offset(u);
        score_key<D, GM>(qr, *reinterpret_cast<const uint4*>(k_tile + tile_at(key_offset(u), li)), li, j < end, logits,
                         j - tile_begin, INT8 ? kv8_key_scale[u] : 1.0f);
      }
    }
    __syncthreads();
    // 3. Softmax statistics per head.
    update_softmax(logits, min(end - tile_begin, TILE), heads_here, running_max, running_sum, rescale);
    __syncthreads();
    // 4. acc = acc * alpha + P V over this tile.
    if constexpr (MMA && INT8) {
      if (p.high_only)
        mma_tile_pv_int8<D, GM, TILE, true>(kv8_rows[stage], logits, min(end - tile_begin, TILE), heads_here, rescale,
                                            pv, pv_lo, pair_scale);
      else
        mma_tile_pv_int8<D, GM, TILE, false>(kv8_rows[stage], logits, min(end - tile_begin, TILE), heads_here, rescale,
                                             pv, pv_lo, pair_scale);
    } else if constexpr (MMA) {
      mma_tile_pv<D, GM, TILE>(v_tile, logits, min(end - tile_begin, TILE), heads_here, rescale, pv, pv_lo);
    } else {
      rescale_accumulators(acc, rescale, heads_here);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = tile_begin + key_offset(u);
        if (j < end)
          accumulate_value(acc, *reinterpret_cast<const uint4*>(v_tile + tile_at(key_offset(u), li)), logits,
                           j - tile_begin, heads_here);
      }
    }
    __syncthreads();  // logits are rewritten by the next tile
    // 5. The tile after next into the stage just read (each thread overwrites only its own
    // copies, read above; the barrier also keeps the compiler from moving those reads past
    // the copies), then the table entries of the one after it.
    issue_tile(tile_begin + 2 * TILE, stage, blocks0);
    if (tile_begin + 3 * TILE < end) load_blocks(tile_begin + 3 * TILE, blocks0);
    QSPEC_ATTENTION_STAMP_TILE();
  }
  cp_async_wait<0>();  // no copy outlives the block (the last groups are empty)

  if constexpr (MMA) {
#pragma unroll
    for (int mt = 0; mt < kPvTiles; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) pv[mt][c] += pv_lo[mt][c];
    QSPEC_ATTENTION_STAMP(5);
    finish_split_mma<D, INT8>(p, pv, running_max, running_sum, seq, split, head0, heads_here);
    QSPEC_ATTENTION_STAMP(6);  // after the arrival (and, in the last block, the merge)
#ifdef QSPEC_ATTENTION_STAMPS
    if (threadIdx.x == 0 && stamp_launch - QSPEC_ATTENTION_STAMPS < 4u)
      printf("attention-stamps launch %u block %d %d %d: entry %llu wait %llu rope %llu tile1 %llu tile2 %llu "
             "stores %llu end %llu tiles %d\n",
             stamp_launch, blockIdx.x, blockIdx.y, blockIdx.z, stamps[0], stamps[1], stamps[2], stamps[3],
             stamps[4], stamps[5], stamps[6], stamp_tile - 3);
    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
      atomicAdd(&g_attention_stamp_launch, 1u);
#endif
  } else {
    finish_split<D, GM>(p, acc, reduce, running_max, running_sum, seq, split, head0, heads_here);
  }
}

}  // namespace qspec::cuda::kernels
