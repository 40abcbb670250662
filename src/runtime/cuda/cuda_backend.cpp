// The engine's GPU backend (runtime/backend.h; CUDA builds only): GpuLlama runs the engine's one
// target mode (w4a16 on a 4-bit model, else w16a16) and, on 4-bit models, QSpec drafts in a
// low-precision activation mode over the same weights and KV cache. Each sequence holds one
// of max_batch_size GPU cache slots of max_context positions; the engine's pool only counts
// blocks. A pass returns the argmax id of every row (the next token of a greedy request); logit
// rows cross to the host only when asked, and sampled rows can be drawn on the device.
#include "runtime/cuda/cuda_backend.h"

#include <cstdio>

#include "model/cuda/llama_gpu.h"
#include "ops/cuda/device.h"
#include "qspec/decode_plan.h"
#include "qspec/engine.h"
#include "runtime/backend.h"

namespace qspec {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(const LlamaModel& model, const RunMode& mode, const EngineOptions& options, int64_t context_limit)
      : mode_(mode), target_(gpu_activations(mode)), draft_vocab_(model.draft_vocab()) {
    GpuLlamaOptions gpu_options = engine_gpu_options(options, context_limit);
    // "auto": a map tuned on this GPU for this model's shapes when bench/policies has one; "none"
    // or "": the built-in crossovers; anything else: a map file.
    if (options.gpu_gemm_policy == "auto")
      gpu_options.auto_gemm_policy = true;
    else if (!options.gpu_gemm_policy.empty() && options.gpu_gemm_policy != "none")
      gpu_options.gemm_policy = std::make_shared<const gemm::PolicyMap>(gemm::PolicyMap::load(options.gpu_gemm_policy));
    // Throws (naming what is missing: a GPU, sm_80, memory, a supported model) before any request.
    owned_ = std::make_unique<GpuLlama>(model, mode, gpu_options);
    gpu_ = owned_.get();
    if (options.gpu_gemm_policy == "auto")
      std::fprintf(stderr, "qspec: GEMM policy: %s\n",
                   gpu_->gemm_policy_source().empty() ? "built-in crossovers (no map for this GPU and model)"
                                                      : gpu_->gemm_policy_source().c_str());
    slot_owner_.assign(static_cast<size_t>(options.max_batch_size), 0);
  }

  // Over a GPU model built elsewhere: sequence s + 1 in slot s (GpuSlots::fixed), or every slot free.
  CudaBackend(GpuLlama& gpu, const RunMode& mode, GpuSlots slots)
      : mode_(mode), target_(gpu_activations(mode)), gpu_(&gpu) {
    for (int64_t s = 0; s < gpu.max_seqs(); ++s)
      slot_owner_.push_back(slots == GpuSlots::fixed ? static_cast<uint64_t>(s + 1) : 0);
  }

  // The engine's mode, and QSpec drafts in a low-precision activation mode over a 4-bit
  // model's weights.
  void check_mode(const RunMode& mode, const std::string& field) const override {
    const bool draft = field == "draft" && mode_.name != "w16a16" && runs_draft(mode);
    QSPEC_CHECK(mode.name == mode_.name || draft, "request: ", field, " ", mode.name,
                ": this engine runs on the GPU in mode ", mode_.name,
                mode_.name == "w16a16" ? " only"
                                       : " only, with QSpec drafts in a low-precision activation mode (w4a8*, "
                                         "w4a4*)");
    // GpuLlama's layer loop fuses each layer's residual add into the next layer's norm and is
    // captured in CUDA graphs: it has no way to leave a layer out yet.
    QSPEC_CHECK(mode.skip_layers == 0, "request: draft_skip ", mode.skip_layers,
                ": layer skipping drafts run on the CPU only (the GPU model runs every layer)");
    // A draft mode these weights cannot run (int4-asym: f16 activations only), refused at submit.
    if (mode.name != mode_.name) gpu_->check_activations(gpu_activations(mode));
  }
  bool kv_in_pool() const override { return false; }
  std::string device_name() const override { return cuda::device_name(); }
  // Its logit rows a step are bounded (GpuLlama's max_logit_rows, a few per sequence), below a
  // prompt chunk's.
  bool scores_prompts() const override { return false; }

  PassResult forward(const RunMode& mode, std::span<const PassRun> runs) override {
    PassResult result;
    std::vector<GpuLlama::Run> gpu_runs = to_gpu_runs(runs);
    int64_t rows = 0;
    for (const PassRun& run : runs) {
      result.first_row.push_back(rows);
      rows += run.output == PassRun::Output::all ? static_cast<int64_t>(run.tokens.size()) : 1;
    }
    use(mode);
    const int64_t graphs = gpu_->graphs_captured();
    result.ids = gpu_->step(gpu_runs);
    result.one_off = gpu_->graphs_captured() != graphs;
    return result;
  }

  std::vector<float> logits() override { return gpu_->step_logits(); }

  std::optional<int64_t> draft_chain(const RunMode& mode, std::span<const PassRun> runs, int64_t steps) override {
    if (steps < 2 || steps > GpuLlama::kMaxChainSteps) return std::nullopt;
    const std::vector<GpuLlama::Run> gpu_runs = to_gpu_runs(runs);
    use(mode);
    return gpu_->draft_chain_async(gpu_runs, steps);
  }
  void begin_step() override { gpu_->begin_chains(); }
  const std::vector<int32_t>& chain_ids() const override { return gpu_->last_chain_ids(); }

  bool samples_on_device() const override { return true; }
  std::vector<int32_t> sample_rows(std::span<const RowDraw> rows) override {
    std::vector<GpuLlama::RowSample> samples(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      samples[i] = GpuLlama::RowSample{rows[i].row, rows[i].params, rows[i].draw, rows[i].penalised_ids};
    return gpu_->sample_rows(samples);
  }

  void release(uint64_t sequence) override {
    for (uint64_t& owner : slot_owner_)
      if (owner == sequence) owner = 0;
  }

 private:
  // Whether the GPU drafts in `mode` (a low-precision activation mode on the 4-bit weights).
  static bool runs_draft(const RunMode& mode) {
    if (!mode.quantized_weights || mode.activations.kind != ActivationMode::Kind::quantized) return false;
    try {
      (void)gpu_activations(mode);
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  // The activation precision and the cache view of the next steps.
  void use(const RunMode& mode) {
    const GpuActivations activations = mode.name == mode_.name ? target_ : gpu_activations(mode);
    if (gpu_->activations() != activations) gpu_->set_activations(activations);
    gpu_->set_kv_view(mode.kv_window, mode.kv_sinks);
    gpu_->set_kv_cache_view(mode.kv_high_nibble ? KvView::high_nibble : KvView::full);  // a /k4 draft
    if (mode.vocab_subset > gpu_->draft_vocab_rows()) {
      // The model's draft vocabulary table on the device, on the first draft that asks for it
      // (a model built elsewhere brings its own, GpuLlama::set_draft_vocab).
      QSPEC_CHECK(draft_vocab_ && static_cast<int64_t>(draft_vocab_->ids.size()) >= mode.vocab_subset,
                  "request: draft_vocab ", mode.vocab_subset, ": the GPU model has no draft vocabulary table that "
                  "holds it");
      gpu_->set_draft_vocab(draft_vocab_->ids);
    }
    gpu_->set_vocab_subset(mode.vocab_subset);
  }

  // Each run in its sequence's slot, the slot's rows past the run's base forgotten (a preempted
  // sequence's, or the drafts a verify rewrites).
  std::vector<GpuLlama::Run> to_gpu_runs(std::span<const PassRun> runs) {
    std::vector<GpuLlama::Run> gpu_runs;
    gpu_runs.reserve(runs.size());
    for (const PassRun& run : runs) {
      const int64_t slot = slot_of(run.sequence, run.base);
      gpu_->truncate(slot, run.base);
      gpu_runs.push_back(GpuLlama::Run{slot, run.tokens, run.output == PassRun::Output::all, run.chain_offset,
                                       run.chain_stride});
    }
    return gpu_runs;
  }

  // The slot a sequence holds, else a free one, which it may only take at position 0.
  int64_t slot_of(uint64_t sequence, int64_t base) {
    for (size_t s = 0; s < slot_owner_.size(); ++s)
      if (slot_owner_[s] == sequence) return static_cast<int64_t>(s);
    for (size_t s = 0; s < slot_owner_.size(); ++s)
      if (slot_owner_[s] == 0) {
        QSPEC_CHECK(base == 0, "engine: request ", sequence, " lost its GPU cache slot at position ", base);
        slot_owner_[s] = sequence;
        return static_cast<int64_t>(s);
      }
    fail("engine: every GPU cache slot is taken (", slot_owner_.size(), " slots)");
  }

  RunMode mode_;
  GpuActivations target_;
  const DraftVocabTable* draft_vocab_ = nullptr;  // the model's, for drafts with a vocabulary subset
  std::unique_ptr<GpuLlama> owned_;  // null when the caller owns the model
  GpuLlama* gpu_ = nullptr;
  std::vector<uint64_t> slot_owner_;  // the sequence in each cache slot; 0: free
};

}  // namespace

GpuLlamaOptions engine_gpu_options(const EngineOptions& options, int64_t context_limit) {
  GpuLlamaOptions gpu_options;
  gpu_options.max_seqs = options.max_batch_size;
  gpu_options.max_context = context_limit;
  gpu_options.max_step_tokens = std::max(options.max_batch_tokens, options.max_batch_size);
  // QSpec verify runs return a logit row per token: gamma + 1 a sequence.
  gpu_options.max_logit_rows = options.max_batch_size * (decode_rules::kMaxGamma + 1);
  const std::optional<KvCacheFormat> kv_cache = parse_kv_cache_format(options.kv_cache);
  QSPEC_CHECK(kv_cache, "engine: kv_cache must be f16 or int8, got '", options.kv_cache, "'");
  gpu_options.kv_cache = *kv_cache;
  return gpu_options;
}

std::unique_ptr<Backend> make_cuda_backend(const LlamaModel& model, const RunMode& mode, const EngineOptions& options,
                                           int64_t context_limit) {
  return std::make_unique<CudaBackend>(model, mode, options, context_limit);
}

std::unique_ptr<Backend> make_cuda_backend(GpuLlama& gpu, const RunMode& mode, GpuSlots slots) {
  return std::make_unique<CudaBackend>(gpu, mode, slots);
}

}  // namespace qspec
