// What the model-level gpu tests share: the bundled fixture model, the GPU check (the gpu tests
// fail without a GPU, they never skip), the eval questions as prompts and running an engine's
// requests to the end.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/cuda/device_info.h"
#include "qspec/engine.h"
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

// Each request's emitted ids and finish reason (": error" appended when there is one).
struct Outputs {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> finish_reasons;
};

// Submits every request at once and steps the engine until all have finished.
inline Outputs run_all(qspec::Engine& engine, const std::vector<qspec::Request>& requests) {
  Outputs out;
  out.ids.resize(requests.size());
  out.finish_reasons.resize(requests.size());
  std::map<qspec::RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    const qspec::RequestId id = engine.submit(requests[i], [&out, &index](const qspec::TokenEvent& event) {
      const size_t at = index.at(event.id);
      out.ids[at].insert(out.ids[at].end(), event.tokens.begin(), event.tokens.end());
      if (event.finished) out.finish_reasons[at] = event.finish_reason + (event.error.empty() ? "" : ": " + event.error);
    });
    index[id] = i;
  }
  engine.run_until_idle();
  return out;
}

}  // namespace qspec_gpu_test
