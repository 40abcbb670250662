// The step costs of `--draft auto`, measured through an engine Backend (bench/step_costs.h).
#include "bench/step_costs.h"

#include <algorithm>
#include <chrono>

#include "qspec/decode_plan.h"
#include "qspec/error.h"
#include "runtime/draft_mode.h"
#include "runtime/kv_cache.h"

namespace qspec {
namespace {

double median_ms(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2] * 1e3;
}

// A draft spec as the run mode the engine gives its draft passes (the request's rules).
RunMode draft_mode(const std::string& spec, int64_t group_size, int64_t context_limit) {
  const DecodePlan plan = cost_table_draft_plan(spec, "qspec costs");
  RunMode mode = with_draft_diets(parse_run_mode(plan.draft), plan);
  mode.activations.group_size = group_size;
  QSPEC_CHECK(plan.draft_window + mode.kv_sinks < context_limit, "qspec costs: draft ", spec,
              ": its view is not below the largest context timed (", context_limit, ")");
  return mode;
}

}  // namespace

QSpecCostTable measure_step_costs(const LlamaModel& model, Backend& backend, const StepCostOptions& options) {
  const ModelConfig& config = model.config();
  QSPEC_CHECK(!options.batches.empty() && !options.contexts.empty() && !options.gammas.empty(),
              "qspec costs: needs batch sizes, contexts and gammas");
  QSPEC_CHECK(options.repeats >= 1, "qspec costs: repeats must be >= 1");
  const int64_t max_batch = *std::max_element(options.batches.begin(), options.batches.end());
  const int64_t max_context = *std::max_element(options.contexts.begin(), options.contexts.end());
  const int64_t max_gamma = *std::max_element(options.gammas.begin(), options.gammas.end());
  for (int64_t b : options.batches) QSPEC_CHECK(b >= 1, "qspec costs: batch sizes must be >= 1, got ", b);
  for (int64_t c : options.contexts) QSPEC_CHECK(c >= 1, "qspec costs: contexts must be >= 1, got ", c);
  for (int64_t g : options.gammas)
    QSPEC_CHECK(g >= 1 && g <= decode_rules::kMaxGamma, "qspec costs: gammas must be in 1..", decode_rules::kMaxGamma,
                ", got ", g);
  QSPEC_CHECK(max_context + max_gamma + 1 <= config.max_position_embeddings, "qspec costs: context ", max_context,
              " + gamma ", max_gamma, " exceeds the model's context (", config.max_position_embeddings, ")");
  RunMode verify = parse_run_mode(decode_rules::kVerifyMode);
  verify.activations.group_size = options.group_size;
  QSPEC_CHECK(model.has_quantized_weights(), "qspec costs: the model has no 4-bit weights (quantize it first)");
  std::vector<std::pair<std::string, RunMode>> drafts;
  bool ngram = false;
  for (const std::string& spec : options.drafts) {
    if (spec == decode_rules::kNgramDraft) {
      ngram = true;
      continue;
    }
    drafts.emplace_back(spec, draft_mode(spec, options.group_size, max_context));
    check_draft_kv_cache(drafts.back().second, options.kv_cache);
    backend.check_mode(drafts.back().second, "draft");
  }

  // Every sequence's rows: the context (zeros: attention costs the same whatever the keys hold)
  // and the verify's gamma + 1 beyond it.
  const int64_t rows = max_context + max_gamma + 1;
  KvBlockPool pool(config.num_layers, config.num_kv_heads, config.head_dim, options.kv_cache,
                   max_batch * ((rows + 15) / 16 + 1), 16, /*with_storage=*/backend.kv_in_pool());
  std::vector<SequenceKv> kv(static_cast<size_t>(max_batch));
  for (SequenceKv& s : kv) QSPEC_CHECK(s.reserve(pool, rows), "qspec costs: the KV pool is short");
  std::vector<int32_t> tokens(static_cast<size_t>(max_batch * (max_gamma + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((700 + 13 * i) % config.vocab_size);

  QSpecCostTable table;
  table.device = backend.device_name();
  table.kv_cache = options.kv_cache;
  table.shape = ModelShape::of(config);
  const size_t total = options.contexts.size() * options.batches.size();
  size_t done = 0;
  using Clock = std::chrono::steady_clock;
  for (int64_t context : options.contexts)
    for (int64_t batch : options.batches) {
      // One pass of `count` tokens a sequence from `context`: the engine's calls, timed.
      auto pass = [&](const RunMode& mode, int64_t count) {
        std::vector<PassRun> runs(static_cast<size_t>(batch));
        for (int64_t s = 0; s < batch; ++s) {
          PassRun& run = runs[static_cast<size_t>(s)];
          run.sequence = static_cast<uint64_t>(s + 1);
          run.base = context;
          run.tokens = std::span<const int32_t>(tokens.data() + s * (max_gamma + 1), static_cast<size_t>(count));
          run.kv = kv[static_cast<size_t>(s)].blocks(pool);
          run.output = count > 1 ? PassRun::Output::all : PassRun::Output::last;
        }
        const auto start = Clock::now();
        const PassResult result = backend.forward(mode, runs);
        if (result.ids.empty() || count > 1) (void)backend.logits();  // the rows the engine reads
        return std::chrono::duration<double>(Clock::now() - start).count();
      };
      for (int64_t s = 0; s < batch; ++s) kv[static_cast<size_t>(s)].set_length(context, pool);
      std::vector<double> step_times;
      std::vector<std::vector<double>> draft_times(drafts.size()), verify_times(options.gammas.size());
      for (int round = 0; round <= options.repeats; ++round) {  // round 0 warms up
        const bool keep = round > 0;
        const double t = pass(verify, 1);
        if (keep) step_times.push_back(t);
        for (size_t d = 0; d < drafts.size(); ++d) {
          const double td = pass(drafts[d].second, 1);
          if (keep) draft_times[d].push_back(td);
        }
        for (size_t g = 0; g < options.gammas.size(); ++g) {
          const double tv = pass(verify, options.gammas[g] + 1);
          if (keep) verify_times[g].push_back(tv);
        }
      }
      StepCostPoint point;
      point.batch = batch;
      point.context = context;
      point.w4a16_step_ms = median_ms(step_times);
      for (size_t g = 0; g < options.gammas.size(); ++g) point.verify_ms[options.gammas[g]] = median_ms(verify_times[g]);
      for (size_t d = 0; d < drafts.size(); ++d) point.draft_step_ms[drafts[d].first] = median_ms(draft_times[d]);
      if (ngram) point.draft_step_ms[std::string(decode_rules::kNgramDraft)] = 0.0;
      table.points.push_back(std::move(point));
      if (options.progress) options.progress(++done, total);
    }
  for (SequenceKv& s : kv) s.release(pool);
  return table;
}

}  // namespace qspec
