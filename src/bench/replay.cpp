// Recorded text replayed through the engine at another model's shapes (bench/replay.h).
#include "bench/replay.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "model/llama.h"
#include "qspec/decode_plan.h"
#include "qspec/error.h"
#include "runtime/qspec.h"

namespace qspec {

std::vector<ReplayText> load_replay_texts(const std::string& path) {
  std::ifstream file(path);
  QSPEC_CHECK(file.good(), "bench --replay: cannot read ", path);
  std::vector<ReplayText> texts;
  try {
    const nlohmann::json data = nlohmann::json::parse(file);
    const auto prompts = data.at("prompts").get<std::vector<std::vector<int32_t>>>();
    const auto outputs = data.at("outputs").get<std::vector<std::vector<int32_t>>>();
    QSPEC_CHECK(prompts.size() == outputs.size(), "bench --replay ", path, ": ", prompts.size(), " prompts but ",
                outputs.size(), " outputs");
    for (size_t i = 0; i < prompts.size(); ++i) {
      QSPEC_CHECK(!prompts[i].empty(), "bench --replay ", path, ": prompt ", i, " is empty");
      if (!outputs[i].empty()) texts.push_back({prompts[i], outputs[i]});
    }
  } catch (const nlohmann::json::exception& e) {
    fail("bench --replay ", path, ": not a record of `qspec eval qspec --save-reference` (prompts and outputs: ",
         e.what(), ")");
  }
  QSPEC_CHECK(!texts.empty(), "bench --replay ", path, ": no text with an output");
  return texts;
}

ReplayBackend::ReplayBackend(std::unique_ptr<Backend> inner, std::string target_key, int64_t vocab)
    : inner_(std::move(inner)), target_key_(std::move(target_key)), vocab_(vocab) {
  QSPEC_CHECK(inner_ != nullptr, "replay: no backend to wrap");
}

void ReplayBackend::follow(uint64_t sequence, const ReplayText* text) { texts_[sequence] = text; }

// A released sequence may come back (preempted, then recomputed): its text stays followed.
void ReplayBackend::release(uint64_t sequence) { inner_->release(sequence); }

PassResult ReplayBackend::forward(const RunMode& mode, std::span<const PassRun> runs) {
  PassResult pass = inner_->forward(mode, runs);
  rows_.clear();
  rows_from_inner_ = pass.ids.empty();
  last_replayed_ = false;
  if (rows_from_inner_) {
    // A backend of logit rows only (the CPU's): the argmax of each (lowest id on ties, as the
    // engine's greedy pick), so the replayed rows can be given as ids.
    rows_ = inner_->logits();
    const size_t rows = rows_.size() / static_cast<size_t>(vocab_);
    pass.ids.resize(rows);
    for (size_t r = 0; r < rows; ++r) {
      const float* row = rows_.data() + r * static_cast<size_t>(vocab_);
      pass.ids[r] = static_cast<int32_t>(std::max_element(row, row + vocab_) - row);
    }
  }
  if (mode.key() != target_key_) return pass;
  for (size_t r = 0; r < runs.size(); ++r) {
    const PassRun& run = runs[r];
    const auto it = texts_.find(run.sequence);
    if (it == texts_.end() || run.output == PassRun::Output::none) continue;
    const ReplayText& text = *it->second;
    const int64_t n = static_cast<int64_t>(run.tokens.size());
    // Row i of an `all` run follows the token at position base + i; a `last` run's one row
    // follows its last token. A row predicts the position after the token it follows.
    const int64_t rows = run.output == PassRun::Output::all ? n : 1;
    const int64_t first_followed = run.output == PassRun::Output::all ? run.base : run.base + n - 1;
    const int64_t prompt = static_cast<int64_t>(text.prompt.size());
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t predicted = first_followed + i + 1 - prompt;  // index into the output
      if (predicted < 0 || predicted >= static_cast<int64_t>(text.output.size())) continue;
      pass.ids[static_cast<size_t>(pass.first_row[r] + i)] = text.output[static_cast<size_t>(predicted)];
      ++replayed_rows_;
      last_replayed_ = true;
    }
  }
  return pass;
}

std::vector<float> ReplayBackend::logits() {
  QSPEC_CHECK(!last_replayed_, "replay: the engine asked for the logit rows of a replayed pass (its ids are the "
              "recorded text's, its rows the model's): replay greedy requests without log-probabilities");
  return rows_from_inner_ ? std::move(rows_) : inner_->logits();
}

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

struct ReplayRun {
  std::string draft;  // "" for plain W4A16
  int64_t gamma = 0;
};

struct RunResult {
  double seconds = 0;
  int64_t tokens = 0;
  double decode_seconds = 0;  // each request's first token to its last, summed
  int64_t decode_tokens = 0;
  int64_t identical = 0, requests = 0;
  int64_t steps = 0;
  // After the last request's first token (every prompt prefilled): decoding alone, the batch
  // draining as its requests finish. With requests = batch (one wave) this is the decode
  // throughput of a batch that starts full, without prefill chunks in its steps.
  double drain_seconds = 0;
  int64_t drain_tokens = 0;
  QSpecMetrics qspec;
};

RunResult run_once(const LlamaModel& model, const std::vector<ReplayText>& texts, const ReplayOptions& options,
                   const ReplayBackendFactory& make_backend, int64_t batch, const ReplayRun& spec) {
  const std::string target = std::string(decode_rules::kVerifyMode);
  auto owned = std::make_unique<ReplayBackend>(make_backend(batch), parse_run_mode(target).key(),
                                               model.config().vocab_size);
  ReplayBackend* replay = owned.get();
  EngineOptions engine_options = options.engine;
  engine_options.max_batch_size = batch;
  engine_options.qspec_costs = options.qspec_costs;
  if (!engine_options.planner_trace.empty()) {  // a line naming the run its engine's lines belong to
    std::ofstream trace(engine_options.planner_trace, std::ios::app);
    QSPEC_CHECK(trace.good(), "bench --replay: cannot open the planner trace ", engine_options.planner_trace);
    trace << nlohmann::json{{"run", spec.draft.empty() ? std::string("w4a16") : spec.draft},
                            {"gamma", spec.gamma},
                            {"batch", batch}}
                 .dump()
          << '\n';
  }
  Engine engine(model, nullptr, engine_options, std::move(owned));

  const int64_t requests = options.requests > 0 ? options.requests
                           : options.waves > 0  ? std::max<int64_t>(8, options.waves * batch)
                                                : std::max<int64_t>(16, 4 * batch);
  RunResult result;
  result.requests = requests;
  std::vector<std::vector<int32_t>> outputs(static_cast<size_t>(requests));
  std::map<RequestId, size_t> index;
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<Clock::time_point, int64_t>> emitted;  // (when, tokens) of every event
  std::vector<Clock::time_point> first_token(static_cast<size_t>(requests));
  auto callback = [&](const TokenEvent& event) {
    const size_t at = index.at(event.id);
    auto& out = outputs[at];
    if (!event.tokens.empty()) {
      const Clock::time_point now = Clock::now();
      if (out.empty()) first_token[at] = now;
      emitted.emplace_back(now, static_cast<int64_t>(event.tokens.size()));
    }
    out.insert(out.end(), event.tokens.begin(), event.tokens.end());
    if (!event.finished) return;
    QSPEC_CHECK(event.finish_reason != "error", "bench --replay: a request failed: ", event.error);
    if (event.metrics) {
      result.qspec.add(event.metrics->qspec);
      if (event.metrics->generated_tokens > 1) {
        result.decode_seconds += event.metrics->total_seconds - event.metrics->time_to_first_token;
        result.decode_tokens += event.metrics->generated_tokens - 1;
      }
    }
  };
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < requests; ++i) {
    const ReplayText& text = texts[static_cast<size_t>(i) % texts.size()];
    Request request;
    request.prompt = text.prompt;
    request.max_new_tokens = static_cast<int64_t>(text.output.size());
    request.ignore_eos = true;  // the text's length decides (its ids may be another model's eos)
    if (spec.draft.empty()) {
      request.plan.mode = target;
    } else {
      DecodePlan& plan = request.plan;
      plan.mode = std::string(decode_rules::kQSpecMode);
      plan.verify = target;
      set_draft_spec(plan, spec.draft);
      plan.gamma = spec.gamma;
      if (plan.auto_draft()) plan.max_gamma = spec.gamma;
      plan.ngram_corpus = options.ngram_corpus && i < static_cast<int64_t>(texts.size());
      validate(plan, "bench --replay: ");
    }
    const RequestId id = engine.submit(std::move(request), callback);
    index[id] = static_cast<size_t>(i);
    replay->follow(id, &text);
  }
  engine.run_until_idle();
  const Clock::time_point end = Clock::now();
  result.seconds = std::chrono::duration<double>(end - start).count();
  const Clock::time_point drain_start = *std::max_element(first_token.begin(), first_token.end());
  result.drain_seconds = std::chrono::duration<double>(end - drain_start).count();
  for (const auto& [when, tokens] : emitted)
    if (when > drain_start) result.drain_tokens += tokens;
  result.steps = engine.metrics().steps;
  for (int64_t i = 0; i < requests; ++i) {
    const std::vector<int32_t>& want = texts[static_cast<size_t>(i) % texts.size()].output;
    result.tokens += static_cast<int64_t>(outputs[static_cast<size_t>(i)].size());
    result.identical += outputs[static_cast<size_t>(i)] == want;
  }
  QSPEC_CHECK(result.identical == requests, "bench --replay: ", requests - result.identical, " of ", requests,
              " requests did not emit their recorded text (batch ", batch, ", ",
              spec.draft.empty() ? target : spec.draft, ")");
  return result;
}

}  // namespace

nlohmann::json run_replay(const LlamaModel& model, const std::vector<ReplayText>& texts,
                          const ReplayOptions& options, const ReplayBackendFactory& make_backend) {
  QSPEC_CHECK(!texts.empty(), "bench --replay: no texts");
  QSPEC_CHECK(options.rounds >= 1, "bench --replay: rounds must be >= 1, got ", options.rounds);
  QSPEC_CHECK(options.requests == 0 || options.waves == 0, "bench --replay: give requests or waves, not both");
  for (const ReplayText& text : texts)
    for (const auto* ids : {&text.prompt, &text.output})
      for (int32_t id : *ids)
        QSPEC_CHECK(id >= 0 && id < model.config().vocab_size, "bench --replay: token id ", id,
                    " is outside this model's vocabulary (", model.config().vocab_size, ")");
  std::vector<ReplayRun> specs = {{"", 0}};
  for (const std::string& draft : options.drafts)
    for (int64_t gamma : options.gammas) specs.push_back({draft, gamma});  // auto: gamma is its bound
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%6s %-10s %5s %10s %8s %12s %8s %10s %8s %10s %9s  %s\n", "batch", "run", "gamma", "tok/s",
              "x w4a16", "decode t/s", "x w4a16", "drain t/s", "x w4a16", "acceptance", "acc/cycle", "plans");
  for (int64_t batch : options.batch_sizes) {
    std::vector<std::vector<RunResult>> results(specs.size());
    for (int round = 0; round < options.rounds; ++round)
      for (size_t s = 0; s < specs.size(); ++s)
        results[s].push_back(run_once(model, texts, options, make_backend, batch, specs[s]));
    auto rate = [](const RunResult& r) { return r.tokens / std::max(r.seconds, 1e-9); };
    auto decode_rate = [](const RunResult& r) { return r.decode_tokens / std::max(r.decode_seconds, 1e-9); };
    auto drain_rate = [](const RunResult& r) { return r.drain_tokens / std::max(r.drain_seconds, 1e-9); };
    auto medians = [&](size_t s, auto&& f) {
      std::vector<double> v;
      for (const RunResult& r : results[s]) v.push_back(f(r));
      return median(v);
    };
    const double plain_rate = medians(0, rate), plain_decode = medians(0, decode_rate),
                 plain_drain = medians(0, drain_rate);
    for (size_t s = 0; s < specs.size(); ++s) {
      const RunResult& last = results[s].back();  // acceptance and plans: the same text every round
      const double tps = medians(s, rate), decode = medians(s, decode_rate), drain = medians(s, drain_rate);
      std::vector<double> all_rates;
      for (const RunResult& r : results[s]) all_rates.push_back(rate(r));
      const std::string name = specs[s].draft.empty() ? std::string(decode_rules::kVerifyMode) : specs[s].draft;
      const std::string plans = specs[s].draft.empty() ? "" : describe_planner_metrics(last.qspec);
      std::printf("%6lld %-10s %5lld %10.1f %8.3f %12.1f %8.3f %10.1f %8.3f %9.1f%% %9.2f  %s\n",
                  static_cast<long long>(batch), name.c_str(), static_cast<long long>(specs[s].gamma), tps,
                  tps / plain_rate, decode, decode / plain_decode, drain, drain / plain_drain,
                  specs[s].draft.empty() ? 0.0 : 100.0 * last.qspec.acceptance_rate(),
                  specs[s].draft.empty() ? 0.0 : last.qspec.mean_accepted_length(), plans.c_str());
      nlohmann::json row = {{"batch_size", batch},
                            {"run", name},
                            {"gamma", specs[s].gamma},
                            {"requests", last.requests},
                            {"generated_tokens", last.tokens},
                            {"engine_steps", last.steps},
                            {"tokens_per_second", tps},
                            {"tokens_per_second_rounds", all_rates},
                            {"over_w4a16", tps / plain_rate},
                            {"decode_tokens_per_second", decode},
                            {"decode_over_w4a16", decode / plain_decode},
                            {"drain_tokens_per_second", drain},
                            {"drain_over_w4a16", drain / plain_drain},
                            {"identical_to_text", last.identical}};
      if (!specs[s].draft.empty()) {
        row["qspec"] = qspec_counters_json(last.qspec);
        row["mean_accepted_per_cycle"] = last.qspec.mean_accepted_length();
        const nlohmann::json planner = qspec_planner_json(last.qspec);
        if (!planner.is_null()) row["planner"] = planner;
      }
      rows.push_back(row);
    }
    std::fflush(stdout);
  }
  return rows;
}

}  // namespace qspec
