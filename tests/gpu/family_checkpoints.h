// Tiny random checkpoints of the families the GPU runs beyond Llama, written to a temporary
// directory for the gpu tests: Qwen2 (q/k/v biases, tied embeddings) and Qwen3 (per-head q/k
// norms, an explicit head_dim wider than hidden / heads). The CPU family checkpoints of
// tests/data/tiny (transformers goldens) have head_dim 16 and 24, which the GPU attention kernels
// (32, 64, 128) do not take; these have the same layouts at head_dim 64, and the CPU forward pass
// (checked against transformers on those) is their reference.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace qspec_gpu_test {

enum class Family { qwen2, qwen3 };

inline const char* family_name(Family family) { return family == Family::qwen2 ? "qwen2" : "qwen3"; }

// A directory holding config.json and model.safetensors (f32) of a 2-layer model, removed when
// the object goes. Weights are normal: projections of spread 1 / sqrt(k), norms around 1, biases
// large (Qwen2's k biases reach tens), embeddings of spread 1 so that the tied lm_head's logits
// spread over tens and greedy picks are not near-ties.
class FamilyCheckpoint {
 public:
  explicit FamilyCheckpoint(Family family, uint32_t seed = 5) {
    namespace fs = std::filesystem;
    dir_ = (fs::temp_directory_path() /
            ("qspec-gpu-" + std::string(family_name(family)) + "-" + std::to_string(::getpid()) + "-" +
             std::to_string(seed)))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const bool qwen2 = family == Family::qwen2;
    const int64_t vocab = 256, hidden = qwen2 ? 256 : 128, heads = 4, kv_heads = 2, head_dim = 64,
                  inter = qwen2 ? 512 : 384, layers = 2;
    nlohmann::json config = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"}},
                             {"model_type", qwen2 ? "qwen2" : "qwen3"},
                             {"vocab_size", vocab},
                             {"hidden_size", hidden},
                             {"intermediate_size", inter},
                             {"num_hidden_layers", layers},
                             {"num_attention_heads", heads},
                             {"num_key_value_heads", kv_heads},
                             {"max_position_embeddings", 256},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 1000000.0},
                             {"tie_word_embeddings", true},
                             {"bos_token_id", 1},
                             {"eos_token_id", 2},
                             {"hidden_act", "silu"},
                             {"torch_dtype", "float32"}};
    if (!qwen2) config["head_dim"] = head_dim;  // 4 x 64 = 256 != hidden 128: explicit
    std::ofstream(fs::path(dir_) / "config.json") << config.dump(2);

    std::mt19937 random(seed);
    qspec::SafetensorsWriter writer;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float spread) {
      int64_t count = 1;
      for (int64_t d : shape) count *= d;
      std::normal_distribution<float> normal(mean, spread);
      std::vector<float> values(static_cast<size_t>(count));
      for (float& v : values) v = normal(random);
      writer.add(name, qspec::DType::F32, shape, values.data(), values.size() * 4);
    };
    const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    auto projection = [&](const std::string& name, int64_t rows, int64_t cols) {
      add(name, {rows, cols}, 0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
    };
    add("model.embed_tokens.weight", {vocab, hidden}, 0.0f, 1.0f);
    add("model.norm.weight", {hidden}, 1.0f, 0.1f);
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {hidden}, 1.0f, 0.1f);
      add(p + "post_attention_layernorm.weight", {hidden}, 1.0f, 0.1f);
      projection(p + "self_attn.q_proj.weight", q_dim, hidden);
      projection(p + "self_attn.k_proj.weight", kv_dim, hidden);
      projection(p + "self_attn.v_proj.weight", kv_dim, hidden);
      projection(p + "self_attn.o_proj.weight", hidden, q_dim);
      projection(p + "mlp.gate_proj.weight", inter, hidden);
      projection(p + "mlp.up_proj.weight", inter, hidden);
      projection(p + "mlp.down_proj.weight", hidden, inter);
      if (qwen2) {
        add(p + "self_attn.q_proj.bias", {q_dim}, 0.0f, 0.5f);
        add(p + "self_attn.k_proj.bias", {kv_dim}, 0.0f, 2.0f);
        add(p + "self_attn.v_proj.bias", {kv_dim}, 0.0f, 0.5f);
      } else {
        add(p + "self_attn.q_norm.weight", {head_dim}, 1.0f, 0.3f);
        add(p + "self_attn.k_norm.weight", {head_dim}, 1.0f, 0.3f);
      }
    }
    writer.write((fs::path(dir_) / "model.safetensors").string());
  }
  ~FamilyCheckpoint() { std::filesystem::remove_all(dir_); }
  FamilyCheckpoint(const FamilyCheckpoint&) = delete;
  FamilyCheckpoint& operator=(const FamilyCheckpoint&) = delete;

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// Random prompts of 3..(3 + spread) tokens (ids 3.. : no bos / eos).
inline std::vector<std::vector<int32_t>> random_prompts(int count, uint32_t seed, int64_t spread = 40) {
  std::mt19937 random(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(3 + random() % spread));
    for (int32_t& id : prompt) id = 3 + static_cast<int32_t>(random() % 250);
    prompts.push_back(prompt);
  }
  return prompts;
}

}  // namespace qspec_gpu_test
