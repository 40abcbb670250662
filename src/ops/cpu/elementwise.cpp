// RMSNorm, RoPE, SwiGLU / GeGLU and soft-capping on the CPU: the elementwise pieces of a transformer layer.
#include <cmath>

#include "ops/activation.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace qspec::cpu {

void rmsnorm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* y) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = x + row * dim;
    float* out = y + row * dim;
    float sum_squares = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum_squares += in[i] * in[i];
    // transformers: x * rsqrt(mean(x^2) + eps) in f32, then times the weight.
    const float inverse_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(dim) + static_cast<float>(eps));
    for (int64_t i = 0; i < dim; ++i) out[i] = (in[i] * inverse_rms) * weight[i];
  }
}

void rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, float attention_scaling) {
  const int64_t half = head_dim / 2;
  float cos_table[512], sin_table[512];  // head_dim <= 1024 is checked by the model loader
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos_table[i] = std::cos(angle) * attention_scaling;
      sin_table[i] = std::sin(angle) * attention_scaling;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* head = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float first = head[i], second = head[i + half];
        head[i] = first * cos_table[i] - second * sin_table[i];
        head[i + half] = second * cos_table[i] + first * sin_table[i];
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + kCubic * g * g * g))) * up[i];
  }
}

void soft_cap(float* x, int64_t count, float cap) {
  for (int64_t i = 0; i < count; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace qspec::cpu
