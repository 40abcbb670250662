// GPTQ: bit-identical to RTN when the Hessian has no cross terms, clearly lower output error
// than RTN on correlated calibration data with outlier channels, stored codes that decode to
// exactly the values the error propagation used, the Hessian accumulator, and the errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "qspec/error.h"
#include "quant/gptq.h"
#include "quant/quantized_linear.h"

namespace {

using qspec::quant::Format;

std::vector<float> normal_values(std::mt19937& rng, size_t count, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

qspec::WeightMatrix f32_matrix(const std::string& name, const std::vector<float>& values, int64_t rows,
                               int64_t cols) {
  qspec::WeightMatrix matrix;
  matrix.name = name;
  matrix.dtype = qspec::DType::F32;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.owned = values;
  matrix.data = matrix.owned.data();
  return matrix;
}

struct FormatCase {
  Format format;
  int64_t group_size;
  std::string label() const {
    std::string name(qspec::quant::format_name(format));
    if (qspec::quant::format_has_groups(format)) name += " g" + std::to_string(group_size);
    return name;
  }
};

const FormatCase kFormats[] = {
    {Format::int4, 32}, {Format::int4, 128}, {Format::int4_channel, 128}, {Format::nvfp4, 128}, {Format::mxfp4, 128},
    {Format::int4_asym, 32}, {Format::int4_asym, 128}, {Format::int4_zp, 64},
};

std::vector<float> dequantized(const qspec::QuantizedMatrix& matrix) {
  std::vector<float> out(static_cast<size_t>(matrix.rows * matrix.cols()));
  for (int64_t r = 0; r < matrix.rows; ++r) matrix.dequantize_row(r, out.data() + r * matrix.cols());
  return out;
}

// Calibration inputs X = Z A (correlated channels) with a few outlier channels scaled 10-50x.
std::vector<float> calibration_inputs(std::mt19937& rng, int64_t samples, int64_t k) {
  std::vector<float> z = normal_values(rng, static_cast<size_t>(samples * k), 1.0f);
  std::vector<float> a = normal_values(rng, static_cast<size_t>(k * k), 1.0f / std::sqrt(static_cast<float>(k)));
  for (int64_t i = 0; i < k; ++i) a[static_cast<size_t>(i * k + i)] += 0.5f;
  std::vector<double> channel_scale(static_cast<size_t>(k), 1.0);
  std::uniform_int_distribution<int64_t> channel(0, k - 1);
  std::uniform_real_distribution<double> magnitude(10.0, 50.0);
  for (int outlier = 0; outlier < 4; ++outlier) channel_scale[static_cast<size_t>(channel(rng))] = magnitude(rng);
  std::vector<float> x(static_cast<size_t>(samples * k));
  std::vector<double> row(static_cast<size_t>(k));
  for (int64_t s = 0; s < samples; ++s) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t m = 0; m < k; ++m) {
      const double zm = z[static_cast<size_t>(s * k + m)];
      for (int64_t j = 0; j < k; ++j) row[static_cast<size_t>(j)] += zm * a[static_cast<size_t>(m * k + j)];
    }
    for (int64_t j = 0; j < k; ++j)
      x[static_cast<size_t>(s * k + j)] = static_cast<float>(row[static_cast<size_t>(j)] * channel_scale[static_cast<size_t>(j)]);
  }
  return x;
}

// ||X W^T - X V^T||_F in f64.
double output_error(const std::vector<float>& x, int64_t samples, const std::vector<float>& w,
                    const std::vector<float>& v, int64_t rows, int64_t k) {
  double total = 0.0;
  for (int64_t s = 0; s < samples; ++s)
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j)
        sum += static_cast<double>(x[static_cast<size_t>(s * k + j)]) *
               (static_cast<double>(w[static_cast<size_t>(r * k + j)]) - v[static_cast<size_t>(r * k + j)]);
      total += sum * sum;
    }
  return std::sqrt(total);
}

template <typename Fn>
void expect_error_naming(Fn&& fn, const std::string& name, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "no error (expected one mentioning '" << fragment << "')";
  } catch (const qspec::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

}  // namespace

TEST(GptqHessian, AccumulatorMatchesDirectTwoOverNXtX) {
  std::mt19937 rng(1234);
  const int64_t k = 48, first = 37, second = 91;
  std::vector<float> x = normal_values(rng, static_cast<size_t>((first + second) * k), 2.0f);
  for (int64_t s = 0; s < first + second; s += 5) x[static_cast<size_t>(s * k + 3)] = 0.0f;
  qspec::HessianAccumulator accumulator(k);
  EXPECT_EQ(accumulator.samples(), 0);
  accumulator.add(x.data(), first);
  accumulator.add(x.data() + first * k, second);
  EXPECT_EQ(accumulator.samples(), first + second);
  const std::vector<double> h = accumulator.hessian();
  ASSERT_EQ(h.size(), static_cast<size_t>(k * k));
  const int64_t n = first + second;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      long double direct = 0.0L;
      for (int64_t s = 0; s < n; ++s)
        direct += static_cast<long double>(x[static_cast<size_t>(s * k + i)]) * x[static_cast<size_t>(s * k + j)];
      const double expected = static_cast<double>(2.0L * direct / static_cast<long double>(n));
      ASSERT_NEAR(h[static_cast<size_t>(i * k + j)], expected, 1e-12 * (1.0 + std::fabs(expected))) << i << "," << j;
    }

  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(accumulator.add(x.data(), 1), qspec::Error);
  EXPECT_EQ(accumulator.samples(), n);  // nothing added
  EXPECT_THROW(qspec::HessianAccumulator(0), qspec::Error);
}

// With no cross terms in H nothing propagates, so GPTQ must be RTN bit for bit, whatever the
// processing order (a random positive diagonal reorders columns under act_order).
TEST(GptqRtnEquivalence, DiagonalHessianGivesRtnCodesAndScales) {
  std::mt19937 rng(42);
  const int64_t rows = 37, k = 256;  // 37: a partial row tile
  std::vector<float> w = normal_values(rng, static_cast<size_t>(rows * k), 0.05f);
  w[11] = 1.3f;
  w[static_cast<size_t>(5 * k + 200)] = -0.9f;
  for (int64_t c = 0; c < 32; ++c) w[static_cast<size_t>(3 * k + 64 + c)] = 0.0f;  // a zero block
  std::uniform_real_distribution<double> positive(0.1, 20.0);
  std::vector<double> scaled_identity(static_cast<size_t>(k * k), 0.0), random_diagonal(static_cast<size_t>(k * k), 0.0);
  for (int64_t j = 0; j < k; ++j) {
    scaled_identity[static_cast<size_t>(j * k + j)] = 3.7;
    random_diagonal[static_cast<size_t>(j * k + j)] = positive(rng);
  }
  for (const FormatCase& fc : kFormats) {
    const qspec::QuantizedMatrix rtn = qspec::quantize_rtn(f32_matrix("rtn", w, rows, k), fc.format, fc.group_size);
    for (bool act_order : {false, true})
      for (const auto* hessian : {&scaled_identity, &random_diagonal}) {
        qspec::GptqOptions options;
        options.act_order = act_order;
        options.block_columns = 48;  // not a multiple of every block: exercises the alignment
        const qspec::QuantizedMatrix gptq =
            qspec::gptq_quantize("layer.w", w.data(), rows, k, *hessian, fc.format, fc.group_size, options);
        SCOPED_TRACE(fc.label() + (act_order ? " act_order" : "") +
                     (hessian == &scaled_identity ? " c*I" : " diagonal"));
        EXPECT_EQ(gptq.name, "layer.w");
        EXPECT_EQ(gptq.rows, rows);
        EXPECT_EQ(gptq.format.block, rtn.format.block);
        EXPECT_EQ(gptq.format.tensor_scale, rtn.format.tensor_scale);
        EXPECT_TRUE(gptq.codes == rtn.codes);
        EXPECT_TRUE(gptq.scales == rtn.scales);
        EXPECT_TRUE(gptq.block_scale_values == rtn.block_scale_values);
      }
  }
}

TEST(GptqAccuracy, OutputErrorClearlyBelowRtnOnCorrelatedCalibration) {
  std::mt19937 rng(7);
  const int64_t rows = 96, k = 256, samples = 1024;
  const std::vector<float> x = calibration_inputs(rng, samples, k);
  std::vector<float> w = normal_values(rng, static_cast<size_t>(rows * k), 0.02f);
  for (int i = 0; i < 20; ++i) w[static_cast<size_t>(rng() % (rows * k))] *= 8.0f;  // weight outliers
  qspec::HessianAccumulator accumulator(k);
  accumulator.add(x.data(), samples);
  const std::vector<double> h = accumulator.hessian();
  for (const FormatCase& fc : kFormats) {
    const std::vector<float> rtn =
        dequantized(qspec::quantize_rtn(f32_matrix("rtn", w, rows, k), fc.format, fc.group_size));
    const double rtn_error = output_error(x, samples, w, rtn, rows, k);
    for (bool act_order : {false, true}) {
      qspec::GptqOptions options;
      options.act_order = act_order;
      options.block_columns = 64;
      const std::vector<float> gptq =
          dequantized(qspec::gptq_quantize("mlp.w", w.data(), rows, k, h, fc.format, fc.group_size, options));
      const double ratio = output_error(x, samples, w, gptq, rows, k) / rtn_error;
      std::printf("[ GPTQ/RTN ] %-14s act_order=%d  output error ratio %.3f\n", fc.label().c_str(), act_order ? 1 : 0,
                  ratio);
      // Observed 0.66-0.68 (natural order) and 0.45-0.49 (act_order); without the in-batch
      // updates they are 0.74-0.79 and 0.70-0.72, so these margins also catch partial bugs.
      EXPECT_LT(ratio, act_order ? 0.6 : 0.72) << fc.label() << (act_order ? " act_order" : "");
    }
  }
}

// The stored codes and scales decode to exactly the values the error propagation used, the
// reported loss is sum (w - q) H_damped (w - q)^T of those values, scales are valid codes, a dead
// channel is zeroed, and the nvfp4 tensor scale is RTN's.
TEST(GptqConsistency, StoredCodesDecodeToThePropagatedValues) {
  std::mt19937 rng(99);
  const int64_t rows = 20, k = 128, samples = 300, dead_channel = 17;
  std::vector<float> x = calibration_inputs(rng, samples, k);
  for (int64_t s = 0; s < samples; ++s) x[static_cast<size_t>(s * k + dead_channel)] = 0.0f;
  const std::vector<float> w = normal_values(rng, static_cast<size_t>(rows * k), 0.1f);
  qspec::HessianAccumulator accumulator(k);
  accumulator.add(x.data(), samples);
  const std::vector<double> h = accumulator.hessian();
  for (const FormatCase& fc : kFormats)
    for (bool act_order : {false, true}) {
      SCOPED_TRACE(fc.label() + (act_order ? " act_order" : ""));
      qspec::GptqOptions options;
      options.act_order = act_order;
      options.block_columns = 32;
      qspec::GptqStats stats;
      stats.record_values = true;
      const qspec::QuantizedMatrix q =
          qspec::gptq_quantize("attn.q", w.data(), rows, k, h, fc.format, fc.group_size, options, &stats);
      EXPECT_EQ(stats.dead_channels, 1);
      EXPECT_EQ(stats.damp_percent, options.damp_percent);
      ASSERT_EQ(stats.values.size(), static_cast<size_t>(rows * k));
      const std::vector<float> decoded = dequantized(q);
      std::vector<float> reference(static_cast<size_t>(k));
      for (int64_t r = 0; r < rows; ++r) {
        qspec::quant::dequantize_row(q.format, q.codes.data() + r * q.format.code_bytes(),
                                     q.scales.data() + r * q.format.scale_bytes(), reference.data());
        for (int64_t c = 0; c < k; ++c) {
          const size_t i = static_cast<size_t>(r * k + c);
          ASSERT_EQ(decoded[i], stats.values[i]) << "row " << r << " col " << c;
          ASSERT_EQ(reference[static_cast<size_t>(c)], stats.values[i]) << "row " << r << " col " << c;
        }
        // A dead channel's weight is 0; an asymmetric grid (int4-asym) need not hold 0 exactly.
        if (!qspec::quant::format_has_min(fc.format))
          EXPECT_EQ(decoded[static_cast<size_t>(r * k + dead_channel)], 0.0f);
      }
      for (size_t b = 0; b < q.scales.size(); ++b) {
        if (fc.format == Format::nvfp4) {
          ASSERT_NE(q.scales[b] & 0x7f, 0x7f) << "NaN E4M3 scale";
        }
        if (fc.format == Format::mxfp4) {
          ASSERT_NE(q.scales[b], 0xff) << "NaN E8M0 scale";
        }
      }
      for (float scale : q.block_scale_values) ASSERT_TRUE(std::isfinite(scale) && scale >= 0.0f);
      if (fc.format == Format::nvfp4) {
        const qspec::QuantizedMatrix rtn = qspec::quantize_rtn(f32_matrix("rtn", w, rows, k), fc.format);
        EXPECT_EQ(q.format.tensor_scale, rtn.format.tensor_scale);
      }

      // loss = sum over rows of (w - q) H_damped (w - q)^T, dead channel weight taken as 0.
      std::vector<double> damped = h;
      damped[static_cast<size_t>(dead_channel * k + dead_channel)] = 1.0;
      double mean = 0.0;
      for (int64_t j = 0; j < k; ++j) mean += damped[static_cast<size_t>(j * k + j)];
      mean /= static_cast<double>(k);
      for (int64_t j = 0; j < k; ++j) damped[static_cast<size_t>(j * k + j)] += options.damp_percent * mean;
      double loss = 0.0;
      std::vector<double> delta(static_cast<size_t>(k));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          const double original = c == dead_channel ? 0.0 : w[static_cast<size_t>(r * k + c)];
          delta[static_cast<size_t>(c)] = original - decoded[static_cast<size_t>(r * k + c)];
        }
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j)
            loss += delta[static_cast<size_t>(i)] * damped[static_cast<size_t>(i * k + j)] * delta[static_cast<size_t>(j)];
      }
      EXPECT_NEAR(stats.loss, loss, 1e-9 * loss);
    }
}

TEST(GptqErrors, BadInputsNameTheMatrix) {
  std::mt19937 rng(5);
  const int64_t rows = 4, k = 64;
  std::vector<float> w = normal_values(rng, static_cast<size_t>(rows * k), 0.1f);
  std::vector<double> identity(static_cast<size_t>(k * k), 0.0);
  for (int64_t j = 0; j < k; ++j) identity[static_cast<size_t>(j * k + j)] = 1.0;

  expect_error_naming([&] { qspec::gptq_quantize("blk.3.wq", w.data(), rows, k, std::vector<double>(k * k - 1), Format::int4, 32); },
                      "blk.3.wq", "Hessian");
  expect_error_naming([&] { qspec::gptq_quantize("blk.3.wk", w.data(), rows, k - 16, identity, Format::int4, 32); },
                      "blk.3.wk", "multiple");
  expect_error_naming([&] { qspec::gptq_quantize("blk.3.wv", w.data(), rows, k, identity, Format::int8, 32); },
                      "blk.3.wv", "not a weight format");
  {
    std::vector<float> bad = w;
    bad[70] = std::numeric_limits<float>::quiet_NaN();
    expect_error_naming([&] { qspec::gptq_quantize("blk.3.wo", bad.data(), rows, k, identity, Format::mxfp4); },
                        "blk.3.wo", "NaN");
    bad[70] = std::numeric_limits<float>::infinity();
    expect_error_naming([&] { qspec::gptq_quantize("blk.3.wo", bad.data(), rows, k, identity, Format::nvfp4); },
                        "blk.3.wo", "inf");
  }
  {
    std::vector<double> bad = identity;
    bad[3 * k + 9] = std::numeric_limits<double>::quiet_NaN();
    expect_error_naming([&] { qspec::gptq_quantize("ffn.up", w.data(), rows, k, bad, Format::int4, 32); }, "ffn.up",
                        "Hessian");
  }
  {
    // Indefinite: a 2 x 2 block [[1, 100], [100, 1]] stays indefinite under every damping tried.
    std::vector<double> bad = identity;
    bad[0 * k + 1] = bad[1 * k + 0] = 100.0;
    expect_error_naming([&] { qspec::gptq_quantize("ffn.down", w.data(), rows, k, bad, Format::int4_channel); },
                        "ffn.down", "positive definite");
  }
  {
    // Mildly indefinite: the retry with more damping factorizes it.
    std::vector<double> mild = identity;
    mild[0 * k + 1] = mild[1 * k + 0] = 1.005;
    qspec::GptqStats stats;
    qspec::GptqOptions options;
    options.damp_percent = 0.0;
    EXPECT_NO_THROW(qspec::gptq_quantize("ffn.gate", w.data(), rows, k, mild, Format::int4, 32, options, &stats));
    EXPECT_EQ(stats.damp_percent, 0.01);
  }
}

// Timing of realistic shapes (printed; the bound only catches a pathological slowdown).
TEST(GptqTiming, RealisticShapesInt4G64) {
  std::mt19937 rng(2024);
  qspec::ThreadPool::set_global_threads(1);
  for (auto [rows, k] : {std::pair<int64_t, int64_t>{1536, 576}, {576, 1536}}) {
    const int64_t samples = 512;
    const std::vector<float> x = normal_values(rng, static_cast<size_t>(samples * k), 1.0f);
    const std::vector<float> w = normal_values(rng, static_cast<size_t>(rows * k), 0.02f);
    qspec::HessianAccumulator accumulator(k);
    const auto t0 = std::chrono::steady_clock::now();
    accumulator.add(x.data(), samples);
    const std::vector<double> h = accumulator.hessian();
    const auto t1 = std::chrono::steady_clock::now();
    for (bool act_order : {false, true}) {
      qspec::GptqOptions options;
      options.act_order = act_order;
      const auto t2 = std::chrono::steady_clock::now();
      const qspec::QuantizedMatrix q = qspec::gptq_quantize("timing", w.data(), rows, k, h, Format::int4, 64, options);
      const auto t3 = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(t3 - t2).count();
      std::printf("[ GPTQ time ] %lld x %lld int4 g64 act_order=%d: %.3f s on 1 thread (Hessian of %lld rows: %.3f s)\n",
                  static_cast<long long>(rows), static_cast<long long>(k), act_order ? 1 : 0, seconds,
                  static_cast<long long>(samples), std::chrono::duration<double>(t1 - t0).count());
      EXPECT_EQ(q.rows, rows);
      EXPECT_LT(seconds, 20.0);
    }
  }
  qspec::ThreadPool::set_global_threads(0);
}
