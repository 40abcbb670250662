// The engine's GPU backend over a GpuLlama the caller built (CUDA builds only): what the GPU
// benchmark drives, so that it times the engine's own QSpec cycle (runtime/backend.h) on
// synthetic full-size models that have no host weights.
#pragma once
#include <memory>

#include "model/cuda/llama_gpu.h"
#include "qspec/engine.h"
#include "runtime/backend.h"

namespace qspec {

// The GPU model an engine of `options` needs: its slots, context, step tokens, logit rows, KV cache.
GpuLlamaOptions engine_gpu_options(const EngineOptions& options, int64_t context_limit);

// How a backend over a model built elsewhere gives out the GPU's cache slots: `fixed`, the GPU's
// sequences are taken as they are (sequence s + 1 of the passes is GPU sequence s, at whatever
// length it holds: the benchmark's own passes); `engine`, every slot starts free and an engine's
// requests take them as they start (an Engine over this backend).
enum class GpuSlots { fixed, engine };

// A backend over `gpu` (not owned; it must outlive the backend) whose target mode is `mode`.
std::unique_ptr<Backend> make_cuda_backend(GpuLlama& gpu, const RunMode& mode, GpuSlots slots = GpuSlots::fixed);

}  // namespace qspec
