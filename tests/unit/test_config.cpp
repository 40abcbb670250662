#include <gtest/gtest.h>

#include <cmath>

#include "model/config.h"
#include "qspec/error.h"

using qspec::ModelConfig;

namespace {

std::string llama_json(const std::string& extra) {
  return R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":2,"rms_norm_eps":1e-5,"max_position_embeddings":256)" + extra + "}";
}

std::string error_of(const std::string& text) {
  try {
    qspec::parse_model_config(text, "test/config.json");
  } catch (const qspec::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST(Config, LlamaDefaultsAndDerivedHeadDim) {
  ModelConfig config = qspec::parse_model_config(llama_json(""), "x");
  EXPECT_EQ(config.architecture, qspec::Architecture::Llama);
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.num_kv_heads, 2);
  EXPECT_EQ(config.rope.type, "default");
  EXPECT_DOUBLE_EQ(config.rope.theta, 10000.0);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_FALSE(config.attention_bias);
}

TEST(Config, ExplicitHeadDimAndV5RopeParameters) {
  ModelConfig config = qspec::parse_model_config(
      llama_json(R"(,"head_dim":32,"rope_parameters":{"rope_theta":500000.0,"rope_type":"default"})"), "x");
  EXPECT_EQ(config.head_dim, 32);
  EXPECT_DOUBLE_EQ(config.rope.theta, 500000.0);
}

TEST(Config, Llama3RopeScalingFromV4Keys) {
  ModelConfig config = qspec::parse_model_config(
      llama_json(R"(,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,
      "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64})"),
      "x");
  EXPECT_EQ(config.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(config.rope.factor, 8.0);
  qspec::RopeTables tables = qspec::rope_tables(config);
  ASSERT_EQ(tables.inv_freq.size(), 8u);
  // Highest frequencies (short wavelengths) are untouched, the lowest are divided by factor.
  EXPECT_FLOAT_EQ(tables.inv_freq[0], 1.0f);
  const float unscaled_last = 1.0f / std::pow(500000.0f, 14.0f / 16.0f);
  EXPECT_NEAR(tables.inv_freq[7], unscaled_last / 8.0f, 1e-12);
}

TEST(Config, QwenHasQkvBiasAndTiedEmbeddings) {
  ModelConfig config = qspec::parse_model_config(
      R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"tie_word_embeddings":true,
      "rope_theta":1000000.0,"eos_token_id":[5,6]})",
      "x");
  EXPECT_EQ(config.architecture, qspec::Architecture::Qwen2);
  EXPECT_TRUE(config.attention_bias);
  EXPECT_FALSE(config.attention_output_bias);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int32_t>{5, 6}));
}

TEST(Config, MistralSlidingWindow) {
  ModelConfig config = qspec::parse_model_config(
      R"({"architectures":["MistralForCausalLM"],"vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"sliding_window":16})",
      "x");
  EXPECT_EQ(config.architecture, qspec::Architecture::Mistral);
  ASSERT_TRUE(config.sliding_window.has_value());
  EXPECT_EQ(*config.sliding_window, 16);
}

TEST(Config, LinearRopeDividesFrequencies) {
  ModelConfig plain = qspec::parse_model_config(llama_json(""), "x");
  ModelConfig linear = qspec::parse_model_config(llama_json(R"(,"rope_scaling":{"type":"linear","factor":4.0})"), "x");
  auto a = qspec::rope_tables(plain), b = qspec::rope_tables(linear);
  for (size_t i = 0; i < a.inv_freq.size(); ++i) EXPECT_FLOAT_EQ(b.inv_freq[i], a.inv_freq[i] / 4.0f);
}

TEST(Config, ClearErrors) {
  EXPECT_NE(error_of(R"({"architectures":["GPTNeoXForCausalLM"]})").find("unsupported architecture 'GPTNeoXForCausalLM'"),
            std::string::npos);
  EXPECT_NE(error_of("{not json").find("test/config.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"architectures":["LlamaForCausalLM"],"vocab_size":10})").find("hidden_size"),
            std::string::npos);
  EXPECT_NE(error_of(llama_json(R"(,"hidden_act":"gelu")")).find("hidden_act"), std::string::npos);
  EXPECT_NE(error_of(llama_json(R"(,"rope_scaling":{"type":"longrope","factor":2.0})")).find("longrope"),
            std::string::npos);
  EXPECT_NE(error_of(llama_json(R"(,"num_key_value_heads":3)")).find("multiple"), std::string::npos);
  EXPECT_NE(error_of(llama_json(R"(,"vocab_size":"many")")).find("'vocab_size' must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of("[1,2]").find("object"), std::string::npos);
}

TEST(Config, BundledModel) {
  ModelConfig config = qspec::load_model_config(QSPEC_SOURCE_DIR "/models/gsm-synth-llama");
  EXPECT_EQ(config.num_layers, 8);
  EXPECT_EQ(config.head_dim, 32);
  EXPECT_EQ(config.vocab_size, 477);
  EXPECT_EQ(config.parameter_count(), 6146816);
}

namespace {

// A Gemma 3 text config with `extra` appended (6 layers: 5 sliding, then 1 global by the
// default pattern).
std::string gemma3_json(const std::string& extra) {
  return R"({"architectures":["Gemma3ForCausalLM"],"vocab_size":100,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":6,"num_attention_heads":4,"num_key_value_heads":1,
    "head_dim":32,"hidden_activation":"gelu_pytorch_tanh","sliding_window":16)" + extra + "}";
}

}  // namespace

TEST(Config, Qwen3HasQkNormAndExplicitHeadDim) {
  ModelConfig config = qspec::parse_model_config(
      R"({"model_type":"qwen3","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":24,
      "attention_bias":false,"use_sliding_window":false,"sliding_window":4096,"tie_word_embeddings":true})",
      "x");
  EXPECT_EQ(config.architecture, qspec::Architecture::Qwen3);
  EXPECT_EQ(config.head_dim, 24);
  EXPECT_EQ(config.q_dim(), 96);  // != hidden_size
  EXPECT_TRUE(config.recipe().qk_norm);
  EXPECT_FALSE(config.recipe().norm_adds_one);
  EXPECT_FALSE(config.attention_bias);
  EXPECT_EQ(config.layer_window(0), 0);  // use_sliding_window false: sliding_window is unused
  EXPECT_DOUBLE_EQ(config.attention_scale(), 1.0 / std::sqrt(24.0));
}

TEST(Config, Gemma3LayerTypesAndTwoRopes) {
  // transformers v4 spelling: rope_theta + rope_scaling (global) + rope_local_base_freq.
  ModelConfig config = qspec::parse_model_config(
      gemma3_json(R"(,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,"query_pre_attn_scalar":20,
      "rope_scaling":{"rope_type":"linear","factor":8.0},"final_logit_softcapping":30.0,
      "layer_types":["sliding_attention","full_attention","sliding_attention","sliding_attention",
                     "sliding_attention","full_attention"])"),
      "x");
  EXPECT_EQ(config.architecture, qspec::Architecture::Gemma3);
  EXPECT_TRUE(config.tie_word_embeddings);  // Gemma's default
  const qspec::LayerRecipe recipe = config.recipe();
  EXPECT_TRUE(recipe.qk_norm && recipe.norm_adds_one && recipe.output_norms && recipe.scale_embeddings);
  EXPECT_EQ(recipe.activation, qspec::MlpActivation::gelu_tanh);
  EXPECT_EQ(config.layer_window(0), 16);
  EXPECT_EQ(config.layer_window(1), 0);
  EXPECT_EQ(config.layer_window(5), 0);
  EXPECT_EQ(config.layer_rope(1).type, "linear");
  EXPECT_DOUBLE_EQ(config.layer_rope(1).theta, 1000000.0);
  EXPECT_EQ(config.layer_rope(0).type, "default");  // the sliding layers are never scaled
  EXPECT_DOUBLE_EQ(config.layer_rope(0).theta, 10000.0);
  EXPECT_DOUBLE_EQ(config.attention_scale(), 1.0 / std::sqrt(20.0));
  ASSERT_TRUE(config.final_logit_softcapping.has_value());
  EXPECT_DOUBLE_EQ(*config.final_logit_softcapping, 30.0);
  // Two RoPE tables: the global one divided by the linear factor, over the global base.
  const auto local = qspec::rope_tables(config, config.layer_rope(0));
  const auto global = qspec::rope_tables(config, config.layer_rope(1));
  EXPECT_FLOAT_EQ(global.inv_freq[1], 1.0f / std::pow(1000000.0f, 2.0f / 32.0f) / 8.0f);
  EXPECT_FLOAT_EQ(local.inv_freq[1], 1.0f / std::pow(10000.0f, 2.0f / 32.0f));
}

TEST(Config, Gemma3V5RopeParametersAndDefaultPattern) {
  // transformers v5: one RoPE object per layer type; no layer_types: every 6th layer global.
  ModelConfig config = qspec::parse_model_config(
      R"({"model_type":"gemma3_text","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":12,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":32,
      "rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":1000000.0},
                         "sliding_attention":{"rope_type":"default","rope_theta":10000.0}}})",
      "x");
  EXPECT_EQ(config.architecture, qspec::Architecture::Gemma3);
  for (int64_t l = 0; l < 12; ++l) {
    const bool global = l == 5 || l == 11;
    EXPECT_EQ(config.layer_window(l), global ? 0 : 4096) << l;  // Gemma's default sliding_window
    EXPECT_DOUBLE_EQ(config.layer_rope(l).theta, global ? 1000000.0 : 10000.0) << l;
  }
  EXPECT_DOUBLE_EQ(config.attention_scale(), 1.0 / 16.0);  // query_pre_attn_scalar 256
  EXPECT_FALSE(config.final_logit_softcapping.has_value());
  EXPECT_EQ(qspec::parse_model_config(R"({"model_type":"gemma3","vocab_size":100,"hidden_size":64,
      "intermediate_size":128,"num_hidden_layers":1,"num_attention_heads":4,"head_dim":16})", "x").architecture,
            qspec::Architecture::Gemma3);
}

// Bad input fails at load, naming the field.
TEST(Config, UnsupportedFamilyFeaturesNameTheField) {
  const std::string architecture = error_of(R"({"architectures":["Gemma3ForConditionalGeneration"]})");
  EXPECT_NE(architecture.find("unsupported architecture 'Gemma3ForConditionalGeneration' in field 'architectures'"),
            std::string::npos) << architecture;
  const std::string model_type = error_of(R"({"model_type":"gemma2","vocab_size":10})");
  EXPECT_NE(model_type.find("'model_type' 'gemma2'"), std::string::npos) << model_type;
  const std::string rope = error_of(gemma3_json(R"(,"rope_scaling":{"rope_type":"longrope","factor":2.0})"));
  EXPECT_NE(rope.find("unsupported rope type 'longrope' in 'rope_scaling'"), std::string::npos) << rope;
  const std::string nested_rope = error_of(gemma3_json(
      R"(,"rope_parameters":{"full_attention":{"rope_type":"su"},"sliding_attention":{"rope_type":"default"}})"));
  EXPECT_NE(nested_rope.find("'su' in 'rope_parameters.full_attention'"), std::string::npos) << nested_rope;
  const std::string rope_layer_type = error_of(gemma3_json(R"(,"rope_parameters":{"chunked_attention":{}})"));
  EXPECT_NE(rope_layer_type.find("unknown layer type 'chunked_attention' in 'rope_parameters'"), std::string::npos)
      << rope_layer_type;
  const std::string layer_type = error_of(gemma3_json(
      R"(,"layer_types":["sliding_attention","chunked_attention","full_attention","full_attention","full_attention","full_attention"])"));
  EXPECT_NE(layer_type.find("field 'layer_types'[1] = 'chunked_attention' is not a supported layer type"),
            std::string::npos) << layer_type;
  const std::string layer_count = error_of(gemma3_json(R"(,"layer_types":["full_attention"])"));
  EXPECT_NE(layer_count.find("'layer_types' must be a list of 6"), std::string::npos) << layer_count;
  const std::string no_window = error_of(llama_json(R"(,"layer_types":["sliding_attention","full_attention"])"));
  EXPECT_NE(no_window.find("'layer_types'[0] is sliding_attention but the config has no 'sliding_window'"),
            std::string::npos) << no_window;
  const std::string activation = error_of(gemma3_json(R"(,"hidden_activation":"gelu")"));
  EXPECT_NE(activation.find("unsupported hidden_activation 'gelu'"), std::string::npos) << activation;
  const std::string softcap = error_of(gemma3_json(R"(,"attn_logit_softcapping":50.0)"));
  EXPECT_NE(softcap.find("field 'attn_logit_softcapping'"), std::string::npos) << softcap;
  // Both spellings: a rope_scaling that rope_parameters would silently override is an error.
  const std::string both = error_of(llama_json(R"(,"rope_parameters":{"rope_type":"default","rope_theta":10000.0},
      "rope_scaling":{"rope_type":"linear","factor":4.0})"));
  EXPECT_NE(both.find("'rope_scaling' (type linear, factor 4) disagrees with 'rope_parameters' (type default"),
            std::string::npos) << both;
  EXPECT_EQ(error_of(llama_json(R"(,"rope_parameters":{"rope_type":"linear","factor":4.0},
      "rope_scaling":{"type":"linear","factor":4.0})")), "");
  const std::string qwen3_swa = error_of(R"({"architectures":["Qwen3ForCausalLM"],"vocab_size":10,"hidden_size":8,
      "intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":1,"use_sliding_window":true})");
  EXPECT_NE(qwen3_swa.find("use_sliding_window"), std::string::npos) << qwen3_swa;
}
