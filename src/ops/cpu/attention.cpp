// Causal grouped-query attention on the CPU over paged or contiguous K/V rows: f32 rows, or the
// 8-bit cache's rows dequantized a chunk of keys at a time into the same f32 loops.
#include "ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "ops/quantized_linear.h"
#include "qspec/error.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace qspec::cpu {
namespace {
// Keys scored kKeys at a time: each key's dot product is eight partial sums, lane l summing
// elements l, l + 8, ... by FMA, then summed in a fixed tree; the keys' chains are independent,
// so kKeys of them keep the FMA units busy where one key's chain of head_dim / 8 FMAs would wait
// on each. The arithmetic is that of the one-key loop this replaced, as GCC compiled it (it
// contracts a * b + c into an FMA), so the logits did not move.
constexpr int64_t kKeys = 4;

inline float reduce(const float partial[8]) {
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

// Portable: the reference of the SIMD versions below, lane for lane.
template <int64_t K>
inline void dots_portable(const float* a, const float* const* keys, int64_t n, float* out) {
  float partial[K][8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int64_t key = 0; key < K; ++key)
      for (int lane = 0; lane < 8; ++lane) partial[key][lane] = std::fma(a[i + lane], keys[key][i + lane], partial[key][lane]);
  for (int64_t key = 0; key < K; ++key) {
    float sum = reduce(partial[key]);
    for (int64_t j = i; j < n; ++j) sum = std::fma(a[j], keys[key][j], sum);
    out[key] = sum;
  }
}

// The weighted sum of the value rows, kValueLanes dimensions at a time held in registers across
// every key (a loop over `out` in memory waited on its own store each key), each dimension the
// same FMA chain over the keys in position order.
constexpr int64_t kValueLanes = 32;

// `accumulate`: continue the chains from out (the int8 path sums its keys chunk by chunk; a
// value stored and loaded again is the same float, so the chains are the one-pass ones).
template <int64_t W>
inline void weighted_values_portable(const float* weights, const float* const* values, int64_t count, int64_t d0,
                                     float* out, bool accumulate) {
  float acc[W] = {};
  if (accumulate)
    for (int64_t j = 0; j < W; ++j) acc[j] = out[d0 + j];
  for (int64_t i = 0; i < count; ++i) {
    const float* value = values[i] + d0;
    for (int64_t j = 0; j < W; ++j) acc[j] = std::fma(weights[i], value[j], acc[j]);
  }
  for (int64_t j = 0; j < W; ++j) out[d0 + j] = acc[j];
}

#if defined(__AVX2__) && defined(__FMA__)
template <int64_t K>
inline void dots(const float* a, const float* const* keys, int64_t n, float* out) {
  if (n % 8 != 0) return dots_portable<K>(a, keys, n, out);
  __m256 acc[K];
  for (int64_t key = 0; key < K; ++key) acc[key] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    for (int64_t key = 0; key < K; ++key) acc[key] = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[key] + i), acc[key]);
  }
  for (int64_t key = 0; key < K; ++key) {
    float partial[8];
    _mm256_storeu_ps(partial, acc[key]);
    out[key] = reduce(partial);
  }
}

template <int64_t W>
inline void weighted_values(const float* weights, const float* const* values, int64_t count, int64_t d0, float* out,
                            bool accumulate) {
  if constexpr (W % 8 != 0) {
    return weighted_values_portable<W>(weights, values, count, d0, out, accumulate);
  } else {
    __m256 acc[W / 8];
    for (int64_t j = 0; j < W / 8; ++j) acc[j] = accumulate ? _mm256_loadu_ps(out + d0 + 8 * j) : _mm256_setzero_ps();
    for (int64_t i = 0; i < count; ++i) {
      const __m256 weight = _mm256_broadcast_ss(weights + i);
      const float* value = values[i] + d0;
      for (int64_t j = 0; j < W / 8; ++j) acc[j] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * j), acc[j]);
    }
    for (int64_t j = 0; j < W / 8; ++j) _mm256_storeu_ps(out + d0 + 8 * j, acc[j]);
  }
}
#endif

// The SIMD loops where the build has them and the kernel choice (ops/quantized_linear.h
// kernel_isa) is not the portable set, else the portable ones: the same bits either way.
template <int64_t K>
inline void score_keys(bool simd, const float* a, const float* const* keys, int64_t n, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  if (simd) return dots<K>(a, keys, n, out);
#endif
  dots_portable<K>(a, keys, n, out);
}

template <int64_t W>
inline void sum_values(bool simd, const float* weights, const float* const* values, int64_t count, int64_t d0,
                       float* out, bool accumulate) {
#if defined(__AVX2__) && defined(__FMA__)
  if (simd) return weighted_values<W>(weights, values, count, d0, out, accumulate);
#endif
  weighted_values_portable<W>(weights, values, count, d0, out, accumulate);
}

// Scores of `count` keys (their head rows) against one query, kKeys at a time.
inline void score_all(bool simd, const float* query, const float* const* keys, int64_t count, int64_t head_dim,
                      float* scores) {
  int64_t i = 0;
  for (; i + kKeys <= count; i += kKeys) score_keys<kKeys>(simd, query, keys + i, head_dim, scores + i);
  for (; i < count; ++i) score_keys<1>(simd, query, keys + i, head_dim, scores + i);
}

// out [head_dim] = the weights' sum of `count` value rows (continuing out's sums: accumulate).
inline void sum_all(bool simd, const float* weights, const float* const* values, int64_t count, int64_t head_dim,
                    float* out, bool accumulate) {
  int64_t d0 = 0;
  for (; d0 + kValueLanes <= head_dim; d0 += kValueLanes)
    sum_values<kValueLanes>(simd, weights, values, count, d0, out, accumulate);
  for (; d0 + 8 <= head_dim; d0 += 8) sum_values<8>(simd, weights, values, count, d0, out, accumulate);
  for (; d0 < head_dim; ++d0) sum_values<1>(simd, weights, values, count, d0, out, accumulate);
}

// Scaled scores -> each key's softmax weight, in place.
inline void softmax_weights(std::vector<float>& scores, float scale) {
  float max_score = -INFINITY;
  for (float& score : scores) {
    score *= scale;
    max_score = std::max(max_score, score);
  }
  float denominator = 0.0f;
  for (float& score : scores) {
    score = std::exp(score - max_score);
    denominator += score;
  }
  for (float& score : scores) score /= denominator;
}

// The cache rows a token at position `last` sees, in position order: the sinks 0 .. sinks - 1,
// then first .. last. Walked block by block: PagedKv::row's division a key cost more than its
// dot product.
void visible_rows(const PagedKv& kv, const AttentionShape& shape, int64_t last, std::vector<int64_t>& rows) {
  const int64_t first = shape.sliding_window > 0 ? std::max<int64_t>(0, last - shape.sliding_window + 1) : 0;
  const int64_t sinks = std::min(shape.sliding_window > 0 ? shape.sink_tokens : 0, first);
  rows.clear();
  auto add_rows = [&](int64_t from, int64_t to) {  // positions from..to - 1
    if (from >= to) return;
    int64_t block = from / kv.block_size, offset = from % kv.block_size;
    for (int64_t p = from; p < to; ++p) {
      rows.push_back(static_cast<int64_t>(kv.block_table[block]) * kv.block_size + offset);
      if (++offset == kv.block_size) {
        offset = 0;
        ++block;
      }
    }
  };
  add_rows(0, sinks);
  add_rows(first, last + 1);
}

// Rows a chunk: 64 rows of a head stay in L1 (the int8 cache dequantizes them into f32 a chunk at
// a time).
constexpr int64_t kChunkRows = 64;

// Query tokens a work item takes together without a window: each sees a prefix of the same rows
// (positions 0 .. its own), so a chunk of rows in L1 serves all of their heads (a prefill reads a
// KV head's rows once for 8 tokens). The most (8, 4, 2) whose items still give every thread one;
// with a window each token sees rows of its own: one a work item.
constexpr int64_t kAttentionTokenBlock = 8;
int64_t attention_token_block(const AttentionShape& shape, int64_t tokens) {
  if (shape.sliding_window > 0) return 1;
  const int64_t threads = static_cast<int64_t>(ThreadPool::global().size());
  for (int64_t block = kAttentionTokenBlock; block > 1; block /= 2)
    if ((tokens + block - 1) / block * shape.num_kv_heads >= threads) return block;
  return 1;
}

// One work item per (block of tokens, KV head): each chunk of kChunkRows key rows is scored
// against every query head of the group for every token of the block that sees it, and each chunk
// of value rows summed into those heads' outputs, so the item reads (the int8 cache: dequantizes)
// a KV head's rows once. The per-head loop (attention below) read an f32 cache's rows once per
// query head and token (SmolLM2: 3 query heads a KV head). Each head's arithmetic is the per-head
// loop's in the same order (chunks of a multiple of kKeys keys; sum_all continues its chains
// across chunks), so the two give the same bits, and the int8 cache's are the f32 loop's over its
// dequantized rows (kv8_read_head in the pass's view).
template <bool kInt8>
void attention_grouped(const float* q, int64_t tokens, const int32_t* positions, const PagedKv& kv,
                       const AttentionShape& shape, float* out) {
  static_assert(kChunkRows % kKeys == 0, "chunks keep score_all's groups of kKeys keys");
  const int64_t head_dim = shape.head_dim, kv_heads = shape.num_kv_heads;
  const int64_t group = shape.num_heads / kv_heads;
  const int64_t kv_stride = kv_heads * head_dim;
  const int64_t token_block = attention_token_block(shape, tokens);
  const int64_t blocks = (tokens + token_block - 1) / token_block;
  const float scale = shape.scale > 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const bool simd = kernel_isa() != KernelIsa::portable;
  ThreadPool::global().parallel_for(static_cast<size_t>(blocks * kv_heads), 1, [&](size_t begin, size_t end) {
    // Kept by each thread across calls: no allocation per pass once grown.
    thread_local std::vector<float> chunk;  // int8: a chunk's rows dequantized
    thread_local std::vector<const float*> heads;
    thread_local std::vector<int64_t> rows;
    thread_local std::vector<std::vector<float>> scores;  // [token of the block][head of the group]
    heads.resize(static_cast<size_t>(kChunkRows));
    if (scores.size() < static_cast<size_t>(token_block * group)) scores.resize(static_cast<size_t>(token_block * group));
    if constexpr (kInt8) {
      chunk.resize(static_cast<size_t>(kChunkRows * head_dim));
      for (int64_t i = 0; i < kChunkRows; ++i) heads[static_cast<size_t>(i)] = chunk.data() + i * head_dim;
    }
    for (size_t item = begin; item < end; ++item) {
      const int64_t t0 = static_cast<int64_t>(item) / kv_heads * token_block;
      const int64_t kv_head = static_cast<int64_t>(item) % kv_heads;
      const int64_t count_tokens = std::min(token_block, tokens - t0);
      // Token t0 + i sees seen[i] rows: without a window the first positions[t0 + i] + 1 of the walk
      // up to the block's last position; in a block of one, its own walk.
      int32_t last = positions[t0];
      for (int64_t t = t0 + 1; t < t0 + count_tokens; ++t) last = std::max(last, positions[t]);
      visible_rows(kv, shape, last, rows);
      const int64_t visible = static_cast<int64_t>(rows.size());
      int64_t seen[kAttentionTokenBlock];
      for (int64_t i = 0; i < count_tokens; ++i)
        seen[i] = count_tokens == 1 ? visible : static_cast<int64_t>(positions[t0 + i]) + 1;
      auto score_row = [&](int64_t i, int64_t g) -> std::vector<float>& {
        return scores[static_cast<size_t>(i * group + g)];
      };
      for (int64_t i = 0; i < count_tokens; ++i)
        for (int64_t g = 0; g < group; ++g) score_row(i, g).resize(static_cast<size_t>(seen[i]));
      // Each chunk of a KV head's rows (keys or values) in `heads`, then visit(i, g, from, here) for
      // every head g of every token i that sees `here` of its rows.
      auto over_chunks = [&](bool values, auto&& visit) {
        for (int64_t from = 0; from < visible; from += kChunkRows) {
          const int64_t count = std::min(kChunkRows, visible - from);
          for (int64_t r = 0; r < count; ++r) {
            const int64_t row = rows[static_cast<size_t>(from + r)];
            if constexpr (kInt8)
              kv8_read_head(values ? kv.values8 : kv.keys8, row, kv_head, kv_heads, head_dim, kv.view,
                            chunk.data() + r * head_dim);
            else
              heads[static_cast<size_t>(r)] = (values ? kv.values : kv.keys) + row * kv_stride + kv_head * head_dim;
          }
          for (int64_t i = 0; i < count_tokens; ++i) {
            const int64_t here = std::min(count, seen[i] - from);
            for (int64_t g = 0; g < group && here > 0; ++g) visit(i, g, from, here);
          }
        }
      };
      auto head_offset = [&](int64_t i, int64_t g) { return ((t0 + i) * shape.num_heads + kv_head * group + g) * head_dim; };
      over_chunks(false, [&](int64_t i, int64_t g, int64_t from, int64_t here) {
        score_all(simd, q + head_offset(i, g), heads.data(), here, head_dim, score_row(i, g).data() + from);
      });
      for (int64_t i = 0; i < count_tokens; ++i)
        for (int64_t g = 0; g < group; ++g) softmax_weights(score_row(i, g), scale);
      over_chunks(true, [&](int64_t i, int64_t g, int64_t from, int64_t here) {
        sum_all(simd, score_row(i, g).data() + from, heads.data(), here, head_dim, out + head_offset(i, g), from > 0);
      });
    }
  });
}

// -1: follow QSPEC_CPU_ATTENTION; else an AttentionLoop set by set_attention_loop.
std::atomic<int> attention_loop_override{-1};

// Rows from which reading them once outweighs an uneven split of the grouped loop's few items (a
// decode of SmolLM2 on 2 threads: 3 items, 2 : 1, against the per-head loop's 9, 5 : 4): measured
// per head 3 % faster at 64-192 rows, grouped 4 % faster at 512 and 8-11 % at 2048
// (bench/results/cpu-attention-grouped-ab-smollm2-*.log).
constexpr int64_t kGroupedMinRows = 256;

// Whether the f32 cache takes the grouped loop: forced, or wherever its items (blocks of tokens x
// KV heads) share rows between heads or tokens, give every thread one, and either split as evenly
// as the per-head loop's (in query-head units) or read at least kGroupedMinRows rows.
bool grouped_attention(const AttentionShape& shape, int64_t tokens, const int32_t* positions) {
  static const AttentionLoop from_env = [] {
    const char* text = std::getenv("QSPEC_CPU_ATTENTION");
    if (text == nullptr || *text == '\0') return AttentionLoop::automatic;
    const std::string value(text);
    QSPEC_CHECK(value == "grouped" || value == "per-head", "QSPEC_CPU_ATTENTION: '", value,
                "' is not grouped or per-head");
    return value == "grouped" ? AttentionLoop::grouped : AttentionLoop::per_head;
  }();
  const int forced = attention_loop_override.load(std::memory_order_relaxed);
  const AttentionLoop loop = forced >= 0 ? static_cast<AttentionLoop>(forced) : from_env;
  if (loop != AttentionLoop::automatic) return loop == AttentionLoop::grouped;
  const int64_t group = shape.num_heads / shape.num_kv_heads, token_block = attention_token_block(shape, tokens);
  const int64_t items = (tokens + token_block - 1) / token_block * shape.num_kv_heads;
  const int64_t threads = static_cast<int64_t>(ThreadPool::global().size());
  if (tokens <= 0 || !(group > 1 || (token_block > 1 && tokens > 1)) || items < threads) return false;
  const int64_t grouped_load = (items + threads - 1) / threads * std::min(token_block, tokens) * group;
  const int64_t per_head_load = (tokens * shape.num_heads + threads - 1) / threads;
  const int32_t last = *std::max_element(positions, positions + tokens);
  return grouped_load <= per_head_load || static_cast<int64_t>(last) + 1 >= kGroupedMinRows;
}

}  // namespace

void set_attention_loop(AttentionLoop loop) {
  attention_loop_override.store(static_cast<int>(loop), std::memory_order_relaxed);
}

void attention(const float* q, int64_t tokens, const int32_t* positions, const float* keys,
               const float* values, const AttentionShape& shape, float* out) {
  static const int32_t kSingleBlock[1] = {0};
  PagedKv contiguous;
  contiguous.keys = keys;
  contiguous.values = values;
  contiguous.block_table = kSingleBlock;
  contiguous.block_size = int64_t{1} << 40;
  attention(q, tokens, positions, contiguous, shape, out);
}

void attention(const float* q, int64_t tokens, const int32_t* positions, const PagedKv& kv,
               const AttentionShape& shape, float* out) {
  if (kv.format == KvCacheFormat::int8) return attention_grouped<true>(q, tokens, positions, kv, shape, out);
  if (grouped_attention(shape, tokens, positions))
    return attention_grouped<false>(q, tokens, positions, kv, shape, out);
  const int64_t head_dim = shape.head_dim;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t kv_stride = shape.num_kv_heads * head_dim;
  const float scale = shape.scale > 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t work_items = static_cast<size_t>(tokens * shape.num_heads);
  const bool simd = kernel_isa() != KernelIsa::portable;
  ThreadPool::global().parallel_for(work_items, 4, [&](size_t begin, size_t end) {
    std::vector<float> scores;
    std::vector<int64_t> rows;  // the cache row of each visible key, in position order
    std::vector<const float*> heads;  // each visible key's (then value's) head
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = static_cast<int64_t>(item) / shape.num_heads;
      const int64_t h = static_cast<int64_t>(item) % shape.num_heads;
      const int64_t kv_head = h / group;
      visible_rows(kv, shape, positions[t], rows);
      const int64_t visible = static_cast<int64_t>(rows.size());
      const float* query = q + (t * shape.num_heads + h) * head_dim;
      scores.resize(static_cast<size_t>(visible));
      heads.resize(static_cast<size_t>(visible));
      for (int64_t i = 0; i < visible; ++i)
        heads[static_cast<size_t>(i)] = kv.keys + rows[static_cast<size_t>(i)] * kv_stride + kv_head * head_dim;
      score_all(simd, query, heads.data(), visible, head_dim, scores.data());
      softmax_weights(scores, scale);  // each key's weight
      for (int64_t j = 0; j < visible; ++j)
        heads[static_cast<size_t>(j)] = kv.values + rows[static_cast<size_t>(j)] * kv_stride + kv_head * head_dim;
      sum_all(simd, scores.data(), heads.data(), visible, head_dim, out + (t * shape.num_heads + h) * head_dim,
              /*accumulate=*/false);
    }
  });
}

}  // namespace qspec::cpu
