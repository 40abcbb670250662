// Rotary position embedding, Hugging Face "rotate_half" convention: within each head the
// pair (i, i + head_dim/2) is rotated by angle position * inv_freq[i].
#pragma once
#include <cstdint>

namespace qspec::cpu {
// x: [tokens, heads * head_dim], rotated in place; positions: [tokens].
// attention_scaling multiplies cos and sin (yarn), 1 otherwise.
void rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, float attention_scaling);
}  // namespace qspec::cpu
