// ModelConfig's arithmetic, names and per-family layer recipes; parsing config.json is
// model/config.cpp's.
#include "io/model_config.h"

#include <cmath>

namespace qspec {

const char* architecture_name(Architecture architecture) {
  switch (architecture) {
    case Architecture::Llama: return "LlamaForCausalLM";
    case Architecture::Qwen2: return "Qwen2ForCausalLM";
    case Architecture::Mistral: return "MistralForCausalLM";
    case Architecture::Qwen3: return "Qwen3ForCausalLM";
    case Architecture::Gemma3: return "Gemma3ForCausalLM";
  }
  return "?";
}

LayerRecipe layer_recipe(Architecture architecture) {
  LayerRecipe recipe;
  switch (architecture) {
    case Architecture::Llama:
    case Architecture::Qwen2:
    case Architecture::Mistral:
      break;
    case Architecture::Qwen3:
      recipe.qk_norm = true;
      break;
    case Architecture::Gemma3:
      recipe.qk_norm = true;
      recipe.norm_adds_one = true;
      recipe.output_norms = true;
      recipe.scale_embeddings = true;
      recipe.activation = MlpActivation::gelu_tanh;
      break;
  }
  return recipe;
}

const char* layer_type_name(LayerType type) {
  return type == LayerType::sliding_attention ? "sliding_attention" : "full_attention";
}

LayerType ModelConfig::layer_type(int64_t layer) const {
  if (layer_types.empty()) return sliding_window ? LayerType::sliding_attention : LayerType::full_attention;
  return layer_types[static_cast<size_t>(layer)];
}

int64_t ModelConfig::layer_window(int64_t layer) const {
  return layer_type(layer) == LayerType::sliding_attention ? sliding_window.value_or(0) : 0;
}

const RopeConfig& ModelConfig::layer_rope(int64_t layer) const {
  return layer_type(layer) == LayerType::sliding_attention && rope_local ? *rope_local : rope;
}

double ModelConfig::attention_scale() const {
  return 1.0 / std::sqrt(query_pre_attn_scalar.value_or(static_cast<double>(head_dim)));
}

int64_t ModelConfig::parameter_count() const {
  int64_t attention = hidden_size * q_dim() + 2 * hidden_size * kv_dim() + q_dim() * hidden_size;
  if (attention_bias) attention += q_dim() + 2 * kv_dim();
  if (attention_output_bias) attention += hidden_size;
  int64_t mlp = 3 * hidden_size * intermediate_size;
  if (mlp_bias) mlp += 2 * intermediate_size + hidden_size;
  const LayerRecipe shape = recipe();
  if (shape.qk_norm) attention += 2 * head_dim;
  int64_t per_layer = attention + mlp + (shape.output_norms ? 4 : 2) * hidden_size;
  int64_t embeddings = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  return num_layers * per_layer + embeddings + hidden_size;
}

}  // namespace qspec
