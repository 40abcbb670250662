// Split-K attention: the workspace's size and counters, and the prefill's combine launch.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/attention_combine.cuh"
#include "ops/cuda/kernels/attention_split.h"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

size_t attention_workspace_bytes(int64_t tokens, int64_t num_heads, int64_t head_dim, int64_t max_context) {
  return detail::kAttentionCounterBytes +
         detail::attention_partial_bytes(detail::max_attention_splits(max_context), tokens * num_heads, head_dim);
}

void attention_workspace_init(void* workspace, size_t bytes, void* stream) {
  if (workspace != nullptr && bytes > 0)
    QSPEC_CUDA_CHECK(
        cudaMemsetAsync(workspace, 0, std::min(bytes, detail::kAttentionCounterBytes), as_stream(stream)));
}

namespace detail {
int64_t attention_keys_per_split() {
  static const int64_t keys = [] {
    const int value = env_int("QSPEC_ATTENTION_KEYS_PER_SPLIT", static_cast<int>(kKeysPerSplitMin), 16, 1024);
    QSPEC_CHECK(value % 16 == 0, "QSPEC_ATTENTION_KEYS_PER_SPLIT=", value, ": a multiple of 16");
    return static_cast<int64_t>(value);
  }();
  return keys;
}

int64_t attention_blocks_per_sm() {
  static const int64_t blocks =
      env_int("QSPEC_ATTENTION_BLOCKS_PER_SM", static_cast<int>(kAttentionBlocksPerSm), 1, 8);
  return blocks;
}

// Used by the prefill launcher after a split launch (decode merges in its last block).
void launch_attention_combine(void* workspace, int64_t splits, int64_t rows, int64_t num_heads,
                              int64_t head_dim, __half* out, int64_t out_stride, cudaStream_t stream) {
  const float* part_o = attention_partial_o(workspace);
  const auto* part_ml = reinterpret_cast<const float2*>(attention_partial_ml(workspace, splits, rows, head_dim));
  QSPEC_CHECK(splits <= kernels::kCombineMaxSplits, "attention combine: ", splits, " splits (at most ",
              kernels::kCombineMaxSplits, ")");
  QSPEC_CHECK(attention_head_dim_supported(head_dim), "attention combine: head_dim ", head_dim, " (supported: ",
              attention_head_dims_text(), ")");
  const dim3 grid(static_cast<unsigned>((rows + 3) / 4)), block(128);
  auto* kernel = head_dim == 32    ? kernels::attention_combine_kernel<32>
                 : head_dim == 64  ? kernels::attention_combine_kernel<64>
                 : head_dim == 128 ? kernels::attention_combine_kernel<128>
                                   : kernels::attention_combine_kernel<256>;
  launch_pdl(kernel, grid, block, 0, stream, part_o, part_ml, static_cast<int>(splits), rows,
             static_cast<int>(num_heads), out, out_stride);
  QSPEC_CUDA_CHECK_LAUNCH("attention_combine_kernel");
}
}  // namespace detail

}  // namespace qspec::cuda
