// Launcher of the paged KV write: f16 rows copied, or int8 rows quantized into the nibble planes.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/kv_int8.cuh"
#include "ops/cuda/kernels/paged_kv_write.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace detail {
template <int D>
void launch_kv_write_int8(const f16_bits* k, const f16_bits* v, int64_t row_stride, const QueryBatch& batch,
                          const PagedKv& kv, int64_t num_kv_heads, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 128 / (D / 8);
  const dim3 grid(static_cast<unsigned>(batch.max_query_len), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>((2 * num_kv_heads + kRowsPerBlock - 1) / kRowsPerBlock));
  launch_pdl(kernels::paged_kv_write_int8_kernel<D>, grid, dim3(128), 0, stream, reinterpret_cast<const __half*>(k),
             reinterpret_cast<const __half*>(v), row_stride, batch.query_start, batch.positions, kv.block_tables,
             kv.max_blocks_per_seq, static_cast<int>(num_kv_heads), kv.k8, kv.v8);
  QSPEC_CUDA_CHECK_LAUNCH("paged_kv_write_int8_kernel");
}

void paged_kv_write_int8(const f16_bits* k, const f16_bits* v, int64_t row_stride, const QueryBatch& batch,
                         const PagedKv& kv, int64_t num_kv_heads, int64_t head_dim, cudaStream_t stream) {
  // 16-byte chunks of the rows: the int8 write reads k / v as vectors only.
  QSPEC_CHECK(row_stride % 8 == 0 && is_aligned_16(k) && is_aligned_16(v),
              "cuda::paged_kv_write: an int8 cache takes k / v rows 16-byte aligned (row_stride ", row_stride, ")");
  if (head_dim == 32) launch_kv_write_int8<32>(k, v, row_stride, batch, kv, num_kv_heads, stream);
  else if (head_dim == 64) launch_kv_write_int8<64>(k, v, row_stride, batch, kv, num_kv_heads, stream);
  else if (head_dim == 128) launch_kv_write_int8<128>(k, v, row_stride, batch, kv, num_kv_heads, stream);
  else launch_kv_write_int8<256>(k, v, row_stride, batch, kv, num_kv_heads, stream);
}
}  // namespace detail

void paged_kv_write(const f16_bits* k, const f16_bits* v, int64_t row_stride, const QueryBatch& batch,
                    const PagedKv& kv, int64_t num_kv_heads, int64_t head_dim, void* stream) {
  const int64_t width = num_kv_heads * head_dim;
  QSPEC_CHECK(num_kv_heads > 0 && head_dim > 0 && row_stride >= width, "cuda::paged_kv_write: bad shape kv_heads ",
              num_kv_heads, " head_dim ", head_dim, " row_stride ", row_stride);
  QSPEC_CHECK(batch.num_seqs >= 0 && batch.num_seqs < 65536 && batch.max_query_len >= 0,
              "cuda::paged_kv_write: bad batch (", batch.num_seqs, " sequences, max_query_len ", batch.max_query_len, ")");
  check_paged_kv("paged_kv_write", kv, head_dim);
  if (batch.num_seqs == 0 || batch.max_query_len == 0) return;
  if (kv.int8()) {
    detail::paged_kv_write_int8(k, v, row_stride, batch, kv, num_kv_heads, head_dim, as_stream(stream));
    return;
  }
  const bool vec = width % 8 == 0 && row_stride % 8 == 0 && is_aligned_16(k) && is_aligned_16(v) &&
                   is_aligned_16(kv.k_pool) && is_aligned_16(kv.v_pool);
  const dim3 grid(static_cast<unsigned>(batch.max_query_len), static_cast<unsigned>(batch.num_seqs));
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, vec ? width / 8 : width)));
  const auto* kh = reinterpret_cast<const __half*>(k);
  const auto* vh = reinterpret_cast<const __half*>(v);
  auto* kp = reinterpret_cast<__half*>(kv.k_pool);
  auto* vp = reinterpret_cast<__half*>(kv.v_pool);
  if (vec)
    launch_pdl(kernels::paged_kv_write_kernel<8>, dim3(grid), dim3(threads), 0, as_stream(stream),
        kh, vh, row_stride, batch.query_start, batch.positions, kv.block_tables, kv.max_blocks_per_seq, width, kp, vp);
  else
    launch_pdl(kernels::paged_kv_write_kernel<1>, dim3(grid), dim3(threads), 0, as_stream(stream),
        kh, vh, row_stride, batch.query_start, batch.positions, kv.block_tables, kv.max_blocks_per_seq, width, kp, vp);
  QSPEC_CUDA_CHECK_LAUNCH("paged_kv_write_kernel");
}

}  // namespace qspec::cuda
