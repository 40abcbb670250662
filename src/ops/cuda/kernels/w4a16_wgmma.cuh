// W4A16 GEMM for tens to thousands of tokens on Hopper's own machinery: warpgroup MMA (wgmma)
// with the 4-bit weights as the register A operand, fed by the bulk copy engine, warp-specialised
// (a producer warp copies, two or four mma warpgroups dequantize and multiply), tokens of x read
// by the tensor cores straight from shared memory in their natural k order.
//
// Why this shape (issue 53; docs/perf-notes.md, "W4A16 at batch 16-64, and the QSpec verify"):
// the mma.sync tiles take about their bytes' time plus their mma time at 32-64 tokens, and the
// first wgmma kernel here (register A in the packed k order) had to transpose x in shared memory
// every stage behind two block barriers and wait for its wgmma at every scale group: slower.
// Here nothing waits for anything but data:
// * x arrives by TMA (a 2D tensor map, 64 k x NT tokens a box, the 128-byte swizzle the wgmma
//   descriptor reads), in natural k order, so no thread touches it;
// * the weights stay in their one packed layout (ops/w4a16_pack.h, shared with every other W4A16
//   kernel). Lane 4g + t holds, for each 32-k pair, physical k 8t .. 8t + 7 of rows g and g + 8,
//   where a wgmma k16 step wants k 2t, 2t + 1, 2t + 8, 2t + 9: a 4 x 4 transpose of 16-bit
//   pieces among the 4 lanes of a quad (two shfl.xor rounds) turns each lane's two words into the
//   two packed words of its A fragments in natural order (pair_to_natural below);
// * the group scale is folded into the dequantized weights (f16 (u - 8) * s, as Marlin and
//   Machete do), so the f32 accumulators run across the whole k range and each warpgroup only
//   waits for the wgmma of the batch before last (double-buffered A registers, a batch = one or
//   two pairs).
// The price: the products are of f16-rounded scaled weights (relative 2^-11 a weight) summed in
// 16-k steps of natural order, so the output is not the mma.sync tiles' bit for bit; it is
// within the same bound of the CPU reference (the gpu tests check both).
//
// The block: warpgroup 0 is the producer (its warp 0, lane 0 issues every copy: four TMA a
// stage), warpgroups 1 and 2 (1 - 4 in the 256-row tiles) multiply, 64 weight rows each (a row
// block of 16 a warp), NT = 8 * TILES tokens. A ring of STAGES slots of 128 k (4 pairs): x (two
// 64-k boxes), the tile's row blocks' codes (1 KB each) and scales; a full barrier a slot (the
// producer's expect-tx, completed by the copies) and an empty barrier a slot (one arrival a mma
// warp once its wgmma reading the slot are done). Weights of
// the first STAGES stages go out before griddepcontrol.wait (no earlier kernel writes them).
//
// Why 256 rows (four mma warpgroups, 640 threads): a stage of the 128-row tile takes ~1 us
// whatever its tokens (32 to 128), 2-3x its tensor and bytes time at 64 tokens, because the two
// warps a scheduler issue their dequantization chains with nothing to hide the latency
// (docs/perf-notes.md, "Why it is not at its floor yet"). Four warps a scheduler do twice the
// rows in about the same latency, and Llama-3-8B's gate_up takes 112 row tiles of 256 (one wave
// on 132 multiprocessors) where it took 224 of 128 (1.7 waves). At 32 and 64 tokens the mma
// warps fit the 96 registers a thread that 640 threads leave.
// The 256-token tile (prefill, hundreds to thousands of tokens): 128 accumulators a mma thread,
// so the producer warpgroup gives the mma warpgroups its registers (setmaxnreg) and returns once
// its copies are out (W4A16WgmmaShape's MMA_REGISTERS; no split-K for such a shape). Its x box is
// 8x the stage's weights, so twice the tokens a block halve the L2 reads of x a flop, and each
// weight's dequantization feeds 256 tokens.
// Split-K (grid z) cuts k at 128-k stage boundaries; the epilogue is the tiled kernels'. A short
// last stage (k % 128 != 0) takes no branch: TMA fills what lies past the tensors with zeros, so
// the pairs past k multiply zero weights (zero codes and zero scales) by zero x.
//
// Zero points (ZP, int4-asym weights, ops/w4a16_pack.h): unsigned codes, f16 (u * s + m) folded
// the same way (dequant_folded: one hfma2 a register where int4 has its hmul2). The group
// minimums come from global memory (L2), a stage's few words a lane requested before its full
// barrier's wait, so the ring, its copies and the tensor maps are int4's; int4's instances
// (ZP false) compile as before. Pairs past k still multiply zero x.
//
// Integer zero points (ZC, int4-zp weights): the packed zero points come as the minimums do (a
// word a group a lane), and each word unpacks to u - z (dequant_zero_codes4x8) then takes int4's
// hmul2 by the scales.
//
// x given in the weights' packed k order (PX; W4A16TiledConfig::x_packed, ops/w4a16_pack.h's
// w4a16_packed_x_index): each 32-k block of every token row is the 4 x 4 transpose of its 4-byte
// pieces, so the k order TMA brings is the one the packed codes hold and each lane's two words
// are its A fragments as they are: no quad transposes (two shuffles and ~10 byte permutes a pair,
// a third of an mma warp's instructions and its longest chain). Only a producer of x that writes
// it so (the kernel before the GEMM) makes this pay; producer warps that permuted x in the ring
// were measured 2-3x slower (docs/perf-notes.md, "x in the packed k order: tried, removed").
#pragma once
#include <cuda.h>  // CUtensorMap

#include <type_traits>

#include "ops/cuda/kernels/w4_activation.cuh"  // prmt
#include "ops/cuda/kernels/w4a16_tiled.cuh"
#include "ops/cuda/kernels/wgmma.cuh"

namespace qspec::cuda::kernels {

// (token tiles of 8, ring stages, blocks a multiprocessor, pairs a wgmma batch, row blocks of 16:
// 8 = two mma warpgroups, 16 = four; registers a mma thread, 0 = the even share)
// MMA_REGISTERS: the producer warpgroup hands its registers to the mma warpgroups (setmaxnreg) and
// leaves once its copies are issued, so such a shape has no split-K (its fix-up needs every
// thread): the 256-token tile, whose 128 accumulators and two batches of A fragments a thread
// exceed the 168 registers of 384 threads (at one pair a batch ptxas serialised every wgmma, C7513).
template <int TILES_, int STAGES_, int MIN_BLOCKS_, int BATCH_PAIRS_, int ROW_BLOCKS_ = 8, int MMA_REGISTERS_ = 0>
struct W4A16WgmmaShape {
  static constexpr int TILES = TILES_, STAGES = STAGES_, kMinBlocks = MIN_BLOCKS_, kBatchPairs = BATCH_PAIRS_;
  static constexpr int kMmaRegisters = MMA_REGISTERS_, kProducerRegisters = 56;
  static constexpr bool kSplitK = MMA_REGISTERS_ == 0;
  static constexpr int kTokens = 8 * TILES;
  static constexpr int kRowBlocks = ROW_BLOCKS_, kRows = 16 * kRowBlocks;
  static_assert(kRowBlocks % 4 == 0, "whole mma warpgroups of 64 rows");
  static constexpr int kThreads = 128 + 32 * kRowBlocks;     // producer warpgroup + a warp a row block
  static constexpr int kPairs = 4;                           // 32-k pairs a stage (128 k)
  static constexpr int kBoxBytes = kTokens * 128;            // 64 k x NT tokens of f16, 128B-swizzled
  static constexpr int kXBytes = 2 * kBoxBytes;              // two boxes a stage
  static constexpr int kCodeBytes = kPairs * 256;            // a row block's codes a stage
  static constexpr int kScaleBytes = kPairs * 32;            // its scales: at most a group a pair (G = 32)
  static constexpr int kWBytes = kRowBlocks * (kCodeBytes + kScaleBytes);
  static constexpr int kStageBytes = (kXBytes + kWBytes + 1023) / 1024 * 1024;  // boxes stay 1024-aligned
  static constexpr int kSmemBytes = STAGES * kStageBytes + 1024;                // + the alignment slack
  static_assert(MIN_BLOCKS_ * (kSmemBytes + 1024) <= 228 * 1024, "the rings of kMinBlocks blocks fit a multiprocessor");
  static_assert(kSplitK || (MIN_BLOCKS_ == 1 && 128 * kProducerRegisters + 32 * kRowBlocks * kMmaRegisters <= 65536),
                "the register file");
};

// Lane 4g + t's two words of one pair (w0: k 8t .. 8t + 3, w1: 8t + 4 .. 8t + 7, rows g and g + 8,
// ops/w4a16_pack.h) -> the packed words of k16 steps 0 and 1 in natural order: step s's word holds
// k 16s + 2t, + 1 and 16s + 8 + 2t, + 1 of rows g and g + 8 in the nibble order dequant_int4x8
// reads (a[0] = row g k 2t, 2t + 1, a[1] = row g + 8, a[2] / a[3] k + 8: the A fragment).
//
// A 16-bit piece (j, h) of a word is its bytes h and h + 2: both rows at k 8t + 4j + 2h, + 1.
// Lane t's piece t' of source lane t'' ... in short: lane t needs piece t (j = t >> 1, h = t & 1)
// from each lane of its quad, a 4 x 4 transpose of pieces: two butterfly rounds (xor 1, xor 2),
// each sending the two pieces whose slot bit differs from the lane's. `sel` holds the lane's
// byte selectors (pair_selectors).
struct PairSelectors {
  uint32_t send1, keep_lo, keep_hi;
  bool t0, t1;
};
__device__ __forceinline__ PairSelectors pair_selectors(int t) {
  PairSelectors s;
  s.t0 = (t & 1) != 0;
  s.t1 = (t & 2) != 0;
  s.send1 = s.t0 ? 0x5410u : 0x7632u;    // slots (0, !t0), (1, !t0): the halves !t0 of lo and hi
  s.keep_lo = s.t0 ? 0x3254u : 0x5410u;  // lo' = slot (0, 0), (0, 1): own half t0, received low half
  s.keep_hi = s.t0 ? 0x3276u : 0x7610u;  // hi' = slot (1, 0), (1, 1): own half t0, received high half
  return s;
}
__device__ __forceinline__ void pair_to_natural(uint32_t w0, uint32_t w1, const PairSelectors& sel, uint32_t& step0,
                                                uint32_t& step1) {
  // Slots q = 2j + h: lo = (q 0, q 1) = w0's halves, hi = (q 2, q 3) = w1's.
  uint32_t lo = prmt(w0, w0, 0x3120u), hi = prmt(w1, w1, 0x3120u);
  const uint32_t got1 = __shfl_xor_sync(0xffffffffu, prmt(lo, hi, sel.send1), 1);
  const uint32_t lo1 = prmt(lo, got1, sel.keep_lo), hi1 = prmt(hi, got1, sel.keep_hi);
  const uint32_t got2 = __shfl_xor_sync(0xffffffffu, sel.t1 ? lo1 : hi1, 2);
  lo = sel.t1 ? got2 : lo1;
  hi = sel.t1 ? hi1 : got2;
  // lo = (piece from lane 0, lane 1), hi = (lane 2, lane 3): bytes (a.b0, b.b0, a.b1, b.b1).
  step0 = prmt(lo, lo, 0x3120u);
  step1 = prmt(hi, hi, 0x3120u);
}

// The scales of rows g and g + 8 (a scale word: f16 pair (s_g, s_g+8)), each in both halves.
struct RowScales {
  __half2 g, g8;
};
__device__ __forceinline__ RowScales row_scales(uint32_t scale_pair) {
  const uint32_t row_g = prmt(scale_pair, scale_pair, 0x1010u), row_g8 = prmt(scale_pair, scale_pair, 0x3232u);
  return {*reinterpret_cast<const __half2*>(&row_g), *reinterpret_cast<const __half2*>(&row_g8)};
}

// A packed word (natural order, above) -> the A fragment with the group scales folded in: rows g
// and g + 8 as f16 (u - 8) * s.
__device__ __forceinline__ void dequant_scaled(uint32_t word, const RowScales& scales, uint32_t (&a)[4]) {
  dequant_int4x8(word, a);
  const __half2 sg = scales.g, sg8 = scales.g8;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 v = *reinterpret_cast<__half2*>(&a[i]);
    v = __hmul2(v, (i & 1) ? sg8 : sg);
    a[i] = *reinterpret_cast<uint32_t*>(&v);
  }
}

// The same for int4-zp: rows g and g + 8 as f16 (u - z) * s, z in the group's constants.
__device__ __forceinline__ void dequant_zero_scaled(uint32_t word, const RowScales& scales, const ZeroConstants& zc,
                                                    uint32_t (&a)[4]) {
  dequant_zero_codes4x8(word, zc, a);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 v = *reinterpret_cast<__half2*>(&a[i]);
    v = __hmul2(v, (i & 1) ? scales.g8 : scales.g);
    a[i] = *reinterpret_cast<uint32_t*>(&v);
  }
}

// The same for int4-asym: unsigned codes, rows g and g + 8 as f16 fma(u, s, m), one rounding.
__device__ __forceinline__ void dequant_folded(uint32_t word, const RowScales& scales, const RowScales& mins,
                                               uint32_t (&a)[4]) {
  dequant_uint4x8(word, a);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 v = *reinterpret_cast<__half2*>(&a[i]);
    v = __hfma2(v, (i & 1) ? scales.g8 : scales.g, (i & 1) ? mins.g8 : mins.g);
    a[i] = *reinterpret_cast<uint32_t*>(&v);
  }
}

// The kernel's tensor maps (made by the launcher for each launch, w4a16_tiled.cu): x [m][k] f16 in
// 64 k x NT-token boxes, 128-byte swizzle; the packed codes as [row blocks][k / 16][128 bytes] in
// boxes of a stage (8 rows of 128 bytes) of the tile's row blocks; the scales as [row
// blocks][groups][8 words] in boxes of a stage's groups of the tile's row blocks. Boxes past the
// matrix read as zeros. One TMA a stage each, from one thread: bulk copies a row block (16 a
// stage) issued by one thread took ~1.4 us a stage, five times the stage's bytes (H200, 758f954).
struct W4A16WgmmaMaps {
  CUtensorMap x, codes, scales;
};

template <class Shape, int G, bool ZP = false, bool ZC = false, bool PX = false>
__global__ __launch_bounds__(Shape::kThreads, Shape::kMinBlocks) void w4a16_wgmma_kernel(const __grid_constant__ W4A16WgmmaMaps maps,
                                                                          const W4A16TiledParams p) {
#if QSPEC_WGMMA
  using T = Shape;
  constexpr int TILES = T::TILES, STAGES = T::STAGES, PPG = G / 32;
  static_assert(T::kPairs % PPG == 0, "a stage holds whole scale groups");
  constexpr int GROUPS = T::kPairs / PPG;          // scale groups a stage
  constexpr int SCALE_STRIDE = GROUPS * 32;        // a row block's scales in a stage, in the ring
  constexpr uint32_t kStageTx = T::kXBytes + T::kRowBlocks * (T::kCodeBytes + SCALE_STRIDE);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __shared__ uint64_t full[STAGES], empty[STAGES];

  // The warp index through a shuffle: provably uniform across the warp, so the compiler keeps the
  // wgmma of the mma warps' branch pipelined (it serialises wgmma on paths it thinks divergent).
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int m_tile = blockIdx.x, row_tile = blockIdx.y, split = blockIdx.z;
  const int m0 = m_tile * T::kTokens, tile_m = min(T::kTokens, p.m - m0);
  // Stages of 4 pairs (128 k); the last may be short (k % 128 != 0). Splits cut at stages.
  const int total_pairs = 2 * p.w.full_chunks + p.w.tail;
  const int all_stages = (total_pairs + T::kPairs - 1) / T::kPairs;
  const int stage_begin = static_cast<int>(static_cast<int64_t>(split) * all_stages / p.splits);
  const int stage_end = static_cast<int>(static_cast<int64_t>(split + 1) * all_stages / p.splits);
  const int stages = stage_end - stage_begin;
  auto stage_pairs = [&](int st) { return min(T::kPairs, total_pairs - (stage_begin + st) * T::kPairs); };

  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < STAGES; ++i) {
      mbarrier_init(&full[i], 1);
      mbarrier_init(&empty[i], T::kRowBlocks);  // the mma warps
    }
    fence_proxy_async_shared();
  }
  __syncthreads();
  grid_launch_dependents();

  // ---- producer: one thread (warp 0, lane 0) issues every copy of every stage ----
  auto produce = [&] {
    // A stage's weights: its row blocks' codes (1 KB each: 8 rows of 128 bytes, ops/w4a16_pack.h)
    // and scales; a short last stage's box runs past k and reads zeros (its bytes still count).
    auto load_w = [&](int st) {
      const int slot = st % STAGES, pair0 = (stage_begin + st) * T::kPairs;
      uint8_t* const w_dst = ring + slot * T::kStageBytes + T::kXBytes;
      tma_load_3d(w_dst, &maps.codes, 0, pair0 * 2, row_tile * T::kRowBlocks, &full[slot]);
      tma_load_3d(w_dst + T::kRowBlocks * T::kCodeBytes, &maps.scales, 0, pair0 / PPG, row_tile * T::kRowBlocks,
                  &full[slot]);
    };
    auto load_x = [&](int st) {
      const int slot = st % STAGES, k0 = (stage_begin + st) * T::kPairs * 32;
      uint8_t* const x_dst = ring + slot * T::kStageBytes;
      // Both boxes even in a short last stage: k past the matrix reads as zeros, which its
      // zero A fragments multiply (stale shared memory could hold NaN bits).
      tma_load_2d(x_dst, &maps.x, k0, m0, &full[slot]);
      tma_load_2d(x_dst + T::kBoxBytes, &maps.x, k0 + 64, m0, &full[slot]);
    };
    // The first STAGES stages: the weights before the wait for the previous kernel, x after it.
    const int first = min(STAGES, stages);
    for (int st = 0; st < first; ++st) {
      mbarrier_arrive_expect_tx(&full[st], kStageTx);
      load_w(st);
    }
    grid_dependency_wait();
    for (int st = 0; st < first; ++st) load_x(st);
    for (int st = STAGES; st < stages; ++st) {
      const int slot = st % STAGES;
      mbarrier_wait(&empty[slot], ((st / STAGES) - 1) & 1);
      mbarrier_arrive_expect_tx(&full[slot], kStageTx);
      load_w(st);
      load_x(st);
    }
  };
  if constexpr (T::kSplitK) {
    if (warp == 0 && lane == 0) produce();
  } else {
    // Each warpgroup's registers set before its own code only (ptxas ignores a setmaxnreg whose
    // code after it is shared with the other warpgroups').
    if (warp < 4) {
      warpgroup_registers_decrease<T::kProducerRegisters>();
      if (warp == 0 && lane == 0) produce();
      return;  // no split-K fix-up to join (the launcher runs these shapes unsplit)
    }
    warpgroup_registers_increase<T::kMmaRegisters>();
  }
  grid_dependency_wait();  // every thread: the epilogue writes y, which an earlier kernel may read

  float acc[TILES][4];
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

  const int mma_warp = warp - 4;  // 0 .. kRowBlocks - 1: warpgroup mma_warp / 4, row block mma_warp
  if (warp >= 4) {
    [[maybe_unused]] const PairSelectors sel = pair_selectors(t);
    // Shared-memory addresses, made once: the ring's, and the full and empty barriers' (stepped by
    // slot below; from generic pointers each use cost ~20 instructions a stage).
    const uint32_t ring_address = (smem_address(smem_raw) + 1023u) & ~1023u;  // = smem_address(ring), in 32 bits
    const uint32_t full_address = smem_address(full), empty_address = smem_address(empty);
    // A stage runs as batches of BP pairs: batch b's A fragments ([b % 2][pair][k16 step]) are
    // made before its first wgmma and stay until its wgmma are waited for, one batch later. An
    // even number of batches a stage keeps the parity static without unrolling the stage loop, and
    // only two batches' fragments live in registers (two blocks a multiprocessor fit).
    constexpr int BP = T::kBatchPairs, BATCHES = T::kPairs / BP;
    static_assert(BATCHES % 2 == 0, "an even number of batches a stage");
    uint32_t a[2][BP][2][4];
    // This lane's codes and scales in a stage's slot, past its x boxes.
    const uint32_t lane_codes = T::kXBytes + mma_warp * T::kCodeBytes + lane * 16;
    const uint32_t lane_scales = T::kXBytes + T::kRowBlocks * T::kCodeBytes + mma_warp * SCALE_STRIDE + g * 4;
    // ZP: this lane's minimums (rows g, g + 8) of the warp's row block, clamped to the last row
    // block (a tile past n multiplies, like its zero codes, rows that are never stored).
    constexpr bool GW = ZP || ZC;  // a word a group beside the scales
    const uint32_t zero_selector = zero_byte_selector(g);
    const uint8_t* lane_zeros =  // ZC: the warp's row block's packed zero points
        ZC ? zero_point_bytes(p.w, min(row_tile * T::kRowBlocks + mma_warp, p.w.row_blocks - 1)) : nullptr;
    const uint32_t* lane_mins =
        ZP ? zero_point_mins(p.w) + static_cast<int64_t>(min(row_tile * T::kRowBlocks + mma_warp, p.w.row_blocks - 1)) *
                            p.w.groups * 8 + g
           : nullptr;
    // The ring slot and phase of stage st (st % STAGES, (st / STAGES) & 1) as counters: a run-time
    // division by STAGES (6) cost ~10 instructions twice a stage in this issue-bound loop (SASS of
    // the 128x32 tile: ~52 instructions a pair, ~29 of them the dequantization).
    int slot = 0;
    uint32_t phase = 0;
    // One stage. TAIL: the matrix's last stage where k % 64 == 32 (its last pair a half chunk); only
    // that stage pays for the run-time pair test, every other stage's addresses are compile-time
    // offsets.
    auto run_stage = [&](const int st, auto tail_tag) {
      constexpr bool TAIL = decltype(tail_tag)::value;
      // ZP: the stage's group minimums, in flight during the wait (groups past k clamped: their
      // weights meet zero x).
      [[maybe_unused]] uint32_t zmin[GW ? GROUPS : 1];
      if constexpr (GW) {
        const int group0 = (stage_begin + st) * T::kPairs / PPG;
#pragma unroll
        for (int j = 0; j < GROUPS; ++j)
          zmin[j] = ZP ? __ldg(lane_mins + min(group0 + j, p.w.groups - 1) * 8)
                       : zero_point_word(lane_zeros, min(group0 + j, p.w.groups - 1), g);
      }
      // The k tail's half chunk (k % 64 == 32), the last pair of the matrix: 8 bytes a lane. Pairs
      // past the matrix need no care: their codes and scales arrive as zeros (TMA's fill past the
      // tensor), so their A fragments are (0 - 8) * 0 = 0, and so are their x columns.
      const int tail_q = TAIL ? stage_pairs(st) - 1 : -1;
      mbarrier_wait(full_address + slot * 8, phase);
      const uint32_t x_stage = ring_address + slot * T::kStageBytes;
      const uint64_t desc_stage = wgmma_descriptor_128b(x_stage);
#pragma unroll
      for (int b = 0; b < BATCHES; ++b) {
#pragma unroll
        for (int i = 0; i < BP; ++i) {
          const int q = BP * b + i;  // the pair of the stage
          // Pair q's two words of this lane: chunk q / 2, half q % 2 of its 16 bytes (the tail's
          // half chunk: bytes 8 lane).
          const uint32_t address =
              x_stage + lane_codes + (q / 2) * 512 +
              (TAIL && q == tail_q ? -static_cast<uint32_t>(lane * 8) : static_cast<uint32_t>((q % 2) * 8));
          uint32_t w0, w1, scale_pair;
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w0), "=r"(w1) : "r"(address));
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(scale_pair) : "r"(x_stage + lane_scales + (q / PPG) * 32));
          uint32_t step0 = w0, step1 = w1;  // PX: x is in the packed order, the words are the fragments
          if constexpr (!PX) pair_to_natural(w0, w1, sel, step0, step1);
          const RowScales scales = row_scales(scale_pair);
          if constexpr (ZP) {
            const RowScales mins = row_scales(zmin[q / PPG]);
            dequant_folded(step0, scales, mins, a[b % 2][i][0]);
            dequant_folded(step1, scales, mins, a[b % 2][i][1]);
          } else if constexpr (ZC) {
            const ZeroConstants zc = zero_constants(zmin[q / PPG], zero_selector);
            dequant_zero_scaled(step0, scales, zc, a[b % 2][i][0]);
            dequant_zero_scaled(step1, scales, zc, a[b % 2][i][1]);
          } else {
            dequant_scaled(step0, scales, a[b % 2][i][0]);
            dequant_scaled(step1, scales, a[b % 2][i][1]);
          }
        }
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < BP; ++i)  // no branch among the wgmma: it would serialise them
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            // Pair q of the stage: box q / 2, bytes 64 (q % 2) + 32 s of each token row (the
            // descriptor's start address counts 16-byte units).
            const int q = BP * b + i;
            const uint64_t desc = desc_stage + (((q / 2) * T::kBoxBytes + (q % 2) * 64 + s * 32) >> 4);
            wgmma_f16_rs<TILES>(acc, a[b % 2][i][s], desc);
          }
        wgmma_commit();
        wgmma_wait<1>();  // the batch before is done: its A registers (and, at b = 0, the ring slot) are free
#pragma unroll
        for (int i = 0; i < BP; ++i)
#pragma unroll
          for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[1 - b % 2][i][s][r])::"memory");
        if (b == 0 && st > 0) {  // the previous stage's last batch is done: its slot goes back
          __syncwarp();
          if (lane == 0) mbarrier_arrive(empty_address + (slot == 0 ? STAGES - 1 : slot - 1) * 8);
        }
      }
      if (++slot == STAGES) {
        slot = 0;
        phase ^= 1u;
      }
    };
    // The matrix's last stage holds the k tail's half chunk: this split's last stage, if the split
    // ends the matrix.
    const bool tail_stage = p.w.tail && stage_end == all_stages && stages > 0;
    const int plain_stages = stages - (tail_stage ? 1 : 0);
#pragma unroll 1
    for (int st = 0; st < plain_stages; ++st) run_stage(st, std::false_type{});
    if (tail_stage) run_stage(plain_stages, std::true_type{});
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
#pragma unroll
    for (int i = 0; i < BP; ++i)
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[0][i][s][r]), "+r"(a[1][i][s][r])::"memory");
  }

  // Epilogue: the mma warps store their row block (or split-K partials); every thread joins the
  // split-K fix-up (it synchronises the block).
  float* partials = p.splits > 1 ? p.partials + static_cast<int64_t>(p.splits) * m0 * p.w.n : nullptr;
  if (warp >= 4) {
    const int rb = row_tile * T::kRowBlocks + mma_warp;
    if (rb < p.w.row_blocks)
      store_fragment<TILES>(acc, rb, t, g, p.w.n, tile_m, p.splits, split, p.y + static_cast<int64_t>(m0) * p.ldy,
                            p.ldy, partials);
  }
  if (!T::kSplitK || p.splits == 1) return;
  const int row_begin = row_tile * T::kRows;
  splitk_finish<T::kThreads>(p.counters, row_tile * p.m_tiles + m_tile, p.splits, partials,
                             p.y + static_cast<int64_t>(m0) * p.ldy, p.ldy, tile_m, p.w.n, row_begin,
                             min(T::kRows, p.w.n - row_begin));
#else
  (void)maps;
  (void)p;
  __trap();
#endif
}

}  // namespace qspec::cuda::kernels
