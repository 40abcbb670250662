// What the model-level gpu tests share: the bundled fixture model, the GPU check (the gpu tests
// fail without a GPU, they never skip) and the eval questions as prompts.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/cuda/device_info.h"
#include "tokenizer/tokenizer.h"

namespace qspec_gpu_test {

inline const std::string kModelDir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

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
