// W4A8 GEMM for many tokens on wgmma with the weights taken from registers: the same math, tile
// and bits as w4_s8_wgmma_kernel (w4_s8_wgmma.cuh), without the unpack kernel and its n x k int8
// scratch buffer.
//
// Why: the unpack kernel + wgmma GEMM spends 15-20 % of its time at 1024 tokens in the unpack (it
// reads the packed weights and writes and rereads twice their bytes, alone on the GPU); the
// fused and cooperative kernels (w4_s8_wgmma_fused.cuh) moved that unpack into the GEMM but kept
// an int8 weight tile in shared memory, one more round trip through a memory whose bandwidth the
// wgmma's operand reads and the copies already mostly use (perf-notes). Here the packed
// weights go by TMA into shared memory (8 KB a stage instead of 16) and each mma thread loads its
// own A fragment from them, turns the nibbles into int8 in registers (4 instructions for 8
// weights) and issues the wgmma with A from registers (wgmma ... {a0..a3}, b-desc): no int8
// weight tile anywhere.
//
// The fragment. The packed layout (ops/w4a16_pack.h) is mma.m16n8k32's A fragment with k
// permuted: lane 4g + t' holds rows g / g + 8 (even / odd nibbles) at physical k 8t'..8t'+7 of each
// 32-k pair (word 0: 8t'..+3, word 1: 8t'+4..+7), the order the mma.sync kernels' x loads match.
// A wgmma reads its B (the tokens) from shared memory unpermuted, so thread (g, t) needs k 4t..4t+3
// (a0 / a1) and 16 + 4t.. (a2 / a3): word t & 1 of lanes 4g + t / 2 and 4g + 2 + t / 2. Each thread
// loads those two lanes' 16-byte pieces a 64-k chunk (both pairs of the chunk), and the byte
// permute that orders the nibbles picks the word as well (int4_words_to_s8_x16).
// The weights come 16 x (u - 8) (the nibble at the top of its byte): the sums are 16 x, exact
// through the float bias (|sum| <= 2^21), and the group scale / 16 (exact) gives the same fma.
//
// The stage: the token box (128 x 128 bytes, 128-byte swizzle, as w4_s8_wgmma_kernel) and the
// packed weights of the tile's 8 row blocks (8 x 1 KB). The weights come through a 3D tensor map
// (128-byte rows, 8 rows a stage, a row block a plane) with the 128-byte swizzle, so a warp's
// 16-byte loads of lanes 4g + {0, 1} (or + {2, 3}) spread over all 8 bank groups (2 wavefronts, the
// least 256 distinct bytes take) instead of 4 of them. Weight rows past the matrix arrive as
// zeros; their outputs are dropped.
//
// The loop is w4_s8_wgmma_kernel's: a block barrier a stage, one thread refilling the ring
// kStages - 2 ahead, two groups an iteration with double-buffered sums (and now double-buffered
// A fragments: a group's registers stay untouched until its wgmma is waited for). The weight
// copies of the first stages need nothing from the previous kernel and go out before
// griddepcontrol.wait.
#pragma once
#include <cuda.h>

#include "ops/cuda/kernels/w4_s8_wgmma.cuh"

namespace qspec::cuda::kernels {

template <int STAGES, int UNROLL, int I2F_OF_8>
struct W4S8RegisterTile {
  static constexpr int kRows = 128, kTokens = 128, kStageK = 128;
  static constexpr int kStages = STAGES;
  static constexpr int kUnroll = UNROLL;
  static constexpr int kI2fOf8 = I2F_OF_8;
  static constexpr int kThreads = 256;
  static constexpr int kMmaThreads = kThreads;
  static constexpr int kBBytes = kTokens * kStageK;            // the token box
  static constexpr int kPackedBytes = kRows / 16 * 1024;       // 8 row blocks x 2 chunks x 512 bytes
  static constexpr int kStageBytes = kBBytes + kPackedBytes;   // a multiple of 1024: every box aligned
  static constexpr int kOutPitch = kRows + 8;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  static_assert(kStageBytes % 1024 == 0, "the swizzled boxes need 1024-byte alignment");
  static_assert(kTokens * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the ring");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// w_map: the packed weights as [row blocks][k / 16 rows][128 bytes], boxes of 8 x 8 x 128 bytes
// (one stage of 8 row blocks); x_map: the activation codes as w4_s8_wgmma_kernel's.
template <class T>
__global__ __launch_bounds__(T::kThreads, 1) void w4_s8_wgmma_rs_kernel(const __grid_constant__ CUtensorMap w_map,
                                                                        const __grid_constant__ CUtensorMap x_map,
                                                                        const W4S8WgmmaParams p) {
#if QSPEC_WGMMA
  constexpr int kAhead = T::kStages - 2;  // prefetch distance (w4_s8_wgmma_kernel's reasoning)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __shared__ uint64_t stage_full[T::kStages];

  const int tid = threadIdx.x, warpgroup = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * T::kTokens, row0 = blockIdx.y * T::kRows;
  const int stages = p.k / T::kStageK;

  auto b_tile = [&](int slot) { return ring + slot * T::kStageBytes; };
  auto packed_tile = [&](int slot) { return ring + slot * T::kStageBytes + T::kBBytes; };
  auto load_weights = [&](int slot, int st) { tma_load_3d(packed_tile(slot), &w_map, 0, st * 8, row0 / 16, &stage_full[slot]); };
  auto load_tokens = [&](int slot, int st) { tma_load_2d(b_tile(slot), &x_map, st * T::kStageK, m0, &stage_full[slot]); };
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) mbarrier_init(&stage_full[i], 1);
    fence_proxy_async_shared();
    // The weights are no earlier kernel's output: their first copies go out before the wait.
    for (int st = 0; st < kAhead && st < stages; ++st) {
      mbarrier_arrive_expect_tx(&stage_full[st], T::kStageBytes);
      load_weights(st, st);
    }
  }
  __syncthreads();

  // This thread's two 16-byte pieces of chunk c of its warp's row block (lanes 4g + t / 2 and
  // 4g + 2 + t / 2: 128-byte row 4c + g / 2, piece 4 (g & 1) + t / 2 (+ 2), swizzled by the row).
  const int warp_row_block = warpgroup * 4 + warp, piece = 4 * (g & 1) + (t >> 1);
  uint32_t piece_offset[2][2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int row = 4 * c + (g >> 1);
    piece_offset[c][0] = warp_row_block * 1024 + swizzled_offset(row, 16 * piece);
    piece_offset[c][1] = warp_row_block * 1024 + swizzled_offset(row, 16 * (piece + 2));
  }
  const uint32_t word_selector = (t & 1) ? 0x7564u : 0x3120u;  // word 1 or word 0 of each pair
  const uint32_t flip = 0x88888888u, keep = 0xf0f0f0f0u;       // int4_words_to_s8_x16's masks
  constexpr float kInverseWeightFactor = 1.0f / 16.0f;

  float total[64];  // zeroed, with this thread's scale words
  const uint32_t* const scale_words = w4_s8_thread_scales(p, row0, warpgroup, warp, g, total);
  int sums[2][64];
  uint32_t a[2][4][4];  // [buffer][k32 step][register]: a group's A fragments, live until its wait

  grid_dependency_wait();  // the activations come from the previous kernel
  grid_launch_dependents();
  if (tid == 0)
    for (int st = 0; st < kAhead && st < stages; ++st) load_tokens(st, st);

  // Stage st: wait for its data, refill the slot freed two stages ago, build the group's A
  // fragments, issue its four wgmma into sums[B]; returns the group's scale pair.
  auto issue_stage = [&](auto buffer, int st) {
    constexpr int B = decltype(buffer)::value;
    const uint32_t scale_word = __ldg(scale_words + st * 8);
    const int slot = st % T::kStages;
    __syncthreads();  // every warpgroup is done with stage st - 2
    if (tid == 0 && st + kAhead < stages) {
      const int refill = (st + kAhead) % T::kStages;
      mbarrier_arrive_expect_tx(&stage_full[refill], T::kStageBytes);
      load_weights(refill, st + kAhead);
      load_tokens(refill, st + kAhead);
    }
    mbarrier_wait(&stage_full[slot], (st / T::kStages) & 1);
    const uint32_t packed = smem_address(packed_tile(slot));
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint4 lo = load_shared_16(packed + piece_offset[c][0]);  // k 4t.. of both pairs
      const uint4 hi = load_shared_16(packed + piece_offset[c][1]);  // k 16 + 4t..
      int4_words_to_s8_x16(lo.x, lo.y, word_selector, flip, keep, a[B][2 * c][0], a[B][2 * c][1]);
      int4_words_to_s8_x16(hi.x, hi.y, word_selector, flip, keep, a[B][2 * c][2], a[B][2 * c][3]);
      int4_words_to_s8_x16(lo.z, lo.w, word_selector, flip, keep, a[B][2 * c + 1][0], a[B][2 * c + 1][1]);
      int4_words_to_s8_x16(hi.z, hi.w, word_selector, flip, keep, a[B][2 * c + 1][2], a[B][2 * c + 1][3]);
    }
    const uint64_t b_desc = wgmma_descriptor_128b(b_tile(slot));
    wgmma_fence();
    wgmma_fence_operands(sums[B]);
#pragma unroll
    for (int kk = 0; kk < T::kStageK / 32; ++kk) wgmma_s8_m64n128k32_rs(sums[B], a[B][kk], b_desc + 2 * kk, kk);
    wgmma_commit();
    return scale_word;
  };
  // After a group's wait: its sums are final and its A registers free (pinned until here).
  auto retire_group = [&](auto buffer, uint32_t scale_word) {
    constexpr int B = decltype(buffer)::value;
    wgmma_fence_operands(sums[B]);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[B][kk][r])::"memory");
    w4_s8_scale_group<T::kI2fOf8>(total, sums[B], scale_word, kInverseWeightFactor);
  };
  using Zero = std::integral_constant<int, 0>;
  using One = std::integral_constant<int, 1>;
  int st = 0;
  for (; st + T::kUnroll <= stages; st += T::kUnroll) {
    uint32_t group_scale[T::kUnroll];
#pragma unroll
    for (int j = 0; j < T::kUnroll; ++j) {
      if (j % 2 == 0) group_scale[j] = issue_stage(Zero{}, st + j);
      else group_scale[j] = issue_stage(One{}, st + j);
      if (j > 0) {
        wgmma_wait<1>();
        if ((j - 1) % 2 == 0) retire_group(Zero{}, group_scale[j - 1]);
        else retire_group(One{}, group_scale[j - 1]);
      }
    }
    wgmma_wait<0>();
    if ((T::kUnroll - 1) % 2 == 0) retire_group(Zero{}, group_scale[T::kUnroll - 1]);
    else retire_group(One{}, group_scale[T::kUnroll - 1]);
  }
  for (; st < stages; ++st) {
    const uint32_t scale_word = issue_stage(Zero{}, st);
    wgmma_wait<0>();
    retire_group(Zero{}, scale_word);
  }
  __syncthreads();  // the ring becomes the output tile

  w4_s8_store_tile<T>(total, ring, p, warpgroup * 64 + warp * 16 + g, t, tid, [] { __syncthreads(); });
#else
  (void)p;
  __trap();
#endif
}

}  // namespace qspec::cuda::kernels
