// Token choice on the GPU: argmax and the sampler's filters and draw (CPU twin: ops/sample.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"

namespace qspec::cuda {

// ids[r] = argmax over logits row r (lowest id wins ties, as Sampler::argmax). NaNs are never
// chosen (the sampler rejects NaN logits); a row with no finite maximum gives 0.
void argmax_f32(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, void* stream);
void argmax_f16(const f16_bits* logits, int64_t rows, int64_t vocab, int32_t* ids, void* stream);

// out[r, ids[j]] = subset[r, j] for j < n, every other entry of out [rows, vocab] -inf (f16): a
// QSpec draft's vocabulary-subset logits as whole rows, so argmax_f16 and sample_logits_f16 see
// the softmax over the subset (cpu::scatter_subset_logits is the CPU twin). ids: distinct, in
// [0, vocab), device. One block a row.
void scatter_subset_logits(const f16_bits* subset, int64_t rows, int64_t n, const int32_t* ids, int64_t vocab,
                           f16_bits* out, void* stream);

// Sampling on the device: one logit row's parameters (SamplingParams as plain numbers, plus the
// request generator's uniform draw in [0, 1), Sampler::next_draw).
struct SampleRowParams {
  int32_t row = 0;                 // which row of `logits`
  int32_t top_k = 0;               // 0 (or >= vocab): off
  float temperature = 0.0f;        // <= 0: greedy (argmax of the penalised scores)
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // 1: off
  double draw = 0.0;
  int32_t penalty_offset = 0;      // the row's penalised ids: penalty_ids[offset .. offset + count),
  int32_t penalty_count = 0;       // in [0, vocab); repeats allowed (a bitmap applies each id once)
};
static_assert(sizeof(SampleRowParams) == 40, "SampleRowParams is copied to the device as is");
// ids[i] = the token Sampler::sample_with_draw picks from row params[i].row of `logits` (f16
// [rows, vocab]) with the params' draw: the repetition penalty, temperature, top_k, top_p and
// min_p filters and the draw over the kept tokens in id order, with ties ranked by lower id.
// Masses are summed in 2^-44 fixed point (deterministic, whatever the thread order), so a token
// can differ from the CPU's only where the draw or a filter falls within ~1e-9 of a boundary.
// A row holding a NaN (not greedy) gives -1, as the CPU sampler refuses it; a row whose maximum
// is not finite gives its argmax. params, penalty_ids, ids: device. One block a row.
void sample_logits_f16(const f16_bits* logits, int64_t vocab, const SampleRowParams* params, int64_t count,
                       const int32_t* penalty_ids, int32_t* ids, void* stream);

// A chained greedy decode step's inputs from the last one's outputs, on the device (QSpec drafts
// without a host round trip): for r < runs, chain_ids[r] = out_ids[r]; with `advance` also
// ids[r] = out_ids[r], positions[r] += 1, context_lens[r] += 1 (one token a run).
void advance_decode_inputs(const int32_t* out_ids, int64_t runs, int32_t* ids, int32_t* positions,
                           int32_t* context_lens, int32_t* chain_ids, bool advance, void* stream);
// A verify step's draft tokens from the device (QSpec without a host read between drafting and
// verifying): for each of `count` entries (first, offset, stride, n) of `entries` (int32 x 4, on
// the device), ids[first + i] = chain[offset + i * stride] for i < n.
void scatter_chain_drafts(const int32_t* chain, const int32_t* entries, int64_t count, int32_t* ids, void* stream);

}  // namespace qspec::cuda
