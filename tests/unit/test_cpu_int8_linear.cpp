// The int8-block lm_head (ops/int8_linear.h): exact Q8_0-style matrices convert losslessly and
// anything else is refused; every instruction set gives the portable kernel's bits and those of
// cpu::linear on the f32 matrix; and a model whose lm_head is such blocks keeps its logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "model_dir_copy.h"
#include "ops/int8_linear.h"
#include "ops/linear.h"
#include "ops/quantized_linear.h"
#include "qspec/error.h"

namespace {

using qspec::cpu::KernelIsa;

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

// Values that are Q8_0 blocks: codes in [-127, 127] (each block reaching 127 somewhere) times an
// f16 scale per block, as a GGUF's Q8_0 matrix dequantizes to f32.
std::vector<float> q8_values(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(-127, 127);
  std::uniform_real_distribution<float> magnitude(1e-4f, 2e-2f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float scale = qspec::f16_to_f32(qspec::f32_to_f16(magnitude(rng)));
      for (int64_t i = 0; i < 32; ++i)
        values[static_cast<size_t>(r * cols + b * 32 + i)] = static_cast<float>(code(rng)) * scale;
      // The block reaches 127 in magnitude somewhere (its Q8_0 scale is amax / 127).
      values[static_cast<size_t>(r * cols + b * 32 + (r + b) % 32)] = ((r + b) % 2 ? 127.0f : -127.0f) * scale;
    }
  return values;
}

qspec::WeightMatrix f32_matrix(std::vector<float> values, int64_t rows, int64_t cols) {
  qspec::WeightMatrix m;
  m.name = "test.weight";
  m.rows = rows;
  m.cols = cols;
  m.owned = std::move(values);
  m.data = m.owned.data();
  return m;
}

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

std::vector<float> run(KernelIsa isa, const std::vector<float>& x, int64_t tokens, const qspec::cpu::Int8BlockMatrix& w,
                       const float* bias) {
  qspec::cpu::set_kernel_isa(isa);
  std::vector<float> y(static_cast<size_t>(tokens * w.rows), std::numeric_limits<float>::quiet_NaN());
  qspec::cpu::int8_linear(x.data(), tokens, w, bias, y.data());
  return y;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << what << " output " << i;
    ASSERT_EQ(a[i], b[i]) << what << " output " << i;
  }
}

}  // namespace

TEST(CpuInt8Linear, Q8BlocksConvertLosslessly) {
  const int64_t rows = 37, cols = 96;
  const qspec::WeightMatrix dense = f32_matrix(q8_values(rows, cols, 3), rows, cols);
  const auto blocks = qspec::cpu::exact_int8_blocks(dense);
  ASSERT_TRUE(blocks.has_value());
  EXPECT_EQ(blocks->rows, rows);
  EXPECT_EQ(blocks->cols, cols);
  EXPECT_EQ(blocks->name, "test.weight");
  EXPECT_EQ(blocks->bytes(), static_cast<size_t>(rows * cols + rows * 3 * 4));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < cols; ++e)
      ASSERT_EQ(static_cast<float>(blocks->codes[r * cols + e]) * blocks->scales[r * 3 + e / 32], dense.owned[r * cols + e])
          << "row " << r << " column " << e;
}

TEST(CpuInt8Linear, MatricesThatAreNotInt8BlocksAreRefused) {
  const int64_t rows = 20, cols = 64;
  // Plain f32 weights.
  EXPECT_FALSE(qspec::cpu::exact_int8_blocks(f32_matrix(random_values(rows * cols, 5), rows, cols)).has_value());
  // Q8 blocks but for one value of the last row, one ulp off: found past the first row.
  std::vector<float> values = q8_values(rows, cols, 7);
  values.back() = std::nextafter(values.back(), 1.0f);
  EXPECT_FALSE(qspec::cpu::exact_int8_blocks(f32_matrix(values, rows, cols)).has_value());
  // A value the block's scale cannot reach with a code of at most 127 in magnitude.
  values = q8_values(rows, cols, 7);
  values[5 * cols + 40] = values[5 * cols + 40] * 0.5f + 1e-7f;
  EXPECT_FALSE(qspec::cpu::exact_int8_blocks(f32_matrix(values, rows, cols)).has_value());
  // Not a number; K not a multiple of 32.
  values = q8_values(rows, cols, 7);
  values[3 * cols + 2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(qspec::cpu::exact_int8_blocks(f32_matrix(values, rows, cols)).has_value());
  EXPECT_FALSE(qspec::cpu::exact_int8_blocks(f32_matrix(q8_values(rows, 48, 9), rows, 40)).has_value());
  // All-zero blocks are exact (scale 0).
  const auto zeros = qspec::cpu::exact_int8_blocks(f32_matrix(std::vector<float>(rows * cols, 0.0f), rows, cols));
  ASSERT_TRUE(zeros.has_value());
  EXPECT_EQ(zeros->scales[0], 0.0f);
}

TEST(CpuInt8Linear, EveryIsaGivesThePortableBitsAndTheF32GemmOfTheMatrix) {
  IsaGuard guard;
  // 608 columns: 19 blocks a row, the tiles' k loop past a few hundred values.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8, 160}, {37, 160}, {131, 160}, {37, 608}}) {
    const qspec::WeightMatrix dense = f32_matrix(q8_values(rows, cols, 11), rows, cols);
    const auto w = qspec::cpu::exact_int8_blocks(dense);
    ASSERT_TRUE(w.has_value());
    // 2-191: the register tiles (a verify, a short prefill); 192 on: the decoded-rows buffer.
    for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 9, 10, 17, 31, 64, 192, 194}) {
      const std::string shape = std::to_string(rows) + "x" + std::to_string(cols) + ", " + std::to_string(tokens) + " tokens";
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * cols), 13);
      const std::vector<float> bias = random_values(static_cast<size_t>(rows), 17);
      const std::vector<float> portable = run(KernelIsa::portable, x, tokens, *w, bias.data());
      for (KernelIsa isa : supported_isas()) {
        const std::string what = shape + " on " + std::string(qspec::cpu::kernel_isa_name(isa));
        expect_same_bits(run(isa, x, tokens, *w, bias.data()), portable, what);
        expect_same_bits(run(isa, x, tokens, *w, nullptr), run(KernelIsa::portable, x, tokens, *w, nullptr),
                         what + " no bias");
      }
      std::vector<float> reference(portable.size());
      qspec::cpu::linear(x.data(), tokens, dense, bias.data(), reference.data());
#if defined(__AVX2__) && defined(__FMA__)
      expect_same_bits(portable, reference, shape + " vs cpu::linear on the f32 matrix");
#else
      for (size_t i = 0; i < reference.size(); ++i) ASSERT_NEAR(portable[i], reference[i], 1e-4) << shape;
#endif
    }
  }
}

TEST(CpuInt8Linear, Bf16MatricesOfInt8BlocksConvertAndKeepTheirProducts) {
  // Codes times powers of two are exact in bf16: such a bf16 matrix converts too.
  IsaGuard guard;
  const int64_t rows = 19, cols = 64;
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> code(-127, 127);
  std::vector<uint16_t> bits(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < bits.size(); ++i) {
    const int c = i % 32 == 7 ? 127 : code(rng);
    bits[i] = qspec::f32_to_bf16(std::ldexp(static_cast<float>(c), -12 - static_cast<int>(i / 32 % 5)));
  }
  qspec::WeightMatrix dense;
  dense.name = "bf16.weight";
  dense.dtype = qspec::DType::BF16;
  dense.rows = rows;
  dense.cols = cols;
  dense.data = bits.data();
  const auto w = qspec::cpu::exact_int8_blocks(dense);
  ASSERT_TRUE(w.has_value());
  const std::vector<float> x = random_values(static_cast<size_t>(3 * cols), 29);
  std::vector<float> reference(static_cast<size_t>(3 * rows));
  qspec::cpu::linear(x.data(), 3, dense, nullptr, reference.data());
  const std::vector<float> got = run(guard.saved, x, 3, *w, nullptr);
#if defined(__AVX2__) && defined(__FMA__)
  expect_same_bits(got, reference, "bf16");
#else
  for (size_t i = 0; i < reference.size(); ++i) ASSERT_NEAR(got[i], reference[i], 1e-4);
#endif
}

TEST(CpuInt8Linear, EveryTokenIsComputedAsIfAlone) {
  // A QSpec verify's logits must be those of one-token decoding, bit for bit.
  IsaGuard guard;
  const int64_t rows = 45, cols = 576, tokens = 11;
  const auto w = qspec::cpu::exact_int8_blocks(f32_matrix(q8_values(rows, cols, 31), rows, cols));
  ASSERT_TRUE(w.has_value());
  const std::vector<float> x = random_values(static_cast<size_t>(tokens * cols), 37);
  for (KernelIsa isa : supported_isas()) {
    const std::vector<float> all = run(isa, x, tokens, *w, nullptr);
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> alone(x.begin() + t * cols, x.begin() + (t + 1) * cols);
      const std::vector<float> one = run(isa, alone, 1, *w, nullptr);
      for (int64_t n = 0; n < rows; ++n)
        ASSERT_EQ(all[t * rows + n], one[n]) << qspec::cpu::kernel_isa_name(isa) << " token " << t;
    }
  }
}

// gsm-synth-llama with its lm_head replaced by Q8_0 blocks (an f32 tensor, as `qspec convert
// gguf` writes a GGUF's Q8_0 output matrix).
class Int8LmHeadModel : public ModelDirCopy {
 protected:
  Int8LmHeadModel() : ModelDirCopy("int8-lm-head") {}

  void SetUp() override {
    ModelDirCopy::SetUp();
    const std::string shard = (dir_ / read_json("model.safetensors.index.json")["weight_map"]["lm_head.weight"]
                                          .get<std::string>()).string();
    qspec::SafetensorsWriter writer;
    {
      auto file = qspec::SafetensorsFile::open(shard);
      for (const qspec::TensorView& view : file->tensors()) {
        if (view.name != "lm_head.weight") {
          writer.add(view.name, view.dtype, view.shape, view.data, view.nbytes);
          continue;
        }
        const std::vector<float> values = q8_values(view.shape[0], view.shape[1], 41);
        writer.add(view.name, qspec::DType::F32, view.shape, values.data(), values.size() * sizeof(float));
      }
    }
    writer.write(shard);
  }
  void TearDown() override {
    unsetenv("QSPEC_CPU_LM_HEAD");
    ModelDirCopy::TearDown();
  }
};

TEST_F(Int8LmHeadModel, ReadsItsLmHeadAsInt8BlocksWithTheSameLogits) {
  auto model = qspec::LlamaModel::load(dir_.string());
  ASSERT_NE(model->lm_head_int8(), nullptr);
  setenv("QSPEC_CPU_LM_HEAD", "f32", 1);
  auto f32_model = qspec::LlamaModel::load(dir_.string());
  EXPECT_EQ(f32_model->lm_head_int8(), nullptr);
  // The benchmark's bytes a token count the int8 matrix: 1.125 bytes a weight, not 4.
  const qspec::ModelConfig& c = model->config();
  EXPECT_EQ(f32_model->weight_bytes() - model->weight_bytes(),
            static_cast<size_t>(c.vocab_size * c.hidden_size * 4) - model->lm_head_int8()->bytes());
  model->quantize_weights(qspec::quant::Format::int4);
  f32_model->quantize_weights(qspec::quant::Format::int4);
  const std::vector<int32_t> prompt = {314, 26, 473, 307, 221, 19, 21, 409};
  for (const char* name : {"w16a16", "w4a16", "w4a8"}) {
    qspec::RunMode mode = qspec::parse_run_mode(name);
    mode.activations.group_size = 64;
    std::vector<float> logits[2];
    const qspec::LlamaModel* models[2] = {model.get(), f32_model.get()};
    for (int i = 0; i < 2; ++i) {
      qspec::KvCache cache = models[i]->new_cache(16);
      models[i]->forward(prompt, cache, logits[i], true, mode);  // every position's logits (a verify)
      const int32_t next = 42;
      std::vector<float> step;
      models[i]->forward(std::span<const int32_t>(&next, 1), cache, step, false, mode);
      logits[i].insert(logits[i].end(), step.begin(), step.end());
    }
    expect_same_bits(logits[0], logits[1], name);
  }
}

TEST_F(Int8LmHeadModel, AnUnknownLmHeadChoiceIsAnErrorNamingTheVariable) {
  setenv("QSPEC_CPU_LM_HEAD", "int4", 1);
  try {
    qspec::LlamaModel::load(dir_.string());
    FAIL() << "loaded with QSPEC_CPU_LM_HEAD=int4";
  } catch (const qspec::Error& error) {
    EXPECT_NE(std::string(error.what()).find("QSPEC_CPU_LM_HEAD=int4"), std::string::npos) << error.what();
  }
}

TEST(CpuInt8Linear, ABf16CheckpointKeepsItsLmHeadAsLoaded) {
  auto model = qspec::LlamaModel::load(QSPEC_SOURCE_DIR "/models/gsm-synth-llama");
  EXPECT_EQ(model->lm_head_int8(), nullptr);
}

// int8-group weights (quant::Format::int8_group: a GGUF's Q8_0 / Q5_0 / Q6_K projections kept at
// 8 bits) in the 4-bit GEMM's entry points: groups of 16, 32, 64 and of 12 (portable only), alone
// and fused with 4-bit matrices, give cpu::linear's bits on their dequantized f32 matrix, and
// under int8 activations the exact integer W8A8 sums.
TEST(CpuInt8Linear, Int8GroupWeightsGiveTheF32GemmOfTheirValuesInEveryEntryPoint) {
  IsaGuard guard;
  const int64_t rows = 37, cols = 192;
  for (int64_t group : {16, 32, 12, 64}) {
    const qspec::WeightMatrix source = f32_matrix(random_values(static_cast<size_t>(rows * cols), 41), rows, cols);
    const qspec::QuantizedMatrix w = qspec::quantize_rtn(source, qspec::quant::Format::int8_group, group);
    ASSERT_EQ(w.format.format, qspec::quant::Format::int8_group);
    ASSERT_EQ(w.codes.size(), static_cast<size_t>(rows * cols));
    ASSERT_EQ(w.scales.size(), static_cast<size_t>(rows * cols / group * 4));
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      w.dequantize_row(r, values.data() + r * cols);
      std::vector<float> reference(static_cast<size_t>(cols));
      qspec::quant::dequantize_row(w.format, w.codes.data() + r * cols, w.scales.data() + r * w.format.scale_bytes(),
                                   reference.data());
      for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(values[r * cols + i], reference[i]) << "row " << r;
      // RTN on int8 groups: within half a step of the source.
      for (int64_t i = 0; i < cols; ++i) {
        const float scale = w.block_scale_values[r * (cols / group) + i / group];
        ASSERT_LE(std::fabs(values[r * cols + i] - source.owned[r * cols + i]), 0.5001f * scale) << "row " << r;
      }
    }
    const qspec::WeightMatrix dense = f32_matrix(values, rows, cols);
    const qspec::QuantizedMatrix four_bit = qspec::quantize_rtn(source, qspec::quant::Format::int4, 64);
    for (int64_t tokens : {1, 3, 4, 9, 194}) {
      const std::string shape = "group " + std::to_string(group) + ", " + std::to_string(tokens) + " tokens";
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * cols), 43);
      const std::vector<float> bias = random_values(static_cast<size_t>(rows), 47);
      std::vector<float> reference(static_cast<size_t>(tokens * rows));
      qspec::cpu::linear(x.data(), tokens, dense, bias.data(), reference.data());
      for (KernelIsa isa : supported_isas()) {
        qspec::cpu::set_kernel_isa(isa);
        const std::string what = shape + " on " + std::string(qspec::cpu::kernel_isa_name(isa));
        std::vector<float> y(reference.size(), NAN), y4(static_cast<size_t>(tokens * rows), NAN);
        qspec::cpu::quantized_linear(x.data(), tokens, w, bias.data(), y.data());
#if defined(__AVX2__) && defined(__FMA__)
        expect_same_bits(y, reference, what);
#else
        for (size_t i = 0; i < reference.size(); ++i) ASSERT_NEAR(y[i], reference[i], 1e-4) << what;
#endif
        // Fused with a 4-bit matrix (q / k / v of a Q4_K_M layer mix so): each its own result.
        std::vector<float> fused(reference.size(), NAN), fused4(y4.size(), NAN);
        qspec::cpu::quantized_linear(x.data(), tokens, four_bit, nullptr, y4.data());
        const qspec::cpu::LinearOutput outputs[] = {{&four_bit, nullptr, fused4.data()}, {&w, bias.data(), fused.data()}};
        qspec::cpu::quantized_linear(x.data(), tokens, std::span<const qspec::cpu::LinearOutput>(outputs));
        expect_same_bits(fused, y, what + " fused");
        expect_same_bits(fused4, y4, what + " fused, the 4-bit matrix");
        // int8 activations (w4a8 drafts): W8A8, the exact integer sum of each group's code products
        // under the weights' group scale, times the token's scale (the int4 kernels' order):
        // y = fma(sum_b s_w[b] * S_b (one fma a group, in order), s_x, bias).
        qspec::cpu::Int8Activations codes;
        qspec::cpu::quantize_activations_int8(x.data(), tokens, cols, codes);
        std::vector<float> got8(reference.size(), NAN), fused8(reference.size(), NAN), fused84(y4.size(), NAN);
        qspec::cpu::quantized_linear(codes, w, bias.data(), got8.data());
        const qspec::quant::RowFormat a8 =
            qspec::quant::make_row_format(qspec::quant::Format::int8, qspec::quant::Role::activation, cols);
        std::vector<uint8_t> token_codes(cols), token_scale(4);
        for (int64_t t = 0; t < tokens; ++t) {
          qspec::quant::quantize_row(a8, x.data() + t * cols, token_codes.data(), token_scale.data());
          const float sx = qspec::quant::block_scale(a8, token_scale.data(), 0);
          for (int64_t r = 0; r < rows; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < cols / group; ++b) {
              int32_t sum = 0;
              for (int64_t i = b * group; i < (b + 1) * group; ++i)
                sum += int32_t{static_cast<int8_t>(token_codes[i])} * static_cast<int8_t>(w.codes[r * cols + i]);
              acc = std::fma(w.block_scale_values[r * (cols / group) + b], static_cast<float>(sum), acc);
            }
            ASSERT_EQ(got8[t * rows + r], std::fma(acc, sx, bias[r])) << what << " int8 activations, output " << r;
            // Within the activations' rounding of the f32 GEMM: each code is within s_x / 2 of x.
            double bound = 1e-4;
            for (int64_t i = 0; i < cols; ++i) bound += 0.5 * sx * std::fabs(values[r * cols + i]) * 1.001;
            ASSERT_NEAR(got8[t * rows + r], reference[t * rows + r], bound) << what;
          }
        }
        const qspec::cpu::LinearOutput outputs8[] = {{&four_bit, nullptr, fused84.data()}, {&w, bias.data(), fused8.data()}};
        qspec::cpu::quantized_linear(codes, std::span<const qspec::cpu::LinearOutput>(outputs8));
        expect_same_bits(fused8, got8, what + " int8 activations, fused");
      }
    }
  }
}
