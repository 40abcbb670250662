// Sliding-window perplexity of a token sequence (the fixed-length-model method of the
// Hugging Face "Perplexity of fixed-length models" guide).
//
// A model with a context of C tokens cannot condition on a whole corpus at once, so the
// sequence t_0 ... t_{n-1} is cut into windows of `context` tokens whose starts advance by
// `stride` (< context): window w covers [w*stride, min(w*stride + context, n)). Each window
// runs in a fresh KV cache and scores only the tokens that no earlier window scored: the
// first window scores t_1 ... t_{end-1} (t_0 has no prefix), every later window scores from
// the previous window's end to its own end, each such token conditioned on the (context -
// its distance to the window end) tokens before it inside the window. The windows stop at
// the first one that reaches the end of the sequence, so every token except t_0 is scored
// exactly once; a smaller stride gives each token more context at more compute.
//
//   NLL(t_i) = -log softmax(logits at position i-1)[t_i]   (log-softmax in double)
//   perplexity = exp(sum NLL / tokens scored)
//
// With context >= n there is one window and the result is the full-context perplexity of
// one forward pass. max_windows > 0 stops early (to bound CPU time): the result then covers
// the tokens scored by the windows that ran.
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "model/llama.h"

namespace qspec {

struct PerplexityOptions {
  int64_t context = 0;      // window length in tokens; 0: min(2048, max_position_embeddings)
  int64_t stride = 0;       // window step, 1 <= stride < context; 0: context / 2
  int64_t max_windows = 0;  // stop after this many windows; 0: all
  RunMode mode;             // weights and activation precision of every forward pass
  KvCacheFormat kv_cache = KvCacheFormat::f16;  // what each window's KV cache stores (--kv-cache)
  // Called after each window with (windows done, windows planned); may be empty.
  std::function<void(int64_t, int64_t)> on_window;
};

struct PerplexityResult {
  double perplexity = 0;  // exp(nll_sum / tokens)
  double nll_sum = 0;     // natural log
  int64_t tokens = 0;     // tokens scored
  int64_t windows = 0;    // windows run
  int64_t total_windows = 0;  // windows needed for the whole sequence
  int64_t context = 0, stride = 0;  // as resolved
  double seconds = 0;
};

// Number of windows the method needs for n tokens (1 when n <= context).
int64_t perplexity_window_count(int64_t n, int64_t context, int64_t stride);

// Throws qspec::Error on fewer than 2 tokens, a context past the model's, or a bad stride.
PerplexityResult sliding_window_perplexity(const LlamaModel& model, std::span<const int32_t> tokens,
                                           const PerplexityOptions& options = {});

// -log softmax(logits)[target], computed in double.
double token_nll(std::span<const float> logits, int32_t target);

}  // namespace qspec
