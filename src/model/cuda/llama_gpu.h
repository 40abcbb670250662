// The forward pass of a LlamaModel on the GPU (CUDA builds only: compiled into qspec_core when
// QSPEC_HAVE_CUDA). Plain C++ over ops/cuda/ops.h: f16 activations and residual stream, f32
// statistics and accumulation; W16A16 through cuBLAS (checkpoint weights converted to f16 at
// upload), W4A16 through the packed 4-bit kernels (gemm/w4a16_pack.h); one sequence, its KV
// cache paged in 16-position blocks. Its reference is LlamaModel::forward (CPU, f32).
//
// Scope of this first version: modes w16a16 and w4a16; no biases, no Hadamard rotation, no
// ARC reordering (each rejected at construction with a qspec::Error naming it).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/llama.h"

namespace qspec {

class GpuLlama {
 public:
  // Uploads the weights `mode` needs and allocates a KV cache of max_tokens positions.
  // Throws (at load, never mid-request) without a GPU, below sm_80, on an unsupported model
  // or mode, or when the GPU has too little memory (the CUDA error names the allocation).
  GpuLlama(const LlamaModel& model, const RunMode& mode, int64_t max_tokens);
  ~GpuLlama();
  GpuLlama(const GpuLlama&) = delete;
  GpuLlama& operator=(const GpuLlama&) = delete;

  // Runs `tokens` at positions length() ... and appends their K/V; returns the greedy (argmax)
  // id after the last token. logits(): that token's logits (f16 on the GPU, as f32).
  int32_t forward(std::span<const int32_t> tokens);
  std::vector<float> logits() const;
  int64_t length() const { return length_; }
  void reset() { length_ = 0; }
  size_t device_bytes() const;  // weights + cache + scratch held on the GPU

 private:
  struct State;
  std::unique_ptr<State> state_;
  int64_t length_ = 0;
};

// Greedy decoding on the GPU: prompt, then up to max_new_tokens ids (stops after an eos id,
// which is kept), like runtime/generate.h's greedy path. Resets the cache first.
std::vector<int32_t> gpu_greedy_generate(GpuLlama& gpu, std::span<const int32_t> prompt, int64_t max_new_tokens,
                                         const std::vector<int32_t>& eos_ids);

}  // namespace qspec
