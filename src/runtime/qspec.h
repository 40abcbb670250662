// QSpec decoding of one sequence on the contiguous KvCache: a cheap low-precision
// activation mode (W4A8 / W4A4) drafts gamma tokens one at a time, then ONE forward pass in
// the verify mode (W4A16) over [last, d_0 .. d_{gamma-1}] scores them all, writing its own
// K/V over the draft entries, and the agreeing prefix plus the verify's next token are kept.
// Both modes run from the same loaded 4-bit weights; the mode is a forward() argument.
//
// Greedy QSpec emits exactly the tokens of greedy decoding in the verify mode (argmax ties
// go to the lowest id in both paths): with overwrite_kv every committed K/V row is the
// verify mode's, bit for bit, because a forward over k tokens computes each token's rows
// exactly as k single-token forwards do (per-token activation quantization, per-row dot
// products, per-query attention). With temperature > 0 the draft is accepted by rejection
// sampling (Leviathan et al. 2023, Chen et al. 2023), so each emitted token follows the
// verify mode's filtered distribution (the sampler's temperature / top-k / top-p / min-p /
// repetition penalty applied to both draft and verify logits).
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include <random>

#include "model/llama.h"
#include "qspec/metrics.h"
#include "runtime/generate.h"
#include "ops/sample.h"

namespace qspec {

struct QSpecOptions {
  RunMode draft;   // the low-precision drafting mode (w4a8, w4a8-fp8, w4a4-*)
  RunMode verify;  // the target mode (w4a16); the prompt is prefilled in it
  int64_t gamma = 4;  // draft tokens per cycle (>= 1); fewer near max_new_tokens / the context end
  // false: the paper's no-overwrite ablation. Accepted draft tokens keep the K/V their draft
  // pass wrote (the verify's K/V for them is discarded), so later tokens attend to
  // low-precision K/V and the output is NOT expected to equal verify-mode decoding.
  bool overwrite_kv = true;
};


// The per-sequence token choices of QSpec: the first token and the drafts (pick), and the
// acceptance of a cycle's drafts against the verify pass's logits (accept). The
// single-sequence loop below and the batching engine (runtime/engine.cpp) share it, so both
// make exactly the same choices from the same logits and seed.
class QSpecAcceptor {
 public:
  // output_start: where the output begins in the histories (Sampler's, for the penalties).
  explicit QSpecAcceptor(const SamplingParams& params, int64_t output_start = 0);
  // A token from a logit row with `history` (prompt + committed ids) as the repetition-penalty
  // context. When sampling, `probs` receives the distribution it was drawn from (q for a draft).
  int32_t pick(std::span<const float> row, std::span<const int32_t> history, std::vector<float>* probs);

  struct Outcome {
    int64_t accepted = 0;  // leading drafts kept
    int32_t next = -1;     // the verify's token after them (correction or bonus)
  };
  // verify_logits: [drafts.size() + 1, vocab], row i scoring the token after d_{i-1}. `history`
  // is used as scratch and restored. draft_probs[i]: the distribution d_i was drawn from (q), or
  // empty for a point mass on d_i (a deterministic draft such as prompt lookup: no vocab-sized row).
  Outcome accept(std::span<const int32_t> drafts, const std::vector<std::vector<float>>& draft_probs,
                 const float* verify_logits, int64_t vocab, std::vector<int32_t>& history);
  // Greedy acceptance from the verify's argmax ids (verify_ids[i]: the token after d_{i-1}, so
  // drafts.size() + 1 of them): the leading drafts equal to them, then the verify's token. What
  // accept() gives for greedy requests without a repetition penalty, from ids alone (the GPU's).
  static Outcome accept_greedy(std::span<const int32_t> drafts, std::span<const int32_t> verify_ids);

 private:
  bool greedy_;
  Sampler sampler_;
  std::mt19937_64 generator_;
};

struct QSpecResult : GenerationResult {
  QSpecMetrics metrics;
};

// Generates like generate() (options.mode is ignored: the prompt and every verify pass run
// in qspec.verify, the drafts in qspec.draft). Stops on an eos id (kept), after
// max_new_tokens (never more, even mid-cycle), at the context end, or when on_token returns
// false. `cache`, when given, must be empty with room for prompt + max_new_tokens rows; it is
// used instead of a private one and afterwards holds the K/V of every committed token except
// the last generated one (the tests compare it with plain verify-mode decoding).
QSpecResult qspec_generate(const LlamaModel& model, std::span<const int32_t> prompt, const GenerationOptions& options,
                           const QSpecOptions& qspec, const std::function<bool(int32_t)>& on_token = {},
                           KvCache* cache = nullptr);

// "w4a4-nvfp4 g4 | 312 cycles, accepted 812/1100 (73.8%), mean accepted 2.60 | histogram 0:40 1:...
// | draft 1.2 s, verify 0.8 s"
std::string describe_qspec_metrics(const QSpecMetrics& metrics, const QSpecOptions& qspec);
// The acceptance counters every JSON report of QSpec carries (the server's usage.qspec, the
// rows of eval qspec): cycles, drafted, accepted, acceptance_rate, accepted_histogram.
nlohmann::json qspec_counters_json(const QSpecMetrics& metrics);
// Draft auto's report (metrics.plan_steps and the rest): {"steps": {"w4a16": 120, "ngram g3": 14},
// "mean_predicted_gain": 1.31, "reason": "..."}; null when the planner never ran.
nlohmann::json qspec_planner_json(const QSpecMetrics& metrics);
// "w4a16 120 steps, ngram g3 14 steps; mean predicted gain of the cycles 1.31x; last plan: ..."
// ("" when the planner never ran).
std::string describe_planner_metrics(const QSpecMetrics& metrics);

}  // namespace qspec
