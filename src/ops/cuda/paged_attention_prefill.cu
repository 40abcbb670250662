// Launcher of the multi-query paged attention (prefill, QSpec verify) and its split-K combine.
#include <cmath>
#include <cstdlib>
#include <string>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/attention_split.h"
#include "ops/cuda/kernels/paged_attention_prefill.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace detail {
void launch_attention_combine(void* workspace, int64_t splits, int64_t rows, int64_t num_heads,
                              int64_t head_dim, __half* out, int64_t out_stride, cudaStream_t stream);
}

namespace {
// The prefill block's dynamic shared memory: Q and two stages of K and V, 64 rows each, 80 KB at
// head_dim 128 and 160 KB at 256 (an H100 / H200 / A100 block takes up to 227 / 227 / 163 KB,
// sm_86 and sm_89 only 99).
size_t prefill_smem_bytes(int64_t D) {
  return D == 32    ? kernels::PrefillSmem<32>::kBytes
         : D == 64  ? kernels::PrefillSmem<64>::kBytes
         : D == 128 ? kernels::PrefillSmem<128>::kBytes
                    : kernels::PrefillSmem<256>::kBytes;
}
}  // namespace

void check_attention_runs_here(int64_t head_dim) {
  QSPEC_CHECK(attention_head_dim_supported(head_dim), "cuda attention: head_dim ", head_dim, " (supported: ",
              attention_head_dims_text(), ")");
  const cudaDeviceProp& device = current_device_properties();
  QSPEC_CHECK(prefill_smem_bytes(head_dim) <= device.sharedMemPerBlockOptin, "cuda attention: head_dim ", head_dim,
              " takes ", prefill_smem_bytes(head_dim), " bytes of shared memory a prefill block; ", device.name,
              " gives a block at most ", device.sharedMemPerBlockOptin);
}

namespace detail {
// paged_attention_prefill_int8.cu: the INT8 instances.
void launch_prefill_int8(const kernels::PrefillParams& params, int64_t head_dim, int key_warps, dim3 grid,
                         cudaStream_t stream);
int prefill_resident_int8(int64_t head_dim, int key_warps);
}  // namespace detail

namespace {

// Warps that split a tile's keys (kernels::kPrefillBlockRows): as many as keep every row group
// full of a run's (token, head) rows. QSPEC_PREFILL_KEY_WARPS=1|2|4 forces one (A/B runs).
int prefill_key_warps(int64_t run_rows) {
  static const int forced = [] {
    const char* text = std::getenv("QSPEC_PREFILL_KEY_WARPS");
    if (text == nullptr || *text == '\0') return 0;
    const std::string value(text);
    QSPEC_CHECK(value == "1" || value == "2" || value == "4", "QSPEC_PREFILL_KEY_WARPS: '", value,
                "' is not 1, 2 or 4");
    return std::stoi(value);
  }();
  if (forced > 0) return forced;
  return run_rows <= 16 ? 4 : run_rows <= 32 ? 2 : 1;
}

// The prefill kernel's blocks resident on the whole GPU at once, for its instance.
int64_t prefill_resident_blocks(int64_t D, int key_warps, bool int8) {
  const int per_multiprocessor = int8          ? detail::prefill_resident_int8(D, key_warps)
                                 : D == 32     ? detail::prefill_resident_kw<32, false>(key_warps)
                                 : D == 64     ? detail::prefill_resident_kw<64, false>(key_warps)
                                 : D == 128    ? detail::prefill_resident_kw<128, false>(key_warps)
                                               : detail::prefill_resident_kw<256, false>(key_warps);
  return per_multiprocessor * multiprocessor_count();
}

// The splits fill one wave of the kernel's resident blocks over the launch's grid
// (detail::plan_wave_splits, as the decode attention plans): the verify at Qwen2.5-7B 32 K batch 8
// / 16 9.9 -> 7.3 / 15.2 -> 12.4 ms, level at batch 32-64 (perf-notes, "Decode attention: splits
// that fill one wave"). QSPEC_PREFILL_SPLITS=fill: the plan before, 2 blocks a multiprocessor over
// the blocks that may find rows (A/B runs).
bool prefill_wave_splits() {
  static const bool wave = [] {
    const char* text = std::getenv("QSPEC_PREFILL_SPLITS");
    if (text == nullptr || *text == '\0') return true;
    const std::string value(text);
    QSPEC_CHECK(value == "wave" || value == "fill", "QSPEC_PREFILL_SPLITS: '", value, "' is not wave or fill");
    return value == "wave";
  }();
  return wave;
}
}  // namespace

void paged_attention_prefill(const f16_bits* q, int64_t q_stride, const QueryBatch& batch, const PagedKv& kv,
                             const cpu::AttentionShape& shape, f16_bits* out, int64_t out_stride, void* workspace,
                             size_t workspace_bytes, void* stream) {
  const int64_t D = shape.head_dim, H = shape.num_heads, KV = shape.num_kv_heads;
  QSPEC_CHECK(attention_head_dim_supported(D), "cuda::paged_attention_prefill: head_dim ", D, " (supported: ",
              attention_head_dims_text(), ")");
  QSPEC_CHECK(KV > 0 && H % KV == 0 && q_stride >= H * D && out_stride >= H * D && q_stride % 8 == 0 &&
                  out_stride % 2 == 0,
              "cuda::paged_attention_prefill: bad shape heads ", H, " kv_heads ", KV, " q_stride ", q_stride);
  QSPEC_CHECK(batch.num_seqs >= 0 && batch.num_seqs < 65536 && batch.max_query_len >= 0 && batch.num_tokens >= 0 &&
                  batch.max_context > 0,
              "cuda::paged_attention_prefill: bad batch (", batch.num_seqs, " sequences, ", batch.num_tokens,
              " tokens, max_query_len ", batch.max_query_len, ", max_context ", batch.max_context, ")");
  check_paged_kv("paged_attention_prefill", kv, D);
  if (batch.num_seqs == 0 || batch.max_query_len == 0 || batch.num_tokens == 0) return;
  const int64_t group = H / KV;
  const int key_warps = prefill_key_warps(batch.max_query_len * group);
  const int64_t block_rows = 64 / key_warps;  // kernels::kPrefillBlockRows<key_warps>
  const int64_t q_tiles = (batch.max_query_len * group + block_rows - 1) / block_rows;
  QSPEC_CHECK(q_tiles < (1ll << 31), "cuda::paged_attention_prefill: query run too long");
  const int64_t rows = batch.num_tokens * H;
  // The blocks the splits are planned over: at most one partial tile a run beyond the tokens' rows.
  // For a verify's short uniform runs this overcounts (Qwen2.5-7B, batch 64, gamma 3: 480 where 256
  // find rows), which plans fewer splits; planning over the 256 measured slower (32 K, batch 32:
  // verify 22.7 -> 27.8 ms; perf-notes, "Tried and closed").
  const int64_t blocks = ((batch.num_tokens * group + block_rows - 1) / block_rows + batch.num_seqs) * KV;
  // A window with sinks reads every tile from position 0 (the sinks' and the window's) and masks
  // the gap: drafts with a sparse view run decode steps (paged_attention_decode), never this.
  const int64_t keys = shape.sliding_window > 0 && shape.sink_tokens == 0
                           ? std::min(batch.max_context, shape.sliding_window + batch.max_query_len)
                           : batch.max_context;
  const int64_t most_splits =
      std::min<int64_t>(detail::max_attention_splits(keys), std::max<int64_t>(1, keys / (2 * kernels::kPrefillKeys)));
  int64_t splits = prefill_wave_splits()
                       ? detail::plan_wave_splits(q_tiles * batch.num_seqs * KV, most_splits,
                                                  prefill_resident_blocks(D, key_warps, kv.int8()), rows, D,
                                                  workspace == nullptr ? 0 : workspace_bytes)
                       : std::min(detail::plan_splits(blocks, keys, multiprocessor_count(), rows, D,
                                                      workspace == nullptr ? 0 : workspace_bytes),
                                  most_splits);

  kernels::PrefillParams params{};
  params.q = reinterpret_cast<const __half*>(q);
  params.q_stride = q_stride;
  params.query_start = batch.query_start;
  params.positions = batch.positions;
  params.k_pool = reinterpret_cast<const __half*>(kv.k_pool);
  params.v_pool = reinterpret_cast<const __half*>(kv.v_pool);
  params.block_tables = kv.block_tables;
  params.max_blocks = kv.max_blocks_per_seq;
  params.num_heads = static_cast<int>(H);
  params.num_kv_heads = static_cast<int>(KV);
  params.group = static_cast<int>(group);
  params.window = static_cast<int>(shape.sliding_window);
  params.sinks = static_cast<int>(shape.sink_tokens);
  params.scale_log2 = detail::attention_scale_log2(shape);
  params.splits = static_cast<int>(splits);
  params.rows = rows;
  params.out = reinterpret_cast<__half*>(out);
  params.out_stride = out_stride;
  if (splits > 1) {
    params.part_o = detail::attention_partial_o(workspace);
    params.part_ml = reinterpret_cast<float2*>(detail::attention_partial_ml(workspace, splits, rows, D));
  }
  const dim3 grid(static_cast<unsigned>(q_tiles), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>(KV * splits));
  cudaStream_t s = as_stream(stream);
  if (kv.int8()) {
    params.k8 = kv.k8;
    params.v8 = kv.v8;
    params.high_only = kv.view == KvView::high_nibble;
    detail::launch_prefill_int8(params, D, key_warps, grid, s);
  } else if (D == 32) {
    detail::launch_prefill_kw<32, false>(key_warps, params, grid, s);
  } else if (D == 64) {
    detail::launch_prefill_kw<64, false>(key_warps, params, grid, s);
  } else if (D == 128) {
    detail::launch_prefill_kw<128, false>(key_warps, params, grid, s);
  } else {
    detail::launch_prefill_kw<256, false>(key_warps, params, grid, s);
  }
  if (splits > 1)
    detail::launch_attention_combine(workspace, splits, rows, H, D, reinterpret_cast<__half*>(out), out_stride, s);
}

}  // namespace qspec::cuda
