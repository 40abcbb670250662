// SwiGLU: out = silu(gate) * up, elementwise.
#pragma once
#include <cstdint>

namespace qspec::cpu {
void silu_mul(const float* gate, const float* up, int64_t count, float* out);
}  // namespace qspec::cpu
