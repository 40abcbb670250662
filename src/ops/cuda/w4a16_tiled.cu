#include <algorithm>
#include <string>
#include <type_traits>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/kernels/w4a16_tiled.cuh"
#include "ops/cuda/kernels/w4a16_wgmma.cuh"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {
namespace {

// The tiles (W4A16TiledConfig::tile), as <MT, RPW, WARPS, CH, STAGES, MIN_BLOCKS>: every one
// stages 2 chunks (128 k) a slot. 256x64 and 256x32 share each x slab among 8 warps (half the
// L2 traffic for x of a 128-row tile); 128x64 runs 2 blocks a multiprocessor instead;
// 128x128 halves the weight re-reads from L2 at large M but reads x from shared memory once
// per row block (RPW 1), twice as much per mma as the others.
using Tile256x64 = kernels::W4A16TileShape<8, 2, 8, 2, 4, 1>;
using Tile128x64 = kernels::W4A16TileShape<8, 2, 4, 2, 4, 2>;
using Tile256x32 = kernels::W4A16TileShape<4, 2, 8, 2, 6, 1>;
using Tile128x128 = kernels::W4A16TileShape<16, 1, 8, 2, 3, 1>;
// 128x32: 256x32's warp tile in blocks of 4 warps, two a multiprocessor (97.5 KB of shared
// memory each), so Llama-3-8B's gate_up (224 row tiles) fills every multiprocessor where 256x32's
// 112 blocks of one a multiprocessor left 20 idle: 5-8 % faster on every layer GEMM at 17-32
// tokens on the H100 (docs/perf-journal/perf-notes-journal-2026.md, "A 128x32 tile").
using Tile128x32 = kernels::W4A16TileShape<4, 2, 4, 2, 6, 2>;
// 128x64 and 128x32 with 8 warps of one row block each (RPW 1): twice the warps a multiprocessor
// (128 and 120 registers), each x fragment read for one row block instead of two. The same
// arithmetic a row block and token, so the same bits. Taken for plain f16 launches of at most
// 32 tokens whose split covers at most kWarps8MaxSplitK of k (plain_launch_kernel). On the H100 the
// split-K GEMMs with 512-1792 k a split (qkv, o, most down projections at 17-32 tokens) ran
// 0.2-2.9 µs faster each alone; Llama-2-7B's qkv (2048 k a split) ran 0.7 µs slower alone but its
// steps at batch 17-32 were 0.6-1.9 % shorter with it than without; the long splits (one-split
// gate_up) ran 3-12 µs slower; at 48-64 tokens the steps gained at most 1 % and Qwen2.5-7B's lost
// 1.6 % at 64 (docs/perf-journal/perf-notes-journal-2026.md, "Eight warps a block for the short split-K GEMMs").
// QSPEC_W4A16_WARPS8=0 never takes them (A/B runs).
using Tile128x64w8 = kernels::W4A16TileShape<8, 1, 8, 2, 4, 2>;
using Tile128x32w8 = kernels::W4A16TileShape<4, 1, 8, 2, 6, 2>;
constexpr int64_t kWarps8MaxSplitK = 2048;
constexpr int64_t kWarps8MaxTokens = 32;
bool warps8_allowed() {
  static const bool on = env_int("QSPEC_W4A16_WARPS8", 1, 0, 1) == 1;
  return on;
}

struct TiledKernel {
  int rows, tokens;   // the tile
  int threads;        // a block
  int blocks_per_sm;  // resident blocks a multiprocessor holds (occupancy calculator)
  void (*launch)(const kernels::W4A16TiledParams&, dim3, cudaStream_t);
  bool split_k = true;  // false: runs unsplit only (W4A16WgmmaShape::kSplitK)
};

// One kernel of the tiled path: the mma.sync KERNEL on ROWS x TOKENS tiles, THREADS a block, SMEM
// bytes of dynamic shared memory.
template <auto KERNEL, int THREADS, int SMEM, int ROWS, int TOKENS>
struct TileLauncher {
  // Once per process: opt in to the shared memory, then ask how many blocks fit.
  static int configure() {
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    int blocks = 0;
    QSPEC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, KERNEL, THREADS, SMEM));
    return std::max(blocks, 1);
  }
  static void launch(const kernels::W4A16TiledParams& params, dim3 grid, cudaStream_t stream) {
    launch_pdl(KERNEL, grid, dim3(THREADS), SMEM, stream, params);
    QSPEC_CUDA_CHECK_LAUNCH("w4_tiled_kernel");
  }
  static TiledKernel get() {
    static const int blocks_per_sm = configure();
    return {ROWS, TOKENS, THREADS, blocks_per_sm, &launch};
  }
};

// Tiles 1-4 and 6: the mma.sync kernel (kernels/w4a16_tiled.cuh); SWIGLU: its SwiGLU epilogue.
template <class Act, class Tile, int G, bool SWIGLU = false, bool LATE = kernels::kTiledLateRefill<Act, Tile, SWIGLU>>
using TiledLauncher = TileLauncher<kernels::w4_tiled_kernel<Act, Tile, G, SWIGLU, LATE>, Tile::kThreads,
                                   Tile::template smem_bytes<G, kernels::kActGroupWords<Act>>(), Tile::kRows,
                                   Tile::kTokens>;
// QSPEC_W4A16_LATE_REFILL=0: every tile refills its ring first in a stage, as before the late
// refill (A/B runs; the default takes kernels::kTiledLateRefill's choice a tile).
bool late_refill() {
  static const bool on = env_int("QSPEC_W4A16_LATE_REFILL", 1, 0, 1) == 1;
  return on;
}

// Tiles 5, 7 and 8: the wgmma kernel (kernels/w4a16_wgmma.cuh) at 64, 32 and 128 tokens, f16
// activation values only. Its x arrives by TMA: each launch encodes x's tensor map (a kernel
// parameter, so a captured graph keeps it).
// (token tiles of 8, ring stages, blocks a multiprocessor, pairs a wgmma batch): two blocks a
// multiprocessor at 32 tokens, for twice the mma warps to hide the dequantization's latency (at
// 64 tokens two blocks' 80 registers a thread made ptxas serialise the wgmma, C7512).
using WgmmaShape64 = kernels::W4A16WgmmaShape<8, 6, 1, 2>;
using WgmmaShape32 = kernels::W4A16WgmmaShape<4, 6, 2, 2>;
using WgmmaShape128 = kernels::W4A16WgmmaShape<16, 4, 1, 2>;
// 256 rows: four mma warpgroups (kernels/w4a16_wgmma.cuh says why), one block a multiprocessor.
using WgmmaShape256x32 = kernels::W4A16WgmmaShape<4, 8, 1, 2, 16>;
using WgmmaShape256x64 = kernels::W4A16WgmmaShape<8, 6, 1, 2, 16>;
// 256 tokens (prefill): 128 f32 accumulators a thread, which with two batches of A fragments
// exceed the 168 registers 384 threads leave, so the producer warpgroup gives its registers to the
// mma warpgroups (224 a thread; no split-K then, kernels/w4a16_wgmma.cuh); three 74 KB stages (x
// is 64 KB of a stage). The dequantization a weight costs the same at any width, here under four
// times the tensor time it had at 64 tokens.
using WgmmaShape128x256 = kernels::W4A16WgmmaShape<32, 3, 1, 2, 8, 224>;
// ZP: the zero-point instance (int4-asym weights, kernels::zero_point_mins); ZC: the integer
// zero-point one (int4-zp, its zero words there).
template <class Shape, int G, bool ZP = false, bool ZC = false, bool PX = false>
struct WgmmaLauncher {
  static constexpr auto kKernel = kernels::w4a16_wgmma_kernel<Shape, G, ZP, ZC, PX>;
  static int configure() {
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
    int blocks = 0;
    QSPEC_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, Shape::kThreads, Shape::kSmemBytes));
    return std::max(blocks, 1);
  }
  static void launch(const kernels::W4A16TiledParams& params, dim3 grid, cudaStream_t stream) {
    constexpr const char* who = "cuda::w4a16_gemm_tiled (wgmma)";
    const kernels::W4A16Layout& w = params.w;
    kernels::W4A16WgmmaMaps maps;
    maps.x = detail::f16_box_map(params.a.x, params.m, w.k, params.a.ldx * 2, 64, Shape::kTokens, who);
    // Codes: [row blocks][k / 16 rows][128 bytes], a box = a stage (8 rows) of the tile's row blocks.
    const uint64_t code_dims[3] = {128, static_cast<uint64_t>(w.k / 16), static_cast<uint64_t>(w.row_blocks)};
    const uint64_t code_strides[2] = {128, static_cast<uint64_t>(w.k) * 8};
    const uint32_t code_box[3] = {128, Shape::kCodeBytes / 128, Shape::kRowBlocks};
    maps.codes = detail::tiled_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, w.codes, code_dims, code_strides, code_box,
                                          CU_TENSOR_MAP_SWIZZLE_NONE, who);
    // Scales: [row blocks][groups][8 words], a box = a stage's groups of the tile's row blocks.
    const uint64_t scale_dims[3] = {8, static_cast<uint64_t>(w.groups), static_cast<uint64_t>(w.row_blocks)};
    const uint64_t scale_strides[2] = {32, static_cast<uint64_t>(w.groups) * 32};
    const uint32_t scale_box[3] = {8, static_cast<uint32_t>(Shape::kPairs / (G / 32)), Shape::kRowBlocks};
    maps.scales = detail::tiled_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, w.scales, scale_dims, scale_strides,
                                           scale_box, CU_TENSOR_MAP_SWIZZLE_NONE, who);
    launch_pdl(kKernel, grid, dim3(Shape::kThreads), Shape::kSmemBytes, stream, maps, params);
    QSPEC_CUDA_CHECK_LAUNCH("w4a16_wgmma_kernel");
  }
  static TiledKernel get() {
    static const int blocks_per_sm = configure();
    return {Shape::kRows, Shape::kTokens, Shape::kThreads, blocks_per_sm, &launch, Shape::kSplitK};
  }
};
template <class Shape, bool ZP = false, bool ZC = false, bool PX = false>
TiledKernel wgmma_kernel_for_group(int64_t group) {
  switch (group) {
    case 32: return WgmmaLauncher<Shape, 32, ZP, ZC, PX>::get();
    case 64: return WgmmaLauncher<Shape, 64, ZP, ZC, PX>::get();
    default: return WgmmaLauncher<Shape, 128, ZP, ZC, PX>::get();
  }
}

// The kernel of a wgmma tile (w4a16_is_wgmma_tile) with these instance flags: ZP / ZC the
// zero-point ones (int4-asym / int4-zp), PX x given in the packed k order (int4,
// W4A16TiledConfig::x_packed).
template <bool ZP = false, bool ZC = false, bool PX = false>
TiledKernel wgmma_kernel(int tile, int64_t group) {
  switch (tile) {
    case kW4A16WgmmaTile32: return wgmma_kernel_for_group<WgmmaShape32, ZP, ZC, PX>(group);
    case kW4A16WgmmaTile: return wgmma_kernel_for_group<WgmmaShape64, ZP, ZC, PX>(group);
    case kW4A16WgmmaTile256x32: return wgmma_kernel_for_group<WgmmaShape256x32, ZP, ZC, PX>(group);
    case kW4A16WgmmaTile256x64: return wgmma_kernel_for_group<WgmmaShape256x64, ZP, ZC, PX>(group);
    case kW4A16WgmmaTile128x256: return wgmma_kernel_for_group<WgmmaShape128x256, ZP, ZC, PX>(group);
    default: return wgmma_kernel_for_group<WgmmaShape128, ZP, ZC, PX>(group);
  }
}

// Whether this GPU runs the wgmma tiles' sm_90a code (an H100 / H200 and a build with sm_90a).
bool wgmma_tile_runs_here() {
  static const bool runs = detail::sm90a_build_runs(kernels::w4a16_wgmma_kernel<WgmmaShape64, 128>);
  return runs;
}

template <class Act>
constexpr bool kF16Values = sizeof(typename Act::Elem) == 2;
// Plain f16 activations, on int4, int4-asym or int4-zp (zero point) weights: the policies with wgmma
// tiles, a SwiGLU epilogue and the 8-warp forms.
template <class Act>
constexpr bool kPlainF16 = std::is_same_v<Act, kernels::ActF16> || kernels::kActGroupWords<Act>;

template <class Act, class Tile, bool SWIGLU, bool LATE>
TiledKernel tiled_kernel_for_refill(int64_t group) {
  switch (group) {
    case 32: return TiledLauncher<Act, Tile, 32, SWIGLU, LATE>::get();
    case 64: return TiledLauncher<Act, Tile, 64, SWIGLU, LATE>::get();
    default: return TiledLauncher<Act, Tile, 128, SWIGLU, LATE>::get();
  }
}

template <class Act, class Tile, bool SWIGLU>
TiledKernel tiled_kernel_for_group(int64_t group) {
  constexpr bool late = kernels::kTiledLateRefill<Act, Tile, SWIGLU>;
  return late && !late_refill() ? tiled_kernel_for_refill<Act, Tile, SWIGLU, false>(group)
                                : tiled_kernel_for_refill<Act, Tile, SWIGLU, late>(group);
}

// SWIGLU (f16 activations only): the mma.sync tiles with the SwiGLU epilogue; the wgmma tile has none.
// Zero points (ActF16Zp, ActF16Zc): the wgmma tiles, 128x64 and 128x32 only (zero_point_tile picks among them).
template <class Act, bool SWIGLU = false>
TiledKernel tiled_kernel(int tile, int64_t group) {
  static_assert(!SWIGLU || kPlainF16<Act>, "the SwiGLU epilogue takes f16 activations");
  if constexpr (std::is_same_v<Act, kernels::ActF16> && !SWIGLU) {
    if (w4a16_is_wgmma_tile(tile)) return wgmma_kernel(tile, group);
  }
  if constexpr (kernels::kActGroupWords<Act>) {
    // The wgmma tiles' zero-point instances (int4-asym, or int4-zp's with ZC; beside the mma.sync
    // tiles 128x64 and 128x32, zero_point_tile).
    constexpr bool ZC = kernels::kActZeroCodes<Act>;
    if (!SWIGLU && w4a16_is_wgmma_tile(tile)) return wgmma_kernel<!ZC, ZC>(tile, group);
    if (tile == 2) return tiled_kernel_for_group<Act, Tile128x64, SWIGLU>(group);
    if (tile == kW4A16Tile128x32) return tiled_kernel_for_group<Act, Tile128x32, SWIGLU>(group);
    fail("cuda::w4a16_gemm_tiled: int4-asym / int4-zp weights (zero points) run on the tiles 128x64 (2), 128x32 (",
         kW4A16Tile128x32, ") and the wgmma tiles (5, 7 - 11)", SWIGLU ? " (with SwiGLU: 2 and 6 only)" : "",
         ", not tile ", tile);
  } else {
    switch (tile) {
      case 1: return tiled_kernel_for_group<Act, Tile256x64, SWIGLU>(group);
      case 2: return tiled_kernel_for_group<Act, Tile128x64, SWIGLU>(group);
      case 3: return tiled_kernel_for_group<Act, Tile256x32, SWIGLU>(group);
      case kW4A16Tile128x32: return tiled_kernel_for_group<Act, Tile128x32, SWIGLU>(group);
      default:
        if constexpr (SWIGLU) fail("cuda::w4a16_gemm_tiled_swiglu: tile ", tile, " has no SwiGLU epilogue");
        else return tiled_kernel_for_group<Act, Tile128x128, false>(group);
    }
  }
}

// The tile `tile = 0` takes for m tokens, n weight rows and depth k.
// * 128x32 (two blocks a multiprocessor) at 17-32 tokens, 5-8 % faster than 256x32 on every
//   Llama-3-8B GEMM on the H100; and at 41-64 where its blocks fit one wave without split-K (o,
//   qkv and down of Llama-3-8B, not gate_up). There its time is flat in m (two token tiles) while
//   the 64-token tiles' grows (docs/perf-journal/perf-notes-journal-2026.md, "A 128x32 tile"). And, for f16 activation
//   values, at 65-96 tokens (three token tiles) where k <= 4096: every qkv, o and gate_up of
//   Llama-3-8B and Qwen2.5-7B 2-28 % faster there than 128x64; not the long-k down projections,
//   not 97-128 tokens (gate_up 9-11 % slower), not int8 (Llama-3-8B's gate_up 3 % slower)
//   (perf-notes "128x32 at 65-96 tokens").
// * Elsewhere beyond 32 tokens the 64-token tile: 128x64 where two of its blocks fit a
//   multiprocessor (every H100 tuning record, five activation kinds, Llama-3-8B and Qwen2.5-7B
//   shapes, 33-4096 tokens: 2-9 % faster than 256x64 on average, at most 5 % slower at a point;
//   Qwen2.5-7B's gate_up 21 % faster, its 148 row tiles of 256 leaving a second wave of 16
//   blocks), 256x64 where they do not; 256x32 up to 32 tokens where 128x32's two blocks do not fit.
// * Plain f16 activations past kWgmmaMinTokens on sm_90a: the wgmma kernel's 128 x 128 tile
//   (kernels/w4a16_wgmma.cuh), faster than every mma.sync tile on every Llama-3-8B layer GEMM
//   at 96, 128 and 256 tokens on the H200 (at 96: gate_up 71 vs 93 us, down 36 vs 53, qkv 24 vs
//   32, o 16 vs 21; bench/results/gpu-w4a16-wgmma-gemm-llama3-8b-h200-76b2e57.log), slower at
//   16-64 (its stage costs ~1 us whatever the tokens: issue 53 is open). The mma.sync tiles' time
//   steps with their token tiles of 32 and 64, so 65 tokens cost them what 96 do.
//   QSPEC_W4A16_WGMMA=0 never takes the wgmma tiles, =1 takes them from 17 tokens (by m: 32, 64
//   or 128 tokens a tile), unset: the rule above.
// * Int4 weights and f16 activations of 33-64 tokens on sm_90a whose 256-row tiles make one wave
//   that fills at least kWgmma256MinWave of the multiprocessors: the wgmma kernel's 256 x 64 tile.
//   Llama-3-8B's gate_up (112 tiles on 132) at 48 / 64 tokens took 40.7 / 41.4 us against 48.5 /
//   48.6 for the best other tile (wgmma 128 x 64) and 54.5 / 53.7 for 128x64, and lost at 32 (40.5
//   against 128x32's 32.7); every GEMM of fewer tiles lost with it (qkv, o, down: 16-24 tiles)
//   (H200, 427cd95, bench/results/gpu-w4a16-wgmma-256-gemm-llama3-8b-h200-427cd95.log). It has no
//   SwiGLU epilogue, so gate_up takes it and a separate silu_mul. QSPEC_W4A16_WGMMA_256=0 never.
// * Int4 weights and f16 activations of 17-64 tokens on sm_90a otherwise: the wgmma kernel's
//   128 x 32 (17-32 tokens) and 128 x 64 (33-64) tiles, since x comes in the packed k order
//   (w4a16_gemm_reads_packed_x, the norms and silu_mul write it so). Llama-3-8B on the H200
//   (7bf1dc2, bench/results/gpu-w4a16-wgmma-17-64-tokens-gemm-llama3-8b-h200-7bf1dc2.log), wgmma
//   with packed x against the mma.sync 128x32 tile these took before, at 17-32 / 40-64 tokens:
//   gate_up 27.8-28.0 vs 32.2-32.5 us (it loses 128x32's SwiGLU epilogue, a silu_mul of ~2 us
//   comes back), down 17.9-19.2 vs 20.3-20.9 / 21.9-22.7 vs 30.4-32.2, qkv 10.9-11.8 vs 11.6-12.1 /
//   14.0-15.0 vs 19.5-21.6; o (x from the attention, not packed) 9.1-10.5 vs 9.1-9.8 / 11.2-11.9
//   vs 13.9-14.2. The decode step (one call, bench/results/gpu-decode-wgmma-17-64-ab-h200-7bf1dc2.log)
//   at batch 24 / 32 / 48 / 64: Llama-3-8B 3.42 / 3.59 / 4.81 / 5.07 -> 3.32 / 3.52 / 4.21 / 4.50
//   ms, Qwen2.5-7B 3.41 / 3.54 / 5.23 / 5.33 -> 3.18 / 3.35 / 4.26 / 4.35; the gamma-3 verify at
//   batch 16 (64 tokens) 4.59 -> 4.08 and 4.92 -> 4.03. QSPEC_W4A16_WGMMA_17_64=0 keeps the mma.sync
//   tiles there (A/B runs). The zero-point formats keep them (their wgmma instances read x in
//   natural order: unmeasured here).
// QSPEC_W4A16_NARROW=0 leaves 128x32 out and QSPEC_W4A16_TILE_64=1 takes 256x64 as the 64-token
// tile (A/B runs).
constexpr int64_t kWgmmaMinTokens = 64;
// From kWgmmaPrefillTileFrom tokens the 128 x 256 wgmma tile where its blocks (one a
// multiprocessor, no split-K) fill at least kWgmmaPrefillMinWave of a wave, else 128 x 128: x is
// 8x the weights' bytes a k, so twice the tokens a tile halve each block's share of x's loads, and
// each weight's dequantization serves twice the tokens. Llama-3-8B on the H200 (ebd3e06,
// bench/results/gpu-w4a16-prefill-gemm-llama3-8b-h200-ebd3e06.log and ...-points-...-6a10c69.log),
// 128 x 256 against 128 x 128: gate_up at 160 / 192 tokens 99 / 98 vs 127 / 132 us, at 256 (224
// blocks) 107-113 vs 117 (128 x 128 timed alone; 149-160 beside the bench's cuBLAS baselines), at
// 512 211 vs 266; qkv at 384 / 512 (96 blocks, 0.73 of a wave) 43 / 51 vs 57 / 66; but o at 384 /
// 512 (64 blocks) 43 vs 29, down at 256 / 512 (32 / 64 blocks) 149-165 / 173 vs 55 / 118, and
// every shape at 128 tokens (one token tile of 128 against half of one of 256).
constexpr int64_t kWgmmaPrefillTileFrom = 129;
constexpr double kWgmmaPrefillMinWave = 0.7;
bool wgmma_prefill_tile_fills_wave(int64_t m, int64_t n) {
  const int64_t blocks = ceil_div(m, int64_t{256}) * ceil_div(n, int64_t{128});
  return static_cast<double>(blocks) >= kWgmmaPrefillMinWave * static_cast<double>(multiprocessor_count());
}
constexpr double kWgmma256MinWave = 0.75;
bool wgmma_256_fills_one_wave(int64_t n) {
  const int64_t tiles = ceil_div(n, int64_t{256}), sms = multiprocessor_count();
  return tiles <= sms && static_cast<double>(tiles) >= kWgmma256MinWave * static_cast<double>(sms);
}
template <class Act>
int default_tile(int64_t m, int64_t n, int64_t k, int64_t group) {
  // A/B switches, 0 or 1 (env_int refuses anything else by name).
  static const int wgmma_switch = env_int("QSPEC_W4A16_WGMMA", 2, 0, 2);
  static const bool narrow_allowed = env_int("QSPEC_W4A16_NARROW", 1, 0, 1) == 1;
  static const bool wide_256 = env_int("QSPEC_W4A16_TILE_64", 0, 0, 1) == 1;
  static const bool wgmma_256 = env_int("QSPEC_W4A16_WGMMA_256", 1, 0, 1) == 1;
  static const bool wgmma_17_64 = env_int("QSPEC_W4A16_WGMMA_17_64", 1, 0, 1) == 1;
  if (kPlainF16<Act> && wgmma_switch != 0 && wgmma_tile_runs_here()) {
    if (wgmma_switch == 1 && m >= w4a16_wgmma_min_tokens()) return m <= 32 ? kW4A16WgmmaTile32 : m <= 64 ? kW4A16WgmmaTile : kW4A16WgmmaTile128;
    if (m >= kWgmmaPrefillTileFrom && w4a16_prefill_takes_wgmma() && wgmma_prefill_tile_fills_wave(m, n))
      return kW4A16WgmmaTile128x256;
    if (m > kWgmmaMinTokens) return kW4A16WgmmaTile128;
    if (std::is_same_v<Act, kernels::ActF16> && wgmma_256 && m > 32 && wgmma_256_fills_one_wave(n))
      return kW4A16WgmmaTile256x64;
    if (std::is_same_v<Act, kernels::ActF16> && wgmma_17_64 && m >= w4a16_wgmma_min_tokens())
      return m <= 32 ? kW4A16WgmmaTile32 : kW4A16WgmmaTile;
  }
  const int wide = !wide_256 && tiled_kernel<Act>(2, group).blocks_per_sm >= 2 ? 2 : 1;
  const TiledKernel narrow = tiled_kernel<Act>(kW4A16Tile128x32, group);
  const bool narrow_fits = narrow_allowed && narrow.blocks_per_sm >= 2;
  if (m > 64) return kF16Values<Act> && narrow_fits && m <= 96 && k <= 4096 ? kW4A16Tile128x32 : wide;
  if (m <= 32) return narrow_fits ? kW4A16Tile128x32 : 3;
  if (m <= 40) return wide;
  const int64_t blocks = ceil_div(n, narrow.rows) * ceil_div(m, narrow.tokens);
  return narrow_fits && blocks <= static_cast<int64_t>(narrow.blocks_per_sm) * multiprocessor_count() ? kW4A16Tile128x32
                                                                                                      : wide;
}

// The zero-point weights' tile rule and its A/B switch (defined with their launch below).
bool zero_points_take_int4_wgmma_rule();
int zero_point_tile(int64_t m, const W4A16Weights& w, int config_tile);

}  // namespace

bool w4a16_wgmma_tile_runs_here() { return wgmma_tile_runs_here(); }

bool w4a16_gemm_reads_packed_x(int64_t m, const W4A16Weights& w) {
  if (m < 1 || w.k % 32 != 0 || w4a16_choose_path(m, w) != W4A16Path::tiled) return false;
  if (w.has_min()) return zero_points_take_int4_wgmma_rule() && w4a16_is_wgmma_tile(zero_point_tile(m, w, 0));
  return w4a16_is_wgmma_tile(default_tile<kernels::ActF16>(m, w.n, w.k, w.group));
}

std::string w4a16_tiled_tile_name(int tile) {
  switch (tile) {
    case 1: return "256x64";
    case 2: return "128x64";
    case 3: return "256x32";
    case 4: return "128x128";
    case kW4A16WgmmaTile: return "wgmma_128x64";
    case kW4A16WgmmaTile32: return "wgmma_128x32";
    case kW4A16WgmmaTile128: return "wgmma_128x128";
    case kW4A16WgmmaTile256x32: return "wgmma_256x32";
    case kW4A16WgmmaTile256x64: return "wgmma_256x64";
    case kW4A16WgmmaTile128x256: return "wgmma_128x256";
    case kW4A16Tile128x32: return "128x32";
    default: return "auto";
  }
}

namespace {

// A tiled launch: the tile, its kernel, the grid and the split-K partitions.
struct TiledPlan {
  int tile;
  TiledKernel kernel;
  int64_t m_tiles, row_tiles, splits;
};

// Every entry point checks its config once, before its m == 0 return; plan_tiled trusts it.
void check_tiled_config(const W4A16TiledConfig& config) {
  QSPEC_CHECK(config.tile >= 0 && config.tile <= kW4A16TiledTiles && config.splits >= 0,
              "cuda::w4a16_gemm_tiled: unknown tile ", config.tile, " or splits ", config.splits);
}

// The plan of a launch of m tokens (m >= 1) for any activation policy: the tile (config's, or
// default_tile), and split-K only while the tiles leave multiprocessors idle.
template <class Act>
TiledPlan plan_tiled(int64_t m, const W4A16Weights& w, const kernels::W4A16Layout& layout, const void* workspace,
                     size_t workspace_bytes, const W4A16TiledConfig& config) {
  const int tile = config.tile != 0 ? config.tile : default_tile<Act>(m, w.n, w.k, w.group);
  QSPEC_CHECK(!w4a16_is_wgmma_tile(tile) || (kPlainF16<Act> && wgmma_tile_runs_here()),
              "cuda::w4a16_gemm_tiled: the wgmma tiles (5, 7 - 11) need f16 activation values and an sm_90a GPU and "
              "build");
  const TiledKernel kernel = tiled_kernel<Act>(tile, w.group);
  const int64_t m_tiles = ceil_div(m, kernel.tokens), row_tiles = ceil_div(w.n, kernel.rows);
  QSPEC_CHECK(row_tiles <= 65535, "cuda::w4a16_gemm_tiled: n ", w.n, " too large");
  const int64_t blocks = m_tiles * row_tiles;
  // Split-K: at most one wave of blocks, within the partials bound, one chunk a split, the
  // counters and the workspace.
  const int64_t capacity = static_cast<int64_t>(kernel.blocks_per_sm) * multiprocessor_count();
  int64_t splits = config.splits > 0 ? config.splits
                                     : std::min<int64_t>(std::max<int64_t>(1, capacity / blocks),
                                                         detail::w4a16_tiled_max_splits(m, w.k));
  // Splits cut k at scale-group boundaries (the kernel flushes groups at static points).
  const int64_t group_units = layout.full_chunks / std::max<int64_t>(1, w.group / 64);
  splits = std::clamp<int64_t>(splits, 1, std::min<int64_t>(65535, std::max<int64_t>(1, group_units)));
  QSPEC_CHECK(kernel.split_k || config.splits <= 1, "cuda::w4a16_gemm_tiled: tile ", tile, " runs unsplit (splits ",
              config.splits, ")");
  if (blocks * 4 > static_cast<int64_t>(detail::kW4A16CounterBytes) || !kernel.split_k) splits = 1;
  splits = detail::splits_that_fit(splits, m, w.n, workspace, workspace_bytes);
  return {tile, kernel, m_tiles, row_tiles, splits};
}

// The kernel a plain launch (no SwiGLU epilogue) of the plan runs: the 8-warp form of 128x64 /
// 128x32 for short splits of f16 activations, else the plan's. The same tile, so the same grid
// and splits; the SwiGLU launches keep their (gate, up) pairs a warp and never take it.
template <class Act>
TiledKernel plain_launch_kernel(const TiledPlan& plan, int64_t m, const W4A16Weights& w) {
  if constexpr (kPlainF16<Act>) {
    if ((plan.tile == 2 || plan.tile == kW4A16Tile128x32) && warps8_allowed() && m <= kWarps8MaxTokens &&
        ceil_div(w.k, plan.splits) <= kWarps8MaxSplitK) {
      const TiledKernel warps8 = plan.tile == 2 ? tiled_kernel_for_group<Act, Tile128x64w8, false>(w.group)
                                                : tiled_kernel_for_group<Act, Tile128x32w8, false>(w.group);
      if (warps8.blocks_per_sm >= plan.kernel.blocks_per_sm) return warps8;
    }
  }
  return plan.kernel;
}

// The kernels' view of w (with its zero points where asked), once its scales are checked to be
// 16-byte aligned (cp.async); `op` names the entry point in the error.
kernels::W4A16Layout checked_layout(const W4A16Weights& w, bool zero_points = false,
                                    const char* op = "cuda::w4a16_gemm_tiled") {
  QSPEC_CHECK(reinterpret_cast<uintptr_t>(w.scales) % 16 == 0, op, ": the scales must be 16-byte aligned (cp.async)");
  return detail::w4a16_layout(w, zero_points);
}

void fill_launch(kernels::W4A16TiledParams& params, const kernels::W4A16Layout& layout, int64_t m, f16_bits* y,
                 int64_t ldy, int64_t m_tiles, int64_t splits, void* workspace) {
  params.w = layout;
  params.y = reinterpret_cast<__half*>(y);
  params.ldy = ldy;
  params.m = static_cast<int>(m);
  params.m_tiles = static_cast<int>(m_tiles);
  params.splits = static_cast<int>(splits);
  params.counters = static_cast<unsigned*>(workspace);
  params.partials = detail::splitk_partials(workspace, splits);
}

// Plans and launches the tiled kernel for any activation policy; params.a set by the caller.
template <class Act>
void launch_tiled(kernels::W4A16TiledParams params, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                  void* workspace, size_t workspace_bytes, void* stream, const W4A16TiledConfig& config) {
  const kernels::W4A16Layout layout = checked_layout(w);
  check_tiled_config(config);
  if (m == 0) return;
  const TiledPlan plan = plan_tiled<Act>(m, w, layout, workspace, workspace_bytes, config);
  QSPEC_CHECK(!config.x_packed || w4a16_is_wgmma_tile(plan.tile),
              "cuda::w4a16_gemm_tiled: x in the packed k order (x_packed) runs on the wgmma tiles only, not tile ",
              plan.tile);
  fill_launch(params, layout, m, y, ldy, plan.m_tiles, plan.splits, workspace);
  const dim3 grid(static_cast<unsigned>(plan.m_tiles), static_cast<unsigned>(plan.row_tiles),
                  static_cast<unsigned>(plan.splits));
  const TiledKernel kernel =
      config.x_packed ? wgmma_kernel<false, false, true>(plan.tile, w.group) : plain_launch_kernel<Act>(plan, m, w);
  kernel.launch(params, grid, as_stream(stream));
}

// The tile of an int4-asym launch: config's, or the int4 rule's (default_tile), where that is one
// with a zero-point instance (128x64, 128x32, the wgmma tiles), else the wgmma tile by m (32, 64
// or 128 tokens a tile). So on the H200 17-64 tokens take the mma.sync tiles as int4 does.
// The mma.sync tiles only for groups of 32 and 64: their fold replaces int4's group flush of every
// pair or two, where at groups of 128 it costs more than the flush it saves. Measured (H200,
// synthetic Llama-3-8B, steps against int4's of the same group in one call, fb62428): mma.sync
// tiles +2.5 / +3.0 % at batch 32 / 64 (g32), +3.2 / +3.2 % (g64), +17 / +10 % (g128); the wgmma
// tiles +13 / +4.4 % (g32), +11 / +7 % (g64), +10.5 / +2.9 % (g128)
// (bench/results/gpu-decode-int4-asym-ab-llama3-8b-h200-fb62428.log).
//
// int4-zp (zero codes): the mma.sync tiles at every group, since their loop and flushes are int4's.
// Since int4 took the wgmma tiles with x in the packed order at 17-64 tokens (559ae39), its step
// there is faster than these: int4-zp g128 over int4 +8 % at batch 32, +30 % at 64 (H200,
// 2e11548, bench/results/gpu-w4a8-zero-point-correction-llama3-8b-h200.log, its w4a16 rows).
// So zero-point weights take the wgmma tiles' zero-point instances there, as int4's rule does, and
// read x in the packed k order wherever their tile is a wgmma one (17-256 tokens,
// w4a16_gemm_reads_packed_x; the instances with ZP / ZC and PX): int4-zp g128 steps at batch
// 16 / 32 / 64 -0.1 / -2.2 / -17.5 % (3.62 / 4.61 ms at 32 / 64, int4's 3.41 / 4.32: +6 / +7 %
// over int4, from +8 / +30 %; H200, 34434ef, two alternating rounds within 0.6 %,
// bench/results/gpu-w4a16-zp-wgmma-ab-llama3-8b-h200-34434ef.log). QSPEC_W4A16_ZP_WGMMA_17_64=0
// keeps the mma.sync tiles there (the A/B switch).
bool zero_points_take_int4_wgmma_rule() {
  static const bool on = env_int("QSPEC_W4A16_ZP_WGMMA_17_64", 1, 0, 1) == 1;
  return on;
}
int zero_point_tile(int64_t m, const W4A16Weights& w, int config_tile) {
  QSPEC_CHECK(config_tile == 0 || w4a16_tile_has_zero_points(config_tile),
              "cuda::w4a16_gemm_tiled: int4-asym / int4-zp weights (zero points) run on the tiles 128x64 (2), 128x32 (",
              kW4A16Tile128x32, ") and the wgmma tiles (5, 7 - 11), not tile ", config_tile);
  if (config_tile != 0) return config_tile;
  if (zero_points_take_int4_wgmma_rule() && wgmma_tile_runs_here() && m >= w4a16_wgmma_min_tokens() && m <= 64) {
    if (m > 32 && wgmma_256_fills_one_wave(w.n)) return kW4A16WgmmaTile256x64;
    return m <= 32 ? kW4A16WgmmaTile32 : kW4A16WgmmaTile;
  }
  const bool mma_sync = w.zero_codes || w.group <= 64;
  const int tile = w.zero_codes ? default_tile<kernels::ActF16Zc>(m, w.n, w.k, w.group)
                                : default_tile<kernels::ActF16Zp>(m, w.n, w.k, w.group);
  if (mma_sync && (tile == 2 || tile == kW4A16Tile128x32)) return tile;
  if (w4a16_is_wgmma_tile(tile)) return tile;
  return m <= 32 ? kW4A16WgmmaTile32 : m <= 64 ? kW4A16WgmmaTile : kW4A16WgmmaTile128;
}

// Calls fn(policy) with the zero-point policy of these weights: ActF16Zc for int4-zp (zero
// codes), ActF16Zp for int4-asym.
template <class Fn>
void with_zero_point_policy(const W4A16Weights& w, Fn&& fn) {
  if (w.zero_codes) fn(kernels::ActF16Zc{});
  else fn(kernels::ActF16Zp{});
}

// int4-asym / int4-zp weights on the tiled path (sm_90a): the zero-point instances, planned as int4's.
template <class Act>
void launch_tiled_zero_points(kernels::W4A16TiledParams params, int64_t m, const W4A16Weights& w, f16_bits* y,
                              int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                              const W4A16TiledConfig& config) {
  check_tiled_config(config);
  QSPEC_CHECK(w4a16_runs_zero_points(W4A16Path::tiled, m),
              "cuda::w4a16_gemm_tiled: int4-asym weights (zero points) run on the tiled path on an sm_90a GPU and "
              "build only; cuda::w4a16_gemm's automatic path routes them");
  const kernels::W4A16Layout layout = checked_layout(w, /*zero_points=*/true);
  if (m == 0) return;
  const TiledPlan plan = plan_tiled<Act>(m, w, layout, workspace, workspace_bytes,
                                         {zero_point_tile(m, w, config.tile), config.splits});
  QSPEC_CHECK(!config.x_packed || w4a16_is_wgmma_tile(plan.tile),
              "cuda::w4a16_gemm_tiled: x in the packed k order (x_packed) runs on the wgmma tiles only, not tile ",
              plan.tile);
  fill_launch(params, layout, m, y, ldy, plan.m_tiles, plan.splits, workspace);
  const dim3 grid(static_cast<unsigned>(plan.m_tiles), static_cast<unsigned>(plan.row_tiles),
                  static_cast<unsigned>(plan.splits));
  constexpr bool ZC = kernels::kActZeroCodes<Act>;
  const TiledKernel kernel = config.x_packed ? wgmma_kernel<!ZC, ZC, true>(plan.tile, w.group)
                                             : plain_launch_kernel<Act>(plan, m, w);
  kernel.launch(params, grid, as_stream(stream));
}

}  // namespace

void w4a16_gemm_tiled(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                      void* workspace, size_t workspace_bytes, void* stream, const W4A16TiledConfig& config) {
  QSPEC_CHECK(m >= 0 && m < (1ll << 31) && ldx >= w.k && ldx % 8 == 0 && ldy >= w.n &&
                  reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "cuda::w4a16_gemm_tiled: x must be 16-byte aligned with ldx >= k and ldx % 8 == 0, ldy >= n (m ", m,
              ", ldx ", ldx, ", ldy ", ldy, ")");
  kernels::W4A16TiledParams params{};
  params.a = kernels::ActivationRows{x, ldx, nullptr, 0, 0};
  if (w.has_min()) {
    with_zero_point_policy(w, [&](auto policy) {
      launch_tiled_zero_points<decltype(policy)>(params, m, w, y, ldy, workspace, workspace_bytes, stream, config);
    });
    return;
  }
  launch_tiled<kernels::ActF16>(params, m, w, y, ldy, workspace, workspace_bytes, stream, config);
}

int w4a16_tiled_warps(const W4A16Weights& w, int64_t m, const W4A16TiledConfig& config, const void* workspace,
                      size_t workspace_bytes) {
  check_tiled_config(config);
  QSPEC_CHECK(m >= 1, "cuda::w4a16_tiled_warps: m ", m, " < 1");
  const TiledPlan plan =
      plan_tiled<kernels::ActF16>(m, w, checked_layout(w), workspace, workspace_bytes, config);
  return plain_launch_kernel<kernels::ActF16>(plan, m, w).threads / 32;
}

namespace {

// The tiles with a SwiGLU epilogue: the mma.sync ones with (gate, up) row block pairs a warp (RPW 2).
bool swiglu_tile(int tile) { return tile == 1 || tile == 2 || tile == 3 || tile == kW4A16Tile128x32; }

}  // namespace

bool w4a16_tiled_swiglu_partition(const W4A16Weights& w, int64_t m, const W4A16TiledConfig& config,
                                   const void* workspace, size_t workspace_bytes) {
  check_tiled_config(config);
  if (m < 1 || w.n % 32 != 0 || reinterpret_cast<uintptr_t>(w.scales) % 16 != 0) return false;
  if (w.has_min()) {  // int4-asym: 128x64 and 128x32 have the SwiGLU epilogue's zero-point instances
    if (!w4a16_runs_zero_points(W4A16Path::tiled, m)) return false;
    if (config.tile != 0 && config.tile != 2 && config.tile != kW4A16Tile128x32) return false;
    const int tile = zero_point_tile(m, w, config.tile);
    if (tile != 2 && tile != kW4A16Tile128x32) return false;
    bool one_split = false;
    with_zero_point_policy(w, [&](auto policy) {
      one_split = plan_tiled<decltype(policy)>(m, w, detail::w4a16_layout(w, /*zero_points=*/true), workspace,
                                               workspace_bytes, {tile, config.splits})
                      .splits == 1;
    });
    return one_split;
  }
  const TiledPlan plan =
      plan_tiled<kernels::ActF16>(m, w, detail::w4a16_layout(w), workspace, workspace_bytes, config);
  return swiglu_tile(plan.tile) && plan.splits == 1;
}

void w4a16_gemm_tiled_swiglu(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* act,
                             int64_t ld_act, void* stream, const W4A16TiledConfig& config) {
  QSPEC_CHECK(m >= 0 && m < (1ll << 31) && ldx >= w.k && ldx % 8 == 0 && ld_act >= w.n / 2 &&
                  reinterpret_cast<uintptr_t>(x) % 16 == 0 && w.n % 32 == 0,
              "cuda::w4a16_gemm_tiled_swiglu: x must be 16-byte aligned with ldx >= k and ldx % 8 == 0, n % 32 == 0 "
              "and ld_act >= n / 2 (m ",
              m, ", ldx ", ldx, ", n ", w.n, ", ld_act ", ld_act, ")");
  check_tiled_config(config);
  QSPEC_CHECK(config.splits <= 1, "cuda::w4a16_gemm_tiled_swiglu: one split only (asked for ", config.splits, ")");
  QSPEC_CHECK(!config.x_packed, "cuda::w4a16_gemm_tiled_swiglu: x in the packed k order runs on the wgmma tiles, which "
                                "have no SwiGLU epilogue");
  const bool zero_points = w.has_min();
  QSPEC_CHECK(!zero_points || w4a16_runs_zero_points(W4A16Path::tiled, std::max<int64_t>(m, 1)),
              "cuda::w4a16_gemm_tiled_swiglu: int4-asym weights need an sm_90a GPU and build");
  const kernels::W4A16Layout layout = checked_layout(w, zero_points, "cuda::w4a16_gemm_tiled_swiglu");
  if (m == 0) return;
  TiledPlan plan{};
  if (zero_points)
    with_zero_point_policy(w, [&](auto policy) {
      plan = plan_tiled<decltype(policy)>(m, w, layout, nullptr, 0, {zero_point_tile(m, w, config.tile), 1});
    });
  else
    plan = plan_tiled<kernels::ActF16>(m, w, layout, nullptr, 0, W4A16TiledConfig{config.tile, 1});
  QSPEC_CHECK(swiglu_tile(plan.tile) && (!zero_points || plan.tile == 2 || plan.tile == kW4A16Tile128x32),
              "cuda::w4a16_gemm_tiled_swiglu: tile ", plan.tile,
              " has no SwiGLU epilogue (the wgmma tiles and 128x128, tile 4; with zero points only 2 and ",
              kW4A16Tile128x32, ")");
  const TiledKernel kernel = !zero_points ? tiled_kernel<kernels::ActF16, true>(plan.tile, w.group)
                            : w.zero_codes ? tiled_kernel<kernels::ActF16Zc, true>(plan.tile, w.group)
                                           : tiled_kernel<kernels::ActF16Zp, true>(plan.tile, w.group);
  kernels::W4A16TiledParams params{};
  params.a = kernels::ActivationRows{x, ldx, nullptr, 0, 0};
  fill_launch(params, layout, m, act, ld_act, plan.m_tiles, 1, nullptr);
  // A row tile is kernel.rows / 2 outputs: its gate rows and their up rows.
  const int64_t row_tiles = ceil_div(w.n / 2, kernel.rows / 2);
  kernel.launch(params, dim3(static_cast<unsigned>(plan.m_tiles), static_cast<unsigned>(row_tiles), 1u),
                as_stream(stream));
}

void w4_quantized_gemm_tiled(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                             int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                             const W4A16TiledConfig& config) {
  kernels::W4A16TiledParams params{};
  params.a = detail::activation_rows(x, m, w, "cuda::w4_quantized_gemm_tiled");
  QSPEC_CHECK(ldy >= w.n, "cuda::w4_quantized_gemm_tiled: ldy ", ldy, " < n ", w.n);
  kernels::with_activation_policy(x.format, x.e4m3, [&](auto policy) {
    launch_tiled<decltype(policy)>(params, m, w, y, ldy, workspace, workspace_bytes, stream, config);
  });
}

}  // namespace qspec::cuda
