// KvStorage (model/kv_storage.h): the rows of a KV cache in either format, their byte count, and
// one row's bytes saved and restored.
#include "model/kv_storage.h"

#include <cstring>

#include "qspec/error.h"

namespace qspec {

KvStorage::KvStorage(int64_t layers, int64_t rows, int64_t num_kv_heads, int64_t head_dim, KvCacheFormat format,
                     bool with_storage)
    : format_(format), layers_(layers), rows_(rows), heads_(num_kv_heads), head_dim_(head_dim),
      with_storage_(with_storage) {
  QSPEC_CHECK(layers > 0 && rows > 0 && num_kv_heads > 0 && head_dim > 0, "KV cache: bad shape (", layers,
              " layers, ", rows, " rows, ", num_kv_heads, " KV heads of ", head_dim, ")");
  QSPEC_CHECK(format == KvCacheFormat::f16 || head_dim % 2 == 0, "--kv-cache int8: head_dim ", head_dim,
              " is odd; the 8-bit cache pairs a head's elements in its nibble planes");
  const size_t values = static_cast<size_t>(rows * num_kv_heads * head_dim);
  if (format == KvCacheFormat::f16) {
    keys_.resize(static_cast<size_t>(layers));
    values_.resize(static_cast<size_t>(layers));
    for (int64_t l = 0; l < layers; ++l) {
      if (with_storage) {
        keys_[l].assign(values, 0.0f);
        values_[l].assign(values, 0.0f);
      }
      key_pointers_.push_back(keys_[l].data());
      value_pointers_.push_back(values_[l].data());
    }
    return;
  }
  keys8_storage_.resize(static_cast<size_t>(layers));
  values8_storage_.resize(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l)
    for (Int8Planes* planes : {&keys8_storage_[l], &values8_storage_[l]}) {
      if (with_storage) {
        planes->high.assign(values / 2, 0);
        planes->low.assign(values / 2, 0);
        planes->scales.assign(static_cast<size_t>(rows * num_kv_heads), 0);
      }
      (planes == &keys8_storage_[l] ? keys8_ : values8_)
          .push_back(cpu::Kv8Rows{planes->high.data(), planes->low.data(), planes->scales.data()});
    }
}

size_t KvStorage::position_bytes(int64_t num_kv_heads, int64_t head_dim, KvCacheFormat format) {
  return 2 * (format == KvCacheFormat::int8 ? cpu::kv8_row_bytes(num_kv_heads, head_dim)
                                            : static_cast<size_t>(num_kv_heads * head_dim) * sizeof(float));
}

size_t KvStorage::bytes() const {
  if (!with_storage_) return 0;
  return static_cast<size_t>(layers_ * rows_) * position_bytes(heads_, head_dim_, format_);
}

KvBlocks KvStorage::blocks(const int32_t* block_table, int64_t block_size) const {
  KvBlocks kv;
  kv.block_table = block_table;
  kv.block_size = block_size;
  kv.format = format_;
  if (format_ == KvCacheFormat::int8) {
    kv.keys8 = keys8_.data();
    kv.values8 = values8_.data();
  } else {
    kv.keys = key_pointers_.data();
    kv.values = value_pointers_.data();
  }
  return kv;
}

float* KvStorage::keys(int64_t layer) const {
  QSPEC_CHECK(format_ == KvCacheFormat::f16, "KV cache: an int8 cache has no f32 rows");
  return key_pointers_[static_cast<size_t>(layer)];
}

float* KvStorage::values(int64_t layer) const {
  QSPEC_CHECK(format_ == KvCacheFormat::f16, "KV cache: an int8 cache has no f32 rows");
  return value_pointers_[static_cast<size_t>(layer)];
}

namespace {
// The byte ranges of one row: f32 rows, or each plane's part and the scales.
template <typename Visit>
void row_ranges(const KvBlocks& kv, int64_t layer, int64_t row, int64_t heads, int64_t head_dim, Visit visit) {
  const int64_t kv_dim = heads * head_dim;
  if (kv.format == KvCacheFormat::f16) {
    visit(reinterpret_cast<uint8_t*>(kv.keys[layer] + row * kv_dim), kv_dim * sizeof(float));
    visit(reinterpret_cast<uint8_t*>(kv.values[layer] + row * kv_dim), kv_dim * sizeof(float));
    return;
  }
  for (const cpu::Kv8Rows* rows : {&kv.keys8[layer], &kv.values8[layer]}) {
    visit(rows->high + row * kv_dim / 2, static_cast<size_t>(kv_dim / 2));
    visit(rows->low + row * kv_dim / 2, static_cast<size_t>(kv_dim / 2));
    visit(reinterpret_cast<uint8_t*>(rows->scales + row * heads), heads * sizeof(uint16_t));
  }
}
}  // namespace

void save_kv_row(const KvBlocks& kv, int64_t layer, int64_t row, int64_t num_kv_heads, int64_t head_dim,
                 std::vector<uint8_t>& out) {
  row_ranges(kv, layer, row, num_kv_heads, head_dim,
             [&](const uint8_t* bytes, size_t size) { out.insert(out.end(), bytes, bytes + size); });
}

void restore_kv_row(const KvBlocks& kv, int64_t layer, int64_t row, int64_t num_kv_heads, int64_t head_dim,
                    const uint8_t* in) {
  row_ranges(kv, layer, row, num_kv_heads, head_dim, [&](uint8_t* bytes, size_t size) {
    std::memcpy(bytes, in, size);
    in += size;
  });
}

}  // namespace qspec
