#include "ops/linear.h"

#include <algorithm>
#include <cstring>

#include "base/thread_pool.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QSPEC_LINEAR_AVX2 1
#endif

namespace qspec {

namespace cpu {
namespace {

// Rows of W handled together: x is loaded once per 8 weight rows, and the 8 independent
// accumulator chains hide the FMA latency (4 cycles, 2 per cycle: 8 in flight).
constexpr int64_t kRowBlock = kLinearRowBlock;

#ifdef QSPEC_LINEAR_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1));
  return _mm_cvtss_f32(sum);
}
#endif

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }

// out[r] = dot(x, w_rows[r]) for `count` (<= kRowBlock) rows of length k.
template <typename WeightT>
void dot_rows(const float* x, const WeightT* const* w_rows, int64_t count, int64_t k, float* out) {
#ifdef QSPEC_LINEAR_AVX2
  if (count == kRowBlock) {
    __m256 acc[kRowBlock];
#pragma GCC unroll 8
    for (int64_t r = 0; r < kRowBlock; ++r) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      const __m256 xv = load8(x + i);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRowBlock; ++r) acc[r] = _mm256_fmadd_ps(xv, load8(w_rows[r] + i), acc[r]);
    }
    float sums[kRowBlock];
#pragma GCC unroll 8
    for (int64_t r = 0; r < kRowBlock; ++r) sums[r] = horizontal_sum(acc[r]);
    for (; i < k; ++i)
      for (int64_t r = 0; r < kRowBlock; ++r) sums[r] += x[i] * to_f32(w_rows[r][i]);
    for (int64_t r = 0; r < kRowBlock; ++r) out[r] = sums[r];
    return;
  }
  for (int64_t r = 0; r < count; ++r) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) acc = _mm256_fmadd_ps(load8(x + i), load8(w_rows[r] + i), acc);
    float sum = horizontal_sum(acc);
    for (; i < k; ++i) sum += x[i] * to_f32(w_rows[r][i]);
    out[r] = sum;
  }
#else
  for (int64_t r = 0; r < count; ++r) {
    // Eight partial sums let the compiler vectorise without reassociating.
    float partial[8] = {};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
      for (int lane = 0; lane < 8; ++lane) partial[lane] += x[i + lane] * to_f32(w_rows[r][i + lane]);
    float sum = 0;
    for (float p : partial) sum += p;
    for (; i < k; ++i) sum += x[i] * to_f32(w_rows[r][i]);
    out[r] = sum;
  }
#endif
}

template <typename WeightT>
void linear_typed(const float* x, int64_t tokens, const WeightT* w, int64_t n, int64_t k,
                  const float* bias, float* y) {
  const int64_t row_blocks = (n + kRowBlock - 1) / kRowBlock;
  // Enough rows per chunk that a chunk is worth a hand-off (~32K multiply-adds).
  const size_t grain = static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, k * tokens * kRowBlock)));
  ThreadPool::global().parallel_for(static_cast<size_t>(row_blocks), grain, [&](size_t begin, size_t end) {
    for (int64_t block = static_cast<int64_t>(begin); block < static_cast<int64_t>(end); ++block) {
      const int64_t row0 = block * kRowBlock;
      const int64_t count = std::min(kRowBlock, n - row0);
      const WeightT* rows[kRowBlock];
      for (int64_t r = 0; r < kRowBlock; ++r) rows[r] = w + (row0 + std::min(r, count - 1)) * k;
      // The weight block stays in L1/L2 while every token streams past it.
      for (int64_t t = 0; t < tokens; ++t) {
        float sums[kRowBlock];
        dot_rows(x + t * k, rows, count, k, sums);
        float* out = y + t * n + row0;
        for (int64_t r = 0; r < count; ++r) out[r] = sums[r] + (bias ? bias[row0 + r] : 0.0f);
      }
    }
  });
}

}  // namespace

void linear(const float* x, int64_t tokens, const WeightMatrix& weight, const float* bias,
            float* y) {
  if (weight.dtype == DType::BF16)
    linear_typed(x, tokens, static_cast<const uint16_t*>(weight.data), weight.rows, weight.cols,
                 bias, y);
  else
    linear_typed(x, tokens, static_cast<const float*>(weight.data), weight.rows, weight.cols, bias,
                 y);
}

}  // namespace cpu
}  // namespace qspec
