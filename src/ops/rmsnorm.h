// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, row by row.
#pragma once
#include <cstdint>

namespace qspec::cpu {
void rmsnorm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* y);
}  // namespace qspec::cpu
