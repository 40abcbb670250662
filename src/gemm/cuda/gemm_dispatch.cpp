#include "gemm/cuda/gemm_dispatch.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "qspec/error.h"

namespace qspec {

std::string_view W4GemmInput::activations() const {
  return quantized == nullptr ? std::string_view("f16") : quant::format_name(quantized->format);
}

namespace {

// Whether the wgmma strategy can take this GEMM: the kernel runs here on these weights, the
// workspace holds the unpacked weights, and fp8 activations come as e4m3 codes.
bool wgmma_runs(const W4GemmInput& x, const cuda::W4A16Weights& w, size_t workspace_bytes) {
  return x.quantized != nullptr && cuda::w4_s8_wgmma_supports(w, x.quantized->format) &&
         workspace_bytes >= cuda::w4_s8_wgmma_workspace_bytes(w.n, w.k) &&
         (x.quantized->format != quant::Format::fp8 || x.quantized->e4m3);
}

// The strategy a map names for this GEMM, or none where the kernels choose (no map, or the map
// names builtin there): the one place that reading of a map lives.
std::optional<gemm::Strategy> map_strategy(const gemm::PolicyMap* policy, std::string_view activations,
                                           const cuda::W4A16Weights& w, int64_t m) {
  if (policy == nullptr) return std::nullopt;
  const gemm::Strategy strategy = policy->lookup(activations, w.n, w.k, m);
  if (strategy == gemm::Strategy::builtin) return std::nullopt;
  return strategy;
}

// small_m_v5's launch: the preload kernel, or variant 1 where it cannot run (not sm_90a).
cuda::W4A16SmallMConfig small_m_v5_config(const cuda::W4A16Weights& w) {
  return cuda::W4A16SmallMConfig{cuda::w4a16_preload_supported(w) ? 5 : 1, 0, 0};
}

// The tiled kernel's tile (cuda::W4A16TiledConfig::tile) of a tiled strategy; 0 for the others.
int tiled_strategy_tile(gemm::Strategy strategy) {
  using gemm::Strategy;
  switch (strategy) {
    case Strategy::tiled_256x64:
    case Strategy::tiled_128x64:
    case Strategy::tiled_256x32:
    case Strategy::tiled_128x128:
      return static_cast<int>(strategy) - static_cast<int>(Strategy::tiled_256x64) + 1;
    case Strategy::tiled_128x32:
      return cuda::kW4A16Tile128x32;
    case Strategy::wgmma_128x128:
      return cuda::kW4A16WgmmaTile128;
    case Strategy::wgmma_128x256:
      return cuda::kW4A16WgmmaTile128x256;
    default:
      return 0;
  }
}

// The W4A16 path a strategy's kernel belongs to (cuda::w4a16_runs_zero_points asks per path).
cuda::W4A16Path strategy_path(gemm::Strategy strategy) {
  using gemm::Strategy;
  switch (strategy) {
    case Strategy::dequant_cublas:
      return cuda::W4A16Path::dequant_cublas;
    case Strategy::small_m_v1:
    case Strategy::small_m_v2:
    case Strategy::small_m_v3:
    case Strategy::small_m_v4:
    case Strategy::small_m_v5:
    case Strategy::split_small_m:
    case Strategy::bitwise_b1:
      return cuda::W4A16Path::small_m;
    default:
      return cuda::W4A16Path::tiled;
  }
}

}  // namespace

SwigluGemm w4_gemm_swiglu_epilogue(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m,
                                   const void* workspace, size_t workspace_bytes) {
  SwigluGemm plan;
  if (m < 1 || w.n % 32 != 0) return plan;
  // int4-asym weights: the preload kernel's SwiGLU has a zero-point instance, the tiled one on
  // 128x64 and 128x32 (w4a16_tiled_swiglu_partition says where).
  // The GEMM dispatch_w4_gemm would run: the map's strategy, or (no map) the kernels' automatic path.
  bool preload = false;
  int tile = 0;  // a tiled strategy's tile; 0 without a map: the tiled path's own choice
  const std::optional<gemm::Strategy> named = map_strategy(policy, "f16", w, m);
  if (named) {
    preload = *named == gemm::Strategy::small_m_v5;
    tile = tiled_strategy_tile(*named);
    if (!preload && tile == 0) return plan;  // neither the preload kernel nor a tiled one
  } else {
    const cuda::W4A16Path path = cuda::w4a16_choose_path(m, w.n, w.k);
    preload = path == cuda::W4A16Path::small_m;
    if (!preload && path != cuda::W4A16Path::tiled) return plan;
  }
  if (preload) {
    if (cuda::w4a16_swiglu_runs(w, m) &&
        cuda::w4a16_small_m_swiglu_partition(w, m, named ? small_m_v5_config(w) : cuda::W4A16SmallMConfig{},
                                             workspace, workspace_bytes))
      plan.kernel = SwigluGemm::Kernel::preload;
    return plan;
  }
  plan.tiled = cuda::W4A16TiledConfig{tile, 0};
  if (cuda::w4a16_tiled_swiglu_partition(w, m, plan.tiled, workspace, workspace_bytes))
    plan.kernel = SwigluGemm::Kernel::tiled;
  return plan;
}

bool w4_gemm_takes_swiglu_epilogue(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m,
                                   const void* workspace, size_t workspace_bytes) {
  return w4_gemm_swiglu_epilogue(policy, w, m, workspace, workspace_bytes).kernel != SwigluGemm::Kernel::none;
}

void run_w4_gemm_swiglu(const SwigluGemm& plan, const cuda::f16_bits* x, int64_t m, int64_t ldx,
                        const cuda::W4A16Weights& w, cuda::f16_bits* act, int64_t ld_act, void* workspace,
                        size_t workspace_bytes, void* stream) {
  QSPEC_CHECK(plan.kernel != SwigluGemm::Kernel::none, "run_w4_gemm_swiglu: this GEMM has no SwiGLU epilogue");
  if (plan.kernel == SwigluGemm::Kernel::preload)
    cuda::w4a16_gemm_swiglu(x, m, ldx, w, act, ld_act, workspace, workspace_bytes, stream);
  else
    cuda::w4a16_gemm_tiled_swiglu(x, m, ldx, w, act, ld_act, stream, plan.tiled);
}

bool w4_fp8_gemm_takes_e4m3(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m,
                            size_t workspace_bytes) {
  // Where the kernels choose, the rule-based default's large-M choice, as dispatch_w4_gemm.
  const gemm::Strategy strategy = map_strategy(policy, "fp8", w, m).value_or(gemm::rule_based_strategy("fp8", m));
  if (strategy != gemm::Strategy::s8_wgmma_128x128) return false;
  return cuda::w4_s8_wgmma_supports(w, quant::Format::fp8) &&
         workspace_bytes >= cuda::w4_s8_wgmma_workspace_bytes(w.n, w.k);
}

void run_w4_gemm(gemm::Strategy strategy, const cuda::Blas& blas, const W4GemmInput& x, int64_t m,
                 const cuda::W4A16Weights& w, cuda::f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes,
                 void* stream) {
  using gemm::Strategy;
  QSPEC_CHECK(gemm::strategy_supports(strategy, x.activations()), "GEMM dispatch: strategy ",
              gemm::strategy_name(strategy), " does not run ", x.activations(), " activations");
  if (strategy == Strategy::builtin) {
    dispatch_w4_gemm(nullptr, blas, x, m, w, y, ldy, workspace, workspace_bytes, stream);
    return;
  }
  QSPEC_CHECK(!x.x_packed, "GEMM dispatch: x in the packed k order goes to the built-in choice only (w4_gemm_reads_packed_x)");
  // Weights with minimums (int4-asym) run f16 activations on the paths with zero-point kernels
  // only (cuda::w4a16_runs_zero_points): a strategy elsewhere becomes the kernels' own automatic
  // choice for these weights (a map tuned on int4 kernels may name any).
  if (w.has_min()) {
    QSPEC_CHECK(x.quantized == nullptr, "GEMM dispatch: int4-asym / int4-zp weights under ", x.activations(),
                " activations go through dispatch_w4_gemm (the strategy on their codes, then the zero points' term)");
    const cuda::W4A16Path path = strategy_path(strategy);
    cuda::w4a16_gemm(blas, x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream,
                     cuda::w4a16_runs_zero_points(path, m) ? path : cuda::W4A16Path::automatic);
    return;
  }
  if (strategy == Strategy::dequant_cublas &&
      workspace_bytes < cuda::w4a16_workspace_bytes(m, w.n, w.k, cuda::W4A16Path::dequant_cublas))
    strategy = Strategy::tiled_128x64;
  // The wgmma kernel's int8 weights live in the workspace; without room (or off sm_90a), the
  // tiled kernel computes the same bits.
  if (strategy == Strategy::s8_wgmma_128x128 && !wgmma_runs(x, w, workspace_bytes)) strategy = Strategy::tiled_128x64;
  switch (strategy) {
    case Strategy::small_m_v1:
    case Strategy::small_m_v2:
    case Strategy::small_m_v3:
    case Strategy::small_m_v4: {
      const cuda::W4A16SmallMConfig config{static_cast<int>(strategy) - static_cast<int>(Strategy::small_m_v1) + 1, 0, 0};
      if (x.quantized) cuda::w4_quantized_gemm_small_m(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream, config);
      else cuda::w4a16_gemm_small_m(x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream, config);
      return;
    }
    case Strategy::small_m_v5: {
      // f16 or int8 (strategy_supports).
      if (x.quantized)
        cuda::w4_quantized_gemm_small_m(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream, small_m_v5_config(w));
      else cuda::w4a16_gemm_small_m(x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream, small_m_v5_config(w));
      return;
    }
    case Strategy::tiled_256x64:
    case Strategy::tiled_128x64:
    case Strategy::tiled_256x32:
    case Strategy::tiled_128x128:
    case Strategy::wgmma_128x128:  // f16 only (strategy_supports); the tiled path runs it as tile 8
    case Strategy::wgmma_128x256:  // and this one as tile 11
    case Strategy::tiled_128x32: {
      const cuda::W4A16TiledConfig config{tiled_strategy_tile(strategy), 0};
      if (x.quantized) cuda::w4_quantized_gemm_tiled(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream, config);
      else cuda::w4a16_gemm_tiled(x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream, config);
      return;
    }
    case Strategy::dequant_cublas:
      cuda::w4a16_gemm(blas, x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream, cuda::W4A16Path::dequant_cublas);
      return;
    case Strategy::split_small_m:
      cuda::w4_quantized_gemm_small_m(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream,
                                      cuda::W4A16SmallMConfig{1, 0, 0, true});
      return;
    case Strategy::bitwise_b1:
      cuda::w4_quantized_gemm_bitwise(*x.quantized, m, w, w.bitplanes, y, ldy, workspace, workspace_bytes, stream);
      return;
    case Strategy::s8_wide_128x128:
      cuda::w4_quantized_gemm_s8_wide(*x.quantized, m, w, y, ldy, stream);
      return;
    case Strategy::s8_wgmma_128x128:
      cuda::w4_quantized_gemm_s8_wgmma(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream);
      return;
    case Strategy::builtin:
      break;  // handled above
  }
}

bool w4_gemm_reads_packed_x(const gemm::PolicyMap* policy, const cuda::W4A16Weights& w, int64_t m) {
  return !map_strategy(policy, "f16", w, m) && cuda::w4a16_gemm_reads_packed_x(m, w);
}

void dispatch_w4_gemm(const gemm::PolicyMap* policy, const cuda::Blas& blas, const W4GemmInput& x, int64_t m,
                      const cuda::W4A16Weights& w, cuda::f16_bits* y, int64_t ldy, void* workspace,
                      size_t workspace_bytes, void* stream) {
  QSPEC_CHECK(!x.x_packed || (x.quantized == nullptr && w4_gemm_reads_packed_x(policy, w, m)),
              "dispatch_w4_gemm: x in the packed k order goes to the built-in W4A16 choice where it reads it so only");
  if (x.quantized != nullptr && w.has_min()) {
    // Zero points under quantized activations: every strategy on the codes as int4's, then the
    // zero points' term (cuda::w4_zero_point_correction).
    cuda::W4A16Weights symmetric = w;
    symmetric.mins = nullptr;
    symmetric.zero_codes = false;
    dispatch_w4_gemm(policy, blas, x, m, symmetric, y, ldy, workspace, workspace_bytes, stream);
    cuda::w4_zero_point_correction(*x.quantized, m, w, y, ldy, stream, workspace, workspace_bytes);
    return;
  }
  if (const std::optional<gemm::Strategy> named = map_strategy(policy, x.activations(), w, m)) {
    gemm::Strategy strategy = *named;
    // Bitwise needs the weights' bit-plane copy (GpuLlama makes it for the shapes a measured map
    // sends there); a static or rule-based map may ask for it where it cannot run: the default.
    if (strategy == gemm::Strategy::bitwise_b1 &&
        (w.bitplanes == nullptr || x.quantized == nullptr || !cuda::w4_bitwise_supports(w, x.quantized->format)))
      strategy = gemm::rule_based_strategy(x.activations(), m);
    // The wide kernel needs k % 128 == 0 (a forced map may ask for it on any shape).
    if (strategy == gemm::Strategy::s8_wide_128x128 &&
        (x.quantized == nullptr || !cuda::w4_s8_wide_supports(w, x.quantized->format)))
      strategy = gemm::rule_based_strategy(x.activations(), m);
    if (strategy == gemm::Strategy::s8_wgmma_128x128 && !wgmma_runs(x, w, workspace_bytes))
      strategy = gemm::rule_based_strategy(x.activations(), m);
    // The f16 wgmma kernel runs on sm_90a only (a map tuned there may be loaded elsewhere).
    if (cuda::w4a16_is_wgmma_tile(tiled_strategy_tile(strategy)) && !cuda::w4a16_wgmma_tile_runs_here())
      strategy = gemm::rule_based_strategy(x.activations(), m);
    run_w4_gemm(strategy, blas, x, m, w, y, ldy, workspace, workspace_bytes, stream);
  } else if (x.quantized) {
    // The kernels choose (no map, or builtin there): the rule-based default's large-M choice, the wgmma kernel, where it runs (what
    // a map built without measurements would name; w4_fp8_gemm_takes_e4m3 agrees for fp8); the
    // built-in crossovers of the small-M and tiled kernels elsewhere.
    if (gemm::rule_based_strategy(x.activations(), m) == gemm::Strategy::s8_wgmma_128x128 &&
        wgmma_runs(x, w, workspace_bytes))
      cuda::w4_quantized_gemm_s8_wgmma(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream);
    else
      cuda::w4_quantized_gemm(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream);
  } else {
    cuda::w4a16_gemm(blas, x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream, cuda::W4A16Path::automatic,
                     x.x_packed);
  }
}

std::vector<int64_t> default_tune_m_values() {
  return {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096};
}

gemm::PolicyMap tune_w4_policy(const TuneOptions& options, nlohmann::json* record) {
  const bool adaptive = options.m_values.empty();
  const std::vector<int64_t> m_values = adaptive ? default_tune_m_values() : options.m_values;
  QSPEC_CHECK(!options.shapes.empty() && !m_values.empty(), "tune: no shapes or M values");
  const int64_t max_m = *std::max_element(m_values.begin(), m_values.end());
  void* stream = cuda::create_stream();
  cuda::Blas blas;
  nlohmann::json local_record;
  nlohmann::json& out = record != nullptr ? *record : local_record;
  out["gpu"] = cuda::device_name();
  out["timings"] = nlohmann::json::array();
  const size_t total = options.shapes.size() * options.activations.size() * m_values.size();
  size_t done = 0;
  for (const GemmShape4& shape : options.shapes) {
    // Random packed weights, enough copies that a round robin streams them from HBM (> 2 x L2).
    const int64_t row_blocks = (shape.n + 15) / 16;
    const size_t code_bytes = static_cast<size_t>(row_blocks * shape.k * 8);
    const size_t scale_bytes = static_cast<size_t>(row_blocks * (shape.k / shape.group) * 16) * 2;
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{120} << 20) / (code_bytes + scale_bytes) + 1, 1, 16));
    std::vector<cuda::DeviceMemory> codes, scales, planes;
    std::vector<cuda::W4A16Weights> views;
    for (int c = 0; c < copies; ++c) {
      codes.emplace_back(code_bytes);
      scales.emplace_back(scale_bytes);
      cuda::fill_random_u32(codes.back().as<uint32_t>(), code_bytes / 4, 100 + c, stream);
      cuda::fill_random_f16(scales.back().as<cuda::f16_bits>(), scale_bytes / 2, 0.001f, 0.002f, 200 + c, stream);
      views.push_back({codes.back().get(), scales.back().get(), shape.n, shape.k, shape.group});
      if (cuda::w4_bitwise_supports(views.back(), quant::Format::int8)) {  // the Bitwise strategy's copy
        planes.emplace_back(code_bytes);
        cuda::w4_bitplanes_from_packed(views.back(), planes.back().get(), stream);
        views.back().bitplanes = planes.back().get();
      }
    }
    cuda::DeviceMemory x(static_cast<size_t>(max_m * shape.k) * 2), y(static_cast<size_t>(max_m * shape.n) * 2);
    cuda::DeviceMemory normed(static_cast<size_t>(max_m * shape.k) * 2);
    cuda::fill_random_f16(x.as<cuda::f16_bits>(), static_cast<size_t>(max_m * shape.k), -1.0f, 1.0f, 9, stream);
    const std::vector<float> ones(static_cast<size_t>(shape.k), 1.0f);
    cuda::DeviceMemory norm_weight(ones.size() * 4);
    cuda::copy_to_device(norm_weight.get(), ones.data(), ones.size() * 4);
    const int64_t ldq = (shape.k + 15) / 16 * 16, scale_ld = std::max<int64_t>(1, shape.k / shape.group);
    cuda::DeviceMemory values(static_cast<size_t>(max_m * ldq) * 2), act_scales(static_cast<size_t>(max_m * scale_ld) * 4);
    size_t workspace_bytes = cuda::w4a16_workspace_bytes(max_m, shape.n, shape.k, cuda::W4A16Path::dequant_cublas);
    for (int64_t m = 1; m <= std::min<int64_t>(max_m, 64); ++m)  // every M an adaptive tune may time
      for (auto path : {cuda::W4A16Path::small_m, cuda::W4A16Path::tiled})
        workspace_bytes = std::max(workspace_bytes, cuda::w4a16_workspace_bytes(m, shape.n, shape.k, path));
    cuda::DeviceMemory workspace(workspace_bytes);
    cuda::w4a16_workspace_init(workspace.get(), workspace_bytes, stream);
    for (const std::string& activations : options.activations) {
      const bool quantized = activations != "f16";
      const quant::Format format = quantized ? quant::parse_format(activations) : quant::Format::int8;
      // Every strategy's median time at m tokens (microseconds, by name).
      auto measure = [&](int64_t m) {
        cuda::QuantizedActivations q;
        W4GemmInput input{normed.as<cuda::f16_bits>(), shape.k, nullptr};
        if (quantized) {
          q = cuda::quantize_activations(format, shape.group, x.as<cuda::f16_bits>(), m, shape.k, shape.k, values.get(),
                                         ldq, act_scales.as<float>(), scale_ld, stream);
          input.quantized = &q;
        }
        nlohmann::json times = nlohmann::json::object();
        for (gemm::Strategy strategy : gemm::strategies_for(activations)) {
          using gemm::Strategy;
          if (strategy == Strategy::small_m_v3 || strategy == Strategy::small_m_v4)
            if (m > 32) continue;  // the cp.async ring kernel runs 32 tokens a launch: sliced beyond, never a win
          if ((strategy == Strategy::small_m_v1 || strategy == Strategy::small_m_v2 || strategy == Strategy::split_small_m) &&
              m > 256)
            continue;
          if (strategy == Strategy::small_m_v5 && m > 16) continue;  // 16 tokens a launch: variant 1 beyond
          if (strategy == Strategy::wgmma_128x128 && (m <= 16 || !cuda::w4a16_wgmma_tile_runs_here()))
            continue;  // sm_90a only; a 128-token tile, slower than the small-M kernels at a few tokens
          if (strategy == Strategy::wgmma_128x256 && (m <= 128 || !cuda::w4a16_wgmma_tile_runs_here()))
            continue;  // sm_90a only; a 256-token tile, for prefill
          if (strategy == Strategy::bitwise_b1 && (m > 16 || views[0].bitplanes == nullptr)) continue;  // 8 tokens a launch
          if (strategy == Strategy::s8_wide_128x128 && (m < 32 || !cuda::w4_s8_wide_supports(views[0], format)))
            continue;  // a 128-token tile: built for large M
          if (strategy == Strategy::s8_wgmma_128x128 &&
              (m < 128 || !cuda::w4_s8_wgmma_supports(views[0], format) ||
               workspace_bytes < cuda::w4_s8_wgmma_workspace_bytes(shape.n, shape.k)))
            continue;  // unpacks the whole weight matrix a call: large M only
          // Each GEMM is timed behind the kernel that feeds it in a decode step (the activation
          // quantizer, or an RMSNorm for f16), as the step launches them: under programmatic
          // dependent launch a GEMM's prologue overlaps its predecessor, which back-to-back
          // launches of the GEMM alone do not show.
          // fp8 reaches the wgmma kernel as e4m3 codes, every other kernel as f16 values (the
          // engine quantizes each GEMM's input for the kernel it runs: w4_fp8_gemm_takes_e4m3).
          const bool e4m3_codes = format == quant::Format::fp8 && strategy == Strategy::s8_wgmma_128x128;
          cuda::QuantizedActivations q_codes = q;
          q_codes.e4m3 = e4m3_codes;
          W4GemmInput strategy_input = input;
          if (quantized) strategy_input.quantized = &q_codes;
          // The built-in choice reads x in the packed k order where the step's RMSNorm writes it so.
          strategy_input.x_packed = !quantized && strategy == Strategy::builtin &&
                                    cuda::w4a16_gemm_reads_packed_x(m, views[0]);
          const cuda::ReplayTimes t = cuda::time_replays(
              [&](void* s, int i) {
                if (quantized)
                  cuda::quantize_activations(format, shape.group, x.as<cuda::f16_bits>(), m, shape.k, shape.k,
                                             values.get(), ldq, act_scales.as<float>(), scale_ld, s, {}, e4m3_codes);
                else
                  cuda::rmsnorm(x.as<cuda::f16_bits>(), norm_weight.as<float>(), m, shape.k, 1e-5f,
                                normed.as<cuda::f16_bits>(), s, strategy_input.x_packed);
                run_w4_gemm(strategy, blas, strategy_input, m, views[static_cast<size_t>(i % copies)],
                            y.as<cuda::f16_bits>(), shape.n, workspace.get(), workspace_bytes, s);
              },
              std::max(copies, 4), 2, options.reps, stream);
          std::vector<float> ms = t.ms;
          std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
          times[std::string(gemm::strategy_name(strategy))] = 1e3 * ms[ms.size() / 2];
        }
        if (options.progress) options.progress(++done, std::max(total, done));
        return times;
      };
      std::map<int64_t, nlohmann::json> timed;
      if (adaptive) {
        (void)gemm::adaptive_tune_points(m_values, [&](int64_t m) {
          const nlohmann::json& times = timed[m] = measure(m);
          std::vector<std::pair<gemm::Strategy, double>> us;
          for (const auto& [name, value] : times.items()) us.emplace_back(gemm::parse_strategy(name), value.get<double>());
          return gemm::fastest_strategy(us, activations, m, {}, options.min_gain);
        });
      } else {
        for (int64_t m : m_values) timed[m] = measure(m);
      }
      for (const auto& [m, times] : timed)  // in increasing M, as from_timings reads them
        out["timings"].push_back({{"shape", shape.name}, {"n", shape.n}, {"k", shape.k}, {"group", shape.group},
                                  {"activations", activations}, {"m", m}, {"us", times}});
    }
  }
  cuda::stream_synchronize(stream);
  cuda::destroy_stream(stream);
  gemm::PolicyMap map = gemm::PolicyMap::from_timings(out.dump(), {}, options.min_gain, "tune");
  map.gpu = cuda::device_name();
  // Each point's pick, for the record.
  for (auto& point : out["timings"])
    point["best"] = gemm::strategy_name(map.lookup(point["activations"].get<std::string>(), point["n"].get<int64_t>(),
                                                   point["k"].get<int64_t>(), point["m"].get<int64_t>()));
  return map;
}

}  // namespace qspec
