// The paged KV cache of the batching engine: one pool of fixed-size blocks (16 positions by
// default) shared by every sequence, and per-sequence block tables. A sequence grows block by
// block, rolls back rejected draft rows by truncation, has draft rows overwritten in place by
// the verify pass (the model writes each position's row where the table says), and gives its
// blocks back when it finishes or is preempted.
#pragma once
#include <cstdint>
#include <vector>

#include "model/llama.h"

namespace qspec {

class KvBlockPool {
 public:
  static constexpr int64_t kDefaultBlockSize = 16;

  // layers x num_blocks x block_size rows of keys and values, num_kv_heads heads of head_dim
  // each, in `format` (f32 rows, or the 8-bit cache's planes: model/kv_storage.h). Without
  // storage the pool only does the block accounting (the GPU engine: the rows live in the GPU's
  // cache) and its blocks hold null pointers.
  KvBlockPool(int64_t layers, int64_t num_kv_heads, int64_t head_dim, KvCacheFormat format, int64_t num_blocks,
              int64_t block_size = kDefaultBlockSize, bool with_storage = true);
  // f32 rows of kv_dim values (the f16 format's rows need no heads).
  KvBlockPool(int64_t layers, int64_t kv_dim, int64_t num_blocks, int64_t block_size = kDefaultBlockSize,
              bool with_storage = true)
      : KvBlockPool(layers, 1, kv_dim, KvCacheFormat::f16, num_blocks, block_size, with_storage) {}
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  int64_t layers() const { return layers_; }
  int64_t kv_dim() const { return kv_dim_; }
  KvCacheFormat format() const { return storage_.format(); }
  size_t bytes() const { return storage_.bytes(); }
  // Bytes of one block of `format` rows (every layer's K and V): what a memory budget divides by.
  static size_t block_bytes(int64_t layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                            KvCacheFormat format);

  int32_t allocate();          // throws qspec::Error when no block is free (check free_blocks)
  void release(int32_t block);  // throws on a block that is not allocated

  // The pool's rows as a block table sees them.
  KvBlocks blocks(const int32_t* block_table) const { return storage_.blocks(block_table, block_size_); }
  // Format f16: the per-layer bases of the f32 rows (null without storage); null on an int8 pool.
  float* const* key_pools() const { return blocks(nullptr).keys; }
  float* const* value_pools() const { return blocks(nullptr).values; }

 private:
  int64_t layers_, kv_dim_, num_blocks_, block_size_;
  KvStorage storage_;  // num_blocks * block_size rows
  std::vector<int32_t> free_;      // a stack: the most recently freed block is reused first
  std::vector<uint8_t> allocated_;  // per block
};

// One sequence's block table. `length` is the number of positions whose K/V rows are
// committed; rows past it (drafts, a verify in flight) may be written as long as they fit
// the reserved blocks.
class SequenceKv {
 public:
  SequenceKv() = default;
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;
  SequenceKv(SequenceKv&&) = default;
  SequenceKv& operator=(SequenceKv&&) = default;

  int64_t length() const { return length_; }
  int64_t capacity(const KvBlockPool& pool) const {
    return static_cast<int64_t>(block_table_.size()) * pool.block_size();
  }
  const std::vector<int32_t>& block_table() const { return block_table_; }

  // Blocks still to allocate so that `rows` positions fit.
  int64_t blocks_needed(const KvBlockPool& pool, int64_t rows) const;
  // Makes room for `rows` positions; false (and nothing allocated) when the pool is short.
  bool reserve(KvBlockPool& pool, int64_t rows);
  // Commits rows up to `length` (they must fit the reserved blocks).
  void set_length(int64_t length, const KvBlockPool& pool);
  // Sets the committed length (roll back, or commit written rows) and frees the blocks past it.
  void truncate(KvBlockPool& pool, int64_t length);
  // Frees every block (finish, cancel, preemption).
  void release(KvBlockPool& pool);

  KvBlocks blocks(const KvBlockPool& pool) const {
    return pool.blocks(block_table_.data());
  }

 private:
  std::vector<int32_t> block_table_;
  int64_t length_ = 0;
};

}  // namespace qspec
