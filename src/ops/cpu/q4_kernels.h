// The 4-bit GEMM kernels behind ops/quantized_linear.h, one set per instruction set, and what
// they share: the work of one call, split over output rows by the caller's thread pool.
#pragma once
#include <cstdint>

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

// What the SIMD kernels need of a problem (the portable ones take any).
bool a16_simd_fits(const A16Problem& p);  // block % 8 == 0
bool a8_simd_fits(const A8Problem& p);    // interleaved x, block % 64 == 0 or block == 32

struct Kernels {
  void (*a16)(const A16Problem& p, int64_t row_begin, int64_t row_end);
  void (*a8)(const A8Problem& p, int64_t row_begin, int64_t row_end);
};

const Kernels& portable_kernels();
#if defined(__x86_64__) || defined(_M_X64)
const Kernels& avx2_kernels();
const Kernels& avx_vnni_kernels();
const Kernels& avx512_vnni_kernels();
#endif

}  // namespace qspec::cpu::q4
