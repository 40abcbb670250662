// The portable low-bit GEMM kernels (plain C++): the reference order every SIMD kernel of
// q4_kernels_x86.inc reproduces bit for bit, and the path for CPUs without AVX2.
#include "ops/cpu/q4_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant/formats.h"

namespace qspec::cpu::q4 {

bool a16_simd_fits(const A16Problem& p) { return p.weight->format.block % 8 == 0; }
bool i8_simd_fits(const I8Problem& p) { return p.weight.block % 8 == 0; }

bool a8_simd_fits(const A8Problem& p) {
  const int64_t block = p.weight->format.block;
  if (p.weight->format.format == quant::Format::int8_group) return p.x->interleaved && (block % 32 == 0 || block == 16);
  return p.x->interleaved && (block % 64 == 0 || block == 32);
}

namespace {

// Eight lanes summed in the order of the AVX2 horizontal sum (low half + high half, then
// pairs), so this and the SIMD kernels agree to the bit.
inline float lane_sum(const float lanes[8]) {
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

void a16_portable(const A16Problem& p, int64_t row_begin, int64_t row_end) {
  const QuantizedMatrix& w = *p.weight;
  const int64_t n = w.rows, k = w.cols(), k8 = k / 8 * 8;
  thread_local std::vector<float> decoded_row;
  decoded_row.resize(static_cast<size_t>(k));
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = decoded_row.data();
    if (w.decoded.empty())
      w.dequantize_row(r, decoded_row.data());
    else
      row = w.decoded.data() + r * k;
    for (int64_t t = 0; t < p.tokens; ++t) {
      const float* x = p.x + t * k;
      float lanes[8] = {};
      for (int64_t i = 0; i < k8; i += 8)
        for (int j = 0; j < 8; ++j) lanes[j] = std::fma(x[i + j], row[i + j], lanes[j]);
      float sum = lane_sum(lanes);
      for (int64_t i = k8; i < k; ++i) sum = std::fma(x[i], row[i], sum);
      p.y[t * n + r] = sum + (p.bias ? p.bias[r] : 0.0f);
    }
  }
}

void a8_portable(const A8Problem& p, int64_t row_begin, int64_t row_end) {
  const QuantizedMatrix& w = *p.weight;
  const Int8Activations& x = *p.x;
  const int64_t n = w.rows, k = w.cols(), block = w.format.block, blocks = w.format.blocks();
  // The tokens' codes back in plain order, and one row's int4 values.
  thread_local std::vector<int8_t> codes, values;
  codes.resize(static_cast<size_t>(x.tokens * k));
  values.resize(static_cast<size_t>(k));
  for (int64_t t = 0; t < x.tokens; ++t)
    for (int64_t e = 0; e < k; ++e) {
      const int64_t within = e % 64;
      const int64_t position = x.interleaved ? e - within + (within & 1) * 32 + (within >> 1) : e;
      codes[static_cast<size_t>(t * k + e)] = x.codes[static_cast<size_t>(t * k + position)];
    }
  const bool asym = w.has_min();
  const bool int8 = w.format.format == quant::Format::int8_group;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row_codes = w.codes.data() + r * w.format.code_bytes();
    // int8-group: the codes themselves, one byte each.
    const int8_t* row_values = int8 ? reinterpret_cast<const int8_t*>(row_codes) : values.data();
    if (!int8)
      for (int64_t e = 0; e < k; ++e) {
        const int nibble = (row_codes[e / 2] >> (4 * (e & 1))) & 0xf;
        // int4: two's complement -8..7; int4-asym: the unsigned code 0..15.
        values[static_cast<size_t>(e)] = static_cast<int8_t>(asym ? nibble : (nibble ^ 8) - 8);
      }
    const float* scales = w.block_scale_values.data() + r * blocks;
    const float* mins = asym ? w.block_min_values.data() + r * blocks : nullptr;
    for (int64_t t = 0; t < x.tokens; ++t) {
      const int8_t* q = codes.data() + t * k;
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t sum = 0;  // exact: |sum| <= block * 127 * 128
        for (int64_t e = b * block; e < (b + 1) * block; ++e) sum += int32_t{q[e]} * row_values[e];
        acc = std::fma(scales[b], static_cast<float>(sum), acc);
        // int4-asym: sum_e q_e (s c_e + m) = s * sum + m * sum_e q_e (the block's activation codes).
        if (asym) {
          int32_t code_sum = 0;
          for (int64_t e = b * block; e < (b + 1) * block; ++e) code_sum += q[e];
          acc = std::fma(mins[b], static_cast<float>(code_sum), acc);
        }
      }
      p.y[t * n + r] = std::fma(acc, x.scales[static_cast<size_t>(t)], p.bias ? p.bias[r] : 0.0f);
    }
  }
}

// int8-block weights: each row decoded (code * scale, exactly the f32 matrix's values), then the
// f32 order of a16_portable.
void i8_portable(const I8Problem& p, int64_t row_begin, int64_t row_end) {
  const Int8BlockView& w = p.weight;
  const int64_t n = w.rows, k = w.cols, blocks = w.blocks(), k8 = k / 8 * 8;
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(k));
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int8_t* codes = w.codes + r * k;
    for (int64_t b = 0; b < blocks; ++b) {
      const float scale = w.scales[r * blocks + b];
      for (int64_t e = b * w.block; e < (b + 1) * w.block; ++e)
        row[static_cast<size_t>(e)] = static_cast<float>(codes[e]) * scale;
    }
    for (int64_t t = 0; t < p.tokens; ++t) {
      const float* x = p.x + t * k;
      float lanes[8] = {};
      for (int64_t i = 0; i < k8; i += 8)
        for (int j = 0; j < 8; ++j) lanes[j] = std::fma(x[i + j], row[static_cast<size_t>(i + j)], lanes[j]);
      float sum = lane_sum(lanes);
      for (int64_t i = k8; i < k; ++i) sum = std::fma(x[i], row[static_cast<size_t>(i)], sum);
      p.y[t * n + r] = sum + (p.bias ? p.bias[r] : 0.0f);
    }
  }
}

}  // namespace

const Kernels& portable_kernels() {
  static const Kernels kernels{a16_portable, a8_portable, i8_portable};
  return kernels;
}

}  // namespace qspec::cpu::q4
