// RMSNorm, RoPE, SwiGLU / GeGLU and soft-capping on the CPU: the elementwise pieces of a transformer layer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "base/thread_pool.h"
#include "ops/activation.h"
#include "ops/quantized_linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace qspec::cpu {
namespace {

// body(begin, end) over [0, count) in chunks on the thread pool: for the activations of a prefill
// or a verify (a 64-token GeGLU of Gemma 3 270M is 131K elements a layer; libm's exp costs ~5 ns
// an element). Below 4096 elements (a small model's decode step) the parallel region costs more
// than it saves. Each element is computed alone, so the values are the single loop's.
template <typename Body>
void for_element_chunks(int64_t count, const Body& body) {
  constexpr int64_t kChunk = 4096;
  if (count <= kChunk) {
    body(int64_t{0}, count);
    return;
  }
  const auto chunks = static_cast<size_t>((count + kChunk - 1) / kChunk);
  ThreadPool::global().parallel_for(chunks, 1, [&](size_t begin, size_t end) {
    body(static_cast<int64_t>(begin) * kChunk, std::min(count, static_cast<int64_t>(end) * kChunk));
  });
}

// GeGLU's gate as g sigmoid(2u) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3): the same
// function as 0.5 g (1 + tanh(u)) (PyTorch's gelu(approximate="tanh")), with one exp and no
// cancellation in 1 + tanh(u) for negative u. exp is Cephes' single-precision polynomial (within
// ~1 ulp) written with explicit fmas, so the scalar and the AVX2 loop give the same bits.
namespace gelu {
constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
// exp's argument stays where 2^n is a normal float (n in -126..127): beyond kMaxArg the gate's
// value is 0 (exp(-2u) > 1e38), below kMinArg it is g (exp(-2u) < 1e-37, 1 + that rounds to 1).
constexpr float kMaxArg = 88.0f, kMinArg = -87.0f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

inline float scalar(float g, float up) {
  const float inner = std::fma(kCubic, (g * g) * g, g);
  const float z_raw = -2.0f * (kSqrt2OverPi * inner);
  if (z_raw > kMaxArg) return 0.0f;
  const float z = std::max(z_raw, kMinArg);
  const float n = std::nearbyint(z * kLog2e);
  float r = std::fma(-n, kLn2Hi, z);
  r = std::fma(-n, kLn2Lo, r);
  float p = std::fma(kP0, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  const float e = std::fma(p, r * r, r) + 1.0f;  // e^r
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof(pow2n));
  return (g / std::fma(e, pow2n, 1.0f)) * up;  // 1 + e^r 2^n in one rounding
}

#if defined(__x86_64__) || defined(_M_X64)
// Eight values of scalar(), lane by lane, in the same operations.
__attribute__((target("avx2,fma"))) inline void eight(const float* gate, const float* up, float* out) {
  const __m256 g = _mm256_loadu_ps(gate), one = _mm256_set1_ps(1.0f);
  const __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(kCubic), _mm256_mul_ps(_mm256_mul_ps(g, g), g), g);
  const __m256 z_raw = _mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_mul_ps(_mm256_set1_ps(kSqrt2OverPi), inner));
  const __m256 zero_out = _mm256_cmp_ps(z_raw, _mm256_set1_ps(kMaxArg), _CMP_GT_OQ);  // the scalar's early 0
  const __m256 z = _mm256_min_ps(_mm256_max_ps(z_raw, _mm256_set1_ps(kMinArg)), _mm256_set1_ps(kMaxArg));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), z);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kP0), r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
  const __m256 pow2n =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  const __m256 value = _mm256_mul_ps(_mm256_div_ps(g, _mm256_fmadd_ps(e, pow2n, one)), _mm256_loadu_ps(up));
  _mm256_storeu_ps(out, _mm256_andnot_ps(zero_out, value));
}

__attribute__((target("avx2,fma"))) void avx2(const float* gate, const float* up, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) eight(gate + i, up + i, out + i);
  if (i < count) {  // the tail through the same code, padded
    float g[8] = {}, u[8] = {}, y[8];
    std::memcpy(g, gate + i, static_cast<size_t>(count - i) * sizeof(float));
    std::memcpy(u, up + i, static_cast<size_t>(count - i) * sizeof(float));
    eight(g, u, y);
    std::memcpy(out + i, y, static_cast<size_t>(count - i) * sizeof(float));
  }
}
#endif
}  // namespace gelu

}  // namespace

void rmsnorm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* y) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = x + row * dim;
    float* out = y + row * dim;
    float sum_squares = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum_squares += in[i] * in[i];
    // transformers: x * rsqrt(mean(x^2) + eps) in f32, then times the weight.
    const float inverse_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(dim) + static_cast<float>(eps));
    for (int64_t i = 0; i < dim; ++i) out[i] = (in[i] * inverse_rms) * weight[i];
  }
}

void rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, float attention_scaling) {
  const int64_t half = head_dim / 2;
  float cos_table[512], sin_table[512];  // head_dim <= 1024 is checked by the model loader
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos_table[i] = std::cos(angle) * attention_scaling;
      sin_table[i] = std::sin(angle) * attention_scaling;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* head = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float first = head[i], second = head[i + half];
        head[i] = first * cos_table[i] - second * sin_table[i];
        head[i + half] = second * cos_table[i] + first * sin_table[i];
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t count, float* out) {
  for_element_chunks(count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out) {
#if defined(__x86_64__) || defined(_M_X64)
  if (kernel_isa() != KernelIsa::portable) {
    for_element_chunks(count, [&](int64_t begin, int64_t end) {
      gelu::avx2(gate + begin, up + begin, end - begin, out + begin);
    });
    return;
  }
#endif
  for_element_chunks(count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = gelu::scalar(gate[i], up[i]);
  });
}

void soft_cap(float* x, int64_t count, float cap) {
  for_element_chunks(count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] = cap * std::tanh(x[i] / cap);
  });
}

}  // namespace qspec::cpu
