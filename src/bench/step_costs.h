// The step costs `--draft auto` plans with, measured through an engine Backend
// (`qspec bench MODEL --qspec-costs-out FILE` on the CPU): at each (batch, context) grid point,
// the calls the engine makes for a plain W4A16 decode step, one draft step of each draft and a
// W4A16 verify of gamma + 1 tokens a sequence, host-timed (input, pass, logit rows back).
// The GPU's table comes from `qspec bench --device cuda`'s own QSpec cycles instead
// (QSpecCostTable::from_gpu_bench_record): one timing loop a device, not two.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama.h"
#include "runtime/backend.h"
#include "runtime/qspec_costs.h"

namespace qspec {

struct StepCostOptions {
  std::vector<int64_t> batches = {1, 4};
  std::vector<int64_t> contexts = {256, 2048};
  std::vector<int64_t> gammas = {2, 4, 7};
  // Drafts timed (set_draft_spec's spellings; "ngram" joins at cost 0 without timing).
  std::vector<std::string> drafts = {"w4a8"};
  int repeats = 5;           // each cost: the median of this many, after one warm-up
  int64_t group_size = 0;    // int4 activation groups (the engine's: the weights' group size)
  // The KV cache every step reads (`--kv-cache`): a `/k4` draft needs int8, and an int8 cache's
  // steps cost what its engine's will.
  KvCacheFormat kv_cache = KvCacheFormat::f16;
  std::function<void(size_t done, size_t total)> progress;
};

// Measures every cost at every (batch, context) on `backend` over `model`'s 4-bit weights.
// Rounds interleave the measurements (step, each draft, each verify, then again), so a machine
// that slows down mid-run slows all of them alike. Throws qspec::Error naming a bad option (a
// draft that is no draft, a context beyond the model's).
QSpecCostTable measure_step_costs(const LlamaModel& model, Backend& backend, const StepCostOptions& options);

}  // namespace qspec
