// W4A16 GEMM for few tokens, variant 3 ("stream"): the same math as w4a16_small_m.cuh (y^T = W
// x^T on mma.sync m16n8k16, lop3 dequantization, per-group f32 scaling, split-K with a
// last-block fixup), but the packed weights, their scales and the x slice travel through a
// STAGES-deep cp.async ring in shared memory, so each block keeps (STAGES - 1) stages of
// weights in flight (28 KB for 4 warps, 2 chunks a stage, 8 stages) instead of a few
// registers' worth, and x is read from global memory once per block instead of once per warp.
//
// Programmatic dependent launch: the weight loads of the first STAGES - 1 stages are issued
// before griddepcontrol.wait (weights never depend on the previous kernel), x and every global
// write come after it; the block signals its dependents once its main loop is done. Launched
// without the attribute, both instructions are no-ops. The grid is sized to one wave, so the
// dependents are released at the start: they take multiprocessor slots as this grid's blocks
// leave, and prefetch their own weights while this grid drains.
//
// One row block (16 rows) per warp; each lane copies its own 16 bytes of each 512-byte chunk,
// so a warp reads back only what it wrote (still, x is shared: one __syncthreads per stage).
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/kernels/w4a16_small_m.cuh"  // W4A16SmallMParams

namespace qspec::cuda::kernels {


template <int MT, int WARPS, int CH, int STAGES, int G>
struct W4A16StreamShape {
  static constexpr int kPairsPerGroup = G / 32;
  static constexpr int kGroupsPerStage = (2 * CH) / kPairsPerGroup + 1;  // a stage may straddle groups
  static constexpr int kXRows = MT * 8;
  static constexpr int kXStride = CH * 64 + 8;  // halves per x row: 16 bytes of padding (no bank conflicts)
  static constexpr int kWBytes = WARPS * CH * 512;
  static constexpr int kXBytes = kXRows * kXStride * 2;
  static constexpr int kSBytes = WARPS * kGroupsPerStage * 32;
  static constexpr int kStageBytes = (kWBytes + kXBytes + kSBytes + 15) / 16 * 16;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static constexpr int kRows = WARPS * 16;
};

template <int MT, int WARPS, int CH, int STAGES, int G>
__global__ __launch_bounds__(WARPS * 32) void w4a16_stream_kernel(const W4A16SmallMParams p) {
  using Shape = W4A16StreamShape<MT, WARPS, CH, STAGES, G>;
  constexpr int PPG = Shape::kPairsPerGroup;
  constexpr int NG = Shape::kGroupsPerStage;
  constexpr int XS = Shape::kXStride;
  extern __shared__ __align__(16) uint8_t smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y;
  const KShare share = k_share(p.w, split, p.splits);
  const int chunk_begin = share.chunk_begin, chunk_end = share.chunk_end, pair_end = share.pair_end;
  const bool do_tail = share.tail;
  const int stages = (chunk_end - chunk_begin + CH - 1) / CH;
  const int x_rows = min(p.m, Shape::kXRows);

  const int rb = min(tile * WARPS + warp, p.w.row_blocks - 1);
  const uint8_t* w_block = p.w.codes + static_cast<int64_t>(rb) * p.w.k * 8;
  const uint32_t* s_block = p.w.scales + static_cast<int64_t>(rb) * p.w.groups * 8;

  auto w_smem = [&](int slot) { return smem + slot * Shape::kStageBytes + warp * CH * 512; };
  auto x_smem = [&](int slot) {
    return reinterpret_cast<__half*>(smem + slot * Shape::kStageBytes + Shape::kWBytes);
  };
  auto s_smem = [&](int slot) {
    return reinterpret_cast<uint32_t*>(smem + slot * Shape::kStageBytes + Shape::kWBytes + Shape::kXBytes) +
           warp * NG * 8;
  };

  // Weights and scales of stage st (this warp's row block) into ring slot `slot`.
  auto load_w = [&](int slot, int st) {
    const int c0 = chunk_begin + st * CH;
#pragma unroll
    for (int ch = 0; ch < CH; ++ch) {
      const int c = c0 + ch;
      const bool valid = c < chunk_end;
      cp_async_16(smem_address(w_smem(slot) + ch * 512 + lane * 16),
                  w_block + static_cast<int64_t>(valid ? c : chunk_begin) * 512 + lane * 16, valid ? 16 : 0);
    }
    if (lane < 2 * NG) {
      const int group = (2 * c0) / PPG + (lane >> 1);
      const bool valid = group < p.w.groups;
      cp_async_16(smem_address(s_smem(slot) + (lane >> 1) * 8 + (lane & 1) * 4),
                  s_block + (valid ? group : 0) * 8 + (lane & 1) * 4, valid ? 16 : 0);
    }
  };
  // x rows 0..x_rows-1, k values of stage st, into slot; `async` false: plain loads (prologue).
  auto load_x = [&](int slot, int st, bool async) {
    const int c0 = chunk_begin + st * CH;
    const int pieces = x_rows * CH * 8;
    for (int i = threadIdx.x; i < pieces; i += WARPS * 32) {
      const int row = i / (CH * 8), piece = i % (CH * 8);
      const bool valid = c0 + piece / 8 < chunk_end;
      const __half* src = static_cast<const __half*>(p.a.x) + static_cast<int64_t>(row) * p.a.ldx + static_cast<int64_t>(valid ? c0 : chunk_begin) * 64 +
                          (valid ? piece * 8 : 0);
      __half* dst = x_smem(slot) + row * XS + piece * 8;
      if (async) {
        cp_async_16(smem_address(dst), src, valid ? 16 : 0);
      } else {
        *reinterpret_cast<uint4*>(dst) = valid ? __ldg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
      }
    }
  };

  float acc[MT][4], gacc[MT][4];
#pragma unroll
  for (int nt = 0; nt < MT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = gacc[nt][e] = 0.0f;
  auto flush = [&](uint32_t scale_word) {
    const float2 s = unpack_half2(scale_word);
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) {
      acc[nt][0] = fmaf(s.x, gacc[nt][0], acc[nt][0]);
      acc[nt][1] = fmaf(s.x, gacc[nt][1], acc[nt][1]);
      acc[nt][2] = fmaf(s.y, gacc[nt][2], acc[nt][2]);
      acc[nt][3] = fmaf(s.y, gacc[nt][3], acc[nt][3]);
#pragma unroll
      for (int e = 0; e < 4; ++e) gacc[nt][e] = 0.0f;
    }
  };
  auto pair_mma = [&](uint32_t w0, uint32_t w1, const uint4 (&xf)[MT]) {
    uint32_t a[4];
    dequant_int4x8(w0, a);
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) mma_f16_16816(gacc[nt], a, xf[nt].x, xf[nt].y);
    dequant_int4x8(w1, a);
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) mma_f16_16816(gacc[nt], a, xf[nt].z, xf[nt].w);
  };
  // Rows of x this lane feeds to the mma (tokens past m repeat the last row; their outputs are dropped).
  int x_row[MT];
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) x_row[nt] = min(nt * 8 + g, x_rows - 1) * XS + t * 8;

  grid_launch_dependents();
  // Prologue: weights first (independent of the previous kernel), then wait for it, then x.
  prefetch_weights_then_wait<STAGES>(stages, load_w);
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st)
    if (st < stages) load_x(st, st, false);

  for (int st = 0; st < stages; ++st) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = st + STAGES - 1;
    if (next < stages) {
      load_w(next % STAGES, next);
      load_x(next % STAGES, next, true);
    }
    cp_async_commit();

    const int slot = st % STAGES;
    const int c0 = chunk_begin + st * CH;
    const int group_base = (2 * c0) / PPG;
    const uint8_t* ws = w_smem(slot);
    const __half* xs = x_smem(slot);
    const uint32_t* ss = s_smem(slot);
#pragma unroll
    for (int ch = 0; ch < CH; ++ch) {
      const int c = c0 + ch;
      if (c < chunk_end) {
        const uint4 w = *reinterpret_cast<const uint4*>(ws + ch * 512 + lane * 16);
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
          const int pair = 2 * c + hp;
          uint4 xf[MT];
#pragma unroll
          for (int nt = 0; nt < MT; ++nt) xf[nt] = *reinterpret_cast<const uint4*>(xs + x_row[nt] + ch * 64 + hp * 32);
          pair_mma(hp ? w.z : w.x, hp ? w.w : w.y, xf);
          if ((pair + 1) % PPG == 0 || pair + 1 == pair_end) flush(ss[(pair / PPG - group_base) * 8 + g]);
        }
      }
    }
  }
  cp_async_wait<0>();

  if (do_tail) {  // k % 64 == 32: the last pair, straight from global memory
    const int pair = 2 * p.w.full_chunks;
    uint4 xf[MT];
#pragma unroll
    for (int nt = 0; nt < MT; ++nt)
      xf[nt] = __ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(p.a.x) + static_cast<int64_t>(min(nt * 8 + g, p.m - 1)) * p.a.ldx +
                                                    pair * 32 + t * 8));
    const uint2 w = load_stream_8(w_block + static_cast<int64_t>(p.w.full_chunks) * 512 + lane * 8);
    pair_mma(w.x, w.y, xf);
    flush(__ldg(s_block + (pair / PPG) * 8 + g));
  }

  // Epilogue: thread holds rows (rb*16 + g, + 8) x tokens (nt*8 + 2t, + 1).
  const int my_rb = tile * WARPS + warp;
  if (my_rb < p.w.row_blocks) store_fragment<MT>(acc, my_rb, t, g, p.w.n, p.m, p.splits, split, p.y, p.ldy, p.partials);
  if (p.splits == 1) return;

  const int row_begin = tile * Shape::kRows;
  splitk_finish<WARPS * 32>(p.counters, tile, p.splits, p.partials, p.y, p.ldy, p.m, p.w.n, row_begin,
                            min(Shape::kRows, p.w.n - row_begin));
}

}  // namespace qspec::cuda::kernels
