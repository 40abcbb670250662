// 4-bit linear layers: RTN quantization of checkpoint matrices, the fast dequantization the
// CPU GEMM uses (bit for bit the formats reference), the GEMM against a float64 reference,
// run-mode parsing, and a model running every mode from one loaded weight set.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/quantized_linear.h"
#include "model/llama.h"
#include "qspec/error.h"
#include "quant/quantized_linear.h"

namespace {

std::mt19937& rng() {
  static std::mt19937 generator(std::random_device{}());
  return generator;
}

std::vector<float> random_values(size_t count, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng());
  return values;
}

qspec::WeightMatrix f32_matrix(const std::vector<float>& values, int64_t rows, int64_t cols) {
  qspec::WeightMatrix matrix;
  matrix.name = "test.weight";
  matrix.dtype = qspec::DType::F32;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.owned = values;
  matrix.data = matrix.owned.data();
  return matrix;
}

const qspec::quant::Format kWeightFormats[] = {qspec::quant::Format::int4, qspec::quant::Format::int4_channel,
                                               qspec::quant::Format::nvfp4, qspec::quant::Format::mxfp4,
                                               qspec::quant::Format::int4_asym};

}  // namespace

TEST(QuantizedLinear, RunModesParseAndUnknownNamesAreErrors) {
  EXPECT_FALSE(qspec::parse_run_mode("w16a16").quantized_weights);
  EXPECT_TRUE(qspec::parse_run_mode("w4a16").quantized_weights);
  EXPECT_EQ(qspec::parse_run_mode("w4a16").activations.kind, qspec::ActivationMode::Kind::f16);
  EXPECT_EQ(qspec::parse_run_mode("w4a8").activations.format, qspec::quant::Format::int8);
  EXPECT_EQ(qspec::parse_run_mode("w4a8-fp8").activations.format, qspec::quant::Format::fp8);
  EXPECT_EQ(qspec::parse_run_mode("w4a4").name, "w4a4-int4");
  EXPECT_EQ(qspec::parse_run_mode("w4a4-nvfp4").activations.format, qspec::quant::Format::nvfp4);
  EXPECT_EQ(qspec::parse_run_mode("w4a4-mxfp4").activations.format, qspec::quant::Format::mxfp4);
  try {
    qspec::parse_run_mode("w3a7");
    FAIL() << "no error";
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find("w3a7"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("w4a16"), std::string::npos);
  }
}

TEST(QuantizedLinear, FastDequantizationEqualsTheFormatReferenceBitForBit) {
  for (auto format : kWeightFormats) {
    const int64_t rows = 5, cols = 256;
    std::vector<float> values = random_values(static_cast<size_t>(rows * cols), 0.05f);
    values[7] = 0.9f;  // an outlier
    for (int64_t c = 0; c < 64; ++c) values[static_cast<size_t>(2 * cols + c)] = 0.0f;  // a zero block
    qspec::QuantizedMatrix matrix = qspec::quantize_rtn(f32_matrix(values, rows, cols), format, 64);
    std::vector<float> fast(static_cast<size_t>(cols)), reference(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      matrix.dequantize_row(r, fast.data());
      qspec::quant::dequantize_row(matrix.format, matrix.codes.data() + r * matrix.format.code_bytes(),
                                   matrix.scales.data() + r * matrix.format.scale_bytes(), reference.data());
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(fast[c], reference[c]) << qspec::quant::format_name(format) << " row " << r << " col " << c;
    }
    // RTN error is bounded: no dequantized value is further from its input than the row's
    // largest magnitude (a loose bound every 4-bit format meets; the formats test has the
    // tight per-format ones).
    for (int64_t r = 0; r < rows; ++r) {
      matrix.dequantize_row(r, fast.data());
      float amax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(values[r * cols + c]));
      for (int64_t c = 0; c < cols; ++c) ASSERT_LE(std::fabs(fast[c] - values[r * cols + c]), amax);
    }
  }
}

TEST(QuantizedLinear, GemmMatchesFloat64ReferenceOnOddShapes) {
  for (auto format : kWeightFormats) {
    for (int64_t tokens : {1, 3, 17}) {
      const int64_t rows = 37, cols = 192;  // rows not a multiple of the 8-row block
      std::vector<float> weights = random_values(static_cast<size_t>(rows * cols), 0.1f);
      qspec::QuantizedMatrix matrix = qspec::quantize_rtn(f32_matrix(weights, rows, cols), format, 32);
      std::vector<float> x = random_values(static_cast<size_t>(tokens * cols));
      std::vector<float> bias = random_values(static_cast<size_t>(rows));
      std::vector<float> y(static_cast<size_t>(tokens * rows), std::numeric_limits<float>::quiet_NaN());
      qspec::cpu::quantized_linear(x.data(), tokens, matrix, bias.data(), y.data());
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t n = 0; n < rows; ++n) {
        matrix.dequantize_row(n, row.data());
        for (int64_t t = 0; t < tokens; ++t) {
          double expected = bias[n], magnitude = std::fabs(bias[n]);
          for (int64_t k = 0; k < cols; ++k) {
            expected += static_cast<double>(x[t * cols + k]) * row[k];
            magnitude += std::fabs(static_cast<double>(x[t * cols + k]) * row[k]);
          }
          const float got = y[t * rows + n];
          ASSERT_TRUE(std::isfinite(got)) << "unwritten output " << t << "," << n;
          ASSERT_NEAR(got, expected, 1e-5 * magnitude + 1e-6) << qspec::quant::format_name(format);
        }
      }
    }
  }
}

// --cpu-f32-weights: the decoded cache must change speed only, never a bit of the output.
TEST(QuantizedLinear, F32WeightCacheGivesBitIdenticalOutputs) {
  struct CacheOff {
    ~CacheOff() { qspec::cpu::set_f32_weight_cache(false); }
  } restore;
  for (auto format : kWeightFormats) {
    const int64_t rows = 29, cols = 128, tokens = 5;
    std::vector<float> weights = random_values(static_cast<size_t>(rows * cols), 0.1f);
    qspec::cpu::set_f32_weight_cache(false);
    qspec::QuantizedMatrix plain = qspec::quantize_rtn(f32_matrix(weights, rows, cols), format, 32);
    qspec::cpu::set_f32_weight_cache(true);
    qspec::QuantizedMatrix cached = qspec::quantize_rtn(f32_matrix(weights, rows, cols), format, 32);
    ASSERT_TRUE(plain.decoded.empty());
    ASSERT_EQ(cached.decoded.size(), static_cast<size_t>(rows * cols));
    std::vector<float> x = random_values(static_cast<size_t>(tokens * cols));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> y_plain(static_cast<size_t>(tokens * rows), nan), y_cached(y_plain.size(), nan);
    qspec::cpu::quantized_linear(x.data(), tokens, plain, nullptr, y_plain.data());
    qspec::cpu::quantized_linear(x.data(), tokens, cached, nullptr, y_cached.data());
    for (size_t i = 0; i < y_plain.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y_plain[i])) << i;
      ASSERT_EQ(y_plain[i], y_cached[i]) << qspec::quant::format_name(format) << " output " << i;
    }
  }
}

TEST(QuantizedLinear, RejectsShapesTheFormatCannotHoldNamingTheMatrix) {
  std::vector<float> weights = random_values(4 * 100);
  try {
    qspec::quantize_rtn(f32_matrix(weights, 4, 100), qspec::quant::Format::nvfp4);
    FAIL() << "no error";
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find("test.weight"), std::string::npos) << error.what();
  }
  EXPECT_THROW(qspec::quantize_rtn(f32_matrix(weights, 4, 100), qspec::quant::Format::int8), qspec::Error);
}

TEST(QuantizedLinear, ActivationModesQuantizePerTokenIndependently) {
  // A token's quantized values must not depend on the other tokens of its batch.
  for (const std::string& name : qspec::run_mode_names()) {
    qspec::RunMode mode = qspec::parse_run_mode(name);
    mode.activations.group_size = 64;
    const int64_t k = 256;
    std::vector<float> batch = random_values(3 * k);
    for (int64_t i = 0; i < k; ++i) batch[2 * k + i] *= 100.0f;  // a loud neighbour
    std::vector<float> alone(batch.begin(), batch.begin() + k);
    qspec::cpu::apply_activation_mode(mode.activations, batch.data(), 3, k);
    qspec::cpu::apply_activation_mode(mode.activations, alone.data(), 1, k);
    for (int64_t i = 0; i < k; ++i) ASSERT_EQ(batch[i], alone[i]) << name;
  }
}

TEST(QuantizedLinear, OneLoadedModelRunsEveryMode) {
  auto model = qspec::LlamaModel::load(QSPEC_SOURCE_DIR "/models/gsm-synth-llama");
  EXPECT_EQ(model->auto_group_size(), 64);  // intermediate 704 = 11 x 64
  const std::vector<int32_t> prompt = {314, 26, 473, 307, 221, 19, 21, 409};
  std::vector<float> reference;
  {
    qspec::KvCache cache = model->new_cache(16);
    model->forward(prompt, cache, reference);
  }
  // 4-bit modes need quantized weights first.
  {
    qspec::KvCache cache = model->new_cache(16);
    std::vector<float> logits;
    EXPECT_THROW(model->forward(prompt, cache, logits, false, qspec::parse_run_mode("w4a16")), qspec::Error);
  }
  model->quantize_weights(qspec::quant::Format::int4);
  EXPECT_EQ(model->quantized_format(), "int4 g64 rtn");
  EXPECT_LT(model->quantized_weight_bytes(), model->weight_bytes() / 3);
  double scale = 0.0;
  for (float v : reference) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (const std::string& name : qspec::run_mode_names()) {
    qspec::RunMode mode = qspec::parse_run_mode(name);
    mode.activations.group_size = 64;
    qspec::KvCache cache = model->new_cache(16);
    std::vector<float> logits;
    if (mode.activations.arc) {  // needs ARC calibration, which RTN weights do not have
      EXPECT_THROW(model->forward(prompt, cache, logits, false, mode), qspec::Error) << name;
      continue;
    }
    model->forward(prompt, cache, logits, false, mode);
    ASSERT_EQ(logits.size(), reference.size());
    double max_diff = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      ASSERT_TRUE(std::isfinite(logits[i])) << name;
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(logits[i]) - reference[i]));
    }
    if (name == "w16a16") {
      EXPECT_EQ(max_diff, 0.0);  // the checkpoint weights are untouched by quantize_weights
    } else {
      // Quantization moves logits, but a 4-bit model stays the same model: the top token
      // of this confident position (top-1 logit ~20, next ~2) survives every mode.
      EXPECT_GT(max_diff, 0.0) << name;
      EXPECT_LT(max_diff, 0.5 * scale) << name;
      EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(),
                std::max_element(reference.begin(), reference.end()) - reference.begin())
          << name;
    }
  }
}
