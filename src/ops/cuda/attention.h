// Paged attention on the GPU: the KV cache layout, decode and prefill kernels (CPU twin: ops/attention.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"
#include "ops/attention.h"
#include "ops/kv_int8.h"

namespace qspec::cuda {

// ---- paged attention ------------------------------------------------------------------

// K/V pool of one layer: f16 [num_blocks, kKvBlockSize, num_kv_heads * head_dim]. Position p
// of sequence s lives in block block_tables[s * max_blocks_per_seq + p / kKvBlockSize], row
// p % kKvBlockSize.
inline constexpr int kKvBlockSize = 16;

// The head_dims the attention kernels (decode, prefill, their split-K combine) are built for:
// each is a template instantiation, so a model of another head_dim is refused at load rather
// than run on a kernel that was never compiled. Every launcher and the GPU model check this
// one list (256: Gemma 3).
inline constexpr int64_t kAttentionHeadDims[] = {32, 64, 128, 256};
constexpr bool attention_head_dim_supported(int64_t head_dim) {
  for (const int64_t d : kAttentionHeadDims)
    if (d == head_dim) return true;
  return false;
}
constexpr int64_t attention_max_head_dim() {
  int64_t widest = 0;
  for (const int64_t d : kAttentionHeadDims) widest = d > widest ? d : widest;
  return widest;
}
// "32, 64, 128, 256": the list for error messages.
inline std::string attention_head_dims_text() {
  std::string text;
  for (const int64_t d : kAttentionHeadDims) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return text;
}
// Throws unless the attention kernels of head_dim run on the current device: one of
// kAttentionHeadDims, and the prefill block's shared memory (160 KB at 256) within what the device
// gives a block. The GPU model calls it at load, so a Gemma 3 on an sm_89 card is refused there
// rather than at its first prefill.
void check_attention_runs_here(int64_t head_dim);

// ---- the 8-bit cache (KvCacheFormat::int8; the numbers are ops/kv_int8.h's) ----------------
// A layer's K (and its V) is three arrays, each block of the pool holding its kKvBlockSize
// positions head by head, so that the 16 rows of one KV head a decode or prefill block reads are
// one contiguous run (full 32-byte sectors at every head_dim, one sector of scales):
//   high   [num_blocks][num_kv_heads][kKvBlockSize][head_dim / 2] bytes: each code's high 4 bits
//          (two's complement, code >> 4), two codes a byte;
//   low    the same shape: each code's low 4 bits (code & 15);
//   scales [num_blocks][num_kv_heads][kKvBlockSize] f16: the row's kv8 scale.
// A 4-bit-view pass (KvView::high_nibble) reads only `high` and `scales`: a quarter of the f16
// cache's bytes. Within a plane row, each 4-byte word holds 8 consecutive elements, element e of
// the word in nibble (e / 2) + 4 (e % 2) (little-endian nibble order: bits 4n .. 4n + 3), so
// that one mask of 0x000F000F picks the pair (2i, 2i + 1) into the two halves of an f16x2
// (kernels/kv_int8.cuh): kv8_nibble_index gives an element's nibble in its row.
struct Kv8Planes {
  uint8_t* high = nullptr;
  uint8_t* low = nullptr;
  f16_bits* scales = nullptr;
};
// The nibble of a plane row (byte index / 2, bits 4 (index % 2) ..) that holds element e.
constexpr int64_t kv8_nibble_index(int64_t e) { return e / 8 * 8 + (e % 8) / 2 + 4 * (e % 2); }
// The row of (pool block, KV head, position in the block) in the planes (head_dim / 2 bytes a
// row) and the scales (one a row).
constexpr int64_t kv8_row(int64_t block, int64_t kv_head, int64_t slot, int64_t num_kv_heads) {
  return (block * num_kv_heads + kv_head) * kKvBlockSize + slot;
}
// Bytes of one int8 pool (K or V of a layer) of num_blocks blocks in one allocation: the high
// plane, the low plane, then the scales, each 256-byte aligned (kv8_planes_in carves them).
size_t kv8_pool_bytes(int64_t num_blocks, int64_t num_kv_heads, int64_t head_dim);
Kv8Planes kv8_planes_in(void* pool, int64_t num_blocks, int64_t num_kv_heads, int64_t head_dim);
// Bytes one position takes in one layer's K or V pool: num_kv_heads * head_dim * 2 in f16,
// num_kv_heads * (head_dim + 2) in int8 (codes and a scale a row).
size_t kv_pool_bytes_per_position(KvCacheFormat format, int64_t num_kv_heads, int64_t head_dim);

// A layer's cache as the kernels see it. f16: k_pool / v_pool, [num_blocks, kKvBlockSize,
// num_kv_heads * head_dim] (above). int8: k8 / v8 (layout above), k_pool / v_pool unused. Every
// write stores whole rows (f16 values, or both planes and the scale); `view` is what the
// attention of this pass reads (the verify, plain steps and full-view drafts: full; a `/k4`
// draft: high_nibble, int8 only). The block tables and the positions are the same in both.
struct PagedKv {
  PagedKv() = default;
  // An f16 cache (the fields after max_blocks_per_seq keep their defaults).
  PagedKv(f16_bits* k, f16_bits* v, const int32_t* tables, int64_t max_blocks)
      : k_pool(k), v_pool(v), block_tables(tables), max_blocks_per_seq(max_blocks) {}
  f16_bits* k_pool = nullptr;
  f16_bits* v_pool = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], device
  int64_t max_blocks_per_seq = 0;
  KvCacheFormat format = KvCacheFormat::f16;
  Kv8Planes k8, v8;
  KvView view = KvView::full;
  bool int8() const { return format == KvCacheFormat::int8; }
};
// Throws (naming `op`) unless the kernels take kv's format and view at this head_dim: the 4-bit
// view only on an int8 cache; int8 at the head_dims of kAttentionHeadDims with its six arrays
// present and 16-byte aligned.
void check_paged_kv(const char* op, const PagedKv& kv, int64_t head_dim);

// A batch of query runs: sequence s owns tokens query_start[s] .. query_start[s + 1] - 1 of
// q / out (device arrays), token t sits at positions[t] and attends causally to positions
// 0..positions[t] of its sequence's cache (within the sliding window when set). The host
// values size the grid: num_tokens = query_start[num_seqs], max_query_len >= every run's
// length, max_context > every position.
struct QueryBatch {
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  const int32_t* query_start = nullptr;  // [num_seqs + 1]
  const int32_t* positions = nullptr;    // [tokens]
  int64_t max_query_len = 0;
  int64_t max_context = 0;
};

// Writes new K/V rows (after RoPE) of every token of the batch into the pool at the token's
// position (overwriting what was there: QSpec's verify overwrites its drafts' entries).
// k / v: f16 [tokens, *] with rows row_stride apart, num_kv_heads * head_dim values each.
void paged_kv_write(const f16_bits* k, const f16_bits* v, int64_t row_stride, const QueryBatch& batch,
                    const PagedKv& kv, int64_t num_kv_heads, int64_t head_dim, void* stream);

// What a family does to a token's q, k and v heads between the QKV GEMM and RoPE
// (io/model_config.h LayerRecipe, ModelConfig::attention_bias), done where RoPE is, so that every
// activation path's GEMM (cuBLAS, W4A16, the low-bit kernels, ARC) gets it and no pass of its own
// reads the qkv rows again: the q/k/v biases (Qwen2) are added to the GEMM's f16 output and the
// sum rounded to f16 (what a bias in the GEMM's epilogue would store), then each q and k head is
// RMS-normalized with its weights (Qwen3, Gemma 3; f32 statistics, no rounding before RoPE).
// Device pointers, null where the model has none. CPU twin: the bias of cpu::linear, cpu::rmsnorm
// over head_dim rows and cpu::rope, in that order (LlamaModel::run_layer).
struct QkvPrologue {
  const float* bias = nullptr;    // f32 [num_heads * head_dim + 2 * num_kv_heads * head_dim]: q | k | v
  const float* q_norm = nullptr;  // f32 [head_dim] (with k_norm)
  const float* k_norm = nullptr;  // f32 [head_dim]
  float eps = 1e-6f;
  bool normalizes() const { return q_norm != nullptr; }
  bool any() const { return bias != nullptr || q_norm != nullptr; }
};

// rope on the q and k heads of fused qkv rows ([tokens, row_stride]: num_heads q heads, then
// num_kv_heads k heads, then the v heads), then paged_kv_write of the rotated k and the v: one
// launch where the two ops take two, bitwise the same results (the model's per-layer path).
// With a prologue, the biases and q/k norms first (a warp a head, in the same launch); the
// rows then hold the biased v and the normalized, rotated q and k.
void rope_kv_write(f16_bits* qkv, int64_t row_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                   const QueryBatch& batch, const float* inv_freq, float attention_scaling, const PagedKv& kv,
                   void* stream, const QkvPrologue& prologue = {});

// Scratch for split-K attention (partial outputs + softmax statistics), bytes for `rows`
// = tokens * num_heads query rows. The launchers need at least this much workspace when they
// split (they decide; pass the size from here for the largest batch you run).
size_t attention_workspace_bytes(int64_t tokens, int64_t num_heads, int64_t head_dim, int64_t max_context);
// Zeroes the workspace's arrival counters: once after allocating it (the launches leave them
// zero), before the first attention launch that uses it.
void attention_workspace_init(void* workspace, size_t bytes, void* stream);

// Which decode attention kernel paged_attention_decode launches: mma (the tiles kernel with its
// scores and P V on tensor cores, head_dim 64 and up; tiles at head_dim 32), tiles (each
// block's keys and values of two tiles in flight at once, scores and P V in f32 FMAs), chunked
// (the earlier kernel: keys, then values, 32 at a time) or automatic (the default: mma, which
// runs the f32 tiles at head_dim 32).
// QSPEC_DECODE_ATTENTION=automatic|mma|tiles|chunked picks it for a process; set_decode_attention
// overrides both (tests and benchmarks compare them in one run).
enum class DecodeAttention { tiles, chunked, mma, automatic };
DecodeAttention decode_attention();
void set_decode_attention(DecodeAttention kernel);

// Decode: one query per sequence (q, out: [num_seqs, num_heads * head_dim] rows q_stride /
// out_stride apart), sequence s attends to its context_lens[s] cached positions (the query
// sits at position context_lens[s] - 1). GQA, head_dims of kAttentionHeadDims, flash-decoding split-K
// over the context when the batch alone does not fill the GPU. Scores scaled by shape.scale (0: 1/sqrt(head_dim)).
void paged_attention_decode(const f16_bits* q, int64_t q_stride, int64_t num_seqs, const int32_t* context_lens,
                            int64_t max_context, const PagedKv& kv, const cpu::AttentionShape& shape,
                            f16_bits* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                            void* stream);

// Decode with RoPE and the new token's K/V write folded in: bitwise rope_kv_write, then
// paged_attention_decode on the rotated rows. qkv: each sequence's token as unrotated [q heads,
// k heads, v heads] rows qkv_stride apart; batch: one token a sequence (query_start[s] = s), at
// batch.positions[s] = context_lens[s] - 1, batch.max_context the largest context. The tiles
// kernel does it in one launch and leaves qkv as it was; with the chunked kernel, or
// QSPEC_DECODE_ROPE=separate, it runs the two launches, which rotate qkv in place. The one
// launch reads context_lens, the block tables and the cache's earlier positions before its
// grid-dependency wait (PDL, common.h): the kernel before it on the stream must not write them
// (in a decode step the host or the draft chain's input update does, before the first layer).
// A prologue's biases are folded into the one launch too (bitwise rope_kv_write's); q/k norms
// take the two launches (not folded yet: one more launch a layer in Qwen3's decode steps).
void paged_attention_decode_rope(f16_bits* qkv, int64_t qkv_stride, const QueryBatch& batch,
                                 const int32_t* context_lens, const float* inv_freq, float attention_scaling,
                                 const PagedKv& kv, const cpu::AttentionShape& shape, f16_bits* out,
                                 int64_t out_stride, void* workspace, size_t workspace_bytes, void* stream,
                                 const QkvPrologue& prologue = {});
// Whether paged_attention_decode_rope runs one launch: QSPEC_DECODE_ROPE (folded, the default,
// or separate) and the tiles kernel selected.
bool decode_rope_folded();

// Multi-query (prefill, QSpec verify): every token of the batch attends causally to its
// sequence's cache, which must already hold positions 0..max position of the run (write the
// run's own K/V first with paged_kv_write). FlashAttention-2 tiling on f16 mma.sync; query
// rows of one KV head (tokens x GQA group) share each K/V tile; split-K over the context for
// short runs over long caches. q / out: [tokens, num_heads * head_dim], rows q_stride / out_stride apart.
void paged_attention_prefill(const f16_bits* q, int64_t q_stride, const QueryBatch& batch, const PagedKv& kv,
                             const cpu::AttentionShape& shape, f16_bits* out, int64_t out_stride,
                             void* workspace, size_t workspace_bytes, void* stream);

}  // namespace qspec::cuda
