// An f32 weight matrix held losslessly as int8 codes with one scale per 32 values (the layout of
// llama.cpp's Q8_0), and the CPU GEMM over it that gives cpu::linear's bits: the lm_head of a
// GGUF whose output matrix was Q8_0 reads 1.125 bytes a weight instead of 4.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/weight_matrix.h"

namespace qspec::cpu {

// Int8 codes with one f32 scale per `block` values along K, weight = code * scale: what the int8
// GEMM reads, from an Int8BlockMatrix or from an int8-group QuantizedMatrix (quant/formats.h).
struct Int8BlockView {
  const int8_t* codes = nullptr;  // [rows, cols]
  const float* scales = nullptr;  // [rows, cols / block]
  int64_t rows = 0, cols = 0, block = 0;
  int64_t blocks() const { return cols / block; }
};

struct Int8BlockMatrix {
  static constexpr int64_t kBlock = 32;  // values per scale, along K
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<int8_t> codes;  // [rows, cols]
  std::vector<float> scales;  // [rows, cols / kBlock]: weight = code * scale, exactly the f32 value
  int64_t blocks() const { return cols / kBlock; }
  size_t bytes() const { return codes.size() + scales.size() * sizeof(float); }
  Int8BlockView view() const { return {codes.data(), scales.data(), rows, cols, kBlock}; }
};

// The matrix as int8 blocks when every block of 32 values of every row is exactly code * s for
// integer codes in [-127, 127] and one f32 s (so each f32 product code * s is the stored value
// itself); nullopt otherwise (any block that is not, or K not a multiple of 32). Threaded
// over rows; a matrix that is not exact is usually refused at its first block.
std::optional<Int8BlockMatrix> exact_int8_blocks(const WeightMatrix& weight);

// y[m, n] = sum_k x[m, k] * W[n, k] + bias[n]: the result of cpu::linear on the f32 matrix the
// blocks came from, bit for bit on AVX2 builds (each (token, row) is one 8-lane FMA chain over K
// and one horizontal sum, over the weights decoded as code * scale). Kernels as
// ops/quantized_linear.h chooses them (kernel_isa()). bias may be null.
void int8_linear(const float* x, int64_t tokens, const Int8BlockMatrix& weight, const float* bias, float* y);
// The same over a view (any block; SIMD kernels where the block is a multiple of 8).
void int8_linear(const float* x, int64_t tokens, const Int8BlockView& weight, const float* bias, float* y);

}  // namespace qspec::cpu
