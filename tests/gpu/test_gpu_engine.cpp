// The continuous-batching engine with its forward passes on the GPU (EngineOptions::device
// "cuda"): the same scheduler, sampling and streaming as on the CPU, with the model, its paged
// KV cache and the greedy argmax on the GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpu_model_fixture.h"
#include "model/draft_vocab.h"
#include "model/llama.h"
#include "model/quantize.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_info.h"
#include "qspec/engine.h"
#include "qspec/error.h"
#include "runtime/qspec.h"
#include "runtime/qspec_costs.h"
#include "tokenizer/calibration_text.h"
#include "tokenizer/tokenizer.h"

namespace {

using qspec_gpu_test::kModelDir;
using qspec_gpu_test::Outputs;
using qspec_gpu_test::question_prompts;
using qspec_gpu_test::require_gpu;
using qspec_gpu_test::run_all;


// The W4A16 greedy references: all 400 eval problems from the committed CPU reference
// (gpu_reference_path), else (QSPEC_GPU_REFERENCE set empty) `fallback` question prompts with no
// references (the caller computes them).
struct Reference {
  std::vector<std::vector<int32_t>> prompts, outputs;
  int64_t max_tokens = 96;
};
Reference load_reference(const qspec::Tokenizer& tokenizer, int fallback) {
  Reference reference;
  const std::string path = qspec_gpu_test::gpu_reference_path();
  if (!path.empty()) {
    std::ifstream file(path);
    if (!file.good()) throw qspec::Error("cannot read the W4A16 reference " + path);
    const nlohmann::json saved = nlohmann::json::parse(file);
    reference.prompts = saved["prompts"].get<std::vector<std::vector<int32_t>>>();
    reference.outputs = saved["outputs"].get<std::vector<std::vector<int32_t>>>();
    reference.max_tokens = saved["max_tokens"].get<int64_t>();
  } else {
    reference.prompts = question_prompts(tokenizer, fallback);
  }
  return reference;
}

qspec::EngineOptions batching_options() {
  qspec::EngineOptions options;
  options.max_batch_size = 16;
  options.max_batch_tokens = 192;
  options.prefill_chunk = 48;  // prompts take several steps, beside other requests' decode tokens
  options.device = "cuda";
  options.max_context = 512;
  return options;
}

}  // namespace

// Greedy W4A16 through the GPU engine, many requests at once (continuous batching, chunked
// prefill beside decode tokens, slots refilled as requests finish), equals the CPU's W4A16
// greedy output: all 400 eval problems against the committed CPU reference (saved by `qspec eval qspec
// --save-reference`), else a subset against the CPU engine run here.
TEST(GpuEngine, GreedyW4A16EqualsTheCpuUnderContinuousBatching) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  const Reference reference = load_reference(*tokenizer, 24);
  const auto& prompts = reference.prompts;
  std::vector<std::vector<int32_t>> references = reference.outputs;
  const int64_t max_tokens = reference.max_tokens;
  std::vector<qspec::Request> requests;
  for (const auto& prompt : prompts) {
    qspec::Request request;
    request.prompt = prompt;
    request.max_new_tokens = max_tokens;
    request.plan.mode = "w4a16";
    requests.push_back(request);
  }
  qspec::EngineOptions options = batching_options();
  qspec::Engine gpu_engine(*model, tokenizer.get(), options);
  const Outputs gpu = run_all(gpu_engine, requests);
  if (references.empty()) {
    options.device = "cpu";
    qspec::Engine cpu_engine(*model, tokenizer.get(), options);
    references = run_all(cpu_engine, requests).ids;
  }
  ASSERT_EQ(references.size(), prompts.size());
  size_t identical = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(gpu.finish_reasons[i] == "eos" || gpu.finish_reasons[i] == "length") << gpu.finish_reasons[i];
    if (gpu.ids[i] == references[i]) ++identical;
    EXPECT_EQ(gpu.ids[i], references[i]) << "problem " << i;
  }
  const qspec::EngineMetrics metrics = gpu_engine.metrics();
  std::printf("  GPU engine W4A16 greedy == CPU greedy on %zu / %zu problems (%lld steps, batch up to 16)\n", identical,
              prompts.size(), static_cast<long long>(metrics.steps));
  EXPECT_GT(metrics.steps, 0);
  EXPECT_LT(metrics.steps, static_cast<int64_t>(prompts.size()) * max_tokens) << "requests ran one at a time";
}

// Log-probabilities on the GPU: each output token's, from the logit rows of the pass that chose
// it (a decode step's, a QSpec verify's), close to the CPU engine's (f16 logits there); prompt
// logprobs are refused at submit (the GPU keeps a few logit rows per sequence).
TEST(GpuEngine, OutputLogprobsMatchTheCpuAndPromptLogprobsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  const auto prompts = question_prompts(*tokenizer, 6);
  auto run = [&](const std::string& device, const std::string& mode) {
    qspec::EngineOptions options = batching_options();
    options.device = device;
    qspec::Engine engine(*model, tokenizer.get(), options);
    std::map<qspec::RequestId, std::vector<qspec::TokenLogprob>> logprobs;
    std::map<qspec::RequestId, std::vector<int32_t>> tokens;
    std::vector<qspec::RequestId> ids;
    for (const auto& prompt : prompts) {
      qspec::Request request;
      request.prompt = prompt;
      request.max_new_tokens = 32;
      request.plan.mode = mode;
      if (request.plan.qspec()) request.plan.draft = std::string(qspec::decode_rules::kCheapestDraft);
      request.plan.draft = "w4a8";
      request.logprobs = 2;
      ids.push_back(engine.submit(request, [&](const qspec::TokenEvent& event) {
        EXPECT_EQ(event.logprobs.size(), event.tokens.size());
        logprobs[event.id].insert(logprobs[event.id].end(), event.logprobs.begin(), event.logprobs.end());
        tokens[event.id].insert(tokens[event.id].end(), event.tokens.begin(), event.tokens.end());
      }));
    }
    engine.run_until_idle();
    std::vector<std::vector<qspec::TokenLogprob>> out;
    for (qspec::RequestId id : ids) out.push_back(logprobs[id]);
    qspec::Request scoring;
    scoring.prompt = prompts[0];
    scoring.prompt_logprobs = true;
    if (device == "cuda") {
      EXPECT_THROW(engine.submit(scoring, {}), qspec::Error);
    }
    return out;
  };
  const auto cpu = run("cpu", "w4a16");
  for (const char* mode : {"w4a16", "qspec"}) {
    const auto gpu = run("cuda", mode);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(gpu[i].size(), cpu[i].size()) << mode << " request " << i;
      for (size_t k = 0; k < gpu[i].size(); ++k) {
        EXPECT_EQ(gpu[i][k].id, cpu[i][k].id);
        EXPECT_NEAR(gpu[i][k].logprob, cpu[i][k].logprob, 0.05) << mode << " request " << i << " token " << k;
        ASSERT_EQ(gpu[i][k].top.size(), 2u);
        EXPECT_EQ(gpu[i][k].top[0].first, gpu[i][k].id);  // greedy
      }
    }
  }
}

// QSpec on the GPU: w4a8 drafts (int8 activations, the s8-mma GEMM) over the same 4-bit weights
// and KV cache, W4A16 verify runs of gamma + 1 tokens that overwrite the drafts' K/V, greedy
// acceptance from the GPU's argmax ids, under continuous batching beside prompt chunks. The
// output must equal W4A16 greedy decoding: the same references as the test above (all 400
// problems with the committed reference), gamma 1..6 across the requests, some adaptive.
class GpuEngineDrafts : public testing::TestWithParam<const char*> {};

// Every draft the GPU runs (each low-precision mode, and prompt-lookup n-gram drafts): greedy
// QSpec output is W4A16's, token for token.
// A parameter "MODE@W+S" drafts in MODE with a sparse view of the cache: the last W positions
// and S sinks (DecodePlan::draft_window / draft_sinks).
// A parameter ".../vN" scores only the N most frequent ids of a draft vocabulary table made from
// the model's calibration text (DecodePlan::draft_vocab; the GPU's subset GEMM and scatter).
// A parameter "int8:..." runs on an 8-bit KV cache (--kv-cache int8); ".../k4" drafts read only
// its high nibbles (DecodePlan::draft_kv4). The reference is then the GPU's own greedy W4A16 on
// the same int8 cache (the committed reference is the f16 cache's): QSpec equals W4A16 on the
// same cache format, whatever the draft reads.
TEST_P(GpuEngineDrafts, GreedyQSpecEqualsW4A16UnderContinuousBatching) {
  std::string param = GetParam();
  const bool int8_cache = param.rfind("int8:", 0) == 0;
  if (int8_cache) param = param.substr(5);
  qspec::DecodePlan spec;
  qspec::set_draft_spec(spec, param);
  const std::string draft = spec.draft;
  const int64_t window = spec.draft_window, sinks = spec.draft_window > 0 ? spec.draft_sinks : 0;
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  if (spec.draft_vocab > 0) {
    const qspec::CalibrationSet text = qspec::load_calibration_text(
        QSPEC_SOURCE_DIR "/data/calibration/gsm-synth-self.txt", *tokenizer, 1 << 20, 512);
    const std::vector<int32_t> ranked =
        qspec::rank_token_frequencies(text.sequences, model->config().vocab_size, tokenizer->eos_ids);
    model->set_draft_vocab(qspec::make_draft_vocab_table(*model, ranked, static_cast<int64_t>(ranked.size()),
                                                         {text.source}, text.tokens));
  }
  const Reference reference = load_reference(*tokenizer, 24);
  std::vector<std::vector<int32_t>> references = reference.outputs;
  std::vector<qspec::Request> requests;
  for (size_t i = 0; i < reference.prompts.size(); ++i) {
    qspec::Request request;
    request.prompt = reference.prompts[i];
    request.max_new_tokens = reference.max_tokens;
    request.plan.mode = "qspec";
    request.plan.draft = draft;
    request.plan.verify = "w4a16";
    request.plan.draft_window = window;
    request.plan.draft_sinks = sinks;
    request.plan.draft_vocab = spec.draft_vocab;
    request.plan.draft_kv4 = spec.draft_kv4;
    request.plan.gamma = 1 + static_cast<int64_t>(i % 6);
    request.plan.adaptive_gamma = i % 5 == 4;
    request.plan.max_gamma = 8;
    requests.push_back(request);
  }
  qspec::EngineOptions gpu_options = batching_options();
  if (int8_cache) {
    gpu_options.kv_cache = "int8";
    qspec::Engine reference_engine(*model, tokenizer.get(), gpu_options);
    std::vector<qspec::Request> plain = requests;
    for (qspec::Request& request : plain) request.plan.mode = "w4a16";
    const std::vector<std::vector<int32_t>> int8_references = run_all(reference_engine, plain).ids;
    size_t same_as_f16 = 0;
    for (size_t i = 0; i < int8_references.size() && i < references.size(); ++i)
      same_as_f16 += int8_references[i] == references[i] ? 1 : 0;
    std::printf("  W4A16 greedy on the int8 cache equals the f16 cache's on %zu / %zu problems\n", same_as_f16,
                int8_references.size());
    references = int8_references;
  }
  qspec::Engine gpu_engine(*model, tokenizer.get(), gpu_options);
  const Outputs gpu = run_all(gpu_engine, requests);
  if (references.empty()) {
    qspec::EngineOptions cpu_options = batching_options();
    cpu_options.device = "cpu";
    qspec::Engine cpu_engine(*model, tokenizer.get(), cpu_options);
    std::vector<qspec::Request> plain = requests;
    for (qspec::Request& request : plain) request.plan.mode = "w4a16";
    references = run_all(cpu_engine, plain).ids;
  }
  ASSERT_EQ(references.size(), requests.size());
  size_t identical = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(gpu.finish_reasons[i] == "eos" || gpu.finish_reasons[i] == "length") << gpu.finish_reasons[i];
    if (gpu.ids[i] == references[i]) ++identical;
    EXPECT_EQ(gpu.ids[i], references[i]) << "problem " << i << " gamma " << requests[i].plan.gamma;
  }
  const qspec::EngineMetrics metrics = gpu_engine.metrics();
  const qspec::QSpecMetrics& q = metrics.qspec;
  std::printf("  GPU engine QSpec (%s drafts, gamma 1..6) == W4A16 greedy on %zu / %zu problems; %lld cycles, "
              "accepted %lld / %lld drafts (%.1f%%), %lld steps\n",
              param.c_str(), identical, requests.size(), static_cast<long long>(q.cycles), static_cast<long long>(q.accepted),
              static_cast<long long>(q.drafted), q.drafted > 0 ? 100.0 * q.accepted / q.drafted : 0.0,
              static_cast<long long>(metrics.steps));
  EXPECT_GT(q.cycles, 0);
  EXPECT_GT(q.accepted, 0) << "no draft was ever accepted: the " << draft << " drafts are not the model's";
}

INSTANTIATE_TEST_SUITE_P(DraftModes, GpuEngineDrafts,
                         testing::Values("w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4", "ngram",
                                         "w4a16@24+4", "w4a8@40+16", "w4a8/v128", "w4a4-nvfp4/v256",
                                         "w4a16@24+4/v96", "int8:w4a8", "int8:w4a16/k4", "int8:w4a8/k4",
                                         "int8:w4a16@24+4/k4", "int8:ngram"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-' || ch == '@' || ch == '+' || ch == '/' || ch == ':') ch = '_';
                           return name;
                         });

// Draft auto on the GPU: a step-cost table for this GPU where drafts pay at batch 1-8 or a mean
// context up to 96 (a w4a8 step a tenth of a W4A16 step, a verify token 5 % of one) and nothing
// pays from batch 9 and context 160 on, so as the batch of 16 drains and its contexts grow the
// planner moves between plain steps, w4a8 cycles (drafts chained on the device) and n-gram
// cycles: greedy output stays W4A16's.
TEST(GpuEngine, DraftAutoGreedyEqualsW4A16WhateverThePlannerPicks) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  const Reference reference = load_reference(*tokenizer, 24);
  qspec::QSpecCostTable table;
  table.device = qspec::cuda::device_name();
  table.model = "gsm-synth-llama";
  table.shape = qspec::ModelShape::of(model->config());
  for (int64_t context : {32, 96, 160, 512})
    for (int64_t batch : {1, 8, 9, 16}) {
      qspec::StepCostPoint p;
      p.batch = batch;
      p.context = context;
      p.w4a16_step_ms = 1.0;
      const bool pays = batch <= 8 || context <= 96;
      for (int64_t g : {1, 2, 4}) p.verify_ms[g] = 1.0 + (pays ? 0.05 : 2.0) * static_cast<double>(g);
      p.draft_step_ms = {{"ngram", 0.0}, {"w4a8", pays ? 0.1 : 3.0}};
      table.points.push_back(p);
    }
  const std::string file =
      (std::filesystem::temp_directory_path() / ("qspec-gpu-auto-costs-" + std::to_string(::getpid()) + ".json")).string();
  table.save(file);
  std::vector<qspec::Request> requests;
  for (const auto& prompt : reference.prompts) {
    qspec::Request request;
    request.prompt = prompt;
    request.max_new_tokens = reference.max_tokens;
    request.plan.mode = "qspec";
    request.plan.draft = "auto";
    request.plan.max_gamma = 4;
    requests.push_back(request);
  }
  qspec::EngineOptions options = batching_options();
  options.qspec_costs = file;
  qspec::Engine gpu_engine(*model, tokenizer.get(), options);
  EXPECT_NE(gpu_engine.qspec_planner().find("drafts ngram, w4a8"), std::string::npos) << gpu_engine.qspec_planner();
  const Outputs gpu = run_all(gpu_engine, requests);
  std::vector<std::vector<int32_t>> references = reference.outputs;
  if (references.empty()) {
    qspec::EngineOptions cpu_options = batching_options();
    cpu_options.device = "cpu";
    qspec::Engine cpu_engine(*model, tokenizer.get(), cpu_options);
    std::vector<qspec::Request> plain = requests;
    for (qspec::Request& request : plain) request.plan.mode = "w4a16";
    references = run_all(cpu_engine, plain).ids;
  }
  ASSERT_EQ(references.size(), requests.size());
  size_t identical = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(gpu.finish_reasons[i] == "eos" || gpu.finish_reasons[i] == "length") << gpu.finish_reasons[i];
    identical += gpu.ids[i] == references[i];
    EXPECT_EQ(gpu.ids[i], references[i]) << "problem " << i;
  }
  const qspec::QSpecMetrics q = gpu_engine.metrics().qspec;
  std::printf("  GPU engine draft auto == W4A16 greedy on %zu / %zu problems; planner: %s\n", identical,
              requests.size(), qspec::describe_planner_metrics(q).c_str());
  EXPECT_GT(q.cycles, 0);
  EXPECT_GT(q.plan_steps.count("w4a16") ? q.plan_steps.at("w4a16") : 0, 0);
  std::filesystem::remove(file);
}

// Sampled requests, a repetition penalty (logit rows come back from the GPU), determinism by
// seed, and the requests the GPU engine cannot run refused at submit with the reason.
TEST(GpuEngine, SamplesFromGpuLogitsAndRefusesWhatItCannotRun) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::EngineOptions options;
  options.max_batch_size = 4;
  options.device = "cuda";
  options.max_context = 256;
  qspec::Engine engine(*model, tokenizer.get(), options);
  const auto prompts = question_prompts(*tokenizer, 3);
  std::vector<qspec::Request> requests;
  for (int repeat = 0; repeat < 2; ++repeat)
    for (const auto& prompt : prompts) {
      qspec::Request request;
      request.prompt = prompt;
      request.max_new_tokens = 40;
      request.ignore_eos = true;
      request.sampling.temperature = 0.8f;
      request.sampling.top_p = 0.95f;
      request.sampling.repetition_penalty = 1.1f;
      request.sampling.seed = 7;
      requests.push_back(request);
    }
  const Outputs out = run_all(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(out.finish_reasons[i], "length");
    ASSERT_EQ(out.ids[i].size(), 40u);
    for (int32_t id : out.ids[i]) ASSERT_TRUE(id >= 0 && id < model->config().vocab_size) << id;
  }
  // The same prompt and seed give the same tokens, whatever else shares the batch.
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out.ids[i], out.ids[i + prompts.size()]) << "prompt " << i;

  auto refused = [&](qspec::Request request, const std::string& expected) {
    try {
      engine.submit(std::move(request), [](const qspec::TokenEvent&) {});
      ADD_FAILURE() << "accepted a request the GPU engine cannot run (" << expected << ")";
    } catch (const qspec::Error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  qspec::Request qspec_request;  // ARC drafts need an ARC-calibrated model (and are not on the GPU)
  qspec_request.prompt = prompts[0];
  qspec_request.plan.mode = "qspec";
  qspec_request.plan.draft = "w4a4-nvfp4-arc";
  refused(qspec_request, "ARC");
  qspec_request.plan.draft = "w4a8";
  qspec_request.plan.kv_overwrite = false;
  refused(qspec_request, "GPU");
  // Layer-skipping drafts: the model has a skip table, but the GPU model runs every layer.
  qspec::DraftSkipTable skip;
  static_cast<qspec::DraftTableIdentity&>(skip) = qspec::draft_table_identity(*model, {}, 0);
  skip.order = {1};
  skip.agreement = {1.0, 0.5};
  model->set_draft_skip(skip);
  qspec_request.plan.kv_overwrite = true;
  qspec_request.plan.draft_skip = 1;
  refused(qspec_request, "CPU only");
  qspec::Request other_mode;
  other_mode.prompt = prompts[0];
  other_mode.plan.mode = "w4a8";
  refused(other_mode, "GPU");
  qspec::Request too_long;
  too_long.prompt.assign(300, prompts[0][0]);
  too_long.plan.mode = "w4a16";
  refused(too_long, "context is 256");
}

// Sampling on the GPU (EngineOptions::gpu_sampling, the default) draws the tokens the host's
// Sampler draws from the same logit rows with the same seeds: two engines, one sampling on the
// device and one copying the rows to the host, give every request the same tokens, under
// continuous batching, for every filter (and greedy with a repetition penalty).
TEST(GpuEngine, SamplingOnTheGpuDrawsWhatTheHostDraws) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  const auto prompts = question_prompts(*tokenizer, 6);
  std::vector<qspec::Request> requests;
  const std::vector<qspec::SamplingParams> samplings = {
      {.temperature = 1.0f, .seed = 1},
      {.temperature = 0.8f, .top_p = 0.95f, .repetition_penalty = 1.1f, .seed = 2},
      {.temperature = 0.7f, .top_k = 20, .seed = 3},
      {.temperature = 1.2f, .top_k = 50, .top_p = 0.9f, .min_p = 0.05f, .seed = 4},
      {.temperature = 0.0f, .repetition_penalty = 1.3f},
      {.temperature = 1.5f, .min_p = 0.1f, .seed = 5},
  };
  for (size_t i = 0; i < 12; ++i) {
    qspec::Request request;
    request.prompt = prompts[i % prompts.size()];
    request.max_new_tokens = 48;
    request.ignore_eos = true;
    request.sampling = samplings[i % samplings.size()];
    request.sampling.seed += 100 * (i / samplings.size());
    requests.push_back(request);
  }
  auto run = [&](bool gpu_sampling) {
    qspec::EngineOptions options = batching_options();
    options.max_batch_size = 8;  // 12 requests: slots are refilled as requests finish
    options.gpu_sampling = gpu_sampling;
    qspec::Engine engine(*model, tokenizer.get(), options);
    return run_all(engine, requests);
  };
  const Outputs device = run(true), host = run(false);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(device.finish_reasons[i], "length") << i;
    EXPECT_EQ(device.ids[i], host.ids[i]) << "request " << i << " (sampling " << i % samplings.size() << ")";
  }
}

// An engine on a device that is not there, or a mode the GPU does not run, fails when it is
// built, not at the first request.
TEST(GpuEngine, BadDeviceOptionsFailAtConstruction) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::EngineOptions options;
  options.device = "tpu";
  EXPECT_THROW(qspec::Engine(*model, nullptr, options), qspec::Error);
  options.device = "cuda";
  options.gpu_mode = "w4a4-nvfp4-arc";
  EXPECT_THROW(qspec::Engine(*model, nullptr, options), qspec::Error);
  options.gpu_mode = "w8a8";
  EXPECT_THROW(qspec::Engine(*model, nullptr, options), qspec::Error);
  options.gpu_mode = "";
  options.max_context = model->config().max_position_embeddings + 1;
  EXPECT_THROW(qspec::Engine(*model, nullptr, options), qspec::Error);
}

// An ARC-calibrated checkpoint (RTN int4 + ARCQuant: reordered inputs, augmented columns) on the
// GPU: its W4A16 greedy output equals the CPU's on the same checkpoint, and greedy QSpec with
// every ARC draft mode (residual channels quantized into the augmented columns), a plain 4-bit
// draft and the int8 draft (reordered, zero augmented columns) equals it too, under continuous
// batching. The eval problems of the committed reference (all 400), else 24.
TEST(GpuEngine, ArcCheckpointW4A16AndArcDraftsEqualTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  qspec::CalibrationSet calibration;
  calibration.source = "eval questions";
  for (const auto& prompt : question_prompts(*tokenizer, 16)) {
    calibration.sequences.push_back(prompt);
    calibration.tokens += static_cast<int64_t>(prompt.size());
  }
  qspec::QuantizeOptions quantize;
  quantize.format = qspec::quant::Format::int4;
  quantize.arc = true;
  qspec::quantize_model(*model, quantize, &calibration);
  ASSERT_TRUE(model->has_arc());
  const Reference reference = load_reference(*tokenizer, 24);
  std::vector<qspec::Request> plain;
  for (const auto& prompt : reference.prompts) {
    qspec::Request request;
    request.prompt = prompt;
    request.max_new_tokens = reference.max_tokens;
    request.plan.mode = "w4a16";
    plain.push_back(request);
  }
  qspec::EngineOptions cpu_options = batching_options();
  cpu_options.device = "cpu";
  qspec::Engine cpu_engine(*model, tokenizer.get(), cpu_options);
  const std::vector<std::vector<int32_t>> expected = run_all(cpu_engine, plain).ids;

  qspec::Engine gpu_engine(*model, tokenizer.get(), batching_options());
  auto check = [&](const std::vector<qspec::Request>& requests, const std::string& what) {
    const Outputs gpu = run_all(gpu_engine, requests);
    size_t identical = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (gpu.ids[i] == expected[i]) ++identical;
      EXPECT_EQ(gpu.ids[i], expected[i]) << what << " problem " << i;
    }
    std::printf("  ARC checkpoint, GPU %s == CPU W4A16 greedy on %zu / %zu problems\n", what.c_str(), identical,
                requests.size());
  };
  check(plain, "w4a16");
  for (const char* draft : {"w4a4-int4-arc", "w4a4-nvfp4-arc", "w4a4-mxfp4-arc", "w4a4-nvfp4", "w4a8"}) {
    std::vector<qspec::Request> requests = plain;
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].plan.mode = "qspec";
      requests[i].plan.draft = draft;
      requests[i].plan.verify = "w4a16";
      requests[i].plan.gamma = 1 + static_cast<int64_t>(i % 6);
    }
    const qspec::QSpecMetrics before = gpu_engine.metrics().qspec;
    check(requests, std::string("QSpec (") + draft + " drafts)");
    const qspec::QSpecMetrics after = gpu_engine.metrics().qspec;
    EXPECT_GT(after.accepted, before.accepted) << draft << ": no draft accepted";
    std::printf("    %s: accepted %lld / %lld drafts\n", draft, static_cast<long long>(after.accepted - before.accepted),
                static_cast<long long>(after.drafted - before.drafted));
  }
}

// ARC-calibrated checkpoints with zero points (int4-asym, int4-zp; issue 55) on the GPU: the ARC drafts
// run the symmetric kernels over K + S and the zero points' term over every group of the augmented
// row. W4A16 greedy output equals the CPU's on the same checkpoint, and greedy QSpec with each ARC
// draft equals it under continuous batching, the drafts accepted at least half the time (a missing
// or wrong zero-point term on the augmented columns drafts noise). 24 eval problems.
TEST(GpuEngine, ArcCheckpointWithZeroPointsEqualsTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  for (const qspec::quant::Format format : {qspec::quant::Format::int4_asym, qspec::quant::Format::int4_zp}) {
    SCOPED_TRACE(std::string(qspec::quant::format_name(format)));
    auto model = qspec::LlamaModel::load(kModelDir);
    auto tokenizer = qspec::Tokenizer::load(kModelDir);
    qspec::CalibrationSet calibration;
    calibration.source = "eval questions";
    for (const auto& prompt : question_prompts(*tokenizer, 16)) {
      calibration.sequences.push_back(prompt);
      calibration.tokens += static_cast<int64_t>(prompt.size());
    }
    qspec::QuantizeOptions quantize;
    quantize.format = format;
    quantize.arc = true;
    qspec::quantize_model(*model, quantize, &calibration);
    ASSERT_TRUE(model->has_arc());
    std::vector<qspec::Request> plain;
    for (const auto& prompt : question_prompts(*tokenizer, 24)) {
      qspec::Request request;
      request.prompt = prompt;
      request.max_new_tokens = 96;
      request.plan.mode = "w4a16";
      plain.push_back(request);
    }
    qspec::EngineOptions cpu_options = batching_options();
    cpu_options.device = "cpu";
    qspec::Engine cpu_engine(*model, tokenizer.get(), cpu_options);
    const std::vector<std::vector<int32_t>> expected = run_all(cpu_engine, plain).ids;

    qspec::Engine gpu_engine(*model, tokenizer.get(), batching_options());
    auto check = [&](const std::vector<qspec::Request>& requests, const std::string& what) {
      const Outputs gpu = run_all(gpu_engine, requests);
      size_t identical = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        if (gpu.ids[i] == expected[i]) ++identical;
        EXPECT_EQ(gpu.ids[i], expected[i]) << what << " problem " << i;
      }
      const std::string format_text(qspec::quant::format_name(format));  // a string_view: not NUL-ended
      std::printf("  ARC %s checkpoint, GPU %s == CPU W4A16 greedy on %zu / %zu problems\n", format_text.c_str(),
                  what.c_str(), identical, requests.size());
    };
    check(plain, "w4a16");
    for (const char* draft : {"w4a4-int4-arc", "w4a4-nvfp4-arc", "w4a4-mxfp4-arc"}) {
      std::vector<qspec::Request> requests = plain;
      for (size_t i = 0; i < requests.size(); ++i) {
        requests[i].plan.mode = "qspec";
        requests[i].plan.draft = draft;
        requests[i].plan.verify = "w4a16";
        requests[i].plan.gamma = 1 + static_cast<int64_t>(i % 6);
      }
      const qspec::QSpecMetrics before = gpu_engine.metrics().qspec;
      check(requests, std::string("QSpec (") + draft + " drafts)");
      const qspec::QSpecMetrics after = gpu_engine.metrics().qspec;
      EXPECT_GE(static_cast<double>(after.accepted - before.accepted),
                0.5 * static_cast<double>(after.drafted - before.drafted))
          << draft << " drafts on an ARC checkpoint with zero points";
      std::printf("    %s: accepted %lld / %lld drafts\n", draft, static_cast<long long>(after.accepted - before.accepted),
                  static_cast<long long>(after.drafted - before.drafted));
    }
  }
}

// int8-group weights beside int4-asym ones (what `qspec convert gguf --keep-4bit` makes of a
// Q4_K_M file: 8-bit q / v / gate / down, 4-bit k / up / o, groups of 16 and 32 in alternate
// layers, so q|k|v and gate|up split into runs of one format) in the GPU engine: W4A16 greedy
// output equals the CPU engine's (the 8-bit projections on the W8A16 kernel, f32 group scales on
// both), greedy QSpec equals it with quantized-activation drafts (the 4-bit parts quantize, the
// 8-bit ones run W8A16 in every mode) and a W4A16 sparse-cache draft (window 64, 4 sinks), and the drafts are accepted
// (>= 50 %); a model of int8-group weights alone too. 24 eval problems.
TEST(GpuEngine, Int8GroupWeightsBesideFourBitEqualTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  auto four_bit = qspec::LlamaModel::load(kModelDir);
  four_bit->quantize_weights(qspec::quant::Format::int4_asym, 32);
  std::vector<qspec::QuantizedLayerWeights> layers = four_bit->quantized_layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    const qspec::LayerWeights& w = four_bit->layer_weights(static_cast<int64_t>(l));
    const int64_t group = l % 2 ? 16 : 32;
    for (auto [target, source] : {std::pair{&layers[l].q_proj, &w.q_proj}, {&layers[l].v_proj, &w.v_proj},
                                  {&layers[l].gate_proj, &w.gate_proj}, {&layers[l].down_proj, &w.down_proj}})
      *target = qspec::quantize_rtn(*source, qspec::quant::Format::int8_group, group);
  }
  auto mixed = qspec::LlamaModel::load(kModelDir);
  mixed->set_quantized_weights(layers, four_bit->quantization());
  auto eight_bit = qspec::LlamaModel::load(kModelDir);
  eight_bit->quantize_weights(qspec::quant::Format::int8_group, 32);

  std::vector<qspec::Request> plain;
  for (const auto& prompt : question_prompts(*tokenizer, 24)) {
    qspec::Request request;
    request.prompt = prompt;
    request.max_new_tokens = 96;
    request.plan.mode = "w4a16";
    plain.push_back(request);
  }
  for (auto [model, name] : {std::pair{mixed.get(), "mixed int8-group / int4-asym"}, {eight_bit.get(), "int8-group"}}) {
    SCOPED_TRACE(name);
    qspec::EngineOptions cpu_options = batching_options();
    cpu_options.device = "cpu";
    qspec::Engine cpu_engine(*model, tokenizer.get(), cpu_options);
    const std::vector<std::vector<int32_t>> expected = run_all(cpu_engine, plain).ids;
    qspec::Engine gpu_engine(*model, tokenizer.get(), batching_options());
    auto check = [&](const std::vector<qspec::Request>& requests, const std::string& what) {
      const Outputs gpu = run_all(gpu_engine, requests);
      size_t identical = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        if (gpu.ids[i] == expected[i]) ++identical;
        EXPECT_EQ(gpu.ids[i], expected[i]) << what << " problem " << i;
      }
      std::printf("  %s weights, GPU %s == CPU W4A16 greedy on %zu / %zu problems\n", name, what.c_str(), identical,
                  requests.size());
    };
    check(plain, "w4a16");
    // w4a16 with a 64-position window and 4 sinks: a W4A16 draft over a sparse view of the cache.
    for (const char* draft : {"w4a8", "w4a4-nvfp4", "w4a16"}) {
      std::vector<qspec::Request> requests = plain;
      for (size_t i = 0; i < requests.size(); ++i) {
        requests[i].plan.mode = "qspec";
        requests[i].plan.draft = draft;
        if (std::string(draft) == "w4a16") {
          requests[i].plan.draft_window = 64;
          requests[i].plan.draft_sinks = 4;
        }
        requests[i].plan.verify = "w4a16";
        requests[i].plan.gamma = 1 + static_cast<int64_t>(i % 4);
      }
      const qspec::QSpecMetrics before = gpu_engine.metrics().qspec;
      check(requests, std::string("QSpec (") + draft + " drafts)");
      const qspec::QSpecMetrics after = gpu_engine.metrics().qspec;
      EXPECT_GE(static_cast<double>(after.accepted - before.accepted),
                0.5 * static_cast<double>(after.drafted - before.drafted))
          << draft << " drafts";
      std::printf("    %s: accepted %lld / %lld drafts\n", draft, static_cast<long long>(after.accepted - before.accepted),
                  static_cast<long long>(after.drafted - before.drafted));
    }
  }
}

// int4-asym and int4-zp weights (zero points, issue 55) in the GPU engine: W4A16 greedy output equals the CPU
// engine's on the same weights (f16 group scales and minimums on the GPU, f32 on the CPU), and
// greedy QSpec equals it, under continuous batching, with the drafts that run W4A16's kernels (a
// sparse-cache window, a vocabulary subset, both), with prompt lookup, and with quantized-activation
// drafts (w4a8, w4a4-nvfp4: the symmetric kernels plus the zero points' term), which must be
// accepted as often as on int4 weights (>= 80 %: a missing or wrong zero-point term drafts noise).
// 24 eval problems (the committed reference is int4's).
TEST(GpuEngine, Int4AsymW4A16AndW4A16DraftsEqualTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  for (const qspec::quant::Format format : {qspec::quant::Format::int4_asym, qspec::quant::Format::int4_zp}) {
    SCOPED_TRACE(std::string(qspec::quant::format_name(format)));
    auto model = qspec::LlamaModel::load(kModelDir);
    auto tokenizer = qspec::Tokenizer::load(kModelDir);
    model->quantize_weights(format);
    {
      const qspec::CalibrationSet text = qspec::load_calibration_text(
          QSPEC_SOURCE_DIR "/data/calibration/gsm-synth-self.txt", *tokenizer, 1 << 20, 512);
      const std::vector<int32_t> ranked =
          qspec::rank_token_frequencies(text.sequences, model->config().vocab_size, tokenizer->eos_ids);
      model->set_draft_vocab(qspec::make_draft_vocab_table(*model, ranked, static_cast<int64_t>(ranked.size()),
                                                           {text.source}, text.tokens));
    }
    std::vector<qspec::Request> plain;
    for (const auto& prompt : question_prompts(*tokenizer, 24)) {
      qspec::Request request;
      request.prompt = prompt;
      request.max_new_tokens = 96;
      request.plan.mode = "w4a16";
      plain.push_back(request);
    }
    qspec::EngineOptions cpu_options = batching_options();
    cpu_options.device = "cpu";
    qspec::Engine cpu_engine(*model, tokenizer.get(), cpu_options);
    const std::vector<std::vector<int32_t>> expected = run_all(cpu_engine, plain).ids;

    qspec::Engine gpu_engine(*model, tokenizer.get(), batching_options());
    auto check = [&](const std::vector<qspec::Request>& requests, const std::string& what) {
      const Outputs gpu = run_all(gpu_engine, requests);
      size_t identical = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        if (gpu.ids[i] == expected[i]) ++identical;
        EXPECT_EQ(gpu.ids[i], expected[i]) << what << " problem " << i;
      }
      std::printf("  int4-asym weights, GPU %s == CPU W4A16 greedy on %zu / %zu problems\n", what.c_str(), identical,
                  requests.size());
    };
    check(plain, "w4a16");
    for (const char* param : {"w4a16@24+4", "w4a16@24+4/v96", "ngram", "w4a8", "w4a4-nvfp4"}) {
      qspec::DecodePlan spec;
      qspec::set_draft_spec(spec, param);
      std::vector<qspec::Request> requests = plain;
      for (size_t i = 0; i < requests.size(); ++i) {
        requests[i].plan.mode = "qspec";
        requests[i].plan.draft = spec.draft;
        requests[i].plan.verify = "w4a16";
        requests[i].plan.draft_window = spec.draft_window;
        requests[i].plan.draft_sinks = spec.draft_window > 0 ? spec.draft_sinks : 0;
        requests[i].plan.draft_vocab = spec.draft_vocab;
        requests[i].plan.gamma = 1 + static_cast<int64_t>(i % 6);
      }
      const qspec::QSpecMetrics before = gpu_engine.metrics().qspec;
      check(requests, std::string("QSpec (") + param + " drafts)");
      const qspec::QSpecMetrics after = gpu_engine.metrics().qspec;
      EXPECT_GT(after.accepted, before.accepted) << param << ": no draft accepted";
      const std::string name = param;
      if (name == "w4a8" || name == "w4a4-nvfp4") {
        EXPECT_GE(static_cast<double>(after.accepted - before.accepted),
                  0.8 * static_cast<double>(after.drafted - before.drafted))
            << param << " drafts on zero-point weights";
      }
      std::printf("    %s: accepted %lld / %lld drafts\n", param, static_cast<long long>(after.accepted - before.accepted),
                  static_cast<long long>(after.drafted - before.drafted));
    }
  }
}
