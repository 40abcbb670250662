// Single-sequence generation on a loaded model: prefill the prompt in one pass, then
// decode token by token. (The batched, paged engine comes with the scheduler.)
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/llama.h"
#include "qspec/sampling.h"

namespace qspec {

struct GenerationOptions {
  int64_t max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;  // stop when one is produced (it is kept in the output)
  RunMode mode;                  // weights and activation precision of every forward pass
  KvCacheFormat kv_cache = KvCacheFormat::f16;  // what the KV cache stores (--kv-cache)
};

struct GenerationResult {
  std::vector<int32_t> ids;   // generated ids (prompt excluded)
  std::string finish_reason;  // "eos", "length" or "context"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // time of the tokens after the first
  double decode_tokens_per_second() const {
    return ids.size() > 1 && decode_seconds > 0 ? static_cast<double>(ids.size() - 1) / decode_seconds : 0;
  }
};

// on_token is called with each new id as soon as it is sampled; returning false stops.
GenerationResult generate(const LlamaModel& model, std::span<const int32_t> prompt,
                          const GenerationOptions& options,
                          const std::function<bool(int32_t)>& on_token = {});

}  // namespace qspec
