// W4A8 GEMM for many tokens on wgmma, with the int4 -> int8 unpack inside the kernel: the same
// math, tile and bits as w4_s8_wgmma_kernel (w4_s8_wgmma.cuh), without the separate unpack kernel
// and its n x k scratch buffer (5-20 % of the GEMM at 1024 tokens, perf-notes).
//
// A block is three warpgroups, warp-specialized:
//   warpgroups 0, 1 (mma)       64 weight rows each: wait for a stage's two operand tiles, issue its
//                               four m64n128k32 wgmma, scale the previous group's sums meanwhile
//                               (the double-buffered sums of w4_s8_wgmma_kernel), release the slot.
//   warpgroup 2 (producer)      four warps, each owning every fourth stage: its lane 0 issues the
//                               copies (the stage's packed weights, 8 row blocks x 1 KB contiguous
//                               in the packed layout: 1D bulk copies; its token box: TMA, 128-byte
//                               swizzle), its 32 lanes turn the packed bytes into the int8 (or
//                               e4m3) weight tile, in the swizzled layout the wgmma descriptor
//                               reads, and arrive.
// The producer needs few registers and gives them to the mma warpgroups (setmaxnreg): 384 threads
// would otherwise leave 168 a thread, and the mma warps hold 192 accumulators.
//
// Two rings. The operand ring (STAGES slots of a weight tile and a token tile) has per slot:
//   tokens_full  the token box landed (the mma warps wait on it);
//   weights_full the 32 lanes of the stage's producer warp wrote the weight tile (each fences the
//                async proxy first, so the wgmma's reads see their generic-proxy stores);
//   slot_free    each of the 8 mma warps finished the stage's wgmma (wgmma.wait_group): the
//                token copy and the unpack of stage st + STAGES may overwrite the slot.
// The packed ring (PACKED slots of 8 KB, packed_full a slot, PACKED / 4 a producer warp) only feeds
// the producer, whose warp frees a slot itself once its lanes have read it: the weight copies run
// PACKED stages ahead of the unpack whatever the mma warps do, and the unpack up to STAGES - 1
// stages ahead of the wgmma. Measured before (perf-notes): the packed bytes in the operand ring,
// copied STAGES - 2 stages ahead, put each stage's unpack on the mma warps' critical path (2.8x
// the unpack kernel + GEMM); one ring of their own but all four warps on every stage, with a
// barrier between the loads and the refill, 1.6x: a chain of latencies a stage.
// The two mma warpgroups run independently (no block barrier in the loop), so one's scaling can
// overlap the other's wgmma; STAGGER starts warpgroup 1 one stage out of step.
//
// The packed weights need nothing from the previous kernel: the first PACKED stages' copies are
// issued before griddepcontrol.wait.
//
// The same loop serves two more weight sources (W4S8FusedTile's SOURCE, below): weights the unpack
// kernel already wrote (a TMA box like the tokens'), and the cooperative unpack, where the blocks
// of a row tile write those weights themselves, once, while the GEMM runs
// (w4_s8_cooperative_producer). All three give the same bits; none beats the unpack kernel +
// w4_s8_wgmma_kernel at 1024-4096 tokens (docs/perf-journal/perf-notes-journal-2026.md), so they run only when asked for.
// (For int8 the register-A kernel, w4_s8_wgmma_rs.cuh, which keeps no int8 weight tile at all,
// beats all of them and is the default.)
#pragma once
#include <cuda.h>

#include "ops/cuda/kernels/w4_s8_wgmma.cuh"

namespace qspec::cuda::kernels {

// BATCH: 16-byte pieces a producer lane loads before converting them (its instruction-level
// parallelism: one warp unpacks a whole stage).
// SOURCE, where the weight tile comes from:
//   kSourceUnpackInProducer  the producer unpacks the packed weights into the swizzled tile (above);
//   kSourceUnpackedTma       already unpacked (w4_unpack_a8_kernel's int8 u - 8 or e4m3 codes), a TMA
//                      box like the tokens': the same warp-specialized loop as a GEMM over the
//                      unpack kernel's output;
//   kSourceCooperative       the blocks of a row tile unpack its weights into global memory together,
//                      once, each stage by whichever block claims it first (stage flags), while
//                      the GEMM runs; every block then reads the stage by TMA as kUnpackedTma.
// PACKED (the producer's packed ring) must be 0 unless the producer unpacks.
enum W4S8WeightSource { kSourceUnpackInProducer = 0, kSourceUnpackedTma = 1, kSourceCooperative = 2 };
template <int STAGES, int PACKED, int UNROLL, int I2F_OF_8, bool STAGGER, int BATCH, int SOURCE = kSourceUnpackInProducer>
struct W4S8FusedTile {
  static constexpr bool kUnpacked = SOURCE != kSourceUnpackInProducer;  // the weight tile comes by TMA
  static constexpr bool kCooperative = SOURCE == kSourceCooperative;
  static constexpr int kProducerBatch = BATCH;
  static constexpr int kRows = 128, kTokens = 128, kStageK = 128;
  static constexpr int kStages = STAGES;         // operand ring slots
  static constexpr int kPackedStages = PACKED;   // packed-weight ring slots
  static constexpr int kUnroll = UNROLL;
  static constexpr int kI2fOf8 = I2F_OF_8;
  static constexpr bool kStagger = STAGGER;
  static constexpr int kMmaThreads = 256;  // warpgroups 0 and 1
  static constexpr int kThreads = 384;     // + the producer warpgroup
  // 2 x 128 x 216 + 128 x 64 <= 64 K; the cooperative producer holds a stage's loads: 200 / 104.
  static constexpr int kMmaRegisters = SOURCE == kSourceCooperative ? 200 : 216;
  static constexpr int kProducerRegisters = SOURCE == kSourceCooperative ? 104 : 64;
  static constexpr int kABytes = kRows * kStageK;    // the int8 weight tile
  static constexpr int kBBytes = kTokens * kStageK;  // the token tile
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kPackedBytes = kRows / 16 * 1024;  // 8 row blocks x 2 chunks x 512 bytes
  static constexpr int kOutPitch = kRows + 8;
  static constexpr int kSmemBytes = kStages * kStageBytes + kPackedStages * kPackedBytes + 1024;
  static_assert(kTokens * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the operand ring");
  static_assert(2 * 128 * kMmaRegisters + 128 * kProducerRegisters <= 65536, "the register file");
  static_assert(kSmemBytes + 64 * (2 * kStages + kPackedStages) <= 227 * 1024, "shared memory");
  static_assert(kUnpacked == (PACKED == 0), "a packed ring exactly when the producer unpacks");
};

// The producer warpgroup of the cooperative kernel. Warp 0's lane 0 feeds the ring: for each
// stage, once its flag says the row tile's weights are in p.unpacked, the weight and token boxes
// by TMA. Warps 1-3 unpack, 96 threads a stage: a stage is claimed by atomicCAS on its flag,
// unpacked into p.unpacked, released. Flags hold launch epochs: in launch E a stage is claimed at
// 2E + 1 and ready at 2E + 2, and anything lower is a free stage (left by an earlier launch), so
// no flag is ever reset; the grid's last block advances the epoch. A block claims, in order:
//   its own stages (stage % blocks of the row = its token tile) of its row tile;
//   the same stages of row tile + lookahead_rows: blocks start one at a time as earlier ones
//     finish, so a row's first blocks would otherwise find its stages not yet unpacked and wait;
//     unpacked a wave ahead, they are ready when that row starts;
//   a sweep of every stage of its row still free (an owner late or not resident).
// A block only ever waits on a stage some running block has claimed: no deadlock.
template <class T, bool E4M3>
__device__ __forceinline__ void w4_s8_cooperative_producer(const CUtensorMap& w_map, const CUtensorMap& x_map,
                                                           const W4S8WgmmaParams& p, uint8_t* ring,
                                                           uint64_t* tokens_full, uint64_t* slot_free, int stages,
                                                           int m0, int row0) {
  constexpr int S = T::kStages;
  constexpr int kEpochWrap = 1 << 29;  // flags stay below 2^30 + 2
  const int ptid = threadIdx.x - T::kMmaThreads, producer_warp = ptid >> 5, lane = ptid & 31;
  const int row_tile = blockIdx.y, token_tile = blockIdx.x, tiles = gridDim.x;
  int* const epoch_word = p.stage_flags;
  int* const grid_arrivals = p.stage_flags + 1;
  auto flag_of = [&](int row, int st) { return p.stage_flags + 2 + static_cast<int64_t>(row) * stages + st; };
  // The previous kernel (perhaps a cooperative GEMM on the same flags and buffer) is complete
  // after the wait: the epoch is this launch's.
  int epoch = 0;
  auto read_epoch = [&] {
    grid_dependency_wait();
    grid_launch_dependents();
    epoch = load_relaxed_gpu(epoch_word);
  };
  if (producer_warp == 0) {
    read_epoch();
    const int ready_value = 2 * epoch + 2;
    if (lane == 0) {
      // A flag read is an L2 round trip: read kFlagsAhead at a time (relaxed, in flight
      // together), remember the run of ready stages, one acquire fence a batch.
      constexpr int kFlagsAhead = 8;
      int ready = 0;  // stages [0, ready) are in p.unpacked
      for (int st = 0; st < stages; ++st) {
        const int slot = st % S;
        if (st >= S) mbarrier_wait(&slot_free[slot], (st / S - 1) & 1);
        while (ready <= st) {
          int flag[kFlagsAhead];
#pragma unroll
          for (int i = 0; i < kFlagsAhead; ++i)
            flag[i] = st + i < stages ? load_relaxed_gpu(flag_of(row_tile, st + i)) : ready_value;
          int run = 0;
#pragma unroll
          for (int i = 0; i < kFlagsAhead; ++i) run += (run == i && flag[i] == ready_value);
          if (run > 0) {
            ready = st + run;
            __threadfence();             // acquire: the stages' bytes before the copies that read them
            fence_proxy_async_global();  // the unpacked stages, seen by the copy engine
          } else {
            __nanosleep(64);
          }
        }
        uint8_t* const tile = ring + slot * T::kStageBytes;
        mbarrier_arrive_expect_tx(&tokens_full[slot], T::kStageBytes);
        tma_load_2d(tile, &w_map, st * T::kStageK, row0, &tokens_full[slot]);
        tma_load_2d(tile + T::kABytes, &x_map, st * T::kStageK, m0, &tokens_full[slot]);
      }
    }
  } else {
    // 96 threads a stage, 6 of its 512 pieces each, all loads in flight at once.
    constexpr int kUnpackThreads = 96, kStagePieces = T::kRows / 16 * 2 * 32;
    constexpr int kPerThread = (kStagePieces + kUnpackThreads - 1) / kUnpackThreads;
    __shared__ int shared_word;
    const int utid = ptid - 32;
    uint4 q[kPerThread];
    // Piece i of stage st of row tile `row`: lane i % 32 of row block i / 64, chunk 2 st + i / 32 % 2.
    auto row_blocks_of = [&](int row) { return min(T::kRows / 16, p.rows / 16 - row * (T::kRows / 16)); };
    auto load_stage = [&](int row, int st) {
      const uint8_t* const codes = p.codes + static_cast<int64_t>(row) * (T::kRows / 16) * p.k * 8;
      const int row_blocks = row_blocks_of(row);  // past the matrix: not written
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int i = utid + kUnpackThreads * j;
        if (i < kStagePieces && i / 64 < row_blocks)
          q[j] = load_stream_16(codes + static_cast<int64_t>(i / 64) * p.k * 8 + (2 * st + i / 32 % 2) * 512 + (i % 32) * 16);
      }
    };
    auto store_stage = [&](int row, int st) {
      int8_t* const out = p.unpacked + static_cast<int64_t>(row) * T::kRows * p.k;
      const int row_blocks = row_blocks_of(row);
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int i = utid + kUnpackThreads * j;
        if (i < kStagePieces && i / 64 < row_blocks) w4_unpack_piece<E4M3>(q[j], i % 32, i / 64, 2 * st + i / 32 % 2, p.k, out);
      }
      fence_proxy_async_global();  // this thread's stores, for the copy engine's reads
      named_barrier_sync(3, kUnpackThreads);
      if (utid == 0) {
        __threadfence();
        store_release_gpu(flag_of(row, st), 2 * epoch + 2);
      }
    };
    // One thread decides for the 96 (flag below 2E + 1: free; claimed by compare-and-swap).
    auto claim = [&](int row, int st) {
      if (utid == 0) {
        int* const flag = flag_of(row, st);
        const int seen = load_relaxed_gpu(flag);
        shared_word = seen < 2 * epoch + 1 && atomicCAS(flag, seen, 2 * epoch + 1) == seen;
      }
      named_barrier_sync(3, kUnpackThreads);
      const bool mine = shared_word != 0;
      named_barrier_sync(3, kUnpackThreads);  // everyone has read it before the next claim
      return mine;
    };
    // The first own stage's packed bytes need nothing from the previous kernel: in flight before
    // the dependency wait (claims and stores wait: the previous GEMM may use the flags and buffer).
    if (token_tile < stages) load_stage(row_tile, token_tile);
    read_epoch();
    for (int st = token_tile; st < stages; st += tiles) {
      if (!claim(row_tile, st)) continue;
      if (st != token_tile) load_stage(row_tile, st);
      store_stage(row_tile, st);
    }
    const int ahead = row_tile + p.lookahead_rows;
    if (p.lookahead_rows > 0 && ahead < static_cast<int>(gridDim.y))
      for (int st = token_tile; st < stages; st += tiles)
        if (claim(ahead, st)) {
          load_stage(ahead, st);
          store_stage(ahead, st);
        }
    // The sweep, 8 flags read at a time, so a row whose stages are all taken costs a few round trips.
    for (int st0 = 0; st0 < stages; st0 += 8) {
      if (utid == 0) {
        int free_stages = 0;  // bit i: stage st0 + i looked free
        for (int i = 0; i < 8 && st0 + i < stages; ++i)
          free_stages |= (load_relaxed_gpu(flag_of(row_tile, st0 + i)) < 2 * epoch + 1) << i;
        shared_word = free_stages;
      }
      named_barrier_sync(3, kUnpackThreads);
      const int free_stages = shared_word;
      named_barrier_sync(3, kUnpackThreads);
      for (int i = 0; i < 8; ++i)
        if ((free_stages >> i & 1) && claim(row_tile, st0 + i)) {
          load_stage(row_tile, st0 + i);
          store_stage(row_tile, st0 + i);
        }
    }
  }
  // This block is done with every flag: the grid's last block starts the next epoch.
  named_barrier_sync(2, 128);
  if (ptid == 0) {
    __threadfence();
    if (atomicAdd(grid_arrivals, 1) == static_cast<int>(gridDim.x * gridDim.y) - 1) {
      *grid_arrivals = 0;
      if (epoch + 1 < kEpochWrap) {
        *epoch_word = epoch + 1;
      } else {  // before the flags would overflow: all free again at epoch 0 (nobody reads them now)
        for (int i = 0; i < kW4S8CooperativeFlagCapacity; ++i) p.stage_flags[2 + i] = 0;
        *epoch_word = 0;
      }
      __threadfence();
    }
  }
}

// x_map: the activation codes [m][k] (rows ldx apart), 128 x 128-byte boxes, 128-byte swizzle.
// p.codes: the packed weights. w_map (T::kUnpacked only): the unpacked weights [rows][k], the
// same boxes. Requirements as w4_s8_wgmma_kernel's.
template <class T, bool E4M3 = false>
__global__ __launch_bounds__(T::kThreads, 1) void w4_s8_wgmma_fused_kernel(const __grid_constant__ CUtensorMap w_map,
                                                                           const __grid_constant__ CUtensorMap x_map,
                                                                           const W4S8WgmmaParams p) {
#if QSPEC_WGMMA
  constexpr int S = T::kStages, P = T::kPackedStages, kProducerWarps = 4;
  static_assert(P % kProducerWarps == 0, "a packed slot belongs to one producer warp");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __shared__ uint64_t packed_full[P > 0 ? P : 1], tokens_full[S], weights_full[S], slot_free[S];

  const int tid = threadIdx.x, warpgroup = tid >> 7;
  const int m0 = blockIdx.x * T::kTokens, row0 = blockIdx.y * T::kRows;
  const int stages = p.k / T::kStageK;
  auto a_tile = [&](int slot) { return ring + slot * T::kStageBytes; };
  auto b_tile = [&](int slot) { return ring + slot * T::kStageBytes + T::kABytes; };
  auto packed_tile = [&](int slot) { return ring + S * T::kStageBytes + slot * T::kPackedBytes; };

  if (tid == 0) {
    for (int i = 0; i < P; ++i) mbarrier_init(&packed_full[i], 1);
    for (int i = 0; i < S; ++i) {
      mbarrier_init(&tokens_full[i], 1);
      mbarrier_init(&weights_full[i], 32);  // the lanes of the stage's producer warp
      mbarrier_init(&slot_free[i], 8);
    }
    fence_proxy_async_shared();  // the barriers' initialization, seen by the copy engine
  }
  __syncthreads();

  if (warpgroup == 2) warpgroup_registers_decrease<T::kProducerRegisters>();
  if constexpr (T::kCooperative) {
    if (warpgroup == 2) {
      w4_s8_cooperative_producer<T, E4M3>(w_map, x_map, p, ring, tokens_full, slot_free, stages, m0, row0);
      return;
    }
  } else if constexpr (T::kUnpacked) {
    // ---- producer, weights unpacked: one thread issues both boxes of every stage ----
    if (warpgroup == 2) {
      if (tid != T::kMmaThreads) return;
      grid_dependency_wait();  // the unpacked weights and the activations come from earlier kernels
      grid_launch_dependents();
      for (int st = 0; st < stages; ++st) {
        const int slot = st % S;
        if (st >= S) mbarrier_wait(&slot_free[slot], (st / S - 1) & 1);
        mbarrier_arrive_expect_tx(&tokens_full[slot], T::kStageBytes);
        tma_load_2d(a_tile(slot), &w_map, st * T::kStageK, row0, &tokens_full[slot]);
        tma_load_2d(b_tile(slot), &x_map, st * T::kStageK, m0, &tokens_full[slot]);
      }
      return;
    }
  } else if (warpgroup == 2) {
    // ---- producer ----
    const int ptid = tid - T::kMmaThreads;
    const int first_block = row0 / 16;
    const int block_row_blocks = min(T::kRows / 16, p.rows / 16 - first_block);
    const uint8_t* const codes = p.codes + static_cast<int64_t>(first_block) * p.k * 8;
    // Row blocks past the matrix are not copied: their weight rows are garbage, and so are
    // the outputs they feed, which the epilogue drops.
    auto load_weights = [&](int st) {
      const int slot = st % P;
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
    // Producer warp w owns stages w, w + 4, w + 8, ...: its operand slots and packed slots are
    // its own (S and P multiples of 4 or not: a slot is freed by the mma warps, a packed slot by
    // the warp itself), and its per-stage chain (wait, 16 loads, unpack, fence, arrive) runs
    // beside the other three warps' instead of one barrier-bound chain for all four.
    const int producer_warp = ptid >> 5, producer_lane = ptid & 31;
    const uint32_t flip = 0x88888888u, keep = 0xf0f0f0f0u;  // int4_word_to_s8_x16's masks
    // Which packed lane (4g + t) this lane converts: a permutation chosen for the shared-memory
    // wavefronts. An 8-byte store is served a half-warp at a time: with the natural order (lanes
    // 4g + t, g 0..3 in a half) its 16 stores hit 4 of the 8 16-byte pieces of a swizzled row
    // group twice (2 wavefronts instead of 1: ncu counted 18 % of all wavefronts excess). Here a
    // half-warp takes g 0..7 with t / 2 = (g / 2 % 2) xor half, so its pieces (k0 / 16) ^ g are
    // all distinct, and each quarter-warp's 16-byte loads still fall in 8 distinct bank groups.
    const int g = (producer_lane & 15) >> 1;
    const int t = 2 * (((g >> 1) & 1) ^ (producer_lane >> 4)) + (producer_lane & 1);
    const int packed_lane = 4 * g + t;
    uint32_t store_offset[2][2];  // [chunk][h]: this lane's byte offsets in a row block of the tile
    {
#pragma unroll
      for (int chunk = 0; chunk < 2; ++chunk)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          store_offset[chunk][h] = static_cast<uint32_t>(swizzled_offset(g, (2 * chunk + h) * 32 + 8 * t));
    }
    if (producer_lane == 0)
      for (int st = producer_warp; st < P && st < stages; st += kProducerWarps) load_weights(st);
    grid_dependency_wait();  // the activations come from the previous kernel
    grid_launch_dependents();

    for (int st = producer_warp; st < stages; st += kProducerWarps) {
      const int slot = st % S, packed_slot = st % P;
      if (st >= S) mbarrier_wait(&slot_free[slot], (st / S - 1) & 1);  // the mma warps are done with it
      if (producer_lane == 0) load_tokens(st);
      mbarrier_wait(&packed_full[packed_slot], (st / P) & 1);
      const uint32_t packed = smem_address(packed_tile(packed_slot)), tile = smem_address(a_tile(slot));
      // Piece i (16 bytes) = 32 j + lane: row block j / 2, chunk j % 2, lane 4g + t of the packed
      // layout (w4_unpack_a8_kernel's mapping, into the swizzled tile instead of global memory).
      // Its words 2h, 2h + 1 hold rows g and g + 8 at k0 = (2 chunk + h) 32 + 8t, stored at
      // row 128 + (((k0 / 16) ^ row) % 8) 16 + k0 % 16 (swizzled_offset): with row % 8 = g that is
      // row_block 2048 + store_offset[chunk][h] (+ 1024 for row g + 8).
      constexpr int kPieces = T::kPackedBytes / 16 / 32, kBatch = T::kProducerBatch;  // a lane's pieces, loads in flight
      static_assert(kPieces % kBatch == 0 && kBatch % 2 == 0, "whole row blocks a batch");
#pragma unroll 1
      for (int j0 = 0; j0 < kPieces; j0 += kBatch) {  // not unrolled: the 64 registers
        uint4 q[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) q[u] = load_shared_16(packed + (32 * (j0 + u) + packed_lane) * 16);
        uint32_t store_at[2][2];  // the batch's first row block; + 2048 a row block, + 1024 for row g + 8
#pragma unroll
        for (int c = 0; c < 4; ++c) store_at[c / 2][c % 2] = tile + (j0 / 2) * 2048 + store_offset[c / 2][c % 2];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int chunk = u & 1, rows = (u / 2) * 2048;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t w0 = h ? q[u].z : q[u].x, w1 = h ? q[u].w : q[u].y;
            uint2 even, odd;  // rows g and g + 8
            if constexpr (E4M3) {
              int4_word_to_e4m3(w0, even.x, odd.x);
              int4_word_to_e4m3(w1, even.y, odd.y);
            } else {  // 16 (u - 8): see kInverseWeightFactor
              int4_word_to_s8_x16(w0, flip, keep, even.x, odd.x);
              int4_word_to_s8_x16(w1, flip, keep, even.y, odd.y);
            }
            store_shared_8(store_at[chunk][h] + rows, even);
            store_shared_8(store_at[chunk][h] + rows + 1024, odd);
          }
        }
      }
      fence_proxy_async_shared();  // the stores, seen by the wgmma (async proxy)
      mbarrier_arrive(&weights_full[slot]);
      // Every lane has read the packed slot: refill it with stage st + P (the generic-proxy reads
      // ordered before the copy engine's writes by __syncwarp and the fence).
      __syncwarp();
      if (producer_lane == 0 && st + P < stages) {
        fence_proxy_async_shared();
        load_weights(st + P);
      }
    }
    return;
  }

  // ---- mma warpgroups ----
  warpgroup_registers_increase<T::kMmaRegisters>();
  const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  grid_dependency_wait();  // the token scales (epilogue) come from the previous kernel
  grid_launch_dependents();

  float total[64];  // zeroed, with this thread's scale words
  const uint32_t* const scale_words = w4_s8_thread_scales(p, row0, warpgroup, warp, g, total);
  using Sum = std::conditional_t<E4M3, float, int>;
  Sum sums[2][64];

  auto issue_stage = [&](auto buffer, int st) {
    constexpr int B = decltype(buffer)::value;
    const uint32_t scale_word = __ldg(scale_words + st * 8);
    const int slot = st % S;
    if constexpr (!T::kUnpacked) mbarrier_wait(&weights_full[slot], (st / S) & 1);
    mbarrier_wait(&tokens_full[slot], (st / S) & 1);  // (unpacked: both boxes)
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
  // int8: the producer stores 16 (u - 8) (half the unpack instructions of u - 8, the producer's
  // issue slots being what the mma warps lose); the sums are 16 x, the scales / 16, the fma the
  // same (w4_s8_scale_group). e4m3: the codes of u - 8.
  // Unpacked: the unpack kernel's u - 8.
  constexpr float kInverseWeightFactor = E4M3 || T::kUnpacked ? 1.0f : 0.0625f;
  auto scale = [&](Sum(&d)[64], uint32_t scale_word) {
    w4_s8_scale_group<T::kI2fOf8>(total, d, scale_word, kInverseWeightFactor);
  };

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
