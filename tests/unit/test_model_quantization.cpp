// Model-level quantization: W4A16 of an exactly representable checkpoint reproduces W16A16;
// ARC's channel reorder and augmented columns leave the math unchanged; ARC calibration picks
// the outlier channels; the Hadamard rotation keeps the model's function.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/safetensors.h"
#include "model/llama.h"
#include "model/quantize.h"
#include "runtime/generate.h"
#include "runtime/qspec.h"
#include "qspec/error.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using qspec::quant::Format;

const std::string kModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
const std::vector<int32_t> kPrompt = {314, 26, 473, 307, 221, 19, 21, 409, 28, 96, 41, 13};

std::vector<float> logits_of(const qspec::LlamaModel& model, const std::string& mode_name, int64_t group = 64) {
  qspec::RunMode mode = qspec::parse_run_mode(mode_name);
  mode.activations.group_size = group;
  qspec::KvCache cache = model.new_cache(32);
  std::vector<float> logits;
  model.forward(kPrompt, cache, logits, /*all_logits=*/true, mode);
  for (float v : logits) EXPECT_TRUE(std::isfinite(v)) << mode_name;
  return logits;
}

double max_abs(const std::vector<float>& values) {
  double m = 0.0;
  for (float v : values) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

const qspec::QuantizedMatrix* projection(const qspec::QuantizedLayerWeights& layer, int p) {
  const qspec::QuantizedMatrix* all[] = {&layer.q_proj,    &layer.k_proj, &layer.v_proj,  &layer.o_proj,
                                         &layer.gate_proj, &layer.up_proj, &layer.down_proj};
  return all[p];
}

// A copy of gsm-synth-llama whose projections are the dequantized 4-bit weights of `source`
// (f32), so they are exactly representable in that format.
std::string write_representable_checkpoint(const qspec::LlamaModel& source, const std::string& name) {
  const fs::path dir = fs::path(testing::TempDir()) / ("qspec_representable_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  qspec::Checkpoint original = qspec::Checkpoint::open(kModel);
  qspec::SafetensorsWriter writer;
  for (const std::string& tensor : original.names()) {
    if (tensor.find("_proj.weight") != std::string::npos) continue;
    const qspec::TensorView& view = original.get(tensor);
    writer.add(tensor, view.dtype, view.shape, view.data, view.nbytes);
  }
  for (size_t l = 0; l < source.quantized_layers().size(); ++l)
    for (int p = 0; p < 7; ++p) {
      const qspec::QuantizedMatrix* m = projection(source.quantized_layers()[l], p);
      std::vector<float> rows(static_cast<size_t>(m->rows * m->cols()));
      for (int64_t r = 0; r < m->rows; ++r) m->dequantize_row(r, rows.data() + r * m->cols());
      writer.add(m->name, qspec::DType::F32, {m->rows, m->cols()}, rows.data(), rows.size() * 4);
    }
  writer.write((dir / "model.safetensors").string());
  for (const char* file : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::copy_file(fs::path(kModel) / file, dir / file);
  return dir.string();
}

TEST(ModelQuantization, W4A16OfAnExactlyRepresentableCheckpointReproducesW16A16) {
  for (Format format : {Format::int4, Format::int4_channel, Format::nvfp4, Format::mxfp4}) {
    const std::string name(qspec::quant::format_name(format));
    auto original = qspec::LlamaModel::load(kModel);
    original->quantize_weights(format, 64);
    const std::string dir = write_representable_checkpoint(*original, name);
    auto model = qspec::LlamaModel::load(dir);
    model->quantize_weights(format, 64);
    // Quantizing representable weights is the identity: every weight comes back bit for bit.
    std::vector<float> got, want;
    for (size_t l = 0; l < model->quantized_layers().size(); ++l)
      for (int p = 0; p < 7; ++p) {
        const qspec::QuantizedMatrix* m = projection(model->quantized_layers()[l], p);
        const qspec::QuantizedMatrix* reference = projection(original->quantized_layers()[l], p);
        ASSERT_EQ(m->codes, reference->codes) << name << " " << m->name;
        ASSERT_EQ(m->scales, reference->scales) << name << " " << m->name;
        got.resize(static_cast<size_t>(m->cols()));
        want.resize(static_cast<size_t>(m->cols()));
        // ... and decodes to exactly the checkpoint's f32 weights.
        const qspec::WeightMatrix* checkpoint_weights[] = {
            &model->layer_weights(static_cast<int64_t>(l)).q_proj,    &model->layer_weights(static_cast<int64_t>(l)).k_proj,
            &model->layer_weights(static_cast<int64_t>(l)).v_proj,    &model->layer_weights(static_cast<int64_t>(l)).o_proj,
            &model->layer_weights(static_cast<int64_t>(l)).gate_proj, &model->layer_weights(static_cast<int64_t>(l)).up_proj,
            &model->layer_weights(static_cast<int64_t>(l)).down_proj};
        for (int64_t r = 0; r < m->rows; r += 7) {
          m->dequantize_row(r, got.data());
          checkpoint_weights[p]->row_to_f32(r, want.data());
          ASSERT_EQ(got, want) << name << " " << m->name << " row " << r;
        }
      }
    // So W4A16 differs from W16A16 only by rounding activations to f16, far less than the
    // weight quantization of the original model moves it.
    const std::vector<float> w16 = logits_of(*model, "w16a16"), w4 = logits_of(*model, "w4a16");
    const double representable_diff = max_diff(w16, w4);
    auto plain = qspec::LlamaModel::load(kModel);
    plain->quantize_weights(format, 64);
    const double quantization_diff = max_diff(logits_of(*plain, "w16a16"), logits_of(*plain, "w4a16"));
    EXPECT_LT(representable_diff, 2e-3 * max_abs(w16)) << name;
    EXPECT_LT(representable_diff * 10, quantization_diff) << name;
    fs::remove_all(dir);
  }
}

// Installs `source`'s 4-bit weights with every site's channels reordered by whole blocks and
// `tail` augmented columns (copies of the last reordered blocks): the same weights, another
// layout. Returns the installed layers.
std::vector<qspec::QuantizedLayerWeights> block_reordered(const qspec::LlamaModel& source, int64_t block,
                                                          int64_t tail, std::mt19937& rng) {
  const qspec::ModelConfig& c = source.config();
  const int64_t site_k[qspec::kLinearSites] = {c.hidden_size, c.q_dim(), c.hidden_size, c.intermediate_size};
  const qspec::LinearSite projection_site[7] = {
      qspec::LinearSite::attention_in, qspec::LinearSite::attention_in, qspec::LinearSite::attention_in,
      qspec::LinearSite::attention_out, qspec::LinearSite::mlp_in,      qspec::LinearSite::mlp_in,
      qspec::LinearSite::mlp_out};
  std::vector<qspec::QuantizedLayerWeights> layers = source.quantized_layers();
  for (qspec::QuantizedLayerWeights& layer : layers) {
    std::vector<int32_t> block_order[qspec::kLinearSites];
    for (int s = 0; s < qspec::kLinearSites; ++s) {
      qspec::ArcSite& site = layer.sites[s];
      const int64_t blocks = site_k[s] / block;
      block_order[s].resize(static_cast<size_t>(blocks));
      std::iota(block_order[s].begin(), block_order[s].end(), 0);
      std::shuffle(block_order[s].begin(), block_order[s].end(), rng);
      site.order.resize(static_cast<size_t>(site_k[s]));
      for (int64_t j = 0; j < site_k[s]; ++j) site.order[j] = block_order[s][j / block] * static_cast<int32_t>(block) + static_cast<int32_t>(j % block);
      site.tail = tail;
      site.outliers_int4 = tail;
      site.outliers_nvfp4 = tail / 2;
      site.outliers_mxfp4 = tail / 2;
    }
    for (int p = 0; p < 7; ++p) {
      qspec::QuantizedMatrix& m = const_cast<qspec::QuantizedMatrix&>(*projection(layer, p));
      const int s = static_cast<int>(projection_site[p]);
      const int64_t k = m.cols(), blocks = k / block, tail_blocks = tail / block;
      qspec::quant::RowFormat format = qspec::quant::make_row_format(m.format.format, qspec::quant::Role::weight, k + tail, block);
      format.tensor_scale = m.format.tensor_scale;
      // A moved chunk of `block` values holds block / 2 code bytes and the scales of the weight
      // blocks inside it.
      const int64_t code_block = block / 2,
                    scale_block = m.format.scale_bytes() / m.format.blocks() * (block / m.format.block);
      std::vector<uint8_t> codes(static_cast<size_t>(m.rows * format.code_bytes()));
      std::vector<uint8_t> scales(static_cast<size_t>(m.rows * format.scale_bytes()));
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t b = 0; b < blocks + tail_blocks; ++b) {
          const int64_t from = block_order[s][static_cast<size_t>(b < blocks ? b : blocks - tail_blocks + (b - blocks))];
          std::copy_n(m.codes.data() + r * m.format.code_bytes() + from * code_block, code_block,
                      codes.data() + r * format.code_bytes() + b * code_block);
          std::copy_n(m.scales.data() + r * m.format.scale_bytes() + from * scale_block, scale_block,
                      scales.data() + r * format.scale_bytes() + b * scale_block);
        }
      m.format = format;
      m.codes = std::move(codes);
      m.scales = std::move(scales);
      m.prepare();
    }
  }
  return layers;
}

TEST(ModelQuantization, ArcReorderAndAugmentedColumnsLeaveTheMathUnchanged) {
  std::mt19937 rng(1234);
  for (Format format : {Format::int4, Format::mxfp4}) {
    const std::string name(qspec::quant::format_name(format));
    auto plain = qspec::LlamaModel::load(kModel);
    plain->quantize_weights(format, 64);
    auto arc = qspec::LlamaModel::load(kModel);
    qspec::QuantizationInfo info = plain->quantization();
    arc->set_quantized_weights(block_reordered(*plain, 64, 64, rng), info);
    ASSERT_TRUE(arc->has_arc());
    // W16A16 never sees the 4-bit layout.
    EXPECT_EQ(logits_of(*plain, "w16a16"), logits_of(*arc, "w16a16"));
    // Modes without ARC read the reordered first K columns of the same weights and quantize
    // the same activation blocks (the reorder moves whole blocks): only the f32 summation
    // order differs. That last-bit difference can move an activation across a rounding
    // boundary (f16, int8, fp8 or 4-bit) in a later layer, which moves the logits visibly but
    // little (measured: up to 1% of the logit scale; most modes agree to 1e-6). A wrong
    // reorder or a misplaced column moves them by the whole scale.
    for (const char* mode : {"w4a16", "w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"}) {
      const std::vector<float> want = logits_of(*plain, mode), got = logits_of(*arc, mode);
      EXPECT_LT(max_diff(want, got), 2e-2 * max_abs(want)) << name << " " << mode;
      std::printf("%s %s: reordered vs plain max diff %.3g (scale %.3g)\n", name.c_str(), mode, max_diff(want, got), max_abs(want));
    }
    // ARC modes add residual channels for the last S reordered channels: the result moves.
    // (These blocks are not real outliers; whether ARC helps is measured in the eval table.)
    const std::vector<float> reference = logits_of(*plain, "w4a16");
    for (const char* mode : {"w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"}) {
      const std::vector<float> without = logits_of(*arc, mode), with = logits_of(*arc, std::string(mode) + "-arc");
      EXPECT_GT(max_diff(without, with), 0.0) << name << " " << mode;
      std::printf("%s %s: vs w4a16 without ARC %.3g, with ARC %.3g\n", name.c_str(), mode, max_diff(reference, without),
                  max_diff(reference, with));
      EXPECT_LT(max_diff(reference, with), 0.5 * max_abs(reference)) << name << " " << mode;
    }
  }
}

TEST(ModelQuantization, ArcCalibrationFindsOutlierChannelsAndRoundsS) {
  std::vector<float> abs_max(256, 1.0f);
  for (int channel : {3, 77, 150, 151, 200}) abs_max[channel] = 10.0f + static_cast<float>(channel) / 100.0f;
  abs_max[9] = 1.5f;  // below tau = 2^-3 * 12 = 1.5: not an outlier (strictly above counts)
  const qspec::ArcSite site = qspec::calibrate_arc_site(abs_max, Format::int4, 64, 64, 0.125, 0.25);
  ASSERT_EQ(site.order.size(), 256u);
  EXPECT_EQ(std::vector<int32_t>(site.order.end() - 5, site.order.end()), (std::vector<int32_t>{3, 77, 150, 151, 200}));
  EXPECT_EQ(site.order[250], 9);
  EXPECT_EQ(site.above_tau, 5);
  EXPECT_EQ(site.outliers_nvfp4, 16);
  EXPECT_EQ(site.outliers_mxfp4, 32);
  EXPECT_EQ(site.outliers_int4, 64);
  EXPECT_EQ(site.tail, 64);
  EXPECT_FALSE(site.capped);
  EXPECT_FLOAT_EQ(site.max_abs, 12.0f);
  // A cap of 10% of K (25 channels) keeps 16 for nvfp4 and nothing for the coarser blocks.
  const qspec::ArcSite capped = qspec::calibrate_arc_site(abs_max, Format::nvfp4, 16, 64, 0.125, 0.1);
  EXPECT_TRUE(capped.capped);
  EXPECT_EQ(capped.outliers_nvfp4, 16);
  EXPECT_EQ(capped.outliers_mxfp4, 0);
  EXPECT_EQ(capped.outliers_int4, 0);
  EXPECT_EQ(capped.tail, 16);
}

TEST(ModelQuantization, CalibratedArcRunsEveryModeAndKeepsW16A16) {
  auto model = qspec::LlamaModel::load(kModel);
  auto tokenizer = qspec::Tokenizer::load(kModel);
  const std::vector<float> before = logits_of(*model, "w16a16");
  const qspec::CalibrationSet calibration = qspec::load_calibration_text(
      QSPEC_SOURCE_DIR "/data/calibration/gsm-synth-self.txt", *tokenizer, 4, 96);
  ASSERT_EQ(calibration.sequences.size(), 4u);
  qspec::QuantizeOptions options;
  options.format = Format::nvfp4;
  options.arc = true;
  qspec::quantize_model(*model, options, &calibration);
  EXPECT_TRUE(model->has_arc());
  EXPECT_EQ(model->quantized_format(), "nvfp4 rtn + arc");
  EXPECT_EQ(logits_of(*model, "w16a16"), before);
  for (const std::string& mode : qspec::run_mode_names()) {
    const std::vector<float> logits = logits_of(*model, mode);
    std::printf("%s: max diff to w16a16 %.3g\n", mode.c_str(), max_diff(before, logits));
    EXPECT_LT(max_diff(before, logits), 0.5 * max_abs(before)) << mode;
  }
  for (const qspec::QuantizedLayerWeights& layer : model->quantized_layers())
    for (const qspec::ArcSite& site : layer.sites) {
      EXPECT_TRUE(site.calibrated());
      EXPECT_EQ(site.tail % 16, 0);
      EXPECT_LE(site.outliers_nvfp4, site.tail);
      EXPECT_LE(site.tail, static_cast<int64_t>(site.order.size()) / 4 + 16);
    }
}

TEST(ModelQuantization, HadamardRotationKeepsTheFunction) {
  auto model = qspec::LlamaModel::load(kModel);
  const std::vector<float> before = logits_of(*model, "w16a16");
  model->apply_hadamard_rotation(42);
  EXPECT_TRUE(model->rotated());
  const std::vector<float> after = logits_of(*model, "w16a16");
  EXPECT_GT(max_diff(before, after), 0.0);  // really recomputed through rotated weights
  EXPECT_LT(max_diff(before, after), 1e-4 * max_abs(before));
  EXPECT_THROW(model->apply_hadamard_rotation(42), qspec::Error);
  model->quantize_weights(Format::int4_channel);
  const std::vector<float> w4a4 = logits_of(*model, "w4a4-int4");
  EXPECT_LT(max_diff(before, w4a4), 0.5 * max_abs(before));
}

}  // namespace

// 8-bit tensors beside the 4-bit set (a GGUF Q4_K_M's Q5_0 / Q6_K / Q8_0 projections kept as
// int8-group, quant_checkpoint.h): int4-asym g32 with q / v / gate / down in int8 groups of 32 or
// 16 (so q/k/v and gate/up mix formats in one fused call) runs every mode; its W4A16 is closer
// to W16A16 than the all-4-bit set's; greedy QSpec equals greedy W4A16 on it.
TEST(ModelQuantization, Int8GroupTensorsBesideInt4AsymRunEveryModeAndQSpecEqualsW4A16) {
  auto four_bit = qspec::LlamaModel::load(kModel);
  four_bit->quantize_weights(Format::int4_asym, 32);
  std::vector<qspec::QuantizedLayerWeights> layers = four_bit->quantized_layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    const qspec::LayerWeights& w = four_bit->layer_weights(static_cast<int64_t>(l));
    const int64_t group = l % 2 ? 16 : 32;
    layers[l].q_proj = qspec::quantize_rtn(w.q_proj, Format::int8_group, group);
    layers[l].v_proj = qspec::quantize_rtn(w.v_proj, Format::int8_group, group);
    layers[l].gate_proj = qspec::quantize_rtn(w.gate_proj, Format::int8_group, group);
    layers[l].down_proj = qspec::quantize_rtn(w.down_proj, Format::int8_group, group);
  }
  auto mixed = qspec::LlamaModel::load(kModel);
  mixed->set_quantized_weights(layers, four_bit->quantization());
  EXPECT_EQ(mixed->quantized_layers()[1].q_proj.format.format, Format::int8_group);
  EXPECT_EQ(mixed->quantized_layers()[1].q_proj.format.block, 16);
  EXPECT_LT(mixed->weight_bytes(), four_bit->weight_bytes() * 3);
  const std::vector<float> w16 = logits_of(*mixed, "w16a16");
  const double mixed_diff = max_diff(w16, logits_of(*mixed, "w4a16"));
  const double four_bit_diff = max_diff(w16, logits_of(*four_bit, "w4a16"));
  EXPECT_LT(mixed_diff, four_bit_diff);
  for (const char* mode : {"w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"})
    EXPECT_LT(max_diff(w16, logits_of(*mixed, mode, 32)), 0.5 * max_abs(w16)) << mode;
  // A model of int8-group weights alone: W4A16 within the f16 rounding of activations.
  auto eight_bit = qspec::LlamaModel::load(kModel);
  eight_bit->quantize_weights(Format::int8_group, 32);
  EXPECT_LT(max_diff(w16, logits_of(*eight_bit, "w4a16")), 0.25 * four_bit_diff);

  qspec::GenerationOptions options;
  options.max_new_tokens = 24;
  options.eos_ids = {};
  options.mode = qspec::parse_run_mode("w4a16");
  const std::vector<int32_t> want = qspec::generate(*mixed, kPrompt, options).ids;
  ASSERT_EQ(want.size(), 24u);
  for (const char* draft : {"w4a8", "w4a4-nvfp4"}) {
    qspec::QSpecOptions q;
    q.draft = qspec::parse_run_mode(draft);
    q.draft.activations.group_size = 32;
    q.verify = options.mode;
    q.gamma = 3;
    q.overwrite_kv = true;
    EXPECT_EQ(qspec::qspec_generate(*mixed, kPrompt, options, q).ids, want) << draft;
  }
}
