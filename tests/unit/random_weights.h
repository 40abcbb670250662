// Test helper: a random weight matrix quantized RTN (normal values of the given spread).
#pragma once
#include <cstdint>
#include <random>

#include "quant/quantized_linear.h"

namespace qspec::test {

inline QuantizedMatrix random_int4_matrix(std::mt19937& rng, int64_t rows, int64_t cols, int64_t group,
                                          float spread = 0.05f) {
  std::normal_distribution<float> normal(0.0f, spread);
  WeightMatrix matrix;
  matrix.name = "test.weight";
  matrix.dtype = DType::F32;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.owned.resize(static_cast<size_t>(rows * cols));
  for (float& v : matrix.owned) v = normal(rng);
  matrix.data = matrix.owned.data();
  return quantize_rtn(matrix, quant::Format::int4, group);
}

}  // namespace qspec::test
