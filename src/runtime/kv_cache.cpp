#include "runtime/kv_cache.h"

#include "qspec/error.h"

namespace qspec {

KvBlockPool::KvBlockPool(int64_t layers, int64_t kv_dim, int64_t num_blocks, int64_t block_size, bool with_storage)
    : kv_dim_(kv_dim), num_blocks_(num_blocks), block_size_(block_size), with_storage_(with_storage) {
  QSPEC_CHECK(layers > 0 && kv_dim > 0, "KV pool: bad shape (", layers, " layers, kv_dim ", kv_dim, ")");
  QSPEC_CHECK(num_blocks > 0, "KV pool: needs at least one block, got ", num_blocks);
  QSPEC_CHECK(block_size > 0, "KV pool: block size must be positive, got ", block_size);
  const size_t floats = static_cast<size_t>(num_blocks * block_size * kv_dim);
  keys_.resize(static_cast<size_t>(layers));
  values_.resize(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) {
    if (with_storage) {
      keys_[l].assign(floats, 0.0f);
      values_[l].assign(floats, 0.0f);
    }
    key_pointers_.push_back(keys_[l].data());
    value_pointers_.push_back(values_[l].data());
  }
  allocated_.assign(static_cast<size_t>(num_blocks), 0);
  // Block 0 on top of the stack: a fresh pool hands out 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

size_t KvBlockPool::bytes() const {
  if (!with_storage_) return 0;
  return 2 * keys_.size() * static_cast<size_t>(num_blocks_ * block_size_ * kv_dim_) * sizeof(float);
}

int32_t KvBlockPool::allocate() {
  QSPEC_CHECK(!free_.empty(), "KV pool: all ", num_blocks_, " blocks are in use");
  const int32_t block = free_.back();
  free_.pop_back();
  allocated_[static_cast<size_t>(block)] = 1;
  return block;
}

void KvBlockPool::release(int32_t block) {
  QSPEC_CHECK(block >= 0 && block < num_blocks_ && allocated_[static_cast<size_t>(block)],
              "KV pool: block ", block, " is not allocated");
  allocated_[static_cast<size_t>(block)] = 0;
  free_.push_back(block);
}

int64_t SequenceKv::blocks_needed(const KvBlockPool& pool, int64_t rows) const {
  const int64_t blocks = (rows + pool.block_size() - 1) / pool.block_size();
  return std::max<int64_t>(0, blocks - static_cast<int64_t>(block_table_.size()));
}

bool SequenceKv::reserve(KvBlockPool& pool, int64_t rows) {
  const int64_t needed = blocks_needed(pool, rows);
  if (needed > pool.free_blocks()) return false;
  for (int64_t i = 0; i < needed; ++i) block_table_.push_back(pool.allocate());
  return true;
}

void SequenceKv::set_length(int64_t length, const KvBlockPool& pool) {
  QSPEC_CHECK(length >= 0 && length <= capacity(pool), "KV cache: length ", length, " exceeds the ",
              capacity(pool), " reserved rows");
  length_ = length;
}

void SequenceKv::truncate(KvBlockPool& pool, int64_t length) {
  QSPEC_CHECK(length >= 0 && length <= capacity(pool), "KV cache: truncate to ", length, " but only ",
              capacity(pool), " rows are reserved");
  length_ = length;
  const int64_t keep = (length + pool.block_size() - 1) / pool.block_size();
  while (static_cast<int64_t>(block_table_.size()) > keep) {
    pool.release(block_table_.back());
    block_table_.pop_back();
  }
}

void SequenceKv::release(KvBlockPool& pool) {
  for (int32_t block : block_table_) pool.release(block);
  block_table_.clear();
  length_ = 0;
}

}  // namespace qspec
