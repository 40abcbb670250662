// The continuous-batching engine (include/qspec/engine.h). One step:
//   1. intake: queued submissions and cancellations;
//   2. admit waiting requests first-come first-served while there is a batch slot and room in
//      the KV pool for their first prompt chunk;
//   3. plan each running sequence's work: a decode token, a QSpec cycle (gamma drafts + one
//      verify over gamma + 1 tokens) or a prompt chunk (chunked prefill: decoding goes first,
//      prompt chunks fill the rest of max_batch_tokens). KV blocks are reserved here; when the
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
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_set>

#include "base/thread_pool.h"
#include "model/llama.h"
#ifdef QSPEC_HAVE_CUDA
#include "model/cuda/llama_gpu.h"
#endif
#include "runtime/kv_cache.h"
#include "runtime/qspec.h"
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
  RunMode mode;   // plain decoding, or the verify mode of qspec (prompt chunks run in it too)
  RunMode draft;  // qspec only
  std::vector<int32_t> tokens;  // prompt + committed output
  int64_t prompt_tokens = 0;
  int64_t budget = 0;              // output tokens allowed (max_new_tokens within the context)
  std::string budget_reason;       // "length" or "context"
  int64_t gamma = 0;               // current draft length (adaptive gamma moves it)
  SequenceKv kv;
  std::optional<Sampler> sampler;         // plain modes
  std::optional<QSpecAcceptor> acceptor;  // qspec
  std::optional<StreamDecoder> decoder;   // with a tokenizer
  std::optional<StopStrings> stops;
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
  // cycle:
  int64_t gamma = 0;
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> draft_probs;
  bool draft_ended = false;  // an eos draft ends the draft
  // GPU greedy drafts still on the device (GpuLlama::draft_chain_async): `drafts` holds gamma
  // placeholders until the verify step reads them back with its ids.
  int64_t chain_offset = -1, chain_stride = 0;
  std::vector<std::vector<float>> saved_keys, saved_values;  // no-overwrite ablation: draft rows
  std::vector<int32_t> target_tokens;
};

}  // namespace

struct Engine::Impl {
  const LlamaModel& model;
  const Tokenizer* tokenizer;
  EngineOptions options;
  KvBlockPool pool;
  std::vector<int32_t> eos_ids;

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

  int64_t activation_group_size = quant::kDefaultGroupSize;

  // device "cuda": the GPU model, its mode, and which request holds each of its cache slots.
  bool on_gpu = false;
  std::string gpu_mode_name;
#ifdef QSPEC_HAVE_CUDA
  GpuActivations gpu_mode_activations = GpuActivations::f16;
#endif
  int64_t context_limit = 0;  // positions a sequence may hold: options.max_context, else the model's
#ifdef QSPEC_HAVE_CUDA
  std::unique_ptr<GpuLlama> gpu;
  std::vector<RequestId> gpu_slot_owner;  // 0: free
#endif

  Impl(const LlamaModel& m, const Tokenizer* t, const EngineOptions& o)
      : model(m),
        tokenizer(t),
        options(o),
        pool(m.config().num_layers, m.config().kv_dim(), pool_blocks(m, o), o.kv_block_size,
             /*with_storage=*/o.device != "cuda") {
    context_limit = context_of(m, o);
    // End of sequence: the tokenizer's eos ids and the checkpoint's (generation_config.json
    // may name more, e.g. an instruct model's end-of-turn token).
    if (tokenizer) eos_ids = tokenizer->eos_ids;
    for (int32_t id : model.config().eos_token_ids)
      if (std::find(eos_ids.begin(), eos_ids.end(), id) == eos_ids.end()) eos_ids.push_back(id);
    // int4 activation groups: as given, else the int4 weights' group size, else the model's.
    if (options.activation_group_size > 0) {
      activation_group_size = options.activation_group_size;
    } else if (model.has_quantized_weights() && model.quantization().format == quant::Format::int4 &&
               model.quantization().group_size > 0) {
      activation_group_size = model.quantization().group_size;
    } else {
      try {
        activation_group_size = model.auto_group_size();
      } catch (const Error&) {
        // only int4 activation modes need it; they will say so
      }
    }
    if (options.device == "cuda") start_gpu();  // after the group size: the GPU's int4 drafts use it
    totals.kv_blocks_total = pool.num_blocks();
    totals.batch_size_histogram.assign(static_cast<size_t>(options.max_batch_size + 1), 0);
    published = totals;
  }

  // The engine's context: options.max_context within the model's, else the model's.
  static int64_t context_of(const LlamaModel& model, const EngineOptions& o) {
    const int64_t model_context = model.config().max_position_embeddings;
    QSPEC_CHECK(o.max_context >= 0 && o.max_context <= model_context, "engine: max_context must be in 0..",
                model_context, " (the model's context), got ", o.max_context);
    return o.max_context > 0 ? o.max_context : model_context;
  }

  static int64_t pool_blocks(const LlamaModel& model, const EngineOptions& o) {
    QSPEC_CHECK(o.max_batch_size >= 1, "engine: max_batch_size must be >= 1, got ", o.max_batch_size);
    QSPEC_CHECK(o.max_batch_tokens >= 1, "engine: max_batch_tokens must be >= 1, got ", o.max_batch_tokens);
    QSPEC_CHECK(o.prefill_chunk >= 1, "engine: prefill_chunk must be >= 1, got ", o.prefill_chunk);
    QSPEC_CHECK(o.kv_block_size >= 1, "engine: kv_block_size must be >= 1, got ", o.kv_block_size);
    QSPEC_CHECK(o.kv_blocks >= 0, "engine: kv_blocks must be >= 0, got ", o.kv_blocks);
    QSPEC_CHECK(o.device == "cpu" || o.device == "cuda", "engine: device must be cpu or cuda, got '", o.device, "'");
    if (o.kv_blocks > 0) return o.kv_blocks;
    const ModelConfig& c = model.config();
    const int64_t per_sequence = (context_of(model, o) + o.kv_block_size - 1) / o.kv_block_size + 1;
    // On the GPU the pool only counts blocks (each sequence's rows live in its GPU slot).
    if (o.device == "cuda") return o.max_batch_size * per_sequence;
    const size_t block_bytes = 2 * static_cast<size_t>(c.num_layers * o.kv_block_size * c.kv_dim()) * sizeof(float);
    const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(o.kv_memory_bytes / block_bytes));
    return std::min(o.max_batch_size * per_sequence, cap);
  }

  // ---- the GPU model (device "cuda") ----

  void start_gpu() {
#ifdef QSPEC_HAVE_CUDA
    on_gpu = true;
    gpu_mode_name = !options.gpu_mode.empty() ? options.gpu_mode
                    : model.has_quantized_weights() ? "w4a16"
                                                     : "w16a16";
    gpu_mode_activations = gpu_activations(runnable_mode(gpu_mode_name, "gpu_mode"));  // throws for modes not on the GPU
    GpuLlamaOptions gpu_options;
    gpu_options.max_seqs = options.max_batch_size;
    gpu_options.max_context = context_limit;
    gpu_options.max_step_tokens = std::max(options.max_batch_tokens, options.max_batch_size);
    // QSpec verify runs return a logit row per token: gamma + 1 a sequence.
    gpu_options.max_logit_rows = options.max_batch_size * (decode_rules::kMaxGamma + 1);
    // "auto": a map tuned on this GPU for this model's shapes when bench/policies has one; "none"
    // or "": the built-in crossovers; anything else: a map file.
    if (options.gpu_gemm_policy == "auto")
      gpu_options.auto_gemm_policy = true;
    else if (!options.gpu_gemm_policy.empty() && options.gpu_gemm_policy != "none")
      gpu_options.gemm_policy = std::make_shared<const gemm::PolicyMap>(gemm::PolicyMap::load(options.gpu_gemm_policy));
    // Throws (naming what is missing: a GPU, sm_80, memory, a supported model) before any request.
    gpu = std::make_unique<GpuLlama>(model, runnable_mode(gpu_mode_name, "gpu_mode"), gpu_options);
    if (options.gpu_gemm_policy == "auto")
      std::fprintf(stderr, "qspec: GEMM policy: %s\n",
                   gpu->gemm_policy_source().empty() ? "built-in crossovers (no map for this GPU and model)"
                                                     : gpu->gemm_policy_source().c_str());
    gpu_slot_owner.assign(static_cast<size_t>(options.max_batch_size), 0);
#else
    fail("engine: device cuda: this qspec was built without the CUDA backend (configure with -DQSPEC_CUDA=ON on a "
         "machine with the CUDA toolkit)");
#endif
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
    QSPEC_CHECK(request.max_new_tokens >= 1, "request: max_new_tokens must be >= 1, got ", request.max_new_tokens);
    for (const std::string& stop : request.stop) QSPEC_CHECK(!stop.empty(), "request: an empty stop string");
    QSPEC_CHECK(request.stop.empty() || tokenizer, "request: stop strings need a tokenizer");
    const DecodePlan& plan = request.plan;
    validate(plan, "request: ");
    seq->qspec = plan.qspec();
    if (seq->qspec) {
      seq->mode = runnable_mode(plan.verify, "verify");
      seq->draft = runnable_mode(plan.draft, "draft");
      QSPEC_CHECK(!on_gpu || plan.kv_overwrite, "request: the no-overwrite ablation (kv_overwrite off) does not "
                  "run on the GPU");
      seq->acceptor.emplace(request.sampling);  // validates the sampling parameters
    } else {
      seq->mode = runnable_mode(plan.mode, "mode");
    }
    seq->sampler.emplace(request.sampling);
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

  RunMode runnable_mode(const std::string& name, const char* field) const {
    RunMode mode;
    try {
      mode = parse_run_mode(name);
    } catch (const Error& e) {
      fail("request: ", field, ": ", e.what());
    }
    mode.activations.group_size = activation_group_size;
    QSPEC_CHECK(!mode.quantized_weights || model.has_quantized_weights(), "request: ", field, " ", name,
                " needs 4-bit weights; the model has none (load it with --weights)");
    QSPEC_CHECK(mode.quantized_weights || model.has_checkpoint_weights(), "request: ", field, " ", name,
                " needs 16-bit weights; the model holds only 4-bit weights");
    QSPEC_CHECK(!mode.activations.arc || model.has_arc(), "request: ", field, " ", name,
                " needs an ARC-calibrated checkpoint (qspec quantize --arc)");
    // On the GPU: the engine's mode, and QSpec drafts in a low-precision activation mode the GPU
    // runs over a 4-bit model's weights.
    const bool gpu_draft = std::string_view(field) == "draft" && gpu_mode_name != "w16a16" && gpu_runs_draft(mode);
    QSPEC_CHECK(!on_gpu || gpu_mode_name.empty() || mode.name == gpu_mode_name || gpu_draft, "request: ", field, " ",
                name, ": this engine runs on the GPU in mode ", gpu_mode_name,
                gpu_mode_name == "w16a16" ? " only"
                                          : " only, with QSpec drafts in a low-precision activation mode (w4a8*, "
                                            "w4a4*)");
    return mode;
  }

  // Whether the GPU model can draft in `mode` (a low-precision activation mode).
  static bool gpu_runs_draft(const RunMode& mode) {
#ifdef QSPEC_HAVE_CUDA
    if (!mode.quantized_weights || mode.activations.kind != ActivationMode::Kind::quantized) return false;
    try {
      (void)gpu_activations(mode);
      return true;
    } catch (const Error&) {
      return false;
    }
#else
    (void)mode;
    return false;
#endif
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

  std::vector<Unit> plan() {
    std::vector<Unit> units;
    int64_t budget = options.max_batch_tokens;
    // Decoding first (one token, or a QSpec cycle of gamma + 1), then prompt chunks.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < running.size(); ++i) {
        Sequence* seq = running[i].get();
        if (seq->finished || seq->decoding() != (pass == 0)) continue;
        Unit unit;
        unit.seq = seq;
        unit.base = seq->kv.length();
        if (pass == 0 && seq->qspec) {
          unit.kind = Unit::Kind::cycle;
          unit.gamma = std::min<int64_t>(seq->gamma, seq->budget - seq->generated() - 1);
          unit.count = unit.gamma + 1;
        } else if (pass == 0) {
          unit.kind = Unit::Kind::decode;
          unit.count = 1;
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

  // Draft passes: per draft mode, step i runs every sequence still drafting, one token each.
  void run_drafts(std::vector<Unit>& units) {
    std::map<std::string, std::vector<Unit*>> by_mode;
    for (Unit& unit : units)
      if (unit.kind == Unit::Kind::cycle && unit.gamma > 0) by_mode[unit.seq->draft.name].push_back(&unit);
    const int64_t vocab = model.config().vocab_size;
    std::vector<SequenceChunk> chunks;
    std::vector<float> logits;
#ifdef QSPEC_HAVE_CUDA
    if (on_gpu && !by_mode.empty()) gpu->begin_chains();
#endif
    for (auto& [name, group] : by_mode) {
      const RunMode& draft = group.front()->seq->draft;
      if (on_gpu) {
        run_drafts_on_gpu(group);
        continue;
      }
      const auto start = Clock::now();
      for (Unit* unit : group) unit->draft_probs.resize(static_cast<size_t>(unit->gamma));
      std::vector<int32_t> inputs(group.size());
      std::vector<int64_t> draft_steps(group.size(), 0);
      for (int64_t i = 0;; ++i) {
        chunks.clear();
        std::vector<Unit*> active;
        for (size_t g = 0; g < group.size(); ++g) {
          Unit* unit = group[g];
          if (i >= unit->gamma || unit->draft_ended) continue;
          inputs[g] = i == 0 ? unit->seq->tokens.back() : unit->drafts.back();
          chunks.push_back(SequenceChunk{std::span<const int32_t>(&inputs[g], 1), unit->base + i,
                                         unit->seq->kv.blocks(pool), SequenceChunk::Logits::last});
          active.push_back(unit);
          ++draft_steps[g];
        }
        if (chunks.empty()) break;
        model.forward_batch(chunks, logits, draft);
        ++totals.forward_passes;
        for (size_t a = 0; a < active.size(); ++a) {
          Unit* unit = active[a];
          const int32_t d = pick_draft(
              *unit, std::span<const float>(logits.data() + static_cast<int64_t>(a) * vocab, static_cast<size_t>(vocab)),
              i);
          unit->drafts.push_back(d);
          if (is_eos(*unit->seq, d)) unit->draft_ended = true;
        }
      }
      record_draft_metrics(group, draft_steps, seconds_between(start, Clock::now()));
      for (Unit* unit : group)
        if (!unit->seq->request.plan.kv_overwrite) save_draft_rows(*unit);
    }
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

  // No-overwrite ablation: the rows the drafts wrote (for last, d_0 .. d_{drafted-2}).
  void save_draft_rows(Unit& unit) {
    const int64_t layers = model.config().num_layers, kv_dim = model.config().kv_dim();
    const int64_t rows = static_cast<int64_t>(unit.drafts.size());
    const KvBlocks blocks = unit.seq->kv.blocks(pool);
    unit.saved_keys.assign(static_cast<size_t>(layers), {});
    unit.saved_values.assign(static_cast<size_t>(layers), {});
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = blocks.row(unit.base + r);
        const float* k = blocks.keys[l] + row * kv_dim;
        const float* v = blocks.values[l] + row * kv_dim;
        unit.saved_keys[l].insert(unit.saved_keys[l].end(), k, k + kv_dim);
        unit.saved_values[l].insert(unit.saved_values[l].end(), v, v + kv_dim);
      }
  }

  void restore_draft_rows(Unit& unit, int64_t rows) {
    const int64_t layers = model.config().num_layers, kv_dim = model.config().kv_dim();
    rows = std::min<int64_t>(rows, static_cast<int64_t>(unit.drafts.size()));
    const KvBlocks blocks = unit.seq->kv.blocks(pool);
    for (int64_t l = 0; l < layers && !unit.saved_keys.empty(); ++l)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = blocks.row(unit.base + r);
        std::copy_n(unit.saved_keys[l].data() + r * kv_dim, kv_dim, blocks.keys[l] + row * kv_dim);
        std::copy_n(unit.saved_values[l].data() + r * kv_dim, kv_dim, blocks.values[l] + row * kv_dim);
      }
  }

  // Target passes: one per run mode over every prompt chunk, decode token and verify run.
  void run_targets(std::vector<Unit>& units) {
    std::map<std::string, std::vector<Unit*>> by_mode;
    for (Unit& unit : units) by_mode[unit.seq->mode.name].push_back(&unit);
    const int64_t vocab = model.config().vocab_size;
    std::vector<SequenceChunk> chunks;
    std::vector<float> logits;
    for (auto& [name, group] : by_mode) {
      chunks.clear();
      for (Unit* unit : group) {
        Sequence& seq = *unit->seq;
        SequenceChunk chunk;
        chunk.start = unit->base;
        chunk.kv = seq.kv.blocks(pool);
        if (unit->kind == Unit::Kind::cycle) {
          unit->target_tokens.assign(1, seq.tokens.back());
          unit->target_tokens.insert(unit->target_tokens.end(), unit->drafts.begin(), unit->drafts.end());
          chunk.logits = SequenceChunk::Logits::all;
        } else {
          unit->target_tokens.assign(seq.tokens.begin() + unit->base, seq.tokens.begin() + unit->base + unit->count);
          const bool last = unit->base + unit->count == static_cast<int64_t>(seq.tokens.size());
          chunk.logits = last ? SequenceChunk::Logits::last : SequenceChunk::Logits::none;
        }
        chunk.tokens = unit->target_tokens;
        chunks.push_back(chunk);
      }
      const auto start = Clock::now();
      if (on_gpu) {
        run_target_on_gpu(group, chunks);
        continue;
      }
      model.forward_batch(chunks, logits, group.front()->seq->mode);
      ++totals.forward_passes;
      const double elapsed = seconds_between(start, Clock::now());
      const float* row = logits.data();
      for (size_t g = 0; g < group.size(); ++g) {
        Unit& unit = *group[g];
        if (unit.kind == Unit::Kind::cycle) {
          commit_cycle(unit, row, elapsed);
          row += static_cast<int64_t>(unit.target_tokens.size()) * vocab;
        } else if (chunks[g].logits == SequenceChunk::Logits::last) {
          commit_token(unit, std::span<const float>(row, static_cast<size_t>(vocab)));
          row += vocab;
        } else {
          unit.seq->kv.set_length(unit.base + unit.count, pool);
        }
      }
    }
  }

  // Whether a sequence's next token is the argmax of its logits (what the GPU returns as ids):
  // greedy without a repetition penalty. Others draw from their logit rows on the host.
  static bool gpu_argmax_suffices(const Sequence& seq) {
    const SamplingParams& sampling = seq.request.sampling;
    return sampling.greedy() && sampling.repetition_penalty == 1.0f;
  }

  // QSpec drafts on the GPU (low-precision activations over the verify's 4-bit weights and KV
  // cache): step i runs every unit still drafting, one token each, through the decode graphs.
  // Greedy drafts are the GPU's argmax ids; sampled drafts are picked on the host from the
  // logit rows as on the CPU.
  void run_drafts_on_gpu(const std::vector<Unit*>& group) {
#ifdef QSPEC_HAVE_CUDA
    const int64_t vocab = model.config().vocab_size;
    const auto start = Clock::now();
    for (Unit* unit : group) unit->draft_probs.resize(static_cast<size_t>(unit->gamma));
    std::vector<int32_t> inputs(group.size());
    std::vector<int64_t> draft_steps(group.size(), 0);
    gpu->set_activations(gpu_activations(group.front()->seq->draft));
    if (draft_chain_on_gpu(group, inputs, draft_steps)) {
      gpu->set_activations(gpu_mode_activations);
      record_draft_metrics(group, draft_steps, seconds_between(start, Clock::now()));
      return;
    }
    for (int64_t i = 0;; ++i) {
      std::vector<GpuLlama::Run> runs;
      std::vector<Unit*> active;
      bool any_sampled = false;
      for (size_t g = 0; g < group.size(); ++g) {
        Unit* unit = group[g];
        if (i >= unit->gamma || unit->draft_ended) continue;
        inputs[g] = i == 0 ? unit->seq->tokens.back() : unit->drafts.back();
        const int64_t slot = gpu_slot(*unit->seq, unit->base);
        if (i == 0) gpu->truncate(slot, unit->base);  // the last cycle's verify rows past base go
        runs.push_back(GpuLlama::Run{slot, std::span<const int32_t>(&inputs[g], 1)});
        active.push_back(unit);
        any_sampled = any_sampled || !gpu_argmax_suffices(*unit->seq);
        ++draft_steps[g];
      }
      if (runs.empty()) break;
      std::vector<int32_t> ids;
      try {
        ids = gpu->step(runs);
      } catch (...) {
        gpu->set_activations(gpu_mode_activations);
        throw;
      }
      ++totals.forward_passes;
      const std::vector<float> logits = any_sampled ? gpu->step_logits() : std::vector<float>{};
      for (size_t a = 0; a < active.size(); ++a) {
        Unit* unit = active[a];
        Sequence& seq = *unit->seq;
        int32_t d = ids[a];
        if (!gpu_argmax_suffices(seq))
          d = pick_draft(*unit, std::span<const float>(logits.data() + static_cast<int64_t>(a) * vocab,
                                                       static_cast<size_t>(vocab)), i);
        unit->drafts.push_back(d);
        if (is_eos(seq, d)) unit->draft_ended = true;
      }
    }
    gpu->set_activations(gpu_mode_activations);
    record_draft_metrics(group, draft_steps, seconds_between(start, Clock::now()));
#else
    (void)group;
#endif
  }

#ifdef QSPEC_HAVE_CUDA
  // Greedy drafts of one gamma for every unit: one GpuLlama::draft_chain_async (the next input
  // of each step is the last step's argmax, on the device). The drafts stay there: the verify
  // step reads them on the device and returns them with its ids, so the host reads once a cycle
  // (run_target_on_gpu). False: not applicable, nothing ran.
  bool draft_chain_on_gpu(const std::vector<Unit*>& group, std::vector<int32_t>& inputs,
                          std::vector<int64_t>& draft_steps) {
    const int64_t gamma = group.front()->gamma;
    if (gamma < 2 || gamma > GpuLlama::kMaxChainSteps) return false;
    for (const Unit* unit : group)
      if (unit->gamma != gamma || unit->draft_ended || !gpu_argmax_suffices(*unit->seq)) return false;
    std::vector<GpuLlama::Run> runs;
    for (size_t g = 0; g < group.size(); ++g) {
      Unit* unit = group[g];
      inputs[g] = unit->seq->tokens.back();
      const int64_t slot = gpu_slot(*unit->seq, unit->base);
      gpu->truncate(slot, unit->base);  // the last cycle's verify rows past base go
      runs.push_back(GpuLlama::Run{slot, std::span<const int32_t>(&inputs[g], 1)});
    }
    int64_t offset = 0;
    try {
      offset = gpu->draft_chain_async(runs, gamma);
    } catch (...) {
      gpu->set_activations(gpu_mode_activations);
      throw;
    }
    totals.forward_passes += gamma;
    const int64_t n = static_cast<int64_t>(group.size());
    for (int64_t g = 0; g < n; ++g) {
      Unit* unit = group[static_cast<size_t>(g)];
      unit->chain_offset = offset + g;
      unit->chain_stride = n;
      unit->drafts.assign(static_cast<size_t>(gamma), unit->seq->tokens.back());  // placeholders (valid ids)
      draft_steps[static_cast<size_t>(g)] = gamma;
    }
    return true;
  }

  // A unit's device drafts from the ids its verify step read back; drafts past an eos id are
  // dropped, as the step-by-step loop never drafts them (their K/V rows lie inside the cycle's
  // reservation, and the verify's ids before them do not depend on them).
  void take_chain_drafts(Unit& unit) {
    const std::vector<int32_t>& chain = gpu->last_chain_ids();
    const int64_t gamma = static_cast<int64_t>(unit.drafts.size());
    unit.drafts.clear();
    for (int64_t i = 0; i < gamma && !unit.draft_ended; ++i) {
      const int32_t d = chain[static_cast<size_t>(unit.chain_offset + i * unit.chain_stride)];
      unit.drafts.push_back(d);
      if (is_eos(*unit.seq, d)) unit.draft_ended = true;
    }
    unit.chain_offset = -1;
  }
#endif

  // The GPU pass of one mode's group. Each sequence runs in its own cache slot; the GPU returns
  // the argmax id after each run's last token (after every token of a QSpec verify run), which
  // is the next token of a greedy request without a repetition penalty (the argmax of the same
  // f16 logits the CPU would sample from); other requests get their logit rows. A verify run
  // rewrites the K/V its drafts wrote (the slot is truncated to the cycle's base first).
  void run_target_on_gpu(const std::vector<Unit*>& group, const std::vector<SequenceChunk>& chunks) {
#ifdef QSPEC_HAVE_CUDA
    const auto start = Clock::now();
    std::vector<GpuLlama::Run> runs;
    runs.reserve(group.size());
    std::vector<int64_t> first_row(group.size());  // each run's first id / logit row
    std::vector<size_t> sampled;  // plain runs whose next token is drawn from their logit row
    bool need_logits = false;
    int64_t rows = 0;
    for (size_t g = 0; g < group.size(); ++g) {
      Unit& unit = *group[g];
      const bool cycle = unit.kind == Unit::Kind::cycle;
      const int64_t slot = gpu_slot(*unit.seq, unit.base);
      gpu->truncate(slot, unit.base);  // rows past base (a preempted sequence's, or drafts) are rewritten
      runs.push_back(GpuLlama::Run{slot, unit.target_tokens, cycle, cycle ? unit.chain_offset : -1,
                                   cycle ? unit.chain_stride : 0});
      first_row[g] = rows;
      rows += cycle ? static_cast<int64_t>(unit.target_tokens.size()) : 1;
      const bool host_pick = !gpu_argmax_suffices(*unit.seq);
      if (cycle) need_logits = need_logits || host_pick;
      else if (chunks[g].logits == SequenceChunk::Logits::last && host_pick) sampled.push_back(g);
    }
    gpu->set_activations(gpu_mode_activations);
    const std::vector<int32_t> ids = gpu->step(runs);
    ++totals.forward_passes;
    std::vector<int32_t> next(group.size());
    for (size_t g = 0; g < group.size(); ++g) next[g] = ids[static_cast<size_t>(first_row[g])];
    if (options.gpu_sampling && !sampled.empty()) {
      sample_on_gpu(group, sampled, first_row, next);
      sampled.clear();
    }
    need_logits = need_logits || !sampled.empty();
    const std::vector<float> logits = need_logits ? gpu->step_logits() : std::vector<float>{};
    const double elapsed = seconds_between(start, Clock::now());
    // Sampled rows draw in parallel (each sequence owns its sampler; a 128k-entry row is ~1 ms
    // of filtering), then every token is emitted in order on this thread.
    const int64_t vocab = model.config().vocab_size;
    ThreadPool::global().parallel_for(sampled.size(), 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const size_t g = sampled[i];
        Sequence& seq = *group[g]->seq;
        const std::span<const float> row(logits.data() + first_row[g] * vocab, static_cast<size_t>(vocab));
        next[g] = seq.sampler->sample(row, seq.tokens);
      }
    });
    for (size_t g = 0; g < group.size(); ++g) {
      Unit& unit = *group[g];
      Sequence& seq = *unit.seq;
      if (unit.kind == Unit::Kind::cycle) {
        if (unit.chain_offset >= 0) take_chain_drafts(unit);
        if (!gpu_argmax_suffices(seq)) {
          commit_cycle(unit, logits.data() + first_row[g] * vocab, elapsed);
        } else {
          const std::span<const int32_t> verify_ids(ids.data() + first_row[g], unit.drafts.size() + 1);
          commit_cycle(unit, QSpecAcceptor::accept_greedy(unit.drafts, verify_ids), elapsed);
        }
        continue;
      }
      seq.kv.set_length(unit.base + unit.count, pool);
      if (chunks[g].logits == SequenceChunk::Logits::last) emit(seq, next[g]);
    }
#else
    (void)group;
    (void)chunks;
#endif
  }

#ifdef QSPEC_HAVE_CUDA
  // The next tokens of plain sampled rows, drawn on the GPU from the last step's logits: each
  // sequence's generator gives the draw its host Sampler would have used (none when greedy), and
  // the repetition penalty gets the prompt and output ids (the kernel applies each id once).
  void sample_on_gpu(const std::vector<Unit*>& group, const std::vector<size_t>& sampled,
                     const std::vector<int64_t>& first_row, std::vector<int32_t>& next) {
    std::vector<GpuLlama::RowSample> rows(sampled.size());
    for (size_t i = 0; i < sampled.size(); ++i) {
      Sequence& seq = *group[sampled[i]]->seq;
      GpuLlama::RowSample& row = rows[i];
      row.row = first_row[sampled[i]];
      row.params = seq.sampler->params();
      if (!row.params.greedy()) row.draw = seq.sampler->next_draw();
      row.penalised_ids = seq.tokens;  // read by sample_rows only when the penalty is on
    }
    const std::vector<int32_t> ids = gpu->sample_rows(rows);
    for (size_t i = 0; i < sampled.size(); ++i) next[sampled[i]] = ids[i];
  }

  // The GPU cache slot of a sequence: the one it holds, else a free one (a slot whose request is
  // no longer running), which it may only take at position 0.
  int64_t gpu_slot(const Sequence& seq, int64_t base) {
    for (size_t s = 0; s < gpu_slot_owner.size(); ++s)
      if (gpu_slot_owner[s] == seq.id) return static_cast<int64_t>(s);
    std::unordered_set<RequestId> alive;
    for (const auto& r : running) alive.insert(r->id);
    for (size_t s = 0; s < gpu_slot_owner.size(); ++s)
      if (gpu_slot_owner[s] == 0 || alive.count(gpu_slot_owner[s]) == 0) {
        QSPEC_CHECK(base == 0, "engine: request ", seq.id, " lost its GPU cache slot at position ", base);
        gpu_slot_owner[s] = seq.id;
        return static_cast<int64_t>(s);
      }
    fail("engine: every GPU cache slot is taken (", gpu_slot_owner.size(), " slots)");
  }
#endif

  // A prompt's last chunk or a decode token: the next token from the last logit row.
  void commit_token(Unit& unit, std::span<const float> row) {
    Sequence& seq = *unit.seq;
    seq.kv.set_length(unit.base + unit.count, pool);
    std::vector<float> probs;
    const int32_t next = seq.qspec ? seq.acceptor->pick(row, seq.tokens, &probs) : seq.sampler->sample(row, seq.tokens);
    emit(seq, next);
  }

  void commit_cycle(Unit& unit, const float* verify_logits, double verify_seconds) {
    Sequence& seq = *unit.seq;
    commit_cycle(unit,
                 seq.acceptor->accept(unit.drafts, unit.draft_probs, verify_logits, model.config().vocab_size, seq.tokens),
                 verify_seconds);
  }

  void commit_cycle(Unit& unit, const QSpecAcceptor::Outcome& outcome, double verify_seconds) {
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
    int64_t emitted = 0;
    for (int64_t i = 0; i < outcome.accepted && !seq.finished; ++i, ++emitted) emit(seq, unit.drafts[static_cast<size_t>(i)]);
    if (!seq.finished) {
      emit(seq, outcome.next);
      ++emitted;
    }
    // The cache keeps every committed token but the last; rows of rejected drafts are dropped.
    seq.kv.truncate(pool, unit.base + emitted);
    if (seq.request.plan.adaptive_gamma && drafted > 0) {
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

  void emit(Sequence& seq, int32_t id) {
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
      if (seq.event.tokens.empty() && !seq.event.finished) return;
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
int64_t Engine::context_limit() const { return impl_->context_limit; }

std::vector<int32_t> Engine::tokenize(const std::string& text) const {
  QSPEC_CHECK(impl_->tokenizer, "engine: no tokenizer loaded");
  const Tokenizer& t = *impl_->tokenizer;
  return t.encode(text, t.add_bos_by_default && t.bos_id.has_value());
}

}  // namespace qspec
