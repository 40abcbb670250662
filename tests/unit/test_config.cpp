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
