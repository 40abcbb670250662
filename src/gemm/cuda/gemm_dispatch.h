// ADAngel's dispatcher and tuner for the 4-bit-weight GEMMs (CUDA builds only; the policy map
// itself is gemm/policy_map.h). run_w4_gemm launches one strategy; dispatch_w4_gemm looks the
// strategy up in a map (O(1)) and launches it; tune_w4_policy times every strategy on a model's
// GEMM shapes over a sweep of M and writes the map.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "gemm/policy_map.h"
#include "ops/cuda/ops.h"

namespace qspec {

// A GEMM's activations: f16 rows (x, ldx) or quantized ones (ops.h QuantizedActivations).
struct W4GemmInput {
  const cuda::f16_bits* x = nullptr;
  int64_t ldx = 0;
  const cuda::QuantizedActivations* quantized = nullptr;
  // x in the W4A16 packed k order (w4_gemm_reads_packed_x said the GEMM reads it so: the built-in
  // choice, without a map or where the map names builtin).
  bool x_packed = false;
  // "f16" or the quantized format's name, as the policy map keys it.
  std::string_view activations() const;
};

// One strategy. dequant_cublas needs w4a16_workspace_bytes(m, n, k, dequant_cublas) of workspace;
// with less it runs the tiled 256x64 kernel instead (the only fallback).
void run_w4_gemm(gemm::Strategy strategy, const cuda::Blas& blas, const W4GemmInput& x, int64_t m,
                 const cuda::W4A16Weights& w, cuda::f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes,
                 void* stream);
// The map's strategy for (activations, n, k, m); without a map (nullptr) the kernels' own
// `automatic` paths, except that quantized activations go to the wgmma kernel where the
// rule-based default names it (int8 / fp8 from 512 tokens) and it runs here: the default
// engine, bench and tests run the large-M kernel a map would. Weights with zero points under
// quantized activations: the chosen strategy on their codes as int4's, then
// cuda::w4_zero_point_correction.
void dispatch_w4_gemm(const gemm::PolicyMap* policy, const cuda::Blas& blas, const W4GemmInput& x, int64_t m,
                      const cuda::W4A16Weights& w, cuda::f16_bits* y, int64_t ldy, void* workspace,
                      size_t workspace_bytes, void* stream);

// Whether the GEMM dispatch_w4_gemm runs for m f16 tokens under `policy` reads x in the W4A16
// packed k order, so the kernel making x writes it so (rmsnorm's y_packed, silu_mul's
// out_packed) and passes W4GemmInput::x_packed: the built-in choice (no map, or the map names
// builtin there) where cuda::w4a16_gemm_reads_packed_x says so.
bool w4_gemm_reads_packed_x(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m);

// Whether a GEMM of m tokens with fp8 activations runs on the wgmma kernel under `policy` (the
// map's pick, rule_based_strategy's without a map; the kernel runs here, the workspace holds its
// weights): then its activations must be e4m3 codes (QuantizedActivations::e4m3), everywhere
// else f16 values (faster on f16 mma).
bool w4_fp8_gemm_takes_e4m3(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m,
                            size_t workspace_bytes);

// gate_up's GEMM with SwiGLU in its epilogue, where that keeps the GEMM's bits: dispatch_w4_gemm
// would run this GEMM of m f16 tokens (the map's strategy, or no map and the kernels' automatic
// path) on the preload kernel in one split and at most 4 k slices where its SwiGLU epilogue runs
// (cuda::w4a16_swiglu_runs), or on a tiled kernel tile with one (1, 2, 3, 6) in one split
// (cuda::w4a16_tiled_swiglu_partition). Then gate_up's GEMM writes silu(gate) * up itself and the
// kernel that runs does not change (run_w4_gemm_swiglu).
struct SwigluGemm {
  enum class Kernel { none, preload, tiled } kernel = Kernel::none;
  cuda::W4A16TiledConfig tiled;  // Kernel::tiled: the tile (0: the tiled path's own choice)
};
SwigluGemm w4_gemm_swiglu_epilogue(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m,
                                   const void* workspace, size_t workspace_bytes);
bool w4_gemm_takes_swiglu_epilogue(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m,
                                   const void* workspace, size_t workspace_bytes);
// act[t, i] = silu(y[t, i]) * y[t, n / 2 + i] (cuda::w4a16_gemm_swiglu's contract) on plan's kernel;
// throws for Kernel::none.
void run_w4_gemm_swiglu(const SwigluGemm& plan, const cuda::f16_bits* x, int64_t m, int64_t ldx,
                        const cuda::W4A16Weights& w, cuda::f16_bits* act, int64_t ld_act, void* workspace,
                        size_t workspace_bytes, void* stream);

struct GemmShape4 {
  std::string name;
  int64_t n, k, group;
};
struct TuneOptions {
  std::vector<GemmShape4> shapes;
  std::vector<std::string> activations = {"f16", "int8"};
  std::vector<int64_t> m_values;  // empty: default_tune_m_values(), refined (gemm::adaptive_tune_points)
  int reps = 15;
  // A strategy replaces the rule-based default at an M only when it is this much faster there.
  double min_gain = 0.03;
  // Progress: (done, total) units of (shape, activations, M).
  std::function<void(size_t, size_t)> progress;
};
// The coarse token counts a default tune starts from, 1..4096 (powers of two and the points
// halfway between); gemm::adaptive_tune_points adds midpoints wherever neighbours' winners
// differ, so a tune times ~30-40 M values a shape instead of every decode batch and verify size.
std::vector<int64_t> default_tune_m_values();
// Times every strategy (median of reps graph replays, weights round-robin over copies that
// exceed the L2) at options.m_values, or adaptively from default_tune_m_values() when it is
// empty, and returns the map (ranges merged: the winner at each sampled M covers the M values
// above the previous sample; the rule-based default keeps M values where no strategy beats it by
// min_gain). `record` receives every timing (us) for bench/results.
gemm::PolicyMap tune_w4_policy(const TuneOptions& options, nlohmann::json* record);

}  // namespace qspec
