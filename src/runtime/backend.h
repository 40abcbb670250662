// The seam between the engine's scheduler (runtime/engine.cpp) and a device. The scheduler
// admits, batches, preempts, samples, accepts QSpec drafts and streams; a Backend only computes:
// forward passes over runs of sequences, greedy draft chains kept on the device, sampling on the
// device, and the KV operations the scheduler needs. Two implementations: the CPU's
// (runtime/cpu_backend.cpp: K/V rows in the engine's block pool, LlamaModel::forward_batch) and
// the GPU's (runtime/cuda/cuda_backend.cpp, CUDA builds: each sequence in a GPU cache slot,
// GpuLlama). No backend-specific code lives in the scheduler.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/llama.h"
#include "qspec/sampling.h"

namespace qspec {

struct EngineOptions;

// One sequence's tokens in a forward pass.
struct PassRun {
  uint64_t sequence = 0;  // the request id: a backend may keep state per sequence (a GPU cache slot)
  int64_t base = 0;       // positions in its cache before the pass: rows base .. are (re)written
  std::span<const int32_t> tokens;
  KvBlocks kv;            // its blocks in the engine's pool (a host backend's K/V rows)
  // The rows of output the run needs: none (a prompt chunk that is not the last), last (the next
  // token) or all (a QSpec verify: the target's pick after every token; a prompt chunk of a
  // request that asked for prompt logprobs, Backend::scores_prompts).
  enum class Output { none, last, all } output = Output::last;
  // A verify whose drafts are still on the device (Backend::draft_chain): tokens[1 + i] are
  // placeholders for chain id chain_offset + i * chain_stride.
  int64_t chain_offset = -1;
  int64_t chain_stride = 0;
};

// What a forward pass leaves: its output rows, runs in order.
struct PassResult {
  std::vector<int64_t> first_row;  // run r's first row
  // The argmax id of every row (the next token of a greedy request without a repetition
  // penalty); empty when the backend gives logit rows only (Backend::logits).
  std::vector<int32_t> ids;
  // The pass paid a one-time cost (the GPU captured a CUDA graph for its shape), so its time says
  // nothing about the next pass of that shape: the planner's measured costs leave it out.
  bool one_off = false;
};

// A row of the last pass's logits to draw a token from on the device (Backend::sample_rows).
struct RowDraw {
  int64_t row = 0;
  SamplingParams params;
  double draw = 0;                         // Sampler::next_draw() (unused when greedy)
  std::span<const int32_t> penalised_ids;  // ids the repetition penalty applies to
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Throws qspec::Error naming `field` when `mode` does not run here as a target ("mode",
  // "verify") or as a QSpec draft ("draft").
  virtual void check_mode(const RunMode& mode, const std::string& field) const = 0;
  // Whether the engine's KV pool holds the K/V rows (with storage); else they live on the
  // device and the pool only counts blocks.
  virtual bool kv_in_pool() const = 0;
  // The machine whose step costs this backend has, as step-cost tables name it
  // (runtime/qspec_costs.h): the GPU's name, or the CPU's model and thread count.
  virtual std::string device_name() const = 0;

  // One forward pass in `mode` over `runs` (one GEMM per projection over all their tokens),
  // writing their K/V from each run's base.
  virtual PassResult forward(const RunMode& mode, std::span<const PassRun> runs) = 0;
  // Every logit row of the last pass (vocab floats a row, PassResult::first_row's layout); call
  // it at most once a pass. A backend that gives ids copies the rows only when asked.
  virtual std::vector<float> logits() = 0;

  // Greedy QSpec drafts without a host round trip a step: `steps` one-token passes in `mode`,
  // each run fed its own argmax of the pass before, on the device. Returns the chain's offset
  // (run r's draft i is chain id offset + i * runs.size() + r, read back by the verify pass
  // that names it, chain_ids()), or nothing when the backend has no device chains (the
  // scheduler then drafts pass by pass). Chains accumulate until begin_step().
  virtual std::optional<int64_t> draft_chain(const RunMode& mode, std::span<const PassRun> runs, int64_t steps) {
    (void)mode, (void)runs, (void)steps;
    return std::nullopt;
  }
  virtual void begin_step() {}
  // Every chain id of this step, as read back by the last pass that verified some.
  virtual const std::vector<int32_t>& chain_ids() const { return no_chain_ids_; }

  // Whether forward() gives every row of a prompt chunk (Output::all over up to prefill_chunk
  // tokens) for requests that score their prompt (Request::prompt_logprobs); false: they are
  // refused at submit.
  virtual bool scores_prompts() const { return true; }

  // Whether sample_rows draws tokens on the device (the logit rows never cross to the host).
  virtual bool samples_on_device() const { return false; }
  // Draws from rows of the last pass's logits, as Sampler::sample_with_draw would.
  virtual std::vector<int32_t> sample_rows(std::span<const RowDraw> rows);

  // A sequence left the device (finished or preempted): its state there may be reused.
  virtual void release(uint64_t sequence) { (void)sequence; }

 private:
  std::vector<int32_t> no_chain_ids_;
};

// The CPU backend, over every mode the model's weights allow.
std::unique_ptr<Backend> make_cpu_backend(const LlamaModel& model);
// "cpu: MODEL NAME, N threads" (/proc/cpuinfo's model name, the global thread pool's size): a CPU
// step costs what its cores and the threads it runs on give.
std::string cpu_device_name();
// The GPU backend, running `mode` (and QSpec drafts beside it on a 4-bit model) for
// options.max_batch_size sequences of context_limit positions. Throws, naming what is missing,
// when this build has no CUDA backend or the machine no suitable GPU, or the model does not fit.
std::unique_ptr<Backend> make_cuda_backend(const LlamaModel& model, const RunMode& mode, const EngineOptions& options,
                                           int64_t context_limit);
// Whether the GPU backend stores a KV cache of `format` (EngineOptions::kv_cache); the engine
// refuses the others when it is built, before any request.
bool cuda_stores_kv_cache(KvCacheFormat format);

}  // namespace qspec
