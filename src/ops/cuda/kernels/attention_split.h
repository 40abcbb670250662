// Host-side split-K planning shared by the paged attention launchers and
// attention_workspace_bytes (plain C++; included by .cu files).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ops/attention.h"

namespace qspec::cuda::detail {

// What the kernels multiply q.k by, in log2 units: log2(e) times the shape's scale (cpu::attention's
// rule: 0 means 1 / sqrt(head_dim); Gemma's query_pre_attn_scalar sets another).
// The default scale, however it is spelled (0, or the f32 1 / sqrt(head_dim) that attention_shape
// sets for every family but Gemma), keeps the bits the kernels have always used.
inline float attention_scale_log2(const cpu::AttentionShape& shape) {
  constexpr double kLog2e = 1.4426950408889634;
  const double default_scale = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
  if (shape.scale > 0.0f && shape.scale != static_cast<float>(default_scale))
    return static_cast<float>(kLog2e * static_cast<double>(shape.scale));
  return static_cast<float>(kLog2e / std::sqrt(static_cast<double>(shape.head_dim)));
}

inline constexpr int64_t kMaxAttentionSplits = 32;
// The workspace starts with arrival counters (zeroed once by attention_workspace_init; each
// launch leaves them zero): split-K decode merges its partials in the block of each
// (sequence, head group) that finishes last. Partials follow at this offset.
inline constexpr size_t kAttentionCounterBytes = 64 * 1024;
inline constexpr int64_t kAttentionCounters = kAttentionCounterBytes / 4;
// 64 keys a split at least: a batch-1 decode over 1k positions then runs 16 splits x 8 KV heads
// = 128 blocks instead of 32 (ncu on the H100: 18 us a layer at 4 splits, latency-bound).
inline constexpr int64_t kKeysPerSplitMin = 64;
// kKeysPerSplitMin, or QSPEC_ATTENTION_KEYS_PER_SPLIT (a multiple of 16, 16-1024; read once a
// process, for sweeps). Defined in attention_combine.cu.
int64_t attention_keys_per_split();

// The most splits any launch plans for a context of max_context keys.
inline int64_t max_attention_splits(int64_t max_context) {
  const int64_t keys = attention_keys_per_split();
  return std::clamp<int64_t>((max_context + keys - 1) / keys, 1, kMaxAttentionSplits);
}

inline size_t attention_partial_bytes(int64_t splits, int64_t rows, int64_t head_dim) {
  // part_o [splits][rows][head_dim] f32, then part_ml [splits][rows] float2.
  return static_cast<size_t>(splits * rows * head_dim) * sizeof(float) + static_cast<size_t>(splits * rows) * 8;
}

// Where split-K partials live in a workspace: o [splits][rows][head_dim] f32 after the counters,
// then (m, l) [splits][rows] as float pairs (float2 in the kernels).
inline float* attention_partial_o(void* workspace) {
  return reinterpret_cast<float*>(static_cast<char*>(workspace) + kAttentionCounterBytes);
}
inline float* attention_partial_ml(void* workspace, int64_t splits, int64_t rows, int64_t head_dim) {
  return attention_partial_o(workspace) + splits * rows * head_dim;
}

// The prefill (verify) attention's split-K fills the GPU to this many blocks a multiprocessor:
// kAttentionBlocksPerSm, or QSPEC_ATTENTION_BLOCKS_PER_SM (1-8, read once a process: a benchmark
// knob; swept at 512-token contexts on the H100, 3 or 4 gained nothing). The decode attention
// plans by its kernel's occupancy instead (plan_wave_splits). Defined in attention_combine.cu.
inline constexpr int64_t kAttentionBlocksPerSm = 2;
int64_t attention_blocks_per_sm();

// Query heads a decode block serves (1, 2, 4 or 8). A block reads its KV head's keys and values
// once for all its heads, so a KV head's whole group goes in one block (the power of two at or
// above the group, at most 8: the mma's n): rounding down instead read Qwen2.5-7B's K/V twice a
// step (group 7: blocks of 4 and 3 heads) and SmolLM2's (group 3: 2 and 1). Only where even the
// most splits leave fewer blocks than multiprocessors (`kv_heads` (sequences x KV heads) x
// `most_splits` below `min_blocks`, the multiprocessor count: batch 1, a step bound by latency, not
// bytes) do chunks of the group add the blocks instead. H200, Qwen2.5-7B shapes, W4A16 step
// (perf-notes, "Decode attention: a KV head's query group in one block"): whole groups -12 to
// -36 % at batch 8-64 and 8-32 K context, and at batch 2 from 8 K (2 x 4 KV heads x 32 splits = 256 blocks:
// -2 / -14 % at 8 / 32 K); chunks 6-14 % faster at batch 1, and at batch 2-4 with 512 keys (8 splits).
inline int decode_heads_per_block(int64_t group, int64_t kv_heads, int64_t most_splits, int64_t min_blocks) {
  const int whole = group > 4 ? 8 : group > 2 ? 4 : group > 1 ? 2 : 1;
  const int chunk = group >= 8 ? 8 : group >= 4 ? 4 : group >= 2 ? 2 : 1;
  return whole == chunk || kv_heads * most_splits >= min_blocks ? whole : chunk;
}

// Splits for `blocks` independent blocks over `keys` keys on `sms` multiprocessors, limited by
// what the workspace holds for `rows` query rows.
inline int64_t plan_splits(int64_t blocks, int64_t keys, int64_t sms, int64_t rows, int64_t head_dim,
                           size_t workspace_bytes) {
  const int64_t target = attention_blocks_per_sm() * sms;
  int64_t splits = std::min(max_attention_splits(keys), std::max<int64_t>(1, (target + blocks - 1) / std::max<int64_t>(blocks, 1)));
  while (splits > 1 && kAttentionCounterBytes + attention_partial_bytes(splits, rows, head_dim) > workspace_bytes)
    --splits;
  return std::max<int64_t>(splits, 1);
}

// Splits for a launch of `blocks` blocks a split (decode: (sequence, head group) blocks): as many as fill one wave
// of the kernel's `resident` blocks (its occupancy times the multiprocessors), never past it, at
// most `most_splits` (the context's), limited by what the workspace holds for `rows` query rows.
// A second, partial wave or a first one a third empty costs more than the splits save: H200, Qwen2.5-7B
// shapes, 32 K context, W4A16 step at batch 8 / 16 / 32 (528 resident) 8.87 / 14.85 / 22.42 ms with
// 288 / 320 / 384 blocks (plan_splits, 2 a multiprocessor rounded up), 6.10 / 10.66 / 17.85 ms with
// 512 (perf-notes, "Decode attention: splits that fill one wave").
inline int64_t plan_wave_splits(int64_t blocks, int64_t most_splits, int64_t resident, int64_t rows,
                                int64_t head_dim, size_t workspace_bytes) {
  int64_t splits = std::clamp<int64_t>(resident / std::max<int64_t>(blocks, 1), 1, std::max<int64_t>(most_splits, 1));
  while (splits > 1 && kAttentionCounterBytes + attention_partial_bytes(splits, rows, head_dim) > workspace_bytes)
    --splits;
  return splits;
}

}  // namespace qspec::cuda::detail
