// Forward-pass checks against transformers fp32 logits for architectures without real
// weights here (tests/data/tiny, made by tools/make_tiny_checkpoints.py): Llama with llama3,
// yarn and linear RoPE scaling (and attention/MLP biases), Qwen2 with q/k/v biases and tied
// embeddings, Mistral with a sliding window shorter than the prompt, Qwen3 with per-head q/k
// norms and head_dim != hidden / heads, Gemma 3 with (1 + w) norms, four norms per layer,
// GeGLU, scaled embeddings, sliding layers (window 8, own RoPE base) around a global layer
// with linear RoPE scaling, query_pre_attn_scalar and final logit soft-capping, and Gemma 3 at
// head_dim 256 (Gemma 3 270M's heads; the GPU's widest attention). Weights in f32, bf16 and f16
// exercise every load path.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/llama.h"

namespace {

class TinyModel : public testing::TestWithParam<std::string> {};

double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace

TEST_P(TinyModel, LogitsMatchTransformers) {
  const std::string dir = std::string(QSPEC_TEST_DATA) + "/tiny/" + GetParam();
  auto model = qspec::LlamaModel::load(dir);
  std::ifstream file(dir + "/golden.json");
  ASSERT_TRUE(file.good());
  nlohmann::json golden = nlohmann::json::parse(file);
  const int64_t vocab = model->config().vocab_size;
  for (size_t p = 0; p < golden["prompts"].size(); ++p) {
    const auto prompt = golden["prompts"][p].get<std::vector<int32_t>>();
    const auto expected = golden["logits"][p].get<std::vector<std::vector<float>>>();
    // Whole prompt in one pass (prefill), all positions.
    qspec::KvCache cache = model->new_cache();
    std::vector<float> logits(prompt.size() * vocab, NAN);
    model->forward(prompt, cache, logits, /*all_logits=*/true);
    for (size_t t = 0; t < prompt.size(); ++t) {
      std::vector<float> row(logits.begin() + t * vocab, logits.begin() + (t + 1) * vocab);
      EXPECT_LT(relative_error(row, expected[t]), 1e-4) << GetParam() << " prompt " << p << " position " << t;
    }
    // Token by token through the KV cache (decode path) must agree as well.
    qspec::KvCache step_cache = model->new_cache();
    for (size_t t = 0; t < prompt.size(); ++t) {
      std::vector<float> step_logits;
      model->forward(std::span<const int32_t>(&prompt[t], 1), step_cache, step_logits);
      EXPECT_LT(relative_error(step_logits, expected[t]), 1e-4)
          << GetParam() << " prompt " << p << " decode position " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, TinyModel,
                         testing::Values("llama3-rope", "llama-yarn", "llama-linear-bias", "qwen2-tied",
                                         "mistral-swa", "qwen3-qknorm", "gemma3-swa", "gemma3-hd256"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });
