// ModelConfig: the one struct for a model's hyper-parameters, as a Hugging Face config.json
// spells them. It lives in io/ so that the importers (which write config.json) and the model
// (which reads it: model/config.h parses and validates) share it; io/ is below model/.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qspec {

enum class Architecture { Llama, Qwen2, Mistral, Qwen3, Gemma3 };

// The gated MLP's activation: down(act(gate) * up).
enum class MlpActivation : uint8_t {
  silu,       // SwiGLU (Llama, Qwen, Mistral)
  gelu_tanh,  // GeGLU with the tanh approximation of GELU (Gemma: gelu_pytorch_tanh)
};

// How a family's decoder layer is put together. The forward pass reads these flags, never
// the architecture, so a new family is a new row in layer_recipe() (io/model_config.cpp).
struct LayerRecipe {
  // RMSNorm over each head's q and k (weights [head_dim]) before RoPE (Qwen3, Gemma 3).
  bool qk_norm = false;
  // Every RMSNorm multiplies by (1 + w) instead of w (Gemma).
  bool norm_adds_one = false;
  // RMSNorm on the attention and MLP outputs before each residual add ("sandwich" norms,
  // Gemma 3: post_attention_layernorm / post_feedforward_layernorm; the MLP's input norm is
  // then pre_feedforward_layernorm).
  bool output_norms = false;
  // The embedding rows are multiplied by sqrt(hidden_size) (Gemma).
  bool scale_embeddings = false;
  MlpActivation activation = MlpActivation::silu;
};
LayerRecipe layer_recipe(Architecture architecture);

// The attention of one layer: over the whole history, or a sliding window of the last
// `sliding_window` positions (the token itself included), as config.json's layer_types says.
enum class LayerType : uint8_t { full_attention, sliding_attention };

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
  std::optional<int64_t> sliding_window;  // Mistral (every layer), Gemma 3 (sliding layers)
  // Per layer; empty: every layer slides when sliding_window is set, else none does.
  std::vector<LayerType> layer_types;
  RopeConfig rope;  // the full-attention layers' RoPE
  // The sliding layers' own RoPE (Gemma 3: rope_local_base_freq, never scaled); unset: `rope`.
  std::optional<RopeConfig> rope_local;
  // Attention scores are scaled by query_pre_attn_scalar^-1/2 (Gemma); unset: head_dim^-1/2.
  std::optional<double> query_pre_attn_scalar;
  // logits <- cap * tanh(logits / cap) after lm_head (Gemma 2 style), when set.
  std::optional<double> final_logit_softcapping;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // config.json: one -> an integer, several -> a list
  // Written by the importers (GGUF's padding token); the engine never pads, so parsing
  // leaves it unset.
  std::optional<int32_t> pad_token_id;
  std::string torch_dtype;

  LayerRecipe recipe() const { return layer_recipe(architecture); }
  LayerType layer_type(int64_t layer) const;
  // The layer's attention window (0: the whole history) and RoPE.
  int64_t layer_window(int64_t layer) const;
  const RopeConfig& layer_rope(int64_t layer) const;
  double attention_scale() const;  // what q.k is multiplied by

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t parameter_count() const;  // from the shapes (matches the tensors when bound)
};

const char* architecture_name(Architecture architecture);
const char* layer_type_name(LayerType type);  // "full_attention", "sliding_attention"

}  // namespace qspec
