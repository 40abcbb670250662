// Gated MLP activations, elementwise: SwiGLU silu(gate) * up, GeGLU gelu_tanh(gate) * up;
// and tanh soft-capping of logits.
#pragma once
#include <cstdint>

namespace qspec::cpu {
void silu_mul(const float* gate, const float* up, int64_t count, float* out);
// GELU with the tanh approximation (PyTorch's gelu(approximate="tanh")) times up.
void gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out);
// x <- cap * tanh(x / cap).
void soft_cap(float* x, int64_t count, float cap);
}  // namespace qspec::cpu
