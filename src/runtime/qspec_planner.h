// The `--draft auto` planner (issue 50): for every engine step, plain W4A16 or one draft and
// gamma for the batch's auto sequences, from the step costs measured on this device for this
// model (runtime/qspec_costs.h) and each sequence's running acceptance. Pure: no engine state,
// no clock; the engine (runtime/engine.cpp) feeds it and follows its plan.
//
// The model. A sequence whose first draft is kept with probability a and each later one with
// probability c given the one before was kept yields, per cycle of gamma drafts, the accepted
// prefix plus the verify's own token:
//   E = 1 + a (1 + c + ... + c^(g-1)) = 1 + a (1 - c^g) / (1 - c),   g = min(gamma, drafts it has, room)
// (c = a: the geometric run (1 - a^(g+1)) / (1 - a)). Prompt lookups are far from geometric: on
// Qwen2.5-7B's GSM8K replay at batch 4 (H200, fixed gamma 4) 41 % of the cycles kept their first
// draft but 72-79 % of the drafts after a kept one were kept, and 18 % of the cycles kept all 4,
// where one rate of 0.38 predicts 2 %; priced as geometric, long lookups looked worthless.
// A cycle of the batch costs gamma draft steps plus one verify of (g + 1) tokens a sequence; a
// plain step costs one W4A16 step for one token a sequence. The predicted gain of (draft, gamma)
// is (sum of E over the batch / cycle time) / (batch / W4A16 step time); the planner takes the
// best, and speculates only when it is at least kMinGain, so a plan is never predicted to lose
// (without a table: at the prices this engine has measured, or while it measures them at its
// exploring price; see planner_rules).
//
// One plan per step for the whole batch, not per sequence: a draft pass is one forward over
// every drafting sequence, so splitting the batch between drafts would run more passes, each
// at a smaller batch where the table says less about it; one plan keeps the engine's passes as
// they are (the drafting group, then one W4A16 pass over every sequence, plain decode tokens
// and verify runs alike) and the cost model exact for the step it prices. Sequences differ only
// in what the plan yields for them (their acceptance, the n-gram drafts they have), which the
// sum of E already weighs, and, for prompt lookup (no draft passes), in how many drafts each
// takes (StepPlan::gammas).
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/ngram_draft.h"
#include "runtime/qspec_costs.h"

namespace qspec {

namespace planner_rules {
// Speculate only when the predicted gain over plain W4A16 is at least this much: the cost
// model's errors (interpolation between grid points, step-time jitter, acceptance that moves)
// must not turn a predicted gain into a loss. The bar is >= 0.98x W4A16 everywhere.
inline constexpr double kMinGain = 1.05;
// A model draft's per-token acceptance before a sequence has shown its own: the table's prior
// (`acceptance`, from a real checkpoint's trace) or this. SmolLM2 keeps 74-95 % of w4a4 / w4a8
// drafts and 34-46 % of sparse-view ones (docs/perf-notes.md); 0.5 is below all but the last.
inline constexpr double kDefaultAcceptancePrior = 0.5;
// How much a prior counts, in decided drafts: a sequence's own evidence outweighs it within a
// few cycles.
inline constexpr double kPriorWeight = 4.0;
// Each new observation (a cycle's outcome, a resolved n-gram probe) keeps this share of the
// evidence before it: acceptance is an exponential moving average over ~10 observations, so it
// follows a sequence moving from prose to code and back.
inline constexpr double kAcceptanceDecay = 0.9;
// Without a cost table for this device and model: n-gram drafts only (they read no weights, so
// their cycle costs one verify pass), priced by the engine's own passes (MeasuredPassCosts) once
// it has timed enough of them for the batch's size class. It gets them by exploring: a class's
// first kMinMeasuredPasses steps run plain and are timed (the start of every sequence is plain
// anyway, before its probe has shown acceptance), then its verify tokens are priced at
// kExploreVerifyTokenCost of a W4A16 step each until kMinMeasuredPasses verify passes are timed.
// Measured, a verify token costs 0.05 of a step on the H200 at batch 1, 0.17 at batch 64 and 8 K
// context, and 0.2-0.7 on the CPU (SmolLM2, 2 threads; docs/perf-notes.md). The price is
// optimistic on purpose: a pessimistic one (0.75, before) let so few cycles run at batch 8-64 that
// a class never measured its verify passes and stayed plain where prompt lookup paid 1.2-1.4x
// (Qwen2.5-7B shapes, H200, 25901e0). What exploring can lose is bounded: a few passes a class.
inline constexpr double kExploreVerifyTokenCost = 0.1;
// The fallback's largest gamma.
inline constexpr int64_t kFallbackMaxGamma = 8;
// Passes a batch-size class must have timed, of each kind (plain steps, verify passes), before
// the fallback prices with them.
inline constexpr double kMinMeasuredPasses = 4.0;
// The share of the estimate each new pass keeps (an exponential moving average over ~20 passes:
// contexts grow and batches change slowly next to that).
inline constexpr double kPassCostDecay = 0.95;
// The first kWarmupPasses of each kind (plain steps, verify passes) a batch-size class runs are
// its warm-up and are not timed: a new batch size allocates and touches memory the first time
// (the CPU's first plain step at batch 2 took 14 ms against 4 in the replay test's trace, and
// with it in the fit the planner priced a 0.99-acceptance lookup at 1.00x); on the GPU such
// passes are one-offs (graph captures) anyway. What it costs: one more plain step and one more
// exploring cycle a class. (A pass that stalls later still enters the fit: the decay forgets it
// within ~20 passes.)
inline constexpr int64_t kWarmupPasses = 1;
// A class whose measured price has kept it plain this many steps since its last verify pass runs
// one cycle at the exploring price again (gamma at most kRemeasureMaxGamma), where that price
// would speculate: its line then follows costs that moved (longer contexts) and recovers from
// passes that misled it (a first launch's lazy module load, a host stall), instead of never
// verifying again. At most a small verify's loss every 64 steps.
inline constexpr int64_t kRemeasureAfterPlainSteps = 64;
inline constexpr int64_t kRemeasureMaxGamma = 2;
// N-gram lookups are weighed by the length of the suffix they matched, in these classes: 1, 2,
// and this many or more (runtime/ngram_draft.h: a longer match is kept more often).
inline constexpr int64_t kNgramMatchClasses = 3;
// A sequence's n-gram estimates start from what the engine's lookups have kept so far, across
// all its sequences (per match class; an average over ~100 probe outcomes), not from nothing. The
// prior of 0 kept a new sequence plain until its own probe had shown hits, and its estimate near
// 0 for a while after: in the GSM8K chat replay at batch 1, lookups the planner estimated below
// 0.1 kept their first draft 37 / 57 / 58 % of the time (match 1 / 2 / 3+), and auto gave 5 % to
// fixed gamma 4 (tests/unit/test_replay.cpp's staircase harness).
inline constexpr double kPopulationAcceptanceDecay = 0.99;
// A verify pass's price is a staircase in its tokens, not a line: a GEMM's time steps with its
// kernel's token tile (8, 16, 32, 64, ...) and is nearly flat within one. Measured on the H200
// (Qwen2.5-7B shapes, planner-trace-gsm8k-chat-qwen2.5-7b-h200-6f13822.jsonl), batch 4: a plain
// step 2.19 ms, verify passes of 8 tokens 2.64, of 9-16 tokens 3.08-3.37, of 17 3.31; batch 16: of
// 17-32 tokens 3.40-3.56, of 33-38 tokens 4.97-5.02. So MeasuredPassCosts also keeps, per class,
// what verify passes add in each bucket of a pass's tokens (1, 2, 3-4, 5-8, 9-16, ...), and
// prices a pass by its bucket's mean once the bucket has this many passes (its line between
// them otherwise). QSPEC_PLANNER_TOKEN_BUCKETS=0: the line only (A/B runs). A bucket whose last
// pass is more than kRemeasureAfterPlainSteps of the class's passes old counts as untimed again:
// a price the planner never pays is never re-timed, and one stalled pass (a host hiccup; 2 of
// a bucket's first passes) could otherwise keep its bucket priced out for good (a CPU replay
// under ASan stayed plain for 109 steps at a predicted 1.00x with every lookup coming true).
inline constexpr double kMinBucketPasses = 2.0;
}  // namespace planner_rules

// Tokens a cycle of g drafts yields (the model above): 1 + a (1 + c + ... + c^(g-1)).
inline double expected_tokens(double first, double next, int64_t g) {
  double run = 0, kept = first;
  for (int64_t i = 0; i < g; ++i, kept *= next) run += kept;
  return 1.0 + run;
}

// A sequence's running acceptance of one draft, the model's a and c: decayed counts of the
// cycles' first drafts (decided, kept) and of the drafts after a kept one (decided, kept). A cycle
// ends at its first rejection, so an observation of `kept` drafts decides its first draft (kept
// when kept > 0) unless it had none to decide, and then kept - 1 later drafts, plus one more
// (rejected) when a rejection followed a kept draft. Each estimate is kept / decided. The prior
// counts as `weight` decided drafts at its rate before the first observation and decays with the
// evidence (as if the counts had started there), so it steers a new sequence without biasing one
// that has shown its own acceptance.
class DraftAcceptance {
 public:
  // `decay`: the share of the evidence each observation keeps.
  explicit DraftAcceptance(double decay = planner_rules::kAcceptanceDecay) : decay_(decay) {}
  void observe(int64_t kept, bool rejected);
  // The chance a cycle's first draft is kept (the model's a).
  double estimate(double prior, double weight = planner_rules::kPriorWeight) const;
  // The chance a draft is kept given the one before it was (the model's c); `prior` (the caller
  // passes the first draft's estimate: a geometric run) until the later drafts show their own.
  double continuation(double prior, double weight = planner_rules::kPriorWeight) const;
  double evidence() const { return first_trials_ + next_trials_; }  // decayed drafts decided

 private:
  double first_kept_ = 0, first_trials_ = 0;  // decayed: cycles' first drafts decided, and kept
  double next_kept_ = 0, next_trials_ = 0;    // decayed: drafts after a kept one decided, and kept
  double prior_share_ = 1.0;  // what is left of the prior's weight: decay^observations
  double decay_;
};

// The n-gram draft's acceptance for a sequence: pooled, and per class of match length
// (planner_rules::kNgramMatchClasses; each class's estimate starts from the pooled one and moves
// to its own with its evidence), lookups in the sequence's own tokens and in other requests'
// text (NgramCorpus: `corpus`) in classes of their own.
struct NgramAcceptance {
  explicit NgramAcceptance(double decay = planner_rules::kAcceptanceDecay) : pooled(decay) {
    for (DraftAcceptance& a : by_match) a = DraftAcceptance(decay);
  }
  DraftAcceptance pooled;
  DraftAcceptance by_match[2 * planner_rules::kNgramMatchClasses];
  static int64_t match_class(int64_t match, bool corpus = false) {
    return std::clamp<int64_t>(match, 1, planner_rules::kNgramMatchClasses) - 1 +
           (corpus ? planner_rules::kNgramMatchClasses : 0);
  }
  void observe(int64_t match, int64_t kept, bool rejected, bool corpus = false) {
    pooled.observe(kept, rejected);
    by_match[match_class(match, corpus)].observe(kept, rejected);
  }
  // The per-token estimate for a lookup that matched `match` tokens.
  double estimate(int64_t match, double prior, bool corpus = false) const {
    return by_match[match_class(match, corpus)].estimate(pooled.estimate(prior));
  }
  // Its continuation (DraftAcceptance::continuation), pooled before its class has its own;
  // `next_prior` before either has any (else the first draft's estimate: a geometric run).
  double continuation(int64_t match, double prior, double next_prior = -1, bool corpus = false) const {
    const double first = estimate(match, prior, corpus);
    return by_match[match_class(match, corpus)].continuation(pooled.continuation(next_prior >= 0 ? next_prior : first));
  }
};

// The n-gram draft's acceptance for a sequence, measured for free while it does not run: what
// prompt lookup would have proposed at some point, checked against the tokens the sequence then
// committed (by plain steps or cycles of any draft alike; when n-gram cycles run, what they
// commit is the verify's, so the probe measures exactly what they would keep).
class NgramProbe {
 public:
  // Resolves the outstanding proposal once `tokens` decide it (a mismatch, or all of it
  // matched), feeding `acceptance` (in the class of the proposal's match); then, when none is
  // outstanding, proposes up to `max_tokens` from `tokens`.
  // `index`: the sequence's NgramIndex for the lookup (null: ngram_lookup's scan, the same answer).
  // `population`: the engine's estimates across its sequences, fed the same outcomes.
  // `corpus`: other requests' text, looked up where the sequence's own tokens have no match
  // (ngram_lookup_own_then_corpus, as the engine drafts).
  void update(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max,
              NgramAcceptance& acceptance, NgramIndex* index = nullptr, NgramAcceptance* population = nullptr,
              const NgramCorpus* corpus = nullptr);

 private:
  std::vector<int32_t> proposal_;
  int64_t match_ = 0;    // the proposal's matched suffix length
  bool corpus_ = false;  // the proposal came from the corpus
  size_t start_ = 0;     // tokens.size() when proposed
};

// The engine's own W4A16 passes, timed, for a planner without a step-cost table: per batch-size
// class (1, 2, 3-4, 5-8, ...), a plain decode step's time, and a line through what verify passes
// add to it over the verify tokens they add (exponential moving averages of the sums,
// planner_rules::kPassCostDecay). The line has an intercept because a pass with any verify run
// costs more than its tokens: on the GPU it leaves the decode step's graph and kernels for the
// general ones (a few verify tokens in a batch of 8 cost ~0.3 of a step, each further one little).
class MeasuredPassCosts {
 public:
  // A W4A16 pass over `sequences` runs of `tokens` tokens in all (no prompt chunk), `seconds` from
  // its inputs to its ids; the first of each kind a class sees is its warm-up and is not timed.
  void observe(int64_t sequences, int64_t tokens, double seconds);
  // What a verify pass adds to a plain step, in plain steps: fixed + per_token x its extra tokens
  // (the line through all the class's verify passes), or where the bucket of the pass's tokens
  // has been timed enough (kMinBucketPasses), that bucket's mean: within a bucket the price is
  // flat, as the GEMMs' token tiles make it (a slope within buckets, fitted over their passes,
  // drafted less and measured 1-3 % slower at batch 4 in the staircase replay test).
  struct Verify {
    double fixed = 0, per_token = 0;
    struct Bucket {
      double extra = -1;    // the mean extra of its passes; < 0: not timed enough
      double verified = 0;  // the mean verify tokens of its passes
    };
    std::vector<Bucket> bucket;  // per token bucket (token_bucket)
    // The extra of a pass of `tokens` in all, `verified` of them verify tokens: its bucket's mean,
    // else the line, kept between the means of the nearest timed buckets below and above (a pass
    // with more tokens never costs less). Below every timed bucket, at most the lowest timed
    // one's mean scaled by verify tokens: optimistic, so that a smaller pass gets timed once (a
    // line through passes of 33-64 tokens alone prices 20 tokens as high and kept a replay at
    // 40-token passes where 32-token ones cost 0.4 of them).
    double extra(int64_t tokens, double verified) const;
  };
  // The bucket of a pass of `tokens` tokens: 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, ...
  static size_t token_bucket(int64_t tokens) { return class_of(tokens); }
  // For a batch of `sequences`, once its class has enough of both kinds of pass
  // (planner_rules::kMinMeasuredPasses); else nothing.
  std::optional<Verify> verify_cost(int64_t sequences) const;
  // Whether the class of `sequences` has timed enough plain steps (verify passes are priced
  // against them, so none is recorded before).
  bool has_plain_steps(int64_t sequences) const;
  // Whether the class of `sequences` has a measured verify price that has seen no verify pass
  // for planner_rules::kRemeasureAfterPlainSteps plain steps.
  bool verify_price_stale(int64_t sequences) const;

 private:
  struct Class {
    double step_seconds = 0, step_weight = 0;  // decayed sum and weight of plain steps' times
    // Verify passes: decayed weight and sums of x (extra tokens), y (extra seconds), x^2 and x y.
    double weight = 0, x = 0, y = 0, xx = 0, xy = 0;
    // Per token bucket: the decayed weight and sums of x and y of its own passes.
    struct BucketSums {
      double weight = 0, x = 0, y = 0;
      int64_t last = 0;  // the class's `passes` at its last pass
    };
    std::vector<BucketSums> buckets;
    int64_t passes = 0;  // timed passes of either kind
    int64_t plain_since_verify = 0;  // plain steps since the last verify pass
    int64_t plain_warmups = 0, verify_warmups = 0;  // warm-up passes of each kind seen (kWarmupPasses)
  };
  static size_t class_of(int64_t sequences);
  static double enough();  // the decayed weight of kMinMeasuredPasses passes
  static double decayed_weight(double passes);
  static bool price_by_token_bucket();  // QSPEC_PLANNER_TOKEN_BUCKETS (unset: yes)
  const Class* class_for(int64_t sequences) const;
  bool has_verify_price(int64_t sequences) const;  // enough of both kinds of pass for verify_cost
  std::vector<Class> classes_;
};

// One auto sequence in a step, as the planner sees it.
struct PlannerSequence {
  int64_t context = 0;  // positions in its cache
  // Drafts it may take this cycle: its max_gamma, and its token budget less the verify's token.
  int64_t room = 0;
  std::vector<double> acceptance;   // per candidate (QSpecPlanner::candidates()): its first draft's (the model's a)
  // Per candidate: the chance a draft is kept given the one before was (the model's c); empty:
  // the acceptance (a geometric run).
  std::vector<double> continuation;
  std::vector<int64_t> proposable;  // per candidate: drafts it has now (n-gram: the lookup's length; a model draft: room)
};

struct StepPlan {
  int candidate = -1;  // index into QSpecPlanner::candidates(); -1: plain W4A16
  int64_t gamma = 0;
  // Per sequence of the batch planned (its order), the drafts it takes this cycle, for a draft
  // that costs no draft passes (prompt lookup): a sequence whose lookups come true drafts long,
  // one whose lookups fail drafts little or nothing, in the same verify pass. Empty: `gamma` for
  // every sequence (a model draft: its draft passes run for the longest anyway).
  std::vector<int64_t> gammas;
  // Predicted tokens/s over plain W4A16's: the plan's, or when plain, the best draft's (below
  // kMinGain; 0 when there was none to price).
  double predicted_gain = 0;
  std::string label;   // "w4a16", or "DRAFT g GAMMA" ("ngram g3")
  std::string reason;  // why, in a line: the prediction, the batch, the costs it came from
  bool speculates() const { return candidate >= 0; }
};

class QSpecPlanner {
 public:
  struct Candidate {
    std::string draft;  // a draft spec (set_draft_spec's spelling)
    double prior = 0;   // per-token acceptance before a sequence's own evidence
  };

  // `table`: the costs measured for this device and model, or nothing (the fallback: n-gram
  // drafts at planner_rules' costs). `drafts`: the table's drafts this engine can run, in this
  // order (none: plain W4A16 only; not given: all the table's); ignored without a table.
  explicit QSpecPlanner(std::optional<QSpecCostTable> table,
                        std::optional<std::vector<std::string>> drafts = std::nullopt, std::string table_source = "",
                        double min_gain = planner_rules::kMinGain);

  const std::vector<Candidate>& candidates() const { return candidates_; }
  bool has_table() const { return table_.has_value(); }
  // The costs and drafts it plans with, in a line (the CLI prints it; usage reports it).
  std::string describe() const;

  StepPlan plan(std::span<const PlannerSequence> batch) const;
  // The engine's timing of a W4A16 pass without prompt chunks (MeasuredPassCosts::observe): what
  // the fallback prices with once it has enough; a table's costs are kept as measured.
  void observe_pass(int64_t sequences, int64_t tokens, double seconds) {
    if (!table_) measured_.observe(sequences, tokens, seconds);
  }
  // The model's prediction for one (candidate, gamma) over `batch` (the tests check it; plan()
  // maximises it).
  double predicted_gain(std::span<const PlannerSequence> batch, int candidate, int64_t gamma) const;

 private:
  StepCosts costs_at(std::span<const PlannerSequence> batch, double* mean_context) const;
  // `measured`: the fallback's verify from this engine's passes (then `costs` are in plain steps).
  double gain_with(const StepCosts& costs, std::span<const PlannerSequence> batch, int candidate, int64_t gamma,
                   const std::optional<MeasuredPassCosts::Verify>& measured = std::nullopt) const;
  // The predicted gain of a cycle of `candidate` over a batch of n sequences that yields `tokens`
  // for `verified` verify tokens and `draft_steps` draft passes.
  double cycle_gain(const StepCosts& costs, size_t candidate, double n, double tokens, double verified,
                    int64_t draft_steps, const std::optional<MeasuredPassCosts::Verify>& measured) const;
  // For a candidate without draft passes: the draft counts, at most max_gamma each, that maximise
  // the predicted gain (each further draft of a sequence adds the chance that it and the ones
  // before it are kept, a c^k, which only falls, so the best plan takes the drafts of highest
  // such chance across the batch, as many as the verify's price pays for); returns the gain.
  double allocate_drafts(const StepCosts& costs, std::span<const PlannerSequence> batch, int candidate,
                         int64_t max_gamma, const std::optional<MeasuredPassCosts::Verify>& measured,
                         std::vector<int64_t>& gammas) const;
  std::optional<MeasuredPassCosts::Verify> measured_verify(size_t batch) const {
    return table_ ? std::nullopt : measured_.verify_cost(static_cast<int64_t>(batch));
  }

  std::optional<QSpecCostTable> table_;
  MeasuredPassCosts measured_;  // without a table: this engine's own passes
  std::string table_source_;
  std::vector<Candidate> candidates_;
  int64_t max_gamma_ = 0;  // the largest gamma it prices: the table's largest measured one
  double min_gain_;
};

}  // namespace qspec
