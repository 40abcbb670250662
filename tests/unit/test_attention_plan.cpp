// The GPU attention's host-side planning (ops/cuda/kernels/attention_split.h, plain C++) on the
// CPU: how many query heads a decode block serves, where CI runs without a GPU. The GPU harness
// (tests/gpu, PagedDecode*) runs every heads-a-block size against the CPU attention.
#include <gtest/gtest.h>

#include "ops/cuda/kernels/attention_split.h"

namespace {

using qspec::cuda::detail::decode_heads_per_block;
using qspec::cuda::detail::plan_wave_splits;

constexpr int64_t kTarget = 132;  // the H200's multiprocessors

TEST(DecodeHeadsPerBlock, AWholeGroupGoesInOneBlockUpToEight) {
  // Plenty of blocks (batch 64 x 4 KV heads x 32 splits): each KV head's group in one block.
  const int64_t kv_heads = 64 * 4, splits = 32;
  EXPECT_EQ(decode_heads_per_block(1, kv_heads, splits, kTarget), 1);
  EXPECT_EQ(decode_heads_per_block(2, kv_heads, splits, kTarget), 2);
  EXPECT_EQ(decode_heads_per_block(3, kv_heads, splits, kTarget), 4);  // SmolLM2: one block, not 2 + 1
  EXPECT_EQ(decode_heads_per_block(4, kv_heads, splits, kTarget), 4);  // Llama-3-8B
  EXPECT_EQ(decode_heads_per_block(5, kv_heads, splits, kTarget), 8);
  EXPECT_EQ(decode_heads_per_block(7, kv_heads, splits, kTarget), 8);  // Qwen2.5-7B: one block, not 4 + 3
  EXPECT_EQ(decode_heads_per_block(8, kv_heads, splits, kTarget), 8);
  EXPECT_EQ(decode_heads_per_block(16, kv_heads, splits, kTarget), 8);  // larger groups: chunks of 8
}

TEST(DecodeHeadsPerBlock, ChunksOfTheGroupOnlyWhereTheMostSplitsLeaveTooFewBlocks) {
  // Qwen2.5-7B (4 KV heads, group 7) at batch 1 and 32 K context: 4 x 32 = 128 blocks < 132,
  // so chunks of 4 (256 blocks); at batch 2, 2 x 4 x 32 = 256: the whole group.
  EXPECT_EQ(decode_heads_per_block(7, 1 * 4, 32, kTarget), 4);
  EXPECT_EQ(decode_heads_per_block(7, 2 * 4, 32, kTarget), 8);
  EXPECT_EQ(decode_heads_per_block(7, 8 * 4, 32, kTarget), 8);
  // A short context allows few splits (512 keys: 8): batch 4 then chunks, batch 8 not.
  EXPECT_EQ(decode_heads_per_block(7, 4 * 4, 8, kTarget), 4);
  EXPECT_EQ(decode_heads_per_block(7, 8 * 4, 8, kTarget), 8);
  // The boundary: exactly the multiprocessor count is enough.
  EXPECT_EQ(decode_heads_per_block(3, 33, 4, kTarget), 4);
  EXPECT_EQ(decode_heads_per_block(3, 32, 4, kTarget), 2);
  // Where a whole group already is a power of two, nothing to choose.
  EXPECT_EQ(decode_heads_per_block(4, 1, 1, kTarget), 4);
  EXPECT_EQ(decode_heads_per_block(1, 1, 1, kTarget), 1);
}

TEST(PlanWaveSplits, FillOneWaveOfResidentBlocksNeverPastIt) {
  constexpr int64_t kResident = 4 * 132;  // the tensor-core decode kernel on an H200
  constexpr size_t kRoomy = size_t{1} << 30;
  // Qwen2.5-7B at 32 K (4 KV heads, 32 splits at most): 512 blocks at batch 8 / 16 / 32 / 64.
  EXPECT_EQ(plan_wave_splits(8 * 4, 32, kResident, 8 * 28, 128, kRoomy), 16);
  EXPECT_EQ(plan_wave_splits(16 * 4, 32, kResident, 16 * 28, 128, kRoomy), 8);
  EXPECT_EQ(plan_wave_splits(32 * 4, 32, kResident, 32 * 28, 128, kRoomy), 4);
  EXPECT_EQ(plan_wave_splits(64 * 4, 32, kResident, 64 * 28, 128, kRoomy), 2);
  // Few blocks: the context's most splits; more blocks than a wave: one split.
  EXPECT_EQ(plan_wave_splits(4 * 4, 32, kResident, 4 * 28, 128, kRoomy), 32);
  EXPECT_EQ(plan_wave_splits(4 * 4, 9, kResident, 4 * 28, 128, kRoomy), 9);
  EXPECT_EQ(plan_wave_splits(1024, 32, kResident, 1024 * 7, 128, kRoomy), 1);
  // A workspace too small for the partials of 16 splits takes fewer.
  const size_t room_for_8 = qspec::cuda::detail::kAttentionCounterBytes +
                            qspec::cuda::detail::attention_partial_bytes(8, 8 * 28, 128);
  EXPECT_EQ(plan_wave_splits(8 * 4, 32, kResident, 8 * 28, 128, room_for_8), 8);
}

}  // namespace
