// The step-cost table of `--draft auto` (issue 50): what a plain W4A16 decode step, one step of
// each candidate draft and a W4A16 verify of gamma + 1 tokens a sequence cost on one device for
// one model, measured at a grid of (batch, context) points by `qspec bench --qspec-costs-out`
// and stored like the GEMM policy maps (bench/policies/qspec-costs-<device>-<model>.json). The
// planner (runtime/qspec_planner.h) reads interpolated costs from it every step.
//
// JSON ("format": "qspec-step-costs", "version": 1):
//   {"format": ..., "version": 1, "device": "NVIDIA H200", "model": "llama3-8b",
//    "shape": {"layers": 32, "hidden": 4096, "intermediate": 14336, "heads": 32, "kv_heads": 8,
//              "head_dim": 128, "vocab": 128256},
//    "commit": "...", "command": "...",
//    "acceptance": {"w4a8": 0.94},            (optional: per-token acceptance priors, from a trace)
//    "points": [{"batch": 1, "context": 512, "w4a16_step_ms": 1.94,
//                "verify_ms": {"1": 2.05, "3": 2.31},          (gamma -> B x (gamma + 1) tokens)
//                "draft_step_ms": {"w4a8": 2.96, "w4a16@256+16": 1.9, "ngram": 0}}, ...]}
// Every point holds the same gammas and drafts (a draft spec as set_draft_spec spells it), so
// any cost can be interpolated from every point. Costs are host-timed, as the engine sees them.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ops/kv_int8.h"
#include "io/model_config.h"
#include "qspec/decode_plan.h"

namespace qspec {

// What a table was measured on, as far as costs go: the model's shapes. A table tuned on the
// synthetic Llama-3-8B serves a real Llama-3-8B checkpoint (the same shapes, the same bytes).
struct ModelShape {
  int64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  static ModelShape of(const ModelConfig& config);
  bool operator==(const ModelShape&) const = default;
  std::string describe() const;  // "30 layers, hidden 576, ..."
};

// One measured grid point.
struct StepCostPoint {
  int64_t batch = 0;    // sequences in the step
  int64_t context = 0;  // cached positions of each sequence
  double w4a16_step_ms = 0;                     // one plain W4A16 decode step: batch tokens
  std::map<int64_t, double> verify_ms;          // gamma -> a W4A16 pass of batch x (gamma + 1) tokens, all logits
  std::map<std::string, double> draft_step_ms;  // draft spec -> one draft step: batch tokens (ngram: 0)
};

// The costs at one (batch, context), interpolated from a table's points.
struct StepCosts {
  double w4a16_step_ms = 0;
  std::vector<int64_t> gammas;     // measured, increasing
  std::vector<double> verify_ms;   // at gammas
  std::map<std::string, double> draft_step_ms;
  // A verify of `gamma` drafts a sequence (fractional: the mean over the batch): linear between
  // the measured gammas, anchored at gamma 0 on the W4A16 step (a verify of the last token alone
  // is a decode step); past the largest gamma, the last segment's slope.
  double verify(double gamma) const;
};

class QSpecCostTable {
 public:
  static constexpr std::string_view kFormat = "qspec-step-costs";
  static constexpr int kVersion = 1;

  std::string device;  // Backend::device_name() of the machine it was measured on
  // The KV cache the steps ran on (`--kv-cache`; "kv_cache" in the file, f16 when absent): an
  // engine plans only with a table of its own cache, whose step and draft costs differ.
  KvCacheFormat kv_cache = KvCacheFormat::f16;
  std::string model;   // a name for people (the file name carries it); matching goes by `shape`
  ModelShape shape;
  std::string commit, command;
  std::map<std::string, double> acceptance;  // optional per-token acceptance priors by draft
  std::vector<StepCostPoint> points;

  // The drafts and the verify gammas every point holds.
  std::vector<std::string> drafts() const;
  std::vector<int64_t> gammas() const;

  // Costs at (batch, context): within each measured context, linear in batch between the two
  // nearest batches; across contexts, linear in log(context) between the two nearest; outside
  // the grid, the nearest edge (a step's cost ratios, which the planner compares, change slowly
  // there). Needs a valid table.
  StepCosts at(double batch, double context) const;

  // Adds other's points (one replaces a point at the same batch and context) and acceptance
  // priors; the device and shape must match. validate() afterwards says whether the drafts and
  // gammas still agree.
  void merge(const QSpecCostTable& other);

  // Throws qspec::Error naming `source` and the field at fault: a missing or non-numeric field,
  // a cost that is negative or not finite, batch / context < 1, two points at the same
  // (batch, context), points that disagree on gammas or drafts, a gamma outside 1..kMaxGamma, an
  // acceptance outside [0, 1], a draft that is no valid draft spec.
  void validate(const std::string& source) const;

  nlohmann::json to_json() const;
  static QSpecCostTable from_json(std::string_view text, const std::string& source);
  static QSpecCostTable load(const std::string& path);
  void save(const std::string& path) const;

  // The table `qspec bench --device cuda --qspec-gammas ... --qspec-drafts ...` measured (its JSON
  // record, gpu_bench.h): the W4A16 decode rows give the step, its QSpec rows each draft's step
  // (draft_ms / gamma, the mean over gammas) and the verify of each gamma (the mean over drafts),
  // all at the record's one context; "ngram" joins at cost 0. `accept_trace` (optional, a
  // `qspec eval qspec` result on a real checkpoint) gives per-token acceptance priors.
  static QSpecCostTable from_gpu_bench_record(const nlohmann::json& record, const ModelShape& shape,
                                              const std::string& model, const nlohmann::json* accept_trace = nullptr);
};

// The QSpec plan of a draft a cost table holds or a bench times: a draft spec by the request's
// rules, and a named one (the planner "auto" has no cost of its own). Else fails with
// `where: draft "SPEC": why`.
DecodePlan cost_table_draft_plan(const std::string& spec, const std::string& where);

// Per-token acceptance of each draft in a `qspec eval qspec` result (cycles with KV overwrite
// on): accepted drafts over accepted drafts plus rejections, summed over its gammas, the
// estimate of a draft that keeps each token with one probability.
std::map<std::string, double> acceptance_from_trace(const nlohmann::json& trace, const std::string& source);

// "qspec-costs-<device>-<model>.json", lower case, anything but letters and digits a '-'.
std::string cost_table_file_name(const std::string& device, const std::string& model);

// The first table (*.json by file name, directories in order; gemm::default_policy_dirs() is
// where `--qspec-costs auto` looks) measured on `device` for `shape` on a `kv_cache` cache; ""
// when there is none.
// Files of other formats are skipped; a file that says it is a cost table but is malformed
// throws (a broken table next to the policy maps should be fixed, not silently ignored).
std::string find_cost_table(const std::vector<std::string>& dirs, const std::string& device, const ModelShape& shape,
                            KvCacheFormat kv_cache = KvCacheFormat::f16);

}  // namespace qspec
