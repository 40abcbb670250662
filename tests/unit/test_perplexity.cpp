// Sliding-window perplexity (src/runtime/perplexity.h) on a tiny random Llama checkpoint:
// one window equals a direct single forward pass, and with overlapping windows every token
// but the first is scored exactly once, matching a literal transcription of the Hugging Face
// "Perplexity of fixed-length models" loop.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/llama.h"
#include "qspec/error.h"
#include "runtime/perplexity.h"

namespace {

const std::string kTinyModel = std::string(QSPEC_TEST_DATA) + "/tiny/llama3-rope";  // context 128

std::vector<int32_t> random_tokens(const qspec::LlamaModel& model, size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(model.config().vocab_size) - 1);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = pick(rng);
  return tokens;
}

// -log softmax(row)[target] in long double, independently of token_nll.
double reference_nll(const float* row, int64_t vocab, int32_t target) {
  long double max_logit = row[0];
  for (int64_t v = 1; v < vocab; ++v) max_logit = std::max<long double>(max_logit, row[v]);
  long double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<long double>(row[v]) - max_logit);
  return static_cast<double>(-(row[target] - max_logit - std::log(sum)));
}

// The HF loop, transcribed: labels of the window's first (length - target_length) tokens are
// masked, the loss is over the shifted labels. Returns (nll sum, tokens scored).
std::pair<double, int64_t> hf_reference(const qspec::LlamaModel& model, const std::vector<int32_t>& ids,
                                        int64_t max_length, int64_t stride) {
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = model.config().vocab_size;
  double nll = 0;
  int64_t count = 0, previous_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + max_length, n);
    const int64_t target_length = end - previous_end;
    std::vector<int32_t> input(ids.begin() + begin, ids.begin() + end);
    const int64_t length = static_cast<int64_t>(input.size());
    qspec::KvCache cache = model.new_cache(length);
    std::vector<float> logits;
    model.forward(input, cache, logits, /*all_logits=*/true);
    for (int64_t j = 1; j < length; ++j) {            // label j is predicted by logits j - 1
      if (j < length - target_length) continue;       // masked (-100)
      nll += reference_nll(logits.data() + (j - 1) * vocab, vocab, input[j]);
      ++count;
    }
    previous_end = end;
    if (end == n) break;
  }
  return {nll, count};
}

}  // namespace

TEST(PerplexitySlidingWindow, OneWindowEqualsDirectForward) {
  auto model = qspec::LlamaModel::load(kTinyModel);
  const std::vector<int32_t> tokens = random_tokens(*model, 60, 1);
  const int64_t vocab = model->config().vocab_size;
  qspec::KvCache cache = model->new_cache();
  std::vector<float> logits;
  model->forward(tokens, cache, logits, /*all_logits=*/true);
  double nll = 0;
  for (size_t i = 1; i < tokens.size(); ++i) nll += reference_nll(logits.data() + (i - 1) * vocab, vocab, tokens[i]);
  const double expected = std::exp(nll / static_cast<double>(tokens.size() - 1));

  for (int64_t context : {60, 64, 128}) {
    qspec::PerplexityOptions options;
    options.context = context;
    const qspec::PerplexityResult result = qspec::sliding_window_perplexity(*model, tokens, options);
    EXPECT_EQ(result.windows, 1) << context;
    EXPECT_EQ(result.tokens, 59) << context;
    EXPECT_NEAR(result.nll_sum, nll, 1e-9 * std::abs(nll)) << context;
    EXPECT_NEAR(result.perplexity, expected, 1e-9 * expected) << context;
  }
}

TEST(PerplexitySlidingWindow, EveryTokenButTheFirstScoredOnce) {
  auto model = qspec::LlamaModel::load(kTinyModel);
  const std::vector<int32_t> tokens = random_tokens(*model, 101, 2);
  qspec::PerplexityOptions full;
  full.context = 128;
  const qspec::PerplexityResult whole = qspec::sliding_window_perplexity(*model, tokens, full);
  ASSERT_EQ(whole.tokens, 100);

  for (const auto& [context, stride] : std::vector<std::pair<int64_t, int64_t>>{
           {32, 16}, {32, 1}, {32, 31}, {33, 10}, {100, 99}, {2, 1}, {64, 0 /* default: 32 */}}) {
    qspec::PerplexityOptions options;
    options.context = context;
    options.stride = stride;
    const qspec::PerplexityResult result = qspec::sliding_window_perplexity(*model, tokens, options);
    const int64_t resolved_stride = stride > 0 ? stride : context / 2;
    EXPECT_EQ(result.stride, resolved_stride);
    EXPECT_EQ(result.tokens, 100) << context << "/" << stride;
    EXPECT_EQ(result.windows, qspec::perplexity_window_count(101, context, resolved_stride));
    EXPECT_EQ(result.windows, result.total_windows);
    const auto [reference_nll_sum, reference_count] = hf_reference(*model, tokens, context, resolved_stride);
    EXPECT_EQ(result.tokens, reference_count) << context << "/" << stride;
    EXPECT_NEAR(result.nll_sum, reference_nll_sum, 1e-9 * reference_nll_sum) << context << "/" << stride;
    // Less context per token changes the result a little, not wholesale (a random model is
    // near-uniform, so its perplexity barely depends on context: within 5%; context 2 is a
    // bigram model, so it is left out of this check).
    if (context > 2) {
      EXPECT_NEAR(result.perplexity, whole.perplexity, 0.05 * whole.perplexity) << context << "/" << stride;
    }
  }
}

TEST(PerplexitySlidingWindow, MaxWindowsStopsEarly) {
  auto model = qspec::LlamaModel::load(kTinyModel);
  const std::vector<int32_t> tokens = random_tokens(*model, 100, 3);
  qspec::PerplexityOptions options;
  options.context = 32;
  options.stride = 8;
  options.max_windows = 3;
  std::vector<std::pair<int64_t, int64_t>> progress;
  options.on_window = [&](int64_t done, int64_t planned) { progress.emplace_back(done, planned); };
  const qspec::PerplexityResult result = qspec::sliding_window_perplexity(*model, tokens, options);
  EXPECT_EQ(result.windows, 3);
  EXPECT_EQ(result.total_windows, 1 + (100 - 32 + 7) / 8);
  EXPECT_EQ(result.tokens, 31 + 8 + 8);
  EXPECT_EQ(progress, (std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {2, 3}, {3, 3}}));
  // The same three windows from the front of an unbounded run score the same tokens.
  const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + 32 + 2 * 8);
  options.max_windows = 0;
  options.on_window = {};
  const qspec::PerplexityResult bounded = qspec::sliding_window_perplexity(*model, prefix, options);
  EXPECT_EQ(bounded.windows, 3);
  EXPECT_NEAR(bounded.nll_sum, result.nll_sum, 1e-9 * result.nll_sum);
}

TEST(PerplexitySlidingWindow, BadArgumentsThrow) {
  auto model = qspec::LlamaModel::load(kTinyModel);
  const std::vector<int32_t> one = {5}, many = random_tokens(*model, 50, 4);
  EXPECT_THROW(qspec::sliding_window_perplexity(*model, one), qspec::Error);
  EXPECT_THROW(qspec::sliding_window_perplexity(*model, std::vector<int32_t>{}), qspec::Error);
  qspec::PerplexityOptions options;
  options.context = 16;
  options.stride = 16;  // the first token of every later window would go unscored
  EXPECT_THROW(qspec::sliding_window_perplexity(*model, many, options), qspec::Error);
  options.context = 129;  // past max_position_embeddings
  options.stride = 0;
  EXPECT_THROW(qspec::sliding_window_perplexity(*model, many, options), qspec::Error);
  options.context = 1;
  EXPECT_THROW(qspec::sliding_window_perplexity(*model, many, options), qspec::Error);
}
