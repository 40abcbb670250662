// A Llama-family decoder (Llama, Qwen2, Mistral) bound to a checkpoint's tensors, and its
// CPU forward pass.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "ops/linear.h"
#include "quant/quantized_linear.h"

namespace qspec {

// Keys and values of one sequence, contiguous per layer: [capacity, kv_dim] f32.
class KvCache {
 public:
  KvCache(int64_t layers, int64_t capacity, int64_t kv_dim);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  void set_length(int64_t length);  // truncate (e.g. roll back), never grow past written data
  float* keys(int64_t layer) { return keys_[layer].data(); }
  float* values(int64_t layer) { return values_[layer].data(); }

 private:
  friend class LlamaModel;
  int64_t capacity_;
  int64_t kv_dim_;
  int64_t length_ = 0;
  std::vector<std::vector<float>> keys_, values_;
};

struct LayerWeights {
  std::vector<float> attention_norm, mlp_norm;
  WeightMatrix q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  std::vector<float> q_bias, k_bias, v_bias, o_bias, gate_bias, up_bias, down_bias;
};

// The same seven projections as 4-bit weights (embedding, norms and lm_head stay as loaded).
struct QuantizedLayerWeights {
  QuantizedMatrix q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

class LlamaModel {
 public:
  // Loads DIR (config.json + safetensors). Every tensor's presence, dtype and shape is
  // checked against the config; errors name the tensor.
  static std::unique_ptr<LlamaModel> load(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  // Bytes of weight data touched by one forward pass (for bandwidth figures).
  size_t weight_bytes() const { return weight_bytes_; }
  std::string weight_dtype() const;

  KvCache new_cache(int64_t capacity = 0) const;  // 0: max_position_embeddings

  // Runs `tokens` at positions cache.length() ... and appends their K/V. Writes logits for
  // the last token ([vocab]) or, with all_logits, for every token ([tokens, vocab]).
  // `mode` picks the weights (checkpoint or 4-bit) and how activations enter every linear
  // layer; the KV cache and all other weights are shared by every mode.
  void forward(std::span<const int32_t> tokens, KvCache& cache, std::vector<float>& logits,
               bool all_logits = false, const RunMode& mode = {}) const;

  // Quantizes the seven projections of every layer to 4 bits (round to nearest), kept beside
  // the checkpoint weights so W16A16 and the 4-bit modes run from one loaded model.
  // group_size 0 picks auto_group_size().
  void quantize_weights(quant::Format format, int64_t group_size = 0);
  // The int4 group size for this model: 128 (the usual) when it divides every linear
  // layer's K, else the largest of 64, 32 that does (gsm-synth-llama's intermediate size is
  // 704 = 11 x 64). Throws when none does.
  int64_t auto_group_size() const;
  bool has_quantized_weights() const { return !quantized_layers_.empty(); }
  // "int4 g128", "nvfp4", ...; empty without quantized weights.
  const std::string& quantized_format() const { return quantized_format_; }
  size_t quantized_weight_bytes() const;

 private:
  LlamaModel() = default;
  void bind_weights();

  std::string dir_;
  ModelConfig config_;
  Checkpoint checkpoint_;
  WeightMatrix embedding_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<QuantizedLayerWeights> quantized_layers_;
  std::string quantized_format_;
  std::vector<float> inv_freq_;
  float rope_attention_scaling_ = 1.0f;
  size_t weight_bytes_ = 0;
};

}  // namespace qspec
