// W4A8 GEMM for many tokens (prefill, large verify batches): y[m, n] = x[m, k] W[n, k]^T with W
// int4 (ops/w4a16_pack.h) and x int8 codes with a scale per token. Same math as the tiled
// kernel's ActS8 policy, bit for bit (each scale group's sum exact in s32, scaled by the weight
// group scale in f32, groups in k order; token scales at the end), built for the compute-bound
// regime where the tiled kernel runs at a third of the s8 mma.sync peak.
//
// Why a separate kernel: at large M the tiled kernel issues about three instructions besides
// each mma. Every warp unpacks its own weights into registers for its 64 tokens (about two
// integer instructions an mma), and the group flush costs two more (f32 conversion + fma per
// accumulator per group of 4 mma). Here:
//   * A block owns 128 weight rows x 128 tokens (8 warps: 4 along rows x 2 along tokens, each
//     32 rows x 64 tokens). The stage's packed weights are unpacked ONCE per block into an int8
//     copy in shared memory, in mma fragment order (each lane then reads its 4 A registers of a
//     k pair with one 16-byte load): the unpack is shared by 128 tokens instead of 64, and it
//     is cheaper: a nibble is put in the HIGH half of its byte ((u << 4) ^ 0x80 = 16 (u - 8) as
//     int8: 2-3 instructions a word instead of 4-5 for a sign-extended low nibble). The sums are
//     then 16 x the true ones (|16 sum| <= 16 x 128 x 8 x 127 < 2^22, still exact in s32 and in
//     the biased-float read of w4_activation.cuh), and the scale is taken / 16 (exact).
//   * The group sums start at the float bias (ActS8::kGroupBias) through the first mma of each
//     group, so the flush is one FADD + one FFMA an accumulator (no I2F, no reset).
// Shared memory traffic per mma: one 16-byte A load per k pair and row block (shared by 8
// n-tiles) and one 8-byte x load per n-tile (shared by 2 row blocks).
//
// Stages: 128 k (two packed chunks) a stage, a STAGES-deep cp.async ring of [packed weights
// 8 KB | x 128 tokens x 128 bytes | scales], plus the unpacked A buffer (16 KB, single: the
// barrier after each unpack and the one at the top of each stage order its reuse). x rows are
// swizzled by 32-byte group (group q of row r stored at q ^ (r & 3)) so an 8-byte load of rows
// g = 0..7 takes the minimum two wavefronts.
//
// Requirements (w4_s8_wide_supports): int8 activations, k % 128 == 0 (whole stages, no tail),
// weight groups of 32, 64 or 128. No split-K: it is meant for M where the grid fills the GPU.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"

namespace qspec::cuda::kernels {

// MT n-tiles of 8 tokens a warp (8: 128 x 128 blocks, one a multiprocessor; 4: 128 x 64 blocks
// with half the accumulators, two a multiprocessor), STAGES ring slots.
template <int MT_, int STAGES_, int MIN_BLOCKS_>
struct W4S8WideTile {
  static constexpr int kRowWarps = 4, kTokenWarps = 2;
  static constexpr int RPW = 2, MT = MT_;                 // a warp: 2 row blocks x MT n-tiles
  static constexpr int kMinBlocks = MIN_BLOCKS_;
  static constexpr int kThreads = 32 * kRowWarps * kTokenWarps;
  static constexpr int kRowBlocks = kRowWarps * RPW;      // 8 x 16 = 128 rows
  static constexpr int kRows = kRowBlocks * 16;
  static constexpr int kTokens = kTokenWarps * MT * 8;
  static constexpr int kStageK = 128;
  static constexpr int kPairs = kStageK / 32;             // 4 k pairs a stage
  static constexpr int STAGES = STAGES_;
  static constexpr int kWBytes = kRowBlocks * 2 * 512;    // packed: 2 chunks of 512 B a row block
  static constexpr int kXBytes = kTokens * kStageK;       // int8
  template <int G>
  static constexpr int scale_bytes() { return kRowBlocks * (kStageK / G) * 32; }
  template <int G>
  static constexpr int stage_bytes() { return kWBytes + kXBytes + scale_bytes<G>(); }
  static constexpr int kABytes = kRowBlocks * kPairs * 512;  // unpacked: (row block, pair) x 32 lanes x 16 B
  template <int G>
  static constexpr int smem_bytes() { return STAGES * stage_bytes<G>() + kABytes; }
};

struct W4S8WideParams {
  W4A16Layout w;
  ActivationRows a;  // int8 codes, token scales
  __half* y;
  int64_t ldy;
  int m;
};

// 16 x (u - 8) for the four nibbles at bits 0..3 (low) or 4..7 (high) of each byte, bytes
// reordered (0, 2, 1, 3) as int4_bytes_to_s8 does (w4_activation.cuh).
__device__ __forceinline__ uint32_t low_nibbles_x16(uint32_t w) {
  return __byte_perm(((w << 4) & 0xf0f0f0f0u) ^ 0x80808080u, 0, 0x3120);
}
__device__ __forceinline__ uint32_t high_nibbles_x16(uint32_t w) {
  return __byte_perm((w & 0xf0f0f0f0u) ^ 0x80808080u, 0, 0x3120);
}

template <class T, int G>
__global__ __launch_bounds__(T::kThreads, T::kMinBlocks) void w4_s8_wide_kernel(const W4S8WideParams p) {
  constexpr int STAGES = T::STAGES, PAIRS = T::kPairs, MT = T::MT, RPW = T::RPW;
  constexpr int PPG = G / 32;                 // k pairs a scale group
  constexpr int GPS = T::kStageK / G;         // scale groups a stage
  constexpr int STAGE_BYTES = T::template stage_bytes<G>();
  static_assert(T::kStageK % G == 0, "a stage holds whole scale groups");
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int warp_rows = warp % T::kRowWarps, warp_tokens = warp / T::kRowWarps;
  const int m0 = blockIdx.x * T::kTokens, row_tile = blockIdx.y;
  const int stages = p.w.k / T::kStageK;
  const int block_tokens = min(T::kTokens, p.m - m0);
  // This warp's tokens: m0 + warp_tokens * MT * 8 + [0, warp_m); warp_m <= 0: none (the warp still
  // takes part in the loads, the unpack and the barriers).
  const int warp_first = m0 + warp_tokens * MT * 8, warp_m = min(MT * 8, p.m - warp_first);

  auto w_slot = [&](int slot) { return smem + slot * STAGE_BYTES; };
  auto x_slot = [&](int slot) { return smem + slot * STAGE_BYTES + T::kWBytes; };
  auto s_slot = [&](int slot) { return reinterpret_cast<uint32_t*>(smem + slot * STAGE_BYTES + T::kWBytes + T::kXBytes); };
  uint8_t* const a_buffer = smem + STAGES * STAGE_BYTES;

  // Packed weights and scales of stage st: piece i (16 B) = row block i / 64, chunk (i / 32) % 2,
  // lane i % 32, stored in that order.
  auto load_w = [&](int slot, int st) {
#pragma unroll
    for (int j = 0; j < T::kWBytes / 16 / T::kThreads; ++j) {
      const int i = tid + j * T::kThreads;
      const int rb = min(row_tile * T::kRowBlocks + i / 64, p.w.row_blocks - 1);
      const uint8_t* src = p.w.codes + static_cast<int64_t>(rb) * p.w.k * 8 +
                           static_cast<int64_t>(2 * st + (i / 32) % 2) * 512 + (i % 32) * 16;
      cp_async_16(smem_address(w_slot(slot) + i * 16), src, 16);
    }
    constexpr int SCALE_PIECES = T::kRowBlocks * GPS * 2;  // half a group's 8 words each
    if (tid < SCALE_PIECES) {
      const int rb_local = tid / (2 * GPS), j = tid % (2 * GPS);
      const int rb = min(row_tile * T::kRowBlocks + rb_local, p.w.row_blocks - 1);
      const int group = st * GPS + j / 2;
      const uint32_t* src = p.w.scales + (static_cast<int64_t>(rb) * p.w.groups + group) * 8 + (j & 1) * 4;
      cp_async_16(smem_address(s_slot(slot) + (rb_local * GPS + j / 2) * 8 + (j & 1) * 4), src, 16);
    }
  };
  // x of stage st: piece i = token row i / 8, 16-byte piece i % 8 of its 128 bytes, stored at
  // piece (i % 8) ^ (2 (row & 3)); rows past m are zero-filled.
  const int8_t* x_base = activation_values<ActS8>(p.a);
  auto load_x = [&](int slot, int st) {
#pragma unroll
    for (int j = 0; j < T::kXBytes / 16 / T::kThreads; ++j) {
      const int i = tid + j * T::kThreads;
      const int row = i / 8, piece = i % 8;
      const bool valid = row < block_tokens;
      const int8_t* src = valid ? x_base + static_cast<int64_t>(m0 + row) * p.a.ldx + st * T::kStageK + piece * 16 : x_base;
      cp_async_16(smem_address(x_slot(slot) + row * T::kStageK + ((piece ^ ((row & 3) << 1)) * 16)), src, valid ? 16 : 0);
    }
  };

  float acc[RPW][MT][4];
  int gacc[RPW][MT][4];
  zero_accumulators<ActS8>(acc, gacc);

  grid_launch_dependents();
  // Commit groups as the tiled kernel: W0 .. W(S-2) before the dependency wait, X0 .. X(S-2)
  // after it, then one (W + X) group a stage; wait_group(S - 2) at stage st covers both.
  prefetch_weights_then_wait<STAGES>(stages, load_w);
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < stages) load_x(st, st);
    cp_async_commit();
  }

  // This lane's byte offset in an x slab row block for pair P: row g, value P * 32 + t * 8 in
  // 32-byte group P, swizzled by the row (n-tiles are 8 rows apart: same swizzle).
  auto x_offset = [&](int pair) { return g * T::kStageK + ((pair ^ (g & 3)) * 32) + t * 8; };

  for (int st = 0; st < stages; ++st) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage st landed; every warp is done with stage st - 1 (its slot, the A buffer)
    const int next = st + STAGES - 1;
    if (next < stages) {
      load_w(next % STAGES, next);
      load_x(next % STAGES, next);
    }
    cp_async_commit();

    const int slot = st % STAGES;
    // Unpack: piece i of the packed slot (row block, chunk, lane) -> A fragments of pairs
    // 2 chunk and 2 chunk + 1 of that lane.
#pragma unroll
    for (int j = 0; j < T::kWBytes / 16 / T::kThreads; ++j) {
      const int i = tid + j * T::kThreads;
      const int rb = i / 64, chunk = (i / 32) % 2, l = i % 32;
      const uint4 q = *reinterpret_cast<const uint4*>(w_slot(slot) + i * 16);
      const uint4 pair0 = make_uint4(low_nibbles_x16(q.x), high_nibbles_x16(q.x), low_nibbles_x16(q.y), high_nibbles_x16(q.y));
      const uint4 pair1 = make_uint4(low_nibbles_x16(q.z), high_nibbles_x16(q.z), low_nibbles_x16(q.w), high_nibbles_x16(q.w));
      *reinterpret_cast<uint4*>(a_buffer + ((rb * PAIRS + 2 * chunk) * 32 + l) * 16) = pair0;
      *reinterpret_cast<uint4*>(a_buffer + ((rb * PAIRS + 2 * chunk + 1) * 32 + l) * 16) = pair1;
    }
    __syncthreads();  // the A buffer holds stage st

    const uint8_t* xs = x_slot(slot) + warp_tokens * MT * 8 * T::kStageK;
    const uint32_t* scales = s_slot(slot);
#pragma unroll
    for (int pair = 0; pair < PAIRS; ++pair) {
      uint32_t a[RPW][4];
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const uint4 v = *reinterpret_cast<const uint4*>(a_buffer + (((warp_rows * RPW + r) * PAIRS + pair) * 32 + lane) * 16);
        a[r][0] = v.x;
        a[r][1] = v.y;
        a[r][2] = v.z;
        a[r][3] = v.w;
      }
      const int x_off = x_offset(pair);
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) {
        const uint2 xf = *reinterpret_cast<const uint2*>(xs + nt * 8 * T::kStageK + x_off);
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          if (pair % PPG == 0) mma_s8_16832_from(gacc[r][nt], a[r], xf.x, xf.y, ActS8::kGroupBias);
          else mma_s8_16832(gacc[r][nt], a[r], xf.x, xf.y);
        }
      }
      if ((pair + 1) % PPG == 0) {  // a group ends: static
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          const float2 s = unpack_half2(scales[((warp_rows * RPW + r) * GPS + pair / PPG) * 8 + g]);
          const float s_lo = s.x * 0.0625f, s_hi = s.y * 0.0625f;  // the sums are 16 x (exact: a power of two)
#pragma unroll
          for (int nt = 0; nt < MT; ++nt) {
            acc[r][nt][0] = fmaf(s_lo, ActS8::to_float(gacc[r][nt][0]), acc[r][nt][0]);
            acc[r][nt][1] = fmaf(s_lo, ActS8::to_float(gacc[r][nt][1]), acc[r][nt][1]);
            acc[r][nt][2] = fmaf(s_hi, ActS8::to_float(gacc[r][nt][2]), acc[r][nt][2]);
            acc[r][nt][3] = fmaf(s_hi, ActS8::to_float(gacc[r][nt][3]), acc[r][nt][3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  if (warp_m <= 0) return;

  // Epilogue: thread holds rows (rb * 16 + g, + 8) x tokens warp_first + nt * 8 + 2t (+ 1).
  apply_token_scales<ActS8>(acc, p.a.scales, warp_first, t, warp_m - 1);
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int rb = row_tile * T::kRowBlocks + warp_rows * RPW + r;
    store_fragment<MT>(acc[r], rb, t, g, p.w.n, warp_m, /*splits=*/1, 0, p.y + static_cast<int64_t>(warp_first) * p.ldy,
                       p.ldy, nullptr);
  }
}

}  // namespace qspec::cuda::kernels
