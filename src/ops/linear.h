// Linear layer y = x W^T (+ bias) with x in f32 and W in bf16 or f32, computed in f32.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/weight_matrix.h"

namespace qspec {

namespace cpu {
// y[m, n] = sum_k x[m, k] * W[n, k] + bias[n], for m < tokens. bias may be null.
// Multi-threaded over n on the global pool.
void linear(const float* x, int64_t tokens, const WeightMatrix& weight, const float* bias,
            float* y);

// Weight rows one call handles together (x is loaded once for all of them).
inline constexpr int64_t kLinearRowBlock = 8;
}  // namespace cpu

}  // namespace qspec
