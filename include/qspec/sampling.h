// Sampling parameters of a request, as users know them from llama.cpp / vLLM / OpenAI.
#pragma once
#include <cstdint>
#include <optional>

namespace qspec {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; CTRL-style, over prompt and output tokens
  uint64_t seed = 0;                // fixed seed: same output for the same request

  bool greedy() const { return temperature <= 0.0f; }
};

}  // namespace qspec
