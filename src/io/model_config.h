// ModelConfig: the one struct for a model's hyper-parameters, as a Hugging Face config.json
// spells them. It lives in io/ so that the importers (which write config.json) and the model
// (which reads it: model/config.h parses and validates) share it; io/ is below model/.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qspec {

enum class Architecture { Llama, Qwen2, Mistral };

struct RopeConfig {
  std::string type = "default";  // default | linear | dynamic | llama3 | yarn
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> attention_factor;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
};

struct ModelConfig {
  Architecture architecture = Architecture::Llama;
  std::string architecture_name;  // as written in config.json
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v (Qwen2 always; Llama when attention_bias)
  bool attention_output_bias = false;  // bias on o_proj (Llama attention_bias)
  bool mlp_bias = false;
  std::optional<int64_t> sliding_window;  // Mistral
  RopeConfig rope;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // config.json: one -> an integer, several -> a list
  // Written by the importers (GGUF's padding token); the engine never pads, so parsing
  // leaves it unset.
  std::optional<int32_t> pad_token_id;
  std::string torch_dtype;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t parameter_count() const;  // from the shapes (matches the tensors when bound)
};

const char* architecture_name(Architecture architecture);

}  // namespace qspec
