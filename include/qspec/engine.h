// The qspec engine API: submit requests, get their tokens streamed back, cancel them, read
// metrics. One engine serves many requests with continuous batching (ORCA-style): every step
// runs one forward pass per activation mode over all running sequences -- prefill chunks,
// single decode tokens and QSpec verify passes together -- on a paged KV cache, and a
// finished sequence's slot and blocks are refilled at the next step. The CLI's `generate`
// and the HTTP server sit on this API.
//
// Batch composition never changes a sequence's tokens: every row of a batched forward pass is
// computed exactly as it would be alone, and each request samples from its own seeded state.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qspec/decode_plan.h"
#include "qspec/error.h"
#include "qspec/metrics.h"
#include "qspec/sampling.h"

namespace qspec {

class Backend;
class LlamaModel;
class Tokenizer;

struct EngineOptions {
  int64_t max_batch_size = 16;     // running sequences at a time
  int64_t max_batch_tokens = 512;  // tokens of one step; prompt chunks fill what decoding leaves
  int64_t prefill_chunk = 256;     // prompt tokens of one sequence in one step (chunked prefill)
  // Benchmarks only: no decoding while a running sequence still has prompt tokens to prefill, so
  // every step is prompt chunks or decoding, never both (`qspec bench --replay-prefill-first`
  // times a batch's decoding alone). Serving keeps it off: a new request would stall the others.
  bool prefill_first = false;
  int64_t kv_blocks = 0;           // blocks in the pool; 0: room for max_batch_size full contexts,
                                   // capped at kv_memory_bytes
  int64_t kv_block_size = 16;      // positions per block
  size_t kv_memory_bytes = size_t{1} << 30;  // cap for the automatic kv_blocks
  int64_t activation_group_size = 0;  // int4 activations: 0 = the int4 weights' group size
  int64_t max_waiting = 0;         // queued requests beyond which submit throws QueueFull; 0: no bound
  // Where the forward passes run: "cpu", or "cuda" (builds with the CUDA backend). On the GPU
  // the engine runs one mode, gpu_mode ("" = w4a16 when the model has 4-bit weights, else
  // w16a16); requests for other modes are refused at submit, except QSpec requests that
  // verify in that mode (4-bit) and draft in a low-precision activation mode (the
  // kv_overwrite-off ablation is CPU-only). Each of the max_batch_size sequences gets a GPU
  // cache slot of max_context positions; weights and cache are sized and checked against the
  // GPU's free memory when the engine is built.
  std::string device = "cpu";
  std::string gpu_mode;
  // Positions a sequence may hold, prompt and output (vLLM's --max-model-len, llama.cpp's
  // --ctx-size); 0: the model's max_position_embeddings. It sizes the KV cache on both devices.
  int64_t max_context = 0;
  // A GEMM policy map made by `qspec tune` on this GPU (ADAngel's dispatcher picks each 4-bit
  // GEMM's kernel from it); "auto": the map for this GPU and model in bench/policies (or
  // $QSPEC_GEMM_POLICY_DIR) when there is one; "" or "none": the kernels' built-in crossovers.
  std::string gpu_gemm_policy;
  // On the GPU, plain requests that sample (temperature, top_k / top_p / min_p, repetition
  // penalty) draw their tokens on the device from their generator's draws, as the host Sampler
  // would (cuda::sample_logits_f16): no logit rows cross to the host. false: the rows are copied
  // and the host samples (the A/B baseline). QSpec cycles that sample stay on the host
  // (rejection sampling needs both distributions).
  bool gpu_sampling = true;
  // The step costs QSpec requests with draft "auto" are planned with (runtime/qspec_costs.h, made
  // by `qspec bench --qspec-costs-out`): a table file; "auto": the table for this device and
  // model in bench/policies (or $QSPEC_GEMM_POLICY_DIR) when there is one; "" or "none": no table
  // (the planner's fallback: n-gram drafts where a sequence's probed acceptance pays, else plain
  // W4A16). A table that does not match the device or the model is refused at construction.
  std::string qspec_costs;
  // What the KV cache stores (`--kv-cache`): "f16", each backend's full-precision rows (f32 on the
  // CPU), or "int8", 8-bit codes per (position, KV head) row with an f16 scale (ops/kv_int8.h):
  // ~3.8x the positions of the CPU's f32 rows in the same memory, for every mode, and what QSpec
  // drafts with the 4-bit view (DecodePlan::draft_kv4, `/k4`) need. Engine-wide: every request
  // shares the cache. Both backends store both (the GPU's int8 attention is correct but not yet
  // faster than its f16 one: docs/perf-notes.md, "The 8-bit KV cache").
  std::string kv_cache = "f16";
  // Diagnosis (`qspec bench --replay-planner-trace`): a file that gets, appended, one JSON line a
  // draft-auto plan (the batch's size and contexts, the plan, its predicted gain, why) and one a
  // W4A16 pass the planner times or leaves out (sequences, tokens, milliseconds, and whether it
  // was a one-off or carried a prompt chunk). "": none.
  std::string planner_trace;
};

// A request: its prompt, sampling, limits and decode plan (qspec/decode_plan.h: plain decoding
// in one mode, or QSpec).
struct Request {
  std::vector<int32_t> prompt;  // token ids (Engine::tokenize turns text into them)
  SamplingParams sampling;
  int64_t max_new_tokens = 128;
  bool ignore_eos = false;           // do not stop at the model's eos ids
  std::vector<int32_t> stop_ids;     // extra stop ids (kept in the output, like eos)
  std::vector<std::string> stop;     // stop strings (needs a tokenizer): output ends before them
  DecodePlan plan;
  // Log-probabilities (qspec/sampling.h's TokenLogprob: the model's own distribution at each
  // position, the verify's in QSpec): -1 none; 0..kMaxTopLogprobs: each output token's, with
  // that many most likely alternatives.
  int32_t logprobs = -1;
  // Also each prompt token's from the second on (the first has no context), with
  // max(logprobs, 0) alternatives: the prompt's rows of logits are kept (PassRun::Output::all),
  // which only such requests pay for. Then max_new_tokens may be 0 (scoring only: the request
  // finishes with "length" once its prompt is scored).
  bool prompt_logprobs = false;
};

using RequestId = uint64_t;

struct RequestMetrics {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;            // times its KV blocks were taken back (then recomputed)
  double queue_seconds = 0;           // submit -> first scheduled
  double time_to_first_token = 0;     // submit -> first token
  double total_seconds = 0;           // submit -> finished
  double decode_tokens_per_second() const {
    const double decode = total_seconds - time_to_first_token;
    return generated_tokens > 1 && decode > 0 ? static_cast<double>(generated_tokens - 1) / decode : 0.0;
  }
  QSpecMetrics qspec;  // mode qspec only
};

// What a request's callback receives: once per step that produced tokens, and once with
// finished = true (possibly together with the last tokens).
struct TokenEvent {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // ids committed in this step (QSpec commits several at once)
  std::string text;             // their text, minus anything a stop string may still claim
  bool finished = false;
  // "eos", "stop" (stop id or string), "length", "context", "cancelled", "error"
  std::string finish_reason;
  std::string error;            // finish_reason "error": what went wrong
  std::vector<TokenLogprob> logprobs;         // one per `tokens` entry, when the request asked (logprobs >= 0)
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1, 2, ... as their chunks ran (prompt_logprobs)
  const RequestMetrics* metrics = nullptr;  // set when finished
};
using TokenCallback = std::function<void(const TokenEvent&)>;

struct EngineMetrics {
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  int64_t requests_rejected = 0;  // QueueFull
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t steps = 0, forward_passes = 0, preemptions = 0;
  int64_t running = 0, waiting = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  size_t kv_cache_bytes = 0;  // the host pool's rows (0 when they live on the device)
  double busy_seconds = 0;  // time spent in steps
  QSpecMetrics qspec;       // summed over finished qspec requests (draft/verify seconds per request)
  std::vector<int64_t> batch_size_histogram;  // steps by running sequences
  double generated_tokens_per_second() const {
    return busy_seconds > 0 ? static_cast<double>(generated_tokens) / busy_seconds : 0.0;
  }
};

// Thrown by submit when max_waiting requests are already queued (an HTTP server answers 429).
class QueueFull : public Error {
 public:
  using Error::Error;
};

class Engine {
 public:
  // The model (and tokenizer, when given) must outlive the engine. Without a tokenizer,
  // events carry no text and stop strings are refused.
  Engine(const LlamaModel& model, const Tokenizer* tokenizer, const EngineOptions& options = {});
  // Over a backend the caller built (runtime/backend.h) instead of options.device's: a GPU model
  // made elsewhere (the benchmark's synthetic full-size models, with LlamaModel::without_weights
  // for their shapes), or a backend wrapped by a test or benchmark. Null: options.device's.
  Engine(const LlamaModel& model, const Tokenizer* tokenizer, const EngineOptions& options,
         std::unique_ptr<Backend> backend);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks the request (prompt within the context, modes known and runnable on the loaded
  // weights, sampling parameters, gamma) and queues it; throws qspec::Error naming the field
  // at fault, QueueFull when the queue is full. Thread-safe. The callback runs on the thread
  // that runs step() and must not block for long.
  RequestId submit(Request request, TokenCallback on_event);
  // Finishes the request with "cancelled" at the next step and frees its blocks; false when
  // it is unknown or already finished. Thread-safe.
  bool cancel(RequestId id);

  // Synchronous driving: one scheduling step (admit, one forward pass per mode, emit);
  // false when there was nothing to do. run_until_idle() steps until every request finished.
  bool step();
  void run_until_idle();

  // Background driving: a thread steps while there is work and sleeps otherwise. stop()
  // drains (lets every queued and running request finish) or, with drain = false, cancels
  // them; it returns when the thread has ended. Do not mix with step().
  void start();
  void stop(bool drain = true);

  EngineMetrics metrics() const;  // a snapshot; thread-safe
  // Positions a sequence may hold (options.max_context, else the model's context).
  int64_t context_limit() const;
  const EngineOptions& options() const;
  // What draft "auto" plans with, in a line: the step-cost table and its drafts, or the fallback.
  std::string qspec_planner() const;

  // Text -> prompt ids with the model's bos convention (needs a tokenizer).
  std::vector<int32_t> tokenize(const std::string& text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qspec
