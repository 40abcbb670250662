// W4A8 GEMM for many tokens on wgmma, with the int4 -> int8 unpack inside the kernel: the same
// math, tile and bits as w4_s8_wgmma_kernel (w4_s8_wgmma.cuh), without the separate unpack kernel
// and its n x k scratch buffer (5-20 % of the GEMM at 1024 tokens, perf-notes).
//
// A block is three warpgroups, warp-specialized:
//   warpgroups 0, 1 (mma)       64 weight rows each: wait for a stage's two operand tiles, issue its
//                               four m64n128k32 wgmma, scale the previous group's sums meanwhile
//                               (the double-buffered sums of w4_s8_wgmma_kernel), release the slot.
//   warpgroup 2 (producer)      one thread issues the copies: the stage's packed weights (8 row
//                               blocks x 1 KB, contiguous in the packed layout: 1D bulk copies) and
//                               the token box (TMA, 128-byte swizzle); all 128 threads then turn
//                               the packed bytes into the int8 (or e4m3) weight tile, in the
//                               swizzled layout the wgmma descriptor reads, and arrive.
// The producer needs few registers and gives them to the mma warpgroups (setmaxnreg): 384 threads
// would otherwise leave 168 a thread, and the mma warps hold 192 accumulators.
//
// Ring slot s (stage st = s mod STAGES) has four mbarriers:
//   packed_full  the packed bytes landed (the producer waits on it);
//   tokens_full  the token box landed (the mma warps wait on it);
//   weights_full all 128 producer threads wrote the weight tile (they fence.proxy.async first, so
//                the wgmma's async-proxy reads see their generic-proxy stores);
//   slot_free    each of the 8 mma warps finished the stage's wgmma (wgmma.wait_group), so the
//                copies and the unpack of stage st + STAGES may overwrite the slot.
// The copies of stage st + STAGES - 2 are issued while stage st is unpacked: two stages of slack for
// the slowest mma warpgroup, STAGES - 2 for the copies to land. The two mma warpgroups run
// independently (no block barrier in the loop), so one's scaling can overlap the other's wgmma;
// STAGGER starts warpgroup 1 one stage out of step with warpgroup 0's unrolled pairs.
//
// The packed weights need nothing from the previous kernel: the first stages' copies, and their
// unpack, are issued before griddepcontrol.wait.
#pragma once
#include <cuda.h>

#include "ops/cuda/kernels/w4_s8_wgmma.cuh"

namespace qspec::cuda::kernels {

template <int STAGES, int UNROLL, int I2F_OF_8, bool STAGGER>
struct W4S8FusedTile {
  static constexpr int kRows = 128, kTokens = 128, kStageK = 128;
  static constexpr int kStages = STAGES;
  static constexpr int kUnroll = UNROLL;
  static constexpr int kI2fOf8 = I2F_OF_8;
  static constexpr bool kStagger = STAGGER;
  static constexpr int kMmaThreads = 256;  // warpgroups 0 and 1
  static constexpr int kThreads = 384;     // + the producer warpgroup
  static constexpr int kMmaRegisters = 232, kProducerRegisters = 40;  // 2 x 128 x 232 + 128 x 40 <= 64 K
  static constexpr int kABytes = kRows * kStageK;    // the int8 weight tile
  static constexpr int kBBytes = kTokens * kStageK;  // the token tile
  static constexpr int kPackedBytes = kRows / 16 * 1024;  // 8 row blocks x 2 chunks x 512 bytes
  static constexpr int kStageBytes = kABytes + kBBytes + kPackedBytes;
  static constexpr int kOutPitch = kRows + 8;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  static_assert(kTokens * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the ring");
  static_assert(2 * 128 * kMmaRegisters + 128 * kProducerRegisters <= 65536, "the register file");
};

// x_map: the activation codes [m][k] (rows ldx apart), 128 x 128-byte boxes, 128-byte swizzle.
// p.codes: the packed weights. Requirements as w4_s8_wgmma_kernel's.
template <class T, bool E4M3 = false>
__global__ __launch_bounds__(T::kThreads, 1) void w4_s8_wgmma_fused_kernel(const __grid_constant__ CUtensorMap x_map,
                                                                           const W4S8WgmmaParams p) {
#if QSPEC_WGMMA
  constexpr int S = T::kStages, kAhead = T::kStages - 2;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __shared__ uint64_t packed_full[S], tokens_full[S], weights_full[S], slot_free[S];

  const int tid = threadIdx.x, warpgroup = tid >> 7;
  const int m0 = blockIdx.x * T::kTokens, row0 = blockIdx.y * T::kRows;
  const int stages = p.k / T::kStageK;
  auto a_tile = [&](int slot) { return ring + slot * T::kStageBytes; };
  auto b_tile = [&](int slot) { return ring + slot * T::kStageBytes + T::kABytes; };
  auto packed_tile = [&](int slot) { return ring + slot * T::kStageBytes + T::kABytes + T::kBBytes; };

  if (tid == 0) {
    for (int i = 0; i < S; ++i) {
      mbarrier_init(&packed_full[i], 1);
      mbarrier_init(&tokens_full[i], 1);
      mbarrier_init(&weights_full[i], 128);
      mbarrier_init(&slot_free[i], 8);
    }
    fence_proxy_async_shared();  // the barriers' initialization, seen by the copy engine
  }
  __syncthreads();

  if (warpgroup == 2) {
    // ---- producer ----
    warpgroup_registers_decrease<T::kProducerRegisters>();
    const int ptid = tid - T::kMmaThreads;
    const int first_block = row0 / 16;
    const int block_row_blocks = min(T::kRows / 16, p.rows / 16 - first_block);
    const uint8_t* const codes = p.codes + static_cast<int64_t>(first_block) * p.k * 8;
    // Row blocks past the matrix are not copied: their weight rows are garbage, and so are
    // the outputs they feed, which the epilogue drops.
    auto load_weights = [&](int st) {
      const int slot = st % S;
      mbarrier_arrive_expect_tx(&packed_full[slot], block_row_blocks * 1024);
      for (int r = 0; r < block_row_blocks; ++r)
        bulk_copy_to_shared(packed_tile(slot) + r * 1024, codes + static_cast<int64_t>(r) * p.k * 8 + st * 1024, 1024,
                            &packed_full[slot]);
    };
    auto load_tokens = [&](int st) {  // tokens past m arrive as zeros
      const int slot = st % S;
      mbarrier_arrive_expect_tx(&tokens_full[slot], T::kBBytes);
      tma_load_2d(b_tile(slot), &x_map, st * T::kStageK, m0, &tokens_full[slot]);
    };
    if (ptid == 0)
      for (int st = 0; st < kAhead && st < stages; ++st) load_weights(st);
    grid_dependency_wait();  // the activations come from the previous kernel
    grid_launch_dependents();
    if (ptid == 0)
      for (int st = 0; st < kAhead && st < stages; ++st) load_tokens(st);

    for (int st = 0; st < stages; ++st) {
      const int slot = st % S;
      if (ptid == 0 && st + kAhead < stages) {
        const int next = st + kAhead;
        if (next >= S) mbarrier_wait(&slot_free[next % S], (next / S - 1) & 1);  // stage next - S done
        load_weights(next);
        load_tokens(next);
      }
      // The slot was freed before its copy was issued, so the weight tile may be overwritten
      // once the copy has landed.
      mbarrier_wait(&packed_full[slot], (st / S) & 1);
      const uint8_t* const packed = packed_tile(slot);
      uint8_t* const tile = a_tile(slot);
#pragma unroll
      for (int j = 0; j < T::kPackedBytes / 16 / 128; ++j) {
        // Piece i (16 bytes): row block i / 64, chunk (i / 32) % 2, lane i % 32 = 4g + t;
        // w4_unpack_a8_kernel's mapping, into the swizzled tile instead of global memory.
        const int i = ptid + 128 * j, lane = i & 31, chunk = (i >> 5) & 1, g = lane >> 2, t = lane & 3;
        const int row = (i >> 6) * 16 + g;
        const uint4 q = *reinterpret_cast<const uint4*>(packed + i * 16);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t w0 = h ? q.z : q.x, w1 = h ? q.w : q.y;
          const int k0 = (2 * chunk + h) * 32 + 8 * t;
          uint2 even, odd;  // rows g and g + 8
          if constexpr (E4M3) {
            int4_word_to_e4m3(w0, even.x, odd.x);
            int4_word_to_e4m3(w1, even.y, odd.y);
          } else {
            even = make_uint2(int4_bytes_to_s8(w0), int4_bytes_to_s8(w1));
            odd = make_uint2(int4_bytes_to_s8(w0 >> 4), int4_bytes_to_s8(w1 >> 4));
          }
          *reinterpret_cast<uint2*>(tile + swizzled_offset(row, k0)) = even;
          *reinterpret_cast<uint2*>(tile + swizzled_offset(row + 8, k0)) = odd;
        }
      }
      fence_proxy_async_shared();  // the stores, seen by the wgmma (async proxy)
      mbarrier_arrive(&weights_full[slot]);
    }
    return;
  }

  // ---- mma warpgroups ----
  warpgroup_registers_increase<T::kMmaRegisters>();
  const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  grid_dependency_wait();  // the token scales (epilogue) come from the previous kernel
  grid_launch_dependents();
  const int row_block = min((row0 + warpgroup * 64 + warp * 16) / 16, (p.rows / 16) - 1);
  const uint32_t* const scale_words = p.scales + static_cast<int64_t>(row_block) * p.groups * 8 + g;

  float total[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) total[i] = 0.0f;
  using Sum = std::conditional_t<E4M3, float, int>;
  Sum sums[2][64];

  auto issue_stage = [&](auto buffer, int st) {
    constexpr int B = decltype(buffer)::value;
    const uint32_t scale_word = __ldg(scale_words + st * 8);
    const int slot = st % S;
    mbarrier_wait(&weights_full[slot], (st / S) & 1);
    mbarrier_wait(&tokens_full[slot], (st / S) & 1);
    const uint64_t a_desc = wgmma_descriptor_128b(a_tile(slot) + warpgroup * 64 * 128);
    const uint64_t b_desc = wgmma_descriptor_128b(b_tile(slot));
    wgmma_fence();
    wgmma_fence_operands(sums[B]);
#pragma unroll
    for (int kk = 0; kk < T::kStageK / 32; ++kk)
      if constexpr (E4M3) wgmma_e4m3_m64n128k32(sums[B], a_desc + 2 * kk, b_desc + 2 * kk, kk);
      else wgmma_s8_m64n128k32(sums[B], a_desc + 2 * kk, b_desc + 2 * kk, kk);
    wgmma_commit();
    return scale_word;
  };
  // After this warp's wgmma of stage st completed: one arrival a warp frees the slot.
  auto release = [&](int st) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&slot_free[st % S]);
  };
  auto scale = [&](Sum(&d)[64], uint32_t scale_word) { w4_s8_scale_group<T::kI2fOf8>(total, d, scale_word); };

  // The loop of w4_s8_wgmma_kernel (see there for why UNROLL groups an iteration).
  int st = 0;
  auto single_stage = [&] {
    const uint32_t scale_word = issue_stage(std::integral_constant<int, 0>{}, st);
    wgmma_wait<0>();
    release(st);
    wgmma_fence_operands(sums[0]);
    scale(sums[0], scale_word);
    ++st;
  };
  if (T::kStagger && warpgroup == 1 && stages > 0) single_stage();
  for (; st + T::kUnroll <= stages; st += T::kUnroll) {
    uint32_t group_scale[T::kUnroll];
#pragma unroll
    for (int j = 0; j < T::kUnroll; ++j) {
      if (j % 2 == 0) group_scale[j] = issue_stage(std::integral_constant<int, 0>{}, st + j);
      else group_scale[j] = issue_stage(std::integral_constant<int, 1>{}, st + j);
      if (j > 0) {
        wgmma_wait<1>();
        release(st + j - 1);
        wgmma_fence_operands(sums[(j - 1) % 2]);
        scale(sums[(j - 1) % 2], group_scale[j - 1]);
      }
    }
    wgmma_wait<0>();
    release(st + T::kUnroll - 1);
    wgmma_fence_operands(sums[(T::kUnroll - 1) % 2]);
    scale(sums[(T::kUnroll - 1) % 2], group_scale[T::kUnroll - 1]);
  }
  while (st < stages) single_stage();

  // Every copy and every unpack has landed (each stage was waited for); the producer is done
  // with the ring, so the mma warps alone turn it into the output tile.
  named_barrier_sync(1, T::kMmaThreads);
  w4_s8_store_tile<T>(total, ring, p, warpgroup * 64 + warp * 16 + g, t, tid,
                      [] { named_barrier_sync(1, T::kMmaThreads); });
#else
  (void)p;
  __trap();
#endif
}

}  // namespace qspec::cuda::kernels
