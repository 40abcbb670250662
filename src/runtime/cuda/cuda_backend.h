// The engine's GPU backend over a GpuLlama the caller built (CUDA builds only): what the GPU
// benchmark drives, so that it times the engine's own QSpec cycle (runtime/backend.h) on
// synthetic full-size models that have no host weights.
#pragma once
#include <memory>

#include "model/cuda/llama_gpu.h"
#include "runtime/backend.h"

namespace qspec {

// A backend over `gpu` (not owned; it must outlive the backend) whose target mode is `mode`.
// The GPU's sequences are taken as they are: sequence s + 1 of the passes is GPU sequence s,
// at whatever length it holds.
std::unique_ptr<Backend> make_cuda_backend(GpuLlama& gpu, const RunMode& mode);

}  // namespace qspec
