// An engine over a GPU model built elsewhere (runtime/cuda/cuda_backend.h, GpuSlots::engine; the
// shapes from LlamaModel::without_weights), as `qspec bench --device cuda --replay` runs it: greedy
// W4A16 equals the CPU's with more requests than slots, and a ReplayBackend over it emits the
// recorded text with prompt-lookup drafts accepted as the text allows (bench/replay.h).
#include <gtest/gtest.h>

#include <map>

#include "bench/replay.h"
#include "gpu_model_fixture.h"
#include "model/cuda/llama_gpu.h"
#include "model/llama.h"
#include "qspec/engine.h"
#include "runtime/backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "tokenizer/tokenizer.h"

namespace {

using qspec_gpu_test::kModelDir;
using qspec_gpu_test::question_prompts;
using qspec_gpu_test::require_gpu;
using qspec_gpu_test::run_all;

TEST(GpuReplay, AnEngineOverAGpuModelBuiltElsewhereEqualsTheCpuAndReplaysText) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  const auto shapes = qspec::LlamaModel::without_weights(model->config(), model->quantization());
  qspec::EngineOptions options;
  options.max_batch_size = 4;
  options.max_context = 256;
  options.device = "cuda";
  qspec::RunMode mode = qspec::parse_run_mode("w4a16");
  mode.activations.group_size = model->auto_group_size();
  qspec::GpuLlama gpu(*model, mode, qspec::engine_gpu_options(options, options.max_context));

  // 12 requests through 4 slots: each slot taken, released and taken again.
  const auto prompts = question_prompts(*tokenizer, 12);
  std::vector<qspec::Request> requests;
  for (const auto& prompt : prompts) {
    qspec::Request request;
    request.prompt = prompt;
    request.max_new_tokens = 24;
    request.plan.mode = "w4a16";
    requests.push_back(request);
  }
  qspec::Engine over_gpu(*shapes, nullptr, options, qspec::make_cuda_backend(gpu, mode, qspec::GpuSlots::engine));
  const auto got = run_all(over_gpu, requests);
  qspec::EngineOptions cpu_options = options;
  cpu_options.device = "cpu";
  qspec::Engine cpu(*model, nullptr, cpu_options);
  const auto want = run_all(cpu, requests);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got.ids[i], want.ids[i]) << "request " << i;

  // Texts that repeat their prompts, replayed with prompt-lookup drafts, gamma 3.
  std::vector<qspec::ReplayText> texts;
  for (const auto& prompt : prompts) {
    qspec::ReplayText text{prompt, {}};
    for (size_t i = 0; text.output.size() < 32; ++i) text.output.push_back(prompt[2 + i % (prompt.size() - 2)]);
    texts.push_back(text);
  }
  auto replay = std::make_unique<qspec::ReplayBackend>(qspec::make_cuda_backend(gpu, mode, qspec::GpuSlots::engine),
                                                       mode.key(), model->config().vocab_size);
  qspec::ReplayBackend* backend = replay.get();
  qspec::Engine replaying(*shapes, nullptr, options, std::move(replay));
  std::vector<std::vector<int32_t>> outputs(texts.size());
  qspec::QSpecMetrics metrics;
  std::map<qspec::RequestId, size_t> index;
  for (size_t i = 0; i < texts.size(); ++i) {
    qspec::Request request;
    request.prompt = texts[i].prompt;
    request.max_new_tokens = static_cast<int64_t>(texts[i].output.size());
    request.ignore_eos = true;
    request.plan.mode = "qspec";
    request.plan.verify = "w4a16";
    qspec::set_draft_spec(request.plan, "ngram");
    request.plan.gamma = 3;
    const qspec::RequestId id = replaying.submit(request, [&](const qspec::TokenEvent& event) {
      auto& out = outputs[index.at(event.id)];
      out.insert(out.end(), event.tokens.begin(), event.tokens.end());
      if (event.finished && event.metrics) metrics.add(event.metrics->qspec);
    });
    index[id] = i;
    backend->follow(id, &texts[i]);
  }
  replaying.run_until_idle();
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(outputs[i], texts[i].output) << "text " << i;
  ASSERT_GT(metrics.drafted, 0);
  EXPECT_GT(metrics.acceptance_rate(), 0.8) << metrics.accepted << " of " << metrics.drafted;
  EXPECT_GT(backend->replayed_rows(), 0);
}

}  // namespace
