// The forward pass of a Llama-family model on the GPU (CUDA builds only: compiled into
// qspec_core when QSPEC_HAVE_CUDA). Plain C++ over ops/cuda/ops.h: f16 activations and residual
// stream, f32 statistics and accumulation; W16A16 through cuBLAS (checkpoint weights converted
// to f16 at upload), W4A16 through the packed 4-bit kernels (ops/w4a16_pack.h); q/k/v and
// gate/up fused into one GEMM each. Several sequences at once, each with its own paged KV cache
// (sequence s owns blocks s * blocks_per_seq ...); a step runs any mix of prefill chunks, decode
// tokens and multi-token verify runs. Decode steps (one token per sequence, sequences 0..B-1)
// replay a CUDA graph captured once per (B, context bucket): one launch, no host work per layer.
// Its reference is LlamaModel::forward (CPU, f32).
//
// Modes w16a16, w4a16 and the low-precision activations on the same 4-bit weights: w4a8 (per-token
// int8, s8 mma), w4a4 / w4a4-int4 (int4 groups, s8 mma), w4a8-fp8, w4a4-nvfp4, w4a4-mxfp4
// (emulated exactly on f16 mma); quantized values bitwise the CPU's (ops/cuda/ops.h
// quantize_activations); the lm_head stays f16 in every mode. A 4-bit model switches activation
// precision between steps (set_activations): QSpec drafts in a low precision and verifies in f16
// over one weight set and one KV cache.
// ARC-calibrated checkpoints run in every mode: each projection's input is reordered into its
// augmented width (ops.h gather_columns), and the *-arc modes quantize the outlier channels'
// residuals into the augmented columns (ops.h quantize_activations), as LlamaModel::site_input.
// Families (io/model_config.h LayerRecipe): Llama, Mistral, Qwen2 (q/k/v biases, added in the
// RoPE step: cuda::QkvPrologue), Qwen3 (per-head q/k RMSNorm, there too) and Gemma 3 ((1 + w)
// norms folded into the weights at load, output norms, GeGLU, embeddings scaled in the uploaded
// table, per-layer sliding windows and RoPE, query_pre_attn_scalar, logit soft-capping).
// Refused at construction with a qspec::Error naming what is missing: o_proj / MLP biases,
// Hadamard rotation. Synthetic models (random weights drawn on the GPU, for benchmarks at
// full-size shapes) carry random q/k/v biases where the shapes' family has them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qspec/decode_plan.h"
#include "gemm/policy_map.h"
#include "model/llama.h"
#include "ops/kv_int8.h"
#include "quant/formats.h"
#include "qspec/sampling.h"

namespace qspec {

struct GpuLlamaOptions {
  int64_t max_seqs = 1;         // sequences held at once
  int64_t max_context = 0;      // positions per sequence (0: the model's max_position_embeddings)
  int64_t max_step_tokens = 0;  // tokens per step (0: max(max_context, max_seqs)); prefill chunks beyond split
  int64_t max_logit_rows = 0;   // rows of logits a step may return (0: max_seqs * 8, room for verify runs)
  bool cuda_graphs = true;      // decode steps replay captured graphs
  // QSpec verify steps (every run γ + 1 tokens with all logits, nothing else in the step) replay
  // graphs too, one per (runs, tokens a run, context bucket, activations), captured on first use.
  // 0.11-0.15 ms less a QSpec cycle on an H200 (docs/perf-journal/perf-notes-journal-2026.md, "Verify steps as CUDA
  // graphs"). QSPEC_VERIFY_GRAPHS=0 / 1 overrides it for every model.
  bool verify_graphs = true;
  // Synthetic models only (GpuLlama::synthetic): > 0 makes every 4-bit projection ARC-calibrated
  // with this many residual channels for each 4-bit format (a random channel order a site, the
  // augmented tail S rounded up to the weight group), so ARC steps can be timed at full size.
  int64_t synthetic_arc_channels = 0;
  // Synthetic models only: the 4-bit weight format, int4 or int4-asym (the same random codes and
  // scales plus f16 group minimums: an A/B of the zero-point kernels against int4's).
  quant::Format synthetic_weights = quant::Format::int4;
  // Synthetic models only: the 4-bit weights' group along k, 32, 64 or 128.
  int64_t synthetic_group = 128;
  // ADAngel's policy map for the 4-bit GEMMs (gemm/policy_map.h, made by `qspec tune` on this
  // GPU): every 4-bit GEMM runs the strategy it picks for its (activations, n, k, m). Null: the
  // kernels' built-in crossovers.
  std::shared_ptr<const gemm::PolicyMap> gemm_policy;
  // Without gemm_policy: look for a map tuned on this GPU that covers this model's GEMM shapes
  // (gemm::find_policy_map over gemm::default_policy_dirs) and use it when there is one.
  bool auto_gemm_policy = false;
  // SwiGLU inside the gate_up GEMM's epilogue (W4A16 steps: cuda::w4a16_gemm_swiglu, the preload
  // kernel at 1-16 tokens; cuda::w4a16_gemm_tiled_swiglu, the tiled kernel beyond): automatic
  // where the GEMM would run the same kernel and partition anyway (QSPEC_SWIGLU=separate turns it
  // off, for A/B runs); always: the preload kernel's wherever it runs (tests: small models plan
  // other partitions), automatic beyond 16 tokens; never: the GEMM, then silu_mul.
  enum class Swiglu { automatic, always, never };
  Swiglu swiglu = Swiglu::automatic;
  // What the KV cache stores (ops/kv_int8.h; `--kv-cache f16|int8`): f16 rows, or int8 codes with a
  // scale a (token, KV head) row in two nibble planes (cuda::Kv8Planes), half the bytes. Every mode
  // and draft of the model shares the one cache; GpuLlama::set_kv_cache_view picks what a pass reads.
  KvCacheFormat kv_cache = KvCacheFormat::f16;
};

// The shapes of a well-known model, for synthetic runs: "llama3-8b", "llama2-7b", "qwen2.5-7b"
// (with its q/k/v biases), "qwen2.5-7b-nobias" (without them: the biases' cost).
ModelConfig synthetic_model_config(const std::string& name);
std::vector<std::string> synthetic_model_names();

// Activation precision of the 4-bit GEMMs in a step.
// The *_arc ones (ARC-calibrated models only) add ARCQuant's residual channels.
enum class GpuActivations { f16, int8, int4, fp8, nvfp4, mxfp4, int4_arc, nvfp4_arc, mxfp4_arc };
// The precision of a run mode's activations on a 4-bit model (f16 for w4a16 and w16a16); throws
// for modes the GPU does not run.
GpuActivations gpu_activations(const RunMode& mode);

class GpuLlama {
 public:
  // Uploads the weights `mode` needs. Throws (at load, never mid-request) without a GPU, below
  // sm_80, on an unsupported model or mode, or when weights + cache do not fit the GPU's free
  // memory (the message gives both sizes).
  GpuLlama(const LlamaModel& model, const RunMode& mode, const GpuLlamaOptions& options);
  // One sequence of max_tokens positions (the first version's constructor).
  GpuLlama(const LlamaModel& model, const RunMode& mode, int64_t max_tokens);
  // Random weights drawn on the GPU from `seed` (uniform codes and small scales / values): the
  // timing of a full-size model without its checkpoint. Outputs are meaningless.
  static std::unique_ptr<GpuLlama> synthetic(const ModelConfig& config, const RunMode& mode,
                                             const GpuLlamaOptions& options, uint64_t seed = 1);
  ~GpuLlama();
  GpuLlama(const GpuLlama&) = delete;
  GpuLlama& operator=(const GpuLlama&) = delete;

  // A run of one step: `tokens` appended to sequence `seq` at positions length(seq) ...
  struct Run {
    int64_t seq = 0;
    std::span<const int32_t> tokens;
    bool all_logits = false;  // ids (and logit rows) after every token of the run: a QSpec verify
    // >= 0: tokens[1 ..] are placeholders for drafts still on the device, tokens[1 + i] =
    // chain id chain_offset + i * chain_stride of this engine step's draft chains
    // (draft_chain_async); the step reads them there, and returns them with its ids.
    int64_t chain_offset = -1;
    int64_t chain_stride = 0;
  };
  // Runs every run in one forward pass (one GEMM per projection over all their tokens) and
  // appends their K/V. Returns greedy (argmax) ids: per run, the id after its last token, or,
  // for runs with all_logits (every run with all_tokens), the id after each of its tokens
  // (QSpec verify), runs in order.
  std::vector<int32_t> step(std::span<const Run> runs, bool all_tokens = false);
  // Greedy QSpec drafts without a host round trip a step: `steps` decode steps where each run
  // (one token: its first input) is fed its own argmax id of the step before, on the device.
  // The host reads every id once, at the end: [step][run], runs in order. The same ids and K/V
  // as `steps` calls of step() fed those ids.
  static constexpr int64_t kMaxChainSteps = decode_rules::kMaxGamma;  // a QSpec cycle's drafts
  std::vector<int32_t> draft_chain(std::span<const Run> runs, int64_t steps);
  // The same, left on the device for a verify step (Run::chain_offset): nothing is read back.
  // Returns the chain's offset: run r's draft i is chain id offset + i * runs.size() + r.
  // Chains accumulate until begin_chains() (one engine step's draft groups).
  int64_t draft_chain_async(std::span<const Run> runs, int64_t steps);
  void begin_chains();
  // Every chain id of this engine step, as read back by the last step() that verified some.
  const std::vector<int32_t>& last_chain_ids() const { return last_chain_ids_; }

  // Single sequence 0 (the first version's API): returns the id after the last token.
  int32_t forward(std::span<const int32_t> tokens);
  std::vector<float> logits() const;  // the last step's first logits row, as f32
  // Every logits row of the last step (the rows step() returned ids for, in that order), as f32:
  // what a sampler needs beyond greedy.
  std::vector<float> step_logits() const;
  // Draws tokens from rows of the last step's logits on the device, as Sampler::sample_with_draw
  // does from the same rows and draws (cuda::sample_logits_f16): only the ids come back, not the
  // rows (a 128k-entry row is 256 KB). Throws "sampler: NaN in logits" for a row the CPU
  // sampler would refuse.
  struct RowSample {
    int64_t row = 0;  // a row of the last step's logits, in step_logits() order
    SamplingParams params;
    double draw = 0;                         // Sampler::next_draw() (unused when greedy)
    std::span<const int32_t> penalised_ids;  // ids the repetition penalty applies to, once each (repeats allowed)
  };
  std::vector<int32_t> sample_rows(std::span<const RowSample> rows);

  // Activation precision of the following steps (4-bit models only; the constructor's mode sets
  // the first, gpu_activations(mode)). int4 uses the constructor mode's activation group size.
  // Decode graphs are kept per precision.
  void set_activations(GpuActivations activations);
  // Throws the reason when this model cannot run these activations at all (16-bit weights, int4
  // activation groups its weight groups do not divide, ARC without an ARC calibration). The
  // engine's backend asks it of a request's draft mode before any step (set_activations too).
  void check_activations(GpuActivations activations) const;
  GpuActivations activations() const;
  // The attention's view of the cache in the following steps (a QSpec draft's sparse view,
  // RunMode::kv_window / kv_sinks; 0: the whole cache). Decode graphs are kept per view.
  void set_kv_view(int64_t window, int64_t sinks);
  // What the following steps' attention reads of an int8 cache (GpuLlamaOptions::kv_cache): every
  // bit (KvView::full: the verify, plain steps, full-view drafts) or the high nibbles only (a `/k4`
  // draft: a quarter of an f16 cache's K/V bytes). Writes always store whole rows. Throws for
  // high_nibble on an f16 cache. Decode and verify graphs are kept per view.
  void set_kv_cache_view(KvView view);
  KvCacheFormat kv_cache_format() const;
  // A QSpec draft's vocabulary subset (RunMode::vocab_subset): set_draft_vocab copies the lm_head
  // rows of `ids` (the draft vocabulary table's ranking, most frequent first) on the device;
  // set_vocab_subset(n) makes the following steps score the first n of them only, every other
  // logit -inf (0: the whole lm_head). Decode graphs are kept per subset.
  void set_draft_vocab(std::span<const int32_t> ids);
  int64_t draft_vocab_rows() const;
  void set_vocab_subset(int64_t n);

  // Replaces the GEMM policy map (GpuLlamaOptions::gemm_policy; null = built-in crossovers):
  // captured graphs are dropped, Bitwise's bit-plane weight copies made or freed. Throws for a
  // map tuned on another GPU.
  void set_gemm_policy(std::shared_ptr<const gemm::PolicyMap> policy);

  int64_t length(int64_t seq = 0) const;
  // Forgets positions >= length (QSpec rollback: the next step overwrites their K/V).
  void truncate(int64_t seq, int64_t length);
  void reset() { lengths_.assign(lengths_.size(), 0); }
  void reset(int64_t seq) { truncate(seq, 0); }

  const ModelConfig& config() const;
  int64_t max_seqs() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t max_context() const;
  size_t device_bytes() const;  // weights + cache + scratch held on the GPU
  size_t weight_bytes() const;  // what one decode step reads of weights (lm_head included, embedding not)
  size_t kv_bytes_per_position() const;  // K + V of one position, all layers (int8: codes and scales)
  int64_t graphs_captured() const;
  // Layers whose SwiGLU ran in the gate_up GEMM's epilogue, over every forward pass enqueued
  // (captured into a graph or launched).
  int64_t swiglu_epilogue_layers() const;
  // Where the GEMM policy came from: the map file auto_gemm_policy found, "given" for
  // GpuLlamaOptions::gemm_policy / set_gemm_policy, "" for the built-in crossovers.
  const std::string& gemm_policy_source() const;

 private:
  GpuLlama() = default;
  // step() up to the forward pass, queued: validates, copies the inputs, advances the lengths;
  // returns the number of id / logit rows the pass leaves in out_ids.
  int64_t enqueue_step(std::span<const Run> runs, bool all_tokens);
  struct State;
  std::unique_ptr<State> state_;
  std::vector<int64_t> lengths_;
  std::vector<int32_t> last_chain_ids_;
};

// Greedy decoding of sequence 0: prompt, then up to max_new_tokens ids (stops after an eos id,
// which is kept), like runtime/generate.h's greedy path. Resets the sequence first.
std::vector<int32_t> gpu_greedy_generate(GpuLlama& gpu, std::span<const int32_t> prompt, int64_t max_new_tokens,
                                         const std::vector<int32_t>& eos_ids);

}  // namespace qspec
