// Reads a checkpoint's architecture from its Hugging Face config.json into ModelConfig
// (io/model_config.h). Accepts LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM,
// Qwen3ForCausalLM and Gemma3ForCausalLM; anything this engine would run wrongly (unknown
// architecture, activation, rope type, layer type, partial rotary) is an Error naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"

namespace qspec {

// Parses config.json text; `source` names the file in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// Reads DIR/config.json.
ModelConfig load_model_config(const std::string& dir);

// Inverse frequencies for RoPE (head_dim / 2 of them) after scaling, in float32 as
// transformers computes them, and the attention scaling factor applied to cos/sin (yarn).
struct RopeTables {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
RopeTables rope_tables(const ModelConfig& config, int64_t seq_len = 0);  // config.rope's
RopeTables rope_tables(const ModelConfig& config, const RopeConfig& rope, int64_t seq_len = 0);

}  // namespace qspec
