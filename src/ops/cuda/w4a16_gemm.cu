// W4A16 dispatch: the small-M tensor-core kernel, or dequantize to f16 + cuBLAS.
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {
namespace detail {

kernels::W4A16Layout w4a16_layout(const W4A16Weights& w, bool zero_points) {
  QSPEC_CHECK(w.codes != nullptr && w.scales != nullptr, "cuda::w4a16: null weights");
  QSPEC_CHECK(zero_points || w.mins == nullptr,
              "cuda::w4a16: this kernel has no int4-asym (zero point) variant; weights with minimums run on the "
              "W4A16 paths of cuda::w4a16_runs_zero_points (cuda::w4a16_gemm's automatic path routes them)");
  QSPEC_CHECK(w.group == 32 || w.group == 64 || w.group == 128, "cuda::w4a16: kernel group ", w.group,
              " (supported: 32, 64, 128; see ops/w4a16_pack.h)");
  QSPEC_CHECK(w.n > 0 && w.k > 0 && w.k % w.group == 0 && w.n < (1ll << 31) && w.k < (1ll << 28),
              "cuda::w4a16: bad weight shape ", w.n, " x ", w.k, " (k must be a multiple of the group ", w.group, ")");
  QSPEC_CHECK(reinterpret_cast<uintptr_t>(w.codes) % 16 == 0 && reinterpret_cast<uintptr_t>(w.scales) % 4 == 0,
              "cuda::w4a16: misaligned packed weights");
  kernels::W4A16Layout layout{};
  layout.codes = static_cast<const uint8_t*>(w.codes);
  layout.scales = static_cast<const uint32_t*>(w.scales);
  layout.n = static_cast<int>(w.n);
  layout.k = static_cast<int>(w.k);
  layout.row_blocks = static_cast<int>((w.n + 15) / 16);
  layout.full_chunks = static_cast<int>(w.k / 64);
  layout.tail = w.k % 64 == 32 ? 1 : 0;
  layout.groups = static_cast<int>(w.k / w.group);
  // The minimums directly after the scales (kernels::zero_point_mins reads them there).
  QSPEC_CHECK(w.mins == nullptr ||
                  w.mins == static_cast<const uint32_t*>(w.scales) + static_cast<int64_t>(layout.row_blocks) * layout.groups * 8,
              "cuda::w4a16: W4A16Weights::mins must follow the scales in their buffer (scales + ceil(n/16) * (k/group) * 8 "
              "words)");
  return layout;
}

kernels::ActivationRows activation_rows(const QuantizedActivations& x, int64_t m, const W4A16Weights& w,
                                        const char* who) {
  const bool f16 = quantized_values_are_f16(x);
  QSPEC_CHECK(x.format == quant::Format::int8 || x.format == quant::Format::int4 || x.format == quant::Format::fp8 ||
                  quantized_activations_use_f16(x.format),
              who, ": ",
              kernels::format_label(x.format), " is not an activation format of the quantized GEMMs");
  QSPEC_CHECK(m >= 0 && m < (1ll << 31) && x.ldx >= w.k && x.ldx % (f16 ? 8 : 16) == 0 && is_aligned_16(x.values),
              who, ": x must be 16-byte aligned with ldx >= k and ldx % ", f16 ? 8 : 16, " == 0 (m ", m, ", ldx ",
              x.ldx, ")");
  QSPEC_CHECK(m == 0 || x.scales != nullptr, who, ": no activation scales");
  kernels::ActivationRows rows{x.values, x.ldx, x.scales, 0, 0};
  if (x.format == quant::Format::int4) {
    QSPEC_CHECK(x.group > 0 && x.group % w.group == 0 && w.k % x.group == 0 && x.scale_ld >= w.k / x.group, who,
                ": int4 activation groups of ", x.group, " (", x.scale_ld, " scales a row) must be a multiple of the ",
                "weight group ", w.group, " and divide k ", w.k);
    rows.scale_ld = x.scale_ld;
    rows.group = static_cast<int>(x.group);
  }
  return rows;
}

kernels::ActivationRows activation_rows_from(const kernels::ActivationRows& rows, const QuantizedActivations& x,
                                             int64_t first_token) {
  kernels::ActivationRows out = rows;
  const size_t elem = quantized_values_are_f16(x) ? 2 : 1;
  out.x = static_cast<const char*>(rows.x) + static_cast<size_t>(first_token * rows.ldx) * elem;
  out.scales = rows.scales + first_token * (x.format == quant::Format::int4 ? rows.scale_ld : 1);
  return out;
}

}  // namespace detail

bool quantized_activations_use_f16(quant::Format format) {
  return format == quant::Format::fp8 || format == quant::Format::nvfp4 || format == quant::Format::mxfp4;
}

// Crossovers of `automatic` (docs/perf-journal/perf-notes-journal-2026.md has the H100 numbers behind them): the small-M
// kernel up to kSmallMMax tokens, the tiled kernel up to kTiledMaxM, dequantize + cuBLAS beyond.
// A build may set them (-DQSPEC_W4A16_SMALL_M_MAX=, -DQSPEC_W4A16_TILED_M_MAX=) to try others;
// ADAngel's tuner (issue 6) replaces both with a measured per-shape policy. H100, Llama-3-8B
// layer GEMMs summed (tools/pick_w4a16_crossover.py, bench/results/gpu-w4a16-gemm-h100-tiled.json):
// small-M wins at m <= 8 (70 vs 82 us), tiled at 16..128 (81 vs 112 us at 16, 131 vs 351 at 64),
// dequantize + cuBLAS from 256 (394 vs 400 us).
// Where the preload kernel runs (sm_90a), f16 GEMMs stay on the small-M path up to
// kSmallMMaxPreload tokens (one preload launch): measured in the whole decode step on the H100
// (docs/perf-journal/perf-notes-journal-2026.md, "The preload kernel at 9-16 tokens"), the W4A16 step is 14 / 9 / 5 %
// shorter at batch 9 / 12 / 16 than with the tiled kernel there, which the per-GEMM timings
// above favoured.
#ifndef QSPEC_W4A16_SMALL_M_MAX
#define QSPEC_W4A16_SMALL_M_MAX 8
#endif
#ifndef QSPEC_W4A16_SMALL_M_MAX_PRELOAD
#define QSPEC_W4A16_SMALL_M_MAX_PRELOAD 16
#endif
#ifndef QSPEC_W4A16_TILED_M_MAX
#define QSPEC_W4A16_TILED_M_MAX 128
#endif
// Where the wgmma tiles run (sm_90a), the tiled path keeps the GEMMs up to kTiledMaxMWgmma tokens:
// its 128 x 128 wgmma tile beats dequantize + cuBLAS there on every Llama-3-8B layer GEMM (H200,
// at 256 tokens: gate_up 149 vs 166 us, down 69 vs 76, qkv 37.0 vs 37.6, o 26.6 vs 25.6; at 1024
// dequantize + cuBLAS wins, gate_up 385 vs 554; bench/results/gpu-w4a16-wgmma-gemm-llama3-8b-h200-ce796e9.log).
#ifndef QSPEC_W4A16_TILED_M_MAX_WGMMA
#define QSPEC_W4A16_TILED_M_MAX_WGMMA 256
#endif
static constexpr int64_t kTiledMaxMWgmma = QSPEC_W4A16_TILED_M_MAX_WGMMA;
static constexpr int64_t kSmallMMax = QSPEC_W4A16_SMALL_M_MAX;
static constexpr int64_t kSmallMMaxPreload = QSPEC_W4A16_SMALL_M_MAX_PRELOAD;
static constexpr int64_t kTiledMaxM = QSPEC_W4A16_TILED_M_MAX;

bool w4a16_runs_zero_points(W4A16Path path, int64_t m) {
  switch (path) {
    case W4A16Path::dequant_cublas:
      return true;
    case W4A16Path::small_m:  // the preload kernel (ActF16Zp), 16 tokens a launch, sm_90a
      return m <= 16 && w4a16_preload_runs_here();
    case W4A16Path::tiled:  // the wgmma tiles' zero-point instances (any m, in M tiles), sm_90a
      return w4a16_wgmma_tile_runs_here();
    default:
      return false;
  }
}

W4A16Path w4a16_choose_path(int64_t m, const W4A16Weights& w) {
  const W4A16Path path = w4a16_choose_path(m, w.n, w.k);
  return !w.has_min() || w4a16_runs_zero_points(path, m) ? path : W4A16Path::dequant_cublas;
}

// Where both run (sm_90a), f16 GEMMs of w4a16_wgmma_min_tokens() tokens or more leave the preload
// kernel for the tiled path's wgmma tiles: 17 (one past kSmallMMaxPreload) by default.
// QSPEC_W4A16_WGMMA_FROM=9..17 moves 9-16 tokens there too, for A/B runs in the step: at 16
// tokens the wgmma 128x32 tile with x packed took Llama-3-8B's gate_up 25.6 us against the preload
// kernel's 29.5 and down 16.8 against 17.5, but qkv 10.4 against 9.7, and it has no SwiGLU
// epilogue (gate_up then runs silu_mul after it; H200,
// bench/results/gpu-w4a16-wgmma-stage-loop-gemm-llama3-8b-h200-0f14e83.log).
int64_t w4a16_wgmma_min_tokens() {
  static const int64_t from =
      env_int("QSPEC_W4A16_WGMMA_FROM", static_cast<int>(kSmallMMaxPreload) + 1, 9, static_cast<int>(kSmallMMaxPreload) + 1);
  return from;
}

// Past kTiledMaxMWgmma tokens (prefill) on sm_90a, up to kTiledMaxMPrefill, the tiled path (its
// 128 x 256 wgmma tile, w4a16_tiled.cu's default_tile) instead of dequantize + cuBLAS, which writes
// and reads the whole f16 weight matrix every call. Beyond, that round trip is a few per cent of
// the GEMM and cuBLAS's tiles outrun the 128 x 256 one: Llama-3-8B on the H200, 128 x 256 against
// dequantize + cuBLAS at 1024 / 2048 / 3072 / 4096 tokens: gate_up 384 / 788 / 1205 / 1617 against
// 434 / 821 / 1226 / 1559 us, down 171 / 348 / 540 / 785 against 210 / 387 / 567 / 764, o 49 / 102 /
// 160 / 233 against 61 / 111 / 163 / 238, qkv 99 / 159 / 266 / 343 against 87 / 165 / 249 / 366
// (a layer's four: 1.5 % faster at 3072, 1.7 % slower at 4096;
// bench/results/gpu-w4a16-prefill-gemm-llama3-8b-h200-ebd3e06.log, 3072 in
// gpu-w4a16-prefill-gemm-points-llama3-8b-h200-6a10c69.log).
#ifndef QSPEC_W4A16_TILED_M_MAX_PREFILL
#define QSPEC_W4A16_TILED_M_MAX_PREFILL 3072
#endif
static constexpr int64_t kTiledMaxMPrefill = QSPEC_W4A16_TILED_M_MAX_PREFILL;
bool w4a16_prefill_takes_wgmma() {
  static const bool on = env_int("QSPEC_W4A16_PREFILL_WGMMA", 1, 0, 1) == 1;
  return on && w4a16_wgmma_tile_runs_here();
}

W4A16Path w4a16_choose_path(int64_t m, int64_t n, int64_t k) {
  const bool preload = w4a16_preload_runs_here();
  const bool to_wgmma = preload && m >= w4a16_wgmma_min_tokens() && w4a16_wgmma_tile_runs_here();
  if (m <= (preload ? kSmallMMaxPreload : kSmallMMax) && !to_wgmma) return W4A16Path::small_m;
  if (m <= (w4a16_wgmma_tile_runs_here() ? kTiledMaxMWgmma : kTiledMaxM)) return W4A16Path::tiled;
  return m <= kTiledMaxMPrefill && w4a16_prefill_takes_wgmma() ? W4A16Path::tiled : W4A16Path::dequant_cublas;
}

size_t w4a16_workspace_bytes(int64_t m, int64_t n, int64_t k, W4A16Path path) {
  if (path == W4A16Path::automatic) path = w4a16_choose_path(m, n, k);
  if (path == W4A16Path::small_m) return detail::w4a16_small_m_workspace(m, n, k);
  if (path == W4A16Path::tiled) return detail::w4a16_tiled_workspace(m, n, k);
  // The dequantized weights go after the split-K counters, which must stay zero for the next
  // small-M launch on the same workspace (a prefill through this path used to overwrite them).
  return detail::kW4A16CounterBytes + static_cast<size_t>(n * k) * 2;
}

void w4a16_workspace_init(void* workspace, size_t bytes, void* stream) {
  if (workspace != nullptr && bytes > 0)
    QSPEC_CUDA_CHECK(cudaMemsetAsync(workspace, 0, std::min(bytes, detail::kW4A16CounterBytes), as_stream(stream)));
}

void w4_quantized_gemm(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                       void* workspace, size_t workspace_bytes, void* stream, W4A16Path path) {
  if (path == W4A16Path::automatic) path = m <= kSmallMMax ? W4A16Path::small_m : W4A16Path::tiled;
  QSPEC_CHECK(path != W4A16Path::dequant_cublas,
              "cuda::w4_quantized_gemm: quantized activations have no dequantize + cuBLAS path");
  if (path == W4A16Path::small_m)
    w4_quantized_gemm_small_m(x, m, w, y, ldy, workspace, workspace_bytes, stream);
  else
    w4_quantized_gemm_tiled(x, m, w, y, ldy, workspace, workspace_bytes, stream);
}

void w4a16_gemm(const Blas& blas, const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y,
                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream, W4A16Path path, bool x_packed) {
  if (path == W4A16Path::automatic) path = w4a16_choose_path(m, w);
  if (x_packed) {
    QSPEC_CHECK(path == W4A16Path::tiled && w4a16_gemm_reads_packed_x(m, w),
                "cuda::w4a16_gemm: x in the packed k order where the GEMM reads it so only (w4a16_gemm_reads_packed_x)");
    w4a16_gemm_tiled(x, m, ldx, w, y, ldy, workspace, workspace_bytes, stream, W4A16TiledConfig{0, 0, true});
    return;
  }
  if (path == W4A16Path::small_m) {
    w4a16_gemm_small_m(x, m, ldx, w, y, ldy, workspace, workspace_bytes, stream);
    return;
  }
  if (path == W4A16Path::tiled) {
    w4a16_gemm_tiled(x, m, ldx, w, y, ldy, workspace, workspace_bytes, stream);
    return;
  }
  QSPEC_CHECK(m >= 0 && ldx >= w.k && ldy >= w.n, "cuda::w4a16_gemm: bad strides ldx ", ldx, " ldy ", ldy);
  if (m == 0) return;
  const size_t needed = w4a16_workspace_bytes(m, w.n, w.k, W4A16Path::dequant_cublas);
  QSPEC_CHECK(workspace != nullptr && workspace_bytes >= needed, "cuda::w4a16_gemm: the dequantize + cuBLAS path needs ",
              needed, " bytes of workspace, got ", workspace_bytes);
  auto* w16 = reinterpret_cast<f16_bits*>(static_cast<char*>(workspace) + detail::kW4A16CounterBytes);
  w4a16_dequantize(w, w16, stream);
  gemm_w16_cublas(blas, x, m, ldx, w16, w.n, w.k, y, ldy, Dtype16::f16, stream);
}

}  // namespace qspec::cuda
