// `qspec bench --device cuda`: decode steps and time-to-first-token of the GPU forward pass
// (model/cuda/llama_gpu.h), each next to its roofline measured in the same run. CUDA builds only.
//
// Decode: B sequences (batch sizes from options) each at `context` cached positions, one token
// each per step, steps through GpuLlama::step exactly as a serving loop calls it (input copy,
// graph replay, id copy back, host sync); the median step time gives tokens/s = B / step.
// Roofline of a step: max(bytes / copy bandwidth, FLOPs / GEMM rate), bytes = every weight once
// (lm_head included) + the K/V the attention reads; both ceilings measured here (a 1 GiB device
// copy, bytes read + written; cuBLAS f16 8192^3). Baselines in the same run: the sum of the
// step's GEMMs timed alone (cuBLAS f16 for w16a16, the W4A16 kernels for w4a16).
// TTFT: one sequence, prompt of P tokens in one step.
// QSpec (--qspec-gammas): draft / verify time split per cycle (the paper's Fig. 4), tokens/s
// next to the W4A16 decode of the same batch measured in the same run, each phase's roofline.
// Workloads (the paper's Tables 4 and 6): requests with the prompt and output lengths of a
// dataset (bench/workloads.json, tools/make_workloads.py) served by B slots, continuous
// batching: a free slot takes the next request (its prompt in one prefill step), every active
// slot decodes one token per step; output tokens / wall time, prefill and decode time apart.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/replay.h"  // ReplayOptions
#include "gemm/policy_map.h"
#include "ops/kv_int8.h"
#include "qspec/decode_plan.h"
#include "quant/formats.h"

namespace qspec {

struct GpuBenchOptions {
  std::string model_dir;   // a checkpoint, or "" with synthetic
  std::string synthetic;   // "llama3-8b", ...: random weights drawn on the GPU
  std::vector<std::string> modes = {"w16a16", "w4a16"};
  std::vector<int64_t> batch_sizes = {1, 8, 16, 32, 64};
  int64_t context = 512;   // cached positions per sequence when decode steps are timed
  int64_t steps = 64;      // timed decode steps per batch size (after warm-up)
  std::vector<int64_t> prompt_lengths = {128, 256, 512, 1024, 2048, 4096};
  std::vector<std::string> workloads;  // names in workloads_file: gsm8k, humaneval, mbpp, mt-bench
  std::string workloads_file = "bench/workloads.json";
  int64_t requests_per_slot = 4;  // a workload run serves batch x this many requests (its first ones)
  bool cuda_graphs = true;
  bool programmatic_launch = true;  // programmatic dependent launch (sm_90+); false: --no-pdl
  // Profile mode: per mode and batch size, warm up, then run one decode step between
  // profiler_start/stop (for `ncu --profile-from-start off`); nothing is timed.
  bool profile_step = false;
  // Sampling (--sampling): after each decode batch, the time to draw its B tokens with sampling
  // filters from the step's logits on the GPU (GpuLlama::sample_rows) against the host path
  // (the rows copied back, Sampler::sample on the thread pool), for a few filter settings.
  bool sampling = false;
  // QSpec cycles (mode w4a16 only): per draft mode, batch size and gamma, gamma draft steps then one
  // W4A16 verify step of gamma + 1 tokens a sequence (all-token logits), timed as the engine
  // runs them. Acceptance is meaningless on random weights: tokens per cycle follow from
  // accept_rate, the probability that a draft token is accepted given its predecessors were
  // (1.0 = the upper bound, every draft kept), and the output says which was used.
  std::vector<int64_t> qspec_gammas;
  // Draft modes timed (each a low-precision activation mode, or MODE@WINDOW[+SINKS]); the default:
  // the cheapest activation format (the engine's default draft is the planner, which is no mode).
  std::vector<std::string> qspec_drafts = {std::string(decode_rules::kCheapestDraft)};
  double accept_rate = 1.0;
  // Accepted lengths recorded on a real checkpoint (a `qspec eval qspec` result JSON, or
  // tools/qspec_grid.py's: results with draft, gamma, kv_overwrite and accepted_histogram): when
  // set, each (draft, gamma) row's tokens per cycle are the recorded mean accepted + 1 instead of
  // accept_rate's, and rows without a recording say so.
  std::string accept_trace;
  std::string gemm_policy;  // a policy map (qspec tune) for the 4-bit GEMMs; "" = built-in crossovers
  // Synthetic models run ARC activation modes (w4a4-*-arc, as a mode or as a QSpec draft) on
  // weights ARC-calibrated with this many residual channels a site (GpuLlamaOptions::
  // synthetic_arc_channels), every other mode on plain weights: ARC on / off side by side.
  int64_t synthetic_arc_channels = 128;
  // Synthetic models: the 4-bit weight format (GpuLlamaOptions::synthetic_weights), int4 or int4-asym.
  quant::Format synthetic_weights = quant::Format::int4;
  int64_t synthetic_group = 128;  // their group along k (GpuLlamaOptions::synthetic_group)
  KvCacheFormat kv_cache = KvCacheFormat::f16;  // --kv-cache (GpuLlamaOptions::kv_cache)
  // ADAngel's ablation (issue 6, the paper's Fig. 12) instead of the tables above: per mode one
  // model, each GEMM policy in turn ("builtin" = the kernels' crossovers, "paper-rule",
  // "forced:STRATEGY", or a map file), decode steps at every batch size and TTFT at every prompt
  // length; ablation_repeats rounds, the policy order reversed on odd rounds; per point the mean.
  std::vector<std::string> gemm_ablation;
  int ablation_repeats = 2;
  std::string command_line;
  std::string commit;
};

// Runs the benchmark, prints its tables, returns the JSON record.
nlohmann::json run_gpu_bench(const GpuBenchOptions& options);

// `--replay FILE`: the texts of FILE (`qspec eval qspec --save-reference`) replayed through the
// engine on the synthetic model of `options` (bench/replay.h), plain W4A16 beside replay's runs
// at every batch size of replay.batch_sizes. Prints the table, returns the JSON record.
nlohmann::json run_gpu_replay(const GpuBenchOptions& options, ReplayOptions replay, const std::string& texts_path);

// ADAngel's tuning inside the step (qspec tune, by default): isolated GEMM timings miss how a
// kernel overlaps its neighbours under programmatic dependent launch, which x order its norm
// writes and which epilogue it takes, so for each mode (w4a16 for the map's f16 entries, w4a8 for
// int8) and each point (a decode step of B sequences, M = B, for B in `batches`; a prefill of P
// tokens, M = P, for P in `prompt_lengths`) the map as it stands, `builtin` and each contender at
// M (all shapes) run whole steps (graph replays at `context` cached positions, median of
// `steps`; a prefill's median of 3), gemm::kStepRefineRounds rounds in alternating order. A
// contender is a strategy the isolated timings in `record` put within `contender_slack` of a
// shape's best at the tuned M nearest to M (every strategy when there are none). The pick at M:
// the fastest, where it beats the map's by min_gain; and the map departs from `builtin` only where
// its pick beats builtin by builtin_margin and in every round (gemm::step_refine_choice). Each
// point answers for a band of M (gemm::step_refine_bands: from past the point below up to it):
// where builtin won, or the map won while naming builtin at M itself, the whole band goes back to
// builtin, so an isolated pick stands only in a band whose timed step measured a departure faster
// (the isolated sweep alone put dequantize + cuBLAS at 1025-3840 tokens that cost Llama-3-8B's
// 2048-token prefill 5 % on the H200).
// The model: model_dir (a checkpoint) or synthetic (a name of synthetic_model_config).
struct StepRefineOptions {
  std::string model_dir, synthetic;
  std::vector<std::string> modes = {"w4a16", "w4a8"};
  std::vector<int64_t> batches = gemm::step_refine_batches();
  std::vector<int64_t> prompt_lengths = gemm::step_refine_prompt_lengths();
  int64_t context = 512;
  int64_t steps = 32;
  double min_gain = 0.005;
  double builtin_margin = 0.01;
  double contender_slack = 0.25;
};
// `record` holds the isolated tune's "timings" (for the contenders) and receives "step_refinement".
gemm::PolicyMap refine_policy_in_steps(const gemm::PolicyMap& map, const StepRefineOptions& options,
                                       nlohmann::json* record);

}  // namespace qspec
