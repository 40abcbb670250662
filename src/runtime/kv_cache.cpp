#include "runtime/kv_cache.h"

#include "qspec/error.h"

namespace qspec {

namespace {
int64_t checked_rows(int64_t layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size) {
  QSPEC_CHECK(layers > 0 && num_kv_heads > 0 && head_dim > 0, "KV pool: bad shape (", layers, " layers, ",
              num_kv_heads, " KV heads of ", head_dim, ")");
  QSPEC_CHECK(num_blocks > 0, "KV pool: needs at least one block, got ", num_blocks);
  QSPEC_CHECK(block_size > 0, "KV pool: block size must be positive, got ", block_size);
  return num_blocks * block_size;
}
}  // namespace

KvBlockPool::KvBlockPool(int64_t layers, int64_t num_kv_heads, int64_t head_dim, KvCacheFormat format,
                         int64_t num_blocks, int64_t block_size, bool with_storage)
    : layers_(layers),
      kv_dim_(num_kv_heads * head_dim),
      num_blocks_(num_blocks),
      block_size_(block_size),
      storage_(layers, checked_rows(layers, num_kv_heads, head_dim, num_blocks, block_size), num_kv_heads, head_dim,
               format, with_storage) {
  allocated_.assign(static_cast<size_t>(num_blocks), 0);
  // Block 0 on top of the stack: a fresh pool hands out 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

size_t KvBlockPool::block_bytes(int64_t layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                KvCacheFormat format) {
  return static_cast<size_t>(layers * block_size) * KvStorage::position_bytes(num_kv_heads, head_dim, format);
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
