// What the model-level gpu tests share: the bundled fixture model, the GPU check (the gpu tests
// fail without a GPU, they never skip) and the eval questions as prompts.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/cuda/device_info.h"
#include "tokenizer/tokenizer.h"

namespace qspec_gpu_test {

inline const std::string kModelDir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

// The CPU's W4A16 greedy outputs of all 400 eval problems (prompt ids and outputs of at most 96
// tokens), saved by `qspec eval qspec models/gsm-synth-llama --limit 0 -n 96 --drafts w4a8
// --gammas 1 --batch-sizes 16 --save-reference FILE` and kept current by the CPU test
// QSpecGsm.CommittedW4A16ReferenceIsCurrent. QSPEC_GPU_REFERENCE names another file; set empty,
// the tests compute references for a subset on the CPU instead.
inline std::string gpu_reference_path() {
  const char* path = std::getenv("QSPEC_GPU_REFERENCE");
  return path != nullptr ? std::string(path) : QSPEC_SOURCE_DIR "/tests/data/gsm/w4a16_greedy_reference.json";
}

inline void require_gpu() {
  ASSERT_GT(qspec::cuda::device_count(), 0) << "no CUDA GPU visible: the gpu tests need one";
}

// The first `count` eval problems as "Question: ...\nAnswer:" prompts.
inline std::vector<std::vector<int32_t>> question_prompts(const qspec::Tokenizer& tokenizer, int count) {
  std::ifstream file(kModelDir + "/eval_problems.jsonl");
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  while (static_cast<int>(prompts.size()) < count && std::getline(file, line)) {
    if (line.empty()) continue;
    const nlohmann::json problem = nlohmann::json::parse(line);
    prompts.push_back(tokenizer.encode("Question: " + problem["question"].get<std::string>() + "\nAnswer:"));
  }
  return prompts;
}

}  // namespace qspec_gpu_test
