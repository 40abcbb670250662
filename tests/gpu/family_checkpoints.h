// Tiny random checkpoints of the families the GPU runs beyond Llama, written to a temporary
// directory for the gpu tests: Qwen2 (q/k/v biases, tied embeddings), Qwen3 (per-head q/k
// norms, an explicit head_dim wider than hidden / heads) and Gemma 3 ((1 + w) norms before and
// after attention and MLP, GeGLU, scaled embeddings, q/k norms, sliding layers of window 8 with
// their own RoPE base around a full layer with linear RoPE scaling, query_pre_attn_scalar, logit
// soft-capping), and Gemma 3 at head_dim 256 (Gemma 3 270M's heads: 4 query heads on 1 KV head,
// query_pre_attn_scalar = head_dim). The CPU family checkpoints of tests/data/tiny (transformers
// goldens) have head_dim 16-32 (and 256: gemma3-hd256) and sizes that 128-wide int4 groups do not
// divide; these have the same layouts at head_dim 64 / 256 and 128-multiples, and the CPU forward
// pass (checked against transformers on those) is their reference.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace qspec_gpu_test {

enum class Family { qwen2, qwen3, gemma3, gemma3_hd256 };

inline const char* family_name(Family family) {
  return family == Family::qwen2    ? "qwen2"
         : family == Family::qwen3  ? "qwen3"
         : family == Family::gemma3 ? "gemma3"
                                    : "gemma3_hd256";
}
// gtest prints test parameters with it (instead of their bytes).
inline void PrintTo(Family family, std::ostream* out) { *out << family_name(family); }

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
    const bool qwen2 = family == Family::qwen2, wide = family == Family::gemma3_hd256;
    const bool gemma = family == Family::gemma3 || wide;
    // wide: the GPU's attention at head_dim 256 (q_dim 1024 on a 256-wide hidden, as Gemma 3 270M's
    // 1024 on 640), a GQA group of 4 (every decode kernel's 4-heads-a-block variant).
    const int64_t vocab = 256, hidden = qwen2 || gemma ? 256 : 128, heads = 4, kv_heads = wide ? 1 : 2,
                  head_dim = wide ? 256 : 64, inter = qwen2 || gemma ? 512 : 384, layers = gemma ? 4 : 2;
    const char* architecture = qwen2 ? "Qwen2ForCausalLM" : gemma ? "Gemma3ForCausalLM" : "Qwen3ForCausalLM";
    nlohmann::json config = {{"architectures", {architecture}},
                             {"model_type", qwen2 ? "qwen2" : gemma ? "gemma3_text" : "qwen3"},
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
                             {"torch_dtype", "float32"}};
    if (!qwen2) config["head_dim"] = head_dim;  // Qwen3: 4 x 64 = 256 != hidden 128: explicit
    if (gemma) {
      config["hidden_activation"] = "gelu_pytorch_tanh";
      config["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention"};
      config["sliding_window"] = 8;
      // wide: Gemma 3 270M's query_pre_attn_scalar = head_dim (the default 1 / sqrt(head_dim) scale).
      config["query_pre_attn_scalar"] = wide ? 256 : 48;
      config["final_logit_softcapping"] = 30.0;
      config["rope_local_base_freq"] = 10000.0;
      config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
      config["pad_token_id"] = 0;
    } else {
      config["hidden_act"] = "silu";
    }
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
    auto projection = [&](const std::string& name, int64_t rows, int64_t cols, float gain = 1.0f) {
      add(name, {rows, cols}, 0.0f, gain / std::sqrt(static_cast<float>(cols)));
    };
    // With tied embeddings a token's own row dominates its logits unless the layers' outputs
    // outweigh it in the residual stream: then the model only copies its last input, and a wrong
    // attention or MLP would not change a greedy pick. Loud o_proj / down_proj make the layers count.
    const float output_gain = 8.0f;
    // Gemma's norms multiply by 1 + w: weights around 0 there.
    const float norm_mean = gemma ? 0.0f : 1.0f;
    add("model.embed_tokens.weight", {vocab, hidden}, 0.0f, 1.0f);
    // Gemma: a final norm factor of 0.5 keeps the logits (spread 8) mostly below the soft cap of 30,
    // which would squeeze the top ones together.
    add("model.norm.weight", {hidden}, gemma ? -0.5f : norm_mean, 0.1f);
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {hidden}, norm_mean, 0.1f);
      // Gemma's output norms set the layers' share instead (its embeddings arrive scaled by
      // sqrt(hidden) = 16): factors 1 + w around 48.
      add(p + "post_attention_layernorm.weight", {hidden}, gemma ? 47.0f : norm_mean, gemma ? 3.0f : 0.1f);
      if (gemma) {
        add(p + "pre_feedforward_layernorm.weight", {hidden}, norm_mean, 0.1f);
        add(p + "post_feedforward_layernorm.weight", {hidden}, 47.0f, 3.0f);
      }
      projection(p + "self_attn.q_proj.weight", q_dim, hidden);
      projection(p + "self_attn.k_proj.weight", kv_dim, hidden);
      projection(p + "self_attn.v_proj.weight", kv_dim, hidden);
      projection(p + "self_attn.o_proj.weight", hidden, q_dim, output_gain);
      projection(p + "mlp.gate_proj.weight", inter, hidden);
      projection(p + "mlp.up_proj.weight", inter, hidden);
      projection(p + "mlp.down_proj.weight", hidden, inter, output_gain);
      if (qwen2) {
        add(p + "self_attn.q_proj.bias", {q_dim}, 0.0f, 0.5f);
        add(p + "self_attn.k_proj.bias", {kv_dim}, 0.0f, 2.0f);
        add(p + "self_attn.v_proj.bias", {kv_dim}, 0.0f, 0.5f);
      } else {
        add(p + "self_attn.q_norm.weight", {head_dim}, norm_mean, 0.3f);
        add(p + "self_attn.k_norm.weight", {head_dim}, norm_mean, 0.3f);
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
