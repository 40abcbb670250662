// Launchers of the decode attention (one query a sequence; chunked, tiles and tensor-core tiles kernels).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/attention_split.h"
#include "ops/cuda/kernels/paged_attention_decode.cuh"
#include "ops/cuda/kernels/paged_attention_decode_tiles.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace detail {
using DecodeKernel = void (*)(kernels::DecodeParams);
// paged_attention_decode_int8.cu: the tiles kernel's INT8 instances.
DecodeKernel decode_kernel_int8(int64_t head_dim, int heads_per_block);
}  // namespace detail
namespace {
// detail::decode_heads_per_block, or QSPEC_DECODE_HEADS_PER_BLOCK=1|2|4|8 (a benchmark knob).
int decode_heads_per_block(int64_t group, int64_t kv_heads, int64_t keys) {
  static const int forced = [] {
    const int value = env_int("QSPEC_DECODE_HEADS_PER_BLOCK", 0, 0, 8);
    QSPEC_CHECK(value == 0 || value == 1 || value == 2 || value == 4 || value == 8, "QSPEC_DECODE_HEADS_PER_BLOCK=",
                value, ": 1, 2, 4 or 8");
    return value;
  }();
  if (forced > 0) return forced;
  return detail::decode_heads_per_block(group, kv_heads, detail::max_attention_splits(keys), multiprocessor_count());
}

// QSPEC_DECODE_SPLITS=1..32: every decode launch runs this many splits (capped by the context and
// the workspace), for sweeps of the split plan; 0 (default): detail::plan_wave_splits.
int64_t forced_decode_splits() {
  static const int64_t value = env_int("QSPEC_DECODE_SPLITS", 0, 0, static_cast<int>(detail::kMaxAttentionSplits));
  return value;
}

// The decode kernel's blocks resident on the whole GPU at once (its occupancy a multiprocessor
// times the multiprocessors), asked of the runtime once a kernel.
int64_t resident_blocks(detail::DecodeKernel kernel) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int64_t> known;
  const std::lock_guard lock(mutex);
  const auto found = known.find(reinterpret_cast<const void*>(kernel));
  if (found != known.end()) return found->second;
  int per_multiprocessor = 0;
  QSPEC_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, kernels::kDecodeWarps * 32, 0));
  const int64_t blocks = std::max(per_multiprocessor, 1) * multiprocessor_count();
  known.emplace(reinterpret_cast<const void*>(kernel), blocks);
  return blocks;
}

// QSPEC_DECODE_PLAN_LOG=1: each distinct decode plan once on stderr (heads a block, splits, grid,
// and the kernel's resident blocks), to read a sweep by.
void log_decode_plan(int heads_per_block, dim3 grid, int64_t resident) {
  static const bool on = env_int("QSPEC_DECODE_PLAN_LOG", 0, 0, 1) == 1;
  if (!on) return;
  static std::mutex mutex;
  static std::set<std::tuple<int, unsigned, unsigned, unsigned>> seen;
  const std::lock_guard lock(mutex);
  if (!seen.insert({heads_per_block, grid.x, grid.y, grid.z}).second) return;
  std::fprintf(stderr, "decode plan: heads/block %d, grid %u x %u x %u = %u blocks, %lld resident\n",
               heads_per_block, grid.x, grid.y, grid.z, grid.x * grid.y * grid.z, static_cast<long long>(resident));
}

// -1: follow QSPEC_DECODE_ATTENTION; else a DecodeAttention set by set_decode_attention.
std::atomic<int> decode_attention_override{-1};

template <int D, bool MMA>
auto* tiles_kernel(int heads_per_block) {
  return heads_per_block == 1   ? kernels::paged_attention_decode_tiles_kernel<D, 1, MMA>
         : heads_per_block == 2 ? kernels::paged_attention_decode_tiles_kernel<D, 2, MMA>
         : heads_per_block == 4 ? kernels::paged_attention_decode_tiles_kernel<D, 4, MMA>
                                : kernels::paged_attention_decode_tiles_kernel<D, 8, MMA>;
}

// automatic: the tensor-core tiles wherever they run (head_dim 64 and up; the f32 tiles at 32).
// Measured on the H100 (docs/perf-journal/perf-notes-journal-2026.md, "Decode attention on tensor cores" and "The decode
// attention's automatic choice at long contexts"), W4A16 steps against the f32 tiles: at contexts
// of 512-560 keys 1-4 % shorter at batch 8-64 (the same at batch 1), at 2048 keys 3.5-12 % shorter
// at batch 8-64, on Llama-3-8B (GQA) and Llama-2-7B (MHA) shapes. An earlier rule ran the f32
// tiles on splits of more than 256 keys, on evidence that did not hold up.

template <int D>
detail::DecodeKernel decode_kernel_d(int heads_per_block) {
  DecodeAttention choice = decode_attention();
  if (choice == DecodeAttention::automatic) choice = DecodeAttention::mma;
  if (choice == DecodeAttention::chunked)
    return heads_per_block == 1   ? kernels::paged_attention_decode_kernel<D, 1>
           : heads_per_block == 2 ? kernels::paged_attention_decode_kernel<D, 2>
           : heads_per_block == 4 ? kernels::paged_attention_decode_kernel<D, 4>
                                  : kernels::paged_attention_decode_kernel<D, 8>;
  if constexpr (D >= 64)
    return choice == DecodeAttention::mma ? tiles_kernel<D, true>(heads_per_block)
                                          : tiles_kernel<D, false>(heads_per_block);
  return tiles_kernel<D, false>(heads_per_block);  // the tensor-core tiles need head_dim >= 64
}

detail::DecodeKernel decode_kernel(int64_t D, int heads_per_block, bool int8) {
  if (int8) return detail::decode_kernel_int8(D, heads_per_block);
  return D == 32    ? decode_kernel_d<32>(heads_per_block)
         : D == 64  ? decode_kernel_d<64>(heads_per_block)
         : D == 128 ? decode_kernel_d<128>(heads_per_block)
                    : decode_kernel_d<256>(heads_per_block);
}
}  // namespace

DecodeAttention decode_attention() {
  static const DecodeAttention from_env = [] {
    const char* text = std::getenv("QSPEC_DECODE_ATTENTION");
    if (text == nullptr || *text == '\0') return DecodeAttention::automatic;
    const std::string value(text);
    QSPEC_CHECK(value == "automatic" || value == "mma" || value == "tiles" || value == "chunked",
                "QSPEC_DECODE_ATTENTION: '", value, "' is not automatic, mma, tiles or chunked");
    return value == "automatic" ? DecodeAttention::automatic
           : value == "mma"     ? DecodeAttention::mma
           : value == "tiles"   ? DecodeAttention::tiles
                                : DecodeAttention::chunked;
  }();
  const int forced = decode_attention_override.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<DecodeAttention>(forced) : from_env;
}
void set_decode_attention(DecodeAttention kernel) {
  decode_attention_override.store(static_cast<int>(kernel), std::memory_order_relaxed);
}

bool decode_rope_folded() {
  static const bool from_env = [] {
    const char* text = std::getenv("QSPEC_DECODE_ROPE");
    if (text == nullptr || *text == '\0') return true;
    const std::string value(text);
    QSPEC_CHECK(value == "folded" || value == "separate", "QSPEC_DECODE_ROPE: '", value,
                "' is not folded or separate");
    return value == "folded";
  }();
  return from_env && decode_attention() != DecodeAttention::chunked;
}

namespace {
// Both entry points check first, so the folded call's two-launch fallback never runs
// rope_kv_write on a shape the attention would refuse.
void check_decode_shape(const char* op, const cpu::AttentionShape& shape, const PagedKv& kv, int64_t q_stride,
                        int64_t out_stride, int64_t num_seqs, int64_t max_context) {
  const int64_t D = shape.head_dim, H = shape.num_heads, KV = shape.num_kv_heads;
  QSPEC_CHECK(attention_head_dim_supported(D), "cuda::", op, ": head_dim ", D, " (supported: ",
              attention_head_dims_text(), ")");
  QSPEC_CHECK(KV > 0 && H % KV == 0 && q_stride >= H * D && out_stride >= H * D && q_stride % 8 == 0, "cuda::", op,
              ": bad shape heads ", H, " kv_heads ", KV, " q_stride ", q_stride);
  QSPEC_CHECK(shape.sliding_window >= 0 && shape.sink_tokens >= 0, "cuda::", op, ": bad window ",
              shape.sliding_window, " / sinks ", shape.sink_tokens);
  QSPEC_CHECK(num_seqs >= 0 && num_seqs < 65536 && max_context > 0, "cuda::", op, ": bad batch (", num_seqs,
              " sequences, max_context ", max_context, ")");
  check_paged_kv(op, kv, D);
  // An int8 cache has the kernel automatic picks only (tensor cores; the f32 tiles at head_dim 32).
  const DecodeAttention choice = decode_attention();
  QSPEC_CHECK(!kv.int8() || choice == DecodeAttention::automatic || choice == DecodeAttention::mma ||
                  (choice == DecodeAttention::tiles && D == 32),
              "cuda::", op, ": an int8 KV cache runs on the automatic decode attention (mma), not ",
              choice == DecodeAttention::chunked ? "chunked" : "tiles", " at head_dim ", D,
              " (QSPEC_DECODE_ATTENTION / set_decode_attention)");
}

// rope.positions null: q arrives rotated and the cache holds the new K/V.
void launch_decode(const f16_bits* q, int64_t q_stride, int64_t num_seqs, const int32_t* context_lens,
                   int64_t max_context, const PagedKv& kv, const cpu::AttentionShape& shape, f16_bits* out,
                   int64_t out_stride, void* workspace, size_t workspace_bytes, void* stream,
                   const kernels::DecodeRope& rope) {
  const int64_t D = shape.head_dim, H = shape.num_heads, KV = shape.num_kv_heads;
  if (num_seqs == 0) return;
  const int64_t group = H / KV;
  const int64_t keys = shape.visible_keys(max_context - 1);
  const int heads_per_block = decode_heads_per_block(group, num_seqs * KV, keys);
  const int64_t head_chunks = (group + heads_per_block - 1) / heads_per_block;
  const int64_t rows = num_seqs * H;
  const detail::DecodeKernel kernel = decode_kernel(D, heads_per_block, kv.int8());
  const int64_t resident = resident_blocks(kernel);
  // A forced count is planned as one block wanting that many splits (the same caps).
  const bool forced = forced_decode_splits() > 0;
  int64_t splits =
      detail::plan_wave_splits(forced ? 1 : num_seqs * KV * head_chunks, detail::max_attention_splits(keys),
                               forced ? forced_decode_splits() : resident, rows, D,
                               workspace == nullptr ? 0 : workspace_bytes);
  const int64_t split_len = ((keys + splits - 1) / splits + 15) / 16 * 16;
  splits = (keys + split_len - 1) / split_len;

  kernels::DecodeParams params{};
  params.q = reinterpret_cast<const __half*>(q);
  params.q_stride = q_stride;
  params.context_lens = context_lens;
  params.k_pool = reinterpret_cast<__half*>(kv.k_pool);
  params.v_pool = reinterpret_cast<__half*>(kv.v_pool);
  params.block_tables = kv.block_tables;
  params.max_blocks = kv.max_blocks_per_seq;
  params.num_seqs = static_cast<int>(num_seqs);
  params.num_heads = static_cast<int>(H);
  params.num_kv_heads = static_cast<int>(KV);
  params.group = static_cast<int>(group);
  params.head_chunks = static_cast<int>(head_chunks);
  params.window = static_cast<int>(shape.sliding_window);
  params.sinks = static_cast<int>(shape.sink_tokens);
  params.scale_log2 = detail::attention_scale_log2(shape);
  params.split_len = static_cast<int>(split_len);
  params.splits = static_cast<int>(splits);
  params.out = reinterpret_cast<__half*>(out);
  params.out_stride = out_stride;
  params.rope = rope;
  // Split-K: the last block of each (sequence, head group) merges the partials. Splits only
  // happen below half a wave of resident blocks, far fewer groups than there are counters.
  if (splits > 1) {
    QSPEC_CHECK(num_seqs * KV * head_chunks <= detail::kAttentionCounters,
                "cuda::paged_attention_decode: too many blocks to split (", num_seqs * KV * head_chunks, ")");
    params.part_o = detail::attention_partial_o(workspace);
    params.part_ml = reinterpret_cast<float2*>(detail::attention_partial_ml(workspace, splits, rows, D));
    params.counters = static_cast<unsigned*>(workspace);
  }
  const dim3 grid(static_cast<unsigned>(KV * head_chunks), static_cast<unsigned>(num_seqs), static_cast<unsigned>(splits));
  if (kv.int8()) {
    params.k8 = kv.k8;
    params.v8 = kv.v8;
    params.high_only = kv.view == KvView::high_nibble;
  }
  log_decode_plan(heads_per_block, grid, resident);
  launch_pdl(kernel, grid, dim3(kernels::kDecodeWarps * 32), 0, as_stream(stream), params);
  QSPEC_CUDA_CHECK_LAUNCH("paged_attention_decode_kernel");
#if defined(QSPEC_ATTENTION_STAMPS) && defined(QSPEC_ATTENTION_STAMPS_TWICE)
  // Measurement build: the same launch again (it is idempotent) with its code and data warm and
  // its dependency met; the step's time with it says what a warm launch costs (perf-notes).
  launch_pdl(kernel, grid, dim3(kernels::kDecodeWarps * 32), 0, as_stream(stream), params);
#endif
}
}  // namespace

void paged_attention_decode(const f16_bits* q, int64_t q_stride, int64_t num_seqs, const int32_t* context_lens,
                            int64_t max_context, const PagedKv& kv, const cpu::AttentionShape& shape, f16_bits* out,
                            int64_t out_stride, void* workspace, size_t workspace_bytes, void* stream) {
  check_decode_shape("paged_attention_decode", shape, kv, q_stride, out_stride, num_seqs, max_context);
  launch_decode(q, q_stride, num_seqs, context_lens, max_context, kv, shape, out, out_stride, workspace,
                workspace_bytes, stream, kernels::DecodeRope{});
}

void paged_attention_decode_rope(f16_bits* qkv, int64_t qkv_stride, const QueryBatch& batch,
                                 const int32_t* context_lens, const float* inv_freq, float attention_scaling,
                                 const PagedKv& kv, const cpu::AttentionShape& shape, f16_bits* out,
                                 int64_t out_stride, void* workspace, size_t workspace_bytes, void* stream,
                                 const QkvPrologue& prologue) {
  const int64_t D = shape.head_dim, H = shape.num_heads, KV = shape.num_kv_heads;
  check_decode_shape("paged_attention_decode_rope", shape, kv, qkv_stride, out_stride, batch.num_seqs, batch.max_context);
  QSPEC_CHECK(batch.num_tokens == batch.num_seqs && batch.max_query_len <= 1,
              "cuda::paged_attention_decode_rope: a decode batch has one token a sequence (", batch.num_tokens,
              " tokens, ", batch.num_seqs, " sequences)");
  QSPEC_CHECK(qkv_stride >= (H + 2 * KV) * D, "cuda::paged_attention_decode_rope: qkv_stride ", qkv_stride,
              " is narrower than the q, k and v heads (", (H + 2 * KV) * D, ")");
  QSPEC_CHECK(prologue.bias == nullptr || is_aligned_16(prologue.bias),
              "cuda::paged_attention_decode_rope: the biases are not 16-byte aligned");
  if (!decode_rope_folded() || prologue.normalizes()) {  // the two launches: RoPE + KV write rotates qkv in place
    rope_kv_write(qkv, qkv_stride, H, KV, D, batch, inv_freq, attention_scaling, kv, stream, prologue);
    launch_decode(qkv, qkv_stride, batch.num_seqs, context_lens, batch.max_context, kv, shape, out, out_stride,
                  workspace, workspace_bytes, stream, kernels::DecodeRope{});
    return;
  }
  const kernels::DecodeRope rope{batch.positions, inv_freq, attention_scaling, prologue.bias};
  launch_decode(qkv, qkv_stride, batch.num_seqs, context_lens, batch.max_context, kv, shape, out, out_stride,
                workspace, workspace_bytes, stream, rope);
}

}  // namespace qspec::cuda
