// WeightMatrix (base/weight_matrix.h): a row as f32.
#include "base/weight_matrix.h"

#include <cstring>

namespace qspec {

void WeightMatrix::row_to_f32(int64_t row, float* out) const {
  if (dtype == DType::BF16) {
    const auto* bits = static_cast<const uint16_t*>(data) + row * cols;
    for (int64_t k = 0; k < cols; ++k) {
      uint16_t value;
      std::memcpy(&value, bits + k, sizeof value);
      out[k] = bf16_to_f32(value);
    }
  } else {
    std::memcpy(out, static_cast<const float*>(data) + row * cols, sizeof(float) * cols);
  }
}

}  // namespace qspec
