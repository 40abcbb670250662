#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/thread_pool.h"

namespace qspec::cpu {

void attention(const float* q, int64_t tokens, const int32_t* positions, const float* keys,
               const float* values, const AttentionShape& shape, float* out) {
  const int64_t head_dim = shape.head_dim;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t kv_stride = shape.num_kv_heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t work_items = static_cast<size_t>(tokens * shape.num_heads);
  ThreadPool::global().parallel_for(work_items, 4, [&](size_t begin, size_t end) {
    std::vector<float> scores;
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = static_cast<int64_t>(item) / shape.num_heads;
      const int64_t h = static_cast<int64_t>(item) % shape.num_heads;
      const int64_t kv_head = h / group;
      const int64_t last = positions[t];
      const int64_t first =
          shape.sliding_window > 0 ? std::max<int64_t>(0, last - shape.sliding_window + 1) : 0;
      const float* query = q + (t * shape.num_heads + h) * head_dim;
      scores.resize(static_cast<size_t>(last - first + 1));
      float max_score = -INFINITY;
      for (int64_t p = first; p <= last; ++p) {
        const float* key = keys + p * kv_stride + kv_head * head_dim;
        float dot = 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) dot += query[d] * key[d];
        dot *= scale;
        scores[p - first] = dot;
        max_score = std::max(max_score, dot);
      }
      float denominator = 0.0f;
      for (float& score : scores) {
        score = std::exp(score - max_score);
        denominator += score;
      }
      float* result = out + (t * shape.num_heads + h) * head_dim;
      std::fill(result, result + head_dim, 0.0f);
      for (int64_t p = first; p <= last; ++p) {
        const float weight = scores[p - first] / denominator;
        const float* value = values + p * kv_stride + kv_head * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) result[d] += weight * value[d];
      }
    }
  });
}

}  // namespace qspec::cpu
