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

  // layers x num_blocks x block_size rows of kv_dim f32 keys and values. Without storage the
  // pool only does the block accounting (the GPU engine: the rows live in the GPU's cache) and
  // key_pools() / value_pools() hold null pointers.
  KvBlockPool(int64_t layers, int64_t kv_dim, int64_t num_blocks, int64_t block_size = kDefaultBlockSize,
              bool with_storage = true);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  int64_t layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const;

  int32_t allocate();          // throws qspec::Error when no block is free (check free_blocks)
  void release(int32_t block);  // throws on a block that is not allocated

  float* const* key_pools() const { return key_pointers_.data(); }
  float* const* value_pools() const { return value_pointers_.data(); }

 private:
  int64_t kv_dim_, num_blocks_, block_size_;
  bool with_storage_ = true;
  std::vector<std::vector<float>> keys_, values_;  // [layer][num_blocks * block_size * kv_dim]
  std::vector<float*> key_pointers_, value_pointers_;
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
    return KvBlocks{pool.key_pools(), pool.value_pools(), block_table_.data(), pool.block_size()};
  }

 private:
  std::vector<int32_t> block_table_;
  int64_t length_ = 0;
};

}  // namespace qspec
