// Qwen2 (q/k/v biases, tied embeddings), Qwen3 (per-head q/k RMSNorm, explicit head_dim) and
// Gemma 3 ((1 + w) and output norms, GeGLU, scaled embeddings, sliding layers with their own
// RoPE, query_pre_attn_scalar, logit soft-capping; at head_dim 64 and 256) on the GPU against the
// CPU forward pass, on tiny random checkpoints of each layout (family_checkpoints.h): W16A16 logits within the
// GPU-vs-CPU bound along prefill and decode steps, W4A16 greedy ids equal to the CPU's, every
// activation mode (ARC ones on an ARC-calibrated Qwen2) running with logits near the CPU's in that
// mode, and greedy QSpec equal to greedy W4A16 on the GPU for every draft; and the head_dim-256
// Gemma 3 of tests/data/tiny against transformers' logits. Label `gpu`: fails without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "family_checkpoints.h"
#include "gpu_model_fixture.h"
#include "model/cuda/llama_gpu.h"
#include "model/llama.h"
#include "model/quantize.h"
#include "qspec/engine.h"
#include "qspec/error.h"
#include "runtime/generate.h"

namespace {

using qspec_gpu_test::Family;
using qspec_gpu_test::FamilyCheckpoint;
using qspec_gpu_test::Outputs;
using qspec_gpu_test::random_prompts;
using qspec_gpu_test::require_gpu;
using qspec_gpu_test::run_all;

// ||a - b|| / ||b||.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// The top logit's lead over the runner-up.
double top_two_gap(const std::vector<float>& row) {
  std::vector<float> sorted = row;
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  return static_cast<double>(sorted[0]) - sorted[1];
}

// Random checkpoints' logits have near-ties now and then: a pick whose runner-up is within this of
// the top is a coin toss between two correct kernels (f16 against f32, the prefill attention
// against the decode one: ~0.02 apart here), so greedy comparisons skip such steps or such
// prompts. The checkpoints' logits spread over 8-17 (rms).
constexpr double kTieMargin = 0.15;

qspec::RunMode mode_of(const qspec::LlamaModel& model, const std::string& name) {
  qspec::RunMode mode = qspec::parse_run_mode(name);
  if (mode.quantized_weights && mode.activations.group_size > 0) mode.activations.group_size = model.auto_group_size();
  return mode;
}

// The GPU's and the CPU's logits along a prompt and `steps` decode steps fed the CPU's greedy ids
// (teacher forcing: both see the same tokens); returns the worst relative error, and checks every
// step's against `bound` and, with check_picks, the greedy picks where the CPU's are clear (a
// runner-up more than kTieMargin behind).
double compare_along_decode(const qspec::LlamaModel& model, const qspec::RunMode& mode, const std::vector<int32_t>& prompt,
                            int steps, double bound, const std::string& what, bool check_picks = true) {
  qspec::GpuLlama gpu(model, mode, 256);
  qspec::KvCache cache = model.new_cache(256);
  std::vector<float> cpu;
  model.forward(prompt, cache, cpu, false, mode);
  int32_t gpu_id = gpu.forward(prompt);
  double worst = 0;
  for (int step = 0;; ++step) {
    const std::vector<float> got = gpu.logits();
    EXPECT_TRUE(all_finite(got)) << what << " step " << step;
    const double error = relative_error(got, cpu);
    worst = std::max(worst, error);
    EXPECT_LT(error, bound) << what << " step " << step;
    const int32_t cpu_id = argmax(cpu);
    if (check_picks && top_two_gap(cpu) > kTieMargin) {
      EXPECT_EQ(gpu_id, cpu_id) << what << " step " << step;
    }
    if (step == steps) break;
    const std::vector<int32_t> next = {cpu_id};
    model.forward(next, cache, cpu, false, mode);
    gpu_id = gpu.forward(next);
  }
  return worst;
}

// How far quantizing the activations moves the CPU's own logits: the CPU in `mode` against the
// CPU in W4A16 (the same 4-bit weights) after `prompt`. The GPU's logits in a quantized-activation
// mode are held to a multiple of this, not to a fixed number: its inputs to the quantizer are f16
// where the CPU's are f32, so codes near a rounding boundary land on the other side, and each such
// flip moves a value by a whole quantization step (1/7 of its group's largest for int4). On these
// 128-256-wide 2-layer checkpoints that costs about what the quantization itself costs (H200,
// ab5c0ca: GPU against CPU 0.27 / 0.43 / 0.39 for w4a4-int4 on Qwen2 / Qwen3 / Gemma 3, where the
// CPU's own w4a4-int4 is 0.28 / 0.41 / 0.44 from its W4A16; w4a8 0.02-0.04 against 0.02-0.04). A
// path that dropped the biases, the q/k norms or the GeGLU would be off by the logits' whole size.
constexpr double kQuantizedActivationsFactor = 2.5;
constexpr double kQuantizedActivationsFloor = 0.05;
double quantized_activations_bound(const qspec::LlamaModel& model, const qspec::RunMode& mode,
                                   const qspec::RunMode& w4a16, const std::vector<int32_t>& prompt) {
  auto logits_in = [&](const qspec::RunMode& m) {
    qspec::KvCache cache = model.new_cache(256);
    std::vector<float> logits;
    model.forward(prompt, cache, logits, false, m);
    return logits;
  };
  const double moved = relative_error(logits_in(mode), logits_in(w4a16));
  return std::max(kQuantizedActivationsFloor, kQuantizedActivationsFactor * moved);
}

// A prompt and the CPU's greedy continuation in some mode.
struct Continued {
  std::vector<int32_t> prompt, continuation;
};

// Up to `want` random prompts (from 4 x want candidates) whose CPU greedy continuation of
// new_tokens ids in `mode` is clear at every pick (runner-up more than kTieMargin behind): there a
// GPU pass must pick the same ids, whatever its kernels' rounding.
std::vector<Continued> clear_prompts(const qspec::LlamaModel& model, const qspec::RunMode& mode, int want,
                                     int64_t new_tokens, uint32_t seed, int64_t spread = 40) {
  std::vector<Continued> kept;
  for (const std::vector<int32_t>& prompt : random_prompts(4 * want, seed, spread)) {
    if (static_cast<int>(kept.size()) == want) break;
    qspec::KvCache cache = model.new_cache(256);
    std::vector<float> logits;
    model.forward(prompt, cache, logits, false, mode);
    Continued c{prompt, {}};
    bool clear = true;
    while (clear && static_cast<int64_t>(c.continuation.size()) < new_tokens) {
      clear = top_two_gap(logits) > kTieMargin;
      const std::vector<int32_t> next = {argmax(logits)};
      c.continuation.push_back(next[0]);
      model.forward(next, cache, logits, false, mode);
    }
    if (clear) kept.push_back(std::move(c));
  }
  return kept;
}

class GpuFamilies : public testing::TestWithParam<Family> {};

std::string family_test_name(const testing::TestParamInfo<Family>& info) {
  return qspec_gpu_test::family_name(info.param);
}

}  // namespace

// W16A16 on the GPU: logits within 1e-2 relative of the CPU's (f16 weights and activations
// against f32) along a prefill and 24 graph-replayed decode steps, same greedy picks.
TEST_P(GpuFamilies, W16A16LogitsMatchTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  const FamilyCheckpoint checkpoint(GetParam());
  auto model = qspec::LlamaModel::load(checkpoint.dir());
  double worst = 0;
  for (const std::vector<int32_t>& prompt : random_prompts(4, 11))
    worst = std::max(worst, compare_along_decode(*model, qspec::parse_run_mode("w16a16"), prompt, 24, 1e-2, "w16a16"));
  std::printf("  %s W16A16: worst relative logit error against the CPU %.3g\n", model->config().architecture_name.c_str(),
              worst);
}

// W4A16 greedy ids on the GPU equal the CPU's W4A16 greedy ids (RTN int4 weights).
TEST_P(GpuFamilies, W4A16GreedyIdsMatchTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  const FamilyCheckpoint checkpoint(GetParam());
  auto model = qspec::LlamaModel::load(checkpoint.dir());
  model->quantize_weights(qspec::quant::Format::int4);
  const qspec::RunMode mode = mode_of(*model, "w4a16");
  qspec::GpuLlama gpu(*model, mode, 256);
  int identical = 0;
  const std::vector<Continued> prompts = clear_prompts(*model, mode, 12, 48, 23);
  ASSERT_GE(prompts.size(), 6u) << "too few prompts without near-ties";
  for (const Continued& c : prompts) {
    // The CPU's greedy run (qspec::generate) is the continuation clear_prompts followed.
    qspec::GenerationOptions options;
    options.max_new_tokens = 48;
    options.mode = mode;
    ASSERT_EQ(qspec::generate(*model, c.prompt, options).ids, c.continuation);
    const std::vector<int32_t> got = qspec::gpu_greedy_generate(gpu, c.prompt, 48, {});
    if (got == c.continuation) ++identical;
    EXPECT_EQ(got, c.continuation);
  }
  std::printf("  %s W4A16 GPU greedy == CPU greedy on %d / %zu prompts\n", model->config().architecture_name.c_str(),
              identical, prompts.size());
}

// Every activation mode runs (nothing refused at load) and its logits stay near the CPU's in the
// same mode, prefill and decode: the biases / norms reach the GEMM outputs of every activation
// path (the checkpoints' biases and norm weights are large: without them the logits are far off).
TEST_P(GpuFamilies, EveryActivationModeRunsNearTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  const FamilyCheckpoint checkpoint(GetParam());
  auto model = qspec::LlamaModel::load(checkpoint.dir());
  model->quantize_weights(qspec::quant::Format::int4);
  const std::vector<int32_t> prompt = random_prompts(1, 31).front();
  // f16 activations: within 1e-2 and the same greedy picks; quantized ones: within
  // quantized_activations_bound (above).
  const qspec::RunMode w4a16 = mode_of(*model, "w4a16");
  for (const std::string name : {"w16a16", "w4a16", "w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"}) {
    const qspec::RunMode mode = mode_of(*model, name);
    const bool f16_activations = name == "w16a16" || name == "w4a16";
    const double bound = f16_activations ? 1e-2 : quantized_activations_bound(*model, mode, w4a16, prompt);
    const double worst = compare_along_decode(*model, mode, prompt, 8, bound, name, f16_activations);
    std::printf("  %s %s: worst relative logit error against the CPU %.3g (bound %.3g)\n",
                model->config().architecture_name.c_str(), name.c_str(), worst, bound);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GpuFamilies,
                         testing::Values(Family::qwen2, Family::qwen3, Family::gemma3, Family::gemma3_hd256),
                         family_test_name);

// An ARC-calibrated Qwen2 (reordered inputs, augmented columns) runs W4A16 and the ARC modes
// with its biases: logits near the CPU's in each.
TEST(GpuFamiliesArc, ArcCalibratedQwen2RunsItsModesNearTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  const FamilyCheckpoint checkpoint(Family::qwen2);
  auto model = qspec::LlamaModel::load(checkpoint.dir());
  qspec::CalibrationSet calibration;
  calibration.source = "random prompts";
  for (const std::vector<int32_t>& prompt : random_prompts(16, 41)) {
    calibration.sequences.push_back(prompt);
    calibration.tokens += static_cast<int64_t>(prompt.size());
  }
  qspec::QuantizeOptions quantize;
  quantize.format = qspec::quant::Format::int4;
  quantize.arc = true;
  qspec::quantize_model(*model, quantize, &calibration);
  ASSERT_TRUE(model->has_arc());
  const std::vector<int32_t> prompt = random_prompts(1, 43).front();
  const qspec::RunMode w4a16 = mode_of(*model, "w4a16");
  for (const std::string name : {"w4a16", "w4a8", "w4a4-int4-arc", "w4a4-nvfp4-arc", "w4a4-mxfp4-arc"}) {
    const qspec::RunMode mode = mode_of(*model, name);
    const bool f16_activations = name == "w4a16";
    const double bound = f16_activations ? 1e-2 : quantized_activations_bound(*model, mode, w4a16, prompt);
    const double worst = compare_along_decode(*model, mode, prompt, 8, bound, "ARC " + name, f16_activations);
    std::printf("  ARC-calibrated Qwen2 %s: worst relative logit error against the CPU %.3g (bound %.3g)\n", name.c_str(), worst,
                bound);
  }
}

// Gemma 3 at head_dim 256 against transformers itself (tests/data/tiny/gemma3-hd256, made by
// tools/make_tiny_checkpoints.py: Gemma 3 270M's heads, a sliding layer of window 8 and a full
// one, fp32 goldens): W16A16 logits on the GPU within 1e-2 relative of transformers' at every
// position of each golden prompt, its first half as one prefill, the rest as decode steps (the
// 29-token prompt runs past the window in both).
TEST(GpuFamiliesTransformers, Gemma3HeadDim256MatchesTransformersLogits) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  const std::string dir = std::string(QSPEC_SOURCE_DIR) + "/tests/data/tiny/gemma3-hd256";
  auto model = qspec::LlamaModel::load(dir);
  ASSERT_EQ(model->config().head_dim, 256);
  std::ifstream file(dir + "/golden.json");
  ASSERT_TRUE(file.good()) << dir;
  const nlohmann::json golden = nlohmann::json::parse(file);
  double worst = 0;
  for (size_t p = 0; p < golden["prompts"].size(); ++p) {
    const auto prompt = golden["prompts"][p].get<std::vector<int32_t>>();
    const auto expected = golden["logits"][p].get<std::vector<std::vector<float>>>();
    qspec::GpuLlama gpu(*model, qspec::parse_run_mode("w16a16"), model->config().max_position_embeddings);
    const size_t prefill = (prompt.size() + 1) / 2;
    gpu.forward(std::span<const int32_t>(prompt.data(), prefill));
    for (size_t t = prefill - 1; t < prompt.size(); ++t) {
      if (t >= prefill) gpu.forward(std::span<const int32_t>(&prompt[t], 1));
      const std::vector<float> got = gpu.logits();
      ASSERT_EQ(got.size(), expected[t].size());
      const double error = relative_error(got, expected[t]);
      worst = std::max(worst, error);
      EXPECT_LT(error, 1e-2) << "prompt " << p << " position " << t << (t < prefill ? " (prefill)" : " (decode)");
    }
  }
  std::printf("  gemma3-hd256 W16A16: worst relative logit error against transformers %.3g\n", worst);
}

namespace {

qspec::EngineOptions family_engine_options() {
  qspec::EngineOptions options;
  options.max_batch_size = 8;
  options.max_batch_tokens = 96;
  options.prefill_chunk = 24;  // prompts take several steps, beside other requests' decode tokens
  options.device = "cuda";
  options.max_context = 256;
  return options;
}

// (family, draft): "MODE@W+S" drafts in MODE over a sparse view of the cache (the last W positions
// and S sinks), as GpuEngineDrafts spells it.
using DraftCase = std::tuple<Family, const char*>;
class GpuFamilyDrafts : public testing::TestWithParam<DraftCase> {};

}  // namespace

// Greedy QSpec through the GPU engine (continuous batching, gamma 1..6, some adaptive) equals the
// GPU engine's greedy W4A16, token for token, for every draft the GPU runs.
TEST_P(GpuFamilyDrafts, GreedyQSpecEqualsW4A16OnTheGpu) {
  const auto [family, draft_param] = GetParam();
  const std::string param = draft_param;
  const size_t at = param.find('@');
  const std::string draft = param.substr(0, at);
  int64_t window = 0, sinks = 0;
  if (at != std::string::npos) {
    const size_t plus = param.find('+', at);
    window = std::stoll(param.substr(at + 1, plus - at - 1));
    sinks = std::stoll(param.substr(plus + 1));
  }
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  const FamilyCheckpoint checkpoint(family);
  auto model = qspec::LlamaModel::load(checkpoint.dir());
  model->quantize_weights(qspec::quant::Format::int4);
  std::vector<qspec::Request> plain, qspec_requests;
  // Prompts whose W4A16 continuation has no near-tie: there the verify pass (prefill attention)
  // and the plain decode steps must pick the same ids.
  const std::vector<Continued> prompts = clear_prompts(*model, mode_of(*model, "w4a16"), 16, 64, 53, 60);
  ASSERT_GE(prompts.size(), 8u) << "too few prompts without near-ties";
  for (size_t i = 0; i < prompts.size(); ++i) {
    qspec::Request request;
    request.prompt = prompts[i].prompt;
    request.max_new_tokens = 64;
    request.plan.mode = "w4a16";
    plain.push_back(request);
    request.plan.mode = "qspec";
    request.plan.draft = draft;
    request.plan.verify = "w4a16";
    request.plan.draft_window = window;
    request.plan.draft_sinks = sinks;
    request.plan.gamma = 1 + static_cast<int64_t>(i % 6);
    request.plan.adaptive_gamma = i % 5 == 4;
    request.plan.max_gamma = 8;
    qspec_requests.push_back(request);
  }
  qspec::Engine engine(*model, nullptr, family_engine_options());
  const Outputs reference = run_all(engine, plain);
  const Outputs got = run_all(engine, qspec_requests);
  size_t identical = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(got.finish_reasons[i] == "eos" || got.finish_reasons[i] == "length") << got.finish_reasons[i];
    if (got.ids[i] == reference.ids[i]) ++identical;
    EXPECT_EQ(got.ids[i], reference.ids[i]) << "prompt " << i << " gamma " << qspec_requests[i].plan.gamma;
    // The GPU's W4A16 is the CPU's here (up to an eos stop).
    const std::vector<int32_t>& cpu = prompts[i].continuation;
    EXPECT_TRUE(std::equal(reference.ids[i].begin(), reference.ids[i].end(), cpu.begin()))
        << "prompt " << i << ": GPU W4A16 left the CPU's greedy continuation";
  }
  const qspec::EngineMetrics metrics = engine.metrics();
  const qspec::QSpecMetrics& q = metrics.qspec;
  std::printf("  %s, GPU QSpec (%s drafts) == GPU W4A16 greedy on %zu / %zu prompts; accepted %lld / %lld drafts\n",
              model->config().architecture_name.c_str(), param.c_str(), identical, prompts.size(),
              static_cast<long long>(q.accepted), static_cast<long long>(q.drafted));
  EXPECT_GT(q.cycles, 0);
  if (draft != "ngram") {
    EXPECT_GT(q.accepted, 0) << "no " << draft << " draft was ever accepted";
  }
}

INSTANTIATE_TEST_SUITE_P(Drafts, GpuFamilyDrafts,
                         testing::Combine(testing::Values(Family::qwen2, Family::qwen3, Family::gemma3,
                                                          Family::gemma3_hd256),
                                          testing::Values("w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4",
                                                          "ngram", "w4a16@24+4", "w4a8@40+16")),
                         [](const testing::TestParamInfo<DraftCase>& info) {
                           std::string name = std::string(qspec_gpu_test::family_name(std::get<0>(info.param))) + "_" +
                                              std::get<1>(info.param);
                           for (char& ch : name)
                             if (ch == '-' || ch == '@' || ch == '+') ch = '_';
                           return name;
                         });

// The synthetic qwen2.5-7b benchmark model carries its q/k/v biases (random, drawn from the seed),
// so `qspec bench --synthetic qwen2.5-7b` pays for them: qwen2.5-7b-nobias (the same shapes, seed
// and weights without biases, the A/B of their cost) gives other logits; both stay finite through
// prefill and decode steps.
TEST(GpuFamiliesSynthetic, Qwen25SyntheticModelCarriesItsBiases) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  const qspec::ModelConfig config = qspec::synthetic_model_config("qwen2.5-7b");
  ASSERT_TRUE(config.attention_bias);
  qspec::GpuLlamaOptions options;
  options.max_seqs = 1;
  options.max_context = 512;
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 997 % config.vocab_size);
  auto run = [&](const qspec::ModelConfig& shapes) {
    auto gpu = qspec::GpuLlama::synthetic(shapes, qspec::parse_run_mode("w4a16"), options, 3);
    int32_t next = gpu->forward(prompt);
    for (int step = 0; step < 4; ++step) next = gpu->forward(std::span<const int32_t>(&next, 1));
    const std::vector<float> logits = gpu->logits();
    for (float v : logits) EXPECT_TRUE(std::isfinite(v));
    return logits;
  };
  const std::vector<float> with_biases = run(config);
  const qspec::ModelConfig bias_free = qspec::synthetic_model_config("qwen2.5-7b-nobias");  // the bench's A/B
  ASSERT_FALSE(bias_free.attention_bias);
  ASSERT_EQ(bias_free.parameter_count() + config.num_layers * (config.q_dim() + 2 * config.kv_dim()),
            config.parameter_count());
  const std::vector<float> without = run(bias_free);
  // Both runs are deterministic and differ only by the biases, which are small at the random
  // weights' scale (the logits moved by 6.9e-4 relative on the H200): any change shows they enter.
  EXPECT_GT(relative_error(with_biases, without), 1e-5) << "the synthetic biases changed nothing";
}
