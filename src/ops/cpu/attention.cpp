// Causal grouped-query attention on the CPU over paged or contiguous K/V rows.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/thread_pool.h"

namespace qspec::cpu {
namespace {
// Eight partial sums: the compiler vectorises this without -ffast-math reassociation (a
// single running sum is one dependent chain of head_dim FMAs).
inline float dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int lane = 0; lane < 8; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}
}  // namespace

void attention(const float* q, int64_t tokens, const int32_t* positions, const float* keys,
               const float* values, const AttentionShape& shape, float* out) {
  static const int32_t kSingleBlock[1] = {0};
  const PagedKv contiguous{keys, values, kSingleBlock, int64_t{1} << 40};
  attention(q, tokens, positions, contiguous, shape, out);
}

void attention(const float* q, int64_t tokens, const int32_t* positions, const PagedKv& kv,
               const AttentionShape& shape, float* out) {
  const int64_t head_dim = shape.head_dim;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t kv_stride = shape.num_kv_heads * head_dim;
  const float scale = shape.scale > 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t work_items = static_cast<size_t>(tokens * shape.num_heads);
  ThreadPool::global().parallel_for(work_items, 4, [&](size_t begin, size_t end) {
    std::vector<float> scores;
    std::vector<int64_t> rows;  // the cache row of each visible key, in position order
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = static_cast<int64_t>(item) / shape.num_heads;
      const int64_t h = static_cast<int64_t>(item) % shape.num_heads;
      const int64_t kv_head = h / group;
      const int64_t last = positions[t];
      // Visible: the sinks 0 .. sinks - 1, then first .. last, in position order.
      const int64_t first =
          shape.sliding_window > 0 ? std::max<int64_t>(0, last - shape.sliding_window + 1) : 0;
      const int64_t sinks = std::min(shape.sliding_window > 0 ? shape.sink_tokens : 0, first);
      const int64_t visible = sinks + (last - first + 1);
      // Rows walked block by block: PagedKv::row's division a key cost more than its dot product.
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
      const float* query = q + (t * shape.num_heads + h) * head_dim;
      scores.resize(static_cast<size_t>(visible));
      float max_score = -INFINITY;
      for (int64_t i = 0; i < visible; ++i) {
        const float* key = kv.keys + rows[static_cast<size_t>(i)] * kv_stride + kv_head * head_dim;
        const float score = dot(query, key, head_dim) * scale;
        scores[static_cast<size_t>(i)] = score;
        max_score = std::max(max_score, score);
      }
      float denominator = 0.0f;
      for (float& score : scores) {
        score = std::exp(score - max_score);
        denominator += score;
      }
      float* result = out + (t * shape.num_heads + h) * head_dim;
      std::fill(result, result + head_dim, 0.0f);
      for (int64_t i = 0; i < visible; ++i) {
        const float weight = scores[static_cast<size_t>(i)] / denominator;
        const float* value = kv.values + rows[static_cast<size_t>(i)] * kv_stride + kv_head * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) result[d] += weight * value[d];
      }
    }
  });
}

}  // namespace qspec::cpu
