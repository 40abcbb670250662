// 4-bit-weight GEMMs with f16 activations (W4A16) on the GPU: the packed weights and their kernels
// (CPU twin: ops/quantized_linear.h; layout: ops/w4a16_pack.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"

namespace qspec::cuda {

// ---- GEMMs ----------------------------------------------------------------------------

// 4-bit weights on the device in the layout of ops/w4a16_pack.h (see there), viewed.
struct W4A16Weights {
  const void* codes = nullptr;   // packed codes, ceil(n/16) * k * 8 bytes
  const void* scales = nullptr;  // packed f16 scale pairs, ceil(n/16) * (k/group) * 8 * 4 bytes
  int64_t n = 0, k = 0;
  int64_t group = 0;  // 32, 64 or 128
  // Optional bit-plane copy of the codes (ops/w4_bitplanes.h) for the Bitwise strategy.
  const void* bitplanes = nullptr;
  // int4-asym (ops/w4a16_pack.h): f16 group minimums in the scales' layout, the codes unsigned;
  // null for int4. They must follow the scales in one buffer (mins == scales + ceil(n/16) *
  // (k/group) * 8 words): the kernels find them there, so int4's kernel parameters are unchanged.
  // Only the paths of w4a16_runs_zero_points take them (the others throw).
  const void* mins = nullptr;
  // int4-zp: `mins` holds zero words (ops/w4a16_pack.h), not minimums; the same paths run them
  // (w4a16_runs_zero_points), with integer-zero-point kernels at int4's cost.
  bool zero_codes = false;
  bool has_min() const { return mins != nullptr; }
};

// small_m: kernels/w4a16_small_m.cuh (few tokens); tiled: kernels/w4a16_tiled.cuh (tens to
// hundreds of tokens); dequant_cublas: dequantize to f16 scratch, then cuBLAS.
enum class W4A16Path { automatic, small_m, dequant_cublas, tiled };

// Whether a W4A16 path runs weights with minimums (W4A16Weights::mins) at m tokens here: the one
// rule the dispatchers (w4a16_choose_path, gemm/cuda/gemm_dispatch.cpp) route such weights by.
// dequant_cublas runs every M; small_m the preload kernel's zero-point instance (sm_90a, at most
// 16 tokens); tiled the wgmma tiles' (sm_90a; the mma.sync tiles have none). automatic: false (ask
// per path).
bool w4a16_runs_zero_points(W4A16Path path, int64_t m);

// Workspace a W4A16 GEMM of this size may use: split-K partials and counters for the small-M
// and tiled kernels, or the dequantized f16 weights for the cuBLAS path (n * k * 2 bytes). The counters
// must start zeroed: allocate, then call w4a16_workspace_init once (each launch leaves them zero).
size_t w4a16_workspace_bytes(int64_t m, int64_t n, int64_t k, W4A16Path path = W4A16Path::automatic);
void w4a16_workspace_init(void* workspace, size_t bytes, void* stream);
// The path `automatic` takes for m tokens (small_m up to a measured M threshold: 16 tokens where
// the preload kernel runs, 8 elsewhere; tiled, then dequantize + cuBLAS).
W4A16Path w4a16_choose_path(int64_t m, int64_t n, int64_t k);
// Where the preload kernel and the wgmma tiles both run, the token count from which f16 GEMMs take
// the tiled path's wgmma tiles instead (17 by default; QSPEC_W4A16_WGMMA_FROM=9..17, A/B runs).
int64_t w4a16_wgmma_min_tokens();
// Whether the 128 x 256 wgmma tile (kW4A16WgmmaTile128x256) runs where its rule picks it (from 129
// tokens where its blocks fill most of a wave, and the tiled path's prefill of 257-3072 tokens):
// sm_90a, unless QSPEC_W4A16_PREFILL_WGMMA=0 (A/B runs: the 128 x 128 tile and dequantize + cuBLAS
// as before it).
bool w4a16_prefill_takes_wgmma();
// The same for these weights: weights with minimums go to a path of w4a16_runs_zero_points.
W4A16Path w4a16_choose_path(int64_t m, const W4A16Weights& w);

// y[m, n] = x[m, k] (f16, rows ldx apart, ldx % 8 == 0, 16-byte aligned) * W^T, f16 out
// (rows ldy apart), f32 accumulation. x_packed: x in the packed k order (W4A16TiledConfig::x_packed),
// where w4a16_gemm_reads_packed_x(m, w) (the automatic path, throws elsewhere).
void w4a16_gemm(const Blas& blas, const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y,
                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                W4A16Path path = W4A16Path::automatic, bool x_packed = false);
// Whether w4a16_gemm's automatic path runs m tokens of w on a tile that reads x in the packed k
// order (the tiled path on a wgmma tile: int4 weights by default_tile's rule; int4-asym / int4-zp
// ones too unless QSPEC_W4A16_ZP_WGMMA_17_64=0, an A/B knob), so that the kernel making x may
// write it so (cuda::rmsnorm's y_packed, silu_mul's out_packed) and pass x_packed.
bool w4a16_gemm_reads_packed_x(int64_t m, const W4A16Weights& w);

// Tuning knob for benchmarks: the small-M kernel variant (0 = the default: 5 where it runs, else 1; 1 = 4 warps
// x 2 row blocks, depth 4 register ring; 2 = 8 warps x 1 row block, depth 8; 3 / 4 = the
// shared-memory cp.async ring, 8 stages of 2 chunks / 4 stages of 4, for m <= 32 a launch) and
// the split-K override (0 = heuristic); 5 = the bulk-copy preload kernel (sm_90a, slices of up to
// 16 tokens; beyond, variant 1): each warp's weights through a shared-memory ring of one slot (two
// at one token; QSPEC_W4A16_PRELOAD_KB), the first slots requested before the programmatic-launch wait.
// docs/perf-journal/perf-notes-journal-2026.md has the timings.
// x_staging (variants 1 / 2): 0 = the default (shared memory beyond 8 tokens a launch slice,
// docs/perf-journal/perf-notes-journal-2026.md), 1 = the block copies its k range of x into shared memory first, 2 = x
// straight from global memory (through L1).
struct W4A16SmallMConfig {
  int variant = 0;
  int splits = 0;
  int x_staging = 0;
  // int8 activations only: ADAngel's Split strategy (kernels/w4_activation.cuh ActS8Split), the
  // same output at twice the mma work.
  bool split_activations = false;
  // Variant 5 only: warps of a block that share a row block, each a part of its k range, summed
  // in shared memory (1, 2, 4 or 8; 0: planned, kernels/w4a16_preload.cuh). Bitwise the
  // register-ring kernel with k_slices x splits splits when splits is 1.
  int k_slices = 0;
};
// Whether small-M variant 5 (preload) can run these weights on this device and build.
bool w4a16_preload_supported(const W4A16Weights& w);
// Whether the preload kernel runs on this device and build at all (sm_90a).
bool w4a16_preload_runs_here();
// SwiGLU in the gate_up GEMM's epilogue (kernels/w4a16_preload.cuh, SWIGLU): w holds gate's rows
// [0, n / 2) then up's [n / 2, n); act[t, i] = silu(y[t, i]) * y[t, n / 2 + i] for i < n / 2, act
// rows ld_act apart (columns past n / 2 untouched), with y = x w^T rounded to f16 as w4a16_gemm
// stores it: the bits of w4a16_gemm_small_m (variant 5, one split, the k slices of
// w4a16_swiglu_k_slices: the planned ones, at most 4) then silu_mul, one launch and no y. It runs
// 1-16 tokens with n % 32 == 0 where the preload kernel does (sm_90a, w4a16_swiglu_runs); it
// throws elsewhere. Whether a GEMM's dispatcher would run that same partition anyway:
// w4a16_small_m_swiglu_partition, or qspec::w4_gemm_takes_swiglu_epilogue.
bool w4a16_swiglu_runs(const W4A16Weights& w, int64_t m);
// The k slices a block of w4a16_gemm_swiglu's launch has (1, 2 or 4) for these weights and tokens.
int w4a16_swiglu_k_slices(const W4A16Weights& w, int64_t m, const void* workspace, size_t workspace_bytes);
// Whether w4a16_gemm_small_m(config) would run these m tokens (at most 16) as one preload launch
// of one split and at most 4 k slices, the partition w4a16_gemm_swiglu runs: the same variant
// choice and the same plan as the launch itself.
bool w4a16_small_m_swiglu_partition(const W4A16Weights& w, int64_t m, const W4A16SmallMConfig& config,
                                    const void* workspace, size_t workspace_bytes);
void w4a16_gemm_swiglu(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* act, int64_t ld_act,
                       void* workspace, size_t workspace_bytes, void* stream);
void w4a16_gemm_small_m(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y,
                        int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                        const W4A16SmallMConfig& config = {});
// Tuning knob for benchmarks: the tiled kernel's tile (0 = chosen by m; 1 = 256 weight rows x
// 64 tokens, 8 warps; 2 = 128 x 64, 4 warps; 3 = 256 x 32, 8 warps; 4 = 128 x 128, 8 warps;
// 5 = 128 x 64 on wgmma (kernels/w4a16_wgmma.cuh: warp-specialised, TMA, register-A weights),
// f16 activation values on sm_90a only (w4a16_wgmma_tile_runs_here), not the mma.sync tiles'
// bits (the group scales folded into f16 weights; within the same bound of the CPU); 6 = 128 x
// 32, 4 warps, two blocks a multiprocessor; 7 / 8 = the wgmma kernel at 128 x 32 / 128 x 128;
// 9 / 10 = the wgmma kernel at 256 x 32 / 256 x 64 (four mma warpgroups); 11 = the wgmma
// kernel at 128 x 256 (prefill, unsplit); any m runs, in M tiles) and the split-K override (0 =
// heuristic: fill the GPU once). Tiles 2 and 6 run f16 activations of at most 32 tokens with at
// most 2048 k a split as 8 warps of 16 rows instead of 4 of 32 (the same bits).
struct W4A16TiledConfig {
  int tile = 0;
  int splits = 0;
  // x holds each 32-k block of every row in the weights' packed k order (ops/w4a16_pack.h,
  // w4a16_packed_x_index), as a producer of x may write it: the wgmma tiles skip their quad
  // transposes. The wgmma tiles only (others throw), on int4, int4-asym and int4-zp weights.
  bool x_packed = false;
};
inline constexpr int kW4A16TiledTiles = 11;  // tiles 1 .. kW4A16TiledTiles
inline constexpr int kW4A16WgmmaTile = 5;
inline constexpr int kW4A16Tile128x32 = 6;  // the default at 17-32 tokens where two blocks fit a multiprocessor
inline constexpr int kW4A16WgmmaTile32 = 7;
inline constexpr int kW4A16WgmmaTile128 = 8;
inline constexpr int kW4A16WgmmaTile256x32 = 9;
inline constexpr int kW4A16WgmmaTile256x64 = 10;
inline constexpr int kW4A16WgmmaTile128x256 = 11;  // prefill: 256 tokens a tile
// The wgmma tiles (5, 7 - 11): sm_90a and f16 activation values only.
inline constexpr bool w4a16_is_wgmma_tile(int tile) {
  return tile == kW4A16WgmmaTile || (tile >= kW4A16WgmmaTile32 && tile <= kW4A16WgmmaTile128x256);
}
// The tiles with zero-point instances (int4-asym / int4-zp weights): 128x64 (2), 128x32 and the
// wgmma tiles.
inline constexpr bool w4a16_tile_has_zero_points(int tile) {
  return tile == 2 || tile == kW4A16Tile128x32 || w4a16_is_wgmma_tile(tile);
}
bool w4a16_wgmma_tile_runs_here();
std::string w4a16_tiled_tile_name(int tile);  // "256x64" (rows x tokens) for tile 1, ...
// The warps a block of the kernel w4a16_gemm_tiled(config) runs for these m >= 1 tokens (tests:
// the 8-warp forms of tiles 2 and 6).
int w4a16_tiled_warps(const W4A16Weights& w, int64_t m, const W4A16TiledConfig& config, const void* workspace,
                      size_t workspace_bytes);
void w4a16_gemm_tiled(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                      void* workspace, size_t workspace_bytes, void* stream, const W4A16TiledConfig& config = {});
// SwiGLU in the tiled kernel's epilogue (kernels/w4a16_tiled.cuh, SWIGLU), for gate_up weights as
// in w4a16_gemm_swiglu: act[t, i] = silu(y[t, i]) * y[t, n / 2 + i] for i < n / 2 (act rows ld_act
// apart, columns past n / 2 untouched), the bits of w4a16_gemm_tiled with config's tile (0: the
// one it would choose) in one split then silu_mul, one launch and no y. Any m, n % 32 == 0, tiles
// 1, 2, 3 and 6 (each warp takes row blocks in gate / up pairs; not 128x128 or the wgmma tile 5);
// config.splits must be 0 or 1.
void w4a16_gemm_tiled_swiglu(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* act,
                             int64_t ld_act, void* stream, const W4A16TiledConfig& config = {});
// Whether w4a16_gemm_tiled(config) would run these m f16 tokens on a tile with a SwiGLU epilogue in one split
// (the same plan as the launch itself), n % 32 == 0: then w4a16_gemm_tiled_swiglu gives its bits.
bool w4a16_tiled_swiglu_partition(const W4A16Weights& w, int64_t m, const W4A16TiledConfig& config,
                                  const void* workspace, size_t workspace_bytes);
// The packed weights dequantized to f16 [n, k] row-major (the cuBLAS path's first half).
void w4a16_dequantize(const W4A16Weights& w, f16_bits* out, void* stream);

}  // namespace qspec::cuda
