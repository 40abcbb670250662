// LlamaModel: loading and cross-checking a checkpoint directory, the KV cache, the CPU forward pass.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <stdexcept>

#include "ops/quantized_linear.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "model/quant_checkpoint.h"
#include "model/quantize.h"
#include "ops/sample.h"
#include "qspec/decode_plan.h"
#include "qspec/error.h"

namespace qspec {

cpu::AttentionShape attention_shape(const ModelConfig& c, int64_t layer, int64_t kv_window, int64_t kv_sinks) {
  cpu::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, c.layer_window(layer)};
  shape.scale = static_cast<float>(c.attention_scale());
  if (kv_window > 0) {
    shape.sliding_window = shape.sliding_window > 0 ? std::min(shape.sliding_window, kv_window) : kv_window;
    shape.sink_tokens = kv_sinks;
  }
  return shape;
}

KvCache::KvCache(int64_t layers, int64_t capacity, int64_t num_kv_heads, int64_t head_dim, KvCacheFormat format)
    : capacity_(capacity), storage_(layers, std::max<int64_t>(capacity, 1), num_kv_heads, head_dim, format) {}

KvBlocks KvCache::blocks() {
  static const int32_t kSingleBlock[1] = {0};
  return storage_.blocks(kSingleBlock, std::max<int64_t>(capacity_, 1));
}

void KvCache::set_length(int64_t length) {
  QSPEC_CHECK(length >= 0 && length <= length_, "KvCache::set_length(", length,
              "): only truncation is allowed (length ", length_, ")");
  length_ = length;
}

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

const TensorView& expect_tensor(const Checkpoint& checkpoint, const std::string& name,
                                std::vector<int64_t> shape) {
  const TensorView& tensor = checkpoint.get(name);
  QSPEC_CHECK(tensor.shape == shape, checkpoint.dir(), ": tensor '", name, "' has shape ",
              shape_string(tensor.shape), ", config.json implies ", shape_string(shape));
  QSPEC_CHECK(tensor.dtype == DType::BF16 || tensor.dtype == DType::F16 || tensor.dtype == DType::F32,
              checkpoint.dir(), ": tensor '", name, "' has dtype ", dtype_name(tensor.dtype),
              "; expected BF16, F16 or F32 (quantized checkpoints load through qspec quantize)");
  return tensor;
}

std::vector<float> tensor_to_f32(const TensorView& tensor) {
  std::vector<float> out(static_cast<size_t>(tensor.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (tensor.dtype == DType::F32) {
      std::memcpy(&out[i], tensor.data + i * 4, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, tensor.data + i * 2, 2);
      out[i] = tensor.dtype == DType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
    }
  }
  return out;
}

// BF16 and F32 weights are used in place from the mapping when aligned; F16 (and
// misaligned data) is converted to an owned f32 copy once at load.
WeightMatrix bind_matrix(const Checkpoint& checkpoint, const std::string& name, int64_t rows,
                         int64_t cols) {
  const TensorView& tensor = expect_tensor(checkpoint, name, {rows, cols});
  WeightMatrix matrix;
  matrix.name = name;
  matrix.rows = rows;
  matrix.cols = cols;
  const size_t alignment = dtype_size(tensor.dtype);
  const bool aligned = reinterpret_cast<uintptr_t>(tensor.data) % alignment == 0;
  if ((tensor.dtype == DType::BF16 || tensor.dtype == DType::F32) && aligned) {
    matrix.dtype = tensor.dtype;
    matrix.data = tensor.data;
  } else {
    matrix.dtype = DType::F32;
    matrix.owned = tensor_to_f32(tensor);
    matrix.data = matrix.owned.data();
  }
  return matrix;
}

std::vector<float> bind_vector(const Checkpoint& checkpoint, const std::string& name, int64_t size) {
  return tensor_to_f32(expect_tensor(checkpoint, name, {size}));
}

size_t matrix_bytes(const WeightMatrix& matrix) {
  return static_cast<size_t>(matrix.rows * matrix.cols) * (matrix.dtype == DType::BF16 ? 2 : 4);
}

}  // namespace

namespace {

// The layers config.json declares against the layers the checkpoint holds, before anything is
// sized from num_hidden_layers: a tensor of a layer >= num_hidden_layers (a config that drops
// layers would silently run a truncated model) or a layer without any tensor is an Error.
void check_layer_count(const Checkpoint& checkpoint, const ModelConfig& config, const std::string& dir) {
  const std::string prefix = "model.layers.";
  std::vector<bool> present(static_cast<size_t>(config.num_layers), false);
  for (const std::string& name : checkpoint.names()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t end = name.find('.', prefix.size());
    const std::string index = name.substr(prefix.size(), end == std::string::npos ? std::string::npos : end - prefix.size());
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos) continue;
    const int64_t layer = std::stoll(index);
    QSPEC_CHECK(layer < config.num_layers, dir, ": tensor '", name, "' belongs to layer ", layer,
                ", but config.json has num_hidden_layers = ", config.num_layers, " (layers 0..", config.num_layers - 1,
                "): the config does not describe this checkpoint");
    present[static_cast<size_t>(layer)] = true;
  }
  for (int64_t layer = 0; layer < config.num_layers; ++layer)
    QSPEC_CHECK(present[static_cast<size_t>(layer)], dir, "/config.json: num_hidden_layers = ", config.num_layers,
                ", but the checkpoint has no tensors for layer ", layer, " ('", prefix, layer, ".*')");
}

}  // namespace

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& dir, bool read_draft_tables) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->dir_ = dir;
  // Every size is bounded and checked against the tensors before it sizes anything, so running
  // out of memory here means a real model too large for this machine: say which one.
  try {
    model->config_ = load_model_config(dir);
    model->checkpoint_ = Checkpoint::open(dir);
    check_layer_count(model->checkpoint_, model->config_, dir);
    const std::filesystem::path manifest_path = std::filesystem::path(dir) / kQuantManifestFile;
    std::error_code ignored;
    model->loaded_from_quantized_ = std::filesystem::exists(manifest_path, ignored);
    model->bind_weights();
    if (model->loaded_from_quantized_) model->bind_quantized_weights(read_quant_manifest(manifest_path.string()));
    for (int64_t l = 0; l < model->config_.num_layers; ++l)
      model->layer_rope_.push_back(rope_tables(model->config_, model->config_.layer_rope(l)));
    const std::filesystem::path table_path = std::filesystem::path(dir) / kDraftVocabFile;
    if (read_draft_tables && std::filesystem::exists(table_path, ignored))
      model->set_draft_vocab(read_draft_vocab_table(table_path.string()), table_path.string());
    const std::filesystem::path skip_path = std::filesystem::path(dir) / kDraftSkipFile;
    if (read_draft_tables && std::filesystem::exists(skip_path, ignored))
      model->set_draft_skip(read_draft_skip_table(skip_path.string()), skip_path.string());
  } catch (const std::bad_alloc&) {
    fail(dir, ": out of memory while loading the model");
  } catch (const std::length_error& error) {
    fail(dir, ": out of memory while loading the model (", error.what(), ")");
  }
  return model;
}

namespace {
// A Gemma norm multiplies by (1 + w): store the factor, as transformers computes it in f32.
void add_one(std::vector<float>& weight) {
  for (float& w : weight) w = 1.0f + w;
}

// Rounds to the dtype the checkpoint stores (what a transformers tensor of that dtype holds).
float round_to_dtype(float value, DType dtype) {
  if (dtype == DType::BF16) return bf16_to_f32(f32_to_bf16(value));
  if (dtype == DType::F16) return f16_to_f32(f32_to_f16(value));
  return value;
}
}  // namespace

void LlamaModel::bind_weights() {
  const ModelConfig& c = config_;
  const Checkpoint& ckpt = checkpoint_;
  recipe_ = c.recipe();
  embedding_ = bind_matrix(ckpt, "model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  embedding_dtype_ = ckpt.get("model.embed_tokens.weight").dtype;
  if (recipe_.scale_embeddings)
    embed_scale_ = round_to_dtype(std::sqrt(static_cast<float>(c.hidden_size)), embedding_dtype_);
  final_norm_ = bind_vector(ckpt, "model.norm.weight", c.hidden_size);
  if (recipe_.norm_adds_one) add_one(final_norm_);
  if (c.tie_word_embeddings) {
    lm_head_ = embedding_;
    lm_head_.owned.clear();
    lm_head_.data = embedding_.data;
  } else {
    lm_head_ = bind_matrix(ckpt, "lm_head.weight", c.vocab_size, c.hidden_size);
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  weight_bytes_ = 0;
  bind_lm_head_int8();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    LayerWeights& layer = layers_[i];
    layer.attention_norm = bind_vector(ckpt, prefix + "input_layernorm.weight", c.hidden_size);
    if (recipe_.output_norms) {
      // Gemma 3 names: post_attention_layernorm is the attention output's norm, the MLP's input
      // norm is pre_feedforward_layernorm.
      layer.attention_out_norm = bind_vector(ckpt, prefix + "post_attention_layernorm.weight", c.hidden_size);
      layer.mlp_norm = bind_vector(ckpt, prefix + "pre_feedforward_layernorm.weight", c.hidden_size);
      layer.mlp_out_norm = bind_vector(ckpt, prefix + "post_feedforward_layernorm.weight", c.hidden_size);
    } else {
      layer.mlp_norm = bind_vector(ckpt, prefix + "post_attention_layernorm.weight", c.hidden_size);
    }
    if (recipe_.qk_norm) {
      layer.q_norm = bind_vector(ckpt, prefix + "self_attn.q_norm.weight", c.head_dim);
      layer.k_norm = bind_vector(ckpt, prefix + "self_attn.k_norm.weight", c.head_dim);
    }
    if (recipe_.norm_adds_one)
      for (std::vector<float>* norm : {&layer.attention_norm, &layer.mlp_norm, &layer.q_norm, &layer.k_norm,
                                       &layer.attention_out_norm, &layer.mlp_out_norm})
        add_one(*norm);
    if (c.attention_bias) {
      layer.q_bias = bind_vector(ckpt, prefix + "self_attn.q_proj.bias", c.q_dim());
      layer.k_bias = bind_vector(ckpt, prefix + "self_attn.k_proj.bias", c.kv_dim());
      layer.v_bias = bind_vector(ckpt, prefix + "self_attn.v_proj.bias", c.kv_dim());
    }
    if (c.attention_output_bias) layer.o_bias = bind_vector(ckpt, prefix + "self_attn.o_proj.bias", c.hidden_size);
    if (c.mlp_bias) {
      layer.gate_bias = bind_vector(ckpt, prefix + "mlp.gate_proj.bias", c.intermediate_size);
      layer.up_bias = bind_vector(ckpt, prefix + "mlp.up_proj.bias", c.intermediate_size);
      layer.down_bias = bind_vector(ckpt, prefix + "mlp.down_proj.bias", c.hidden_size);
    }
    if (loaded_from_quantized_) continue;  // the projections are 4-bit: bind_quantized_weights
    layer.q_proj = bind_matrix(ckpt, prefix + "self_attn.q_proj.weight", c.q_dim(), c.hidden_size);
    layer.k_proj = bind_matrix(ckpt, prefix + "self_attn.k_proj.weight", c.kv_dim(), c.hidden_size);
    layer.v_proj = bind_matrix(ckpt, prefix + "self_attn.v_proj.weight", c.kv_dim(), c.hidden_size);
    layer.o_proj = bind_matrix(ckpt, prefix + "self_attn.o_proj.weight", c.hidden_size, c.q_dim());
    layer.gate_proj = bind_matrix(ckpt, prefix + "mlp.gate_proj.weight", c.intermediate_size, c.hidden_size);
    layer.up_proj = bind_matrix(ckpt, prefix + "mlp.up_proj.weight", c.intermediate_size, c.hidden_size);
    layer.down_proj = bind_matrix(ckpt, prefix + "mlp.down_proj.weight", c.hidden_size, c.intermediate_size);
    for (const WeightMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                  &layer.gate_proj, &layer.up_proj, &layer.down_proj})
      weight_bytes_ += matrix_bytes(*m);
  }
}

void LlamaModel::bind_lm_head_int8() {
  {
    // The draft heads are copies of the lm_head's rows: a new lm_head makes them anew.
    std::lock_guard<std::mutex> lock(draft_heads_->mutex);
    draft_heads_->by_rows.clear();
  }
  weight_bytes_ -= lm_head_bytes_;
  lm_head_int8_.reset();
  const char* forced = std::getenv("QSPEC_CPU_LM_HEAD");
  const std::string choice = forced ? forced : "";
  QSPEC_CHECK(choice.empty() || choice == "auto" || choice == "f32", "QSPEC_CPU_LM_HEAD=", choice,
              ": unknown lm_head storage (auto: int8 blocks when exact, f32: as loaded)");
  if (choice != "f32") lm_head_int8_ = cpu::exact_int8_blocks(lm_head_);
  lm_head_bytes_ = lm_head_int8_ ? lm_head_int8_->bytes() : matrix_bytes(lm_head_);
  weight_bytes_ += lm_head_bytes_;
}

size_t DraftHead::bytes() const {
  if (int8) return int8->bytes();
  return static_cast<size_t>(weight.rows * weight.cols) * (weight.dtype == DType::BF16 ? 2 : 4);
}

void LlamaModel::set_draft_vocab(DraftVocabTable table, const std::string& source) {
  check_draft_vocab_table(table, *this, source);
  QSPEC_CHECK(static_cast<int64_t>(table.ids.size()) >= decode_rules::kMinDraftVocab, source, ": field 'ids' holds ",
              table.ids.size(), " ids; a draft subset needs at least ", decode_rules::kMinDraftVocab);
  draft_vocab_ = std::move(table);
  std::lock_guard<std::mutex> lock(draft_heads_->mutex);
  draft_heads_->by_rows.clear();
}

void LlamaModel::check_draft_vocab(int64_t n) const {
  QSPEC_CHECK(draft_vocab_, "draft_vocab ", n, ": ", missing_draft_vocab_message(dir_));
  const int64_t available = static_cast<int64_t>(draft_vocab_->ids.size());
  QSPEC_CHECK(n >= decode_rules::kMinDraftVocab && n <= available, "draft_vocab ", n, " is outside ",
              decode_rules::kMinDraftVocab, "..", available, " (the ids of ", dir_, "/", kDraftVocabFile,
              "; `qspec tune-draft --vocab N` keeps more)");
}

void LlamaModel::set_draft_skip(DraftSkipTable table, const std::string& source) {
  check_draft_skip_table(table, *this, source);
  draft_skip_ = std::move(table);
}

void LlamaModel::check_draft_skip(int64_t n) const {
  QSPEC_CHECK(draft_skip_, "draft_skip ", n, ": ", missing_draft_skip_message(dir_));
  QSPEC_CHECK(n >= 1 && n <= draft_skip_->max_skip(), "draft_skip ", n, " is outside 1..", draft_skip_->max_skip(),
              " (the layers ", dir_, "/", kDraftSkipFile, " orders; `qspec tune-draft --skip-max N` orders more)");
}

std::vector<bool> LlamaModel::skipped_layers(int64_t n) const {
  std::vector<bool> skipped(static_cast<size_t>(config_.num_layers), false);
  if (n == 0) return skipped;
  check_draft_skip(n);
  for (int64_t i = 0; i < n; ++i) skipped[static_cast<size_t>(draft_skip_->order[static_cast<size_t>(i)])] = true;
  return skipped;
}

std::shared_ptr<const DraftHead> LlamaModel::draft_head(int64_t n) const {
  check_draft_vocab(n);
  std::lock_guard<std::mutex> lock(draft_heads_->mutex);
  std::shared_ptr<const DraftHead>& slot = draft_heads_->by_rows[n];
  if (slot) return slot;
  auto head = std::make_shared<DraftHead>();
  head->ids.assign(draft_vocab_->ids.begin(), draft_vocab_->ids.begin() + n);
  const int64_t cols = lm_head_.cols;
  WeightMatrix& w = head->weight;
  w.name = "draft lm_head";
  w.rows = n;
  w.cols = cols;
  w.dtype = lm_head_.dtype;
  if (lm_head_int8_) {
    const cpu::Int8BlockMatrix& full = *lm_head_int8_;
    cpu::Int8BlockMatrix sub;
    sub.name = w.name;
    sub.rows = n;
    sub.cols = full.cols;
    sub.codes.resize(static_cast<size_t>(n * full.cols));
    sub.scales.resize(static_cast<size_t>(n * full.blocks()));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t id = head->ids[static_cast<size_t>(j)];
      std::copy_n(&full.codes[static_cast<size_t>(id * full.cols)], full.cols, &sub.codes[static_cast<size_t>(j * full.cols)]);
      std::copy_n(&full.scales[static_cast<size_t>(id * full.blocks())], full.blocks(),
                  &sub.scales[static_cast<size_t>(j * full.blocks())]);
    }
    head->int8 = std::move(sub);
  } else if (lm_head_.dtype == DType::BF16) {
    head->bf16.resize(static_cast<size_t>(n * cols));
    const auto* bits = static_cast<const uint16_t*>(lm_head_.data);
    for (int64_t j = 0; j < n; ++j)
      std::copy_n(bits + head->ids[static_cast<size_t>(j)] * cols, cols, &head->bf16[static_cast<size_t>(j * cols)]);
    w.data = head->bf16.data();
  } else {
    w.owned.resize(static_cast<size_t>(n * cols));
    for (int64_t j = 0; j < n; ++j) lm_head_.row_to_f32(head->ids[static_cast<size_t>(j)], &w.owned[static_cast<size_t>(j * cols)]);
    w.data = w.owned.data();
  }
  slot = std::move(head);
  return slot;
}

std::string LlamaModel::weight_dtype() const {
  if (loaded_from_quantized_) return quantized_format() + " (embedding and lm_head " + std::string(dtype_name(lm_head_.dtype)) + ")";
  return std::string(dtype_name(layers_.empty() ? lm_head_.dtype : layers_[0].q_proj.dtype));
}

std::string_view linear_site_name(LinearSite site) {
  switch (site) {
    case LinearSite::attention_in: return "attn_in";
    case LinearSite::attention_out: return "attn_out";
    case LinearSite::mlp_in: return "mlp_in";
    case LinearSite::mlp_out: return "mlp_out";
  }
  return "?";
}

int64_t ArcSite::outliers(quant::Format activation_format) const {
  switch (activation_format) {
    case quant::Format::int4: return outliers_int4;
    case quant::Format::nvfp4: return outliers_nvfp4;
    case quant::Format::mxfp4: return outliers_mxfp4;
    default: fail("ARC residual channels need int4, nvfp4 or mxfp4 activations, not ", quant::format_name(activation_format));
  }
}

std::string QuantizationInfo::describe() const {
  std::string text(quant::format_name(format));
  if (quant::format_has_groups(format)) text += " g" + std::to_string(group_size);
  text += " " + method;
  if (details.contains("arc") && details["arc"].value("enabled", false)) text += " + arc";
  if (details.contains("rotation") && details["rotation"].value("enabled", false)) text += " + hadamard";
  return text;
}

KvCache LlamaModel::new_cache(int64_t capacity, KvCacheFormat format) const {
  if (capacity <= 0) capacity = config_.max_position_embeddings;
  return KvCache(config_.num_layers, capacity, config_.num_kv_heads, config_.head_dim, format);
}

namespace {
const float* bias_or_null(const std::vector<float>& bias) { return bias.empty() ? nullptr : bias.data(); }
}  // namespace

int64_t LlamaModel::auto_group_size() const {
  const ModelConfig& c = config_;
  for (int64_t group : {int64_t{128}, int64_t{64}, int64_t{32}})
    if (c.hidden_size % group == 0 && c.q_dim() % group == 0 && c.intermediate_size % group == 0) return group;
  fail(dir_, ": no int4 group size (128, 64, 32) divides every linear layer's K (hidden ", c.hidden_size,
       ", attention ", c.q_dim(), ", intermediate ", c.intermediate_size, "); pass one that does");
}

void LlamaModel::quantize_weights(quant::Format format, int64_t group_size) {
  QuantizeOptions options;
  options.format = format;
  options.group_size = group_size;
  options.block_fit = quant::BlockFit::range;  // load time: the ~40x cheaper grids (quantize.h)
  quantize_model(*this, options, nullptr);
}

void LlamaModel::set_quantized_weights(std::vector<QuantizedLayerWeights> layers, QuantizationInfo info) {
  const ModelConfig& c = config_;
  QSPEC_CHECK(static_cast<int64_t>(layers.size()) == c.num_layers, "quantized weights for ", layers.size(),
              " layers, the model has ", c.num_layers);
  for (size_t l = 0; l < layers.size(); ++l) {
    QuantizedLayerWeights& layer = layers[l];
    const int64_t site_k[kLinearSites] = {c.hidden_size, c.q_dim(), c.hidden_size, c.intermediate_size};
    for (int s = 0; s < kLinearSites; ++s) {
      const ArcSite& site = layer.sites[s];
      const std::string where = "layer " + std::to_string(l) + " " + std::string(linear_site_name(LinearSite(s)));
      if (!site.calibrated()) {
        QSPEC_CHECK(site.tail == 0, where, ": augmented columns without a channel order");
        continue;
      }
      QSPEC_CHECK(static_cast<int64_t>(site.order.size()) == site_k[s], where, ": channel order has ",
                  site.order.size(), " entries, the input has ", site_k[s], " channels");
      std::vector<bool> seen(site.order.size(), false);
      for (int32_t channel : site.order) {
        QSPEC_CHECK(channel >= 0 && channel < site_k[s] && !seen[static_cast<size_t>(channel)], where,
                    ": channel order is not a permutation of 0..", site_k[s] - 1);
        seen[static_cast<size_t>(channel)] = true;
      }
      QSPEC_CHECK(site.tail >= 0 && site.tail <= site_k[s], where, ": ", site.tail, " augmented columns for K=", site_k[s]);
      for (int64_t outliers : {site.outliers_int4, site.outliers_nvfp4, site.outliers_mxfp4})
        QSPEC_CHECK(outliers >= 0 && outliers <= site.tail, where, ": S=", outliers, " exceeds the ", site.tail,
                    " augmented columns");
    }
    auto check = [&](const QuantizedMatrix& m, int64_t rows, int64_t k, LinearSite s) {
      const int64_t cols = k + layer.sites[static_cast<int>(s)].tail;
      QSPEC_CHECK(m.rows == rows && m.cols() == cols, m.name, ": 4-bit matrix is [", m.rows, " x ", m.cols(),
                  "], expected [", rows, " x ", cols, "]");
      // One 4-bit format, and beside it only the 8-bit tensors an import keeps (quant_checkpoint.h).
      QSPEC_CHECK(m.format.format == info.format || m.format.format == quant::kSideWeightFormat, m.name, ": format ",
                  quant::format_name(m.format.format), " differs from the model's ", quant::format_name(info.format));
    };
    check(layer.q_proj, c.q_dim(), c.hidden_size, LinearSite::attention_in);
    check(layer.k_proj, c.kv_dim(), c.hidden_size, LinearSite::attention_in);
    check(layer.v_proj, c.kv_dim(), c.hidden_size, LinearSite::attention_in);
    check(layer.o_proj, c.hidden_size, c.q_dim(), LinearSite::attention_out);
    check(layer.gate_proj, c.intermediate_size, c.hidden_size, LinearSite::mlp_in);
    check(layer.up_proj, c.intermediate_size, c.hidden_size, LinearSite::mlp_in);
    check(layer.down_proj, c.hidden_size, c.intermediate_size, LinearSite::mlp_out);
  }
  quantized_layers_ = std::move(layers);
  quantization_ = std::move(info);
}

void LlamaModel::set_quantized_layer_for_calibration(int64_t l, QuantizedLayerWeights layer) {
  QSPEC_CHECK(l >= 0 && l < config_.num_layers, "set_quantized_layer_for_calibration: layer ", l, " out of range");
  quantized_layers_.resize(static_cast<size_t>(config_.num_layers));
  quantized_layers_[static_cast<size_t>(l)] = std::move(layer);
}

namespace {
// An owned f32 copy of a (possibly mapped bf16) matrix, to transform in place.
void make_owned_f32(WeightMatrix& m) {
  std::vector<float> data(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.row_to_f32(r, data.data() + r * m.cols);
  m.owned = std::move(data);
  m.data = m.owned.data();
  m.dtype = DType::F32;
}
float* mutable_f32(WeightMatrix& m) { return m.owned.data(); }
}  // namespace

void LlamaModel::apply_hadamard_rotation(uint64_t seed) {
  QSPEC_CHECK(has_checkpoint_weights() && !has_quantized_weights(), dir_,
              ": rotate the 16-bit checkpoint before quantizing it");
  QSPEC_CHECK(!rotated_, dir_, ": already rotated");
  QSPEC_CHECK(!recipe_.output_norms, dir_, ": Hadamard rotation of ", config_.architecture_name,
              " is not supported (its norms on the attention and MLP outputs do not commute with a rotation "
              "of the residual stream)");
  const ModelConfig& c = config_;
  const quant::HadamardRotation q = quant::make_hadamard_rotation(c.hidden_size, seed);
  quant::HadamardRotation q2 = quant::make_hadamard_rotation(c.intermediate_size, seed + 1);
  // lm_head <- lm_head diag(g_final) Q (its own copy: a tied embedding is untied, since the
  // two now differ), final norm <- ones.
  WeightMatrix head = lm_head_;
  head.name = "lm_head.weight";
  make_owned_f32(head);
  quant::fold_norm_into_linear(final_norm_.data(), mutable_f32(head), head.rows, head.cols);
  quant::rotate_linear_input(q, mutable_f32(head), head.rows, head.cols);
  lm_head_ = std::move(head);
  bind_lm_head_int8();  // the rotated matrix is no longer int8 blocks
  std::fill(final_norm_.begin(), final_norm_.end(), 1.0f);
  config_.tie_word_embeddings = false;
  make_owned_f32(embedding_);
  quant::rotate_embedding(q, mutable_f32(embedding_), embedding_.rows, embedding_.cols);
  for (LayerWeights& layer : layers_) {
    for (WeightMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj,
                            &layer.up_proj, &layer.down_proj})
      make_owned_f32(*m);
    for (WeightMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj}) {
      quant::fold_norm_into_linear(layer.attention_norm.data(), mutable_f32(*m), m->rows, m->cols);
      quant::rotate_linear_input(q, mutable_f32(*m), m->rows, m->cols);
    }
    for (WeightMatrix* m : {&layer.gate_proj, &layer.up_proj}) {
      quant::fold_norm_into_linear(layer.mlp_norm.data(), mutable_f32(*m), m->rows, m->cols);
      quant::rotate_linear_input(q, mutable_f32(*m), m->rows, m->cols);
    }
    std::fill(layer.attention_norm.begin(), layer.attention_norm.end(), 1.0f);
    std::fill(layer.mlp_norm.begin(), layer.mlp_norm.end(), 1.0f);
    quant::rotate_linear_output(q, mutable_f32(layer.o_proj), layer.o_proj.rows, layer.o_proj.cols,
                                layer.o_bias.empty() ? nullptr : layer.o_bias.data());
    quant::rotate_linear_output(q, mutable_f32(layer.down_proj), layer.down_proj.rows, layer.down_proj.cols,
                                layer.down_bias.empty() ? nullptr : layer.down_bias.data());
    quant::rotate_linear_input(q2, mutable_f32(layer.down_proj), layer.down_proj.rows, layer.down_proj.cols);
  }
  mlp_rotation_ = std::move(q2);
  rotated_ = true;
  rotation_seed_ = seed;
}

void LlamaModel::set_rotation_from_manifest(uint64_t seed) {
  mlp_rotation_ = quant::make_hadamard_rotation(config_.intermediate_size, seed + 1);
  rotated_ = true;
  rotation_seed_ = seed;
}

std::unique_ptr<LlamaModel> LlamaModel::without_weights(const ModelConfig& config, QuantizationInfo quantization) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->config_ = config;
  model->dir_ = "(weights elsewhere)";
  model->weightless_ = true;
  model->loaded_from_quantized_ = true;  // no 16-bit weights either
  model->quantization_ = std::move(quantization);
  return model;
}

bool LlamaModel::has_arc() const {
  for (const QuantizedLayerWeights& layer : quantized_layers_)
    for (const ArcSite& site : layer.sites)
      if (site.calibrated()) return true;
  return false;
}

std::string LlamaModel::quantized_format() const {
  if (!has_quantized_weights()) return std::string();
  // Projections kept in another format beside the set (a GGUF's 8-bit tensors) are counted.
  int64_t others = 0;
  for (const QuantizedLayerWeights& layer : quantized_layers_)
    for (const QuantizedMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj,
                                     &layer.up_proj, &layer.down_proj})
      others += m->format.format != quantization_.format;
  std::string text = quantization_.describe();
  if (others > 0)
    text += " + " + std::to_string(others) + " of " + std::to_string(7 * quantized_layers_.size()) + " projections " +
            std::string(quant::format_name(quant::kSideWeightFormat));
  return text;
}

size_t LlamaModel::quantized_weight_bytes() const {
  size_t bytes = 0;
  for (const QuantizedLayerWeights& layer : quantized_layers_)
    for (const QuantizedMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                     &layer.gate_proj, &layer.up_proj, &layer.down_proj})
      bytes += m->bytes();
  return bytes;
}

LlamaModel::SiteInput LlamaModel::site_input(int64_t l, LinearSite site_id, const RunMode& mode, float* x,
                                             int64_t count, int64_t k, Workspace& workspace) const {
  const ActivationMode& activations = mode.activations;
  if (!mode.quantized_weights) {
    cpu::apply_activation_mode(activations, x, count, k);
    return {x};
  }
  const ArcSite& site = quantized_layers_[static_cast<size_t>(l)].sites[static_cast<int>(site_id)];
  if (activations.arc)
    QSPEC_CHECK(site.calibrated(), "mode ", mode.name, " needs ARC calibration (qspec quantize --arc); ",
                "these 4-bit weights (", quantized_format(), ") have none");
  if (!site.calibrated()) {
    if (activations.kind == ActivationMode::Kind::quantized && activations.format == quant::Format::int8 &&
        !activations.arc) {
      // W4A8: int8 codes once for the site's projections, which dot them in integer arithmetic.
      cpu::quantize_activations_int8(x, count, k, workspace.int8);
      return {nullptr, &workspace.int8};
    }
    cpu::apply_activation_mode(activations, x, count, k);
    return {x};
  }
  // Reorder (a gather; a GPU kernel fuses it into the quantizer), quantize, and lay out
  // [Q(X) | 0 ... 0 | Q(R)] against the augmented weights [W | W_tail].
  const int64_t width = k + site.tail;
  std::vector<float>& reordered = workspace.site_scratch;
  reordered.resize(static_cast<size_t>(count * k));
  for (int64_t t = 0; t < count; ++t)
    for (int64_t j = 0; j < k; ++j) reordered[t * k + j] = x[t * k + site.order[j]];
  std::vector<float>& out = workspace.site_input;
  out.assign(static_cast<size_t>(count * width), 0.0f);
  if (activations.arc) {
    const int64_t outliers = site.outliers(activations.format);
    const quant::ArcRow arc = quant::make_arc_row(activations.format, k, outliers, quant::ArcLayout::concatenated,
                                                  activations.group_size);
    std::vector<float> augmented(static_cast<size_t>(k + outliers));
    for (int64_t t = 0; t < count; ++t) {
      quant::arc_fake_quantize_row(arc, reordered.data() + t * k, augmented.data());
      float* row = out.data() + t * width;
      std::copy(augmented.begin(), augmented.begin() + k, row);
      std::copy(augmented.begin() + k, augmented.end(), row + width - outliers);
    }
  } else {
    cpu::apply_activation_mode(activations, reordered.data(), count, k);
    for (int64_t t = 0; t < count; ++t)
      std::copy(reordered.begin() + t * k, reordered.begin() + (t + 1) * k, out.begin() + t * width);
  }
  return {out.data()};
}

LlamaModel::Workspace LlamaModel::make_workspace(int64_t tokens) const {
  const ModelConfig& c = config_;
  Workspace w;
  w.normed.resize(static_cast<size_t>(tokens * c.hidden_size));
  w.q.resize(static_cast<size_t>(tokens * c.q_dim()));
  w.k.resize(static_cast<size_t>(tokens * c.kv_dim()));
  w.v.resize(static_cast<size_t>(tokens * c.kv_dim()));
  w.attn.resize(static_cast<size_t>(tokens * c.q_dim()));
  w.gate.resize(static_cast<size_t>(tokens * c.intermediate_size));
  w.up.resize(static_cast<size_t>(tokens * c.intermediate_size));
  w.projected.resize(static_cast<size_t>(tokens * c.hidden_size));
  return w;
}

void LlamaModel::run_layer(int64_t l, float* x, int64_t count, const int32_t* positions, KvCache& cache,
                           const RunMode& mode, ForwardObserver* observer, Workspace& w) const {
  const Segment segment{0, count, cache.blocks()};
  run_layer(l, x, count, positions, std::span<const Segment>(&segment, 1), mode, observer, w);
}

void LlamaModel::run_layer(int64_t l, float* x, int64_t count, const int32_t* positions,
                           std::span<const Segment> segments, const RunMode& mode, ForwardObserver* observer,
                           Workspace& w) const {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, q_dim = c.q_dim(), kv_dim = c.kv_dim(), inter = c.intermediate_size;
  const LayerWeights& layer = layers_[static_cast<size_t>(l)];
  using Q = QuantizedLayerWeights;
  // A site's input in the run mode (observed first, then quantized as the mode says).
  auto input = [&](LinearSite site, float* values, int64_t k) {
    if (observer) observer->observe(l, site, values, count, k);
    return site_input(l, site, mode, values, count, k, w);
  };
  // A linear layer in the run mode: checkpoint or 4-bit weights.
  auto project = [&](const SiteInput& in, const WeightMatrix& weight, QuantizedMatrix Q::*quantized,
                     const std::vector<float>& bias, float* out) {
    if (!mode.quantized_weights) return cpu::linear(in.values, count, weight, bias_or_null(bias), out);
    const QuantizedMatrix& matrix = quantized_layers_[static_cast<size_t>(l)].*quantized;
    if (in.int8) return cpu::quantized_linear(*in.int8, matrix, bias_or_null(bias), out);
    cpu::quantized_linear(in.values, count, matrix, bias_or_null(bias), out);
  };
  // Attention block: each token's K/V row goes into its sequence's cache at its position,
  // then each sequence's queries attend over their own cache (within the layer's window).
  const RopeTables& rope = layer_rope_[static_cast<size_t>(l)];
  cpu::rmsnorm(x, layer.attention_norm.data(), count, hidden, c.rms_norm_eps, w.normed.data());
  // Projections that share a site's input: on 4-bit weights one parallel region for all of them.
  auto project_all = [&](const SiteInput& in, std::initializer_list<const WeightMatrix*> weights,
                         std::initializer_list<QuantizedMatrix Q::*> quantized,
                         std::initializer_list<const std::vector<float>*> biases, std::initializer_list<float*> outs) {
    if (!mode.quantized_weights) {
      for (size_t i = 0; i < weights.size(); ++i)
        project(in, *weights.begin()[i], quantized.begin()[i], *biases.begin()[i], outs.begin()[i]);
      return;
    }
    cpu::LinearOutput fused[4];
    for (size_t i = 0; i < quantized.size(); ++i)
      fused[i] = {&(quantized_layers_[static_cast<size_t>(l)].*quantized.begin()[i]), bias_or_null(*biases.begin()[i]),
                  outs.begin()[i]};
    const std::span<const cpu::LinearOutput> outputs(fused, quantized.size());
    if (in.int8) return cpu::quantized_linear(*in.int8, outputs);
    cpu::quantized_linear(in.values, count, outputs);
  };
  SiteInput in = input(LinearSite::attention_in, w.normed.data(), hidden);
  project_all(in, {&layer.q_proj, &layer.k_proj, &layer.v_proj}, {&Q::q_proj, &Q::k_proj, &Q::v_proj},
              {&layer.q_bias, &layer.k_bias, &layer.v_bias}, {w.q.data(), w.k.data(), w.v.data()});
  if (recipe_.qk_norm) {  // per head, in place
    cpu::rmsnorm(w.q.data(), layer.q_norm.data(), count * c.num_heads, c.head_dim, c.rms_norm_eps, w.q.data());
    cpu::rmsnorm(w.k.data(), layer.k_norm.data(), count * c.num_kv_heads, c.head_dim, c.rms_norm_eps, w.k.data());
  }
  cpu::rope(w.q.data(), count, c.num_heads, c.head_dim, positions, rope.inv_freq.data(), rope.attention_scaling);
  cpu::rope(w.k.data(), count, c.num_kv_heads, c.head_dim, positions, rope.inv_freq.data(), rope.attention_scaling);
  const cpu::AttentionShape shape = attention_shape(c, l, mode);
  for (const Segment& segment : segments) {
    cpu::PagedKv kv;
    kv.block_table = segment.kv.block_table;
    kv.block_size = segment.kv.block_size;
    kv.format = segment.kv.format;
    if (segment.kv.format == KvCacheFormat::int8) {
      // The 8-bit cache: each (position, KV head) row quantized as it is written (kv8's rule),
      // read back in the mode's view (a `/k4` draft: the high nibbles).
      kv.keys8 = segment.kv.keys8[l];
      kv.values8 = segment.kv.values8[l];
      kv.view = mode.kv_high_nibble ? KvView::high_nibble : KvView::full;
      for (int64_t t = segment.first; t < segment.first + segment.count; ++t) {
        const int64_t row = segment.kv.row(positions[t]);
        cpu::kv8_write_row(kv.keys8, row, w.k.data() + t * kv_dim, c.num_kv_heads, c.head_dim);
        cpu::kv8_write_row(kv.values8, row, w.v.data() + t * kv_dim, c.num_kv_heads, c.head_dim);
      }
    } else {
      float* keys = segment.kv.keys[l];
      float* values = segment.kv.values[l];
      for (int64_t t = segment.first; t < segment.first + segment.count; ++t) {
        const int64_t row = segment.kv.row(positions[t]);
        std::copy_n(w.k.data() + t * kv_dim, kv_dim, keys + row * kv_dim);
        std::copy_n(w.v.data() + t * kv_dim, kv_dim, values + row * kv_dim);
      }
      kv.keys = keys;
      kv.values = values;
    }
    cpu::attention(w.q.data() + segment.first * q_dim, segment.count, positions + segment.first, kv, shape,
                   w.attn.data() + segment.first * q_dim);
  }
  in = input(LinearSite::attention_out, w.attn.data(), q_dim);
  project(in, layer.o_proj, &Q::o_proj, layer.o_bias, w.projected.data());
  if (recipe_.output_norms)
    cpu::rmsnorm(w.projected.data(), layer.attention_out_norm.data(), count, hidden, c.rms_norm_eps, w.projected.data());
  for (int64_t i = 0; i < count * hidden; ++i) x[i] += w.projected[i];
  // MLP block: down(act(gate) * up), SwiGLU or GeGLU.
  cpu::rmsnorm(x, layer.mlp_norm.data(), count, hidden, c.rms_norm_eps, w.normed.data());
  in = input(LinearSite::mlp_in, w.normed.data(), hidden);
  project_all(in, {&layer.gate_proj, &layer.up_proj}, {&Q::gate_proj, &Q::up_proj}, {&layer.gate_bias, &layer.up_bias},
              {w.gate.data(), w.up.data()});
  if (recipe_.activation == MlpActivation::gelu_tanh) cpu::gelu_tanh_mul(w.gate.data(), w.up.data(), count * inter, w.gate.data());
  else cpu::silu_mul(w.gate.data(), w.up.data(), count * inter, w.gate.data());
  if (rotated_) quant::rotate_rows(mlp_rotation_, w.gate.data(), count);  // online Q2 (W_down holds Q2 too)
  in = input(LinearSite::mlp_out, w.gate.data(), inter);
  project(in, layer.down_proj, &Q::down_proj, layer.down_bias, w.projected.data());
  if (recipe_.output_norms)
    cpu::rmsnorm(w.projected.data(), layer.mlp_out_norm.data(), count, hidden, c.rms_norm_eps, w.projected.data());
  for (int64_t i = 0; i < count * hidden; ++i) x[i] += w.projected[i];
}

void LlamaModel::input_embedding(int32_t id, float* row) const {
  embedding_.row_to_f32(id, row);
  if (recipe_.scale_embeddings)
    for (int64_t i = 0; i < config_.hidden_size; ++i) row[i] = round_to_dtype(row[i] * embed_scale_, embedding_dtype_);
}

void LlamaModel::forward(std::span<const int32_t> tokens, KvCache& cache, std::vector<float>& logits,
                         bool all_logits, const RunMode& mode, ForwardObserver* observer) const {
  const int64_t count = static_cast<int64_t>(tokens.size());
  QSPEC_CHECK(count > 0, "forward: no tokens");
  QSPEC_CHECK(cache.length() + count <= cache.capacity(), "forward: ", cache.length() + count,
              " tokens exceed the KV cache capacity of ", cache.capacity(),
              " (the model's context is ", config_.max_position_embeddings, ")");
  const SequenceChunk chunk{tokens, cache.length(), cache.blocks(),
                            all_logits ? SequenceChunk::Logits::all : SequenceChunk::Logits::last};
  forward_batch(std::span<const SequenceChunk>(&chunk, 1), logits, mode, observer);
  cache.length_ += count;
}

void LlamaModel::forward_batch(std::span<const SequenceChunk> chunks, std::vector<float>& logits,
                               const RunMode& mode, ForwardObserver* observer) const {
  const ModelConfig& c = config_;
  QSPEC_CHECK(!chunks.empty(), "forward: no sequences");
  QSPEC_CHECK(!weightless_, "forward: this model has no weights here (LlamaModel::without_weights: its backend "
              "holds them)");
  QSPEC_CHECK(!mode.quantized_weights || has_quantized_weights(), "mode ", mode.name,
              " needs 4-bit weights: quantize the model first (qspec --weights FORMAT)");
  QSPEC_CHECK(mode.quantized_weights || has_checkpoint_weights(), "mode ", mode.name, " needs the checkpoint's ",
              "16-bit weights; ", dir_, " holds only 4-bit weights (", quantized_format(), ")");
  const int64_t hidden = c.hidden_size;

  // Flatten the chunks into one token matrix; remember which rows want logits.
  int64_t count = 0;
  for (const SequenceChunk& chunk : chunks) count += static_cast<int64_t>(chunk.tokens.size());
  std::vector<int32_t> positions;
  std::vector<Segment> segments;
  std::vector<int64_t> logit_rows;
  std::vector<float> x(static_cast<size_t>(count * hidden));
  positions.reserve(static_cast<size_t>(count));
  for (const SequenceChunk& chunk : chunks) {
    const int64_t n = static_cast<int64_t>(chunk.tokens.size()), first = static_cast<int64_t>(positions.size());
    QSPEC_CHECK(n > 0, "forward: a sequence chunk has no tokens");
    QSPEC_CHECK(chunk.start >= 0 && chunk.start + n <= c.max_position_embeddings, "forward: positions ",
                chunk.start, "..", chunk.start + n - 1, " exceed the model's context of ", c.max_position_embeddings);
    QSPEC_CHECK(chunk.kv.has_rows(), "forward: a sequence chunk has no KV cache");
    QSPEC_CHECK(!mode.kv_high_nibble || chunk.kv.format == KvCacheFormat::int8, "forward: mode ", mode.key(),
                " reads the high nibbles of an 8-bit KV cache (a /k4 draft); this cache is ",
                kv_cache_format_name(chunk.kv.format), " (--kv-cache int8)");
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = chunk.tokens[static_cast<size_t>(t)];
      QSPEC_CHECK(id >= 0 && id < c.vocab_size, "forward: token id ", id, " outside the vocabulary [0, ",
                  c.vocab_size, ")");
      input_embedding(id, &x[static_cast<size_t>((first + t) * hidden)]);
      positions.push_back(static_cast<int32_t>(chunk.start + t));
    }
    segments.push_back(Segment{first, n, chunk.kv});
    if (chunk.logits == SequenceChunk::Logits::all)
      for (int64_t t = 0; t < n; ++t) logit_rows.push_back(first + t);
    else if (chunk.logits == SequenceChunk::Logits::last)
      logit_rows.push_back(first + n - 1);
  }
  Workspace workspace = make_workspace(count);
  // A draft's skipped layers are the identity on the residual stream and write no K/V: the
  // verify, which runs them all, rewrites every layer's rows of the cycle.
  const std::vector<bool> skipped = skipped_layers(mode.skip_layers);
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (!skipped[static_cast<size_t>(l)])
      run_layer(l, x.data(), count, positions.data(), segments, mode, observer, workspace);

  const int64_t rows = static_cast<int64_t>(logit_rows.size());
  // Gather the wanted rows (in place: row i <= logit_rows[i]), then norm + lm_head.
  for (int64_t i = 0; i < rows; ++i)
    if (logit_rows[i] != i) std::copy_n(&x[logit_rows[i] * hidden], hidden, &x[i * hidden]);
  output_logits(x.data(), rows, mode, workspace, logits);
}

void LlamaModel::output_logits(const float* x, int64_t rows, const RunMode& mode, Workspace& workspace,
                               std::vector<float>& logits) const {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  logits.resize(static_cast<size_t>(rows * c.vocab_size));
  if (rows == 0) return;
  cpu::rmsnorm(x, final_norm_.data(), rows, hidden, c.rms_norm_eps, workspace.normed.data());
  if (mode.vocab_subset > 0) {
    // A draft with a vocabulary subset: its rows of the lm_head only, every other logit -inf
    // (the softmax over the subset; the same values as the whole lm_head's on those ids).
    const std::shared_ptr<const DraftHead> head = draft_head(mode.vocab_subset);
    const int64_t n = head->rows();
    std::vector<float> subset(static_cast<size_t>(rows * n));
    if (head->int8) cpu::int8_linear(workspace.normed.data(), rows, *head->int8, nullptr, subset.data());
    else cpu::linear(workspace.normed.data(), rows, head->weight, nullptr, subset.data());
    if (c.final_logit_softcapping)
      cpu::soft_cap(subset.data(), rows * n, static_cast<float>(*c.final_logit_softcapping));
    cpu::scatter_subset_logits(subset.data(), rows, n, head->ids.data(), c.vocab_size, logits.data());
    return;
  }
  if (lm_head_int8_) cpu::int8_linear(workspace.normed.data(), rows, *lm_head_int8_, nullptr, logits.data());
  else cpu::linear(workspace.normed.data(), rows, lm_head_, nullptr, logits.data());
  if (c.final_logit_softcapping)
    cpu::soft_cap(logits.data(), rows * c.vocab_size, static_cast<float>(*c.final_logit_softcapping));
}

}  // namespace qspec
