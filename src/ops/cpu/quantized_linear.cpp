// The CPU 4-bit-weight GEMM and activation modes (ops/quantized_linear.h): weights dequantized
// block by block on the fly, the CPU twin of the CUDA GEMMs in ops/cuda/gemm_*.h.
#include "ops/quantized_linear.h"

#include <algorithm>
#include <vector>

#include "base/thread_pool.h"
#include "ops/linear.h"
#include "qspec/error.h"
#include "quant/formats.h"

namespace qspec {

namespace cpu {

void apply_activation_mode(const ActivationMode& mode, float* x, int64_t tokens, int64_t k) {
  switch (mode.kind) {
    case ActivationMode::Kind::f32:
      return;
    case ActivationMode::Kind::f16:
      for (int64_t i = 0; i < tokens * k; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
      return;
    case ActivationMode::Kind::quantized: {
      const quant::RowFormat format =
          quant::make_row_format(mode.format, quant::Role::activation, k, mode.group_size);
      // Each token alone: its quantized values never depend on the rest of the batch.
      ThreadPool::global().parallel_for(static_cast<size_t>(tokens), 1, [&](size_t begin, size_t end) {
        for (size_t t = begin; t < end; ++t) quant::fake_quantize_row(format, x + static_cast<int64_t>(t) * k);
      });
      return;
    }
  }
}

void quantized_linear(const float* x, int64_t tokens, const QuantizedMatrix& weight,
                      const float* bias, float* y) {
  const int64_t n = weight.rows, k = weight.cols();
  const int64_t row_blocks = (n + kLinearRowBlock - 1) / kLinearRowBlock;
  const size_t grain =
      static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, k * tokens * kLinearRowBlock)));
  ThreadPool::global().parallel_for(static_cast<size_t>(row_blocks), grain, [&](size_t begin, size_t end) {
    // The dequantized block of rows stays in L1/L2 while every token streams past it. One
    // buffer per thread, reused: this runs a few hundred times per decoded token.
    thread_local std::vector<float> block;
    block.resize(static_cast<size_t>(kLinearRowBlock * k));
    for (int64_t b = static_cast<int64_t>(begin); b < static_cast<int64_t>(end); ++b) {
      const int64_t row0 = b * kLinearRowBlock;
      const int64_t count = std::min(kLinearRowBlock, n - row0);
      const float* rows[kLinearRowBlock];
      for (int64_t r = 0; r < count; ++r) {
        if (!weight.decoded.empty()) {
          rows[r] = weight.decoded.data() + (row0 + r) * k;
        } else {
          weight.dequantize_row(row0 + r, block.data() + r * k);
          rows[r] = block.data() + r * k;
        }
      }
      for (int64_t r = count; r < kLinearRowBlock; ++r) rows[r] = rows[count - 1];
      for (int64_t t = 0; t < tokens; ++t) {
        float sums[kLinearRowBlock];
        dot_rows_f32(x + t * k, rows, count, k, sums);
        float* out = y + t * n + row0;
        for (int64_t r = 0; r < count; ++r) out[r] = sums[r] + (bias ? bias[row0 + r] : 0.0f);
      }
    }
  });
}

}  // namespace cpu

}  // namespace qspec
