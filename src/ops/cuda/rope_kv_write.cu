// Launcher of the fused RoPE + paged KV write (attention.h rope_kv_write), with or without a
// family's q/k/v biases and q/k norms.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/kv_int8.cuh"
#include "ops/cuda/kernels/rope_kv_write.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

// The prologue kernel holds a head in registers, so the widest head the attention takes must fit
// there: every supported model gets its biases and q/k norms (Gemma 3's at head_dim 256).
static_assert(attention_max_head_dim() <= 64 * kernels::kPrologueMaxPairsPerLane,
              "rope_kv_write_prologue_kernel: raise kPrologueMaxPairsPerLane for the widest attention head_dim");

void rope_kv_write(f16_bits* qkv, int64_t row_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                   const QueryBatch& batch, const float* inv_freq, float attention_scaling, const PagedKv& kv,
                   void* stream, const QkvPrologue& prologue) {
  const int64_t width = num_kv_heads * head_dim, q_dim = num_heads * head_dim;
  QSPEC_CHECK(num_heads > 0 && num_kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0 &&
                  row_stride >= q_dim + 2 * width,
              "cuda::rope_kv_write: bad shape heads ", num_heads, " kv_heads ", num_kv_heads, " head_dim ", head_dim,
              " row_stride ", row_stride);
  QSPEC_CHECK(batch.num_seqs >= 0 && batch.num_seqs < 65536 && batch.max_query_len >= 0,
              "cuda::rope_kv_write: bad batch (", batch.num_seqs, " sequences, max_query_len ", batch.max_query_len,
              ")");
  QSPEC_CHECK((prologue.q_norm == nullptr) == (prologue.k_norm == nullptr),
              "cuda::rope_kv_write: q_norm and k_norm come together");
  QSPEC_CHECK(!prologue.any() || head_dim <= 64 * kernels::kPrologueMaxPairsPerLane, "cuda::rope_kv_write: head_dim ",
              head_dim, " above ", 64 * kernels::kPrologueMaxPairsPerLane, " with biases or q/k norms");
  check_paged_kv("rope_kv_write", kv, head_dim);
  if (batch.num_seqs == 0 || batch.max_query_len == 0) return;
  const bool vec = width % 8 == 0 && q_dim % 8 == 0 && row_stride % 8 == 0 && is_aligned_16(qkv) &&
                   is_aligned_16(kv.k_pool) && is_aligned_16(kv.v_pool);
  kernels::RopeKvWriteParams params{};
  params.qkv = reinterpret_cast<__half*>(qkv);
  params.row_stride = row_stride;
  params.num_heads = num_heads;
  params.num_kv_heads = num_kv_heads;
  params.head_dim = head_dim;
  params.query_start = batch.query_start;
  params.positions = batch.positions;
  params.inv_freq = inv_freq;
  params.attention_scaling = attention_scaling;
  params.block_tables = kv.block_tables;
  params.max_blocks = kv.max_blocks_per_seq;
  params.k_pool = reinterpret_cast<__half*>(kv.k_pool);
  params.v_pool = reinterpret_cast<__half*>(kv.v_pool);
  // An int8 cache: the q and k heads rotated in place (cuda::rope, or the prologue kernel writing no
  // cache), then paged_kv_write quantizes the rotated k and the v rows whole (a row's scale needs
  // all of it, which rope_kv_write_kernel's threads do not hold). The rows are bitwise the f16
  // path's, so the codes are kv8's of what an f16 cache would hold. One launch more than the f16
  // cache's (to fold later: a warp a head, as in the prologue kernel).
  const auto write_int8 = [&] {
    detail::paged_kv_write_int8(qkv + q_dim, qkv + q_dim + width, row_stride, batch, kv, num_kv_heads, head_dim,
                                as_stream(stream));
  };
  if (prologue.any()) {
    params.bias = prologue.bias;
    params.q_norm = prologue.q_norm;
    params.k_norm = prologue.k_norm;
    params.eps = prologue.eps;
    // A warp a head (q, k and v heads): 8 warps a block, as many blocks a token as that takes.
    const int64_t heads = num_heads + 2 * num_kv_heads;
    const int64_t parts = std::min<int64_t>((heads + 7) / 8, 64);
    const dim3 grid(static_cast<unsigned>(batch.max_query_len), static_cast<unsigned>(batch.num_seqs),
                    static_cast<unsigned>(parts));
    if (kv.int8()) {
      launch_pdl(kernels::rope_kv_write_prologue_kernel<false>, grid, dim3(256), 0, as_stream(stream), params);
      QSPEC_CUDA_CHECK_LAUNCH("rope_kv_write_prologue_kernel");
      write_int8();
      return;
    }
    launch_pdl(kernels::rope_kv_write_prologue_kernel<true>, grid, dim3(256), 0, as_stream(stream), params);
    QSPEC_CUDA_CHECK_LAUNCH("rope_kv_write_prologue_kernel");
    return;
  }
  if (kv.int8()) {
    rope(qkv, batch.num_tokens, num_heads + num_kv_heads, head_dim, row_stride, batch.positions, inv_freq,
         attention_scaling, stream);
    write_int8();
    return;
  }
  // One rotation (and at most one V vector) a thread: 256-thread blocks, as many a token as that takes.
  const int64_t work = std::max((num_heads + num_kv_heads) * head_dim / 2, vec ? width / 8 : width);
  const int64_t threads = std::min<int64_t>(256, (work + 31) / 32 * 32);
  const int64_t parts = std::min<int64_t>((work + threads - 1) / threads, 64);
  const dim3 grid(static_cast<unsigned>(batch.max_query_len), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>(parts));
  const dim3 block(static_cast<unsigned>(threads));
  if (vec) launch_pdl(kernels::rope_kv_write_kernel<8>, grid, block, 0, as_stream(stream), params);
  else launch_pdl(kernels::rope_kv_write_kernel<1>, grid, block, 0, as_stream(stream), params);
  QSPEC_CUDA_CHECK_LAUNCH("rope_kv_write_kernel");
}

}  // namespace qspec::cuda
