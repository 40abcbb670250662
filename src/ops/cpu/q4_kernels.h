// The low-bit GEMM kernels behind ops/quantized_linear.h (4-bit weights) and ops/int8_linear.h
// (int8 weights), one set per instruction set, and what they share: the work of one call, split
// over output rows by the caller's thread pool.
#pragma once
#include <algorithm>
#include <cstdint>

#include "base/thread_pool.h"
#include "ops/int8_linear.h"
#include "ops/quantized_linear.h"

namespace qspec::cpu::q4 {

// Float activations: y = x W^T + bias over rows [row_begin, row_end).
struct A16Problem {
  const float* x;  // [tokens, k]
  int64_t tokens;
  const QuantizedMatrix* weight;
  const float* bias;  // may be null
  float* y;           // [tokens, weight->rows]
  float nibble_values[16];  // element value of each 4-bit code (the format's table)
};

// int8 activations on int4 / int4-channel weights.
struct A8Problem {
  const Int8Activations* x;
  const QuantizedMatrix* weight;
  const float* bias;
  float* y;
};

// int8-block weights, float activations: y = x W^T + bias over rows [row_begin, row_end).
struct I8Problem {
  const float* x;  // [tokens, k]
  int64_t tokens;
  Int8BlockView weight;
  const float* bias;  // may be null
  float* y;           // [tokens, weight.rows]
};

// What the SIMD kernels need of a problem (the portable ones take any).
bool a16_simd_fits(const A16Problem& p);  // block % 8 == 0
bool a8_simd_fits(const A8Problem& p);    // interleaved x, block % 64 == 0 or block == 32 (int8-group: % 32, or 16)
bool i8_simd_fits(const I8Problem& p);    // block % 8 == 0

struct Kernels {
  void (*a16)(const A16Problem& p, int64_t row_begin, int64_t row_end);
  void (*a8)(const A8Problem& p, int64_t row_begin, int64_t row_end);
  void (*i8)(const I8Problem& p, int64_t row_begin, int64_t row_end);
};

const Kernels& portable_kernels();
#if defined(__x86_64__) || defined(_M_X64)
const Kernels& avx2_kernels();
const Kernels& avx_vnni_kernels();
const Kernels& avx512_vnni_kernels();
#endif
// The set kernel_isa() names (ops/cpu/quantized_linear.cpp).
const Kernels& kernels_for(KernelIsa isa);

// Runs body(row_begin, row_end) over the output rows in blocks of 8 (the kernels' row tile) on
// the global pool, with enough rows per hand-off to be worth it (~32K multiply-adds).
template <typename Body>
void for_row_blocks(int64_t n, int64_t work_per_row, const Body& body) {
  constexpr int64_t kRows = 8;
  const int64_t row_blocks = (n + kRows - 1) / kRows;
  const size_t grain = static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_row * kRows)));
  ThreadPool::global().parallel_for(static_cast<size_t>(row_blocks), grain, [&](size_t begin, size_t end) {
    body(static_cast<int64_t>(begin) * kRows, std::min(n, static_cast<int64_t>(end) * kRows));
  });
}

// The same over several matrices that share one input (q/k/v, gate/up): their row tiles split
// together in one parallel region, so the threads meet once; run(matrix, row_begin, row_end)
// gets ranges within one matrix. At most kMaxFused matrices.
inline constexpr size_t kMaxFused = 4;
template <typename Run>
void for_row_blocks_of(const int64_t* rows, size_t count, int64_t work_per_row, const Run& run) {
  constexpr int64_t kRows = 8;
  int64_t first_block[kMaxFused + 1] = {};
  for (size_t m = 0; m < count; ++m) first_block[m + 1] = first_block[m] + (rows[m] + kRows - 1) / kRows;
  const int64_t row_blocks = first_block[count];
  const size_t grain = static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_row * kRows)));
  ThreadPool::global().parallel_for(static_cast<size_t>(row_blocks), grain, [&](size_t begin, size_t end) {
    for (size_t m = 0; m < count; ++m) {
      const int64_t from = std::max<int64_t>(static_cast<int64_t>(begin), first_block[m]);
      const int64_t to = std::min<int64_t>(static_cast<int64_t>(end), first_block[m + 1]);
      if (from < to) run(m, (from - first_block[m]) * kRows, std::min(rows[m], (to - first_block[m]) * kRows));
    }
  });
}

}  // namespace qspec::cpu::q4
