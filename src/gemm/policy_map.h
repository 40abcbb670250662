// ADAngel's policy map for the 4-bit-weight GEMMs (issue 6): for each GEMM shape a model runs
// (activation kind, N, K) and every token count M, the strategy (kernel and tile) that a tuner
// measured fastest on this GPU; a dispatcher looks it up per call in O(1). Strategies are the
// kernels of ops/cuda/ops.h. In DPR terms (gemm/dpr.h) most are Padding (4-bit weights unpacked in
// registers to the activation's mma type): the small-M register-ring kernel (variants 1, 2) and
// cp.async-ring kernel (3, 4; f16 only), the tiled kernel's four tiles, and dequantize + cuBLAS
// (f16 only); for integer activations also Split (int8 as two 4-bit halves on s8) and Bitwise
// (1-bit planes on b1 and.popc, over a bit-plane copy of the weights, groups of 128).
// Host code only (no CUDA): the map is JSON, tested on the CPU; gemm/cuda/gemm_dispatch.h
// launches what it picks.
//
// JSON: {"format": "qspec-gemm-policy", "version": 1, "gpu": "...", "commit": "...", "command":
// "...", "entries": [{"activations": "f16", "n": 6144, "k": 4096, "group": 128,
// "ranges": [{"max_m": 8, "strategy": "small_m_v1"}, ...]}]}: ranges sorted by max_m, the last
// one covering every larger M.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qspec::gemm {

enum class Strategy : uint8_t {
  small_m_v1,
  small_m_v2,
  small_m_v3,
  small_m_v4,
  tiled_256x64,
  tiled_128x64,
  tiled_256x32,
  tiled_128x128,
  dequant_cublas,
  split_small_m,  // int8 only: DPR Split, activations {4, 4} on two s8 mma (small-M kernel, variant 1)
  bitwise_b1,     // int8 / int4, weight groups of 128: DPR Bitwise, 1-bit planes on b1 mma and.popc
  s8_wide_128x128,  // int8, k % 128 == 0: weights unpacked once per 128 x 128 block (large M, compute-bound)
  s8_wgmma_128x128,  // int8, k % 128 == 0, groups of 128, sm_90a: weights unpacked to int8 scratch, wgmma (large M)
  small_m_v5,        // f16 (up to 16 tokens a launch) or int8 (up to 8): the preload kernel (bulk copies into shared memory, sm_90a)
  tiled_128x32,      // the tiled kernel's 256x32 warp tile in blocks of 4 warps, two a multiprocessor
  wgmma_128x128,     // f16, sm_90a: the warp-specialised wgmma kernel, 128 rows x 128 tokens (tens to hundreds of tokens)
  wgmma_128x256,     // f16, sm_90a: the same kernel at 128 rows x 256 tokens, unsplit (hundreds to thousands: prefill)
  // Every activation kind: the kernels' own choice, as dispatch_w4_gemm makes it without a map
  // (the preload kernel, the wgmma tiles with x in the packed k order where the norms write it so,
  // dequantize + cuBLAS, the s8 wgmma kernel at large M). A tune times it beside the others and
  // keeps it unless one beats it by min_gain, so a measured map is never slower than no map on
  // the points it sampled (issue 53: the H200 maps of single strategies measured 0-4 % slower than
  // the built-in choice, which reads x packed where no single strategy does).
  builtin,
};
inline constexpr int kStrategies = 18;

std::string_view strategy_name(Strategy strategy);
// Throws qspec::Error naming the known strategies.
Strategy parse_strategy(std::string_view name);

// "f16" (W4A16) or a quantized activation format ("int8", "int4", "fp8", "nvfp4", "mxfp4").
// f16 runs the Padding strategies (small-M, tiled, dequantize + cuBLAS); quantized activations the
// register-ring and tiled kernels; integer ones also Bitwise (int8, int4) and Split (int8).
std::vector<Strategy> strategies_for(std::string_view activations);
bool strategy_supports(Strategy strategy, std::string_view activations);

// The documented default without a measured map (the crossovers measured on the H100 before
// the tuner existed, docs/perf-journal/perf-notes-journal-2026.md): small-M variant 1 up to 8 tokens; then the tiled
// kernel (256x32 up to 32 tokens, 256x64 beyond) up to 128 tokens for f16 and at every M for
// quantized activations; dequantize + cuBLAS beyond 128 for f16.
Strategy rule_based_strategy(std::string_view activations, int64_t m);

// The rule of issue 6 / the ADAngel paper, without measurements: M <= 8 Bitwise (integer
// activations; the small-M Padding kernel otherwise), M <= 64 Padding (Split is never
// hardware-aligned on sm_90: its 4-bit halves are promoted to s8), Padding beyond (the tiled
// kernel; f16 also stays on Padding: the rule has no cuBLAS). The ablation's "rule-based map".
Strategy paper_rule_strategy(std::string_view activations, int64_t m);

// The winner of one tuning point, the one rule PolicyMap::from_timings and the tuner's sampling
// share: the fastest of `us` (strategy, microseconds) not in `excluded`, except that the default
// (builtin where `us` timed it, else rule_based_strategy: records from before builtin existed)
// keeps the point unless another strategy beats it by more than min_gain
// (hysteresis: isolated timings within a few percent flip between runs). Throws qspec::Error
// when no allowed strategy was timed.
Strategy fastest_strategy(const std::vector<std::pair<Strategy, double>>& us, std::string_view activations, int64_t m,
                          const std::vector<Strategy>& excluded, double min_gain);

// The token counts an adaptive tune times for one (shape, activations), sorted: `coarse` first,
// then, wherever two neighbours' winners (winner_at, which times the point) differ, their midpoint,
// until the two are within adaptive_tune_resolution of the smaller. A map keeps each sampled
// winner for the M values down to the previous sample, so this places every crossover that
// closely with a few points per crossover instead of every M.
std::vector<int64_t> adaptive_tune_points(const std::vector<int64_t>& coarse,
                                          const std::function<Strategy(int64_t)>& winner_at);
// How far apart two sampled M values with different winners may stay: adjacent below 64 tokens
// (decode batches and small verifies, where a step is a few GEMMs of exactly that M), an eighth
// of the smaller from there.
int64_t adaptive_tune_resolution(int64_t m);

struct PolicyRange {
  int64_t max_m;
  Strategy strategy;
};

// Where `qspec tune` times its picks inside whole steps by default (bench/cuda/gpu_bench.h,
// StepRefineOptions): decode batches (M = B) and prefill lengths (M = P).
inline std::vector<int64_t> step_refine_batches() { return {1, 8, 16, 32, 64}; }
inline std::vector<int64_t> step_refine_prompt_lengths() { return {128, 256, 512, 1024, 2048, 4096}; }
// Rounds of a step refinement (alternating order): a departure from builtin must win every one.
inline constexpr int kStepRefineRounds = 3;

// The band of M each step-refinement point answers for: point i (the sorted, distinct M of the
// points) covers (M_{i-1}, M_i], the first from 1 and the last up to PolicyMap::kDenseM (and
// beyond, as a map's last range does). Returns (first, last) M a point.
std::vector<std::pair<int64_t, int64_t>> step_refine_bands(const std::vector<int64_t>& sorted_m);

// The strategies worth timing inside the step at M: builtin first, then those the isolated
// timings (a `qspec tune` record's JSON, its "timings") put within `slack` of a shape's best at
// the tuned M nearest to M; every strategy of the activations when the record has none.
std::vector<Strategy> step_contenders(const std::string& record_json, std::string_view activations, int64_t m,
                                      double slack);
// Which of a step refinement's candidates to take, from their step times `rounds_ms[round][c]`
// (candidate 0 the map as it stands, `builtin` the builtin override), on the means over rounds:
// builtin unless the fastest beats it by builtin_margin and in every round (a map departs from no
// map only where that measured faster beyond the noise: whole prefills differ by 2-3 % between
// rounds on the H200), else the fastest where it beats the map's by min_gain; 0 keeps the map.
size_t step_refine_choice(const std::vector<std::vector<double>>& rounds_ms, size_t builtin, double min_gain,
                          double builtin_margin);
// Each candidate's mean time over a refinement's rounds (`rounds_ms[round][c]`, equal lengths).
std::vector<double> step_refine_means(const std::vector<std::vector<double>>& rounds_ms);

class PolicyMap {
 public:
  std::string gpu, commit, command;
  // M up to which a map holds a pick per M (override_at's range); beyond, its last range.
  static constexpr int64_t kDenseM = 4096;

  // A map that runs one strategy for every GEMM it supports (rule_based_strategy elsewhere): the
  // ablation's static strategies.
  static PolicyMap forced(Strategy strategy);
  // paper_rule_strategy for every GEMM.
  static PolicyMap paper_rule();
  // The map a tuning record implies (tune_w4_policy's "timings": per shape, activations and M
  // the median microseconds of each strategy): per M the fastest strategy not in `excluded`; the
  // rule-based default keeps an M unless another strategy beats it by more than min_gain.
  static PolicyMap from_timings(const std::string& timings_json, const std::vector<Strategy>& excluded,
                                double min_gain, const std::string& source);
  // Sets the strategy at exactly M = m for every shape of `activations` that can run it (a step-level
  // refinement: the tuner measured whole decode steps of m tokens); no-op for forced / rule maps.
  void override_at(std::string_view activations, int64_t m, Strategy strategy);
  // The same for every M in [first, last] (last > kDenseM: every M from first on).
  void override_range(std::string_view activations, int64_t first, int64_t last, Strategy strategy);
  // Whether some shape of `activations` names a strategy other than builtin at M.
  bool departs_at(std::string_view activations, int64_t m) const;
  // Replays a `qspec tune` record's "step_refinement" (refine_policy_in_steps: each point's
  // "activations" (or, in older records, its "mode"), "m", "taken" and, where its band went back to builtin, "band") on the map its
  // isolated "timings" imply: the map that tune wrote, from the record alone. Returns the points
  // replayed (0 for a record without a refinement).
  size_t replay_step_refinement(const std::string& record_json);
  // "forced:NAME", "paper-rule", or "" for a measured map.
  std::string label() const;

  // Installs the ranges of one shape (sorted by max_m, increasing; strategies valid for the
  // activations); throws qspec::Error otherwise.
  void set(std::string_view activations, int64_t n, int64_t k, int64_t group, std::vector<PolicyRange> ranges);
  // The measured strategy, or rule_based_strategy for a shape the map does not hold. O(1): a
  // hash of the shape, then a table indexed by M (M beyond the table: the last range).
  Strategy lookup(std::string_view activations, int64_t n, int64_t k, int64_t m) const;
  bool contains(std::string_view activations, int64_t n, int64_t k) const;
  // Whether any activations' entry for (n, k) picks `strategy` at some M (a model prepares the
  // bit-plane weight copy only for the shapes whose entries use bitwise_b1).
  bool uses(Strategy strategy, int64_t n, int64_t k) const;
  size_t shapes() const { return entries_.size(); }

  std::string to_json() const;
  // Throws qspec::Error naming `source` and the field at fault.
  static PolicyMap from_json(std::string_view text, const std::string& source);
  static PolicyMap load(const std::string& path);
  void save(const std::string& path) const;

 private:
  struct Entry {
    std::string activations;
    int64_t n, k, group;
    std::vector<PolicyRange> ranges;
    std::vector<Strategy> by_m;  // index m (1..kDenseM), then ranges.back()
  };
  enum class Kind : uint8_t { measured, forced, paper_rule };
  Kind kind_ = Kind::measured;
  Strategy forced_ = Strategy::small_m_v1;
  // (activations index, n, k) packed into one word: no allocation a lookup; -1 when unknown.
  static int64_t key(std::string_view activations, int64_t n, int64_t k);
  std::unordered_map<int64_t, Entry> entries_;
};

// Where `--gemm-policy auto` looks for maps, in order: $QSPEC_GEMM_POLICY_DIR, ./bench/policies,
// and the bench/policies of the source tree qspec was built from.
std::vector<std::string> default_policy_dirs();
// The first map (*.json, by file name, directories in order) tuned on `gpu` whose f16 entries hold
// every (n, k) of `shapes`; "" when there is none. Other JSON files and unreadable maps are skipped.
std::string find_policy_map(const std::vector<std::string>& dirs, const std::string& gpu,
                            const std::vector<std::pair<int64_t, int64_t>>& shapes);

}  // namespace qspec::gemm
