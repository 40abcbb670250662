// The `--draft auto` planner (runtime/qspec_planner.h): acceptance estimates, the n-gram probe,
// and the per-step choice of plain W4A16 or a draft and gamma.
#include "runtime/qspec_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "base/env.h"
#include "qspec/decode_plan.h"
#include "qspec/error.h"
#include "runtime/ngram_draft.h"

namespace qspec {

void DraftAcceptance::observe(int64_t kept, bool rejected) {
  const double decay = decay_;
  first_trials_ = first_trials_ * decay + (kept > 0 || rejected ? 1.0 : 0.0);
  first_kept_ = first_kept_ * decay + (kept > 0 ? 1.0 : 0.0);
  // The drafts after the first: each of kept - 1 was kept after a kept one, and a rejection after
  // a kept draft failed one.
  const double next_kept = static_cast<double>(std::max<int64_t>(kept - 1, 0));
  next_kept_ = next_kept_ * decay + next_kept;
  next_trials_ = next_trials_ * decay + next_kept + (kept > 0 && rejected ? 1.0 : 0.0);
  prior_share_ *= decay;
}

double DraftAcceptance::continuation(double prior, double weight) const {
  const double w = weight * prior_share_;
  const double total = next_trials_ + w;
  return total > 0 ? (next_kept_ + prior * w) / total : prior;
}

double DraftAcceptance::estimate(double prior, double weight) const {
  const double w = weight * prior_share_;
  const double total = first_trials_ + w;
  return total > 0 ? (first_kept_ + prior * w) / total : prior;
}

void NgramProbe::update(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max,
                        NgramAcceptance& acceptance, NgramIndex* index, NgramAcceptance* population,
                        const NgramCorpus* corpus) {
  if (!proposal_.empty()) {
    const size_t committed = tokens.size() >= start_ ? tokens.size() - start_ : 0;
    const size_t checkable = std::min(committed, proposal_.size());
    size_t kept = 0;
    while (kept < checkable && proposal_[kept] == tokens[start_ + kept]) ++kept;
    if (kept < checkable || kept == proposal_.size()) {
      const bool rejected = kept < checkable;
      acceptance.observe(match_, static_cast<int64_t>(kept), rejected, corpus_);
      if (population != nullptr) population->observe(match_, static_cast<int64_t>(kept), rejected, corpus_);
    } else {
      return;  // undecided: the tokens so far agree and more are to come
    }
    proposal_.clear();
  }
  NgramLookup lookup = ngram_lookup_own_then_corpus(tokens, max_tokens, ngram_min, ngram_max, index, corpus);
  proposal_ = std::move(lookup.tokens);
  match_ = lookup.match;
  corpus_ = lookup.corpus;
  start_ = tokens.size();
}

size_t MeasuredPassCosts::class_of(int64_t sequences) {
  size_t c = 0;
  while ((int64_t{1} << c) < sequences) ++c;
  return c;
}

void MeasuredPassCosts::observe(int64_t sequences, int64_t tokens, double seconds) {
  if (sequences < 1 || tokens < sequences || !(seconds > 0)) return;
  const size_t c = class_of(sequences);
  if (classes_.size() <= c) classes_.resize(c + 1);
  Class& k = classes_[c];
  constexpr double decay = planner_rules::kPassCostDecay;
  // A class's first passes of each kind are its warm-up, not timed (planner_rules::kWarmupPasses).
  int64_t& warmups = tokens == sequences ? k.plain_warmups : k.verify_warmups;
  if (warmups < planner_rules::kWarmupPasses) {
    ++warmups;
    if (tokens == sequences) ++k.plain_since_verify;
    return;
  }
  ++k.passes;
  if (tokens == sequences) {
    k.step_seconds = k.step_seconds * decay + seconds;
    k.step_weight = k.step_weight * decay + 1.0;
    ++k.plain_since_verify;
    return;
  }
  if (k.step_weight <= 0) return;  // nothing to charge the extra time against yet
  k.plain_since_verify = 0;
  const double x = static_cast<double>(tokens - sequences), y = seconds - k.step_seconds / k.step_weight;
  k.weight = k.weight * decay + 1.0;
  k.x = k.x * decay + x;
  k.y = k.y * decay + y;
  k.xx = k.xx * decay + x * x;
  k.xy = k.xy * decay + x * y;
  if (!price_by_token_bucket()) return;
  const size_t b = token_bucket(tokens);
  if (k.buckets.size() <= b) k.buckets.resize(b + 1);
  k.buckets[b].weight = k.buckets[b].weight * decay + 1.0;
  k.buckets[b].x = k.buckets[b].x * decay + x;
  k.buckets[b].y = k.buckets[b].y * decay + y;
  k.buckets[b].last = k.passes;
}

double MeasuredPassCosts::decayed_weight(double passes) {
  // Decayed weights: n passes give (1 - decay^n) / (1 - decay).
  return (1.0 - std::pow(planner_rules::kPassCostDecay, passes)) / (1.0 - planner_rules::kPassCostDecay) - 1e-9;
}

double MeasuredPassCosts::enough() { return decayed_weight(planner_rules::kMinMeasuredPasses); }

bool MeasuredPassCosts::price_by_token_bucket() {
  static const bool buckets = env_switch("QSPEC_PLANNER_TOKEN_BUCKETS").value_or(true);
  return buckets;
}

const MeasuredPassCosts::Class* MeasuredPassCosts::class_for(int64_t sequences) const {
  const size_t c = class_of(std::max<int64_t>(sequences, 1));
  return c < classes_.size() ? &classes_[c] : nullptr;
}

bool MeasuredPassCosts::has_plain_steps(int64_t sequences) const {
  const Class* k = class_for(sequences);
  return k != nullptr && k->step_weight >= enough();
}

bool MeasuredPassCosts::has_verify_price(int64_t sequences) const {
  return has_plain_steps(sequences) && class_for(sequences)->weight >= enough();
}

bool MeasuredPassCosts::verify_price_stale(int64_t sequences) const {
  return has_verify_price(sequences) &&
         class_for(sequences)->plain_since_verify >= planner_rules::kRemeasureAfterPlainSteps;
}

std::optional<MeasuredPassCosts::Verify> MeasuredPassCosts::verify_cost(int64_t sequences) const {
  if (!has_verify_price(sequences)) return std::nullopt;
  const Class& k = *class_for(sequences);
  // Least squares y = fixed + per_token x over the verify passes; neither part negative (a line
  // through the origin when the intercept would be, a flat one when the slope would be), and a
  // line through the origin when the passes all had about the same extra tokens (no intercept
  // to tell apart).
  const double spread = k.weight * k.xx - k.x * k.x;
  double fixed = 0, per_token = 0;
  if (spread > 1e-9 * k.weight * k.xx) {
    per_token = (k.weight * k.xy - k.x * k.y) / spread;
    fixed = (k.y - per_token * k.x) / k.weight;
  } else {
    per_token = k.xy / k.xx;  // one x seen: proportional
  }
  if (per_token < 0) per_token = 0, fixed = k.y / k.weight;
  if (fixed < 0) fixed = 0, per_token = std::max(k.xy / k.xx, 0.0);
  const double step = k.step_seconds / k.step_weight;
  Verify verify{fixed / step, per_token / step, {}};
  const double bucket_enough = decayed_weight(planner_rules::kMinBucketPasses);
  for (const Class::BucketSums& b : k.buckets)
    verify.bucket.push_back(b.weight >= bucket_enough && k.passes - b.last <= planner_rules::kRemeasureAfterPlainSteps
                                ? Verify::Bucket{std::max(b.y / b.weight, 0.0) / step, b.x / b.weight}
                                : Verify::Bucket{});
  return verify;
}

double MeasuredPassCosts::Verify::extra(int64_t tokens, double verified) const {
  const size_t at = token_bucket(std::max<int64_t>(tokens, 1));
  if (at < bucket.size() && bucket[at].extra >= 0) return bucket[at].extra;
  double below = 0, above = std::numeric_limits<double>::infinity();
  bool timed_below = false;
  for (size_t b = 0; b < bucket.size(); ++b) {
    if (bucket[b].extra < 0) continue;
    if (b < at) {
      below = std::max(below, bucket[b].extra);
      timed_below = true;
    } else if (bucket[b].extra < above) {
      above = bucket[b].extra;
      if (!timed_below && bucket[b].verified > 0) above *= std::min(verified / bucket[b].verified, 1.0);
    }
  }
  return std::min(std::max(fixed + per_token * verified, below), std::max(above, below));
}

QSpecPlanner::QSpecPlanner(std::optional<QSpecCostTable> table, std::optional<std::vector<std::string>> drafts,
                           std::string table_source, double min_gain)
    : table_(std::move(table)), table_source_(std::move(table_source)), min_gain_(min_gain) {
  const std::string ngram(decode_rules::kNgramDraft);
  if (!table_) {
    candidates_.push_back({ngram, 0.0});
    max_gamma_ = planner_rules::kFallbackMaxGamma;
    return;
  }
  table_->validate(table_source_.empty() ? "the step-cost table" : table_source_);
  const std::vector<std::string> known = table_->drafts();
  for (const std::string& draft : drafts.value_or(known)) {
    QSPEC_CHECK(std::find(known.begin(), known.end(), draft) != known.end(), "qspec planner: draft ", draft,
                " is not in the step-cost table ", table_source_);
    // N-gram drafts start from nothing: only what a sequence's probe measures makes them pay.
    const auto prior = table_->acceptance.find(draft);
    candidates_.push_back({draft, draft == ngram                  ? 0.0
                                  : prior != table_->acceptance.end() ? prior->second
                                                                      : planner_rules::kDefaultAcceptancePrior});
  }
  max_gamma_ = table_->gammas().back();
}

std::string QSpecPlanner::describe() const {
  std::string drafts;
  for (const Candidate& c : candidates_) drafts += (drafts.empty() ? "" : ", ") + c.draft;
  if (!table_)
    return detail::concat("no step-cost table for this device and model: n-gram drafts where a sequence's probed "
                          "acceptance pays, priced by this engine's own measured passes (each batch size's first ",
                          planner_rules::kMinMeasuredPasses, " steps plain, then a verify token a sequence = ",
                          planner_rules::kExploreVerifyTokenCost, " W4A16 step until its verify passes are timed), "
                          "else plain W4A16");
  return detail::concat("step costs ", table_source_.empty() ? std::string("(given)") : table_source_, " (",
                        table_->device, ", ", table_->points.size(), " points); drafts ",
                        drafts.empty() ? std::string("none") : drafts, "; gamma up to ", max_gamma_);
}

StepCosts QSpecPlanner::costs_at(std::span<const PlannerSequence> batch, double* mean_context) const {
  double context = 0;
  for (const PlannerSequence& s : batch) context += static_cast<double>(s.context);
  // Attention reads every sequence's K/V once a step, so the batch's total (B x the mean context)
  // is what prices it.
  context /= static_cast<double>(std::max<size_t>(batch.size(), 1));
  *mean_context = context;
  if (table_) return table_->at(static_cast<double>(batch.size()), context);
  StepCosts fallback;  // in units of one W4A16 step (gain_with prices measured verifies itself)
  fallback.w4a16_step_ms = 1.0;
  for (int64_t g = 1; g <= planner_rules::kFallbackMaxGamma; ++g) {
    fallback.gammas.push_back(g);
    fallback.verify_ms.push_back(1.0 + planner_rules::kExploreVerifyTokenCost * static_cast<double>(g));
  }
  fallback.draft_step_ms[std::string(decode_rules::kNgramDraft)] = 0.0;
  return fallback;
}

namespace {
// A sequence's rates for candidate c: (a, c) of the model, clamped to [0, 1].
std::pair<double, double> rates(const PlannerSequence& s, size_t c) {
  const double a = std::clamp(s.acceptance[c], 0.0, 1.0);
  return {a, s.continuation.empty() ? a : std::clamp(s.continuation[c], 0.0, 1.0)};
}
// The drafts a sequence can take at most: its proposals, its room and `gamma`.
int64_t draft_room(const PlannerSequence& s, size_t c, int64_t gamma) {
  return std::clamp<int64_t>(std::min(gamma, s.proposable[c]), 0, std::max<int64_t>(s.room, 0));
}
}  // namespace

double QSpecPlanner::gain_with(const StepCosts& costs, std::span<const PlannerSequence> batch, int candidate,
                               int64_t gamma, const std::optional<MeasuredPassCosts::Verify>& measured) const {
  const size_t c = static_cast<size_t>(candidate);
  double tokens = 0, verified = 0;
  int64_t draft_steps = 0;
  for (const PlannerSequence& s : batch) {
    QSPEC_CHECK(s.acceptance.size() == candidates_.size() && s.proposable.size() == candidates_.size() &&
                    (s.continuation.empty() || s.continuation.size() == candidates_.size()),
                "qspec planner: a sequence's acceptance and proposable hold ", s.acceptance.size(), " and ",
                s.proposable.size(), " entries for ", candidates_.size(), " candidates");
    const int64_t g = draft_room(s, c, gamma);
    const auto [a, next] = rates(s, c);
    tokens += expected_tokens(a, next, g);
    verified += static_cast<double>(g);
    // Draft passes run until the longest unit has its drafts (a model draft drafts its room).
    draft_steps = std::max(draft_steps, std::min(gamma, std::max<int64_t>(s.room, 0)));
  }
  return cycle_gain(costs, c, static_cast<double>(batch.size()), tokens, verified, draft_steps, measured);
}

double QSpecPlanner::allocate_drafts(const StepCosts& costs, std::span<const PlannerSequence> batch, int candidate,
                                     int64_t max_gamma, const std::optional<MeasuredPassCosts::Verify>& measured,
                                     std::vector<int64_t>& gammas) const {
  const size_t c = static_cast<size_t>(candidate);
  // Every draft the batch could take, by the chance it is kept with those before it.
  struct Draft {
    double kept;
    size_t sequence;
  };
  std::vector<Draft> drafts;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto [a, next] = rates(batch[i], c);
    double kept = a;
    for (int64_t k = 0; k < draft_room(batch[i], c, max_gamma); ++k, kept *= next) drafts.push_back({kept, i});
  }
  std::stable_sort(drafts.begin(), drafts.end(), [](const Draft& x, const Draft& y) { return x.kept > y.kept; });
  // The best prefix of this order. A sequence's drafts come in their own order (their chances only
  // fall), so a prefix's yield is the batch's one token each plus its drafts' chances.
  const double n = static_cast<double>(batch.size());
  std::vector<int64_t> taking(batch.size(), 0);
  gammas.assign(batch.size(), 0);
  double best = 0, tokens = n, verified = 0;
  int64_t longest = 0;
  for (const Draft& d : drafts) {
    tokens += d.kept;
    verified += 1.0;
    longest = std::max(longest, ++taking[d.sequence]);
    const double gain = cycle_gain(costs, c, n, tokens, verified, longest, measured);
    if (gain > best + 1e-12) best = gain, gammas = taking;
  }
  return best;
}

double QSpecPlanner::cycle_gain(const StepCosts& costs, size_t c, double n, double tokens, double verified,
                                int64_t draft_steps, const std::optional<MeasuredPassCosts::Verify>& measured) const {
  // Measured: what a pass of its tokens adds (MeasuredPassCosts::Verify::extra).
  const double verify = !measured      ? costs.verify(verified / n)
                        : verified > 0 ? 1.0 + measured->extra(std::llround(n + verified), verified)
                                       : 1.0;
  const double cycle = static_cast<double>(draft_steps) * costs.draft_step_ms.at(candidates_[c].draft) + verify;
  if (cycle <= 0) return 0.0;
  return (tokens / cycle) / (n / costs.w4a16_step_ms);
}

double QSpecPlanner::predicted_gain(std::span<const PlannerSequence> batch, int candidate, int64_t gamma) const {
  QSPEC_CHECK(candidate >= 0 && static_cast<size_t>(candidate) < candidates_.size(), "qspec planner: no candidate ",
              candidate);
  if (batch.empty()) return 0.0;
  double context = 0;
  const StepCosts costs = costs_at(batch, &context);
  return gain_with(costs, batch, candidate, gamma, measured_verify(batch.size()));
}

StepPlan QSpecPlanner::plan(std::span<const PlannerSequence> batch) const {
  StepPlan best;
  best.label = std::string(decode_rules::kVerifyMode);
  if (batch.empty()) {
    best.reason = "w4a16: no sequence decoding";
    return best;
  }
  double context = 0;
  const StepCosts costs = costs_at(batch, &context);
  const std::optional<MeasuredPassCosts::Verify> measured = measured_verify(batch.size());
  if (!table_ && !measured_.has_plain_steps(static_cast<int64_t>(batch.size()))) {
    char line[200];
    std::snprintf(line, sizeof line, "w4a16: timing plain steps at this batch size first (batch %zu, context %.0f, "
                  "no step-cost table)", batch.size(), context);
    best.reason = line;
    return best;
  }
  // The best (candidate, gamma) up to `max_gamma` at the measured prices, or at the exploring
  // ones (measured absent).
  auto best_of = [&](int64_t max_gamma, const std::optional<MeasuredPassCosts::Verify>& prices, int& candidate,
                     int64_t& gamma) {
    double best_gain = 0;
    candidate = -1;
    gamma = 0;
    for (size_t c = 0; c < candidates_.size(); ++c)
      for (int64_t g = 1; g <= max_gamma; ++g) {
        const double gain = gain_with(costs, batch, static_cast<int>(c), g, prices);
        if (gain > best_gain + 1e-12) {  // ties: the shorter gamma, the earlier candidate
          best_gain = gain;
          candidate = static_cast<int>(c);
          gamma = g;
        }
      }
    return best_gain;
  };
  int best_candidate = -1;
  int64_t best_gamma = 0;
  best.predicted_gain = best_of(max_gamma_, measured, best_candidate, best_gamma);
  // A draft without draft passes (prompt lookup) takes each sequence's own count when that pays
  // more than one gamma for all.
  std::vector<int64_t> gammas;
  if (best_candidate >= 0 && costs.draft_step_ms.at(candidates_[static_cast<size_t>(best_candidate)].draft) == 0.0) {
    std::vector<int64_t> own;
    const double gain = allocate_drafts(costs, batch, best_candidate, max_gamma_, measured, own);
    if (gain > best.predicted_gain + 1e-12) {
      best.predicted_gain = gain;
      gammas = std::move(own);
      best_gamma = *std::max_element(gammas.begin(), gammas.end());
    }
  }
  // Plain for long at the measured price: one small cycle at the exploring price re-measures it
  // (planned and reported as any plan, at the exploring price's prediction).
  std::string prices = table_     ? "measured costs"
                       : measured ? "this engine's measured passes"
                                  : "exploring: no step-cost table, verify passes not yet timed at this batch size";
  if (best.predicted_gain < min_gain_ && measured_.verify_price_stale(static_cast<int64_t>(batch.size()))) {
    int candidate = -1;
    int64_t gamma = 0;
    const double exploring = best_of(std::min(max_gamma_, planner_rules::kRemeasureMaxGamma), std::nullopt, candidate, gamma);
    if (exploring >= min_gain_) {
      char there[16];
      std::snprintf(there, sizeof there, "%.2fx", best.predicted_gain);
      prices = detail::concat("re-measuring verify passes: plain ", planner_rules::kRemeasureAfterPlainSteps,
                              " steps at the measured price, ", there, " there");
      best.predicted_gain = exploring;
      best_candidate = candidate;
      best_gamma = gamma;
      gammas.clear();
    }
  }
  double acceptance = 0, continuation = 0;  // the batch's means for the best candidate
  int64_t proposing = 0;  // sequences with drafts of the best candidate now (an n-gram lookup may have none)
  if (best_candidate >= 0)
    for (const PlannerSequence& s : batch) {
      const auto [first, next] = rates(s, static_cast<size_t>(best_candidate));
      acceptance += first;
      continuation += next;
      proposing += s.proposable[static_cast<size_t>(best_candidate)] > 0 ? 1 : 0;
    }
  acceptance /= static_cast<double>(batch.size());
  continuation /= static_cast<double>(batch.size());
  char where[200];
  std::snprintf(where, sizeof where, "batch %zu, context %.0f, %s", batch.size(), context, prices.c_str());
  char line[384];
  if (best_candidate < 0) {
    std::snprintf(line, sizeof line, "w4a16: no draft to price (%s)", where);
    best.reason = line;
    return best;
  }
  const std::string draft = candidates_[static_cast<size_t>(best_candidate)].draft;
  const std::string choice = draft + " g" + std::to_string(best_gamma);
  if (best.predicted_gain < min_gain_) {
    std::snprintf(line, sizeof line,
                  "w4a16: best draft %s predicted %.2fx (< %.2fx), acceptance %.2f then %.2f, drafts to propose in "
                  "%lld of %zu sequences (%s)",
                  choice.c_str(), best.predicted_gain, min_gain_, acceptance, continuation,
                  static_cast<long long>(proposing), batch.size(), where);
    best.reason = line;
    return best;
  }
  best.candidate = best_candidate;
  best.gamma = best_gamma;
  best.gammas = std::move(gammas);
  best.label = choice;
  std::string own;  // per-sequence draft counts
  if (!best.gammas.empty())
    own = detail::concat(", ", *std::min_element(best.gammas.begin(), best.gammas.end()), "-", best_gamma,
                         " drafts a sequence");
  // The verify pass's tokens (its price's bucket, MeasuredPassCosts::token_bucket).
  int64_t pass_tokens = static_cast<int64_t>(batch.size());
  for (size_t i = 0; i < batch.size(); ++i)
    pass_tokens += best.gammas.empty() ? draft_room(batch[i], static_cast<size_t>(best_candidate), best_gamma)
                                       : best.gammas[i];
  std::snprintf(line, sizeof line, "%s: predicted %.2fx over w4a16, acceptance %.2f then %.2f%s, a verify of %lld tokens (%s)",
                choice.c_str(), best.predicted_gain, acceptance, continuation, own.c_str(),
                static_cast<long long>(pass_tokens), where);
  best.reason = line;
  return best;
}

}  // namespace qspec
