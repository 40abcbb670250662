#include "model/cuda/gemm_dispatch.h"

#include <algorithm>
#include <map>
#include <set>

#include "qspec/error.h"

namespace qspec {

std::string_view W4GemmInput::activations() const {
  return quantized == nullptr ? std::string_view("f16") : quant::format_name(quantized->format);
}

void run_w4_gemm(gemm::Strategy strategy, const cuda::Blas& blas, const W4GemmInput& x, int64_t m,
                 const cuda::W4A16Weights& w, cuda::f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes,
                 void* stream) {
  using gemm::Strategy;
  QSPEC_CHECK(gemm::strategy_supports(strategy, x.activations()), "GEMM dispatch: strategy ",
              gemm::strategy_name(strategy), " does not run ", x.activations(), " activations");
  if (strategy == Strategy::dequant_cublas &&
      workspace_bytes < cuda::w4a16_workspace_bytes(m, w.n, w.k, cuda::W4A16Path::dequant_cublas))
    strategy = Strategy::tiled_256x64;
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
    case Strategy::tiled_256x64:
    case Strategy::tiled_128x64:
    case Strategy::tiled_256x32:
    case Strategy::tiled_128x128: {
      const cuda::W4A16TiledConfig config{static_cast<int>(strategy) - static_cast<int>(Strategy::tiled_256x64) + 1, 0};
      if (x.quantized) cuda::w4_quantized_gemm_tiled(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream, config);
      else cuda::w4a16_gemm_tiled(x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream, config);
      return;
    }
    case Strategy::dequant_cublas:
      cuda::w4a16_gemm(blas, x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream, cuda::W4A16Path::dequant_cublas);
      return;
  }
}

void dispatch_w4_gemm(const gemm::PolicyMap* policy, const cuda::Blas& blas, const W4GemmInput& x, int64_t m,
                      const cuda::W4A16Weights& w, cuda::f16_bits* y, int64_t ldy, void* workspace,
                      size_t workspace_bytes, void* stream) {
  if (policy != nullptr) {
    run_w4_gemm(policy->lookup(x.activations(), w.n, w.k, m), blas, x, m, w, y, ldy, workspace, workspace_bytes, stream);
  } else if (x.quantized) {
    cuda::w4_quantized_gemm(*x.quantized, m, w, y, ldy, workspace, workspace_bytes, stream);
  } else {
    cuda::w4a16_gemm(blas, x.x, m, x.ldx, w, y, ldy, workspace, workspace_bytes, stream);
  }
}

std::vector<int64_t> default_tune_m_values() {
  std::set<int64_t> m;
  for (int64_t i = 1; i <= 64; ++i) m.insert(i);
  for (int64_t batch = 1; batch <= 64; ++batch)
    for (int64_t gamma = 1; gamma <= 7; ++gamma)
      if (batch * (gamma + 1) <= 512) m.insert(batch * (gamma + 1));
  for (int64_t v : {768, 1024, 1536, 2048, 3072, 4096}) m.insert(v);
  return {m.begin(), m.end()};
}

gemm::PolicyMap tune_w4_policy(const TuneOptions& options, nlohmann::json* record) {
  const std::vector<int64_t> m_values = options.m_values.empty() ? default_tune_m_values() : options.m_values;
  QSPEC_CHECK(!options.shapes.empty() && !m_values.empty(), "tune: no shapes or M values");
  const int64_t max_m = *std::max_element(m_values.begin(), m_values.end());
  void* stream = cuda::create_stream();
  cuda::Blas blas;
  gemm::PolicyMap map;
  map.gpu = cuda::device_name();
  const size_t total = options.shapes.size() * options.activations.size() * m_values.size();
  size_t done = 0;
  if (record) (*record)["timings"] = nlohmann::json::array();
  for (const GemmShape4& shape : options.shapes) {
    // Random packed weights, enough copies that a round robin streams them from HBM (> 2 x L2).
    const int64_t row_blocks = (shape.n + 15) / 16;
    const size_t code_bytes = static_cast<size_t>(row_blocks * shape.k * 8);
    const size_t scale_bytes = static_cast<size_t>(row_blocks * (shape.k / shape.group) * 16) * 2;
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{120} << 20) / (code_bytes + scale_bytes) + 1, 1, 16));
    std::vector<cuda::DeviceMemory> codes, scales;
    std::vector<cuda::W4A16Weights> views;
    for (int c = 0; c < copies; ++c) {
      codes.emplace_back(code_bytes);
      scales.emplace_back(scale_bytes);
      cuda::fill_random_u32(codes.back().as<uint32_t>(), code_bytes / 4, 100 + c, stream);
      cuda::fill_random_f16(scales.back().as<cuda::f16_bits>(), scale_bytes / 2, 0.001f, 0.002f, 200 + c, stream);
      views.push_back({codes.back().get(), scales.back().get(), shape.n, shape.k, shape.group});
    }
    cuda::DeviceMemory x(static_cast<size_t>(max_m * shape.k) * 2), y(static_cast<size_t>(max_m * shape.n) * 2);
    cuda::fill_random_f16(x.as<cuda::f16_bits>(), static_cast<size_t>(max_m * shape.k), -1.0f, 1.0f, 9, stream);
    const int64_t ldq = (shape.k + 15) / 16 * 16, scale_ld = std::max<int64_t>(1, shape.k / shape.group);
    cuda::DeviceMemory values(static_cast<size_t>(max_m * ldq) * 2), act_scales(static_cast<size_t>(max_m * scale_ld) * 4);
    size_t workspace_bytes = cuda::w4a16_workspace_bytes(max_m, shape.n, shape.k, cuda::W4A16Path::dequant_cublas);
    for (int64_t m : m_values)
      for (auto path : {cuda::W4A16Path::small_m, cuda::W4A16Path::tiled})
        workspace_bytes = std::max(workspace_bytes, cuda::w4a16_workspace_bytes(std::min<int64_t>(m, 64), shape.n, shape.k, path));
    cuda::DeviceMemory workspace(workspace_bytes);
    cuda::w4a16_workspace_init(workspace.get(), workspace_bytes, stream);
    for (const std::string& activations : options.activations) {
      std::vector<gemm::PolicyRange> ranges;
      for (int64_t m : m_values) {
        cuda::QuantizedActivations q;
        W4GemmInput input{x.as<cuda::f16_bits>(), shape.k, nullptr};
        if (activations != "f16") {
          q = cuda::quantize_activations(quant::parse_format(activations), shape.group, x.as<cuda::f16_bits>(), m,
                                         shape.k, shape.k, values.get(), ldq, act_scales.as<float>(), scale_ld, stream);
          input.quantized = &q;
        }
        double best_us = 0;
        gemm::Strategy best = gemm::Strategy::small_m_v1;
        nlohmann::json times = nlohmann::json::object();
        for (gemm::Strategy strategy : gemm::strategies_for(activations)) {
          if (strategy == gemm::Strategy::small_m_v3 || strategy == gemm::Strategy::small_m_v4)
            if (m > 32) continue;  // the cp.async ring kernel runs 32 tokens a launch: sliced beyond, never a win
          if ((strategy == gemm::Strategy::small_m_v1 || strategy == gemm::Strategy::small_m_v2) && m > 256) continue;
          const cuda::ReplayTimes t = cuda::time_replays(
              [&](void* s, int i) {
                run_w4_gemm(strategy, blas, input, m, views[static_cast<size_t>(i % copies)], y.as<cuda::f16_bits>(),
                            shape.n, workspace.get(), workspace_bytes, s);
              },
              std::max(copies, 4), 2, options.reps, stream);
          std::vector<float> ms = t.ms;
          std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
          const double us = 1e3 * ms[ms.size() / 2];
          times[std::string(gemm::strategy_name(strategy))] = us;
          if (best_us == 0 || us < best_us) {
            best_us = us;
            best = strategy;
          }
        }
        // Hysteresis: the rule-based default stays unless another strategy beats it by more than
        // options.min_gain (isolated timings within a few percent flip between runs, and a GEMM inside
        // a decode step overlaps its neighbours, which the isolated timing does not see).
        const gemm::Strategy rule = gemm::rule_based_strategy(activations, m);
        const std::string rule_name(gemm::strategy_name(rule));
        if (best != rule && times.contains(rule_name) && times[rule_name].get<double>() <= best_us * (1.0 + options.min_gain))
          best = rule;
        if (!ranges.empty() && ranges.back().strategy == best) ranges.back().max_m = m;
        else ranges.push_back({m, best});
        if (record)
          (*record)["timings"].push_back({{"shape", shape.name}, {"n", shape.n}, {"k", shape.k}, {"activations", activations},
                                          {"m", m}, {"us", times}, {"best", gemm::strategy_name(best)}});
        if (options.progress) options.progress(++done, total);
      }
      map.set(activations, shape.n, shape.k, shape.group, std::move(ranges));
    }
  }
  cuda::stream_synchronize(stream);
  cuda::destroy_stream(stream);
  return map;
}

}  // namespace qspec
