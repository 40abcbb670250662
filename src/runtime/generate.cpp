#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "qspec/error.h"
#include "ops/sample.h"

namespace qspec {

GenerationResult generate(const LlamaModel& model, std::span<const int32_t> prompt,
                          const GenerationOptions& options, const std::function<bool(int32_t)>& on_token) {
  const int64_t context = model.config().max_position_embeddings;
  QSPEC_CHECK(!prompt.empty(), "generate: the prompt is empty (and the tokenizer adds no bos)");
  QSPEC_CHECK(static_cast<int64_t>(prompt.size()) < context, "generate: the prompt has ", prompt.size(),
              " tokens; the model's context is ", context, " tokens");
  QSPEC_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0");
  using Clock = std::chrono::steady_clock;

  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t budget = std::min<int64_t>(options.max_new_tokens, context - result.prompt_tokens);
  result.finish_reason = budget < options.max_new_tokens ? "context" : "length";
  if (budget == 0) return result;

  KvCache cache = model.new_cache(std::min<int64_t>(context, result.prompt_tokens + budget), options.kv_cache);
  Sampler sampler(options.sampling);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits;

  auto start = Clock::now();
  model.forward(prompt, cache, logits, /*all_logits=*/false, options.mode);
  auto decode_start = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(decode_start - start).count();
  for (int64_t step = 0; step < budget; ++step) {
    if (step > 0) model.forward(std::span<const int32_t>(&history.back(), 1), cache, logits, false, options.mode);
    const int32_t next = sampler.sample(logits, history);
    history.push_back(next);
    result.ids.push_back(next);
    if (step == 0) decode_start = Clock::now();
    const bool keep_going = !on_token || on_token(next);
    if (std::find(options.eos_ids.begin(), options.eos_ids.end(), next) != options.eos_ids.end()) {
      result.finish_reason = "eos";
      break;
    }
    if (!keep_going) {
      result.finish_reason = "stopped";
      break;
    }
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - decode_start).count();
  return result;
}

}  // namespace qspec
