// W4A16 GEMM for few tokens, variant 5 ("preload"): the math of w4a16_small_m.cuh (y^T = W x^T
// on mma.sync, one 16-row block a warp, per-group f32 scaling, split-K with a last-block
// fix-up), with the packed weights brought into shared memory by the bulk copy engine
// (cp.async.bulk, sm_90) instead of 16-byte register loads.
//
// Each warp owns a ring of R slots of up to 4 chunks (2 KB of codes and the group scales they
// need) in shared memory; one lane issues a slot's copies, so a slot costs no registers and a
// few instructions, and the first R slots are requested before griddepcontrol.wait (weights do
// not depend on the previous kernel). It was written to request a GEMM's whole split during the
// kernels before it; measured in the decode step (docs/perf-notes.md, "The preload kernel"),
// deeper rings and smaller slots were slower, so the launcher defaults to one slot a warp, one
// wave of two blocks a multiprocessor. What it gains over variant 1 (6 % of the batch-1 step)
// comes from few large copies a warp and few registers a thread (98), not from depth.
//
// Per warp, no block-wide synchronization: slot i of the warp's split lives in ring slot i % R
// and completes phase (i / R) & 1 of that slot's mbarrier. After reading a slot into registers
// the warp synchronizes, and its lane 0 refills the slot with slot i + R (the generic-proxy
// reads are ordered before the copy engine's writes by __syncwarp and fence.proxy.async).
//
// Bitwise the register-ring kernel's output for the same split count: the same mma per k pair,
// the same group flushes, the same split-K fix-up.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/kernels/w4a16_small_m.cuh"  // W4A16SmallMParams
#include "ops/cuda/kernels/wgmma.cuh"          // mbarriers, fence_proxy_async_shared, QSPEC_WGMMA

namespace qspec::cuda::kernels {

template <int G>
struct W4A16PreloadShape {
  static constexpr int kWarps = 8;                     // 128 rows a block (kW4A16TileRows)
  static constexpr int kSlotChunks = 4;                // 256 k values, 2 KB of codes a warp slot
  static constexpr int kPairsPerGroup = G / 32;
  static constexpr int kSlotGroups = kSlotChunks * 64 / G + 1;  // a slot may straddle groups
  static constexpr int kSlotBytes = kSlotChunks * 512 + (kSlotGroups * 32 + 15) / 16 * 16;
  // Dynamic shared memory for R slots a warp: the rings, then one mbarrier a slot.
  static constexpr size_t smem_bytes(int ring_slots) {
    return static_cast<size_t>(kWarps) * ring_slots * (kSlotBytes + 8);
  }
};

template <class Act, int MT, int G>
__global__ __launch_bounds__(W4A16PreloadShape<G>::kWarps * 32) void w4_preload_kernel(const W4A16SmallMParams p,
                                                                                        const int ring_slots,
                                                                                        const int slot_chunks) {
#if QSPEC_WGMMA
  using Shape = W4A16PreloadShape<G>;
  using Elem = typename Act::Elem;
  using Frag = typename Act::Frag;
  using GroupAcc = typename Act::GroupAcc;
  constexpr int WARPS = Shape::kWarps, SC = Shape::kSlotChunks, PPG = Shape::kPairsPerGroup;
  constexpr int NG = Shape::kSlotGroups;
  extern __shared__ __align__(128) uint8_t smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y;
  const int chunk_begin = static_cast<int>(static_cast<int64_t>(split) * p.w.full_chunks / p.splits);
  const int chunk_end = static_cast<int>(static_cast<int64_t>(split + 1) * p.w.full_chunks / p.splits);
  const bool do_tail = p.w.tail && split == p.splits - 1;
  const int pair_end = 2 * chunk_end + (do_tail ? 1 : 0);
  // A slot holds up to SC chunks; slot_chunks (1..SC) of them are used (a benchmark knob).
  const int sc = slot_chunks;
  const int slots = (chunk_end - chunk_begin + sc - 1) / sc;
  const int R = ring_slots;

  const int rb = min(tile * WARPS + warp, p.w.row_blocks - 1);
  const uint8_t* w_block = p.w.codes + static_cast<int64_t>(rb) * p.w.k * 8;
  const uint32_t* s_block = p.w.scales + static_cast<int64_t>(rb) * p.w.groups * 8;
  uint8_t* ring = smem + static_cast<size_t>(warp) * R * Shape::kSlotBytes;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(WARPS) * R * Shape::kSlotBytes) + warp * R;

  // Slot i of this warp's split: its chunks and the scale groups they touch.
  auto slot_range = [&](int i, int& c0, int& nc, int& g0, int& ng) {
    c0 = chunk_begin + i * sc;
    nc = min(sc, chunk_end - c0);
    g0 = (2 * c0) / PPG;
    ng = (2 * (c0 + nc) - 1) / PPG - g0 + 1;
  };
  auto issue = [&](int i) {  // lane 0 only
    int c0, nc, g0, ng;
    slot_range(i, c0, nc, g0, ng);
    uint8_t* slot = ring + (i % R) * Shape::kSlotBytes;
    uint64_t* barrier = barriers + i % R;
    mbarrier_arrive_expect_tx(barrier, static_cast<uint32_t>(nc * 512 + ng * 32));
    bulk_copy_to_shared(slot, w_block + static_cast<int64_t>(c0) * 512, nc * 512, barrier);
    bulk_copy_to_shared(slot + SC * 512, s_block + g0 * 8, ng * 32, barrier);
  };

  grid_launch_dependents();
  if (lane == 0) {
    for (int i = 0; i < R; ++i) mbarrier_init(barriers + i, 1);
    fence_proxy_async_shared();  // the barriers' initialization, seen by the copy engine
    for (int i = 0; i < min(R, slots); ++i) issue(i);
  }
  __syncwarp();
  grid_dependency_wait();  // weights are in flight; x and every global write come after this

  const Elem* x = activation_values<Act>(p.a);
  const Elem* x_row[MT];
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) x_row[nt] = x + static_cast<int64_t>(min(nt * 8 + g, p.m - 1)) * p.a.ldx + t * 8;

  float acc[1][MT][4];
  GroupAcc gacc[1][MT][4];
  zero_accumulators<Act>(acc, gacc);
  auto pair_mma = [&](uint32_t w0, uint32_t w1, const Frag (&xf)[MT]) {
    const typename Act::Weights a = Act::unpack(w0, w1);
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) Act::mma(gacc[0][nt], a, xf[nt]);
  };

  for (int i = 0; i < slots; ++i) {
    int c0, nc, g0, ng;
    slot_range(i, c0, nc, g0, ng);
    // x of the slot's pairs first: independent of the copy, so its L2 round trip overlaps the wait.
    Frag xf[2 * SC][MT];
#pragma unroll
    for (int pp = 0; pp < 2 * SC; ++pp)
      if (pp < 2 * nc) {
#pragma unroll
        for (int nt = 0; nt < MT; ++nt) xf[pp][nt] = Act::load(x_row[nt] + (2 * c0 + pp) * 32);
      }
    const uint8_t* slot = ring + (i % R) * Shape::kSlotBytes;
    mbarrier_wait(barriers + i % R, static_cast<uint32_t>((i / R) & 1));
    // The whole slot, also past a short last slot's nc chunks / ng groups (stale, never used):
    // unconditional reads keep the arrays in registers.
    uint4 w[SC];
#pragma unroll
    for (int ch = 0; ch < SC; ++ch) w[ch] = *reinterpret_cast<const uint4*>(slot + ch * 512 + lane * 16);
    uint32_t scale[NG];
    const uint32_t* slot_scales = reinterpret_cast<const uint32_t*>(slot + SC * 512);
#pragma unroll
    for (int j = 0; j < NG; ++j) scale[j] = slot_scales[j * 8 + g];
    __syncwarp();  // every lane has read the slot
    if (lane == 0 && i + R < slots) {
      fence_proxy_async_shared();
      issue(i + R);
    }
#pragma unroll
    for (int ch = 0; ch < SC; ++ch)
      if (ch < nc) {
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
          const int pair = 2 * (c0 + ch) + hp;
          pair_mma(hp ? w[ch].z : w[ch].x, hp ? w[ch].w : w[ch].y, xf[2 * ch + hp]);
          if ((pair + 1) % PPG == 0 || pair + 1 == pair_end) {
            // scale[pair / PPG - g0] by selects: a runtime index would put the array in local memory.
            uint32_t group_scale = scale[0];
#pragma unroll
            for (int j = 1; j < NG; ++j)
              if (j == pair / PPG - g0) group_scale = scale[j];
            flush_group<Act, G>(acc[0], gacc[0], group_scale, p.a, pair / PPG, 0, t, p.m - 1);
          }
        }
      }
  }
  if (do_tail) {
    const int pair = 2 * p.w.full_chunks;
    Frag xf[MT];
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) xf[nt] = Act::load(x_row[nt] + pair * 32);
    const uint2 w = load_stream_8(w_block + static_cast<int64_t>(p.w.full_chunks) * 512 + lane * 8);
    pair_mma(w.x, w.y, xf);
    flush_group<Act, G>(acc[0], gacc[0], __ldg(s_block + (pair / PPG) * 8 + g), p.a, pair / PPG, 0, t, p.m - 1);
  }

  // Epilogue: thread holds rows (rb*16 + g, + 8) x tokens (nt*8 + 2t, + 1).
  apply_token_scales<Act>(acc, p.a.scales, 0, t, p.m - 1);
  const int my_rb = tile * WARPS + warp;
  if (my_rb < p.w.row_blocks) {
#pragma unroll
    for (int nt = 0; nt < MT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = my_rb * 16 + g + (e >= 2 ? 8 : 0);
        const int token = nt * 8 + 2 * t + (e & 1);
        if (row >= p.w.n || token >= p.m) continue;
        if (p.splits == 1)
          p.y[token * p.ldy + row] = __float2half_rn(acc[0][nt][e]);
        else
          p.partials[(static_cast<int64_t>(split) * p.m + token) * p.w.n + row] = acc[0][nt][e];
      }
  }
  if (p.splits == 1) return;
  const int row_begin = tile * WARPS * 16;
  splitk_finish<WARPS * 32>(p.counters, tile, p.splits, p.partials, p.y, p.ldy, p.m, p.w.n, row_begin,
                            min(WARPS * 16, p.w.n - row_begin));
#else
  __trap();  // sm_90a only: the launcher checks that this build runs (w4a16_preload_runs_here)
#endif
}

}  // namespace qspec::cuda::kernels
