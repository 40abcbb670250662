#include "model/llama.h"

#include <algorithm>
#include <cstring>

#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "qspec/error.h"

namespace qspec {

KvCache::KvCache(int64_t layers, int64_t capacity, int64_t kv_dim)
    : capacity_(capacity), kv_dim_(kv_dim), keys_(layers), values_(layers) {
  for (int64_t layer = 0; layer < layers; ++layer) {
    keys_[layer].resize(static_cast<size_t>(capacity * kv_dim));
    values_[layer].resize(static_cast<size_t>(capacity * kv_dim));
  }
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

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& dir) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->dir_ = dir;
  model->config_ = ModelConfig::load(dir);
  QSPEC_CHECK(model->config_.head_dim <= 1024, dir, "/config.json: head_dim ",
              model->config_.head_dim, " exceeds the supported 1024");
  model->checkpoint_ = Checkpoint::open(dir);
  model->bind_weights();
  RopeTables tables = rope_tables(model->config_);
  model->inv_freq_ = tables.inv_freq;
  model->rope_attention_scaling_ = tables.attention_scaling;
  return model;
}

void LlamaModel::bind_weights() {
  const ModelConfig& c = config_;
  const Checkpoint& ckpt = checkpoint_;
  embedding_ = bind_matrix(ckpt, "model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  final_norm_ = bind_vector(ckpt, "model.norm.weight", c.hidden_size);
  if (c.tie_word_embeddings) {
    lm_head_ = embedding_;
    lm_head_.owned.clear();
    lm_head_.data = embedding_.data;
  } else {
    lm_head_ = bind_matrix(ckpt, "lm_head.weight", c.vocab_size, c.hidden_size);
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  weight_bytes_ = matrix_bytes(lm_head_);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    LayerWeights& layer = layers_[i];
    layer.attention_norm = bind_vector(ckpt, prefix + "input_layernorm.weight", c.hidden_size);
    layer.mlp_norm = bind_vector(ckpt, prefix + "post_attention_layernorm.weight", c.hidden_size);
    layer.q_proj = bind_matrix(ckpt, prefix + "self_attn.q_proj.weight", c.q_dim(), c.hidden_size);
    layer.k_proj = bind_matrix(ckpt, prefix + "self_attn.k_proj.weight", c.kv_dim(), c.hidden_size);
    layer.v_proj = bind_matrix(ckpt, prefix + "self_attn.v_proj.weight", c.kv_dim(), c.hidden_size);
    layer.o_proj = bind_matrix(ckpt, prefix + "self_attn.o_proj.weight", c.hidden_size, c.q_dim());
    layer.gate_proj = bind_matrix(ckpt, prefix + "mlp.gate_proj.weight", c.intermediate_size, c.hidden_size);
    layer.up_proj = bind_matrix(ckpt, prefix + "mlp.up_proj.weight", c.intermediate_size, c.hidden_size);
    layer.down_proj = bind_matrix(ckpt, prefix + "mlp.down_proj.weight", c.hidden_size, c.intermediate_size);
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
    for (const WeightMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                  &layer.gate_proj, &layer.up_proj, &layer.down_proj})
      weight_bytes_ += matrix_bytes(*m);
  }
}

std::string LlamaModel::weight_dtype() const {
  return std::string(dtype_name(layers_.empty() ? lm_head_.dtype : layers_[0].q_proj.dtype));
}

KvCache LlamaModel::new_cache(int64_t capacity) const {
  if (capacity <= 0) capacity = config_.max_position_embeddings;
  return KvCache(config_.num_layers, capacity, config_.kv_dim());
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
  if (group_size == 0) group_size = auto_group_size();
  std::vector<QuantizedLayerWeights> quantized(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& layer = layers_[l];
    QuantizedLayerWeights& out = quantized[l];
    out.q_proj = quantize_rtn(layer.q_proj, format, group_size);
    out.k_proj = quantize_rtn(layer.k_proj, format, group_size);
    out.v_proj = quantize_rtn(layer.v_proj, format, group_size);
    out.o_proj = quantize_rtn(layer.o_proj, format, group_size);
    out.gate_proj = quantize_rtn(layer.gate_proj, format, group_size);
    out.up_proj = quantize_rtn(layer.up_proj, format, group_size);
    out.down_proj = quantize_rtn(layer.down_proj, format, group_size);
  }
  quantized_layers_ = std::move(quantized);
  quantized_format_ = std::string(quant::format_name(format));
  if (format == quant::Format::int4) quantized_format_ += " g" + std::to_string(group_size);
}

size_t LlamaModel::quantized_weight_bytes() const {
  size_t bytes = 0;
  for (const QuantizedLayerWeights& layer : quantized_layers_)
    for (const QuantizedMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                     &layer.gate_proj, &layer.up_proj, &layer.down_proj})
      bytes += m->bytes();
  return bytes;
}

void LlamaModel::forward(std::span<const int32_t> tokens, KvCache& cache, std::vector<float>& logits,
                         bool all_logits, const RunMode& mode) const {
  const ModelConfig& c = config_;
  const int64_t count = static_cast<int64_t>(tokens.size());
  QSPEC_CHECK(count > 0, "forward: no tokens");
  QSPEC_CHECK(cache.length() + count <= cache.capacity(), "forward: ", cache.length() + count,
              " tokens exceed the KV cache capacity of ", cache.capacity(),
              " (the model's context is ", c.max_position_embeddings, ")");
  const int64_t hidden = c.hidden_size, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const int64_t start = cache.length();

  std::vector<int32_t> positions(count);
  for (int64_t t = 0; t < count; ++t) positions[t] = static_cast<int32_t>(start + t);

  std::vector<float> x(count * hidden), normed(count * hidden), q(count * q_dim),
      attn(count * q_dim), gate(count * c.intermediate_size), up(count * c.intermediate_size),
      projected(count * hidden);
  for (int64_t t = 0; t < count; ++t) {
    QSPEC_CHECK(tokens[t] >= 0 && tokens[t] < c.vocab_size, "forward: token id ", tokens[t],
                " outside the vocabulary [0, ", c.vocab_size, ")");
    embedding_.row_to_f32(tokens[t], &x[t * hidden]);
  }
  const cpu::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, c.sliding_window.value_or(0)};
  QSPEC_CHECK(!mode.quantized_weights || has_quantized_weights(), "mode ", mode.name,
              " needs 4-bit weights: quantize the model first (qspec --weights FORMAT)");

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& layer = layers_[l];
    // A linear layer in the run mode: its input, quantized in place per the activation mode
    // (each input buffer feeds only linear layers), times the checkpoint or 4-bit weights.
    auto project = [&](const float* input, const WeightMatrix& weight,
                       QuantizedMatrix QuantizedLayerWeights::*quantized, const std::vector<float>& bias,
                       float* out) {
      if (!mode.quantized_weights) return cpu::linear(input, count, weight, bias_or_null(bias), out);
      cpu::quantized_linear(input, count, quantized_layers_[l].*quantized, bias_or_null(bias), out);
    };
    auto quantize_input = [&](float* input, int64_t in_dim) {
      cpu::apply_activation_mode(mode.activations, input, count, in_dim);
    };
    using Q = QuantizedLayerWeights;
    float* keys = cache.keys(l);
    float* values = cache.values(l);
    // Attention block: K and V go straight into the cache rows of their positions.
    cpu::rmsnorm(x.data(), layer.attention_norm.data(), count, hidden, c.rms_norm_eps, normed.data());
    quantize_input(normed.data(), hidden);
    project(normed.data(), layer.q_proj, &Q::q_proj, layer.q_bias, q.data());
    project(normed.data(), layer.k_proj, &Q::k_proj, layer.k_bias, keys + start * kv_dim);
    project(normed.data(), layer.v_proj, &Q::v_proj, layer.v_bias, values + start * kv_dim);
    cpu::rope(q.data(), count, c.num_heads, c.head_dim, positions.data(), inv_freq_.data(), rope_attention_scaling_);
    cpu::rope(keys + start * kv_dim, count, c.num_kv_heads, c.head_dim, positions.data(), inv_freq_.data(),
              rope_attention_scaling_);
    cpu::attention(q.data(), count, positions.data(), keys, values, shape, attn.data());
    quantize_input(attn.data(), q_dim);
    project(attn.data(), layer.o_proj, &Q::o_proj, layer.o_bias, projected.data());
    for (int64_t i = 0; i < count * hidden; ++i) x[i] += projected[i];
    // MLP block (SwiGLU).
    cpu::rmsnorm(x.data(), layer.mlp_norm.data(), count, hidden, c.rms_norm_eps, normed.data());
    quantize_input(normed.data(), hidden);
    project(normed.data(), layer.gate_proj, &Q::gate_proj, layer.gate_bias, gate.data());
    project(normed.data(), layer.up_proj, &Q::up_proj, layer.up_bias, up.data());
    cpu::silu_mul(gate.data(), up.data(), count * c.intermediate_size, gate.data());
    quantize_input(gate.data(), c.intermediate_size);
    project(gate.data(), layer.down_proj, &Q::down_proj, layer.down_bias, projected.data());
    for (int64_t i = 0; i < count * hidden; ++i) x[i] += projected[i];
  }
  cache.length_ = start + count;

  const int64_t first_logit_row = all_logits ? 0 : count - 1;
  const int64_t logit_rows = count - first_logit_row;
  cpu::rmsnorm(x.data() + first_logit_row * hidden, final_norm_.data(), logit_rows, hidden, c.rms_norm_eps,
               normed.data());
  logits.resize(static_cast<size_t>(logit_rows * c.vocab_size));
  cpu::linear(normed.data(), logit_rows, lm_head_, nullptr, logits.data());
}

}  // namespace qspec
