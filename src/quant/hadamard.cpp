// Hadamard rotations: see hadamard.h for Q, the sign generator and the arithmetic order.

// Every f32 operation rounds on its own (the documented order a CUDA twin can match): no FMA
// contraction of the sign/scale product into the first butterfly.
#include "base/exact_f32.h"  // first

#include "quant/hadamard.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
#include "qspec/error.h"

namespace qspec::quant {
namespace {

uint64_t splitmix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

// f32(1 / sqrt(b)), the one normalisation constant (exact when b is a power of four).
float inverse_sqrt_block(int64_t block) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
}

void check_rotation(const HadamardRotation& rotation, const char* what) {
  QSPEC_CHECK(rotation.n > 0 && rotation.block >= kMinHadamardBlock && rotation.n % rotation.block == 0 &&
                  (rotation.block & (rotation.block - 1)) == 0,
              what, ": invalid Hadamard rotation (n ", rotation.n, ", block ", rotation.block,
              "); build it with make_hadamard_rotation");
  QSPEC_CHECK(static_cast<int64_t>(rotation.signs.size()) == rotation.n, what, ": Hadamard rotation of width ",
              rotation.n, " has ", rotation.signs.size(), " signs");
}

// The unnormalised Walsh-Hadamard butterflies over each block of b values of t[n], stages
// h = 1, 2, ..., b/2 (the order hadamard.h documents).
// Stages h = 1, 2, 4 run together on each group of 8 values in registers (the same
// butterflies in the same order, so bit for bit the same result); the later stages have
// contiguous runs of h >= 8 that the compiler vectorizes.
void butterflies(float* t, int64_t n, int64_t block) {
  for (int64_t g = 0; g < n; g += 8) {
    float* v = t + g;
    const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
    const float a4 = v[4] + v[5], a5 = v[4] - v[5], a6 = v[6] + v[7], a7 = v[6] - v[7];
    const float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
    const float b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
    v[0] = b0 + b4;
    v[4] = b0 - b4;
    v[1] = b1 + b5;
    v[5] = b1 - b5;
    v[2] = b2 + b6;
    v[6] = b2 - b6;
    v[3] = b3 + b7;
    v[7] = b3 - b7;
  }
  for (int64_t base = 0; base < n; base += block) {
    float* v = t + base;
    for (int64_t h = 8; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        float* lo = v + i;
        float* hi = v + i + h;
        for (int64_t j = 0; j < h; ++j) {
          const float a = lo[j], c = hi[j];
          lo[j] = a + c;
          hi[j] = a - c;
        }
      }
    }
  }
}

// Rows per parallel chunk: at least ~32k values, so small calls stay on the calling thread.
size_t row_grain(int64_t n) { return static_cast<size_t>(std::max<int64_t>(1, (int64_t{1} << 15) / n)); }

// The per-element factors c_i = s_i * f32(1 / sqrt(b)).
std::vector<float> factors(const HadamardRotation& rotation) {
  const float scale = inverse_sqrt_block(rotation.block);
  std::vector<float> c(static_cast<size_t>(rotation.n));
  for (int64_t i = 0; i < rotation.n; ++i) c[i] = rotation.signs[i] * scale;
  return c;
}

void transform_rows(const HadamardRotation& rotation, float* x, int64_t rows, bool inverse, const char* what) {
  check_rotation(rotation, what);
  QSPEC_CHECK(rows >= 0, what, ": negative row count ", rows);
  if (rows == 0) return;
  QSPEC_CHECK(x != nullptr, what, ": null data for ", rows, " rows of ", rotation.n);
  const int64_t n = rotation.n, block = rotation.block;
  const std::vector<float> c = factors(rotation);
  const float* cp = c.data();
  ThreadPool::global().parallel_for(static_cast<size_t>(rows), row_grain(n), [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      float* row = x + static_cast<int64_t>(r) * n;
      if (!inverse) {
        for (int64_t i = 0; i < n; ++i) row[i] *= cp[i];
        butterflies(row, n, block);
      } else {
        butterflies(row, n, block);
        for (int64_t i = 0; i < n; ++i) row[i] *= cp[i];
      }
    }
  });
}

}  // namespace

float hadamard_sign(uint64_t seed, int64_t i) {
  const uint64_t z = splitmix64(seed + (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull);
  return (z >> 63) ? -1.0f : 1.0f;
}

int64_t hadamard_block_size(int64_t n) {
  QSPEC_CHECK(n > 0, "Hadamard rotation: width ", n, " is not positive");
  const int64_t block = n & -n;  // the lowest set bit: the largest power of two dividing n
  QSPEC_CHECK(block >= kMinHadamardBlock, "Hadamard rotation: width ", n,
              " is not a multiple of ", kMinHadamardBlock, " (its largest power-of-two divisor is ", block, ")");
  return block;
}

HadamardRotation make_hadamard_rotation(int64_t n, uint64_t seed) {
  HadamardRotation rotation;
  rotation.block = hadamard_block_size(n);
  rotation.n = n;
  rotation.seed = seed;
  rotation.signs.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rotation.signs[i] = hadamard_sign(seed, i);
  return rotation;
}

void rotate_rows(const HadamardRotation& rotation, float* x, int64_t rows) {
  transform_rows(rotation, x, rows, /*inverse=*/false, "rotate_rows");
}

void unrotate_rows(const HadamardRotation& rotation, float* x, int64_t rows) {
  transform_rows(rotation, x, rows, /*inverse=*/true, "unrotate_rows");
}

void fold_norm_into_linear(const float* norm_weight, float* w, int64_t rows, int64_t cols) {
  QSPEC_CHECK(rows >= 0 && cols >= 0, "fold_norm_into_linear: negative size ", rows, " x ", cols);
  if (rows == 0 || cols == 0) return;
  QSPEC_CHECK(norm_weight != nullptr && w != nullptr, "fold_norm_into_linear: null ",
              norm_weight == nullptr ? "norm weight" : "matrix", " for a ", rows, " x ", cols, " matrix");
  for (int64_t r = 0; r < rows; ++r) {
    float* row = w + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] *= norm_weight[c];
  }
}

void rotate_linear_input(const HadamardRotation& rotation, float* w, int64_t rows, int64_t cols) {
  check_rotation(rotation, "rotate_linear_input");
  QSPEC_CHECK(cols == rotation.n, "rotate_linear_input: a ", rows, " x ", cols,
              " matrix does not take inputs of the rotation's width ", rotation.n, " (cols must equal it)");
  transform_rows(rotation, w, rows, /*inverse=*/false, "rotate_linear_input");
}

void rotate_linear_output(const HadamardRotation& rotation, float* w, int64_t rows, int64_t cols,
                          float* bias) {
  check_rotation(rotation, "rotate_linear_output");
  QSPEC_CHECK(cols >= 0, "rotate_linear_output: negative column count ", cols);
  QSPEC_CHECK(rows == rotation.n, "rotate_linear_output: a ", rows, " x ", cols,
              " matrix does not produce outputs of the rotation's width ", rotation.n,
              " (rows must equal it)");
  if (bias != nullptr) transform_rows(rotation, bias, 1, /*inverse=*/false, "rotate_linear_output (bias)");
  if (cols == 0) return;
  QSPEC_CHECK(w != nullptr, "rotate_linear_output: null data for a ", rows, " x ", cols, " matrix");
  // Q^T W: column k of W becomes Q^T w_k = (w_k^T Q)^T, i.e. rotate_rows on each column. The
  // butterflies run across rows on a strip of columns at once, so the inner loops are
  // contiguous; strips are independent and run in parallel.
  const int64_t n = rotation.n, block = rotation.block;
  const std::vector<float> c = factors(rotation);
  constexpr int64_t kStrip = 64;
  const int64_t strips = (cols + kStrip - 1) / kStrip;
  const size_t grain = static_cast<size_t>(std::max<int64_t>(1, (int64_t{1} << 15) / (n * kStrip)));
  ThreadPool::global().parallel_for(static_cast<size_t>(strips), grain, [&](size_t begin, size_t end) {
    for (size_t s = begin; s < end; ++s) {
      const int64_t c0 = static_cast<int64_t>(s) * kStrip, width = std::min(kStrip, cols - c0);
      for (int64_t i = 0; i < n; ++i) {
        float* row = w + i * cols + c0;
        for (int64_t k = 0; k < width; ++k) row[k] *= c[i];
      }
      for (int64_t base = 0; base < n; base += block) {
        for (int64_t h = 1; h < block; h *= 2) {
          for (int64_t i = base; i < base + block; i += 2 * h) {
            for (int64_t j = i; j < i + h; ++j) {
              float* lo = w + j * cols + c0;
              float* hi = w + (j + h) * cols + c0;
              for (int64_t k = 0; k < width; ++k) {
                const float a = lo[k], d = hi[k];
                lo[k] = a + d;
                hi[k] = a - d;
              }
            }
          }
        }
      }
    }
  });
}

void rotate_embedding(const HadamardRotation& rotation, float* embedding, int64_t vocab, int64_t hidden) {
  check_rotation(rotation, "rotate_embedding");
  QSPEC_CHECK(hidden == rotation.n, "rotate_embedding: a ", vocab, " x ", hidden,
              " embedding table does not match the rotation's width ", rotation.n, " (hidden must equal it)");
  transform_rows(rotation, embedding, vocab, /*inverse=*/false, "rotate_embedding");
}

}  // namespace qspec::quant
