// A weight matrix as the loaders give it: a view into a mapped checkpoint (bf16, f32) or an
// owned f32 copy. The lowest layer's type, so quant/, ops/ and model/ can all name it.
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

}  // namespace qspec
