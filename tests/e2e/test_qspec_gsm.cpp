// Greedy QSpec (runtime/qspec.h) equals greedy W4A16 on gsm-synth-llama's held-out problems
// (RTN int4 weights, prompt "Question: Q\nAnswer:", at most 160 tokens, eos stops): all 400
// problems with a w4a4-nvfp4 draft and gamma 4, and every draft mode x gamma 1..6 on a
// subset. A mismatch fails unless the verify logits at the first differing position hold an
// exact tie for the top, which is printed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/llama.h"
#include "runtime/generate.h"
#include "runtime/qspec.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kModelDir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
constexpr int64_t kMaxTokens = 160;
constexpr size_t kGridProblems = 8;

struct Fixture {
  std::unique_ptr<qspec::LlamaModel> model = qspec::LlamaModel::load(kModelDir);
  std::unique_ptr<qspec::Tokenizer> tokenizer = qspec::Tokenizer::load(kModelDir);
  std::vector<std::vector<int32_t>> prompts, references;  // references: greedy W4A16
  qspec::RunMode verify;
  Fixture() {
    model->quantize_weights(qspec::quant::Format::int4);
    verify = mode("w4a16");
    std::ifstream file(kModelDir + "/eval_problems.jsonl");
    std::string line;
    while (std::getline(file, line)) {
      if (line.empty()) continue;
      const nlohmann::json problem = nlohmann::json::parse(line);
      prompts.push_back(tokenizer->encode("Question: " + problem["question"].get<std::string>() + "\nAnswer:"));
    }
    qspec::GenerationOptions options = generation_options();
    for (const auto& prompt : prompts) references.push_back(qspec::generate(*model, prompt, options).ids);
  }
  qspec::RunMode mode(const std::string& name) const {
    qspec::RunMode m = qspec::parse_run_mode(name);
    m.activations.group_size = model->auto_group_size();
    return m;
  }
  qspec::GenerationOptions generation_options() const {
    qspec::GenerationOptions options;
    options.max_new_tokens = kMaxTokens;
    options.eos_ids = tokenizer->eos_ids;
    options.mode = verify;
    return options;
  }
};

Fixture& fixture() {
  static Fixture instance;
  return instance;
}

// Compares one QSpec output with the W4A16 reference: true when equal or when the first
// difference sits on an exact tie of the W4A16 logits (printed).
bool matches_or_tie(size_t problem, const std::vector<int32_t>& got, const std::string& label) {
  Fixture& f = fixture();
  const std::vector<int32_t>& want = f.references[problem];
  if (got == want) return true;
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i < got.size() && i < want.size()) {
    std::vector<int32_t> context = f.prompts[problem];
    context.insert(context.end(), want.begin(), want.begin() + static_cast<std::ptrdiff_t>(i));
    qspec::KvCache cache = f.model->new_cache(static_cast<int64_t>(context.size()));
    std::vector<float> logits;
    f.model->forward(context, cache, logits, false, f.verify);
    if (logits[static_cast<size_t>(got[i])] == logits[static_cast<size_t>(want[i])]) {
      std::printf("[tie] %s problem %zu position %zu: ids %d and %d share logit %.9g\n", label.c_str(), problem, i,
                  want[i], got[i], static_cast<double>(logits[static_cast<size_t>(want[i])]));
      return true;
    }
  }
  ADD_FAILURE() << label << " problem " << problem << ": first difference at token " << i << " of "
                << want.size() << " (w4a16) / " << got.size() << " (qspec)";
  return false;
}

}  // namespace

TEST(QSpecGsm, GreedyEqualsW4A16OnAll400ProblemsNvfp4DraftGamma4) {
  Fixture& f = fixture();
  ASSERT_EQ(f.prompts.size(), 400u);
  qspec::QSpecOptions q;
  q.draft = f.mode("w4a4-nvfp4");
  q.verify = f.verify;
  q.gamma = 4;
  int64_t drafted = 0, accepted = 0, matched = 0;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    const qspec::QSpecResult result = qspec::qspec_generate(*f.model, f.prompts[i], f.generation_options(), q);
    matched += matches_or_tie(i, result.ids, "w4a4-nvfp4 gamma 4");
    drafted += result.metrics.drafted;
    accepted += result.metrics.accepted;
  }
  std::printf("w4a4-nvfp4 gamma 4: %lld/400 equal to w4a16, acceptance %lld/%lld = %.1f%%\n",
              static_cast<long long>(matched), static_cast<long long>(accepted), static_cast<long long>(drafted),
              100.0 * static_cast<double>(accepted) / static_cast<double>(drafted));
  EXPECT_EQ(matched, 400);
}

TEST(QSpecGsm, GreedyEqualsW4A16ForEveryDraftModeAndGammaOnASubset) {
  Fixture& f = fixture();
  ASSERT_GE(f.prompts.size(), kGridProblems);
  for (const char* draft : {"w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"}) {
    for (int64_t gamma = 1; gamma <= 6; ++gamma) {
      qspec::QSpecOptions q;
      q.draft = f.mode(draft);
      q.verify = f.verify;
      q.gamma = gamma;
      const std::string label = std::string(draft) + " gamma " + std::to_string(gamma);
      int64_t drafted = 0, accepted = 0;
      // Spread over the file: every (400 / kGridProblems)-th problem.
      for (size_t k = 0; k < kGridProblems; ++k) {
        const size_t i = k * (f.prompts.size() / kGridProblems);
        const qspec::QSpecResult result = qspec::qspec_generate(*f.model, f.prompts[i], f.generation_options(), q);
        matches_or_tie(i, result.ids, label);
        drafted += result.metrics.drafted;
        accepted += result.metrics.accepted;
      }
      std::printf("%s: acceptance %.1f%%\n", label.c_str(),
                  100.0 * static_cast<double>(accepted) / static_cast<double>(std::max<int64_t>(1, drafted)));
    }
  }
}
