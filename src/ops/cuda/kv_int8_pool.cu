// The int8 KV cache's pool layout on the host (attention.h Kv8Planes): sizes, carving one
// allocation into planes and scales, and the launchers' shared check of a PagedKv.
#include "ops/cuda/attention.h"
#include "ops/cuda/common.h"

namespace qspec::cuda {
namespace {
size_t aligned_256(size_t bytes) { return (bytes + 255) / 256 * 256; }
size_t plane_bytes(int64_t num_blocks, int64_t num_kv_heads, int64_t head_dim) {
  return aligned_256(static_cast<size_t>(num_blocks * num_kv_heads * kKvBlockSize * (head_dim / 2)));
}
}  // namespace

size_t kv8_pool_bytes(int64_t num_blocks, int64_t num_kv_heads, int64_t head_dim) {
  QSPEC_CHECK(num_blocks > 0 && num_kv_heads > 0 && head_dim > 0 && head_dim % 8 == 0,
              "cuda::kv8_pool_bytes: bad shape (", num_blocks, " blocks, ", num_kv_heads, " kv heads, head_dim ",
              head_dim, ")");
  return 2 * plane_bytes(num_blocks, num_kv_heads, head_dim) +
         aligned_256(static_cast<size_t>(num_blocks * num_kv_heads * kKvBlockSize) * sizeof(f16_bits));
}

Kv8Planes kv8_planes_in(void* pool, int64_t num_blocks, int64_t num_kv_heads, int64_t head_dim) {
  QSPEC_CHECK(pool != nullptr && reinterpret_cast<uintptr_t>(pool) % 256 == 0,
              "cuda::kv8_planes_in: the pool is not a 256-byte aligned allocation");
  auto* base = static_cast<uint8_t*>(pool);
  const size_t plane = plane_bytes(num_blocks, num_kv_heads, head_dim);
  return Kv8Planes{base, base + plane, reinterpret_cast<f16_bits*>(base + 2 * plane)};
}

size_t kv_pool_bytes_per_position(KvCacheFormat format, int64_t num_kv_heads, int64_t head_dim) {
  return format == KvCacheFormat::int8 ? static_cast<size_t>(num_kv_heads * (head_dim + 2))
                                       : static_cast<size_t>(num_kv_heads * head_dim * 2);
}

void check_paged_kv(const char* op, const PagedKv& kv, int64_t head_dim) {
  if (!kv.int8()) {
    QSPEC_CHECK(kv.view == KvView::full, "cuda::", op,
                ": the 4-bit view (KvView::high_nibble) reads an int8 cache; this one is f16");
    return;
  }
  QSPEC_CHECK(attention_head_dim_supported(head_dim), "cuda::", op, ": an int8 KV cache at head_dim ", head_dim,
              " (supported: ", attention_head_dims_text(), ")");
  for (const Kv8Planes* pool : {&kv.k8, &kv.v8})
    QSPEC_CHECK(pool->high != nullptr && pool->low != nullptr && pool->scales != nullptr &&
                    is_aligned_16(pool->high) && is_aligned_16(pool->low) && is_aligned_16(pool->scales),
                "cuda::", op, ": the int8 KV cache's ", pool == &kv.k8 ? "K" : "V",
                " planes and scales must be set and 16-byte aligned (PagedKv::k8 / v8)");
}

}  // namespace qspec::cuda
