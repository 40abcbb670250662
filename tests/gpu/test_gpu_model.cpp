// The GPU forward pass (model/cuda/llama_gpu.h) on the bundled gsm-synth-llama checkpoint:
// W16A16 greedy ids against PyTorch's fp32 goldens, W4A16 greedy ids against the CPU's W4A16
// greedy ids on eval problems, and the load-time errors. Label `gpu`: fails without a GPU.
//
// Environment: QSPEC_GPU_EVAL_PROBLEMS = how many of the 400 eval problems the W4A16
// comparison runs (default 40; 400 for the full check of the issue).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/cuda/llama_gpu.h"
#include "model/llama.h"
#include "ops/cuda/device_info.h"
#include "qspec/error.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kModelDir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

void require_gpu() { ASSERT_GT(qspec::cuda::device_count(), 0) << "no CUDA GPU visible: the gpu tests need one"; }

std::string describe(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

}  // namespace

TEST(GpuModel, W16A16GreedyIdsMatchPyTorchGoldens) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  std::ifstream file(kModelDir + "/golden_fp32.json");
  ASSERT_TRUE(file.good());
  const nlohmann::json goldens = nlohmann::json::parse(file);
  qspec::GpuLlama gpu(*model, qspec::parse_run_mode("w16a16"), model->config().max_position_embeddings);
  std::printf("  GPU model holds %.1f MB on the device\n", gpu.device_bytes() / 1e6);
  int identical = 0;
  for (const nlohmann::json& golden : goldens) {
    const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = golden["greedy_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got =
        qspec::gpu_greedy_generate(gpu, prompt, static_cast<int64_t>(expected.size()), tokenizer->eos_ids);
    if (got == expected) ++identical;
    EXPECT_EQ(got, expected) << "prompt: " << golden["prompt"].get<std::string>() << "\n  gpu:    " << describe(got)
                             << "\n  golden: " << describe(expected);
  }
  std::printf("  W16A16 GPU greedy: %d / %zu goldens identical\n", identical, goldens.size());
}

TEST(GpuModel, W4A16GreedyIdsMatchTheCpu) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  auto tokenizer = qspec::Tokenizer::load(kModelDir);
  model->quantize_weights(qspec::quant::Format::int4);
  const qspec::RunMode mode = qspec::parse_run_mode("w4a16");
  qspec::GpuLlama gpu(*model, mode, model->config().max_position_embeddings);
  const char* env = std::getenv("QSPEC_GPU_EVAL_PROBLEMS");
  const int limit = env != nullptr ? std::atoi(env) : 40;
  std::ifstream file(kModelDir + "/eval_problems.jsonl");
  ASSERT_TRUE(file.good());
  int problems = 0, identical = 0;
  std::string line;
  while (problems < limit && std::getline(file, line)) {
    if (line.empty()) continue;
    const nlohmann::json problem = nlohmann::json::parse(line);
    const std::string prompt = "Question: " + problem["question"].get<std::string>() + "\nAnswer:";
    const std::vector<int32_t> ids = tokenizer->encode(prompt);
    qspec::GenerationOptions options;
    options.max_new_tokens = 160;
    options.eos_ids = tokenizer->eos_ids;
    options.mode = mode;
    const std::vector<int32_t> cpu = qspec::generate(*model, ids, options).ids;
    const std::vector<int32_t> got = qspec::gpu_greedy_generate(gpu, ids, 160, tokenizer->eos_ids);
    ++problems;
    if (got == cpu) ++identical;
    EXPECT_EQ(got, cpu) << "problem " << problems << "\n  gpu: " << describe(got) << "\n  cpu: " << describe(cpu);
  }
  std::printf("  W4A16 GPU greedy == CPU greedy on %d / %d eval problems\n", identical, problems);
  EXPECT_GT(problems, 0);
}

TEST(GpuModel, RejectsWhatIsNotOnTheGpuAtLoadTime) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  auto model = qspec::LlamaModel::load(kModelDir);
  // No 4-bit weights yet, an activation mode not on the GPU, a cache beyond the context.
  EXPECT_THROW(qspec::GpuLlama(*model, qspec::parse_run_mode("w4a16"), 64), qspec::Error);
  model->quantize_weights(qspec::quant::Format::int4);
  EXPECT_THROW(qspec::GpuLlama(*model, qspec::parse_run_mode("w4a8"), 64), qspec::Error);
  EXPECT_THROW(qspec::GpuLlama(*model, qspec::parse_run_mode("w16a16"), model->config().max_position_embeddings + 1),
               qspec::Error);
  // A full cache and a bad token id throw before any launch.
  qspec::GpuLlama gpu(*model, qspec::parse_run_mode("w16a16"), 4);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  EXPECT_THROW(gpu.forward(five), qspec::Error);
  const std::vector<int32_t> bad = {static_cast<int32_t>(model->config().vocab_size)};
  EXPECT_THROW(gpu.forward(bad), qspec::Error);
  EXPECT_EQ(gpu.length(), 0);
}
