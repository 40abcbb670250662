#include "runtime/qspec.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>

#include "qspec/error.h"
#include "ops/sample.h"

namespace qspec {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// 53 random bits -> uniform in [0, 1), as the sampler draws.
double uniform(std::mt19937_64& generator) { return static_cast<double>(generator() >> 11) * 0x1.0p-53; }

// A draw from a distribution over ids (zeros skipped); the last candidate absorbs rounding.
int32_t draw_from(std::span<const float> probs, double draw) {
  double total = 0;
  for (float p : probs) total += p;
  draw *= total;
  double cumulative = 0;
  int32_t last_candidate = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    last_candidate = static_cast<int32_t>(i);
    cumulative += probs[i];
    if (draw < cumulative) return last_candidate;
  }
  return last_candidate;
}

// K/V rows [first, first + count) of every layer, saved for the no-overwrite ablation (in the
// cache's own format: model/kv_storage.h's row bytes).
struct SavedRows {
  int64_t first = 0, count = 0, heads = 0, head_dim = 0;
  size_t row_bytes = 0;
  std::vector<std::vector<uint8_t>> layers;

  void save(KvCache& cache, const ModelConfig& config, int64_t first_row, int64_t rows) {
    first = first_row, count = rows, heads = config.num_kv_heads, head_dim = config.head_dim;
    row_bytes = KvStorage::position_bytes(heads, head_dim, cache.format());
    const KvBlocks kv = cache.blocks();
    layers.assign(static_cast<size_t>(config.num_layers), {});
    for (int64_t l = 0; l < config.num_layers; ++l)
      for (int64_t r = 0; r < count; ++r) save_kv_row(kv, l, kv.row(first + r), heads, head_dim, layers[l]);
  }
  // Writes back the first `rows` saved rows.
  void restore(KvCache& cache, int64_t rows) const {
    rows = std::min(rows, count);
    const KvBlocks kv = cache.blocks();
    for (size_t l = 0; l < layers.size(); ++l)
      for (int64_t r = 0; r < rows; ++r)
        restore_kv_row(kv, static_cast<int64_t>(l), kv.row(first + r), heads, head_dim,
                       layers[l].data() + static_cast<size_t>(r) * row_bytes);
  }
};

}  // namespace

QSpecAcceptor::QSpecAcceptor(const SamplingParams& params, int64_t output_start)
    : greedy_(params.greedy()), sampler_(params, output_start), generator_(params.seed) {}

int32_t QSpecAcceptor::pick(std::span<const float> row, std::span<const int32_t> history, std::vector<float>* probs) {
  if (greedy_) return sampler_.sample(row, history);
  *probs = sampler_.probabilities(row, history);
  return draw_from(*probs, uniform(generator_));
}

QSpecAcceptor::Outcome QSpecAcceptor::accept_greedy(std::span<const int32_t> drafts,
                                                    std::span<const int32_t> verify_ids) {
  QSPEC_CHECK(verify_ids.size() == drafts.size() + 1, "QSpec: ", verify_ids.size(), " verify ids for ", drafts.size(),
              " drafts (expected one more)");
  Outcome outcome;
  while (outcome.accepted < static_cast<int64_t>(drafts.size()) &&
         drafts[static_cast<size_t>(outcome.accepted)] == verify_ids[static_cast<size_t>(outcome.accepted)])
    ++outcome.accepted;
  outcome.next = verify_ids[static_cast<size_t>(outcome.accepted)];
  return outcome;
}

QSpecAcceptor::Outcome QSpecAcceptor::accept(std::span<const int32_t> drafts,
                                             const std::vector<std::vector<float>>& draft_probs,
                                             const float* verify_logits, int64_t vocab,
                                             std::vector<int32_t>& history) {
  const int64_t drafted = static_cast<int64_t>(drafts.size());
  const size_t history_size = history.size();
  auto row = [&](int64_t i) {
    return std::span<const float>(verify_logits + i * vocab, static_cast<size_t>(vocab));
  };
  Outcome outcome;
  std::vector<float> p;
  for (; outcome.accepted < drafted; ++outcome.accepted) {
    const int32_t d = drafts[static_cast<size_t>(outcome.accepted)];
    if (greedy_) {
      const int32_t target = sampler_.sample(row(outcome.accepted), history);
      if (target != d) {
        outcome.next = target;
        break;
      }
    } else {
      p = sampler_.probabilities(row(outcome.accepted), history);
      const std::vector<float>& q = draft_probs[static_cast<size_t>(outcome.accepted)];
      const bool point_mass = q.empty();  // q = 1 at d, 0 elsewhere
      auto q_at = [&](size_t v) { return point_mass ? (v == static_cast<size_t>(d) ? 1.0f : 0.0f) : q[v]; };
      const double u = uniform(generator_);
      // Accept with probability min(1, p(d) / q(d)) (q(d) > 0: d was drawn from q); on
      // rejection draw from the residual max(0, p - q), renormalised.
      if (!(u * q_at(static_cast<size_t>(d)) < p[d])) {
        std::vector<float> residual(p.size());
        double mass = 0;
        for (size_t v = 0; v < p.size(); ++v) {
          residual[v] = std::max(0.0f, p[v] - q_at(v));
          mass += residual[v];
        }
        outcome.next = draw_from(mass > 0 ? std::span<const float>(residual) : std::span<const float>(p),
                                 uniform(generator_));
        break;
      }
    }
    history.push_back(d);
  }
  if (outcome.next < 0) {  // every draft accepted: the bonus token from the last row
    if (greedy_) {
      outcome.next = sampler_.sample(row(drafted), history);
    } else {
      p = sampler_.probabilities(row(drafted), history);
      outcome.next = draw_from(p, uniform(generator_));
    }
  }
  history.resize(history_size);
  return outcome;
}

QSpecResult qspec_generate(const LlamaModel& model, std::span<const int32_t> prompt, const GenerationOptions& options,
                           const QSpecOptions& qspec, const std::function<bool(int32_t)>& on_token,
                           KvCache* external_cache) {
  const ModelConfig& config = model.config();
  const int64_t context = config.max_position_embeddings;
  QSPEC_CHECK(!prompt.empty(), "qspec: the prompt is empty (and the tokenizer adds no bos)");
  QSPEC_CHECK(static_cast<int64_t>(prompt.size()) < context, "qspec: the prompt has ", prompt.size(),
              " tokens; the model's context is ", context, " tokens");
  QSPEC_CHECK(options.max_new_tokens >= 0, "qspec: max_new_tokens must be >= 0");
  QSPEC_CHECK(qspec.gamma >= 1, "qspec: gamma must be >= 1, got ", qspec.gamma);
  QSPEC_CHECK(qspec.overwrite_kv || qspec.draft.skip_layers == 0, "qspec: a draft that skips layers writes no K/V "
              "rows in them, so the no-overwrite ablation has none to keep");

  QSpecResult result;
  QSpecMetrics& metrics = result.metrics;
  metrics.gamma = qspec.gamma;
  metrics.accepted_histogram.assign(static_cast<size_t>(qspec.gamma + 1), 0);
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t budget = std::min<int64_t>(options.max_new_tokens, context - result.prompt_tokens);
  result.finish_reason = budget < options.max_new_tokens ? "context" : "length";
  if (budget == 0) return result;

  std::optional<KvCache> own_cache;
  if (!external_cache)
    own_cache.emplace(model.new_cache(std::min<int64_t>(context, result.prompt_tokens + budget), options.kv_cache));
  KvCache& cache = external_cache ? *external_cache : *own_cache;
  QSPEC_CHECK(cache.length() == 0, "qspec: the given KV cache is not empty");
  QSPEC_CHECK(cache.capacity() >= result.prompt_tokens + budget, "qspec: the KV cache holds ", cache.capacity(),
              " rows; ", result.prompt_tokens + budget, " are needed");

  QSpecAcceptor acceptor(options.sampling);
  const int64_t vocab = config.vocab_size;
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits, verify_logits;
  SavedRows saved;

  // Emits one token; false when generation ends here.
  bool done = false;
  auto emit = [&](int32_t id) {
    history.push_back(id);
    result.ids.push_back(id);
    const bool keep_going = !on_token || on_token(id);
    if (std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end()) {
      result.finish_reason = "eos";
      done = true;
    } else if (!keep_going) {
      result.finish_reason = "stopped";
      done = true;
    } else if (static_cast<int64_t>(result.ids.size()) >= budget) {
      done = true;  // finish_reason stays "length" / "context"
    }
    return !done;
  };
  auto is_eos = [&](int32_t id) {
    return std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end();
  };
  auto pick = [&](std::span<const float> row, std::vector<float>* probs) { return acceptor.pick(row, history, probs); };

  // Prefill in the verify mode; its last logits give the first token.
  auto start = Clock::now();
  model.forward(prompt, cache, logits, /*all_logits=*/false, qspec.verify);
  std::vector<float> scratch_probs;
  const int32_t first = pick(logits, &scratch_probs);
  auto decode_start = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(decode_start - start).count();
  emit(first);

  std::vector<int32_t> drafts, verify_tokens;
  std::vector<std::vector<float>> draft_probs;  // q_i (sampling only)
  while (!done) {
    // The cache holds every committed token but the last one.
    const int64_t base = cache.length();
    const int64_t remaining = budget - static_cast<int64_t>(result.ids.size());
    const int64_t gamma = std::min<int64_t>(qspec.gamma, remaining - 1);
    const int32_t last = history.back();

    // Draft: up to gamma tokens, one forward each, in the draft mode. An eos draft ends the
    // draft (nothing after it could be emitted).
    drafts.clear();
    draft_probs.resize(static_cast<size_t>(std::max<int64_t>(gamma, 0)));
    auto draft_start = Clock::now();
    const size_t history_size = history.size();
    for (int64_t i = 0; i < gamma; ++i) {
      const int32_t input = i == 0 ? last : drafts.back();
      model.forward(std::span<const int32_t>(&input, 1), cache, logits, false, qspec.draft);
      ++metrics.draft_steps;
      const int32_t d = pick(logits, &draft_probs[static_cast<size_t>(i)]);
      drafts.push_back(d);
      history.push_back(d);  // repetition-penalty context of the next draft
      if (is_eos(d)) break;
    }
    history.resize(history_size);
    const int64_t drafted = static_cast<int64_t>(drafts.size());
    metrics.draft_seconds += seconds_since(draft_start);
    // The draft wrote rows base .. base + drafted - 1 (for last, d_0 .. d_{drafted-2}).
    if (!qspec.overwrite_kv && cache.length() > base)
      saved.save(cache, config, base, cache.length() - base);
    cache.set_length(base);

    // Verify: one pass over [last, d_0 .. d_{drafted-1}], logits for every position.
    auto verify_start = Clock::now();
    verify_tokens.assign(1, last);
    verify_tokens.insert(verify_tokens.end(), drafts.begin(), drafts.end());
    model.forward(verify_tokens, cache, verify_logits, /*all_logits=*/true, qspec.verify);
    ++metrics.cycles;
    metrics.drafted += drafted;

    // Accept the agreeing prefix, then the verify's own token after it.
    const QSpecAcceptor::Outcome outcome = acceptor.accept(drafts, draft_probs, verify_logits.data(), vocab, history);
    const int64_t accepted = outcome.accepted;
    const int32_t next = outcome.next;
    metrics.verify_seconds += seconds_since(verify_start);
    metrics.accepted += accepted;
    metrics.rejected += drafted - accepted;
    ++metrics.accepted_histogram[static_cast<size_t>(accepted)];

    // No-overwrite ablation: the accepted tokens (last, d_0 .. d_{accepted-1}) keep the rows
    // their draft pass wrote (d_{drafted-1} was never run by the draft).
    if (!qspec.overwrite_kv && saved.count > 0) saved.restore(cache, accepted + 1);
    saved.count = 0;

    // Commit: emitting stops at eos / max tokens / on_token; the cache keeps all but the
    // last committed token.
    int64_t emitted = 0;
    for (int64_t i = 0; i < accepted && !done; ++i, ++emitted) emit(drafts[static_cast<size_t>(i)]);
    if (!done) {
      emit(next);
      ++emitted;
    }
    cache.set_length(base + emitted);
  }
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

nlohmann::json qspec_counters_json(const QSpecMetrics& metrics) {
  return {{"cycles", metrics.cycles},
          {"drafted", metrics.drafted},
          {"accepted", metrics.accepted},
          {"acceptance_rate", metrics.acceptance_rate()},
          {"accepted_histogram", metrics.accepted_histogram}};
}

nlohmann::json qspec_planner_json(const QSpecMetrics& metrics) {
  if (metrics.plan_steps.empty()) return nullptr;
  return {{"steps", metrics.plan_steps},
          {"mean_predicted_gain", metrics.predicted_steps > 0 ? nlohmann::json(metrics.mean_predicted_gain()) : nlohmann::json()},
          {"reason", metrics.plan_reason}};
}

std::string describe_planner_metrics(const QSpecMetrics& metrics) {
  if (metrics.plan_steps.empty()) return "";
  std::string text;
  for (const auto& [plan, steps] : metrics.plan_steps)
    text += (text.empty() ? "" : ", ") + plan + " " + std::to_string(steps) + (steps == 1 ? " step" : " steps");
  if (metrics.predicted_steps > 0) {
    char gain[96];
    std::snprintf(gain, sizeof gain, "; mean predicted gain of the cycles %.2fx", metrics.mean_predicted_gain());
    text += gain;
  }
  return text + "; last plan: " + metrics.plan_reason;
}

std::string describe_qspec_metrics(const QSpecMetrics& m, const QSpecOptions& qspec) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer,
                "draft %s gamma %lld%s | %lld cycles, accepted %lld/%lld (%.1f%%), mean accepted %.2f/cycle | "
                "histogram",
                qspec.draft.name.c_str(), static_cast<long long>(m.gamma), qspec.overwrite_kv ? "" : " no-kv-overwrite",
                static_cast<long long>(m.cycles), static_cast<long long>(m.accepted),
                static_cast<long long>(m.drafted), 100.0 * m.acceptance_rate(), m.mean_accepted_length());
  std::string text = buffer;
  for (size_t i = 0; i < m.accepted_histogram.size(); ++i) {
    std::snprintf(buffer, sizeof buffer, " %zu:%lld", i, static_cast<long long>(m.accepted_histogram[i]));
    text += buffer;
  }
  std::snprintf(buffer, sizeof buffer, " | draft %.1f ms (%lld steps), verify %.1f ms", m.draft_seconds * 1e3,
                static_cast<long long>(m.draft_steps), m.verify_seconds * 1e3);
  return text + buffer;
}

}  // namespace qspec
