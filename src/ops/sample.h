// Turns a logit row into the next token: repetition penalty, presence / frequency penalties and
// logit_bias, then temperature, top-k, top-p and min-p filtering, then a draw from a seeded
// generator (argmax when greedy).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "qspec/sampling.h"

namespace qspec {

namespace cpu {
// A vocabulary subset's logits as whole rows (a QSpec draft's cheaper lm_head,
// RunMode::vocab_subset): out[r, ids[j]] = subset[r, j] for j < n, every other entry of out
// [rows, vocab] -inf, so argmax and sampling over out see the softmax over the subset and zero
// elsewhere. ids: distinct, in [0, vocab). CPU twin of cuda::scatter_subset_logits.
void scatter_subset_logits(const float* subset, int64_t rows, int64_t n, const int32_t* ids, int64_t vocab, float* out);
}  // namespace cpu

class Sampler {
 public:
  // Throws for parameters check() refuses. `output_start`: where the output begins in the
  // histories sample() gets (the presence / frequency penalties count only the output's ids).
  explicit Sampler(const SamplingParams& params, int64_t output_start = 0);
  // Throws qspec::Error naming the first parameter out of range (what any sampler of them needs).
  static void check(const SamplingParams& params);
  // `history` holds the prompt and generated ids (for the repetition penalty).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // sample() split in two, for a sampler that runs elsewhere (the GPU's cuda::sample_logits):
  // the next uniform draw in [0, 1) of this request's generator (what sample() consumes for a
  // non-greedy token; greedy tokens consume none), and the token that draw picks from a row.
  double next_draw();
  int32_t sample_with_draw(std::span<const float> logits, std::span<const int32_t> history, double draw) const;
  const SamplingParams& params() const { return params_; }
  // The filtered, renormalised distribution the next draw uses (sorted by id); exposed for
  // tests and for rejection sampling later.
  std::vector<float> probabilities(std::span<const float> logits, std::span<const int32_t> history) const;

  static int32_t argmax(std::span<const float> logits);  // lowest id wins ties
  // A fresh seed for a request that names none (each run or request then draws anew).
  static uint64_t random_seed();

 private:
  SamplingParams params_;
  int64_t output_start_ = 0;
  std::mt19937_64 generator_;
};

// The log-softmax of a logit row at `id`, with the `top` most likely ids (best first, lower id
// first on ties): a TokenLogprob (qspec/sampling.h). The row is taken as it is (temperature 1,
// no penalties).
TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int32_t top);

}  // namespace qspec
