// The host sampler (ops/sample.h): penalties, temperature, top-k / top-p / min-p, seeded draws; token log-probabilities.
#include "ops/sample.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <cmath>
#include <numeric>
#include <random>

#include "qspec/error.h"

namespace qspec {

Sampler::Sampler(const SamplingParams& params, int64_t output_start)
    : params_(params), output_start_(std::max<int64_t>(output_start, 0)), generator_(params.seed) {
  check(params);
}

void Sampler::check(const SamplingParams& params) {
  QSPEC_CHECK(std::isfinite(params.temperature) && params.temperature >= 0, "temperature must be >= 0, got ",
              params.temperature);
  QSPEC_CHECK(params.top_k >= 0, "top_k must be >= 0, got ", params.top_k);
  QSPEC_CHECK(params.top_p > 0 && params.top_p <= 1, "top_p must be in (0, 1], got ", params.top_p);
  QSPEC_CHECK(params.min_p >= 0 && params.min_p <= 1, "min_p must be in [0, 1], got ", params.min_p);
  QSPEC_CHECK(params.repetition_penalty > 0, "repetition_penalty must be > 0, got ",
              params.repetition_penalty);
  QSPEC_CHECK(std::isfinite(params.presence_penalty) && std::abs(params.presence_penalty) <= kMaxPenalty,
              "presence_penalty must be in [-", kMaxPenalty, ", ", kMaxPenalty, "], got ", params.presence_penalty);
  QSPEC_CHECK(std::isfinite(params.frequency_penalty) && std::abs(params.frequency_penalty) <= kMaxPenalty,
              "frequency_penalty must be in [-", kMaxPenalty, ", ", kMaxPenalty, "], got ", params.frequency_penalty);
  for (const auto& [id, bias] : params.logit_bias)
    QSPEC_CHECK(id >= 0 && std::isfinite(bias) && std::abs(bias) <= kMaxLogitBias, "logit_bias: id ", id,
                " must be >= 0 with a bias in [-", kMaxLogitBias, ", ", kMaxLogitBias, "], got ", bias);
}

void cpu::scatter_subset_logits(const float* subset, int64_t rows, int64_t n, const int32_t* ids, int64_t vocab,
                                float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * vocab;
    std::fill(row, row + vocab, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n; ++j) row[ids[j]] = subset[r * n + j];
  }
}

uint64_t Sampler::random_seed() {
  static std::atomic<uint64_t> counter{0};  // distinct seeds even where random_device repeats
  std::random_device device;
  return ((static_cast<uint64_t>(device()) << 32) ^ device()) + counter.fetch_add(0x9e3779b97f4a7c15ull);
}

int32_t Sampler::argmax(std::span<const float> logits) {
  QSPEC_CHECK(!logits.empty(), "argmax of an empty logit row");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

namespace {
bool adjusts(const SamplingParams& p) { return p.repetition_penalty != 1.0f || p.has_additive_adjustments(); }

// The scores the filters see: the CTRL-style repetition penalty as in transformers / llama.cpp
// (divide positive logits, multiply negative ones, once per distinct token of the history),
// then OpenAI's presence / frequency penalties over the output's ids (history from
// output_start) and logit_bias (ids outside the row are ignored).
std::vector<float> penalised(std::span<const float> logits, std::span<const int32_t> history, const SamplingParams& p,
                             int64_t output_start) {
  std::vector<float> out(logits.begin(), logits.end());
  if (p.repetition_penalty != 1.0f) {
    std::vector<bool> seen(out.size(), false);
    for (int32_t id : history) {
      if (id < 0 || static_cast<size_t>(id) >= out.size() || seen[id]) continue;
      seen[id] = true;
      out[id] = out[id] > 0 ? out[id] / p.repetition_penalty : out[id] * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::vector<int32_t> count(out.size(), 0);
    for (size_t i = static_cast<size_t>(std::min<int64_t>(output_start, static_cast<int64_t>(history.size())));
         i < history.size(); ++i)
      if (history[i] >= 0 && static_cast<size_t>(history[i]) < out.size()) ++count[history[i]];
    for (size_t id = 0; id < out.size(); ++id)
      if (count[id] > 0) out[id] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count[id]);
  }
  for (const auto& [id, bias] : p.logit_bias)
    if (id >= 0 && static_cast<size_t>(id) < out.size()) out[id] += bias;
  return out;
}
}  // namespace

// The candidates in the order the filters walk them: score descending, lower id first on ties
// (what a stable sort by score gives), without sorting the whole vocabulary: top_k selects its
// k first; top_p and min_p only look at the head of the order, which is found by a weight
// threshold (every token below it ranks after every token at or above it) lowered until the
// head holds the mass the filters need. A 128k vocabulary then costs O(V) plus the sort of a
// few hundred candidates, not a stable sort of all of it (~30 ms a token).
std::vector<float> Sampler::probabilities(std::span<const float> logits, std::span<const int32_t> history) const {
  // No copy of the row without a penalty (a 128k row is half a megabyte of fresh pages a call).
  std::vector<float> penalised_scores;
  std::span<const float> scores = logits;
  if (adjusts(params_)) {
    penalised_scores = penalised(logits, history, params_, output_start_);
    scores = penalised_scores;
  }
  for (float score : scores) QSPEC_CHECK(!std::isnan(score), "sampler: NaN in logits");
  const size_t vocab = scores.size();
  std::vector<float> probs(vocab, 0.0f);
  if (params_.greedy()) {
    probs[argmax(scores)] = 1.0f;
    return probs;
  }
  auto ranks_before = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  const int32_t best = argmax(scores);
  const double top = scores[best] / params_.temperature;
  auto weight_of = [&](int32_t id) { return std::exp(scores[id] / params_.temperature - top); };

  std::vector<int32_t> order;    // the head of the candidate order (or all of the top_k)
  std::vector<double> weights;   // their softmax weights at the temperature, in that order
  double total = 0;              // the weight of every candidate (top_k's, or the vocabulary's)
  const bool use_top_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab;
  if (use_top_k) {
    order.resize(vocab);
    std::iota(order.begin(), order.end(), 0);
    const auto kth = order.begin() + params_.top_k;
    std::nth_element(order.begin(), kth - 1, order.end(), ranks_before);
    order.resize(static_cast<size_t>(params_.top_k));
    std::sort(order.begin(), order.end(), ranks_before);
    for (int32_t id : order) weights.push_back(weight_of(id));
    for (double w : weights) total += w;
  } else {
    // Each token's weight, kept (as float) in probs until the probabilities overwrite it.
    for (size_t id = 0; id < vocab; ++id) {
      const double w = weight_of(static_cast<int32_t>(id));
      total += w;
      probs[id] = static_cast<float>(w);
    }
    if (params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
      // Every token stays: no order needed.
      for (size_t id = 0; id < vocab; ++id) probs[id] = static_cast<float>(probs[id] / total);
      return probs;
    }
    const std::vector<float>& all = probs;
    // The head: tokens of weight >= threshold (the top token has weight 1). With min_p it is
    // every token min_p can keep (weight >= min_p, less a hair for the float weights here):
    // whatever top_p would cut further down is cut by min_p anyway, so a flat row's head stays
    // small. Without, enough of them to reach top_p of the mass (a hair more than top_p of it:
    // the head is summed from float weights, the walk below from double quotients).
    const double needed = params_.top_p < 1.0f ? params_.top_p * total * (1.0 + 1e-6) : 0.0;
    double threshold = params_.min_p > 0.0f ? static_cast<double>(params_.min_p) * (1.0 - 1e-6) : 1e-4;
    while (true) {
      order.clear();
      double head_mass = 0;
      for (size_t id = 0; id < vocab; ++id)
        if (all[id] >= threshold) {
          order.push_back(static_cast<int32_t>(id));
          head_mass += all[id];
        }
      if (params_.min_p > 0.0f || head_mass >= needed || threshold == 0.0 || order.size() == vocab) break;
      threshold = threshold < 1e-30 ? 0.0 : threshold * 1e-4;
    }
    std::sort(order.begin(), order.end(), ranks_before);
    for (int32_t id : order) weights.push_back(weight_of(id));  // exact (double) for the filters
    std::fill(probs.begin(), probs.end(), 0.0f);
  }
  size_t keep = order.size();
  if (params_.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (at least one token).
    double mass = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      mass += weights[i] / total;
      if (mass >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * weights[0];
    size_t cut = 1;
    while (cut < keep && weights[cut] >= floor) ++cut;
    keep = cut;
  }
  double kept_total = 0;
  for (size_t i = 0; i < keep; ++i) kept_total += weights[i];
  for (size_t i = 0; i < keep; ++i) probs[order[i]] = static_cast<float>(weights[i] / kept_total);
  return probs;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (params_.greedy()) return sample_with_draw(logits, history, 0.0);
  return sample_with_draw(logits, history, next_draw());
}

// 53 random bits -> uniform in [0, 1): the draw is the same on every platform.
double Sampler::next_draw() { return static_cast<double>(generator_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample_with_draw(std::span<const float> logits, std::span<const int32_t> history,
                                  double draw) const {
  if (params_.greedy()) {
    if (!adjusts(params_)) return argmax(logits);
    std::vector<float> scores = penalised(logits, history, params_, output_start_);
    return argmax(scores);
  }
  std::vector<float> probs = probabilities(logits, history);
  // The first id (ascending) whose cumulative probability passes the draw.
  double cumulative = 0;
  int32_t last_candidate = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    last_candidate = static_cast<int32_t>(i);
    cumulative += probs[i];
    if (draw < cumulative) return last_candidate;
  }
  return last_candidate;  // rounding left the draw just past the total
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int32_t top) {
  QSPEC_CHECK(!logits.empty() && id >= 0 && static_cast<size_t>(id) < logits.size(), "token_logprob: id ", id,
              " outside a row of ", logits.size());
  float peak = logits[0];
  for (float x : logits) peak = std::max(peak, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - peak);
  const double log_total = peak + std::log(sum);
  TokenLogprob out;
  out.id = id;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(id)] - log_total);
  if (top <= 0) return out;
  // The `top` best ids in one pass: a small list kept sorted (score descending, lower id first).
  const size_t keep = std::min(static_cast<size_t>(top), logits.size());
  std::vector<int32_t> best;
  best.reserve(keep + 1);
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  for (size_t i = 0; i < logits.size(); ++i) {
    const int32_t candidate = static_cast<int32_t>(i);
    if (best.size() == keep && !before(candidate, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), candidate, before), candidate);
    if (best.size() > keep) best.pop_back();
  }
  for (int32_t b : best) out.top.emplace_back(b, static_cast<float>(logits[static_cast<size_t>(b)] - log_total));
  return out;
}

}  // namespace qspec
