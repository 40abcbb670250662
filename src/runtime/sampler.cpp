#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "qspec/error.h"

namespace qspec {

Sampler::Sampler(const SamplingParams& params) : params_(params), generator_(params.seed) {
  QSPEC_CHECK(std::isfinite(params.temperature) && params.temperature >= 0, "temperature must be >= 0, got ",
              params.temperature);
  QSPEC_CHECK(params.top_k >= 0, "top_k must be >= 0, got ", params.top_k);
  QSPEC_CHECK(params.top_p > 0 && params.top_p <= 1, "top_p must be in (0, 1], got ", params.top_p);
  QSPEC_CHECK(params.min_p >= 0 && params.min_p <= 1, "min_p must be in [0, 1], got ", params.min_p);
  QSPEC_CHECK(params.repetition_penalty > 0, "repetition_penalty must be > 0, got ",
              params.repetition_penalty);
}

int32_t Sampler::argmax(std::span<const float> logits) {
  QSPEC_CHECK(!logits.empty(), "argmax of an empty logit row");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

namespace {
// CTRL-style penalty as in transformers / llama.cpp: divide positive logits, multiply
// negative ones, once per distinct token.
std::vector<float> penalised(std::span<const float> logits, std::span<const int32_t> history, float penalty) {
  std::vector<float> out(logits.begin(), logits.end());
  if (penalty == 1.0f) return out;
  std::vector<bool> seen(out.size(), false);
  for (int32_t id : history) {
    if (id < 0 || static_cast<size_t>(id) >= out.size() || seen[id]) continue;
    seen[id] = true;
    out[id] = out[id] > 0 ? out[id] / penalty : out[id] * penalty;
  }
  return out;
}
}  // namespace

std::vector<float> Sampler::probabilities(std::span<const float> logits, std::span<const int32_t> history) const {
  std::vector<float> scores = penalised(logits, history, params_.repetition_penalty);
  for (float score : scores) QSPEC_CHECK(!std::isnan(score), "sampler: NaN in logits");
  const size_t vocab = scores.size();
  std::vector<float> probs(vocab, 0.0f);
  if (params_.greedy()) {
    probs[argmax(scores)] = 1.0f;
    return probs;
  }
  // Candidates sorted by score, highest first (stable: lower id first on ties).
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  size_t keep = vocab;
  if (params_.top_k > 0) keep = std::min<size_t>(keep, static_cast<size_t>(params_.top_k));
  // Softmax over the kept candidates at the temperature (double for stable sums).
  const double top = scores[order[0]] / params_.temperature;
  std::vector<double> weights(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    weights[i] = std::exp(scores[order[i]] / params_.temperature - top);
    total += weights[i];
  }
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
  if (params_.greedy()) {
    if (params_.repetition_penalty == 1.0f) return argmax(logits);
    std::vector<float> scores = penalised(logits, history, params_.repetition_penalty);
    return argmax(scores);
  }
  std::vector<float> probs = probabilities(logits, history);
  // 53 random bits -> uniform in [0, 1): the draw is the same on every platform.
  const double draw = static_cast<double>(generator_() >> 11) * 0x1.0p-53;
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

}  // namespace qspec
