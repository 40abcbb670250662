// Int8-block weights on the CPU (ops/int8_linear.h): the lossless conversion of an f32 matrix that
// is Q8_0 blocks in disguise (a GGUF's output matrix converted to f32), and its GEMM.
#include "ops/int8_linear.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "base/thread_pool.h"
#include "ops/cpu/q4_kernels.h"

namespace qspec::cpu {

namespace {

// Codes and scale of one block when it is exactly code * s: s = amax / m for the largest code
// magnitude m (127 for a Q8_0 block, whose scale is amax / 127), every value / s an integer
// whose product with s gives the value back. False when no m does (or a value is not finite).
bool exact_block(const float* values, int8_t* codes, float* scale) {
  constexpr int64_t kBlock = Int8BlockMatrix::kBlock;
  float amax = 0.0f;
  for (int64_t i = 0; i < kBlock; ++i) {
    if (!std::isfinite(values[i])) return false;
    amax = std::max(amax, std::fabs(values[i]));
  }
  if (amax == 0.0f) {
    *scale = 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) codes[i] = 0;
    return true;
  }
  for (int m = 127; m >= 1; --m) {
    const float s = amax / static_cast<float>(m);
    bool exact = s > 0.0f;
    for (int64_t i = 0; i < kBlock && exact; ++i) {
      const float code = std::nearbyint(values[i] / s);
      exact = std::fabs(code) <= 127.0f && code * s == values[i];
      codes[i] = static_cast<int8_t>(code);
    }
    if (exact) {
      *scale = s;
      return true;
    }
  }
  return false;
}

}  // namespace

std::optional<Int8BlockMatrix> exact_int8_blocks(const WeightMatrix& weight) {
  constexpr int64_t kBlock = Int8BlockMatrix::kBlock;
  if (weight.rows <= 0 || weight.cols <= 0 || weight.cols % kBlock != 0) return std::nullopt;
  Int8BlockMatrix out;
  out.name = weight.name;
  out.rows = weight.rows;
  out.cols = weight.cols;
  const int64_t blocks = out.blocks();
  // The first row alone: most matrices that are not int8 blocks fail here, before any allocation.
  std::vector<float> first(static_cast<size_t>(weight.cols));
  std::vector<int8_t> first_codes(static_cast<size_t>(weight.cols));
  weight.row_to_f32(0, first.data());
  for (int64_t b = 0; b < blocks; ++b) {
    float scale = 0.0f;
    if (!exact_block(first.data() + b * kBlock, first_codes.data() + b * kBlock, &scale)) return std::nullopt;
  }
  out.codes.resize(static_cast<size_t>(weight.rows * weight.cols));
  out.scales.resize(static_cast<size_t>(weight.rows * blocks));
  std::atomic<bool> exact{true};
  ThreadPool::global().parallel_for(static_cast<size_t>(weight.rows), 256, [&](size_t begin, size_t end) {
    std::vector<float> row(static_cast<size_t>(weight.cols));
    for (size_t r = begin; r < end && exact.load(std::memory_order_relaxed); ++r) {
      weight.row_to_f32(static_cast<int64_t>(r), row.data());
      for (int64_t b = 0; b < blocks; ++b)
        if (!exact_block(row.data() + b * kBlock, out.codes.data() + static_cast<int64_t>(r) * weight.cols + b * kBlock,
                         out.scales.data() + static_cast<int64_t>(r) * blocks + b)) {
          exact.store(false, std::memory_order_relaxed);
          return;
        }
    }
  });
  if (!exact.load()) return std::nullopt;
  return out;
}

void int8_linear(const float* x, int64_t tokens, const Int8BlockMatrix& weight, const float* bias, float* y) {
  int8_linear(x, tokens, weight.view(), bias, y);
}

void int8_linear(const float* x, int64_t tokens, const Int8BlockView& weight, const float* bias, float* y) {
  if (tokens <= 0 || weight.rows == 0) return;
  const q4::I8Problem problem{x, tokens, weight, bias, y};
  const q4::Kernels& kernels = q4::i8_simd_fits(problem) ? q4::kernels_for(kernel_isa()) : q4::portable_kernels();
  q4::for_row_blocks(weight.rows, weight.cols * tokens,
                     [&](int64_t begin, int64_t end) { kernels.i8(problem, begin, end); });
}

}  // namespace qspec::cpu
