// The K/V rows of a cache in one of the KvCacheFormats (ops/kv_int8.h): f32 rows (`--kv-cache
// f16`, the CPU's full precision) or the 8-bit cache's nibble planes and scales (ops/kv8_rows.h).
// One class, so the contiguous KvCache and the engine's paged pool (runtime/kv_cache.h) store,
// count and hand out their rows alike; KvBlocks is how the model sees one sequence's rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/kv8_rows.h"

namespace qspec {

// Where one sequence's K/V rows live in every layer: per-layer pools of rows [*, kv_dim],
// position p at row block_table[p / block_size] * block_size + p % block_size (see
// cpu::PagedKv). The contiguous KvCache and the paged cache of runtime/kv_cache.h both hand the
// model one of these.
struct KvBlocks {
  float* const* keys = nullptr;    // [layers] pool bases (format f16)
  float* const* values = nullptr;  // [layers]
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;
  KvCacheFormat format = KvCacheFormat::f16;
  const cpu::Kv8Rows* keys8 = nullptr;    // [layers] (format int8)
  const cpu::Kv8Rows* values8 = nullptr;  // [layers]
  int64_t row(int64_t position) const {
    return static_cast<int64_t>(block_table[position / block_size]) * block_size + position % block_size;
  }
  bool has_rows() const {
    return block_table && block_size > 0 && (format == KvCacheFormat::int8 ? keys8 && values8 : keys && values);
  }
};

class KvStorage {
 public:
  // `rows` rows of K and V per layer, each num_kv_heads heads of head_dim values, zero. Without
  // storage nothing is allocated (a GPU engine's pool only counts blocks). Throws on an int8
  // format with an odd head_dim (the planes pair elements of a head).
  KvStorage(int64_t layers, int64_t rows, int64_t num_kv_heads, int64_t head_dim, KvCacheFormat format,
            bool with_storage = true);
  KvStorage(const KvStorage&) = delete;  // KvBlocks point into it
  KvStorage& operator=(const KvStorage&) = delete;
  KvStorage(KvStorage&&) = default;      // the buffers move with it
  KvStorage& operator=(KvStorage&&) = default;

  // Bytes of one position's K and V rows in one layer: what a cache of `format` holds a position
  // in, the unit of every memory budget.
  static size_t position_bytes(int64_t num_kv_heads, int64_t head_dim, KvCacheFormat format);
  size_t bytes() const;  // 0 without storage
  KvCacheFormat format() const { return format_; }
  int64_t rows() const { return rows_; }
  // The rows as a block table sees them.
  KvBlocks blocks(const int32_t* block_table, int64_t block_size) const;
  // Format f16: layer l's f32 rows [rows, kv_dim] (throws on an int8 cache).
  float* keys(int64_t layer) const;
  float* values(int64_t layer) const;

 private:
  struct Int8Planes {
    std::vector<uint8_t> high, low;
    std::vector<uint16_t> scales;
  };
  KvCacheFormat format_;
  int64_t layers_, rows_, heads_, head_dim_;
  bool with_storage_;
  std::vector<std::vector<float>> keys_, values_;
  std::vector<Int8Planes> keys8_storage_, values8_storage_;
  // What KvBlocks points at (the vectors' buffers stay put when the storage moves).
  std::vector<float*> key_pointers_, value_pointers_;
  std::vector<cpu::Kv8Rows> keys8_, values8_;
};

// One position's K and V rows of `layer` as bytes, appended to `out` (position_bytes of them),
// and written back: the QSpec no-overwrite ablation keeps the draft's rows across the verify.
void save_kv_row(const KvBlocks& kv, int64_t layer, int64_t row, int64_t num_kv_heads, int64_t head_dim,
                 std::vector<uint8_t>& out);
void restore_kv_row(const KvBlocks& kv, int64_t layer, int64_t row, int64_t num_kv_heads, int64_t head_dim,
                    const uint8_t* in);

}  // namespace qspec
