// Paged attention for decode (one query per sequence), flash-decoding style: a block owns one
// KV head, up to GM of its query heads, one sequence and one split of the context; K and V
// are read once per block with 16-byte loads, scores and softmax in f32 (log2 domain).
#pragma once
#include "ops/cuda/attention.h"
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/attention_combine.cuh"

namespace qspec::cuda::kernels {

// RoPE and the new token's K/V store folded into the decode attention (the tiles kernel only;
// positions null: q arrives rotated and the cache holds the new K/V). q then points at unrotated
// qkv rows (q heads, k heads, v heads); sequence s's token sits at positions[s] ==
// context_lens[s] - 1, and its rotated key and its value go into k_pool / v_pool there.
struct DecodeRope {
  const int32_t* positions;
  const float* inv_freq;  // [head_dim / 2]
  float attention_scaling;
  // The q/k/v biases (QkvPrologue::bias, attention.h), added to the unrotated row as
  // rope_kv_write adds them; null: none.
  const float* bias;
};

struct DecodeParams {
  const __half* q;
  int64_t q_stride;
  const int32_t* context_lens;
  __half* k_pool;  // written only with rope folded in, at the new token's slot
  __half* v_pool;
  const int32_t* block_tables;
  int64_t max_blocks;
  int num_seqs, num_heads, num_kv_heads, group, head_chunks;
  int window;          // 0: off
  int sinks;           // with a window: the first `sinks` positions stay visible too (KeyView)
  float scale_log2;    // log2(e) times the shape's scale (1 / sqrt(head_dim) unless set: detail::attention_scale_log2)
  int split_len;       // keys per split (multiple of 16)
  int splits;
  __half* out;
  int64_t out_stride;
  float* part_o;       // splits > 1: [splits][num_seqs * num_heads][D]
  float2* part_ml;     // splits > 1: [splits][num_seqs * num_heads]
  unsigned* counters;  // splits > 1: one per (sequence, blockIdx.x), zero before and after a launch
  DecodeRope rope;
  // An int8 cache (the tiles kernel's INT8 instances; attention.h Kv8Planes): its K and V planes
  // and scales (k_pool / v_pool unused), and whether this pass reads the high nibbles only.
  Kv8Planes k8, v8;
  bool high_only;
};

inline constexpr int kDecodeWarps = 4;

// The keys a decode query sees, numbered 0 .. visible - 1 in position order: every cached
// position, or with a window the first `sinks` positions (attention sinks) and the last `window`
// (a sliding window alone when sinks is 0; a QSpec draft's sparse view of the shared cache with
// both, StreamingLLM style). Key v of the view sits at cache position position(v); the kernels
// split, tile and mask in view numbers, and only the cache reads map them.
struct KeyView {
  int visible, sinks, shift;
  __device__ __forceinline__ int position(int v) const { return v < sinks ? v : v + shift; }
  // The view number of a visible position.
  __device__ __forceinline__ int index(int position) const { return position < sinks ? position : position - shift; }
};
__device__ __forceinline__ KeyView key_view(const DecodeParams& p, int context) {
  if (p.window <= 0) return KeyView{context, 0, 0};
  const int shift = max(0, context - p.window - p.sinks);
  return KeyView{context - shift, shift > 0 ? p.sinks : 0, shift};
}

// Split-K: after a block wrote its partials, the last of the `splits` blocks of its (sequence,
// head group) to arrive merges them into out (the split-K GEMM's fix-up, here for attention): one
// launch and one dependent round trip fewer a layer than a combine kernel after.
template <int D>
__device__ __forceinline__ void merge_splits(const DecodeParams& p, int seq, int head0, int heads_here) {
  if (p.splits <= 1) return;
  unsigned* counter = p.counters + static_cast<int64_t>(seq) * gridDim.x + blockIdx.x;
  if (!last_to_arrive(counter, static_cast<unsigned>(p.splits))) return;
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;
  for (int g = threadIdx.x >> 5; g < heads_here; g += kDecodeWarps) {  // a warp a head
    const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head0 + g;
    combine_attention_row<D>(p.part_o, p.part_ml, p.splits, rows, row, p.out + seq * p.out_stride + (head0 + g) * D);
  }
}
inline constexpr int kDecodeChunk = 256;  // keys scored per pass through shared memory

// A lane's 8 query elements pre-scaled into log2 units, or zeros for a head past the block's.
__device__ __forceinline__ void scale_query(const uint4& q, bool head_here, float scale_log2, float (&qr)[8]) {
  half8_to_float(q, qr);
#pragma unroll
  for (int e = 0; e < 8; ++e) qr[e] = head_here ? qr[e] * scale_log2 : 0.0f;
}

// This lane's slice of each query head the block owns (lanes li of a key hold elements
// li * 8 .. + 7), pre-scaled into log2 units; zeros for heads past heads_here.
template <int D, int GM>
__device__ __forceinline__ void load_scaled_query(const DecodeParams& p, int seq, int head0, int heads_here, int li,
                                                  float (&qr)[GM][8]) {
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    const uint4 q = g < heads_here
                        ? *reinterpret_cast<const uint4*>(p.q + seq * p.q_stride + (head0 + g) * D + li * 8)
                        : make_uint4(0, 0, 0, 0);
    scale_query(q, g < heads_here, p.scale_log2, qr[g]);
  }
}

// Who a decode block and thread are: the warp, the lane's key (lg: its key of the warp's step;
// li: its 16-byte slice of the key), the block's KV head, its chunk of the group's query heads
// (head0 .. head0 + heads_here - 1), sequence and split of the context.
struct DecodeThread {
  int warp, lg, li, kv_head, chunk_of_heads, seq, split, head0, heads_here;
};
template <int D, int GM>
__device__ __forceinline__ DecodeThread decode_thread(const DecodeParams& p) {
  constexpr int LPK = D / 8;  // lanes per key
  const int lane = threadIdx.x & 31;
  const int kv_head = blockIdx.x / p.head_chunks, chunk_of_heads = blockIdx.x % p.head_chunks;
  return DecodeThread{static_cast<int>(threadIdx.x >> 5), lane / LPK, lane % LPK, kv_head, chunk_of_heads,
                      static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z), kv_head * p.group + chunk_of_heads * GM,
                      min(GM, p.group - chunk_of_heads * GM)};
}

// Each query head's score against one key in f32 FMAs: this lane's 8 elements, summed over the
// key's LPK lanes; the key's first lane stores it at logits[g][index] when `store`.
// key_scale: an int8 cache's K scale (key holds codes), 1 for an f16 cache.
template <int D, int GM, int N>
__device__ __forceinline__ void score_key(const float (&qr)[GM][8], const uint4& key, int li, bool store,
                                          float (&logits)[GM][N], int index, float key_scale = 1.0f) {
  constexpr int LPK = D / 8;
  float kf[8];
  half8_to_float(key, kf);
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) dot = fmaf(qr[g][e], kf[e], dot);
#pragma unroll
    for (int offset = LPK / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (li == 0 && store) logits[g][index] = dot * key_scale;
  }
}

// The f32 P V of one value row (this lane's 8 elements): acc[g] += logits[g][index] x value.
template <int GM, int N>
__device__ __forceinline__ void accumulate_value(float (&acc)[GM][8], const uint4& value, const float (&logits)[GM][N],
                                                 int index, int heads_here) {
  float vf[8];
  half8_to_float(value, vf);
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    const float weight = g < heads_here ? logits[g][index] : 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(weight, vf[e], acc[g][e]);
  }
}
// A block's running softmax (max, sum per head, in shared memory) and this lane's accumulators,
// before the first key.
template <int GM>
__device__ __forceinline__ void start_softmax(float* running_max, float* running_sum, float (&acc)[GM][8]) {
  if (threadIdx.x < GM) {
    running_max[threadIdx.x] = -INFINITY;
    running_sum[threadIdx.x] = 0.0f;
  }
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
}
// acc[g] *= the softmax's rescale factor of head g (0 past heads_here).
template <int GM>
__device__ __forceinline__ void rescale_accumulators(float (&acc)[GM][8], const float* rescale, int heads_here) {
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    const float alpha = g < heads_here ? rescale[g] : 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
  }
}

// Online softmax over the next n scores of each head (logits[g][0 .. n), n >= 1; warp w owns
// heads w, w + kDecodeWarps, ...): the scores become their weights exp2(score - new max), and
// each head's running max and sum move on, with rescale[g] the factor for the accumulators
// (0 on the first pass). Between two block barriers.
template <int GM, int N>
__device__ __forceinline__ void update_softmax(float (&logits)[GM][N], int n, int heads_here, float* running_max,
                                               float* running_sum, float* rescale) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int g = warp; g < heads_here; g += kDecodeWarps) {
    float pass_max = -INFINITY;
    for (int i = lane; i < n; i += 32) pass_max = fmaxf(pass_max, logits[g][i]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      pass_max = fmaxf(pass_max, __shfl_xor_sync(0xffffffffu, pass_max, offset));
    const float old_max = running_max[g];
    const float new_max = fmaxf(old_max, pass_max);  // finite: the pass has keys
    float sum = 0.0f;
    for (int i = lane; i < n; i += 32) {
      const float e = exp2f(logits[g][i] - new_max);
      logits[g][i] = e;
      sum += e;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      const float alpha = exp2f(old_max - new_max);  // 0 on the first pass
      rescale[g] = alpha;
      running_sum[g] = running_sum[g] * alpha + sum;
      running_max[g] = new_max;
    }
  }
}

// A split with no keys (past the context, or a window's start): empty partials (zeros when the
// context is not split), then the merge.
template <int D>
__device__ __forceinline__ void finish_empty_split(const DecodeParams& p, int seq, int split, int head0,
                                                   int heads_here) {
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;
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
}

// A block's result: each warp's key lanes summed, then the warps through `reduce` in shared
// memory, written as this split's partials with its (max, sum), or normalised into out when the
// context is not split; then the merge.
template <int D, int GM>
__device__ __forceinline__ void finish_split(const DecodeParams& p, float (&acc)[GM][8],
                                             float (&reduce)[kDecodeWarps][GM][D], const float* running_max,
                                             const float* running_sum, int seq, int split, int head0,
                                             int heads_here) {
  constexpr int LPK = D / 8;  // lanes per key
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lg = lane / LPK, li = lane % LPK;
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
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;
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

// D: head_dim (32, 64, 128, 256: a warp a key there); GM: query heads per block (1, 2, 4, 8).
template <int D, int GM>
__global__ __launch_bounds__(kDecodeWarps * 32) void paged_attention_decode_kernel(const DecodeParams p) {
  pdl_prologue();  // launched with launch_pdl (common.h)
  constexpr int LPK = D / 8;     // lanes per key (16 bytes each)
  constexpr int KPW = 32 / LPK;  // keys per warp per step
  constexpr int STEP = kDecodeWarps * KPW;
  constexpr int U = 4;           // steps in flight
  __shared__ float logits[GM][kDecodeChunk];
  __shared__ float reduce[kDecodeWarps][GM][D];
  __shared__ float running_max[GM], running_sum[GM], rescale[GM];

  const DecodeThread t = decode_thread<D, GM>(p);  // plain copies: lambdas below capture them
  const int warp = t.warp, lg = t.lg, li = t.li, kv_head = t.kv_head;
  const int seq = t.seq, split = t.split, head0 = t.head0, heads_here = t.heads_here;
  const KeyView view = key_view(p, p.context_lens[seq]);
  const int begin = split * p.split_len;
  const int end = min(view.visible, begin + p.split_len);
  const int64_t kv_stride = static_cast<int64_t>(p.num_kv_heads) * D;
  const int32_t* table = p.block_tables + seq * p.max_blocks;

  if (begin >= end) {  // nothing to attend to in this split
    finish_empty_split<D>(p, seq, split, head0, heads_here);
    return;
  }
  // visit(row, j) for this lane's rows of keys (or values) j of the chunk, U loads in flight at
  // a time (zeros past chunk_end).
  auto for_each_row = [&](const __half* pool, int chunk_begin, int chunk_end, auto&& visit) {
    for (int base = chunk_begin; base < chunk_end; base += STEP * U) {
      uint4 rows[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = base + (u * kDecodeWarps + warp) * KPW + lg;
        rows[u] = make_uint4(0, 0, 0, 0);
        if (j < chunk_end) {
          const int at = view.position(j);
          const int64_t slot = static_cast<int64_t>(table[at >> 4]) * 16 + (at & 15);
          rows[u] = *reinterpret_cast<const uint4*>(pool + slot * kv_stride + kv_head * D + li * 8);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) visit(rows[u], base + (u * kDecodeWarps + warp) * KPW + lg);
    }
  };

  // This lane's slice of each query head, pre-scaled into log2 units.
  float qr[GM][8];
  load_scaled_query<D, GM>(p, seq, head0, heads_here, li, qr);
  float acc[GM][8];
  start_softmax(running_max, running_sum, acc);

  for (int chunk_begin = begin; chunk_begin < end; chunk_begin += kDecodeChunk) {
    const int chunk_end = min(end, chunk_begin + kDecodeChunk);
    // 1. scores of this chunk's keys.
    for_each_row(p.k_pool, chunk_begin, chunk_end, [&](const uint4& key, int j) {
      score_key<D, GM>(qr, key, li, j < chunk_end, logits, j - chunk_begin);
    });
    __syncthreads();
    // 2. softmax statistics per head.
    update_softmax(logits, chunk_end - chunk_begin, heads_here, running_max, running_sum, rescale);
    __syncthreads();
    // 3. acc = acc * alpha + P V over this chunk.
    rescale_accumulators(acc, rescale, heads_here);
    for_each_row(p.v_pool, chunk_begin, chunk_end, [&](const uint4& value, int j) {
      if (j < chunk_end) accumulate_value(acc, value, logits, j - chunk_begin, heads_here);
    });
    __syncthreads();  // logits are rewritten by the next chunk
  }

  finish_split<D, GM>(p, acc, reduce, running_max, running_sum, seq, split, head0, heads_here);
}

}  // namespace qspec::cuda::kernels
