// Sampling parameters of a request, as users know them from llama.cpp / vLLM / OpenAI, and the
// log-probabilities a request may ask for.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace qspec {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; CTRL-style, over prompt and output tokens
  // OpenAI's penalties over the output tokens only (as vLLM): logit -= presence_penalty once a
  // token has appeared, and -= frequency_penalty per appearance. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias{};  // added to those ids' logits before sampling
  uint64_t seed = 0;                // fixed seed: same output for the same request

  bool greedy() const { return temperature <= 0.0f; }
  // Whether any of OpenAI's additive adjustments (penalties, logit_bias) is on.
  bool has_additive_adjustments() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || !logit_bias.empty();
  }
};

// Bounds of OpenAI's adjustments (its API's): |presence_penalty|, |frequency_penalty| and
// |logit_bias| values.
inline constexpr float kMaxPenalty = 2.0f;
inline constexpr float kMaxLogitBias = 100.0f;

// The most alternatives a request may ask for per token (OpenAI's top_logprobs bound, vLLM's
// default --max-logprobs).
inline constexpr int32_t kMaxTopLogprobs = 20;

// A token's log-probability under the model's distribution: the log-softmax of the logits the
// engine computed for its position (the target pass's; in QSpec the W4A16 verify's) at
// temperature 1, before penalties, logit_bias and filters (vLLM's default "raw_logprobs").
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // the most likely ids and their logprobs, best first (ties: lower id)
};

}  // namespace qspec
