// Greedy QSpec equals greedy W4A16 on gsm-synth-llama's held-out problems (RTN int4 weights,
// prompt "Question: Q\nAnswer:", at most 160 tokens, eos stops): all 400 problems through the
// continuous-batching engine (batch 16, staggered arrivals) with a w4a4-nvfp4 draft and with
// prompt-lookup (n-gram) drafts, gamma 4, with drafts that skip layers (a skip table searched on the
// model's calibration text), with draft auto (the planner switching between plain
// steps and cycles as the batch fills and drains), and every draft mode x gamma 1..6 on a subset
// with the single-sequence path. A mismatch
// fails unless the verify logits at the first differing position hold an exact tie for the
// top, which is printed. The whole grid (every draft, gamma 1..6, batch 1/3/16, 400 problems)
// is tools/qspec_grid.py's job; its results are in bench/results/qspec-grid-*.json.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/draft_skip.h"
#include "model/draft_vocab.h"
#include "model/llama.h"
#include "qspec/engine.h"
#include "quant/quantized_linear.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "runtime/qspec.h"
#include "runtime/qspec_costs.h"
#include "tokenizer/calibration_text.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kModelDir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
constexpr int64_t kMaxTokens = 160;
constexpr size_t kGridProblems = 8;

struct Fixture {
  std::unique_ptr<qspec::LlamaModel> model = qspec::LlamaModel::load(kModelDir);
  std::unique_ptr<qspec::Tokenizer> tokenizer = qspec::Tokenizer::load(kModelDir);
  std::vector<std::vector<int32_t>> prompts, references;  // references: greedy W4A16
  std::vector<std::vector<int32_t>> references_int8;      // greedy W4A16 on the 8-bit KV cache, on first use
  qspec::RunMode verify;
  explicit Fixture(qspec::quant::Format weights) {
    // Decoded f32 weights: same outputs bit for bit (tested), about twice the CPU speed.
    qspec::cpu::set_f32_weight_cache(true);
    model->quantize_weights(weights);
    qspec::cpu::set_f32_weight_cache(false);
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
    // The draft vocabulary table as `qspec tune-draft` makes it, from the model's own calibration
    // text (which shares nothing with the eval problems): drafts with a vocabulary subset use it.
    const qspec::CalibrationSet text = qspec::load_calibration_text(
        QSPEC_SOURCE_DIR "/data/calibration/gsm-synth-self.txt", *tokenizer, 1 << 20, 512);
    const std::vector<int32_t> ranked =
        qspec::rank_token_frequencies(text.sequences, model->config().vocab_size, tokenizer->eos_ids);
    model->set_draft_vocab(qspec::make_draft_vocab_table(*model, ranked, static_cast<int64_t>(ranked.size()),
                                                         {text.source}, text.tokens));
    // The layer skip table as `qspec tune-draft` makes it (half the layers, w4a8 drafts), from
    // the first 256 tokens of the same text.
    std::vector<std::vector<int32_t>> skip_text;
    for (size_t i = 0; i < 2 && i < text.sequences.size(); ++i)
      skip_text.emplace_back(text.sequences[i].begin(), text.sequences[i].begin() + 128);
    qspec::DraftSkipTable skip = qspec::search_draft_skip(*model, skip_text, mode("w4a8"), verify,
                                                          model->config().num_layers / 2);
    static_cast<qspec::DraftTableIdentity&>(skip) = qspec::draft_table_identity(*model, {text.source}, 256);
    model->set_draft_skip(std::move(skip));
  }
  qspec::RunMode mode(const std::string& name) const {
    qspec::RunMode m = qspec::parse_run_mode(name);
    m.activations.group_size = model->auto_group_size();
    return m;
  }
  qspec::GenerationOptions generation_options(qspec::KvCacheFormat kv_cache = qspec::KvCacheFormat::f16) const {
    qspec::GenerationOptions options;
    options.max_new_tokens = kMaxTokens;
    options.eos_ids = tokenizer->eos_ids;
    options.mode = verify;
    options.kv_cache = kv_cache;
    return options;
  }
  // Greedy W4A16 on a KV cache of `kv_cache`: what QSpec on that cache must equal.
  const std::vector<std::vector<int32_t>>& references_for(qspec::KvCacheFormat kv_cache) {
    if (kv_cache == qspec::KvCacheFormat::f16) return references;
    if (references_int8.empty()) {
      const qspec::GenerationOptions options = generation_options(kv_cache);
      for (const auto& prompt : prompts) references_int8.push_back(qspec::generate(*model, prompt, options).ids);
    }
    return references_int8;
  }
};

// The model with symmetric int4 weights (the default), or with int4-asym / int4-zp ones (zero points).
Fixture& fixture(qspec::quant::Format weights = qspec::quant::Format::int4) {
  if (weights == qspec::quant::Format::int4_asym) {
    static Fixture asym(weights);
    return asym;
  }
  if (weights == qspec::quant::Format::int4_zp) {
    static Fixture zp(weights);
    return zp;
  }
  static Fixture instance(qspec::quant::Format::int4);
  return instance;
}

// Compares one QSpec output with the W4A16 reference: true when equal or when the first
// difference sits on an exact tie of the W4A16 logits (printed).
bool matches_or_tie(Fixture& f, size_t problem, const std::vector<int32_t>& got, const std::string& label,
                    qspec::KvCacheFormat kv_cache = qspec::KvCacheFormat::f16) {
  const std::vector<int32_t>& want = f.references_for(kv_cache)[problem];
  if (got == want) return true;
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i < got.size() && i < want.size()) {
    std::vector<int32_t> context = f.prompts[problem];
    context.insert(context.end(), want.begin(), want.begin() + static_cast<std::ptrdiff_t>(i));
    qspec::KvCache cache = f.model->new_cache(static_cast<int64_t>(context.size()), kv_cache);
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

// All 400 problems through the engine (batch 16, one or two arrivals a step: sequences join and
// leave mid-flight) with QSpec drafting in `draft`; every output must equal W4A16's (or part at
// an exact logit tie). On an 8-bit KV cache (kv_cache int8) the W4A16 reference runs on it too;
// draft_kv4: the drafts read only its high nibbles.
static void expect_engine_equals_w4a16_on_all_problems(const std::string& draft, int64_t gamma,
                                                        qspec::quant::Format weights = qspec::quant::Format::int4,
                                                        int64_t draft_window = 0, int64_t draft_sinks = 0,
                                                        const std::string& qspec_costs = "", int64_t draft_vocab = 0,
                                                        int64_t draft_skip = 0,
                                                        qspec::KvCacheFormat kv_cache = qspec::KvCacheFormat::f16,
                                                        bool draft_kv4 = false) {
  Fixture& f = fixture(weights);
  ASSERT_EQ(f.prompts.size(), 400u);
  qspec::EngineOptions options;
  options.max_batch_size = 16;
  options.qspec_costs = qspec_costs;
  options.kv_cache = qspec::kv_cache_format_name(kv_cache);
  qspec::Engine engine(*f.model, f.tokenizer.get(), options);
  qspec::Request base;
  base.max_new_tokens = kMaxTokens;
  base.plan.mode = "qspec";
  base.plan.draft = draft;
  base.plan.gamma = gamma;
  base.plan.draft_window = draft_window;
  base.plan.draft_sinks = draft_sinks;
  base.plan.draft_vocab = draft_vocab;
  base.plan.draft_skip = draft_skip;
  base.plan.draft_kv4 = draft_kv4;
  std::vector<std::vector<int32_t>> outputs(f.prompts.size());
  std::vector<bool> finished(f.prompts.size(), false);
  qspec::QSpecMetrics totals;
  size_t next = 0;
  int64_t max_running = 0;
  for (int64_t step = 0; next < f.prompts.size() || engine.metrics().running + engine.metrics().waiting > 0; ++step) {
    for (int arrivals = 1 + static_cast<int>(step % 2); arrivals > 0 && next < f.prompts.size(); --arrivals, ++next) {
      qspec::Request request = base;
      request.prompt = f.prompts[next];
      const size_t index = next;
      engine.submit(request, [&, index](const qspec::TokenEvent& event) {
        outputs[index].insert(outputs[index].end(), event.tokens.begin(), event.tokens.end());
        if (event.finished) {
          EXPECT_NE(event.finish_reason, "error") << event.error;
          finished[index] = true;
          totals.add(event.metrics->qspec);
        }
      });
    }
    engine.step();
    max_running = std::max(max_running, engine.metrics().running);
  }
  EXPECT_EQ(max_running, 16);  // the batch did fill
  const std::string label = "engine " + draft +
                            (draft_window > 0 ? " window " + std::to_string(draft_window) + "+" +
                                                    std::to_string(draft_sinks)
                                              : "") +
                            (draft_vocab > 0 ? " vocab " + std::to_string(draft_vocab) : "") +
                            (draft_skip > 0 ? " skip " + std::to_string(draft_skip) : "") +
                            (draft_kv4 ? " kv4" : "") + " kv-cache " + qspec::kv_cache_format_name(kv_cache) + " gamma " + std::to_string(gamma) + " " + std::string(qspec::quant::format_name(weights));
  int64_t matched = 0;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    ASSERT_TRUE(finished[i]) << i;
    matched += matches_or_tie(f, i, outputs[i], label, kv_cache);
  }
  std::printf("%s, batch 16: %lld/400 equal to w4a16 (or exact ties), acceptance %lld/%lld = %.1f%%\n", label.c_str(),
              static_cast<long long>(matched), static_cast<long long>(totals.accepted),
              static_cast<long long>(totals.drafted), 100.0 * totals.acceptance_rate());
  EXPECT_GT(totals.drafted, 0) << "the draft never proposed a token";
  EXPECT_EQ(matched, 400);
  if (draft == qspec::decode_rules::kAutoDraft) {
    std::printf("  planner: %s\n", qspec::describe_planner_metrics(totals).c_str());
    EXPECT_GT(totals.plan_steps["w4a16"], 0) << "the planner never chose a plain step";
    EXPECT_GT(totals.cycles, 0) << "the planner never chose a cycle";
  }
}

TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredNvfp4DraftGamma4) {
  expect_engine_equals_w4a16_on_all_problems("w4a4-nvfp4", 4);
}

// Asymmetric int4 weights (zero points, issue 55) with int8 drafts: the W4A8 integer kernels'
// minimum term (per-group activation sums) and W4A16's fma(code, scale, min) decode.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredW4a8DraftGamma4Int4Asym) {
  expect_engine_equals_w4a16_on_all_problems("w4a8", 4, qspec::quant::Format::int4_asym);
}
// Integer zero points (int4-zp) with 4-bit activation drafts: the float GEMM on its exact values.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredNvfp4DraftGamma4Int4Zp) {
  expect_engine_equals_w4a16_on_all_problems("w4a4-nvfp4", 4, qspec::quant::Format::int4_zp);
}

// Prompt-lookup drafts (no draft passes): the same promise.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredNgramDraftGamma4) {
  expect_engine_equals_w4a16_on_all_problems("ngram", 4);
}

// Drafts in the verify's own mode with a sparse view of the shared cache (the last 24 positions
// and 4 attention sinks, far fewer than a problem's prompt): the same promise.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredSparseKvDraftGamma3) {
  expect_engine_equals_w4a16_on_all_problems("w4a16", 3, qspec::quant::Format::int4, 24, 4);
}

// Drafts that score only the most frequent ids (a vocabulary subset, FR-Spec; 128 and 96 of the
// 477 ids, from the model's calibration text): in a low-precision mode, and in the verify's own
// mode composed with a sparse KV view. The drafts' argmax misses every id outside the subset,
// the verify scores all of them: the same promise.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredVocabSubsetW4a8DraftGamma4) {
  Fixture& f = fixture();
  ASSERT_NE(f.model->draft_vocab(), nullptr);
  expect_engine_equals_w4a16_on_all_problems("w4a8", 4, qspec::quant::Format::int4, 0, 0, "", 128);
}

TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredVocabSubsetSparseKvDraftGamma3) {
  expect_engine_equals_w4a16_on_all_problems("w4a16", 3, qspec::quant::Format::int4, 24, 4, "", 96);
}

// Drafts that skip layers (half of the 8, the table's first 2 and 4): a low-precision draft
// skipping 2, and the verify's own mode skipping 4 composed with a sparse KV view and a
// vocabulary subset. The skipped layers' K/V rows of a cycle are never written by the draft;
// the verify writes every layer's: the same promise.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredLayerSkipW4a8DraftGamma4) {
  Fixture& f = fixture();
  ASSERT_NE(f.model->draft_skip(), nullptr);
  std::printf("skip order:");
  for (size_t i = 0; i < f.model->draft_skip()->order.size(); ++i)
    std::printf(" %d (%.1f%%)", f.model->draft_skip()->order[i], 100 * f.model->draft_skip()->agreement[i + 1]);
  std::printf("\n");
  expect_engine_equals_w4a16_on_all_problems("w4a8", 4, qspec::quant::Format::int4, 0, 0, "", 0, 2);
}

TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredLayerSkipVocabSparseKvDraftGamma3) {
  expect_engine_equals_w4a16_on_all_problems("w4a16", 3, qspec::quant::Format::int4, 24, 4, "", 96, 4);
}

// The 8-bit KV cache (issue 50, diet 2), W4A16's reference on it too: a plain w4a8 draft reading
// all 8 bits of each code, and a w4a8 draft reading only the high nibbles (/k4), whose K/V rows the
// verify rewrites at 8 bits: the same promise.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredW4a8DraftGamma4Int8KvCache) {
  expect_engine_equals_w4a16_on_all_problems("w4a8", 4, qspec::quant::Format::int4, 0, 0, "", 0, 0,
                                             qspec::KvCacheFormat::int8);
}

TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredKv4W4a8DraftGamma4Int8KvCache) {
  expect_engine_equals_w4a16_on_all_problems("w4a8", 4, qspec::quant::Format::int4, 0, 0, "", 0, 0,
                                             qspec::KvCacheFormat::int8, /*draft_kv4=*/true);
}

// The 4-bit view composed with the verify's mode, a sparse view and a vocabulary subset.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredKv4SparseVocabDraftGamma3Int8KvCache) {
  expect_engine_equals_w4a16_on_all_problems("w4a16", 3, qspec::quant::Format::int4, 24, 4, "", 96, 0,
                                             qspec::KvCacheFormat::int8, /*draft_kv4=*/true);
}

// Draft auto over a step-cost table (this machine's CPU, this model's shapes) where drafts pay at
// batch 1-8 or a mean context up to 96 (a w4a8 or w4a4-nvfp4 step a tenth of a W4A16 step, a
// verify token 5 % of one) and nothing pays at batch 9+ from context 160 on: as the staggered
// batch fills to 16, its mean context moves across that line and the batch drains, the planner
// moves between cycles and plain steps; every output stays W4A16's.
TEST(QSpecGsm, EngineGreedyEqualsW4A16OnAll400ProblemsBatch16StaggeredDraftAutoSwitchingPlans) {
  qspec::QSpecCostTable table;
  table.device = qspec::cpu_device_name();
  table.model = "gsm-synth-llama";
  table.shape = qspec::ModelShape::of(fixture().model->config());
  for (int64_t context : {32, 96, 160, 512})
    for (int64_t batch : {1, 8, 9, 16}) {
      qspec::StepCostPoint p;
      p.batch = batch;
      p.context = context;
      p.w4a16_step_ms = 1.0;
      const bool pays = batch <= 8 || context <= 96;
      for (int64_t g : {1, 2, 4}) p.verify_ms[g] = 1.0 + (pays ? 0.05 : 2.0) * static_cast<double>(g);
      p.draft_step_ms = {{"ngram", 0.0}, {"w4a8", pays ? 0.1 : 3.0}, {"w4a4-nvfp4", pays ? 0.1 : 3.0}};
      table.points.push_back(p);
    }
  const std::string file =
      (std::filesystem::temp_directory_path() / ("qspec-gsm-auto-costs-" + std::to_string(::getpid()) + ".json")).string();
  table.save(file);
  expect_engine_equals_w4a16_on_all_problems("auto", 4, qspec::quant::Format::int4, 0, 0, file);
  std::filesystem::remove(file);
}

// tests/data/gsm/w4a16_greedy_reference.json, the W4A16 reference the gpu tests compare the GPU
// with on all 400 problems (tests/gpu/gpu_model_fixture.h), is what the CPU computes now: the
// same prompt ids, and each output the first max_tokens (96) of the CPU's greedy W4A16 output.
// When the CPU's W4A16 numerics change on purpose, regenerate it with the command it records.
TEST(QSpecGsm, CommittedW4A16ReferenceIsCurrent) {
  Fixture& f = fixture();
  std::ifstream file(QSPEC_SOURCE_DIR "/tests/data/gsm/w4a16_greedy_reference.json");
  ASSERT_TRUE(file.good());
  const nlohmann::json saved = nlohmann::json::parse(file);
  const auto prompts = saved.at("prompts").get<std::vector<std::vector<int32_t>>>();
  const auto outputs = saved.at("outputs").get<std::vector<std::vector<int32_t>>>();
  const auto max_tokens = saved.at("max_tokens").get<size_t>();
  ASSERT_EQ(prompts.size(), f.prompts.size());
  ASSERT_EQ(outputs.size(), f.references.size());
  ASSERT_LE(max_tokens, static_cast<size_t>(kMaxTokens));
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(prompts[i], f.prompts[i]) << "problem " << i;
    const std::vector<int32_t>& full = f.references[i];
    const std::vector<int32_t> expected(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(std::min(max_tokens, full.size())));
    EXPECT_EQ(outputs[i], expected) << "problem " << i << ": the committed reference is stale (regenerate it: "
                                    << saved.value("command", std::string("qspec eval qspec ... --save-reference")) << ")";
  }
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
        matches_or_tie(f, i, result.ids, label);
        drafted += result.metrics.drafted;
        accepted += result.metrics.accepted;
      }
      std::printf("%s: acceptance %.1f%%\n", label.c_str(),
                  100.0 * static_cast<double>(accepted) / static_cast<double>(std::max<int64_t>(1, drafted)));
    }
  }
}
