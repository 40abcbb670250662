// Linear layer y = x W^T (+ bias) with x in f32 and W in bf16 or f32, computed in f32.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace qspec {

// A [rows x cols] row-major weight matrix: a view into a mapped checkpoint (bf16, f32) or
// an owned f32 copy (converted from f16).
struct WeightMatrix {
  std::string name;
  DType dtype = DType::F32;  // BF16 or F32
  int64_t rows = 0;          // output features (N)
  int64_t cols = 0;          // input features (K)
  const void* data = nullptr;
  std::vector<float> owned;  // backing store when converted at load

  // Row `row` as f32 into out[cols].
  void row_to_f32(int64_t row, float* out) const;
};

namespace cpu {
// y[m, n] = sum_k x[m, k] * W[n, k] + bias[n], for m < tokens. bias may be null.
// Multi-threaded over n on the global pool.
void linear(const float* x, int64_t tokens, const WeightMatrix& weight, const float* bias,
            float* y);

// Weight rows one call handles together (the quantized GEMM dequantizes this many at once).
inline constexpr int64_t kLinearRowBlock = 8;
// out[r] = dot(x, rows[r]) over k values for r < count <= kLinearRowBlock; single-threaded.
void dot_rows_f32(const float* x, const float* const* rows, int64_t count, int64_t k, float* out);
}  // namespace cpu

}  // namespace qspec
