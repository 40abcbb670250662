// The CPU 4-bit GEMM kernels (ops/quantized_linear.h): every instruction set this CPU runs gives
// the portable kernels' bits, on odd shapes, group sizes, row and token tails; W4A8 against an
// exact integer reference; batch invariance; and a model forced onto the portable path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/llama.h"
#include "ops/linear.h"
#include "ops/quantized_linear.h"
#include "qspec/error.h"
#include "quant/formats.h"
#include "quant/quantized_linear.h"

namespace {

using qspec::cpu::KernelIsa;
using qspec::quant::Format;

std::vector<float> random_values(size_t count, float stddev, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = normal(generator);
  return values;
}

qspec::QuantizedMatrix random_matrix(Format format, int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
  qspec::WeightMatrix matrix;
  matrix.name = "test.weight";
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.owned = random_values(static_cast<size_t>(rows * cols), 0.1f, seed);
  if (cols >= 16) matrix.owned[3] = 1.5f;  // an outlier
  matrix.data = matrix.owned.data();
  return qspec::quantize_rtn(matrix, format, group);
}

// Restores the kernel choice after a test that forces one.
struct IsaGuard {
  KernelIsa saved = qspec::cpu::kernel_isa();
  ~IsaGuard() { qspec::cpu::set_kernel_isa(saved); }
};

std::vector<KernelIsa> supported_isas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : {KernelIsa::portable, KernelIsa::avx2, KernelIsa::avx_vnni, KernelIsa::avx512_vnni})
    if (qspec::cpu::kernel_isa_supported(isa)) isas.push_back(isa);
  return isas;
}

std::vector<float> run_a16(KernelIsa isa, const std::vector<float>& x, int64_t tokens, const qspec::QuantizedMatrix& w,
                           const float* bias) {
  qspec::cpu::set_kernel_isa(isa);
  std::vector<float> y(static_cast<size_t>(tokens * w.rows), std::numeric_limits<float>::quiet_NaN());
  qspec::cpu::quantized_linear(x.data(), tokens, w, bias, y.data());
  return y;
}

std::vector<float> run_a8(KernelIsa isa, const std::vector<float>& x, int64_t tokens, const qspec::QuantizedMatrix& w,
                          const float* bias) {
  qspec::cpu::set_kernel_isa(isa);
  qspec::cpu::Int8Activations activations;
  qspec::cpu::quantize_activations_int8(x.data(), tokens, w.cols(), activations);
  std::vector<float> y(static_cast<size_t>(tokens * w.rows), std::numeric_limits<float>::quiet_NaN());
  qspec::cpu::quantized_linear(activations, w, bias, y.data());
  return y;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << what << " output " << i;
    ASSERT_EQ(a[i], b[i]) << what << " output " << i;
  }
}

struct Shape {
  Format format;
  int64_t group, rows, cols;
};

// Groups of 2 / 6 (not a multiple of 8: portable only), 8, 32 (two per 64-value chunk in the
// SIMD W4A8; K = 96 is not interleaved: portable W4A8),
// 64, 128; K not a multiple of 64; rows short of the 8-row tile.
const Shape kShapes[] = {
    {Format::int4, 64, 37, 192},  {Format::int4, 128, 8, 256},  {Format::int4, 32, 13, 128},
    {Format::int4, 8, 11, 200},   {Format::int4, 2, 5, 22},     {Format::int4, 6, 9, 96},
    {Format::int4, 32, 3, 96},    {Format::int4_channel, 0, 19, 192}, {Format::int4_channel, 0, 7, 100},
    {Format::nvfp4, 0, 21, 160},  {Format::mxfp4, 0, 17, 224},
    // int4-asym (zero points): the same tiles, tails and group sizes.
    {Format::int4_asym, 64, 37, 192}, {Format::int4_asym, 128, 8, 256}, {Format::int4_asym, 32, 13, 128},
    {Format::int4_asym, 8, 11, 200},  {Format::int4_asym, 6, 9, 96}, {Format::int4_asym, 32, 21, 192},
    {Format::int4, 32, 21, 192},
    // 8+ blocks a row: the W4A8 tile's scales go through its 8 x 8 transpose (and its tail).
    {Format::int4_asym, 32, 19, 576}, {Format::int4, 64, 11, 1536},
    // int4-zp: int4-asym's kernels with minimums -s z.
    {Format::int4_zp, 64, 37, 192}, {Format::int4_zp, 32, 13, 128}, {Format::int4_zp, 64, 19, 576}, {Format::int4_zp, 128, 8, 256},
};

std::string describe(const Shape& s, int64_t tokens) {
  return std::string(qspec::quant::format_name(s.format)) + " g" + std::to_string(s.group) + " " +
         std::to_string(s.rows) + "x" + std::to_string(s.cols) + " tokens " + std::to_string(tokens);
}

}  // namespace

TEST(CpuQ4Kernels, W4A16EveryIsaGivesThePortableBitsAndTheF32GemmOfTheDequantizedWeights) {
  IsaGuard guard;
  for (const Shape& s : kShapes) {
    const int64_t group = s.group > 0 ? s.group : 128;
    const qspec::QuantizedMatrix w = random_matrix(s.format, s.rows, s.cols, group, 7);
    // The dequantized weights through the f32 GEMM: the order the 4-bit kernels keep.
    qspec::WeightMatrix dense;
    dense.rows = s.rows;
    dense.cols = s.cols;
    dense.owned.resize(static_cast<size_t>(s.rows * s.cols));
    for (int64_t r = 0; r < s.rows; ++r) w.dequantize_row(r, dense.owned.data() + r * s.cols);
    dense.data = dense.owned.data();
    // 2-191: tiles of up to 4 tokens (a verify, a short prefill); 192 on: the decoded-rows buffer
    // with tiles of 3 tokens (kManyTokensFrom in q4_kernels_x86.inc).
    for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 31, 64, 150, 192, 197}) {
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * s.cols), 1.0f, 11);
      const std::vector<float> bias = random_values(static_cast<size_t>(s.rows), 1.0f, 13);
      const std::vector<float> portable = run_a16(KernelIsa::portable, x, tokens, w, bias.data());
      for (KernelIsa isa : supported_isas()) {
        const std::string what = describe(s, tokens) + " on " + std::string(qspec::cpu::kernel_isa_name(isa));
        expect_same_bits(run_a16(isa, x, tokens, w, bias.data()), portable, what);
        expect_same_bits(run_a16(isa, x, tokens, w, nullptr), run_a16(KernelIsa::portable, x, tokens, w, nullptr),
                         what + " no bias");
      }
      if (s.cols % 8 == 0) {  // the f32 GEMM's scalar tail differs from an FMA tail
        std::vector<float> reference(portable.size());
        qspec::cpu::linear(x.data(), tokens, dense, bias.data(), reference.data());
#if defined(__AVX2__) && defined(__FMA__)
        expect_same_bits(portable, reference, describe(s, tokens) + " vs the f32 GEMM");
#else
        for (size_t i = 0; i < reference.size(); ++i) ASSERT_NEAR(portable[i], reference[i], 1e-4);
#endif
      }
    }
  }
}

TEST(CpuQ4Kernels, W4A8MatchesTheExactIntegerReferenceOnEveryIsa) {
  IsaGuard guard;
  for (const Shape& s : kShapes) {
    if (s.format != Format::int4 && s.format != Format::int4_channel && !qspec::quant::format_has_min(s.format)) continue;
    const int64_t group = s.group > 0 ? s.group : 128;
    const qspec::QuantizedMatrix w = random_matrix(s.format, s.rows, s.cols, group, 17);
    const int64_t blocks = w.format.blocks(), block = w.format.block;
    for (int64_t tokens : {1, 2, 3, 7}) {
      std::vector<float> x = random_values(static_cast<size_t>(tokens * s.cols), 1.0f, 19);
      x[0] = 40.0f;  // a loud channel: the int8 scale follows it
      const std::vector<float> bias = random_values(static_cast<size_t>(s.rows), 1.0f, 23);
      const std::vector<float> portable = run_a8(KernelIsa::portable, x, tokens, w, bias.data());
      // Reference from the formats: each token's int8 codes and scale, each block's integer sum.
      const qspec::quant::RowFormat x_format =
          qspec::quant::make_row_format(Format::int8, qspec::quant::Role::activation, s.cols);
      std::vector<uint8_t> codes(static_cast<size_t>(s.cols)), scale(4);
      for (int64_t t = 0; t < tokens; ++t) {
        qspec::quant::quantize_row(x_format, x.data() + t * s.cols, codes.data(), scale.data());
        const double s_x = qspec::quant::block_scale(x_format, scale.data(), 0);
        for (int64_t n = 0; n < s.rows; ++n) {
          const uint8_t* w_codes = w.codes.data() + n * w.format.code_bytes();
          const uint8_t* w_scales = w.scales.data() + n * w.format.scale_bytes();
          double expected = 0.0, magnitude = 0.0;
          for (int64_t b = 0; b < blocks; ++b) {
            int64_t sum = 0, code_sum = 0;
            for (int64_t e = b * block; e < (b + 1) * block; ++e) {
              sum += int64_t{static_cast<int8_t>(codes[static_cast<size_t>(e)])} *
                     static_cast<int64_t>(qspec::quant::element_value(w.format, w_codes, e));
              code_sum += static_cast<int8_t>(codes[static_cast<size_t>(e)]);
            }
            const double s_w = qspec::quant::block_scale(w.format, w_scales, b);
            const double m_w = qspec::quant::block_min(w.format, w_scales, b);  // int4-asym; else 0
            expected += s_w * static_cast<double>(sum) + m_w * static_cast<double>(code_sum);
            magnitude += std::fabs(s_w * static_cast<double>(sum)) + std::fabs(m_w * static_cast<double>(code_sum));
          }
          expected = expected * s_x + bias[n];
          magnitude = magnitude * s_x + std::fabs(bias[n]);
          ASSERT_NEAR(portable[t * s.rows + n], expected, 1e-6 * magnitude + 1e-6) << describe(s, tokens);
        }
      }
      for (KernelIsa isa : supported_isas())
        expect_same_bits(run_a8(isa, x, tokens, w, bias.data()), portable,
                         describe(s, tokens) + " on " + std::string(qspec::cpu::kernel_isa_name(isa)));
    }
  }
}

TEST(CpuQ4Kernels, EveryTokenIsComputedAsIfAlone) {
  // QSpec's verify of gamma + 1 tokens must reproduce single-token decode bit for bit.
  IsaGuard guard;
  for (Format format : {Format::int4, Format::int4_asym}) {
  const qspec::QuantizedMatrix w = random_matrix(format, 45, 576, 64, 29);
  const int64_t tokens = 11;
  const std::vector<float> x = random_values(static_cast<size_t>(tokens * 576), 1.0f, 31);
  for (KernelIsa isa : supported_isas()) {
    const std::vector<float> a16 = run_a16(isa, x, tokens, w, nullptr), a8 = run_a8(isa, x, tokens, w, nullptr);
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> alone(x.begin() + t * 576, x.begin() + (t + 1) * 576);
      const std::vector<float> a16_alone = run_a16(isa, alone, 1, w, nullptr), a8_alone = run_a8(isa, alone, 1, w, nullptr);
      for (int64_t n = 0; n < w.rows; ++n) {
        ASSERT_EQ(a16[t * w.rows + n], a16_alone[n]) << qspec::cpu::kernel_isa_name(isa) << " token " << t;
        ASSERT_EQ(a8[t * w.rows + n], a8_alone[n]) << qspec::cpu::kernel_isa_name(isa) << " token " << t;
      }
    }
  }
  }
}

TEST(CpuQ4Kernels, Int8ActivationsHoldTheFormatsCodesAndScale) {
  for (int64_t k : {64, 192, 96, 30}) {
    const int64_t tokens = 3;
    const std::vector<float> x = random_values(static_cast<size_t>(tokens * k), 2.0f, 37);
    qspec::cpu::Int8Activations activations;
    qspec::cpu::quantize_activations_int8(x.data(), tokens, k, activations);
    EXPECT_EQ(activations.interleaved, k % 64 == 0);
    const qspec::quant::RowFormat format = qspec::quant::make_row_format(Format::int8, qspec::quant::Role::activation, k);
    std::vector<uint8_t> codes(static_cast<size_t>(k)), scale(4);
    for (int64_t t = 0; t < tokens; ++t) {
      qspec::quant::quantize_row(format, x.data() + t * k, codes.data(), scale.data());
      EXPECT_EQ(activations.scales[t], qspec::quant::block_scale(format, scale.data(), 0));
      for (int64_t e = 0; e < k; ++e) {
        const int64_t within = e % 64;
        const int64_t position = activations.interleaved ? e - within + (within & 1) * 32 + (within >> 1) : e;
        ASSERT_EQ(activations.codes[t * k + position], static_cast<int8_t>(codes[e])) << "k " << k << " element " << e;
      }
      for (int64_t c = 0; c < (activations.interleaved ? k / 64 : 0); ++c) {
        int32_t sum = 0, half[2] = {0, 0};
        for (int64_t e = c * 64; e < (c + 1) * 64; ++e) {
          sum += static_cast<int8_t>(codes[e]);
          half[(e - c * 64) / 32] += static_cast<int8_t>(codes[e]);
        }
        EXPECT_EQ(activations.chunk_sums[t * (k / 64) + c], sum);
        EXPECT_EQ(activations.half_chunk_sums[t * (k / 32) + 2 * c], half[0]);
        EXPECT_EQ(activations.half_chunk_sums[t * (k / 32) + 2 * c + 1], half[1]);
      }
    }
  }
}

TEST(CpuQ4Kernels, NonIntegerWeightFormatsTakeInt8ActivationsAsTheirValues) {
  // nvfp4 / mxfp4 weights with int8 activations: the float GEMM on codes * scale, which is what
  // fake quantization gives the old path.
  for (Format format : {Format::nvfp4, Format::mxfp4}) {
    const qspec::QuantizedMatrix w = random_matrix(format, 10, 128, 128, 41);
    const int64_t tokens = 3;
    std::vector<float> x = random_values(static_cast<size_t>(tokens * 128), 1.0f, 43);
    const std::vector<float> via_int8 = run_a8(qspec::cpu::kernel_isa(), x, tokens, w, nullptr);
    qspec::ActivationMode mode;
    mode.kind = qspec::ActivationMode::Kind::quantized;
    mode.format = Format::int8;
    qspec::cpu::apply_activation_mode(mode, x.data(), tokens, 128);
    expect_same_bits(via_int8, run_a16(qspec::cpu::kernel_isa(), x, tokens, w, nullptr),
                     std::string(qspec::quant::format_name(format)));
  }
}

TEST(CpuQ4Kernels, KernelChoiceIsCheckedAndNamed) {
  IsaGuard guard;
  EXPECT_TRUE(qspec::cpu::kernel_isa_supported(KernelIsa::portable));
  EXPECT_EQ(qspec::cpu::kernel_isa_name(KernelIsa::avx512_vnni), "avx512-vnni");
  for (KernelIsa isa : {KernelIsa::avx2, KernelIsa::avx_vnni, KernelIsa::avx512_vnni})
    if (!qspec::cpu::kernel_isa_supported(isa)) {
      EXPECT_THROW(qspec::cpu::set_kernel_isa(isa), qspec::Error);
    }
  qspec::cpu::set_kernel_isa(KernelIsa::portable);
  EXPECT_EQ(qspec::cpu::kernel_isa(), KernelIsa::portable);
}

TEST(CpuQ4Kernels, AModelForcedOntoThePortableKernelsGivesTheSameLogits) {
  IsaGuard guard;
  auto model = qspec::LlamaModel::load(QSPEC_SOURCE_DIR "/models/gsm-synth-llama");
  model->quantize_weights(Format::int4);
  const std::vector<int32_t> prompt = {314, 26, 473, 307, 221, 19, 21, 409};
  for (const char* name : {"w4a16", "w4a8"}) {
    qspec::RunMode mode = qspec::parse_run_mode(name);
    mode.activations.group_size = 64;
    std::vector<float> logits[2];
    const KernelIsa isas[2] = {KernelIsa::portable, guard.saved};
    for (int i = 0; i < 2; ++i) {
      qspec::cpu::set_kernel_isa(isas[i]);
      qspec::KvCache cache = model->new_cache(16);
      model->forward(prompt, cache, logits[i], true, mode);
      const int32_t next = 42;
      std::vector<float> step;
      model->forward(std::span<const int32_t>(&next, 1), cache, step, false, mode);
      logits[i].insert(logits[i].end(), step.begin(), step.end());
    }
    expect_same_bits(logits[1], logits[0], std::string(name) + " on " + std::string(qspec::cpu::kernel_isa_name(guard.saved)));
  }
}

TEST(CpuQ4Kernels, FusedCallsGiveEachMatrixItsOwnCallsBits) {
  // q/k/v and gate/up in one parallel region: each output as its own call gives it, on every
  // ISA, for float and int8 activations, 4-bit integer and E2M1 weights; a K that is not the
  // input's is an error naming the matrix.
  IsaGuard guard;
  for (Format format : {Format::int4, Format::int4_asym, Format::nvfp4}) {
    const qspec::QuantizedMatrix q = random_matrix(format, 43, 192, 64, 51), k = random_matrix(format, 8, 192, 64, 52),
                                 v = random_matrix(format, 5, 192, 64, 53);
    const std::vector<float> bias = random_values(43, 1.0f, 54);
    for (int64_t tokens : {1, 3}) {
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * 192), 1.0f, 55);
      for (KernelIsa isa : supported_isas()) {
        const std::string what = std::string(qspec::quant::format_name(format)) + " tokens " + std::to_string(tokens) +
                                 " on " + std::string(qspec::cpu::kernel_isa_name(isa));
        for (bool int8 : {false, true}) {
          std::vector<float> fused[3];
          const qspec::QuantizedMatrix* matrices[3] = {&q, &k, &v};
          qspec::cpu::LinearOutput outputs[3];
          for (int m = 0; m < 3; ++m) {
            fused[m].assign(static_cast<size_t>(tokens * matrices[m]->rows), std::numeric_limits<float>::quiet_NaN());
            outputs[m] = {matrices[m], m == 0 ? bias.data() : nullptr, fused[m].data()};
          }
          qspec::cpu::set_kernel_isa(isa);
          qspec::cpu::Int8Activations activations;
          qspec::cpu::quantize_activations_int8(x.data(), tokens, 192, activations);
          if (int8) qspec::cpu::quantized_linear(activations, outputs);
          else qspec::cpu::quantized_linear(x.data(), tokens, outputs);
          for (int m = 0; m < 3; ++m) {
            const float* b = m == 0 ? bias.data() : nullptr;
            const std::vector<float> alone = int8 ? run_a8(isa, x, tokens, *matrices[m], b) : run_a16(isa, x, tokens, *matrices[m], b);
            expect_same_bits(fused[m], alone, what + (int8 ? " int8" : " float") + " matrix " + std::to_string(m));
          }
        }
      }
    }
  }
  const qspec::QuantizedMatrix narrow = random_matrix(Format::int4, 8, 128, 64, 56), wide = random_matrix(Format::int4, 8, 192, 64, 57);
  std::vector<float> x(192, 1.0f), y1(8), y2(8);
  const qspec::cpu::LinearOutput mixed[2] = {{&wide, nullptr, y1.data()}, {&narrow, nullptr, y2.data()}};
  try {
    qspec::cpu::quantized_linear(x.data(), 1, mixed);
    FAIL() << "matrices of different K in one call";
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find("test.weight: K = 128"), std::string::npos) << error.what();
  }
}

TEST(CpuQ4Kernels, Int8ActivationQuantizerSimdEqualsPortable) {
  // The AVX2 quantizer (k % 64 == 0) against the portable one (quant::quantize_row, then the
  // interleave): codes, scales and sums, with halfway cases, an all-zero token and a loud one;
  // a NaN is refused by both with the quantizer's error.
  IsaGuard guard;
  for (int64_t k : {64, 576, 1536}) {
    const int64_t tokens = 4;
    std::vector<float> x = random_values(static_cast<size_t>(tokens * k), 3.0f, 61);
    for (int64_t e = 0; e < k; ++e) x[static_cast<size_t>(e)] = static_cast<float>(e % 255 - 127) * 0.5f;  // ties at s = 0.5
    for (int64_t e = 0; e < k; ++e) x[static_cast<size_t>(k + e)] = 0.0f;
    x[static_cast<size_t>(2 * k + 5)] = 1e6f;
    qspec::cpu::Int8Activations a[2];
    for (int portable = 0; portable < 2; ++portable) {
      qspec::cpu::set_kernel_isa(portable ? KernelIsa::portable : guard.saved);
      qspec::cpu::quantize_activations_int8(x.data(), tokens, k, a[portable]);
    }
    EXPECT_EQ(a[0].codes, a[1].codes) << "k " << k;
    EXPECT_EQ(a[0].scales, a[1].scales) << "k " << k;
    EXPECT_EQ(a[0].chunk_sums, a[1].chunk_sums) << "k " << k;
    EXPECT_EQ(a[0].half_chunk_sums, a[1].half_chunk_sums) << "k " << k;
    x[static_cast<size_t>(3 * k + 7)] = std::numeric_limits<float>::quiet_NaN();
    for (KernelIsa isa : {guard.saved, KernelIsa::portable}) {
      qspec::cpu::set_kernel_isa(isa);
      qspec::cpu::Int8Activations refused;
      try {
        qspec::cpu::quantize_activations_int8(x.data(), tokens, k, refused);
        FAIL() << "quantized a NaN on " << qspec::cpu::kernel_isa_name(isa);
      } catch (const qspec::Error& error) {
        EXPECT_NE(std::string(error.what()).find("value 7"), std::string::npos) << error.what();
      }
    }
  }
}
