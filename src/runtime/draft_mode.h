// The run mode of a QSpec draft's passes: its activation mode with the plan's draft diets set on
// it (the view of the KV cache, the vocabulary subset, the skipped layers, the KV bits read). One place, so that a new diet is one line
// here for the engine, the CPU step-cost bench and the GPU bench alike.
#pragma once
#include "ops/kv_int8.h"
#include "qspec/decode_plan.h"
#include "quant/quantized_linear.h"

namespace qspec {

// `mode`: plan.draft as the caller resolves it (the engine's runnable mode, the benches'
// parse_run_mode); returned with the plan's draft_window, the sinks its view keeps, its
// draft_vocab, its draft_skip and its draft_kv4 (RunMode::kv_high_nibble).
RunMode with_draft_diets(RunMode mode, const DecodePlan& plan);

// Throws qspec::Error naming draft_kv4 when `draft` reads the 4-bit view (`/k4`) of a KV cache
// of `format` that is not int8: the engine at submit, the commands before they load a model.
void check_draft_kv_cache(const RunMode& draft, KvCacheFormat format);

}  // namespace qspec
