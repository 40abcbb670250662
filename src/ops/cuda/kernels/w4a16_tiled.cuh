// 4-bit-weight GEMM for tens to hundreds of tokens: y[m, n] = x[m, k] W[n, k]^T with W int4
// (ops/w4a16_pack.h) and x in any activation policy of kernels/w4_activation.cuh. Same math as
// w4a16_small_m.cuh, bit for bit: y^T = W x^T on mma.sync (16 weight rows are A, 8 tokens are
// B), weights unpacked into exact f16 (int8) integers, each scale group accumulated in f32 (s32)
// and then scaled by the group's scale in f32; token scales at the end.
//
// Tiling: a block owns kRows = WARPS x RPW x 16 weight rows and kTokens = MT x 8 tokens (grid:
// x = M tile, y = row tile, z = K split). M tiles are the fastest grid dimension, so the blocks
// that share a row tile run together and all but the first read its weights from L2. The block
// walks its k range in stages of CH chunks (64 k each) through a STAGES-deep cp.async ring in
// shared memory holding, per stage, the x slab [kTokens x 64 CH] (read from L2 once per block,
// not once per warp as in the small-M kernel), the weights and the scales.
//
// Why the weights also go through shared memory (not straight into registers as in the
// small-M kernel): with kTokens = 64 a warp holds 2 x RPW x MT x 4 f32 accumulators (group +
// total: 128 registers for RPW 2, MT 8), so a register ring deep enough to cover DRAM latency
// does not fit; a cp.async ring keeps 3 stages (48 KB a multiprocessor) of weights in flight at
// the price of shared memory only. Each weight is still used by one warp, and each lane copies
// and reads back only its own 16 bytes of each 512-byte chunk (no bank conflicts, and the
// per-stage barrier that x needs anyway orders the slot reuse).
//
// Why no ldmatrix for x: the packed k order (ops/w4a16_pack.h) makes lane 4g+t's B fragments
// of a pair the 8 consecutive values x[g][32P + 8t ..], i.e. one 16-byte (f16) or 8-byte (int8)
// shared load, as many instructions as ldmatrix.x4 (which would deliver pairs 2t, 2t+1: the
// unpermuted order). x rows are 64 CH values (a multiple of 128 bytes) and unpadded; their 16-byte
// pieces are XOR-swizzled (piece p of row r stored at p ^ x_swizzle(r)): f16 odd rows by 4, so
// the 8 lanes of each quarter warp (rows g, g + 1; pieces 4hp + t) hit 8 distinct 16-byte bank
// groups; int8 rows r by 2 (r & 3), so each half warp (rows g..g+3, pieces 2hp, 2hp + 1) covers
// all 32 banks.
//
// Programmatic dependent launch: the weight and scale loads of the first STAGES - 1 stages are
// issued before griddepcontrol.wait; x and every global write come after it.
//
// SwiGLU in the epilogue (SWIGLU, one split, RPW even): the weights are gate_up's, gate rows
// [0, n / 2) then up rows [n / 2, n). Each warp's row blocks come in pairs, a gate row block and
// the up row block of the same outputs (a row tile is kRows / 2 outputs), so each thread holds
// both sums of its outputs and writes y = silu(gate) * up, n / 2 values a token, from registers.
// Each of gate and up is rounded to f16 first, as the GEMM stores them for silu_mul, so the bits
// are the one-split GEMM's then silu_mul's (as in w4a16_preload.cuh), and the step loses
// silu_mul's launch, its dependent round trip and the y it reads.
//
// Zero points (Act = ActF16Zp, int4-asym weights; kActZeroPoints): each unpacked pair gets its
// group's scale and minimum folded in (ActF16Zp::fold, one hfma2 a register) and the mma sums
// into the f32 totals, so there is no group accumulator and no flush. The fold is paid once a
// fragment and shared by the warp's MT token tiles, where a minimum mma (the preload kernel's
// way) would be paid per token tile; at MT 4-8 it costs about what int4's group flushes do.
// Integer zero points (Act = ActF16Zc, int4-zp weights; kActZeroCodes): each pair unpacks to
// u - z with its group's zero word (ActF16Zc::unpack_zero) into int4's group sums and flushes:
// int4's loop with the group's constants where int4 has 1032 and -72. Either way the stage's
// minimums or packed zero points (a separate array after the scales) come into the stage with its
// scales (cp.async, behind them: stage_bytes<G, true>), so the first stages have them in flight
// before griddepcontrol.wait.
#pragma once
#include <type_traits>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/elementwise.cuh"  // swiglu_of_sums
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"

namespace qspec::cuda::kernels {

// Tile shape: MT n-tiles of 8 tokens, RPW row blocks of 16 rows per warp, WARPS warps, CH
// chunks of 64 k per stage, STAGES ring slots, MIN_BLOCKS for __launch_bounds__. kXBytes is
// the f16 slab; an int8 slab takes half of it (the stage layout keeps the f16 size).
template <int MT_, int RPW_, int WARPS_, int CH_, int STAGES_, int MIN_BLOCKS_>
struct W4A16TileShape {
  static constexpr int MT = MT_, RPW = RPW_, WARPS = WARPS_, CH = CH_, STAGES = STAGES_;
  static constexpr int kMinBlocks = MIN_BLOCKS_;
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kTokens = MT * 8;
  static constexpr int kRows = WARPS * RPW * 16;
  static constexpr int kXRowHalves = CH * 64;  // unpadded: swizzled instead
  static constexpr int kWBytes = WARPS * RPW * CH * 512;
  static constexpr int kXBytes = kTokens * kXRowHalves * 2;
  // Scale groups a stage covers exactly (splits start at group boundaries, CH % chunks per group == 0).
  template <int G>
  static constexpr int groups_per_stage() { return (2 * CH) / (G / 32); }
  // A stage's scales, and as many bytes again for the words a group of zero-point weights (GW).
  template <int G>
  static constexpr int scale_bytes() { return WARPS * RPW * groups_per_stage<G>() * 32; }
  template <int G, bool GW = false>
  static constexpr int stage_bytes() { return kWBytes + kXBytes + scale_bytes<G>() * (GW ? 2 : 1); }
  template <int G, bool GW = false>
  static constexpr int smem_bytes() { return STAGES * stage_bytes<G, GW>(); }
  static_assert(CH >= 1 && STAGES >= 2 && MT >= 1 && RPW >= 1, "bad W4A16 tile shape");
};

struct W4A16TiledParams {
  W4A16Layout w;
  ActivationRows a;
  __half* y;
  int64_t ldy;
  int m;        // tokens (any m >= 1: gridDim.x = m_tiles)
  int m_tiles;  // ceil(m / kTokens)
  int splits;
  // When splits > 1: the partials of M tile i start at partials + splits * (i * kTokens) * n,
  // laid out [splits][tokens of the tile][n] (so splitk_fixup sees an m of the tile's tokens).
  float* partials;
  unsigned* counters;  // [row tiles * m_tiles], zero between launches
};

// The stored 16-byte piece of logical piece p in x slab row r (see the header comment).
template <class Act>
__device__ __forceinline__ int x_swizzle(int r) {
  if constexpr (sizeof(typename Act::Elem) == 1) return (r & 3) << 1;
  else return (r & 1) << 2;
}

// The end of a tiled block (the mma.sync tiles and the wgmma tile, w4a16_wgmma.cuh): token
// scales, then this thread's outputs (row blocks first_row_block + r: rows rb * 16 + g, + 8;
// tokens m0 + nt * 8 + 2t, + 1) to y, or with split-K to this M tile's partials,
// [splits][tile tokens][n], and the last block of the output tile sums them.
template <class Act, int THREADS, int ROWS, int RPW, int MT>
__device__ __forceinline__ void tiled_epilogue(float (&acc)[RPW][MT][4], const W4A16TiledParams& p,
                                               int first_row_block, int m_tile, int row_tile, int split, int t,
                                               int g) {
  const int m0 = m_tile * MT * 8, tile_m = min(MT * 8, p.m - m0);
  float* partials = p.splits > 1 ? p.partials + static_cast<int64_t>(p.splits) * m0 * p.w.n : nullptr;
  apply_token_scales<Act>(acc, p.a.scales, m0, t, tile_m - 1);
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int rb = first_row_block + r;
    if (rb >= p.w.row_blocks) continue;
    store_fragment<MT>(acc[r], rb, t, g, p.w.n, tile_m, p.splits, split, p.y + static_cast<int64_t>(m0) * p.ldy, p.ldy,
                       partials);
  }
  if (p.splits == 1) return;
  // Split-K fix-up: the last block to finish this (row tile, M tile) sums the partials in split order.
  const int row_begin = row_tile * ROWS;
  splitk_finish<THREADS>(p.counters, row_tile * p.m_tiles + m_tile, p.splits, partials,
                         p.y + static_cast<int64_t>(m0) * p.ldy, p.ldy, tile_m, p.w.n, row_begin,
                         min(ROWS, p.w.n - row_begin));
}

// The row block of warp `warp`'s r-th rows in row tile `row_tile` (past the matrix: the last one
// again, outputs dropped). SWIGLU: a warp's row blocks come in (gate, up) pairs for the same
// outputs, r even the gate row block and r + 1 its up row block n / 32 further on.
template <class Tile, bool SWIGLU>
__device__ __forceinline__ int tiled_row_block(const W4A16Layout& w, int row_tile, int warp, int r) {
  if constexpr (SWIGLU) {
    const int gate_blocks = w.row_blocks / 2;
    const int rb = min((row_tile * Tile::WARPS + warp) * (Tile::RPW / 2) + r / 2, gate_blocks - 1);
    return r % 2 == 0 ? rb : rb + gate_blocks;
  } else {
    return min((row_tile * Tile::WARPS + warp) * Tile::RPW + r, w.row_blocks - 1);
  }
}

// The SWIGLU end of a tiled block (one split): each (gate, up) pair of this thread's row blocks,
// rounded to f16 as the GEMM stores them, gives silu(gate) * up for this M tile's tokens.
template <class Act, class Tile>
__device__ __forceinline__ void tiled_swiglu_epilogue(float (&acc)[Tile::RPW][Tile::MT][4], const W4A16TiledParams& p,
                                                      int m_tile, int row_tile, int warp, int t, int g) {
  constexpr int PAIRS = Tile::RPW / 2, MT = Tile::MT;
  const int m0 = m_tile * Tile::kTokens, tile_m = min(Tile::kTokens, p.m - m0);
  apply_token_scales<Act>(acc, p.a.scales, m0, t, tile_m - 1);
  const int gate_blocks = p.w.row_blocks / 2;
#pragma unroll
  for (int pair = 0; pair < PAIRS; ++pair) {
    const int gate_rb = (row_tile * Tile::WARPS + warp) * PAIRS + pair;
    if (gate_rb >= gate_blocks) continue;
    for_each_fragment_element<MT>(gate_rb, t, g, [&](int nt, int e, int row, int token) {
      if (token < tile_m)
        p.y[static_cast<int64_t>(m0 + token) * p.ldy + row] =
            swiglu_of_sums(acc[2 * pair][nt][e], acc[2 * pair + 1][nt][e]);
    });
  }
}

// Where the ring's refill goes in a stage (LATE_REFILL): after the first chunk's shared loads,
// predicated, with its copy addresses a base set up once plus the stage's offset, so that the
// compiler interleaves its ~100-150 instructions with that chunk's unpack and mma; or (false)
// first, after the barrier, as one branch. Measured on the H100 (docs/perf-journal/perf-notes-journal-2026.md, "The ring's
// refill among the mma"): the plain 4-token-tile launches (128x32: qkv, o, down at 41-64 tokens,
// down at 17-32) and the int8 tiles gain (down 0.6-1.8 µs a launch at 64 tokens; W4A16 steps at
// batch 48-64 0.4-3.1 % shorter on Llama-3-8B, Qwen2.5-7B, Llama-2-7B). The late place keeps more
// registers live through the mma: the f16 tiles of 8 token tiles (SwiGLU's 128x64: 255 registers,
// 48 bytes of spills, gate_up 4-9 µs slower), the SwiGLU epilogue's 128x32 (0.3-0.6 µs slower) and
// the 8-warp forms (a 128-register cap) lost with it, so they refill first with the original
// copies (with the set-up bases there SwiGLU's 128x64 ran 52.6 µs for 48.2). The original copies
// at the late place lost on every tile.
template <class Act, class Tile, bool SWIGLU>
constexpr bool kTiledLateRefill =
    !SWIGLU && Tile::RPW == 2 && (Tile::MT <= 4 || std::is_same_v<typename Act::GroupAcc, int>);

template <class Act, class Tile, int G, bool SWIGLU = false, bool LATE_REFILL = kTiledLateRefill<Act, Tile, SWIGLU>>
__global__ __launch_bounds__(Tile::kThreads, Tile::kMinBlocks) void w4_tiled_kernel(const W4A16TiledParams p) {
  using Elem = typename Act::Elem;
  using GroupAcc = typename Act::GroupAcc;
  constexpr int MT = Tile::MT, RPW = Tile::RPW, CH = Tile::CH, STAGES = Tile::STAGES;
  constexpr int THREADS = Tile::kThreads, TOKENS = Tile::kTokens, XH = Tile::kXRowHalves;  // XH: values a row
  constexpr int PIECE = 16 / static_cast<int>(sizeof(Elem));  // values a 16-byte piece
  constexpr int PPG = G / 32;                // k pairs (32 values) per scale group
  constexpr int GC = G >= 64 ? G / 64 : 1;   // chunks per group (a group of 32 is half a chunk)
  static_assert(CH % GC == 0, "a stage holds whole scale groups");
  constexpr int NG = Tile::template groups_per_stage<G>();
  constexpr bool ZP = kActZeroPoints<Act>, ZC = kActZeroCodes<Act>, GW = kActGroupWords<Act>;
  constexpr int STAGE_BYTES = Tile::template stage_bytes<G, GW>();
  static_assert(!SWIGLU || RPW % 2 == 0, "SwiGLU: a warp's row blocks in (gate, up) pairs");
  extern __shared__ __align__(128) uint8_t smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int m_tile = blockIdx.x, row_tile = blockIdx.y, split = blockIdx.z;
  const int m0 = m_tile * TOKENS, tile_m = min(TOKENS, p.m - m0);
  // Splits start and end at scale-group boundaries, and so does every stage: each group is
  // flushed at a point known at compile time (no accumulator shuffling at run-time branches).
  const int group_units = p.w.full_chunks / GC;
  const int chunk_begin = static_cast<int>(static_cast<int64_t>(split) * group_units / p.splits) * GC;
  const int chunk_end = static_cast<int>(static_cast<int64_t>(split + 1) * group_units / p.splits) * GC;
  const bool do_tail = p.w.tail && split == p.splits - 1;
  const int stages = (chunk_end - chunk_begin + CH - 1) / CH;

  // This warp's row blocks (past the matrix: the last one again, outputs dropped).
  const uint8_t* w_block[RPW];
  const uint32_t* s_block[RPW];
  const uint32_t* m_lane[RPW];  // int4-asym: this lane's minimum words (rows g, g + 8)
  const uint8_t* zero_rb[RPW];   // int4-zp: the row block's packed zero points
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int rb = tiled_row_block<Tile, SWIGLU>(p.w, row_tile, warp, r);
    w_block[r] = p.w.codes + static_cast<int64_t>(rb) * p.w.k * 8;
    s_block[r] = p.w.scales + static_cast<int64_t>(rb) * p.w.groups * 8;
    m_lane[r] = ZP ? zero_point_mins(p.w) + static_cast<int64_t>(rb) * p.w.groups * 8 + g : nullptr;
    zero_rb[r] = ZC ? zero_point_bytes(p.w, rb) : nullptr;
  }
  // int4-zp: this lane's 8-byte zero-point piece of a stage (row block z_row, group z_j), its row
  // block's bytes picked by selects (zero_rb[z_row], a runtime index, put the array in local memory).
  const int z_row = min(lane / NG, RPW - 1), z_j = lane % NG;
  const uint8_t* z_rb = zero_rb[0];
#pragma unroll
  for (int r = 1; r < RPW; ++r)
    if (z_row == r) z_rb = zero_rb[r];
  // Ring slot layout: [weights: warp, r, ch, 512 B][x: TOKENS rows x XH halves][scales: warp, r, NG x 8 words]
  // [GW: the words a group, as the scales].
  auto w_smem = [&](int slot, int r, int ch) {
    return smem + slot * STAGE_BYTES + ((warp * RPW + r) * CH + ch) * 512 + lane * 16;
  };
  auto x_smem = [&](int slot) { return reinterpret_cast<Elem*>(smem + slot * STAGE_BYTES + Tile::kWBytes); };
  auto scales_smem = [&](int slot) { return smem + slot * STAGE_BYTES + Tile::kWBytes + Tile::kXBytes; };
  auto s_smem = [&](int slot, int r) {
    return reinterpret_cast<uint32_t*>(scales_smem(slot)) + (warp * RPW + r) * NG * 8;
  };
  constexpr int WORDS_OFFSET = Tile::template scale_bytes<G>();  // the words a group, behind the scales
  auto words_smem = [&](int slot, int r) {
    return reinterpret_cast<uint32_t*>(scales_smem(slot) + WORDS_OFFSET) + (warp * RPW + r) * NG * 8;
  };
  const uint32_t* words_base = ZP ? zero_point_mins(p.w) : nullptr;
  // int4-zp: 8 bytes a group and row block in the stage (the first 8 NG of the words' room).
  auto zeros_smem = [&](int slot, int r) { return scales_smem(slot) + WORDS_OFFSET + (warp * RPW + r) * NG * 8; };
  const uint32_t zero_selector = zero_byte_selector(g);

  // Weights and scales of stage st (this warp's row blocks) into ring slot `slot`.
  constexpr int SCALE_PIECES = RPW * NG * 2;  // 16 bytes each: half a group's 8 words
  auto load_w = [&](int slot, int st) {
    const int c0 = chunk_begin + st * CH;
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int ch = 0; ch < CH; ++ch) {
        const int c = c0 + ch;
        const bool valid = c < chunk_end;
        cp_async_16(smem_address(w_smem(slot, r, ch)),
                    w_block[r] + static_cast<int64_t>(valid ? c : chunk_begin) * 512 + lane * 16, valid ? 16 : 0);
      }
    const int group0 = (2 * c0) / PPG;
#pragma unroll
    for (int base = 0; base < SCALE_PIECES; base += 32) {
      const int i = base + lane;
      if (i < SCALE_PIECES) {
        const int r = i / (2 * NG), j = i % (2 * NG);
        const int group = group0 + (j >> 1);
        const bool valid = group < p.w.groups;
        const int rb = tiled_row_block<Tile, SWIGLU>(p.w, row_tile, warp, r);
        const int64_t word = (static_cast<int64_t>(rb) * p.w.groups + (valid ? group : 0)) * 8 + (j & 1) * 4;
        cp_async_16(smem_address(s_smem(slot, r) + (j >> 1) * 8 + (j & 1) * 4), p.w.scales + word, valid ? 16 : 0);
        if constexpr (ZP)
          cp_async_16(smem_address(words_smem(slot, r) + (j >> 1) * 8 + (j & 1) * 4), words_base + word, valid ? 16 : 0);
      }
    }
    if constexpr (ZC) {  // RPW x NG pieces of 8 bytes
      static_assert(RPW * NG <= 32, "one zero-point piece a lane");
      const int group = group0 + z_j;
      const bool valid = group < p.w.groups;
      cp_async_8_if(lane < RPW * NG, smem_address(zeros_smem(slot, z_row) + z_j * 8), z_rb + (valid ? group : 0) * 8,
                    valid ? 8 : 0);
    }
  };
  // The x slab of a stage: tokens m0 .. m0 + tile_m - 1 (rows past them and k past the split are
  // zero-filled, nothing read), rows swizzled. Thread i copies piece i % PIECES_PER_ROW of rows
  // i / PIECES_PER_ROW + ROW_STEP j: the piece and the row's swizzle are fixed.
  constexpr int PIECES_PER_ROW = XH / PIECE, PIECES_PER_CHUNK = 64 / PIECE, ROW_STEP = THREADS / PIECES_PER_ROW;
  static_assert(THREADS % PIECES_PER_ROW == 0 && ROW_STEP % 4 == 0 && TOKENS % ROW_STEP == 0,
                "x slab copy: every thread keeps one piece column and row swizzle");
  static_assert(PIECES_PER_ROW >= 8, "the int8 swizzle needs 8 pieces a row (CH >= 2)");
  const Elem* x_base = activation_values<Act>(p.a);
  const int64_t ldx = p.a.ldx;
  const int x_piece = threadIdx.x % PIECES_PER_ROW, x_row0 = threadIdx.x / PIECES_PER_ROW;
  const Elem* x_src0 = x_base + static_cast<int64_t>(m0 + min(x_row0, tile_m - 1)) * ldx + x_piece * PIECE;
  const int x_dst0 = x_row0 * XH + (x_piece ^ x_swizzle<Act>(x_row0)) * PIECE;
  auto load_x = [&](int slot, int st) {
    const int c0 = chunk_begin + st * CH;
    const bool k_valid = c0 + x_piece / PIECES_PER_CHUNK < chunk_end;
    Elem* xs = x_smem(slot);
#pragma unroll
    for (int j = 0; j < TOKENS / ROW_STEP; ++j) {
      const bool valid = k_valid && x_row0 + j * ROW_STEP < tile_m;
      const Elem* src = valid ? x_src0 + static_cast<int64_t>(j * ROW_STEP) * ldx + c0 * 64 : x_base;
      cp_async_16(smem_address(xs + x_dst0 + j * ROW_STEP * XH), src, valid ? 16 : 0);
    }
  };

  // The same copies for LATE_REFILL, issued among the mma: a stage-invariant base set up here once
  // plus the stage's offset (a copy past the split or the tile's tokens reads nothing, zero fill,
  // from a valid address), and predicated on `live` instead of branched around. (Unused, so not
  // compiled, without LATE_REFILL; the tiles that refill first keep the copies above, which ran
  // faster there: with these, SwiGLU's 128x64 took 52.6 µs for 48.2 on Llama-3-8B's gate_up.)
  const int split_chunks = chunk_end - chunk_begin;
  const uint8_t* w_src[RPW];  // this lane's 16 bytes of the split's first chunk, each row block
#pragma unroll
  for (int r = 0; r < RPW; ++r) w_src[r] = w_block[r] + static_cast<int64_t>(chunk_begin) * 512 + lane * 16;
  static_assert(!LATE_REFILL || SCALE_PIECES <= 32, "one scale piece a lane");
  const int s_row = lane / (2 * NG), s_piece = lane % (2 * NG);
  const int s_group0 = (2 * chunk_begin) / PPG + (s_piece >> 1);  // the lane's group at stage 0
  const int64_t s_word =
      (static_cast<int64_t>(tiled_row_block<Tile, SWIGLU>(p.w, row_tile, warp, min(s_row, RPW - 1))) * p.w.groups +
       min(s_group0, p.w.groups - 1)) * 8 + (s_piece & 1) * 4;
  const uint32_t* s_src = p.w.scales + s_word;
  const int s_dst = ((warp * RPW + s_row) * NG * 8 + (s_piece >> 1) * 8 + (s_piece & 1) * 4) * 4;
  const int z_group0 = (2 * chunk_begin) / PPG + z_j;
  const uint8_t* z_src = ZC ? z_rb + min(z_group0, p.w.groups - 1) * 8 : nullptr;
  auto late_load_w = [&](int slot, int st, bool live) {
#pragma unroll
    for (int ch = 0; ch < CH; ++ch) {
      const int chunk = st * CH + ch;  // within the split
      const bool valid = chunk < split_chunks;
      const int offset = (valid ? chunk : 0) * 512;
#pragma unroll
      for (int r = 0; r < RPW; ++r)
        cp_async_16_if(live, smem_address(w_smem(slot, r, ch)), w_src[r] + offset, valid ? 16 : 0);
    }
    const bool s_valid = s_group0 + st * NG < p.w.groups;
    cp_async_16_if(live && lane < SCALE_PIECES,
                   smem_address(scales_smem(slot) + s_dst),
                   s_src + (s_valid ? st * NG * 8 : 0), s_valid ? 16 : 0);
    if constexpr (ZP)
      cp_async_16_if(live && lane < SCALE_PIECES, smem_address(scales_smem(slot) + WORDS_OFFSET + s_dst),
                     words_base + s_word + (s_valid ? st * NG * 8 : 0), s_valid ? 16 : 0);
    if constexpr (ZC) {
      const bool z_valid = z_group0 + st * NG < p.w.groups;
      cp_async_8_if(live && lane < RPW * NG, smem_address(zeros_smem(slot, z_row) + z_j * 8),
                    z_src + (z_valid ? st * NG * 8 : 0), z_valid ? 8 : 0);
    }
  };
  const Elem* x_src_split = x_src0 + static_cast<int64_t>(chunk_begin) * 64;  // row x_row0, clamped
  const int x_chunk = x_piece / PIECES_PER_CHUNK;  // this piece's chunk within a stage
  auto late_load_x = [&](int slot, int st, bool live) {
    const bool k_valid = st * CH + x_chunk < split_chunks;
    const Elem* src_k = x_src_split + (k_valid ? st * CH * 64 : 0);
    Elem* xs = x_smem(slot);
#pragma unroll
    for (int j = 0; j < TOKENS / ROW_STEP; ++j) {
      const bool row_valid = x_row0 + j * ROW_STEP < tile_m;
      const Elem* src = src_k + (row_valid ? static_cast<int64_t>(j * ROW_STEP) * ldx : 0);
      cp_async_16_if(live, smem_address(xs + x_dst0 + j * ROW_STEP * XH), src, k_valid && row_valid ? 16 : 0);
    }
  };

  float acc[RPW][MT][4];
  GroupAcc gacc[RPW][MT][4];
  zero_accumulators<Act>(acc, gacc);
  // Scale group `group` of row set r into acc (f32), clear the group accumulators.
  auto flush = [&](int r, uint32_t scale_word, int group) {
    flush_group<Act, G>(acc[r], gacc[r], scale_word, p.a, group, m0, t, tile_m - 1);
  };

  grid_launch_dependents();
  // Prologue: weights first (independent of the previous kernel), then wait for it, then x.
  // Commit groups: W0 .. W(S-2), X0 .. X(S-2), then one (W + X) group per main-loop stage; with
  // wait_group(S - 2) at stage st, both W(st) and X(st) have landed (st < S - 1 included).
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if constexpr (LATE_REFILL) late_load_w(st, st, st < stages);
    else if (st < stages) load_w(st, st);
    cp_async_commit();
  }
  grid_dependency_wait();
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if constexpr (LATE_REFILL) late_load_x(st, st, st < stages);
    else if (st < stages) load_x(st, st);
    cp_async_commit();
  }

  // This lane's x offset (values) for n-tile 0 of pair hp of chunk ch of a stage: row g, the
  // piece holding values 64 ch + 32 hp + 8 t, swizzled (n-tiles are 8 rows apart: same swizzle).
  auto x_lane = [&](int ch, int hp) {
    const int value = ch * 64 + hp * 32 + t * 8;
    return g * XH + ((value / PIECE) ^ x_swizzle<Act>(g)) * PIECE + value % PIECE;
  };

  for (int st = 0; st < stages; ++st) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage st landed for every thread; slot (st - 1) % STAGES is free
    const int next = st + STAGES - 1;
    if constexpr (!LATE_REFILL) {
      if (next < stages) {
        load_w(next % STAGES, next);
        load_x(next % STAGES, next);
      }
      cp_async_commit();
    }

    const int slot = st % STAGES;
    const int c0 = chunk_begin + st * CH;
    const Elem* xs = x_smem(slot);
    // int4-zp: each row block's constants of the current group, made at the group's first pair
    // in the stage (once a group and row block, not a pair).
    uint32_t zsub[ZC ? RPW : 1], zadd[ZC ? RPW : 1];
#pragma unroll
    for (int ch = 0; ch < CH; ++ch) {
      const int c = c0 + ch;
      if ((!LATE_REFILL || ch > 0) && c >= chunk_end) break;  // a stage's first chunk is always in the split
      uint4 wq[RPW];
#pragma unroll
      for (int r = 0; r < RPW; ++r) wq[r] = *reinterpret_cast<const uint4*>(w_smem(slot, r, ch));
#pragma unroll
      for (int hp = 0; hp < 2; ++hp) {
        typename Act::Weights a[RPW];
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          const int j = (2 * ch + hp) / PPG;  // the pair's group in the stage
          if constexpr (ZC) {
            if ((2 * ch + hp) % PPG == 0) {  // static: a group starts (a stage starts on one)
              const ZeroConstants zc =
                  zero_constants(reinterpret_cast<const uint32_t*>(zeros_smem(slot, r) + j * 8)[g >> 2], zero_selector);
              zsub[r] = zc.sub;
              zadd[r] = zc.add;
            }
            a[r] = Act::unpack_zero(hp ? wq[r].z : wq[r].x, hp ? wq[r].w : wq[r].y, ZeroConstants{zsub[r], zadd[r]});
          } else
            a[r] = Act::unpack(hp ? wq[r].z : wq[r].x, hp ? wq[r].w : wq[r].y);
          if constexpr (ZP) Act::fold(a[r], s_smem(slot, r)[j * 8 + g], words_smem(slot, r)[j * 8 + g]);
        }
        const int x_off = x_lane(ch, hp);
#pragma unroll
        for (int nt = 0; nt < MT; ++nt) {
          const typename Act::Frag xf = Act::load_shared(xs + x_off + nt * 8 * XH);
#pragma unroll
          for (int r = 0; r < RPW; ++r) {
            if constexpr (ZP) Act::mma(acc[r][nt], a[r], xf);  // folded: finished products
            else if ((2 * ch + hp) % PPG == 0) Act::mma_first(gacc[r][nt], a[r], xf);  // static: a group starts
            else Act::mma(gacc[r][nt], a[r], xf);
          }
        }
        if (!ZP && (2 * ch + hp + 1) % PPG == 0) {  // the stage starts a group: static
#pragma unroll
          for (int r = 0; r < RPW; ++r)
            flush(r, s_smem(slot, r)[((2 * ch + hp) / PPG) * 8 + g], (2 * c + hp) / PPG);
        }
      }
      if (LATE_REFILL && ch == 0) {
        // The refill of the slot stage st - 1 left, after the first chunk's shared loads (the
        // compiler keeps shared-memory accesses in order, so a refill before them would hold them
        // back) and predicated rather than branched around: one block of code with the first
        // chunk's unpack and mma, which the compiler can interleave it with.
        late_load_w(next % STAGES, next, next < stages);
        late_load_x(next % STAGES, next, next < stages);
        cp_async_commit();
      }
    }
  }
  cp_async_wait<0>();

  if (do_tail) {  // k % 64 == 32: the last pair, straight from global memory
    const int pair = 2 * p.w.full_chunks;
    typename Act::Weights a[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const uint2 wq = load_stream_8(w_block[r] + static_cast<int64_t>(p.w.full_chunks) * 512 + lane * 8);
      if constexpr (ZC)
        a[r] = Act::unpack_zero(wq.x, wq.y, zero_constants(zero_point_word(zero_rb[r], pair / PPG, g), zero_selector));
      else a[r] = Act::unpack(wq.x, wq.y);
      if constexpr (ZP) Act::fold(a[r], __ldg(s_block[r] + (pair / PPG) * 8 + g), __ldg(m_lane[r] + (pair / PPG) * 8));
    }
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) {
      const int token = m0 + min(nt * 8 + g, tile_m - 1);
      const typename Act::Frag xf = Act::load(x_base + static_cast<int64_t>(token) * ldx + pair * 32 + t * 8);
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        if constexpr (ZP) Act::mma(acc[r][nt], a[r], xf);
        else Act::mma(gacc[r][nt], a[r], xf);
      }
    }
    if constexpr (!ZP) {
#pragma unroll
      for (int r = 0; r < RPW; ++r) flush(r, __ldg(s_block[r] + (pair / PPG) * 8 + g), pair / PPG);
    }
  }

  if constexpr (SWIGLU) tiled_swiglu_epilogue<Act, Tile>(acc, p, m_tile, row_tile, warp, t, g);
  else tiled_epilogue<Act, THREADS, Tile::kRows>(acc, p, (row_tile * Tile::WARPS + warp) * RPW, m_tile, row_tile, split, t, g);
}

}  // namespace qspec::cuda::kernels
