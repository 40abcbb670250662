// Causal grouped-query attention of new tokens over a contiguous K/V history.
#pragma once
#include <cstdint>

namespace qspec::cpu {

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // 0: attend to the whole history
};

// q: [tokens, num_heads * head_dim]; keys/values: [history, num_kv_heads * head_dim] where
// token t sits at position positions[t] and sees keys 0..positions[t] (within the window);
// out: [tokens, num_heads * head_dim]. Scores are scaled by 1/sqrt(head_dim).
void attention(const float* q, int64_t tokens, const int32_t* positions, const float* keys,
               const float* values, const AttentionShape& shape, float* out);

}  // namespace qspec::cpu
