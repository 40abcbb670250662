// W4A16 GEMM for few tokens, variant 5 ("preload"): the math of w4a16_small_m.cuh (y^T = W x^T
// on mma.sync, one 16-row block a warp, per-group f32 scaling, split-K with a last-block
// fix-up), with the packed weights brought into shared memory by the bulk copy engine
// (cp.async.bulk, sm_90) instead of 16-byte register loads.
//
// Each warp owns a ring of R slots of up to 4 chunks (2 KB of codes and the group scales they
// need) in shared memory; one lane issues a slot's copies, so a slot costs no registers and a
// few instructions, and the first R slots are requested before griddepcontrol.wait (weights do
// not depend on the previous kernel). It was written to request a GEMM's whole split during the
// kernels before it; measured in the decode step (docs/perf-journal/perf-notes-journal-2026.md, "The preload kernel"),
// deeper rings and smaller slots were slower, so the launcher defaults to one slot a warp (two at
// one token, measured later: −1.5 % at batch 1 on the H100), one wave of two blocks a multiprocessor. What it gains over variant 1 (6 % of the batch-1 step)
// comes from few large copies a warp and few registers a thread (98), not from depth.
//
// Per warp, no block-wide synchronization: slot i of the warp's split lives in ring slot i % R
// and completes phase (i / R) & 1 of that slot's mbarrier. After reading a slot into registers
// the warp synchronizes, and its lane 0 refills the slot with slot i + R (the generic-proxy
// reads are ordered before the copy engine's writes by __syncwarp and fence.proxy.async).
//
// K slices inside a block (k_slices = 2, 4 or 8): the block's warps share WARPS / k_slices row
// blocks, each row block's k range cut into k_slices parts, one a warp, and the block sums the
// parts in shared memory (in k order, as the global fix-up sums splits). Where the row blocks
// alone fill too few blocks (o and down of Llama-3-8B: 256 row blocks, 32 blocks of 8), this
// gives the one-wave grid without split-K across blocks, so the GEMM ends without the global
// fix-up's chain (partials to global memory, fence, arrival atomic, the last block's reads).
//
// Bitwise the register-ring kernel's output for the same partition of k: k_slices 1 and S
// splits, or k_slices S and one split (the same mma per k pair, the same group flushes, the
// same sums in the same order).
//
// SwiGLU in the epilogue (SWIGLU, one split, 1, 2 or 4 k slices): the weights are gate_up's, gate
// rows [0, n / 2) then up rows [n / 2, n). A block's first half of row blocks are gate row blocks
// and its second half the up row blocks of the same outputs (one k slice: warps 0-3 and 4-7); the
// up warps hand their sums over in shared memory (with k slices every warp does, and each gate
// row block's first warp adds both row blocks' slices in k order, as the slices' sum below) and
// the gate warps write y = silu(gate) * up, n / 2 values a token. Each of gate and up is rounded
// to f16 first, as the GEMM stores them for silu_mul, so the bits are the GEMM's (same k slices)
// then silu_mul's, and the step loses silu_mul's launch and its dependent round trips.
//
// Zero points (Act = ActF16Zp, int4-asym weights; kActZeroPoints, compile time): each pair's
// group scale and minimum are folded into its f16 weights before the mma (ActF16Zp::fold), which
// then sums into the f32 totals with no group flush. Integer zero points (Act = ActF16Zc, int4-zp
// weights; kActZeroCodes): each pair unpacks to u - z with its group's zero word
// (ActF16Zc::unpack_zero) into int4's mma and group flush. The slot's minimums arrive by one more
// bulk copy into the slot, behind its scales (W4A16PreloadShape<G, true>), so the first slots have
// them in flight before griddepcontrol.wait as they have their codes (read from L2 after the wait
// they cost a dependent round trip a slot). The packed zero points, 8 bytes a group, are few
// enough that a warp takes its whole part's in one bulk copy at the start, issued before its first
// slots, into a region of its own after the rings (preload_zero_bytes): a copy a slot cost ~10
// instructions a slot in this issue-bound loop. The int4 instances compile as before.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/elementwise.cuh"  // swiglu_of_sums
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/kernels/w4a16_small_m.cuh"  // W4A16SmallMParams
#include "ops/cuda/kernels/wgmma.cuh"          // mbarriers, fence_proxy_async_shared, QSPEC_WGMMA

namespace qspec::cuda::kernels {

// GW: the weights have a word a group beside each scale (int4-asym's minimums, kActZeroPoints), a
// slot holds them too.
template <int G, bool GW = false>
struct W4A16PreloadShape {
  static constexpr int kWarps = 8;                     // 128 rows a block (kW4A16TileRows)
  static constexpr int kSlotChunks = 4;                // 256 k values, 2 KB of codes a warp slot
  static constexpr int kPairsPerGroup = G / 32;
  static constexpr int kSlotGroups = kSlotChunks * 64 / G + 1;  // a slot may straddle groups
  static constexpr int kScaleBytes = (kSlotGroups * 32 + 15) / 16 * 16;  // a slot's scales (and group words)
  static constexpr int kSlotBytes = kSlotChunks * 512 + kScaleBytes * (GW ? 2 : 1);
  // Dynamic shared memory for R slots a warp: the rings, then one mbarrier a slot.
  static constexpr size_t smem_bytes(int ring_slots) {
    return static_cast<size_t>(kWarps) * ring_slots * (kSlotBytes + 8);
  }
  // The k slices' sums reuse the rings (never the mbarriers): every warp's MT x 4 accumulators.
  template <int MT>
  static constexpr size_t reduction_bytes() {
    return static_cast<size_t>(kWarps) * MT * 4 * 32 * sizeof(float);
  }
  static_assert(reduction_bytes<2>() <= static_cast<size_t>(kWarps) * kSlotBytes, "a ring slot a warp holds the sums");
};

// int4-zp: the bytes of a warp's zero-point region, for parts of at most ceil(full_chunks / parts)
// chunks, 8 bytes a group: the groups such a part touches (one more where it straddles), one more
// where its run of group pairs starts on an odd group, and a slot's groups past its last (the last
// slot reads a slot's worth, unused). The launcher adds kWarps of these (and an mbarrier a warp)
// to the dynamic shared memory.
__host__ __device__ constexpr int preload_zero_bytes(int group, int full_chunks, int parts) {
  const int chunks = (full_chunks + parts - 1) / parts;
  const int groups = (2 * chunks * 32 + group - 1) / group + 2 + W4A16PreloadShape<128>::kSlotChunks * 64 / group + 1;
  return 16 * ((groups + 1) / 2);
}
// Where that region starts: after the rings and their mbarriers, and one mbarrier a warp for it.
__host__ __device__ constexpr size_t preload_zero_offset(size_t rings_bytes, int warps) {
  return (rings_bytes + static_cast<size_t>(warps) * 8 + 15) / 16 * 16;
}

// Blocks a multiprocessor the register budget is cut for (2: up to 128 registers a thread).
// QSPEC_W4A16_PRELOAD_MIN_BLOCKS at build time overrides it, for experiments.
#ifndef QSPEC_W4A16_PRELOAD_MIN_BLOCKS
#define QSPEC_W4A16_PRELOAD_MIN_BLOCKS 2
#endif

// X_AHEAD: k pairs of x a warp holds in registers ahead of the mma (0: a whole slot's, 2 * SC; see
// "x ahead" in the slot loop).
// ONE_SPLIT: the launch has one split (p.splits == 1; SWIGLU always), so the split-K fix-up is not
// compiled in. At one token tile that takes the plain GEMM from 114 to 102 registers at groups of
// 128 (the SwiGLU instance, which never had the fix-up, has 105; ncu counted 2 % fewer
// instructions for it than for the plain gate_up at one token).
template <class Act, int MT, int G, bool SWIGLU = false, int X_AHEAD = 0, bool ONE_SPLIT = SWIGLU>
__global__ __launch_bounds__(W4A16PreloadShape<G>::kWarps * 32, QSPEC_W4A16_PRELOAD_MIN_BLOCKS) void w4_preload_kernel(
    const W4A16SmallMParams p, const int ring_slots, const int slot_chunks, const int k_slices) {
#if QSPEC_WGMMA
  using Shape = W4A16PreloadShape<G, kActZeroPoints<Act>>;
  using Elem = typename Act::Elem;
  using Frag = typename Act::Frag;
  using GroupAcc = typename Act::GroupAcc;
  constexpr int WARPS = Shape::kWarps, SC = Shape::kSlotChunks, PPG = Shape::kPairsPerGroup;
  constexpr int NG = Shape::kSlotGroups;
  constexpr bool ZP = kActZeroPoints<Act>, ZC = kActZeroCodes<Act>;
  // x ahead: a slot's 2 * SC pairs of x for one token tile are 32 registers, for two 64, which
  // with the rest spill at the 128-register cap (2 blocks a multiprocessor). With XA < 2 * SC the
  // warp holds XA pairs and reloads pair p + XA into pair p's registers once p's mma has read
  // them, so the loads still run XA pairs ahead of their mma (the launcher's swiglu_x_half_slot
  // says where that pays).
  constexpr int XA = X_AHEAD > 0 ? X_AHEAD : 2 * SC;
  static_assert(XA >= 1 && XA <= 2 * SC, "x ahead: 1 to a slot's pairs");
  extern __shared__ __align__(128) uint8_t smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  static_assert(!SWIGLU || ONE_SPLIT, "the SwiGLU epilogue runs one split");
  const int tile = blockIdx.x, split = ONE_SPLIT ? 0 : blockIdx.y;
  const int splits = ONE_SPLIT ? 1 : p.splits;
  // k_slices warps share a row block; k is cut into splits x k_slices parts, in k order.
  const int parts = splits * k_slices, part = split * k_slices + warp % k_slices;
  const KShare share = k_share(p.w, part, parts);
  const int chunk_begin = share.chunk_begin, chunk_end = share.chunk_end, pair_end = share.pair_end;
  const bool do_tail = share.tail;
  // A slot holds up to SC chunks; slot_chunks (1..SC) of them are used (a benchmark knob).
  const int sc = slot_chunks;
  const int slots = (chunk_end - chunk_begin + sc - 1) / sc;
  const int R = ring_slots;

  // The block's WARPS / k_slices row blocks, k_slices warps each. SWIGLU: the first half gate row
  // blocks, the second half the up row blocks n / 2 rows further on.
  const int block_rbs = WARPS / k_slices, rbi = warp / k_slices;
  const int gate_rbs = block_rbs / 2, gate_blocks = p.w.row_blocks / 2;
  const int rb = SWIGLU ? min(tile * gate_rbs + rbi % gate_rbs, gate_blocks - 1) + (rbi < gate_rbs ? 0 : gate_blocks)
                        : min(tile * block_rbs + rbi, p.w.row_blocks - 1);
  const uint8_t* w_block = p.w.codes + static_cast<int64_t>(rb) * p.w.k * 8;
  const uint32_t* s_block = p.w.scales + static_cast<int64_t>(rb) * p.w.groups * 8;
  const uint32_t* words_block = ZP ? zero_point_mins(p.w) + static_cast<int64_t>(rb) * p.w.groups * 8 : nullptr;
  const uint8_t* zero_block = ZC ? zero_point_bytes(p.w, rb) : nullptr;  // int4-zp: 8 bytes a group
  const uint32_t zero_selector = zero_byte_selector(g);
  uint8_t* ring = smem + static_cast<size_t>(warp) * R * Shape::kSlotBytes;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(WARPS) * R * Shape::kSlotBytes) + warp * R;
  // int4-zp: this warp's zero points (its part's group pairs from zero_pair0) and their mbarrier.
  const size_t rings_bytes = Shape::smem_bytes(R);
  uint64_t* zero_barrier = reinterpret_cast<uint64_t*>(smem + rings_bytes) + warp;
  const int zero_region = ZC ? preload_zero_bytes(G, p.w.full_chunks, parts) : 0;
  uint32_t* zero_smem = reinterpret_cast<uint32_t*>(smem + preload_zero_offset(rings_bytes, WARPS) + warp * zero_region);
  const int zero_pair0 = ((2 * chunk_begin) / PPG) & ~1;

  // Slot i of this warp's split: its chunks and the scale groups they touch.
  auto slot_range = [&](int i, int& c0, int& nc, int& g0, int& ng) {
    c0 = chunk_begin + i * sc;
    nc = min(sc, chunk_end - c0);
    g0 = (2 * c0) / PPG;
    ng = (2 * (c0 + nc) - 1) / PPG - g0 + 1;
  };
  const uint64_t policy = p.evict_first ? l2_evict_first_policy() : 0;
  auto copy = [&](void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
    if (p.evict_first) bulk_copy_to_shared_hinted(dst, src, bytes, barrier, policy);
    else bulk_copy_to_shared(dst, src, bytes, barrier);
  };
  // Slot i into ring slot r (= i % R, which the caller tracks: a runtime division costs ~35
  // instructions, and this kernel is bound by instruction issue on the H200, docs/perf-journal/perf-notes-journal-2026.md).
  auto issue = [&](int i, int r) {  // lane 0 only
    int c0, nc, g0, ng;
    slot_range(i, c0, nc, g0, ng);
    uint8_t* slot = ring + r * Shape::kSlotBytes;
    uint64_t* barrier = barriers + r;
    mbarrier_arrive_expect_tx(barrier, static_cast<uint32_t>(nc * 512 + ng * 32 + (ZP ? ng * 32 : 0)));
    copy(slot, w_block + static_cast<int64_t>(c0) * 512, nc * 512, barrier);
    copy(slot + SC * 512, s_block + g0 * 8, ng * 32, barrier);
    if constexpr (ZP) copy(slot + SC * 512 + Shape::kScaleBytes, words_block + g0 * 8, ng * 32, barrier);
  };

  grid_launch_dependents();
  if (lane == 0) {
    for (int i = 0; i < R; ++i) mbarrier_init(barriers + i, 1);
    if constexpr (ZC) mbarrier_init(zero_barrier, 1);
    fence_proxy_async_shared();  // the barriers' initialization, seen by the copy engine
    if constexpr (ZC) {
      // The part's zero points first: the group pairs from zero_pair0 through its last group's.
      const int last_group = (2 * chunk_end - 1) / PPG;
      const int bytes = chunk_end > chunk_begin ? 8 * (((last_group + 2) & ~1) - zero_pair0) : 0;
      mbarrier_arrive_expect_tx(zero_barrier, static_cast<uint32_t>(bytes));
      if (bytes > 0) copy(zero_smem, zero_block + zero_pair0 * 8, static_cast<uint32_t>(bytes), zero_barrier);
    }
    for (int i = 0; i < min(R, slots); ++i) issue(i, i);
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
  // Integer zero points: the pair as u - z, into the group sums as int4's.
  auto pair_mma_zero = [&](uint32_t w0, uint32_t w1, const Frag (&xf)[MT], const ZeroConstants& zc) {
    if constexpr (ZC) {
      const typename Act::Weights a = Act::unpack_zero(w0, w1, zc);
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) Act::mma(gacc[0][nt], a, xf[nt]);
    }
  };
  // Zero points: the pair's group scale and minimum folded in, the products into the totals.
  auto pair_mma_folded = [&](uint32_t w0, uint32_t w1, const Frag (&xf)[MT], uint32_t scale_word, uint32_t min_word) {
    if constexpr (ZP) {
      typename Act::Weights a = Act::unpack(w0, w1);
      Act::fold(a, scale_word, min_word);
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) Act::mma(acc[0][nt], a, xf[nt]);
    }
  };

  static_assert(PPG == 1 || PPG == 2 || PPG == 4, "scale groups of 32, 64 or 128");
  static_assert((2 * SC) % PPG == 0, "a whole slot that starts on a group boundary ends on one");
  if constexpr (ZC) mbarrier_wait(zero_barrier, 0);  // issued before the first slots: here by now
  int r = 0;           // ring slot of slot i (i % R)
  uint32_t phase = 0;  // its mbarrier phase ((i / R) & 1)
  for (int i = 0; i < slots; ++i) {
    int c0, nc, g0, ng;
    slot_range(i, c0, nc, g0, ng);
    // x of the slot's first XA pairs first: independent of the copy, so its L2 round trip overlaps
    // the wait. Pair pp lives in xf[pp % XA] (compile-time indices, so the array stays in registers).
    Frag xf[XA][MT];
    auto load_x = [&](int pp) {
#pragma unroll
      for (int nt = 0; nt < MT; ++nt) xf[pp % XA][nt] = Act::load(x_row[nt] + (2 * c0 + pp) * 32);
    };
#pragma unroll
    for (int pp = 0; pp < XA; ++pp)
      if (pp < 2 * nc) load_x(pp);
    const uint8_t* slot = ring + r * Shape::kSlotBytes;
    mbarrier_wait(barriers + r, phase);
    // The whole slot, also past a short last slot's nc chunks / ng groups (stale, never used):
    // unconditional reads keep the arrays in registers.
    uint4 w[SC];
#pragma unroll
    for (int ch = 0; ch < SC; ++ch) w[ch] = *reinterpret_cast<const uint4*>(slot + ch * 512 + lane * 16);
    uint32_t scale[NG];
    const uint32_t* slot_scales = reinterpret_cast<const uint32_t*>(slot + SC * 512);
#pragma unroll
    for (int j = 0; j < NG; ++j) scale[j] = slot_scales[j * 8 + g];
    // int4-asym: the slot's minimums, behind its scales (past a short last slot's groups: stale,
    // unused). int4-zp: each group's word of packed zero points (from the warp's region), turned
    // into the group's constants where a group starts (zero_constants: an array of ZeroConstants
    // picked by `lead` went to local memory, 24 bytes of stack).
    uint32_t zmin[ZP ? NG : 1];
    uint32_t zword[ZC ? NG : 1];
    if constexpr (ZP) {
      const uint32_t* slot_words = reinterpret_cast<const uint32_t*>(slot + SC * 512 + Shape::kScaleBytes);
#pragma unroll
      for (int j = 0; j < NG; ++j) zmin[j] = slot_words[j * 8 + g];
    }
    if constexpr (ZC) {
      // Group g0 + j's 8 bytes, g0 + j - zero_pair0 groups into the region; this lane's word of them
      // (past the part's last group: stale, unused).
      const uint32_t* zeros = zero_smem + 2 * (g0 - zero_pair0) + (g >> 2);
#pragma unroll
      for (int j = 0; j < NG; ++j) zword[j] = zeros[2 * j];
    }
    __syncwarp();  // every lane has read the slot
    if (lane == 0 && i + R < slots) {
      fence_proxy_async_shared();
      issue(i + R, r);
    }
    if (++r == R) {
      r = 0;
      phase ^= 1u;
    }
    // Pairs of the slot's first scale group before it (0, or 2 for groups of 128: a slot starts
    // at an even pair), so each pair's group within the slot is one of two compile-time indices.
    const int lead = (2 * c0) % PPG;
    if (nc == SC && lead == 0) {
      // A whole slot starting on a group boundary (every slot of a part that starts on one, but a
      // short last slot): its 2 * SC pairs end on a group boundary too, and the part's last pair
      // can only be its last, so the group flushes sit at compile-time pairs. The general body
      // below tests every pair, and a flush it skips still issues (predicated off): ~11
      // instructions a pair in an issue-bound loop (SASS of the batch-1 instance).
      ZeroConstants zc{};  // int4-zp: the current group's, made at its first pair
#pragma unroll
      for (int ch = 0; ch < SC; ++ch)
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
          const int pp = 2 * ch + hp;
          if constexpr (ZC)
            if (pp % PPG == 0) zc = zero_constants(zword[pp / PPG], zero_selector);
          if constexpr (ZP)
            pair_mma_folded(hp ? w[ch].z : w[ch].x, hp ? w[ch].w : w[ch].y, xf[pp % XA], scale[pp / PPG],
                            zmin[pp / PPG]);
          else if constexpr (ZC)
            pair_mma_zero(hp ? w[ch].z : w[ch].x, hp ? w[ch].w : w[ch].y, xf[pp % XA], zc);
          else
            pair_mma(hp ? w[ch].z : w[ch].x, hp ? w[ch].w : w[ch].y, xf[pp % XA]);
          if (pp + XA < 2 * SC) load_x(pp + XA);
          if (!ZP && (2 * ch + hp + 1) % PPG == 0)
            flush_group<Act, G>(acc[0], gacc[0], scale[(2 * ch + hp) / PPG], p.a, (2 * (c0 + ch) + hp) / PPG, 0, t,
                                p.m - 1);
        }
      continue;
    }
#pragma unroll
    for (int ch = 0; ch < SC; ++ch)
      if (ch < nc) {
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
          const int pair = 2 * (c0 + ch) + hp, pp = 2 * ch + hp;
          if constexpr (ZP) {
            // The pair's group in the slot, (lead + pp) / PPG, as one of two compile-time indices
            // (lead is 0, or 2 for groups of 128), as the flush below picks its scale.
            const int j0 = pp / PPG, j2 = min((pp + 2) / PPG, NG - 1);
            pair_mma_folded(hp ? w[ch].z : w[ch].x, hp ? w[ch].w : w[ch].y, xf[pp % XA], lead == 0 ? scale[j0] : scale[j2],
                            lead == 0 ? zmin[j0] : zmin[j2]);
          } else if constexpr (ZC) {
            const int j0 = pp / PPG, j2 = min((pp + 2) / PPG, NG - 1);
            // (rare: a short last slot or a part not starting on a group; constants a pair)
            pair_mma_zero(hp ? w[ch].z : w[ch].x, hp ? w[ch].w : w[ch].y, xf[pp % XA],
                          zero_constants(lead == 0 ? zword[j0] : zword[j2], zero_selector));
          } else {
            pair_mma(hp ? w[ch].z : w[ch].x, hp ? w[ch].w : w[ch].y, xf[pp % XA]);
          }
          if (pp + XA < 2 * SC && pp + XA < 2 * nc) load_x(pp + XA);
          if (!ZP && ((lead + 2 * ch + hp + 1) % PPG == 0 || pair + 1 == pair_end)) {
            // scale[pair / PPG - g0] with compile-time indices: a runtime index (or a select chain
            // the compiler folds back into one) puts the array in local memory.
            const uint32_t group_scale =
                lead == 0 ? scale[(2 * ch + hp) / PPG] : scale[min((2 * ch + hp + 2) / PPG, NG - 1)];
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
    if constexpr (ZP) {
      pair_mma_folded(w.x, w.y, xf, __ldg(s_block + (pair / PPG) * 8 + g), __ldg(words_block + (pair / PPG) * 8 + g));
    } else {
      if constexpr (ZC) pair_mma_zero(w.x, w.y, xf, zero_constants(zero_point_word(zero_block, pair / PPG, g), zero_selector));
      else pair_mma(w.x, w.y, xf);
      flush_group<Act, G>(acc[0], gacc[0], __ldg(s_block + (pair / PPG) * 8 + g), p.a, pair / PPG, 0, t, p.m - 1);
    }
  }

  // Epilogue: thread holds rows (rb*16 + g, + 8) x tokens (nt*8 + 2t, + 1).
  apply_token_scales<Act>(acc, p.a.scales, 0, t, p.m - 1);
  // Hand-overs through shared memory (the k slices' sums, SwiGLU's up row blocks): a warp's
  // accumulators into the rings (each warp has waited for all of its copies, so no bulk copy is in
  // flight once all are here); a row block's sum is its slices' in k order from zero, as the
  // global fix-up sums splits.
  float* sums = reinterpret_cast<float*>(smem);
  auto at = [&](int w, int nt, int e) { return ((w * MT + nt) * 4 + e) * 32 + lane; };
  auto store_sums = [&] {
#pragma unroll
    for (int nt = 0; nt < MT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[at(warp, nt, e)] = acc[0][nt][e];
  };
  auto slice_sum = [&](int first_warp, int nt, int e) {
    float sum = 0.f;
    for (int s = 0; s < k_slices; ++s) sum += sums[at(first_warp + s, nt, e)];
    return sum;
  };
  if constexpr (SWIGLU) {
    // The up warps' accumulators (every warp's, with k slices), then each gate row block's first
    // warp pairs its rows with its up row block's.
    __syncthreads();
    if (k_slices > 1 || rbi >= gate_rbs) store_sums();
    __syncthreads();
    const int gate_rb = tile * gate_rbs + rbi;
    const int up_warp = warp + gate_rbs * k_slices;  // the first warp of the matching up row block
    if (rbi < gate_rbs && warp % k_slices == 0 && gate_rb < gate_blocks) {
      for_each_fragment_element<MT>(gate_rb, t, g, [&](int nt, int e, int row, int token) {
        if (token >= p.m) return;
        const float gate_sum = k_slices > 1 ? slice_sum(warp, nt, e) : acc[0][nt][e];
        const float up_sum = k_slices > 1 ? slice_sum(up_warp, nt, e) : sums[at(up_warp, nt, e)];
        p.y[token * p.ldy + row] = swiglu_of_sums(gate_sum, up_sum);
      });
    }
    return;
  }
  if (k_slices > 1) {
    __syncthreads();
    store_sums();
    __syncthreads();
    if (warp % k_slices == 0) {
#pragma unroll
      for (int nt = 0; nt < MT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][nt][e] = slice_sum(warp, nt, e);
    }
  }
  const int out_rb = tile * block_rbs + rbi;
  if (warp % k_slices == 0 && out_rb < p.w.row_blocks)
    store_fragment<MT>(acc[0], out_rb, t, g, p.w.n, p.m, splits, blockIdx.y, p.y, p.ldy, p.partials);
  if (splits == 1) return;
  const int tile_rows = block_rbs * 16, row_begin = tile * tile_rows;
  splitk_finish<WARPS * 32>(p.counters, tile, splits, p.partials, p.y, p.ldy, p.m, p.w.n, row_begin,
                            min(tile_rows, p.w.n - row_begin));
#else
  __trap();  // sm_90a only: the launcher checks that this build runs (w4a16_preload_runs_here)
#endif
}

}  // namespace qspec::cuda::kernels
