#include "runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "qspec/error.h"

namespace qspec {

namespace {
// Tokens per forward call inside a window: the KV cache carries the earlier chunks, so this
// only bounds the memory of the [chunk, vocab] logits and the activations.
constexpr int64_t kChunk = 512;
}  // namespace

double token_nll(std::span<const float> logits, int32_t target) {
  double max_logit = logits[0];
  for (const float v : logits) max_logit = std::max<double>(max_logit, v);
  double sum = 0.0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - max_logit);
  return -(static_cast<double>(logits[static_cast<size_t>(target)]) - max_logit - std::log(sum));
}

int64_t perplexity_window_count(int64_t n, int64_t context, int64_t stride) {
  if (n <= context) return 1;
  return 1 + (n - context + stride - 1) / stride;
}

PerplexityResult sliding_window_perplexity(const LlamaModel& model, std::span<const int32_t> tokens,
                                           const PerplexityOptions& options) {
  const auto start_time = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t model_context = model.config().max_position_embeddings;
  const int64_t vocab = model.config().vocab_size;
  QSPEC_CHECK(n >= 2, "perplexity: the text has ", n, " token", n == 1 ? "" : "s", "; at least 2 are needed");
  PerplexityResult result;
  result.context = options.context > 0 ? options.context : std::min<int64_t>(2048, model_context);
  QSPEC_CHECK(result.context >= 2, "perplexity: the context must be at least 2 tokens (got ", result.context, ")");
  QSPEC_CHECK(result.context <= model_context, "perplexity: a context of ", result.context,
              " tokens exceeds the model's ", model_context);
  result.stride = options.stride > 0 ? options.stride : result.context / 2;
  QSPEC_CHECK(result.stride < result.context, "perplexity: the stride (", result.stride,
              ") must be less than the context (", result.context,
              "), or the first token of every later window would go unscored");
  QSPEC_CHECK(options.max_windows >= 0, "perplexity: max_windows must be >= 0");
  result.total_windows = perplexity_window_count(n, result.context, result.stride);
  const int64_t planned =
      options.max_windows > 0 ? std::min(options.max_windows, result.total_windows) : result.total_windows;

  std::vector<float> logits;
  int64_t previous_end = 0;  // tokens before this are scored (t_0 never is)
  for (int64_t begin = 0; result.windows < planned; begin += result.stride) {
    const int64_t end = std::min(begin + result.context, n);
    // Score positions [first, end): those after the previous window's end (never t_begin,
    // which has no context inside the window; stride < context keeps it scored earlier).
    const int64_t first = std::max(previous_end, begin + 1);
    KvCache cache = model.new_cache(end - begin, options.kv_cache);
    for (int64_t chunk = begin; chunk < end; chunk += kChunk) {
      const int64_t chunk_end = std::min(chunk + kChunk, end);
      // The logits at position p predict t_{p+1}: this chunk scores (chunk, chunk_end].
      const bool needed = chunk_end >= first;  // some p in [chunk, chunk_end) has p + 1 >= first
      model.forward(tokens.subspan(static_cast<size_t>(chunk), static_cast<size_t>(chunk_end - chunk)), cache,
                    logits, /*all_logits=*/needed, options.mode);
      if (!needed) continue;
      for (int64_t p = std::max(chunk, first - 1); p < chunk_end && p + 1 < end; ++p) {
        const std::span<const float> row(logits.data() + (p - chunk) * vocab, static_cast<size_t>(vocab));
        result.nll_sum += token_nll(row, tokens[static_cast<size_t>(p + 1)]);
        ++result.tokens;
      }
    }
    previous_end = end;
    ++result.windows;
    if (options.on_window) options.on_window(result.windows, planned);
    if (end == n) break;
  }
  result.perplexity = std::exp(result.nll_sum / static_cast<double>(result.tokens));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return result;
}

}  // namespace qspec
