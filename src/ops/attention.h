// Causal grouped-query attention of new tokens over a contiguous or paged K/V history, in f32
// rows or in the 8-bit cache's rows (ops/kv8_rows.h) read in a view.
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/kv8_rows.h"

namespace qspec::cpu {

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // 0: attend to the whole history
  // With a sliding window: the first sink_tokens positions stay visible too (attention sinks;
  // a QSpec draft's sparse view of the shared cache, StreamingLLM / MagicDec style). Position p
  // is visible to a token at position t when p <= t and (p > t - sliding_window or p < sink_tokens).
  int64_t sink_tokens = 0;
  // The keys a token at `position` sees, at most.
  int64_t visible_keys(int64_t position) const {
    const int64_t all = position + 1;
    return sliding_window > 0 ? std::min(all, sliding_window + sink_tokens) : all;
  }
  float scale = 0.0f;          // what q.k is multiplied by; 0: 1/sqrt(head_dim)
};

// K/V rows of one sequence in paged pools [*, num_kv_heads * head_dim]: position p is row
// block_table[p / block_size] * block_size + p % block_size. The rows are visited in position
// order whatever the block layout, so paged and contiguous caches give bit-identical results.
struct PagedKv {
  const float* keys = nullptr;
  const float* values = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;
  // An int8 cache (format int8): keys / values are null and the rows are keys8 / values8, read in
  // `view`. The result equals, bit for bit, f32 attention over kv8_dequantize_rows of the rows.
  KvCacheFormat format = KvCacheFormat::f16;
  Kv8Rows keys8{}, values8{};
  KvView view = KvView::full;
  int64_t row(int64_t position) const {
    return static_cast<int64_t>(block_table[position / block_size]) * block_size + position % block_size;
  }
};

void attention(const float* q, int64_t tokens, const int32_t* positions, const PagedKv& kv,
               const AttentionShape& shape, float* out);

// The f32 cache's two loops, the same bits: per (token, query head), or per (block of up to 8
// tokens, KV head) with the group's heads of every token scoring and summing each chunk of rows
// while it is in L1 (each row read once for all of them; blocks of one token under a window).
// automatic: grouped where the items share rows between heads or tokens and give every thread
// one, else per head. The default comes from
// QSPEC_CPU_ATTENTION=grouped|per-head (A/B runs); tests set it here.
enum class AttentionLoop { automatic, grouped, per_head };
void set_attention_loop(AttentionLoop loop);

// The contiguous case: q: [tokens, num_heads * head_dim]; keys/values: [history, num_kv_heads * head_dim] where
// token t sits at position positions[t] and sees keys 0..positions[t] (within the window);
// out: [tokens, num_heads * head_dim]. Scores are scaled by shape.scale (default 1/sqrt(head_dim)).
void attention(const float* q, int64_t tokens, const int32_t* positions, const float* keys,
               const float* values, const AttentionShape& shape, float* out);

}  // namespace qspec::cpu
