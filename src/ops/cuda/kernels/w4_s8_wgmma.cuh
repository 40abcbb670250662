// W4A8 GEMM for many tokens on Hopper's warpgroup mma: y[m, n] = x[m, k] W[n, k]^T with W int4
// (ops/w4a16_pack.h, weight groups of 128) and x int8 codes with a scale per token. Same math as
// the tiled kernel's ActS8 policy, bit for bit: each group's sum exact in s32, scaled by its
// weight group scale in f32 (fma, groups in k order), token scales at the end, f16 out.
//
// Two kernels:
//   w4_unpack_s8_kernel  the packed weights (fragment order) to plain int8 u - 8, row-major
//                        [row_blocks * 16][k]: 1 byte a weight in a scratch buffer, written once
//                        per GEMM (the W4A16 large-M path dequantizes to f16 for cuBLAS the same
//                        way). It costs 5-15 % of the GEMM at 1024-4096 tokens (perf-notes),
//                        so int8 now runs w4_s8_wgmma_rs.cuh instead (no unpack); fp8 runs these.
//   w4_s8_wgmma_kernel   a block owns 128 weight rows x 128 tokens: two warpgroups of 64 rows,
//                        each issuing m64n128k32 wgmma from shared memory. A stage is one weight
//                        group (128 k = one 128-byte swizzle row) of both operands, 32 KB, brought
//                        by the copy engine (TMA: one thread, two boxes, an mbarrier a slot) into
//                        a kStages-deep ring, already in the swizzled layout wgmma reads.
//
// Where the time goes: every group ends with a scaling of its 64 sums a thread (IADD + FADD +
// FFMA each: the biased-float conversion of w4_activation.cuh, full rate; 3 of every 8 by I2F
// instead, one issue slot on the otherwise idle conversion pipe, I2F_OF_8), about 3/4 of the
// issue slots the tensor cores leave at their peak. So the sums are
// double-buffered: a group's four wgmma are issued into one buffer, then the warpgroup waits only
// for the previous group (wgmma.wait_group 1) and scales it while the new one runs. Slot s - 2 is
// the one refilled at stage s (the prefetch distance is kStages - 2). Loading through TMA instead
// of per-thread cp.async took a third of the instructions away (perf-notes).
//
// W4A8-fp8 runs the same kernels on e4m3 codes (E4M3 = true): the unpack writes e4m3 codes of
// u - 8, the wgmma is e4m3 x e4m3 -> f32, and a group's sums need no conversion.
//
// Requirements (cuda::w4_s8_wgmma_supports): sm_90a code running, int8 or fp8 activations,
// k % 128 == 0, weight groups of 128.
#pragma once
#include <cuda.h>

#include <type_traits>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/kernels/wgmma.cuh"

namespace qspec::cuda::kernels {

// STAGES ring slots; UNROLL groups an iteration of the main loop (see there).
// I2F_OF_8: how many of every 8 sums are converted by I2F (its own pipe, a quarter of the FP32
// rate, one instruction) instead of IADD + FADD (full rate, two issue slots): issue slots are
// this kernel's limit, the conversion pipe is idle otherwise.
template <int STAGES, int UNROLL, int I2F_OF_8 = 0>
struct W4S8WgmmaTile {
  static constexpr int kRows = 128;     // two warpgroups x 64 weight rows
  static constexpr int kTokens = 128;   // the wgmma's n
  static constexpr int kStageK = 128;   // one weight group = one 128-byte swizzle row
  static constexpr int kStages = STAGES;
  static constexpr int kUnroll = UNROLL;
  static constexpr int kI2fOf8 = I2F_OF_8;
  static constexpr int kThreads = 256;
  static constexpr int kMmaThreads = kThreads;  // the threads that run the epilogue: all of them
  static constexpr int kABytes = kRows * kStageK;
  static constexpr int kBBytes = kTokens * kStageK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kOutPitch = kRows + 8;  // f16 output tile [token][row], padded (no bank conflicts)
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + slack to align the ring to 1024
  static_assert(kABytes == 128 * 128 && kBBytes == 128 * 128, "one 128 x 128-byte box each");
  static_assert(kTokens * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the ring");
};

// The cooperative kernel's flag region (w4a16_plan.h: the counter region's second half): the
// epoch, the grid's arrival counter, then this many stage flags.
inline constexpr int kW4S8CooperativeFlagCapacity =
    static_cast<int>((detail::kW4A16CounterBytes - detail::kW4S8CooperativeFlagsOffset) / 4) - 2;

struct W4S8WgmmaParams {
  const uint8_t* codes;      // the packed weights [row_blocks][k * 8 bytes] (the fused kernel's)
  const uint32_t* scales;    // the packed f16 scale pairs [row_blocks][groups][8]
  int n, k, rows, groups;
  ActivationRows a;          // int8 codes, token scales
  __half* y;
  int64_t ldy;
  int m;
  bool vector_store;         // y 16-byte aligned and ldy % 8 == 0
  // The cooperative kernel only: the unpacked weights [rows][k] it writes (w_map reads them); its
  // flag region: [0] the launch epoch, [1] the grid's arrival counter, then a flag a (row tile,
  // stage); and how many row tiles ahead a block unpacks (about the row tiles a wave holds).
  int8_t* unpacked;
  int* stage_flags;
  int lookahead_rows;
};

// One thread a 16-byte piece of the packed weights (row block rb, 64-k chunk c, lane 4g + t):
// words 0 / 1 hold pair 2c, words 2 / 3 pair 2c + 1; a pair's two words are rows g and g + 8 at
// physical k 32P + 8t .. + 7 (int4_bytes_to_s8 of the even / odd nibbles puts them in order).
// E4M3: the bytes are the e4m3 codes of u - 8 instead (int4_word_to_e4m3, the same byte order),
// for the W4A8-fp8 GEMM.
// One 16-byte piece q of the packed weights (row block rb, 64-k chunk, lane 4g + t) into the
// row-major 8-bit matrix `out` [rows][k]: 8 bytes of rows g and g + 8 for each of its two pairs.
template <bool E4M3>
__device__ __forceinline__ void w4_unpack_piece(uint4 q, int lane, int64_t rb, int64_t chunk, int64_t k, int8_t* out) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t w0 = h ? q.z : q.x, w1 = h ? q.w : q.y;
    const int64_t k0 = (2 * chunk + h) * 32 + 8 * t;
    int8_t* row_g = out + (rb * 16 + g) * k + k0;
    uint2 even, odd;  // rows g and g + 8
    if constexpr (E4M3) {
      int4_word_to_e4m3(w0, even.x, odd.x);
      int4_word_to_e4m3(w1, even.y, odd.y);
    } else {
      even = make_uint2(int4_bytes_to_s8(w0), int4_bytes_to_s8(w1));
      odd = make_uint2(int4_bytes_to_s8(w0 >> 4), int4_bytes_to_s8(w1 >> 4));
    }
    *reinterpret_cast<uint2*>(row_g) = even;
    *reinterpret_cast<uint2*>(row_g + 8 * k) = odd;
  }
}

template <bool E4M3>
__global__ void w4_unpack_a8_kernel(const W4A16Layout w, int8_t* __restrict__ out) {
  grid_dependency_wait();  // the previous GEMM may still read `out`
  grid_launch_dependents();
  const int64_t pieces = static_cast<int64_t>(w.row_blocks) * w.full_chunks * 32;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pieces;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(i % 32);
    const int64_t chunk = (i / 32) % w.full_chunks, rb = i / 32 / w.full_chunks;
    w4_unpack_piece<E4M3>(load_stream_16(w.codes + rb * w.k * 8 + chunk * 512 + lane * 16), lane, rb, chunk, w.k, out);
  }
}

// Scales one group's sums d into the totals (s8: exact s32 -> f32; the first I2F_OF_8 of every
// 8 by I2F, the rest by the float bias; e4m3: the sums are f32 already), in the tiled kernel's
// fma order: bitwise its totals.
// weight_factor: a power of two the weights were stored times (the fused kernel's 16 (u - 8)):
// its inverse scales the f16 scale exactly, so the fma is the same.
template <int I2F_OF_8, class Sum>
__device__ __forceinline__ void w4_s8_scale_group(float (&total)[64], const Sum (&d)[64], uint32_t scale_word,
                                                  float inverse_weight_factor = 1.0f) {
  float2 s = unpack_half2(scale_word);
  s.x *= inverse_weight_factor;
  s.y *= inverse_weight_factor;
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    float sum;
    if constexpr (std::is_same_v<Sum, float>) {
      sum = d[i];
    } else {  // both exact (|sum| < 2^22): the same f32
      sum = (i % 8) < I2F_OF_8 ? __int2float_rn(d[i]) : __int_as_float(d[i] + ActS8::kGroupBias) - ActS8::kGroupBiasValue;
    }
    total[i] = fmaf((i & 2) ? s.y : s.x, sum, total[i]);
  }
}

// A kernel's start: this thread's scale words (row block (row0 + 64 warpgroup + 16 warp) / 16,
// clamped into the matrix; rows g and g + 8 share the pair) and its totals zeroed.
template <class Params>
__device__ __forceinline__ const uint32_t* w4_s8_thread_scales(const Params& p, int row0, int warpgroup, int warp, int g,
                                                               float (&total)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) total[i] = 0.0f;
  const int row_block = min((row0 + warpgroup * 64 + warp * 16) / 16, (p.rows / 16) - 1);
  return p.scales + static_cast<int64_t>(row_block) * p.groups * 8 + g;
}

// The epilogue of both wgmma kernels: token scales, the f16 tile [token][row] in shared memory
// (`tile`, the drained ring), then 16-byte stores of the block's rows. local_row: this thread's
// row g in the block (rows local_row and local_row + 8); sync(): a barrier over the T::kThreads
// threads that run the epilogue, numbered by tid.
template <class T, class Params, class Sync>
__device__ __forceinline__ void w4_s8_store_tile(const float (&total)[64], uint8_t* tile, const Params& p, int local_row,
                                                 int t, int tid, Sync&& sync) {
  const int m0 = blockIdx.x * T::kTokens, row0 = blockIdx.y * T::kRows;
  const int block_tokens = min(T::kTokens, p.m - m0);
  __half* const out_tile = reinterpret_cast<__half*>(tile);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int token = 8 * i + 2 * t;
    const float s0 = __ldg(p.a.scales + m0 + min(token, block_tokens - 1));
    const float s1 = __ldg(p.a.scales + m0 + min(token + 1, block_tokens - 1));
    out_tile[token * T::kOutPitch + local_row] = __float2half_rn(total[4 * i + 0] * s0);
    out_tile[(token + 1) * T::kOutPitch + local_row] = __float2half_rn(total[4 * i + 1] * s1);
    out_tile[token * T::kOutPitch + local_row + 8] = __float2half_rn(total[4 * i + 2] * s0);
    out_tile[(token + 1) * T::kOutPitch + local_row + 8] = __float2half_rn(total[4 * i + 3] * s1);
  }
  sync();
  constexpr int kPieces = T::kTokens * T::kRows / 8;  // 8 f16 a piece
#pragma unroll
  for (int j = 0; j < kPieces / T::kMmaThreads; ++j) {
    const int i = tid + j * T::kMmaThreads, token = i / (T::kRows / 8), col = (i % (T::kRows / 8)) * 8;
    if (token >= block_tokens) continue;
    const int row = row0 + col;
    __half* dst = p.y + static_cast<int64_t>(m0 + token) * p.ldy + row;
    const __half* src = out_tile + token * T::kOutPitch + col;
    if (p.vector_store && row + 8 <= p.n) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && row + e < p.n; ++e) dst[e] = src[e];
    }
  }
}

// w_map: the unpacked weights [rows][k] int8 (w4_unpack_a8_kernel), x_map: the activation codes
// [m][k] (rows ldx apart); both 2D tensor maps of 128 x 128-byte boxes, 128-byte swizzle.
// E4M3 (W4A8-fp8): both operands e4m3 codes, each group's sums f32 straight from the wgmma (no
// conversion: the scaling is one FFMA a sum), the same tile, ring and epilogue.
template <class T, bool E4M3 = false>
__global__ __launch_bounds__(T::kThreads, 1) void w4_s8_wgmma_kernel(const __grid_constant__ CUtensorMap w_map,
                                                                     const __grid_constant__ CUtensorMap x_map,
                                                                     const W4S8WgmmaParams p) {
#if QSPEC_WGMMA
  constexpr int kAhead = T::kStages - 2;  // prefetch distance (see the header comment)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __shared__ uint64_t stage_full[T::kStages];  // completes when a slot's two boxes have landed

  const int tid = threadIdx.x, warpgroup = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * T::kTokens, row0 = blockIdx.y * T::kRows;
  const int stages = p.k / T::kStageK;

  auto a_tile = [&](int slot) { return ring + slot * T::kStageBytes; };
  auto b_tile = [&](int slot) { return ring + slot * T::kStageBytes + T::kABytes; };
  // Stage st into `slot` (one thread): the weight box (rows past the matrix arrive as zeros,
  // their outputs are dropped) and the token box (tokens past m: zeros), in the 128-byte
  // swizzled layout the wgmma descriptors read.
  auto load_stage = [&](int slot, int st) {
    mbarrier_arrive_expect_tx(&stage_full[slot], T::kStageBytes);
    tma_load_2d(a_tile(slot), &w_map, st * T::kStageK, row0, &stage_full[slot]);
    tma_load_2d(b_tile(slot), &x_map, st * T::kStageK, m0, &stage_full[slot]);
  };
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) mbarrier_init(&stage_full[i], 1);
    fence_proxy_async_shared();  // the barriers' initialization, seen by the copy engine
  }
  __syncthreads();

  // This thread's rows: row block (row0 + 64 warpgroup + 16 warp) / 16, rows g and g + 8.

  float total[64];  // zeroed, with this thread's scale words
  const uint32_t* const scale_words = w4_s8_thread_scales(p, row0, warpgroup, warp, g, total);
  using Sum = std::conditional_t<E4M3, float, int>;
  Sum sums[2][64];

  auto scale_group = [&](Sum (&d)[64], uint32_t scale_word) {
    w4_s8_scale_group<T::kI2fOf8>(total, d, scale_word);
  };

  grid_dependency_wait();  // the weights' unpack (and the activations) come from earlier kernels
  grid_launch_dependents();
  if (tid == 0)
    for (int st = 0; st < kAhead && st < stages; ++st) load_stage(st, st);

  // Stage st: wait for its data, refill the slot freed two stages ago, issue the group's four
  // wgmma into sums[B]; returns the group's scale pair.
  auto issue_stage = [&](auto buffer, int st) {
    constexpr int B = decltype(buffer)::value;
    const uint32_t scale_word = __ldg(scale_words + st * 8);
    const int slot = st % T::kStages;
    __syncthreads();  // every warpgroup is done with stage st - 2 (it waited for its wgmma)
    if (tid == 0 && st + kAhead < stages) load_stage((st + kAhead) % T::kStages, st + kAhead);
    mbarrier_wait(&stage_full[slot], (st / T::kStages) & 1);  // stage st is in shared memory
    const uint64_t a_desc = wgmma_descriptor_128b(a_tile(slot) + warpgroup * 64 * 128);
    const uint64_t b_desc = wgmma_descriptor_128b(b_tile(slot));
    wgmma_fence();
    wgmma_fence_operands(sums[B]);
#pragma unroll
    for (int kk = 0; kk < T::kStageK / 32; ++kk)  // +32 bytes = +2 in the descriptor's 16-byte units
      if constexpr (E4M3) wgmma_e4m3_m64n128k32(sums[B], a_desc + 2 * kk, b_desc + 2 * kk, kk);
      else wgmma_s8_m64n128k32(sums[B], a_desc + 2 * kk, b_desc + 2 * kk, kk);
    wgmma_commit();
    return scale_word;
  };
  // UNROLL groups an iteration, issued one after the other: each group's sums are scaled while
  // the next group's wgmma run (the two sum buffers alternate), except the iteration's last,
  // scaled after a full wait. Nothing may be in flight across the loop's back edge: ptxas
  // serializes every wgmma (C7514), or waits for all of them (C7517), when accumulators are read
  // while a group issued in an earlier iteration may still run. So (UNROLL - 1) / UNROLL of the
  // scaling overlaps this warpgroup's own wgmma; the rest overlaps the other warpgroup's.
  int st = 0;
  for (; st + T::kUnroll <= stages; st += T::kUnroll) {
    uint32_t group_scale[T::kUnroll];
#pragma unroll
    for (int j = 0; j < T::kUnroll; ++j) {
      if (j % 2 == 0) group_scale[j] = issue_stage(std::integral_constant<int, 0>{}, st + j);
      else group_scale[j] = issue_stage(std::integral_constant<int, 1>{}, st + j);
      if (j > 0) {
        wgmma_wait<1>();
        wgmma_fence_operands(sums[(j - 1) % 2]);
        scale_group(sums[(j - 1) % 2], group_scale[j - 1]);
      }
    }
    wgmma_wait<0>();
    wgmma_fence_operands(sums[(T::kUnroll - 1) % 2]);
    scale_group(sums[(T::kUnroll - 1) % 2], group_scale[T::kUnroll - 1]);
  }
  for (; st < stages; ++st) {  // the stages short of a whole iteration, one at a time
    const uint32_t scale_word = issue_stage(std::integral_constant<int, 0>{}, st);
    wgmma_wait<0>();
    wgmma_fence_operands(sums[0]);
    scale_group(sums[0], scale_word);
  }
  __syncthreads();  // the ring becomes the output tile (every copy landed: each was waited for)

  w4_s8_store_tile<T>(total, ring, p, warpgroup * 64 + warp * 16 + g, t, tid, [] { __syncthreads(); });
#else
  (void)p;
  __trap();
#endif
}

}  // namespace qspec::cuda::kernels
