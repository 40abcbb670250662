// The continuous-batching engine (include/qspec/engine.h). One step:
//   1. intake: queued submissions and cancellations;
//   2. admit waiting requests first-come first-served while there is a batch slot and room in
//      the KV pool for their first prompt chunk;
//   3. plan each running sequence's work: a decode token, a QSpec cycle (gamma drafts + one
//      verify over gamma + 1 tokens) or a prompt chunk (chunked prefill: decoding goes first,
//      prompt chunks fill the rest of max_batch_tokens). Sequences with draft "auto" follow one
//      plan for the step, the planner's (runtime/qspec_planner.h): plain decode tokens, or cycles
//      of one draft and gamma. KV blocks are reserved here; when the
//      pool is short, the most recently admitted sequence is preempted (its blocks freed, its
//      tokens kept, recomputed when it is admitted again);
//   4. run: the draft passes of every QSpec sequence, batched per draft mode, one token each;
//      then one target pass per run mode over every prompt chunk, decode token and verify run;
//   5. commit: sample, accept or reject drafts, roll the KV cache back past rejected drafts,
//      stream the new tokens, finish on eos / stop ids / stop strings / max tokens.
#include "qspec/engine.h"

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "gemm/policy_map.h"
#include "model/llama.h"
#include "runtime/backend.h"
#include "runtime/draft_mode.h"
#include "runtime/kv_cache.h"
#include "runtime/ngram_draft.h"
#include "runtime/qspec.h"
#include "runtime/qspec_planner.h"
#include "ops/sample.h"
#include "tokenizer/tokenizer.h"

namespace qspec {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Holds back the end of the output text while it may still be the start of a stop string;
// cuts the text at the first stop string.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends text and returns what can be released; sets `matched` at a stop string (the text
  // before it is released, everything after is dropped).
  std::string push(const std::string& text, bool& matched) {
    pending_ += text;
    if (stops_.empty()) return std::exchange(pending_, {});
    size_t first = std::string::npos;
    for (const std::string& stop : stops_) first = std::min(first, pending_.find(stop));
    if (first != std::string::npos) {
      matched = true;
      std::string out = pending_.substr(0, first);
      pending_.clear();
      return out;
    }
    size_t hold = 0;  // the longest tail of pending_ that begins a stop string
    for (const std::string& stop : stops_)
      for (size_t k = std::min(stop.size() - 1, pending_.size()); k > hold; --k)
        if (pending_.compare(pending_.size() - k, k, stop, 0, k) == 0) {
          hold = k;
          break;
        }
    std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
  }
  std::string flush() { return std::exchange(pending_, {}); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

struct Sequence {
  RequestId id = 0;
  Request request;
  TokenCallback callback;
  bool qspec = false;
  bool ngram = false;  // qspec with prompt-lookup drafts (no draft passes)
  bool auto_draft = false;  // qspec whose draft and gamma the planner picks each step
  int64_t auto_gamma = 0;   // draft auto: this step's drafts (StepPlan::gammas, else its gamma)
  RunMode mode;   // plain decoding, or the verify mode of qspec (prompt chunks run in it too)
  RunMode draft;  // qspec with draft passes only
  std::vector<int32_t> tokens;  // prompt + committed output
  int64_t prompt_tokens = 0;
  int64_t prompt_scored = 1;       // prompt_logprobs: the next prompt position to score (the first has no context)
  int64_t budget = 0;              // output tokens allowed (max_new_tokens within the context)
  std::string budget_reason;       // "length" or "context"
  int64_t gamma = 0;               // current draft length (adaptive gamma moves it)
  SequenceKv kv;
  std::optional<Sampler> sampler;         // plain modes
  std::optional<QSpecAcceptor> acceptor;  // qspec
  std::optional<StreamDecoder> decoder;   // with a tokenizer
  std::optional<StopStrings> stops;
  // Draft auto: its running acceptance of each model-draft candidate, and the n-gram draft's (by
  // match length) with its probe.
  std::vector<DraftAcceptance> acceptance;
  NgramAcceptance ngram_acceptance;
  NgramProbe ngram_probe;
  NgramIndex ngram_index;  // its prompt lookups, kept up to date as its tokens grow
  RequestMetrics metrics;
  Clock::time_point submitted;
  bool scheduled = false;
  // The step's outcome.
  TokenEvent event;
  bool finished = false;
  bool stop_string_matched = false;
  std::string finish_reason;

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_tokens; }
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - kv.length(); }
  // Decoding: every committed token but the last is in the cache.
  bool decoding() const { return generated() > 0 && pending() == 1; }
};

// One sequence's work in a step.
struct Unit {
  Sequence* seq = nullptr;
  enum class Kind { prompt, decode, cycle } kind = Kind::decode;
  int64_t count = 0;  // tokens in the target pass
  int64_t base = 0;   // kv length before the step
  bool emits = false;   // decode, or a prompt's last chunk: the target pass picks its next token
  bool scores = false;  // a prompt chunk with rows to score (Request::prompt_logprobs): every row's logits
  // cycle:
  int64_t gamma = 0;
  bool ngram = false;              // prompt-lookup drafts (no draft passes)
  const RunMode* draft = nullptr;  // else the drafting mode
  int candidate = -1;              // draft auto: the planner's candidate
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> draft_probs;
  bool draft_ended = false;  // an eos draft ends the draft
  // GPU greedy drafts still on the device (GpuLlama::draft_chain_async): `drafts` holds gamma
  // placeholders until the verify step reads them back with its ids.
  int64_t chain_offset = -1, chain_stride = 0;
  std::vector<std::vector<uint8_t>> saved_rows;  // no-overwrite ablation: the draft rows of each layer
  std::vector<int32_t> target_tokens;
};

}  // namespace

struct Engine::Impl {
  const LlamaModel& model;
  const Tokenizer* tokenizer;
  EngineOptions options;
  std::vector<int32_t> eos_ids;
  int64_t context_limit = 0;  // positions a sequence may hold: options.max_context, else the model's
  int64_t activation_group_size = quant::kDefaultGroupSize;
  KvCacheFormat kv_format = KvCacheFormat::f16;  // options.kv_cache
  std::unique_ptr<Backend> backend;  // where the forward passes run (options.device)
  KvBlockPool pool;
  // Draft auto: the planner over this device's step costs, and its candidates' drafting modes
  // (index-aligned with planner->candidates(); unused for n-gram).
  std::optional<QSpecPlanner> planner;
  std::vector<RunMode> candidate_modes;
  int ngram_candidate = -1;
  // Draft auto: every auto sequence's n-gram probe outcomes, the prior of a sequence's own
  // estimates (planner_rules::kPopulationAcceptanceDecay).
  NgramAcceptance ngram_population{planner_rules::kPopulationAcceptanceDecay};
  // N-gram drafts and the planner's probes: the text of finished requests, for lookups where a
  // sequence's own tokens have no match (DecodePlan::ngram_corpus).
  NgramCorpus ngram_corpus{decode_rules::kNgramCorpusTokens};
  std::string planner_description;
  std::unique_ptr<std::ofstream> trace;  // options.planner_trace, appended

  // Shared with submitting threads.
  mutable std::mutex queue_mutex;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> incoming;
  std::vector<RequestId> cancels;
  std::unordered_set<RequestId> live;
  RequestId next_id = 1;
  int64_t queued = 0;  // incoming + waiting
  bool stopping = false;
  std::thread worker;
  std::atomic<bool> has_work{false};
  std::atomic<int64_t> submitted{0}, rejected{0};

  mutable std::mutex metrics_mutex;
  EngineMetrics published;

  // The stepping thread's own state.
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;  // admission order
  EngineMetrics totals;

  Impl(const LlamaModel& m, const Tokenizer* t, const EngineOptions& o, std::unique_ptr<Backend> given = nullptr)
      : model(m),
        tokenizer(t),
        options(o),
        context_limit(context_of(m, o)),
        activation_group_size(activation_group_size_of(m, o)),
        kv_format(kv_format_of(o)),
        backend(given ? std::move(given) : make_backend(m, o, kv_format, context_limit, activation_group_size)),
        pool(m.config().num_layers, m.config().num_kv_heads, m.config().head_dim, kv_format,
             pool_blocks(m, o, kv_format, context_limit, backend->kv_in_pool()), o.kv_block_size,
             /*with_storage=*/backend->kv_in_pool()) {
    // End of sequence: the tokenizer's eos ids and the checkpoint's (generation_config.json
    // may name more, e.g. an instruct model's end-of-turn token).
    if (tokenizer) eos_ids = tokenizer->eos_ids;
    for (int32_t id : model.config().eos_token_ids)
      if (std::find(eos_ids.begin(), eos_ids.end(), id) == eos_ids.end()) eos_ids.push_back(id);
    totals.kv_blocks_total = pool.num_blocks();
    totals.kv_cache_bytes = pool.bytes();
    totals.batch_size_histogram.assign(static_cast<size_t>(options.max_batch_size + 1), 0);
    published = totals;
    make_planner();
  }

  // Draft auto's planner: the step-cost table options.qspec_costs names (or finds, "auto") for
  // this device and model, over the table's drafts that run here; without one, the fallback.
  void make_planner() {
    if (!options.planner_trace.empty()) {
      trace = std::make_unique<std::ofstream>(options.planner_trace, std::ios::app);
      QSPEC_CHECK(trace->good(), "engine: cannot open the planner trace ", options.planner_trace);
    }
    std::string path = options.qspec_costs;
    const std::string device = backend->device_name();
    const ModelShape shape = ModelShape::of(model.config());
    if (path == "none") path.clear();
    if (path == "auto") path = find_cost_table(gemm::default_policy_dirs(), device, shape, kv_format);
    if (path.empty()) {
      planner.emplace(std::nullopt);
      ngram_candidate = 0;
      candidate_modes.resize(1);
      planner_description = planner->describe();
      return;
    }
    QSpecCostTable table = QSpecCostTable::load(path);
    QSPEC_CHECK(table.device == device, "engine: qspec_costs ", path, " was measured on '", table.device,
                "'; this engine runs on '", device, "' (tune this device: qspec bench --qspec-costs-out)");
    QSPEC_CHECK(table.kv_cache == kv_format, "engine: qspec_costs ", path, " was measured on an ",
                kv_cache_format_name(table.kv_cache), " KV cache; this engine's is ", kv_cache_format_name(kv_format),
                " (tune it: qspec bench --kv-cache ", kv_cache_format_name(kv_format), " --qspec-costs-out)");
    QSPEC_CHECK(table.shape == shape, "engine: qspec_costs ", path, " is for a model with ", table.shape.describe(),
                "; this model has ", shape.describe());
    // The table's drafts that run here (a mode this backend drafts in, a window within the
    // context); the others are named in the description, not fatal: a table may list drafts
    // another build or checkpoint runs.
    std::vector<std::string> usable;
    std::string skipped;
    for (const std::string& spec : table.drafts()) {
      DecodePlan probe;
      probe.mode = std::string(decode_rules::kQSpecMode);
      set_draft_spec(probe, spec);
      if (probe.ngram_draft()) {
        usable.push_back(spec);
        candidate_modes.emplace_back();
        continue;
      }
      try {
        const RunMode mode = with_draft_diets(runnable_mode(probe.draft, "draft"), probe);
        QSPEC_CHECK(probe.draft_window + mode.kv_sinks < context_limit, "its view is not below the context (",
                    context_limit, ")");
        if (mode.vocab_subset > 0) model.check_draft_vocab(mode.vocab_subset);  // a table that holds it
        if (mode.skip_layers > 0) model.check_draft_skip(mode.skip_layers);
        check_kv_view(mode);
        backend->check_mode(mode, "draft");  // with its diets: a backend may lack one
        usable.push_back(spec);
        candidate_modes.push_back(mode);
      } catch (const Error& e) {
        skipped += (skipped.empty() ? "" : "; ") + spec + ": " + e.what();
      }
    }
    planner.emplace(std::move(table), usable, path);
    for (size_t c = 0; c < usable.size(); ++c)
      if (usable[c] == decode_rules::kNgramDraft) ngram_candidate = static_cast<int>(c);
    planner_description = planner->describe() + (skipped.empty() ? "" : " (skipped " + skipped + ")");
  }

  static void check_options(const EngineOptions& o) {
    QSPEC_CHECK(o.max_batch_size >= 1, "engine: max_batch_size must be >= 1, got ", o.max_batch_size);
    QSPEC_CHECK(o.max_batch_tokens >= 1, "engine: max_batch_tokens must be >= 1, got ", o.max_batch_tokens);
    QSPEC_CHECK(o.prefill_chunk >= 1, "engine: prefill_chunk must be >= 1, got ", o.prefill_chunk);
    QSPEC_CHECK(o.kv_block_size >= 1, "engine: kv_block_size must be >= 1, got ", o.kv_block_size);
    QSPEC_CHECK(o.kv_blocks >= 0, "engine: kv_blocks must be >= 0, got ", o.kv_blocks);
    QSPEC_CHECK(o.device == "cpu" || o.device == "cuda", "engine: device must be cpu or cuda, got '", o.device, "'");
  }

  static KvCacheFormat kv_format_of(const EngineOptions& o) {
    const std::optional<KvCacheFormat> format = parse_kv_cache_format(o.kv_cache);
    QSPEC_CHECK(format, "engine: kv_cache (--kv-cache) must be f16 or int8, got '", o.kv_cache, "'");
    return *format;
  }

  // A pass that reads the high nibbles of the cache (a `/k4` draft) needs an 8-bit cache.
  void check_kv_view(const RunMode& mode) const { check_draft_kv_cache(mode, kv_format); }

  // The engine's context: options.max_context within the model's, else the model's.
  static int64_t context_of(const LlamaModel& model, const EngineOptions& o) {
    check_options(o);
    const int64_t model_context = model.config().max_position_embeddings;
    QSPEC_CHECK(o.max_context >= 0 && o.max_context <= model_context, "engine: max_context must be in 0..",
                model_context, " (the model's context), got ", o.max_context);
    return o.max_context > 0 ? o.max_context : model_context;
  }

  // int4 activation groups: as given, else the int4 weights' group size, else the model's.
  static int64_t activation_group_size_of(const LlamaModel& model, const EngineOptions& o) {
    if (o.activation_group_size > 0) return o.activation_group_size;
    if (model.has_quantized_weights() && quant::format_has_groups(model.quantization().format) &&
        model.quantization().group_size > 0)
      return model.quantization().group_size;
    try {
      return model.auto_group_size();
    } catch (const Error&) {
      return quant::kDefaultGroupSize;  // only int4 activation modes need it; they will say so
    }
  }

  // The backend of options.device; on the GPU it runs one mode (gpu_mode, else the weights' own).
  static std::unique_ptr<Backend> make_backend(const LlamaModel& model, const EngineOptions& o, KvCacheFormat format,
                                               int64_t context, int64_t group_size) {
    if (o.device == "cpu") return make_cpu_backend(model);
    QSPEC_CHECK(cuda_stores_kv_cache(format), "--kv-cache ", kv_cache_format_name(format), ": the CUDA backend has "
                "no ", kv_cache_format_name(format), " KV cache yet (use --kv-cache f16 on --device cuda, or the CPU)");
    const std::string mode =
        !o.gpu_mode.empty() ? o.gpu_mode : std::string(decode_rules::checkpoint_mode(model.has_quantized_weights()));
    return make_cuda_backend(model, model_mode(model, group_size, mode, "gpu_mode"), o, context);
  }

  static int64_t pool_blocks(const LlamaModel& model, const EngineOptions& o, KvCacheFormat format, int64_t context,
                             bool kv_in_pool) {
    if (o.kv_blocks > 0) return o.kv_blocks;
    const ModelConfig& c = model.config();
    const int64_t per_sequence = (context + o.kv_block_size - 1) / o.kv_block_size + 1;
    // Rows on the device: the pool only counts blocks.
    if (!kv_in_pool) return o.max_batch_size * per_sequence;
    const size_t block_bytes = KvBlockPool::block_bytes(c.num_layers, c.num_kv_heads, c.head_dim, o.kv_block_size, format);
    const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(o.kv_memory_bytes / block_bytes));
    return std::min(o.max_batch_size * per_sequence, cap);
  }
  // ---- submission ----

  std::unique_ptr<Sequence> make_sequence(Request request, TokenCallback callback) const {
    const ModelConfig& c = model.config();
    auto seq = std::make_unique<Sequence>();
    const int64_t prompt = static_cast<int64_t>(request.prompt.size());
    QSPEC_CHECK(prompt > 0, "request: the prompt is empty");
    for (int32_t id : request.prompt)
      QSPEC_CHECK(id >= 0 && id < c.vocab_size, "request: prompt token id ", id, " is outside the vocabulary [0, ",
                  c.vocab_size, ")");
    QSPEC_CHECK(prompt < context_limit, "request: the prompt has ", prompt, " tokens; the ",
                context_limit < c.max_position_embeddings ? "engine's (max_context)" : "model's", " context is ",
                context_limit, " tokens");
    QSPEC_CHECK(request.max_new_tokens >= (request.prompt_logprobs ? 0 : 1), "request: max_new_tokens must be >= ",
                request.prompt_logprobs ? "0" : "1 (0 only when scoring the prompt)", ", got ", request.max_new_tokens);
    QSPEC_CHECK(request.logprobs >= -1 && request.logprobs <= kMaxTopLogprobs, "request: logprobs must be in -1..",
                kMaxTopLogprobs, ", got ", request.logprobs);
    QSPEC_CHECK(!request.prompt_logprobs || backend->scores_prompts(),
                "request: prompt logprobs are not available on this device (", options.device,
                "): its forward passes keep a few logit rows per sequence, not a prompt's");
    for (const std::string& stop : request.stop) QSPEC_CHECK(!stop.empty(), "request: an empty stop string");
    QSPEC_CHECK(request.stop.empty() || tokenizer, "request: stop strings need a tokenizer");
    const DecodePlan& plan = request.plan;
    validate(plan, "request: ");
    seq->qspec = plan.qspec();
    if (seq->qspec) {
      seq->mode = runnable_mode(plan.verify, "verify");
      seq->ngram = plan.ngram_draft();
      seq->auto_draft = plan.auto_draft();
      if (seq->auto_draft) {
        seq->acceptance.resize(planner->candidates().size());
      } else if (!seq->ngram) {
        seq->draft = with_draft_diets(runnable_mode(plan.draft, "draft"), plan);
        QSPEC_CHECK(plan.draft_window + seq->draft.kv_sinks < context_limit, "request: draft_window ",
                    plan.draft_window, " + draft_sinks ", seq->draft.kv_sinks, " is not below the context (",
                    context_limit, " tokens): the draft would read the whole cache (draft_window 0 says that)");
        // The tables hold the diets, the cache the view, and the backend runs them: an error now,
        // not mid-request.
        try {
          if (plan.draft_vocab > 0) model.check_draft_vocab(plan.draft_vocab);
          if (plan.draft_skip > 0) model.check_draft_skip(plan.draft_skip);
          check_kv_view(seq->draft);
        } catch (const Error& e) {
          fail("request: ", e.what());
        }
        backend->check_mode(seq->draft, "draft");
      }
      QSPEC_CHECK(backend->kv_in_pool() || plan.kv_overwrite, "request: the no-overwrite ablation (kv_overwrite off) "
                  "does not run on the GPU (it needs the K/V rows in the host's pool)");
      seq->acceptor.emplace(request.sampling, prompt);  // validates the sampling parameters
    } else {
      seq->mode = runnable_mode(plan.mode, "mode");
    }
    seq->sampler.emplace(request.sampling, prompt);
    for (const auto& [id, bias] : request.sampling.logit_bias)
      QSPEC_CHECK(id < c.vocab_size, "request: logit_bias id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")");
    seq->budget = std::min<int64_t>(request.max_new_tokens, context_limit - prompt);
    seq->budget_reason = seq->budget < request.max_new_tokens ? "context" : "length";
    seq->gamma = seq->qspec ? plan.gamma : 0;
    const int64_t max_gamma = plan.gamma_bound();
    const int64_t rows = prompt + seq->budget + max_gamma + 1;
    QSPEC_CHECK(rows <= pool.num_blocks() * pool.block_size(), "request: needs up to ", rows,
                " KV rows; the engine's pool holds ", pool.num_blocks() * pool.block_size(),
                " (raise kv_blocks or lower max_new_tokens)");
    seq->metrics.prompt_tokens = prompt;
    seq->metrics.qspec.gamma = max_gamma;
    seq->metrics.qspec.accepted_histogram.assign(static_cast<size_t>(max_gamma + 1), 0);
    seq->tokens = request.prompt;
    seq->prompt_tokens = prompt;
    if (tokenizer) seq->decoder.emplace(*tokenizer, /*skip_special=*/true);
    seq->stops.emplace(request.stop);
    seq->request = std::move(request);
    seq->callback = std::move(callback);
    seq->submitted = Clock::now();
    return seq;
  }

  // A mode by name, with the weights it needs loaded.
  static RunMode model_mode(const LlamaModel& model, int64_t group_size, const std::string& name, const char* field) {
    RunMode mode;
    try {
      mode = parse_run_mode(name);
    } catch (const Error& e) {
      fail("request: ", field, ": ", e.what());
    }
    mode.activations.group_size = group_size;
    QSPEC_CHECK(!mode.quantized_weights || model.has_quantized_weights(), "request: ", field, " ", name,
                " needs 4-bit weights; the model has none (load it with --weights)");
    QSPEC_CHECK(mode.quantized_weights || model.has_checkpoint_weights(), "request: ", field, " ", name,
                " needs 16-bit weights; the model holds only 4-bit weights");
    QSPEC_CHECK(!mode.activations.arc || model.has_arc(), "request: ", field, " ", name,
                " needs an ARC-calibrated checkpoint (qspec quantize --arc)");
    return mode;
  }

  // A mode this engine runs as `field` (mode, verify, draft): the weights' and the backend's rules.
  RunMode runnable_mode(const std::string& name, const char* field) const {
    RunMode mode = model_mode(model, activation_group_size, name, field);
    backend->check_mode(mode, field);
    return mode;
  }
  // ---- one step ----

  bool step() {
    const auto step_start = Clock::now();
    bool progressed = intake();
    admit();
    std::vector<Unit> units = plan();
    if (!units.empty()) {
      progressed = true;
      try {
        run_drafts(units);
        run_targets(units);
      } catch (const std::exception& e) {
        // A failed pass ends the requests in it, never the engine.
        for (Unit& unit : units) fail_sequence(*unit.seq, e.what());
      }
      ++totals.steps;
      ++totals.batch_size_histogram[std::min(units.size(), totals.batch_size_histogram.size() - 1)];
    }
    deliver();
    if (progressed) totals.busy_seconds += seconds_between(step_start, Clock::now());
    publish();
    return progressed;
  }

  // Moves submissions into the waiting queue and applies cancellations.
  bool intake() {
    std::vector<RequestId> cancelled;
    {
      std::lock_guard lock(queue_mutex);
      while (!incoming.empty()) {
        waiting.push_back(std::move(incoming.front()));
        incoming.pop_front();
      }
      cancelled.swap(cancels);
    }
    for (RequestId id : cancelled) {
      for (auto& seq : waiting)
        if (seq->id == id) finish(*seq, "cancelled");
      for (auto& seq : running)
        if (seq->id == id) finish(*seq, "cancelled");
    }
    return !cancelled.empty();
  }

  void admit() {
    while (!waiting.empty() && static_cast<int64_t>(running.size()) < options.max_batch_size) {
      Sequence& seq = *waiting.front();
      if (seq.finished) {  // cancelled while waiting: deliver() reports it
        running.push_back(std::move(waiting.front()));
        waiting.pop_front();
        continue;
      }
      const int64_t first_rows = std::min(seq.pending(), options.prefill_chunk);
      if (seq.kv.blocks_needed(pool, first_rows) > pool.free_blocks()) break;  // FCFS: nobody jumps the queue
      if (!seq.scheduled) {
        seq.scheduled = true;
        seq.metrics.queue_seconds = seconds_between(seq.submitted, Clock::now());
      }
      running.push_back(std::move(waiting.front()));
      waiting.pop_front();
    }
  }

  // Frees a running sequence's blocks and puts it back at the head of the queue; its tokens
  // are kept and their K/V recomputed (in the verify / plain mode) when it runs again.
  void preempt(Sequence* victim, std::vector<Unit>& units) {
    units.erase(std::remove_if(units.begin(), units.end(), [&](const Unit& u) { return u.seq == victim; }),
                units.end());
    victim->kv.release(pool);
    backend->release(victim->id);
    ++victim->metrics.preemptions;
    ++totals.preemptions;
    auto it = std::find_if(running.begin(), running.end(), [&](const auto& s) { return s.get() == victim; });
    waiting.push_front(std::move(*it));
    running.erase(it);
  }

  // Reserves `rows` for seq, preempting the newest sequences as needed; false when seq itself
  // had to go.
  bool reserve(Sequence& seq, int64_t rows, std::vector<Unit>& units, int64_t& budget) {
    while (!seq.kv.reserve(pool, rows)) {
      Sequence* victim = running.back().get();
      for (const Unit& unit : units)
        if (unit.seq == victim) budget += unit.count;  // its planned work is dropped
      preempt(victim, units);
      if (victim == &seq) return false;
    }
    return true;
  }

  // Draft auto: the step's one plan for every auto sequence that decodes, from their contexts,
  // room and acceptance (each n-gram probe resolved and renewed first), recorded in their metrics.
  StepPlan plan_auto_step() {
    std::vector<Sequence*> autos;
    for (const auto& seq : running)
      if (!seq->finished && seq->auto_draft && seq->decoding()) autos.push_back(seq.get());
    if (autos.empty()) return {};
    const std::vector<QSpecPlanner::Candidate>& candidates = planner->candidates();
    std::vector<PlannerSequence> batch(autos.size());
    enum class LookupSource : int8_t { none, own, corpus };  // for the trace
    std::vector<LookupSource> lookup_source(autos.size(), LookupSource::none);
    for (size_t i = 0; i < autos.size(); ++i) {
      Sequence& seq = *autos[i];
      const DecodePlan& plan = seq.request.plan;
      PlannerSequence& p = batch[i];
      p.context = seq.kv.length();
      p.room = std::min(plan.max_gamma, seq.budget - seq.generated() - 1);
      NgramLookup lookup;
      if (ngram_candidate >= 0) {
        seq.ngram_probe.update(seq.tokens, plan.max_gamma, plan.ngram_min, plan.ngram_max, seq.ngram_acceptance,
                               &seq.ngram_index, &ngram_population, corpus_for(seq));
        lookup = lookup_drafts(seq, plan.max_gamma);
        lookup_source[i] = lookup.tokens.empty() ? LookupSource::none
                           : lookup.corpus       ? LookupSource::corpus
                                                 : LookupSource::own;
      }
      for (size_t c = 0; c < candidates.size(); ++c) {
        const bool ngram = static_cast<int>(c) == ngram_candidate;
        // N-gram: the acceptance of lookups that matched as long a suffix as this one, from the
        // engine's lookups so far (ngram_population) until the sequence's own outweigh them.
        const bool corpus = lookup.corpus;
        const double first_prior = ngram ? ngram_population.estimate(lookup.match, candidates[c].prior, corpus) : 0;
        const double next_prior =
            ngram ? ngram_population.continuation(lookup.match, candidates[c].prior, -1, corpus) : 0;
        p.acceptance.push_back(ngram ? seq.ngram_acceptance.estimate(lookup.match, first_prior, corpus)
                                     : seq.acceptance[c].estimate(candidates[c].prior));
        p.continuation.push_back(ngram ? seq.ngram_acceptance.continuation(lookup.match, first_prior, next_prior, corpus)
                                       : seq.acceptance[c].continuation(p.acceptance.back()));
        p.proposable.push_back(ngram ? static_cast<int64_t>(lookup.tokens.size()) : p.room);
      }
    }
    StepPlan step = planner->plan(batch);
    for (size_t i = 0; i < autos.size(); ++i) autos[i]->auto_gamma = step.gammas.empty() ? step.gamma : step.gammas[i];
    if (trace) {
      int64_t longest = 0;
      for (const PlannerSequence& p : batch) longest = std::max(longest, p.context);
      // Lookups by source (own tokens, the corpus of earlier requests' text) and the drafts the
      // plan gave each.
      int64_t own = 0, corpus = 0, own_drafts = 0, corpus_drafts = 0;
      for (size_t i = 0; i < autos.size(); ++i) {
        const int64_t drafts = autos[i]->auto_gamma;  // the plan's draft count for this sequence (above)
        if (lookup_source[i] == LookupSource::own) ++own, own_drafts += drafts;
        if (lookup_source[i] == LookupSource::corpus) ++corpus, corpus_drafts += drafts;
      }
      *trace << nlohmann::json{{"plan", step.label},
                               {"batch", batch.size()},
                               {"longest_context", longest},
                               {"predicted_gain", step.predicted_gain},
                               {"reason", step.reason},
                               {"lookups", {{"own", own}, {"corpus", corpus}}},
                               {"drafts", {{"own", own_drafts}, {"corpus", corpus_drafts}}}}
                    .dump()
             << '\n';
    }
    for (Sequence* seq : autos) {
      QSpecMetrics& m = seq->metrics.qspec;
      ++m.plan_steps[step.label];
      if (step.speculates()) {
        m.predicted_gain_sum += step.predicted_gain;
        ++m.predicted_steps;
      }
      m.plan_reason = step.reason;
    }
    return step;
  }

  std::vector<Unit> plan() {
    std::vector<Unit> units;
    int64_t budget = options.max_batch_tokens;
    // EngineOptions::prefill_first: decoding waits for every running prompt.
    const bool hold_decoding = options.prefill_first && std::any_of(running.begin(), running.end(), [](const auto& s) {
                                 return !s->finished && s->generated() == 0;
                               });
    const StepPlan auto_step = hold_decoding ? StepPlan{} : plan_auto_step();
    // Decoding first (one token, or a QSpec cycle of gamma + 1), then prompt chunks.
    for (int pass = hold_decoding ? 1 : 0; pass < 2; ++pass) {
      for (size_t i = 0; i < running.size(); ++i) {
        Sequence* seq = running[i].get();
        if (seq->finished || seq->decoding() != (pass == 0)) continue;
        Unit unit;
        unit.seq = seq;
        unit.base = seq->kv.length();
        if (pass == 0 && seq->auto_draft && auto_step.speculates()) {
          unit.kind = Unit::Kind::cycle;
          unit.candidate = auto_step.candidate;
          unit.ngram = auto_step.candidate == ngram_candidate;
          if (!unit.ngram) unit.draft = &candidate_modes[static_cast<size_t>(auto_step.candidate)];
          unit.gamma = std::min({seq->auto_gamma, seq->request.plan.max_gamma, seq->budget - seq->generated() - 1});
          unit.count = unit.gamma + 1;
        } else if (pass == 0 && seq->qspec && !seq->auto_draft) {
          unit.kind = Unit::Kind::cycle;
          unit.ngram = seq->ngram;
          if (!unit.ngram) unit.draft = &seq->draft;
          unit.gamma = std::min<int64_t>(seq->gamma, seq->budget - seq->generated() - 1);
          unit.count = unit.gamma + 1;
        } else if (pass == 0) {  // plain decoding, or a plain step of draft auto
          unit.kind = Unit::Kind::decode;
          unit.count = 1;
          unit.emits = true;
        } else {
          unit.kind = Unit::Kind::prompt;
          unit.count = std::min({seq->pending(), options.prefill_chunk, budget});
          if (unit.count <= 0) continue;
        }
        // Decoding always runs (the budget only holds prompt chunks back).
        if (!reserve(*seq, unit.base + unit.count, units, budget)) {
          --i;  // running shrank at or before i; seq is gone
          continue;
        }
        budget -= unit.count;
        units.push_back(std::move(unit));
      }
    }
    return units;
  }

  // ---- forward passes ----

  // Whether a sequence's next token is the argmax of its logits (the ids a backend may return):
  // greedy without a penalty or logit_bias. Others pick from their logit rows on the host.
  static bool argmax_suffices(const Sequence& seq) {
    const SamplingParams& sampling = seq.request.sampling;
    return sampling.greedy() && sampling.repetition_penalty == 1.0f && !sampling.has_additive_adjustments();
  }

  // Draft passes: per draft mode, gamma one-token passes over every sequence still drafting (on
  // the device in one chain where the backend can, else pass by pass). N-gram drafts need none.
  void run_drafts(std::vector<Unit>& units) {
    std::map<std::string, std::vector<Unit*>> by_mode;
    for (Unit& unit : units) {
      if (unit.kind != Unit::Kind::cycle || unit.gamma == 0) continue;
      if (unit.ngram) draft_by_lookup(unit);
      else by_mode[unit.draft->key()].push_back(&unit);
    }
    if (!by_mode.empty()) backend->begin_step();
    for (auto& [name, group] : by_mode) {
      const RunMode& draft = *group.front()->draft;
      const auto start = Clock::now();
      for (Unit* unit : group) unit->draft_probs.resize(static_cast<size_t>(unit->gamma));
      std::vector<int64_t> draft_steps(group.size(), 0);
      if (!draft_chain(group, draft, draft_steps)) draft_pass_by_pass(group, draft, draft_steps);
      record_draft_metrics(group, draft_steps, seconds_between(start, Clock::now()));
      for (Unit* unit : group)
        if (!unit->seq->request.plan.kv_overwrite) save_draft_rows(*unit);
    }
  }

  // The corpus a sequence's lookups may fall back to (DecodePlan::ngram_corpus), or none.
  const NgramCorpus* corpus_for(const Sequence& seq) const {
    return seq.request.plan.ngram_corpus ? &ngram_corpus : nullptr;
  }
  // A sequence's lookup: in its own tokens, else in other requests' text.
  NgramLookup lookup_drafts(Sequence& seq, int64_t max_tokens) {
    const DecodePlan& plan = seq.request.plan;
    return ngram_lookup_own_then_corpus(seq.tokens, max_tokens, plan.ngram_min, plan.ngram_max, &seq.ngram_index,
                                        corpus_for(seq));
  }

  // Prompt-lookup drafts (runtime/ngram_draft.h), cut after an end-of-sequence id as a drafting
  // pass would stop there. A sampled request's draft distribution is the point mass on each
  // draft, so the acceptor's rejection sampling keeps the target's distribution.
  void draft_by_lookup(Unit& unit) {
    const auto start = Clock::now();
    Sequence& seq = *unit.seq;
    for (int32_t d : lookup_drafts(seq, unit.gamma).tokens) {
      unit.drafts.push_back(d);
      if (is_eos(seq, d)) {
        unit.draft_ended = true;
        break;
      }
    }
    // A sampled request's draft distribution is the point mass on each draft: empty rows
    // (QSpecAcceptor::accept), not vocab-sized one-hots.
    if (!argmax_suffices(seq)) unit.draft_probs.assign(unit.drafts.size(), {});
    seq.metrics.qspec.draft_seconds += seconds_between(start, Clock::now());
  }

  // Step i runs every unit still drafting, one token each. Greedy drafts are the backend's
  // argmax ids where it gives them; the others are the acceptor's picks from the logit rows.
  void draft_pass_by_pass(const std::vector<Unit*>& group, const RunMode& draft, std::vector<int64_t>& draft_steps) {
    const int64_t vocab = model.config().vocab_size;
    std::vector<int32_t> inputs(group.size());
    std::vector<PassRun> runs;
    std::vector<Unit*> active;
    for (int64_t i = 0;; ++i) {
      runs.clear();
      active.clear();
      bool host_picks = false;
      for (size_t g = 0; g < group.size(); ++g) {
        Unit* unit = group[g];
        if (i >= unit->gamma || unit->draft_ended) continue;
        inputs[g] = i == 0 ? unit->seq->tokens.back() : unit->drafts.back();
        runs.push_back(PassRun{unit->seq->id, unit->base + i, std::span<const int32_t>(&inputs[g], 1),
                               unit->seq->kv.blocks(pool), PassRun::Output::last});
        active.push_back(unit);
        host_picks = host_picks || !argmax_suffices(*unit->seq);
        ++draft_steps[g];
      }
      if (runs.empty()) break;
      const PassResult pass = backend->forward(draft, runs);
      ++totals.forward_passes;
      const bool have_ids = !pass.ids.empty();
      const std::vector<float> logits = host_picks || !have_ids ? backend->logits() : std::vector<float>{};
      for (size_t a = 0; a < active.size(); ++a) {
        Unit* unit = active[a];
        const int64_t row = pass.first_row[a];
        const int32_t d = have_ids && argmax_suffices(*unit->seq)
                              ? pass.ids[static_cast<size_t>(row)]
                              : pick_draft(*unit,
                                           std::span<const float>(logits.data() + row * vocab, static_cast<size_t>(vocab)),
                                           i);
        unit->drafts.push_back(d);
        if (is_eos(*unit->seq, d)) unit->draft_ended = true;
      }
    }
  }

  // Greedy drafts of one gamma for every unit in one device chain (Backend::draft_chain): the
  // next input of each step is the last step's argmax, on the device. The drafts stay there: the
  // verify pass reads them on the device and returns them with its ids, so the host reads once a
  // cycle (commit_pass). False: not applicable, nothing ran.
  bool draft_chain(const std::vector<Unit*>& group, const RunMode& draft, std::vector<int64_t>& draft_steps) {
    const int64_t gamma = group.front()->gamma;
    for (const Unit* unit : group)
      if (unit->gamma != gamma || unit->draft_ended || !argmax_suffices(*unit->seq)) return false;
    std::vector<int32_t> inputs(group.size());
    std::vector<PassRun> runs;
    for (size_t g = 0; g < group.size(); ++g) {
      Unit* unit = group[g];
      inputs[g] = unit->seq->tokens.back();
      runs.push_back(PassRun{unit->seq->id, unit->base, std::span<const int32_t>(&inputs[g], 1),
                             unit->seq->kv.blocks(pool), PassRun::Output::last});
    }
    const std::optional<int64_t> offset = backend->draft_chain(draft, runs, gamma);
    if (!offset) return false;
    totals.forward_passes += gamma;
    const int64_t n = static_cast<int64_t>(group.size());
    for (int64_t g = 0; g < n; ++g) {
      Unit* unit = group[static_cast<size_t>(g)];
      unit->chain_offset = *offset + g;
      unit->chain_stride = n;
      unit->drafts.assign(static_cast<size_t>(gamma), unit->seq->tokens.back());  // placeholders (valid ids)
      draft_steps[static_cast<size_t>(g)] = gamma;
    }
    return true;
  }

  // A unit's device drafts from the chain ids its verify pass read back; drafts past an eos id
  // are dropped, as the pass-by-pass loop never drafts them (their K/V rows lie inside the
  // cycle's reservation, and the verify's ids before them do not depend on them).
  void take_chain_drafts(Unit& unit) {
    const std::vector<int32_t>& chain = backend->chain_ids();
    const int64_t gamma = static_cast<int64_t>(unit.drafts.size());
    unit.drafts.clear();
    for (int64_t i = 0; i < gamma && !unit.draft_ended; ++i) {
      const int32_t d = chain[static_cast<size_t>(unit.chain_offset + i * unit.chain_stride)];
      unit.drafts.push_back(d);
      if (is_eos(*unit.seq, d)) unit.draft_ended = true;
    }
    unit.chain_offset = -1;
  }

  // Draft i of a unit from its logit row: the acceptor's pick, with the committed tokens and the
  // drafts so far as its repetition-penalty context.
  static int32_t pick_draft(Unit& unit, std::span<const float> row, int64_t i) {
    Sequence& seq = *unit.seq;
    const size_t committed = seq.tokens.size();
    seq.tokens.insert(seq.tokens.end(), unit.drafts.begin(), unit.drafts.end());
    const int32_t d = seq.acceptor->pick(row, seq.tokens, &unit.draft_probs[static_cast<size_t>(i)]);
    seq.tokens.resize(committed);
    return d;
  }

  // A draft pass's time (shared by its units) and each unit's draft steps, into their metrics.
  static void record_draft_metrics(const std::vector<Unit*>& group, const std::vector<int64_t>& draft_steps,
                                   double elapsed) {
    for (size_t g = 0; g < group.size(); ++g) {
      QSpecMetrics& m = group[g]->seq->metrics.qspec;
      m.draft_seconds += elapsed;
      m.draft_steps += draft_steps[g];
    }
  }

  // No-overwrite ablation (K/V rows in the pool only): the rows the drafts wrote (for last,
  // d_0 .. d_{drafted-2}).
  void save_draft_rows(Unit& unit) {
    const ModelConfig& c = model.config();
    const int64_t rows = static_cast<int64_t>(unit.drafts.size());
    const KvBlocks blocks = unit.seq->kv.blocks(pool);
    unit.saved_rows.assign(static_cast<size_t>(c.num_layers), {});
    for (int64_t l = 0; l < c.num_layers; ++l)
      for (int64_t r = 0; r < rows; ++r)
        save_kv_row(blocks, l, blocks.row(unit.base + r), c.num_kv_heads, c.head_dim, unit.saved_rows[l]);
  }

  void restore_draft_rows(Unit& unit, int64_t rows) {
    const ModelConfig& c = model.config();
    const size_t row_bytes = KvStorage::position_bytes(c.num_kv_heads, c.head_dim, kv_format);
    rows = std::min<int64_t>(rows, static_cast<int64_t>(unit.drafts.size()));
    const KvBlocks blocks = unit.seq->kv.blocks(pool);
    for (int64_t l = 0; l < c.num_layers && !unit.saved_rows.empty(); ++l)
      for (int64_t r = 0; r < rows; ++r)
        restore_kv_row(blocks, l, blocks.row(unit.base + r), c.num_kv_heads, c.head_dim,
                       unit.saved_rows[l].data() + static_cast<size_t>(r) * row_bytes);
  }

  // Target passes: one per run mode over every prompt chunk, decode token and verify run. A
  // verify run rewrites the K/V its drafts wrote (rows from the cycle's base).
  void run_targets(std::vector<Unit>& units) {
    std::map<std::string, std::vector<Unit*>> by_mode;
    for (Unit& unit : units) by_mode[unit.seq->mode.name].push_back(&unit);
    std::vector<PassRun> runs;
    for (auto& [name, group] : by_mode) {
      runs.clear();
      for (Unit* unit : group) {
        Sequence& seq = *unit->seq;
        PassRun run;
        run.sequence = seq.id;
        run.base = unit->base;
        run.kv = seq.kv.blocks(pool);
        if (unit->kind == Unit::Kind::cycle) {
          unit->target_tokens.assign(1, seq.tokens.back());
          unit->target_tokens.insert(unit->target_tokens.end(), unit->drafts.begin(), unit->drafts.end());
          run.output = PassRun::Output::all;
          run.chain_offset = unit->chain_offset;
          run.chain_stride = unit->chain_stride;
        } else {
          unit->target_tokens.assign(seq.tokens.begin() + unit->base, seq.tokens.begin() + unit->base + unit->count);
          const bool last = unit->base + unit->count == static_cast<int64_t>(seq.tokens.size());
          // A prompt's last chunk picks the first token, unless the request only scores its prompt.
          unit->emits = last && seq.generated() < seq.budget;
          // Prompt logprobs: rows base .. base + count - 1 score positions base + 1 .. (each once,
          // a recomputation after preemption scores nothing new).
          unit->scores = seq.request.prompt_logprobs && seq.prompt_scored < seq.prompt_tokens &&
                         unit->base + unit->count >= seq.prompt_scored;
          run.output = unit->scores ? PassRun::Output::all
                       : last       ? PassRun::Output::last
                                    : PassRun::Output::none;
        }
        run.tokens = unit->target_tokens;
        runs.push_back(run);
      }
      const auto start = Clock::now();
      const PassResult pass = backend->forward(group.front()->seq->mode, runs);
      ++totals.forward_passes;
      commit_pass(group, runs, pass, start);
      // Draft auto without a step-cost table prices verify tokens from this engine's own W4A16
      // passes: decode steps and verify runs, nothing with a prompt chunk in it, nor a pass that
      // paid a one-time cost (a graph capture: 5-20 ms on a GPU whose step is 2, which priced
      // verifies out at batch 1 when they poisoned the fit).
      const bool prompt =
          std::any_of(group.begin(), group.end(), [](const Unit* u) { return u->kind == Unit::Kind::prompt; });
      const bool timed = !pass.one_off && !prompt;  // what the planner's measured costs take
      if (name == decode_rules::kVerifyMode && (timed || trace)) {
        int64_t tokens = 0;
        for (const PassRun& run : runs) tokens += static_cast<int64_t>(run.tokens.size());
        const double seconds = seconds_between(start, Clock::now());
        if (timed) planner->observe_pass(static_cast<int64_t>(group.size()), tokens, seconds);
        if (trace)
          *trace << nlohmann::json{{"pass", group.size()},  {"tokens", tokens},         {"ms", seconds * 1e3},
                                   {"one_off", pass.one_off}, {"prompt", prompt}}
                        .dump()
                 << '\n';
      }
    }
  }

  // A target pass's tokens: each plain run's next token (its argmax id, a draw on the device, or
  // a host pick from its logit row), each cycle's accepted drafts; then the emits, in order.
  void commit_pass(const std::vector<Unit*>& group, const std::vector<PassRun>& runs, const PassResult& pass,
                   Clock::time_point start) {
    const int64_t vocab = model.config().vocab_size;
    const bool have_ids = !pass.ids.empty();
    std::vector<int32_t> next(group.size(), -1);
    std::vector<size_t> host_rows, device_rows;  // plain runs whose next token is drawn from their row
    bool cycle_rows = false;                     // a cycle accepts from its logit rows
    bool logprob_rows = false;                   // a request reads log-probabilities from its rows
    // The row a plain run picks its next token from: its last.
    auto pick_row = [&](size_t g) {
      return pass.first_row[g] + (runs[g].output == PassRun::Output::all ? group[g]->count - 1 : 0);
    };
    for (size_t g = 0; g < group.size(); ++g) {
      const Sequence& seq = *group[g]->seq;
      const bool argmax = have_ids && argmax_suffices(seq);
      logprob_rows = logprob_rows || group[g]->scores ||
                     (seq.request.logprobs >= 0 && (group[g]->emits || group[g]->kind != Unit::Kind::prompt));
      if (group[g]->kind == Unit::Kind::cycle) {
        cycle_rows = cycle_rows || !argmax;
      } else if (group[g]->emits) {
        if (argmax) next[g] = pass.ids[static_cast<size_t>(pick_row(g))];
        // A QSpec sequence's first token is its acceptor's pick (on the host).
        // The device sampler knows the repetition penalty, not OpenAI's additive adjustments.
        else if (!seq.qspec && options.gpu_sampling && backend->samples_on_device() &&
                 !seq.request.sampling.has_additive_adjustments())
          device_rows.push_back(g);
        else host_rows.push_back(g);
      }
    }
    if (!device_rows.empty()) sample_on_device(group, pass, device_rows, next);
    const std::vector<float> logits =
        cycle_rows || logprob_rows || !host_rows.empty() ? backend->logits() : std::vector<float>{};
    const float* rows = logits.empty() ? nullptr : logits.data();
    const double elapsed = seconds_between(start, Clock::now());
    // Host picks run in parallel (each sequence owns its sampler; a 128k-entry row is ~1 ms of
    // filtering), then every token is emitted in order on this thread.
    ThreadPool::global().parallel_for(host_rows.size(), 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const size_t g = host_rows[i];
        Sequence& seq = *group[g]->seq;
        const std::span<const float> row(logits.data() + pick_row(g) * vocab, static_cast<size_t>(vocab));
        std::vector<float> probs;
        next[g] = seq.qspec ? seq.acceptor->pick(row, seq.tokens, &probs) : seq.sampler->sample(row, seq.tokens);
      }
    });
    for (size_t g = 0; g < group.size(); ++g) {
      Unit& unit = *group[g];
      Sequence& seq = *unit.seq;
      const int64_t first_row = pass.first_row[g];
      if (unit.kind == Unit::Kind::cycle) {
        if (unit.chain_offset >= 0) take_chain_drafts(unit);
        const float* verify_rows = rows ? rows + first_row * vocab : nullptr;
        if (have_ids && argmax_suffices(seq)) {
          const std::span<const int32_t> verify_ids(pass.ids.data() + first_row, unit.drafts.size() + 1);
          commit_cycle(unit, QSpecAcceptor::accept_greedy(unit.drafts, verify_ids), elapsed, verify_rows);
        } else {
          commit_cycle(unit, seq.acceptor->accept(unit.drafts, unit.draft_probs, verify_rows, vocab, seq.tokens),
                       elapsed, verify_rows);
        }
        continue;
      }
      if (unit.scores) score_prompt(unit, rows + first_row * vocab);
      seq.kv.set_length(unit.base + unit.count, pool);
      if (unit.emits) emit(seq, next[g], rows ? rows + pick_row(g) * vocab : nullptr);
      // A scoring-only request (max_new_tokens 0) ends with its prompt.
      else if (seq.kv.length() == static_cast<int64_t>(seq.tokens.size()) && seq.generated() >= seq.budget)
        finish(seq, seq.budget_reason);
    }
  }

  // Prompt logprobs from a chunk's rows (row i scores position base + i + 1), each position once.
  void score_prompt(Unit& unit, const float* chunk_rows) {
    Sequence& seq = *unit.seq;
    const int64_t vocab = model.config().vocab_size;
    const int64_t from = std::max(seq.prompt_scored, unit.base + 1);
    const int64_t to = std::min(seq.prompt_tokens, unit.base + unit.count + 1);  // positions [from, to)
    if (to <= from) return;
    const int32_t top = std::max(seq.request.logprobs, 0);
    std::vector<TokenLogprob> scored(static_cast<size_t>(to - from));
    ThreadPool::global().parallel_for(scored.size(), 16, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const int64_t position = from + static_cast<int64_t>(i);
        const float* row = chunk_rows + (position - 1 - unit.base) * vocab;
        scored[i] = token_logprob({row, static_cast<size_t>(vocab)}, seq.tokens[static_cast<size_t>(position)], top);
      }
    });
    seq.event.prompt_logprobs.insert(seq.event.prompt_logprobs.end(), std::make_move_iterator(scored.begin()),
                                     std::make_move_iterator(scored.end()));
    seq.prompt_scored = to;
  }

  // The next tokens of plain sampled rows, drawn on the device from the pass's logits: each
  // sequence's generator gives the draw its host Sampler would have used (none when greedy), and
  // the repetition penalty gets the prompt and output ids (the kernel applies each id once).
  void sample_on_device(const std::vector<Unit*>& group, const PassResult& pass, const std::vector<size_t>& rows,
                        std::vector<int32_t>& next) {
    std::vector<RowDraw> draws(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      Sequence& seq = *group[rows[i]]->seq;
      RowDraw& draw = draws[i];
      draw.row = pass.first_row[rows[i]];
      draw.params = seq.sampler->params();
      if (!draw.params.greedy()) draw.draw = seq.sampler->next_draw();
      draw.penalised_ids = seq.tokens;  // read only when the penalty is on
    }
    const std::vector<int32_t> ids = backend->sample_rows(draws);
    for (size_t i = 0; i < rows.size(); ++i) next[rows[i]] = ids[i];
  }
  // verify_rows: the verify's logit rows (for log-probabilities), or nullptr when not copied.
  void commit_cycle(Unit& unit, const QSpecAcceptor::Outcome& outcome, double verify_seconds, const float* verify_rows) {
    Sequence& seq = *unit.seq;
    const int64_t drafted = static_cast<int64_t>(unit.drafts.size());
    QSpecMetrics& m = seq.metrics.qspec;
    ++m.cycles;
    m.drafted += drafted;
    m.accepted += outcome.accepted;
    m.rejected += drafted - outcome.accepted;
    ++m.accepted_histogram[static_cast<size_t>(outcome.accepted)];
    m.verify_seconds += verify_seconds;
    // No-overwrite ablation: accepted tokens (last, d_0 .. d_{accepted-1}) keep their draft rows.
    if (!seq.request.plan.kv_overwrite) restore_draft_rows(unit, outcome.accepted + 1);
    const int64_t vocab = model.config().vocab_size;
    auto row = [&](int64_t i) { return verify_rows ? verify_rows + i * vocab : nullptr; };  // scores token i of the cycle
    int64_t emitted = 0;
    for (int64_t i = 0; i < outcome.accepted && !seq.finished; ++i, ++emitted)
      emit(seq, unit.drafts[static_cast<size_t>(i)], row(i));
    if (!seq.finished) {
      emit(seq, outcome.next, row(outcome.accepted));
      ++emitted;
    }
    // The cache keeps every committed token but the last; rows of rejected drafts are dropped.
    seq.kv.truncate(pool, unit.base + emitted);
    // Draft auto: a model draft's outcome is its acceptance evidence (n-gram drafts have their
    // probe, which sees these tokens too).
    if (seq.auto_draft && !unit.ngram && unit.candidate >= 0 && drafted > 0)
      seq.acceptance[static_cast<size_t>(unit.candidate)].observe(outcome.accepted, outcome.accepted < drafted);
    if (seq.request.plan.adaptive_gamma && !seq.auto_draft && drafted > 0) {
      if (outcome.accepted == drafted && drafted == seq.gamma)
        seq.gamma = std::min(seq.gamma + 1, seq.request.plan.max_gamma);
      else if (2 * outcome.accepted < drafted) seq.gamma = std::max<int64_t>(1, seq.gamma - 1);
    }
  }

  // The model's end of sequence (unless the request ignores it).
  bool is_model_eos(const Sequence& seq, int32_t id) const {
    return !seq.request.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end();
  }
  bool is_stop_id(const Sequence& seq, int32_t id) const {
    return std::find(seq.request.stop_ids.begin(), seq.request.stop_ids.end(), id) != seq.request.stop_ids.end();
  }
  // A token that ends the sequence by id (eos or a stop id): a draft stops drafting there.
  bool is_eos(const Sequence& seq, int32_t id) const { return is_model_eos(seq, id) || is_stop_id(seq, id); }

  // `row`: the logits id was chosen from (its log-probability when the request asks; nullptr
  // only when it does not).
  void emit(Sequence& seq, int32_t id, const float* row) {
    if (seq.request.logprobs >= 0) {
      QSPEC_CHECK(row, "engine: no logit row for a logprobs request's token");
      const int64_t vocab = model.config().vocab_size;
      seq.event.logprobs.push_back(token_logprob({row, static_cast<size_t>(vocab)}, id, seq.request.logprobs));
    }
    seq.tokens.push_back(id);
    seq.event.tokens.push_back(id);
    ++seq.metrics.generated_tokens;
    if (seq.generated() == 1) seq.metrics.time_to_first_token = seconds_between(seq.submitted, Clock::now());
    bool stop_string = false;
    if (seq.decoder) seq.event.text += seq.stops->push(seq.decoder->push(id), stop_string);
    seq.stop_string_matched = stop_string;
    if (is_model_eos(seq, id)) finish(seq, "eos");
    else if (stop_string || is_stop_id(seq, id)) finish(seq, "stop");
    else if (seq.generated() >= seq.budget)
      finish(seq, seq.budget_reason);
  }

  void finish(Sequence& seq, const std::string& reason) {
    if (seq.finished) return;
    seq.finished = true;
    // Its text for other requests' lookups (n-gram drafts and the planner's probes).
    if ((seq.ngram || seq.auto_draft) && seq.request.plan.ngram_corpus && seq.generated() > 0)
      ngram_corpus.add(seq.tokens);
    seq.event.finished = true;
    seq.event.finish_reason = reason;
    seq.finish_reason = reason;
    if (seq.decoder && !seq.stop_string_matched) {
      bool ignored = false;
      seq.event.text += seq.stops->push(seq.decoder->flush(), ignored);
      if (!ignored) seq.event.text += seq.stops->flush();
    }
  }

  void fail_sequence(Sequence& seq, const std::string& message) {
    if (seq.finished) return;
    finish(seq, "error");
    seq.event.error = message;
  }

  // Sends every event of the step and retires finished sequences.
  void deliver() {
    auto send = [&](Sequence& seq) {
      if (seq.event.tokens.empty() && seq.event.prompt_logprobs.empty() && !seq.event.finished) return;
      seq.event.id = seq.id;
      if (seq.finished) {
        seq.metrics.total_seconds = seconds_between(seq.submitted, Clock::now());
        seq.event.metrics = &seq.metrics;
      }
      if (seq.callback) {
        try {
          seq.callback(seq.event);
        } catch (...) {
          // A failing consumer (a closed connection) cancels its request, nothing else.
          if (!seq.finished) finish(seq, "cancelled");
        }
      }
      seq.event = TokenEvent{};
    };
    for (auto& seq : running) send(*seq);
    for (auto& seq : waiting)
      if (seq->finished) send(*seq);
    auto retire = [&](auto& list) {
      for (auto it = list.begin(); it != list.end();) {
        Sequence& seq = **it;
        if (!seq.finished) {
          ++it;
          continue;
        }
        seq.kv.release(pool);
        backend->release(seq.id);
        totals.prompt_tokens += seq.prompt_tokens;
        totals.generated_tokens += seq.metrics.generated_tokens;
        if (seq.finish_reason == "cancelled") ++totals.requests_cancelled;
        else if (seq.finish_reason == "error") ++totals.requests_failed;
        else ++totals.requests_finished;
        if (seq.qspec) totals.qspec.add(seq.metrics.qspec);
        {
          std::lock_guard lock(queue_mutex);
          live.erase(seq.id);
        }
        it = list.erase(it);
      }
    };
    retire(running);
    retire(waiting);
  }

  void publish() {
    totals.running = static_cast<int64_t>(running.size());
    totals.waiting = static_cast<int64_t>(waiting.size());
    totals.kv_blocks_used = pool.used_blocks();
    {
      std::lock_guard lock(queue_mutex);
      queued = static_cast<int64_t>(incoming.size() + waiting.size());
      has_work = !running.empty() || !waiting.empty() || !incoming.empty();
    }
    std::lock_guard lock(metrics_mutex);
    published = totals;
  }
};

Engine::Engine(const LlamaModel& model, const Tokenizer* tokenizer, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, options)) {}

Engine::Engine(const LlamaModel& model, const Tokenizer* tokenizer, const EngineOptions& options,
               std::unique_ptr<Backend> backend)
    : impl_(std::make_unique<Impl>(model, tokenizer, options, std::move(backend))) {}

Engine::~Engine() {
  if (impl_->worker.joinable()) stop(/*drain=*/false);
}

RequestId Engine::submit(Request request, TokenCallback on_event) {
  std::unique_ptr<Sequence> seq;
  try {
    seq = impl_->make_sequence(std::move(request), std::move(on_event));
  } catch (...) {
    ++impl_->rejected;
    throw;
  }
  RequestId id;
  {
    std::lock_guard lock(impl_->queue_mutex);
    QSPEC_CHECK(!impl_->stopping, "engine: shutting down, no new requests");
    if (impl_->options.max_waiting > 0 && impl_->queued >= impl_->options.max_waiting) {
      ++impl_->rejected;
      throw QueueFull(detail::concat("engine: ", impl_->queued, " requests are already waiting (max_waiting ",
                                     impl_->options.max_waiting, ")"));
    }
    id = impl_->next_id++;
    seq->id = id;
    impl_->incoming.push_back(std::move(seq));
    impl_->live.insert(id);
    ++impl_->queued;
    impl_->has_work = true;
    ++impl_->submitted;
  }
  impl_->wake.notify_all();
  return id;
}

bool Engine::cancel(RequestId id) {
  {
    std::lock_guard lock(impl_->queue_mutex);
    if (!impl_->live.count(id)) return false;
    impl_->cancels.push_back(id);
  }
  impl_->wake.notify_all();
  return true;
}

bool Engine::step() { return impl_->step(); }

void Engine::run_until_idle() {
  while (impl_->has_work) impl_->step();
}

void Engine::start() {
  QSPEC_CHECK(!impl_->worker.joinable(), "engine: already started");
  impl_->worker = std::thread([impl = impl_.get()] {
    for (;;) {
      {
        std::unique_lock lock(impl->queue_mutex);
        impl->wake.wait(lock, [&] { return impl->has_work || impl->stopping; });
        if (impl->stopping && !impl->has_work) return;
      }
      impl->step();
    }
  });
}

void Engine::stop(bool drain) {
  {
    std::lock_guard lock(impl_->queue_mutex);
    impl_->stopping = true;
    if (!drain)
      for (RequestId id : impl_->live) impl_->cancels.push_back(id);
  }
  impl_->wake.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lock(impl_->metrics_mutex);
  EngineMetrics metrics = impl_->published;
  metrics.requests_submitted = impl_->submitted;
  metrics.requests_rejected = impl_->rejected;
  return metrics;
}

const EngineOptions& Engine::options() const { return impl_->options; }
std::string Engine::qspec_planner() const { return impl_->planner_description; }
int64_t Engine::context_limit() const { return impl_->context_limit; }

std::vector<int32_t> Engine::tokenize(const std::string& text) const {
  QSPEC_CHECK(impl_->tokenizer, "engine: no tokenizer loaded");
  const Tokenizer& t = *impl_->tokenizer;
  return t.encode(text, t.add_bos_by_default && t.bos_id.has_value());
}

}  // namespace qspec
