// The CPU 4-bit-weight GEMM and activation modes (ops/quantized_linear.h): the weights stay
// packed and are decoded inside the kernels (ops/cpu/q4_kernels.h), chosen at run time; the
// CPU twin of the CUDA GEMMs in ops/cuda/gemm_*.h.
#include "ops/quantized_linear.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "base/thread_pool.h"
#include "ops/cpu/q4_kernels.h"
#include "qspec/error.h"
#include "quant/formats.h"

namespace qspec {

namespace cpu {

void round_to_f16(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  // vcvtps2ph rounds to nearest even, as f32_to_f16 does; the two differ only in a NaN's payload.
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
#endif
  for (; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

void apply_activation_mode(const ActivationMode& mode, float* x, int64_t tokens, int64_t k) {
  switch (mode.kind) {
    case ActivationMode::Kind::f32:
      return;
    case ActivationMode::Kind::f16:
      round_to_f16(x, tokens * k);
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

// ---- kernel choice ----------------------------------------------------------------------------

namespace {

constexpr KernelIsa kIsas[] = {KernelIsa::portable, KernelIsa::avx2, KernelIsa::avx_vnni, KernelIsa::avx512_vnni};

KernelIsa best_supported() {
  KernelIsa best = KernelIsa::portable;
  for (KernelIsa isa : kIsas)
    if (kernel_isa_supported(isa)) best = isa;
  return best;
}

KernelIsa initial_isa() {
  const char* forced = std::getenv("QSPEC_CPU_KERNELS");
  if (forced == nullptr || *forced == '\0') return best_supported();
  for (KernelIsa isa : kIsas)
    if (kernel_isa_name(isa) == forced) {
      QSPEC_CHECK(kernel_isa_supported(isa), "QSPEC_CPU_KERNELS=", forced, ": this CPU cannot run those kernels");
      return isa;
    }
  fail("QSPEC_CPU_KERNELS=", forced, ": unknown kernel set (portable, avx2, avx-vnni, avx512-vnni)");
}

std::atomic<int> current_isa{-1};  // -1: not chosen yet

}  // namespace

const q4::Kernels& q4::kernels_for(KernelIsa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(_M_X64)
    case KernelIsa::avx2:
      return q4::avx2_kernels();
    case KernelIsa::avx_vnni:
      return q4::avx_vnni_kernels();
    case KernelIsa::avx512_vnni:
      return q4::avx512_vnni_kernels();
#endif
    default:
      return q4::portable_kernels();
  }
}

std::string_view kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::portable: return "portable";
    case KernelIsa::avx2: return "avx2";
    case KernelIsa::avx_vnni: return "avx-vnni";
    case KernelIsa::avx512_vnni: return "avx512-vnni";
  }
  return "?";
}

#if defined(__x86_64__) || defined(_M_X64)
// AVX-VNNI (the VEX-coded dot products): CPUID leaf 7, subleaf 1, EAX bit 4. Read directly:
// clang 14's __builtin_cpu_supports does not know the feature. Its registers are AVX2's, whose
// OS support the caller checks.
static bool has_avx_vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
  return (eax >> 4) & 1u;
}
#endif

bool kernel_isa_supported(KernelIsa isa) {
  if (isa == KernelIsa::portable) return true;
#if defined(__x86_64__) || defined(_M_X64)
  // __builtin_cpu_supports also checks that the OS saves the vector registers (XCR0).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  switch (isa) {
    case KernelIsa::avx2: return avx2;
    case KernelIsa::avx_vnni: return avx2 && has_avx_vnni();
    case KernelIsa::avx512_vnni:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    default: return false;
  }
#else
  return false;
#endif
}

KernelIsa kernel_isa() {
  int isa = current_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    isa = static_cast<int>(initial_isa());
    current_isa.store(isa, std::memory_order_relaxed);
  }
  return static_cast<KernelIsa>(isa);
}

void set_kernel_isa(KernelIsa isa) {
  QSPEC_CHECK(kernel_isa_supported(isa), "CPU kernels '", kernel_isa_name(isa), "': this CPU cannot run them");
  current_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

// ---- the GEMMs --------------------------------------------------------------------------------

using q4::kernels_for;

namespace {

q4::A16Problem a16_problem(const float* x, int64_t tokens, const LinearOutput& out) {
  q4::A16Problem problem{x, tokens, out.weight, out.bias, out.y, {}};
  // The element value of each code, as QuantizedMatrix::dequantize_row decodes it.
  for (uint8_t code = 0; code < 16; ++code)
    problem.nibble_values[code] = quant::element_value(out.weight->format, &code, 0);
  return problem;
}

// int8-group weights (8-bit tensors beside the 4-bit ones, quant/formats.h) take the int8-block
// GEMM over their codes and decoded scales: the same f32 order as the 4-bit kernels.
bool int8_group(const QuantizedMatrix& weight) { return weight.format.format == quant::Format::int8_group; }

q4::I8Problem i8_problem(const float* x, int64_t tokens, const LinearOutput& out) {
  const QuantizedMatrix& w = *out.weight;
  QSPEC_CHECK(w.block_scale_values.size() == static_cast<size_t>(w.rows * w.format.blocks()), w.name,
              ": int8-group scales not decoded (QuantizedMatrix::prepare)");
  const Int8BlockView view{reinterpret_cast<const int8_t*>(w.codes.data()), w.block_scale_values.data(), w.rows,
                           w.cols(), w.format.block};
  return q4::I8Problem{x, tokens, view, out.bias, out.y};
}

void check_fused(std::span<const LinearOutput> outputs, int64_t k) {
  QSPEC_CHECK(outputs.size() <= q4::kMaxFused, "quantized_linear: ", outputs.size(), " matrices in one call (at most ",
              q4::kMaxFused, ")");
  for (const LinearOutput& out : outputs)
    QSPEC_CHECK(out.weight->cols() == k, out.weight->name, ": K = ", out.weight->cols(), " in a call whose input has ",
                k, " values a token");
}

}  // namespace

void quantized_linear(const float* x, int64_t tokens, const QuantizedMatrix& weight, const float* bias, float* y) {
  const LinearOutput out{&weight, bias, y};
  quantized_linear(x, tokens, std::span<const LinearOutput>(&out, 1));
}

void quantized_linear(const float* x, int64_t tokens, std::span<const LinearOutput> outputs) {
  if (tokens <= 0 || outputs.empty()) return;
  const int64_t k = outputs[0].weight->cols();
  check_fused(outputs, k);
  q4::A16Problem problems[q4::kMaxFused];
  q4::I8Problem int8_problems[q4::kMaxFused];
  bool int8[q4::kMaxFused];
  const q4::Kernels* kernels[q4::kMaxFused];
  int64_t rows[q4::kMaxFused];
  for (size_t m = 0; m < outputs.size(); ++m) {
    int8[m] = int8_group(*outputs[m].weight);
    if (int8[m]) {
      int8_problems[m] = i8_problem(x, tokens, outputs[m]);
      kernels[m] = q4::i8_simd_fits(int8_problems[m]) ? &kernels_for(kernel_isa()) : &q4::portable_kernels();
    } else {
      problems[m] = a16_problem(x, tokens, outputs[m]);
      kernels[m] = q4::a16_simd_fits(problems[m]) ? &kernels_for(kernel_isa()) : &q4::portable_kernels();
    }
    rows[m] = outputs[m].weight->rows;
  }
  q4::for_row_blocks_of(rows, outputs.size(), k * tokens, [&](size_t m, int64_t begin, int64_t end) {
    if (int8[m])
      kernels[m]->i8(int8_problems[m], begin, end);
    else
      kernels[m]->a16(problems[m], begin, end);
  });
}

#if defined(__AVX2__) && defined(__FMA__)
namespace {

// One token of quantize_activations_int8 in AVX2 when k % 64 == 0: quant::quantize_row's int8
// arithmetic (amax, s = amax / 127, clamp(round_half_even(x / s))) on eight values at a time,
// read straight into the interleaved order (each chunk's evens, then its odds). False (nothing
// written) when a value is not finite: the portable path then names it.
bool quantize_token_int8_avx2(const float* x, int64_t k, int8_t* codes, float* scale, int32_t* chunk_sums,
                              int32_t* half_sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256 amax = _mm256_setzero_ps();
  __m256i non_finite = _mm256_setzero_si256();
  for (int64_t i = 0; i < k; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(v), exponent);
    non_finite = _mm256_or_si256(non_finite, _mm256_cmpeq_epi32(bits, exponent));
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
  }
  if (!_mm256_testz_si256(non_finite, non_finite)) return false;
  float lanes[8];
  _mm256_storeu_ps(lanes, amax);
  float row_amax = 0.0f;
  for (float lane : lanes) row_amax = std::max(row_amax, lane);
  const float s = row_amax / 127.0f;
  *scale = s;
  const __m256 divisor = _mm256_set1_ps(s), low = _mm256_set1_ps(-127.0f), high = _mm256_set1_ps(127.0f);
  // Codes of 8 values: x / s rounded half to even (the default rounding mode's nearbyint), clamped.
  auto encode = [&](__m256 v) {
    if (s == 0.0f) return _mm256_setzero_si256();
    const __m256 rounded = _mm256_round_ps(_mm256_div_ps(v, divisor), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rounded, low), high));
  };
  // 32 int32 codes (four registers, in order) as 32 bytes in order.
  auto pack = [](__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  };
  auto lane_sum = [](__m256i v) {
    int32_t lanes32[8];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes32), v);
    int32_t sum = 0;
    for (int32_t lane : lanes32) sum += lane;
    return sum;
  };
  for (int64_t c = 0; c < k / 64; ++c) {
    __m256i even[4], odd[4];
    for (int j = 0; j < 4; ++j) {  // values 16j .. 16j + 15 of the chunk
      const __m256 a = _mm256_loadu_ps(x + c * 64 + 16 * j), b = _mm256_loadu_ps(x + c * 64 + 16 * j + 8);
      // [a0 a2 b0 b2 | a4 a6 b4 b6] -> a0 a2 a4 a6 b0 b2 b4 b6 (64-bit units 0, 2, 1, 3)
      const __m256 evens = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
      const __m256 odds = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
      even[j] = encode(evens);
      odd[j] = encode(odds);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + c * 64), pack(even[0], even[1], even[2], even[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + c * 64 + 32), pack(odd[0], odd[1], odd[2], odd[3]));
    // Values 0..31 of the chunk are evens and odds 0..15: registers 0 and 1 of each.
    const int32_t first = lane_sum(_mm256_add_epi32(_mm256_add_epi32(even[0], even[1]), _mm256_add_epi32(odd[0], odd[1])));
    const int32_t second = lane_sum(_mm256_add_epi32(_mm256_add_epi32(even[2], even[3]), _mm256_add_epi32(odd[2], odd[3])));
    half_sums[2 * c] = first;
    half_sums[2 * c + 1] = second;
    chunk_sums[c] = first + second;
  }
  return true;
}

}  // namespace
#endif

void quantize_activations_int8(const float* x, int64_t tokens, int64_t k, Int8Activations& out) {
  const quant::RowFormat format = quant::make_row_format(quant::Format::int8, quant::Role::activation, k);
  out.tokens = tokens;
  out.k = k;
  out.interleaved = k % 64 == 0;
  const int64_t chunks = k / 64;
  out.codes.resize(static_cast<size_t>(tokens * k));
  out.scales.resize(static_cast<size_t>(tokens));
  out.chunk_sums.resize(static_cast<size_t>(tokens * chunks));
  out.half_chunk_sums.resize(static_cast<size_t>(tokens * chunks * 2));
  [[maybe_unused]] const bool simd = out.interleaved && kernel_isa() != KernelIsa::portable;
  ThreadPool::global().parallel_for(static_cast<size_t>(tokens), 1, [&](size_t begin, size_t end) {
    thread_local std::vector<uint8_t> codes;
    codes.resize(static_cast<size_t>(format.code_bytes()));
    uint8_t scale[4];
    for (int64_t t = static_cast<int64_t>(begin); t < static_cast<int64_t>(end); ++t) {
#if defined(__AVX2__) && defined(__FMA__)
      if (simd && quantize_token_int8_avx2(x + t * k, k, out.codes.data() + t * k, &out.scales[static_cast<size_t>(t)],
                                           out.chunk_sums.data() + t * chunks, out.half_chunk_sums.data() + t * chunks * 2))
        continue;
#endif
      quant::quantize_row(format, x + t * k, codes.data(), scale);
      out.scales[static_cast<size_t>(t)] = quant::block_scale(format, scale, 0);
      int8_t* row = out.codes.data() + t * k;
      if (!out.interleaved) {
        for (int64_t e = 0; e < k; ++e) row[e] = static_cast<int8_t>(codes[static_cast<size_t>(e)]);
        continue;
      }
      for (int64_t c = 0; c < chunks; ++c) {
        int32_t half[2] = {0, 0};
        for (int64_t i = 0; i < 64; ++i) {
          const int8_t code = static_cast<int8_t>(codes[static_cast<size_t>(c * 64 + i)]);
          row[c * 64 + (i & 1) * 32 + (i >> 1)] = code;  // evens, then odds
          half[i / 32] += code;
        }
        out.half_chunk_sums[static_cast<size_t>(t * chunks * 2 + 2 * c)] = half[0];
        out.half_chunk_sums[static_cast<size_t>(t * chunks * 2 + 2 * c + 1)] = half[1];
        out.chunk_sums[static_cast<size_t>(t * chunks + c)] = half[0] + half[1];
      }
    }
  });
}

namespace {
bool integer_weights(const QuantizedMatrix& weight) {
  const quant::Format format = weight.format.format;
  return format == quant::Format::int4 || format == quant::Format::int4_channel || quant::format_has_min(format) ||
         format == quant::Format::int8_group;
}
}  // namespace

void quantized_linear(const Int8Activations& x, std::span<const LinearOutput> outputs) {
  if (x.tokens <= 0 || outputs.empty()) return;
  check_fused(outputs, x.k);
  bool integer = true;
  for (const LinearOutput& out : outputs) integer = integer && integer_weights(*out.weight);
  if (!integer) {  // E2M1 weights take the float GEMM: one call each
    for (const LinearOutput& out : outputs) quantized_linear(x, *out.weight, out.bias, out.y);
    return;
  }
  q4::A8Problem problems[q4::kMaxFused];
  const q4::Kernels* kernels[q4::kMaxFused];
  int64_t rows[q4::kMaxFused];
  for (size_t m = 0; m < outputs.size(); ++m) {
    problems[m] = q4::A8Problem{&x, outputs[m].weight, outputs[m].bias, outputs[m].y};
    kernels[m] = q4::a8_simd_fits(problems[m]) ? &kernels_for(kernel_isa()) : &q4::portable_kernels();
    rows[m] = outputs[m].weight->rows;
  }
  q4::for_row_blocks_of(rows, outputs.size(), x.k * x.tokens, [&](size_t m, int64_t begin, int64_t end) {
    kernels[m]->a8(problems[m], begin, end);
  });
}

void quantized_linear(const Int8Activations& x, const QuantizedMatrix& weight, const float* bias, float* y) {
  QSPEC_CHECK(x.k == weight.cols(), weight.name, ": int8 activations of ", x.k, " values a token for K = ",
              weight.cols());
  if (x.tokens <= 0 || weight.rows == 0) return;
  if (!integer_weights(weight)) {
    // E2M1 weights: x's dequantized values (codes * scale, in plain order) through the float GEMM.
    thread_local std::vector<float> values;
    values.resize(static_cast<size_t>(x.tokens * x.k));
    for (int64_t t = 0; t < x.tokens; ++t)
      for (int64_t e = 0; e < x.k; ++e) {
        const int64_t within = e % 64;
        const int64_t position = x.interleaved ? e - within + (within & 1) * 32 + (within >> 1) : e;
        values[static_cast<size_t>(t * x.k + e)] =
            static_cast<float>(x.codes[static_cast<size_t>(t * x.k + position)]) * x.scales[static_cast<size_t>(t)];
      }
    quantized_linear(values.data(), x.tokens, weight, bias, y);
    return;
  }
  const LinearOutput out{&weight, bias, y};
  quantized_linear(x, std::span<const LinearOutput>(&out, 1));
}

}  // namespace cpu

}  // namespace qspec
