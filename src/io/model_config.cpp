// ModelConfig's arithmetic and names; parsing config.json is model/config.cpp's.
#include "io/model_config.h"

namespace qspec {

const char* architecture_name(Architecture architecture) {
  switch (architecture) {
    case Architecture::Llama: return "LlamaForCausalLM";
    case Architecture::Qwen2: return "Qwen2ForCausalLM";
    case Architecture::Mistral: return "MistralForCausalLM";
  }
  return "?";
}

int64_t ModelConfig::parameter_count() const {
  int64_t attention = hidden_size * q_dim() + 2 * hidden_size * kv_dim() + q_dim() * hidden_size;
  if (attention_bias) attention += q_dim() + 2 * kv_dim();
  if (attention_output_bias) attention += hidden_size;
  int64_t mlp = 3 * hidden_size * intermediate_size;
  if (mlp_bias) mlp += 2 * intermediate_size + hidden_size;
  int64_t per_layer = attention + mlp + 2 * hidden_size;
  int64_t embeddings = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  return num_layers * per_layer + embeddings + hidden_size;
}

}  // namespace qspec
