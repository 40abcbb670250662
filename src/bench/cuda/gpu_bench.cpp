#include "bench/cuda/gpu_bench.h"

#include <algorithm>
#include <numeric>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string_view>

#include "base/thread_pool.h"
#include "bench/replay.h"
#include "gemm/cuda/gemm_dispatch.h"
#include "model/cuda/llama_gpu.h"
#include "model/llama.h"
#include "ops/cuda/ops.h"
#include "ops/cuda/synthetic_w4a16.h"
#include "qspec/error.h"
#include "ops/sample.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/draft_mode.h"

namespace qspec {
namespace {

using cuda::DeviceMemory;
using cuda::f16_bits;

double median(std::vector<double> values) {
  QSPEC_CHECK(!values.empty(), "bench: no samples");
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double median_ms(const cuda::ReplayTimes& times) {
  return median(std::vector<double>(times.ms.begin(), times.ms.end()));
}

struct Ceilings {
  double copy_bytes_per_s = 0;  // bytes read + written
  double gemm_flops_per_s = 0;  // cuBLAS f16, f32 accumulation, 8192^3
};

Ceilings measure_ceilings(void* stream) {
  Ceilings ceilings;
  const size_t bytes = size_t{1} << 30;
  DeviceMemory source(bytes), destination(bytes);
  cuda::fill_random_u32(source.as<uint32_t>(), bytes / 4, 3, stream);
  const double copy_ms =
      median_ms(cuda::time_replays([&](void* s, int) { cuda::copy_kernel(destination.get(), source.get(), bytes, s); },
                                   4, 2, 10, stream));
  ceilings.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e-3);
  const int64_t n = 8192;
  DeviceMemory a(static_cast<size_t>(n * n) * 2), b(static_cast<size_t>(n * n) * 2), c(static_cast<size_t>(n * n) * 2);
  cuda::fill_random_f16(a.as<f16_bits>(), static_cast<size_t>(n * n), -1.0f, 1.0f, 4, stream);
  cuda::fill_random_f16(b.as<f16_bits>(), static_cast<size_t>(n * n), -1.0f, 1.0f, 5, stream);
  cuda::Blas blas;
  const double gemm_ms = median_ms(cuda::time_replays(
      [&](void* s, int) {
        cuda::linear_w16(blas, a.as<uint16_t>(), n, n, b.as<uint16_t>(), n, c.as<uint16_t>(), cuda::Dtype16::f16, s,
                         cuda::W16Kernel::cublas);
      },
      2, 2, 10, stream));
  ceilings.gemm_flops_per_s = 2.0 * static_cast<double>(n) * n * n / (gemm_ms * 1e-3);
  return ceilings;
}

// The projections of one layer and the lm_head, as (n, k) GEMM shapes (fused q|k|v, gate|up).
struct GemmShape {
  const char* name;
  int64_t n, k;
  int64_t per_step;  // how many a forward pass runs (layers, or 1 for the lm_head)
  bool quantizable;  // the lm_head stays f16
};

std::vector<GemmShape> step_gemms(const ModelConfig& c) {
  return {{"qkv", c.q_dim() + 2 * c.kv_dim(), c.hidden_size, c.num_layers, true},
          {"o", c.hidden_size, c.q_dim(), c.num_layers, true},
          {"gate_up", 2 * c.intermediate_size, c.hidden_size, c.num_layers, true},
          {"down", c.hidden_size, c.intermediate_size, c.num_layers, true},
          {"lm_head", c.vocab_size, c.hidden_size, 1, false}};
}

// The workspace a 4-bit GEMM of m tokens may take on the path the dispatcher picks, or on the
// small-M path (at most 64 tokens a launch).
size_t w4_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return std::max(cuda::w4a16_workspace_bytes(m, n, k),
                  cuda::w4a16_workspace_bytes(std::min<int64_t>(m, 64), n, k, cuda::W4A16Path::small_m));
}

// gate_up with SwiGLU in its epilogue alone (the dispatcher's kernel without a map, where it has
// one: w4_gemm_swiglu_epilogue), as gemm_sum_ms times the GEMM, and the plain GEMM again on the
// same weights right after it (plain_us: the pair measured alike, so their ratio is fair):
// {us, plain_us, kernel}; not in the sum (the step runs it where the model fuses,
// docs/perf-journal/perf-notes-journal-2026.md). {"kernel": "none"} where it has none. views: gemm_sum_ms's weight copies.
nlohmann::json gate_up_swiglu_us(const GemmShape& shape, int64_t m, const f16_bits* x,
                                 const std::vector<cuda::W4A16Weights>& views, void* stream) {
  const int copies = static_cast<int>(views.size());
  const size_t workspace_bytes = w4_gemm_workspace_bytes(m, shape.n, shape.k);
  DeviceMemory workspace(workspace_bytes);
  cuda::w4a16_workspace_init(workspace.get(), workspace_bytes, stream);
  const SwigluGemm plan = w4_gemm_swiglu_epilogue(nullptr, views[0], m, workspace.get(), workspace_bytes);
  if (plan.kernel == SwigluGemm::Kernel::none) return {{"kernel", "none"}};
  DeviceMemory act(static_cast<size_t>(m * shape.n / 2) * 2), y(static_cast<size_t>(m * shape.n) * 2);
  const double ms = median_ms(cuda::time_replays(
      [&](void* s, int i) {
        run_w4_gemm_swiglu(plan, x, m, shape.k, views[static_cast<size_t>(i % copies)], act.as<f16_bits>(), shape.n / 2,
                           workspace.get(), workspace_bytes, s);
      },
      std::max(10, copies), 3, 10, stream));
  cuda::Blas blas;
  const double plain_ms = median_ms(cuda::time_replays(
      [&](void* s, int i) {
        cuda::w4a16_gemm(blas, x, m, shape.k, views[static_cast<size_t>(i % copies)], y.as<f16_bits>(), shape.n,
                         workspace.get(), workspace_bytes, s);
      },
      std::max(10, copies), 3, 10, stream));
  return {{"us", ms * 1e3},
          {"plain_us", plain_ms * 1e3},
          {"kernel", plan.kernel == SwigluGemm::Kernel::preload ? "preload" : "tiled"},
          {"weight_copies", copies}};
}

// Each GEMM of a step alone (graph replays), summed over the step: the baseline a forward pass
// is compared with (everything else it does, and the gaps between kernels, is the difference).
// Quantized activations (w4a8, w4a4-*, w4a8-fp8): each GEMM with its activation quantization,
// as the model runs it. As in the step, every launch streams its weights from device memory:
// the replays go round-robin over enough copies to cover 3x the L2 cache (one copy of a 33.5 MB
// f16 o projection replayed alone stays in the H100's 50 MB L2 and took 8-10 us instead of
// 14-16; qspec_gpu_bench's method).
double gemm_sum_ms(const ModelConfig& c, const RunMode& mode, int64_t m, quant::Format format, int64_t group, void* stream,
                   nlohmann::json& detail) {
  const bool quantized = mode.quantized_weights;
  const bool low_precision = mode.activations.kind == ActivationMode::Kind::quantized;
  cuda::Blas blas;
  double total = 0;
  for (const GemmShape& shape : step_gemms(c)) {
    const bool w4 = quantized && shape.quantizable;
    DeviceMemory x(static_cast<size_t>(m * shape.k) * 2), y(static_cast<size_t>(m * shape.n) * 2);
    cuda::fill_random_f16(x.as<f16_bits>(), static_cast<size_t>(m * shape.k), -1.0f, 1.0f, 9, stream);
    double ms = 0;
    int copies = 1;
    if (w4) {
      // Random weights in the benched format and group (the synthetic model's recipe), streamed.
      const cuda::SyntheticW4A16Copies weights =
          cuda::make_synthetic_w4a16_copies(shape.n, shape.k, group, format, 0.001f, 0.002f, 10, stream);
      const std::vector<cuda::W4A16Weights>& views = weights.views;
      copies = static_cast<int>(views.size());
      const size_t workspace_bytes = w4_gemm_workspace_bytes(m, shape.n, shape.k);
      DeviceMemory workspace(workspace_bytes);
      cuda::w4a16_workspace_init(workspace.get(), workspace_bytes, stream);
      const int64_t ldq = (shape.k + 15) / 16 * 16, act_group = mode.activations.group_size;
      const int64_t scale_ld = std::max<int64_t>(1, shape.k / act_group);
      DeviceMemory values(static_cast<size_t>(m * ldq) * 2), act_scales(static_cast<size_t>(m * scale_ld) * 4);
      ms = median_ms(cuda::time_replays(
          [&](void* s, int i) {
            const cuda::W4A16Weights& view = views[static_cast<size_t>(i % copies)];
            if (low_precision) {
              const cuda::QuantizedActivations xq =
                  cuda::quantize_activations(mode.activations.format, act_group, x.as<f16_bits>(), m, shape.k, shape.k,
                                             values.get(), ldq, act_scales.as<float>(), scale_ld, s);
              // The dispatcher, as the model calls it (zero-point weights: the kernels, then their term).
              dispatch_w4_gemm(nullptr, blas, W4GemmInput{nullptr, 0, &xq}, m, view, y.as<f16_bits>(), shape.n,
                               workspace.get(), workspace_bytes, s);
            } else {
              cuda::w4a16_gemm(blas, x.as<f16_bits>(), m, shape.k, view, y.as<f16_bits>(), shape.n, workspace.get(),
                               workspace_bytes, s);
            }
          },
          std::max(10, copies), 3, 10, stream));
      if (!low_precision && std::string_view(shape.name) == "gate_up")
        detail["gate_up_swiglu"] = gate_up_swiglu_us(shape, m, x.as<f16_bits>(), views, stream);
    } else {
      const size_t weight_bytes = static_cast<size_t>(shape.n * shape.k) * 2;
      copies = cuda::weight_copies_beyond_l2(weight_bytes);
      std::vector<DeviceMemory> weights;
      for (int i = 0; i < copies; ++i) {
        weights.emplace_back(weight_bytes);
        cuda::fill_random_f16(weights.back().as<f16_bits>(), weight_bytes / 2, -0.03f, 0.03f, 12 + i, stream);
      }
      // W16A16: cuBLAS's own GEMMs (the baseline for the step); W4A16's f16 lm_head: as
      // the model runs it.
      const cuda::W16Kernel kernel = quantized ? cuda::W16Kernel::automatic : cuda::W16Kernel::cublas;
      ms = median_ms(cuda::time_replays(
          [&](void* s, int i) {
            cuda::linear_w16(blas, x.as<uint16_t>(), m, shape.k, weights[static_cast<size_t>(i % copies)].as<uint16_t>(),
                             shape.n, y.as<uint16_t>(), cuda::Dtype16::f16, s, kernel);
          },
          std::max(10, copies), 3, 10, stream));
    }
    detail[shape.name] = {{"us", ms * 1e3}, {"per_step", shape.per_step}, {"w4", w4}, {"weight_copies", copies}};
    total += ms * static_cast<double>(shape.per_step);
  }
  return total;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// QSpec cycles on a W4A16 model: per draft mode, batch and gamma, `steps` cycles of gamma draft
// steps (decode graphs, the draft mode's activations) and one W4A16 verify step over gamma + 1 tokens a sequence,
// each sequence reset to options.context first (the decode table's context). They run through the
// engine's own GPU backend (runtime/cuda/cuda_backend.h: the calls the engine makes, inputs,
// launch, ids back, sync), host-timed, medians per phase.
// Accepted-length histograms of a real QSpec run (GpuBenchOptions::accept_trace), summed per
// (draft, gamma) over its results with KV overwrite on.
struct AcceptTrace {
  std::string source, model;
  std::map<std::pair<std::string, int64_t>, std::vector<int64_t>> histograms;

  static AcceptTrace load(const std::string& path) {
    AcceptTrace trace;
    trace.source = path;
    std::ifstream file(path);
    QSPEC_CHECK(file.good(), "bench: cannot read --accept-trace ", path);
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(file);
    } catch (const nlohmann::json::exception& e) {
      fail("bench: --accept-trace ", path, " is not JSON: ", e.what());
    }
    QSPEC_CHECK(saved.is_object() && saved.contains("results") && saved["results"].is_array(), "bench: --accept-trace ",
                path, ": expected a `qspec eval qspec` result (an object with a results array)");
    trace.model = saved.value("model", std::string("?"));
    for (const auto& r : saved["results"]) {
      QSPEC_CHECK(r.contains("draft") && r.contains("gamma") && r.contains("accepted_histogram"), "bench: --accept-trace ",
                  path, ": a result without draft, gamma or accepted_histogram");
      if (!r.value("kv_overwrite", true)) continue;
      std::vector<int64_t>& sum = trace.histograms[{r["draft"].get<std::string>(), r["gamma"].get<int64_t>()}];
      const auto histogram = r["accepted_histogram"].get<std::vector<int64_t>>();
      if (sum.size() < histogram.size()) sum.resize(histogram.size(), 0);
      for (size_t i = 0; i < histogram.size(); ++i) sum[i] += histogram[i];
    }
    return trace;
  }
  // Mean accepted drafts + 1 (the verify's own token) over the recorded cycles; 0 if none.
  double tokens_per_cycle(const std::string& draft, int64_t gamma, int64_t* cycles) const {
    const auto it = histograms.find({draft, gamma});
    *cycles = 0;
    if (it == histograms.end()) return 0.0;
    double tokens = 0;
    for (size_t i = 0; i < it->second.size(); ++i) {
      *cycles += it->second[i];
      tokens += static_cast<double>(it->second[i]) * static_cast<double>(i + 1);
    }
    return *cycles > 0 ? tokens / static_cast<double>(*cycles) : 0.0;
  }
};

// A --qspec-drafts entry (set_draft_spec's "MODE" or "MODE@WINDOW[+SINKS]", each with an optional
// "/vN" vocabulary subset) as the run mode the
// engine gives its draft passes; the plan's rules checked as a request's are.
RunMode bench_draft_mode(const std::string& spec) {
  DecodePlan plan;
  plan.mode = std::string(decode_rules::kQSpecMode);
  try {
    set_draft_spec(plan, spec);
    validate(plan, "bench: --qspec-drafts ");
  } catch (const DecodePlanError& e) {
    fail(e.what());
  }
  QSPEC_CHECK(!plan.ngram_draft(), "bench: --qspec-drafts ngram: n-gram drafts need real text (time them with "
              "`qspec eval qspec --device cuda`)");
  QSPEC_CHECK(plan.draft_skip == 0, "bench: --qspec-drafts ", spec, ": layer skipping drafts run on the CPU only "
              "(the GPU model runs every layer)");
  return with_draft_diets(parse_run_mode(plan.draft), plan);
}

// A draft of --qspec-drafts checked against the bench's cache (a /k4 draft needs --kv-cache int8).
RunMode bench_draft_mode(const std::string& spec, KvCacheFormat kv_cache) {
  const RunMode mode = bench_draft_mode(spec);
  check_draft_kv_cache(mode, kv_cache);
  return mode;
}

nlohmann::json run_qspec_cycles(const GpuBenchOptions& options, GpuLlama& gpu, const ModelConfig& config,
                                const nlohmann::json& decode_rows, const Ceilings& ceilings) {
  nlohmann::json out = nlohmann::json::array();
  std::optional<AcceptTrace> trace;
  if (!options.accept_trace.empty()) trace = AcceptTrace::load(options.accept_trace);
  const RunMode verify_mode = parse_run_mode(std::string(decode_rules::kVerifyMode));
  const std::unique_ptr<Backend> backend = make_cuda_backend(gpu, verify_mode);
  for (const std::string& draft_spelling : options.qspec_drafts) {
    const RunMode draft_mode = bench_draft_mode(draft_spelling, options.kv_cache);
    if (draft_mode.vocab_subset > 0) {
      // Random weights have no token frequencies: the first N ids stand for the table's N most
      // frequent (the speed is the same; only N rows are read).
      QSPEC_CHECK(draft_mode.vocab_subset <= config.vocab_size, "bench: --qspec-drafts ", draft_spelling,
                  ": a subset of ", draft_mode.vocab_subset, " ids exceeds the vocabulary (", config.vocab_size, ")");
      std::vector<int32_t> ids(static_cast<size_t>(draft_mode.vocab_subset));
      std::iota(ids.begin(), ids.end(), 0);
      gpu.set_draft_vocab(ids);
    }
    // The canonical spelling (w4a16@256 -> w4a16@256+16): records and trace lookups name it so,
    // as `eval qspec` does.
    DecodePlan spelled;
    set_draft_spec(spelled, draft_spelling);
    const std::string draft_name = draft_spec(spelled);
    const double alpha = options.accept_rate;
    if (trace)
      std::printf("\nQSpec cycles: %s drafts + W4A16 verify; tokens per cycle replayed from the accepted lengths of "
                  "%s (model %s; random weights have no acceptance of their own)\n",
                  draft_name.c_str(), trace->source.c_str(), trace->model.c_str());
    else
      std::printf("\nQSpec cycles: %s drafts + W4A16 verify; %s\naccept rate %.3f\n", draft_name.c_str(),
                  alpha >= 1.0 ? "every draft accepted (upper bound: random weights have no real acceptance)"
                               : "tokens per cycle from --accept-rate (random weights have no real acceptance)",
                  alpha);
    std::printf("roofline: weights once per pass (+ K/V), over the copy bandwidth\n");
    std::printf("cycle ms: drafts step by step (a host read each) + verify; chained: the engine's cycle (gamma >= 2:\n"
                "drafts chained on the device, verified from there, one host read), which tokens/s uses\n");
    std::printf("%6s %6s %10s %10s %10s %10s %8s %10s %12s %12s %9s %9s\n", "batch", "gamma", "draft ms", "verify ms",
                "cycle ms", "chained ms", "draft%", "tok/cycle", "tokens/s", "w4a16 tok/s", "speed-up", "verify/roof");
    for (int64_t batch : options.batch_sizes) {
      double w4a16_step_ms = 0;
      for (const auto& row : decode_rows)
        if (row["batch"].get<int64_t>() == batch) w4a16_step_ms = row["step_ms"].get<double>();
      for (int64_t gamma : options.qspec_gammas) {
        // Expected tokens a cycle: accepted prefix + the verify's token: recorded, or sum of alpha^i
        // for i <= gamma.
        double tokens_per_cycle = 0;
        int64_t trace_cycles = 0;
        if (trace) {
          tokens_per_cycle = trace->tokens_per_cycle(draft_name, gamma, &trace_cycles);
          if (trace_cycles == 0) {
            std::printf("%6lld %6lld   (no %s cycles at gamma %lld in the trace: not timed)\n",
                        static_cast<long long>(batch), static_cast<long long>(gamma), draft_name.c_str(),
                        static_cast<long long>(gamma));
            continue;
          }
        } else {
          for (int64_t i = 0; i <= gamma; ++i) tokens_per_cycle += std::pow(alpha, static_cast<double>(i));
        }
        // The engine's cycle, through its GPU backend (runtime/backend.h): sequence s + 1 of the
        // passes is GPU sequence s, each cycle from options.context cached positions.
        std::vector<int32_t> draft_tokens(static_cast<size_t>(batch)), verify_tokens(static_cast<size_t>(batch * (gamma + 1)));
        for (size_t i = 0; i < verify_tokens.size(); ++i) verify_tokens[i] = static_cast<int32_t>((700 + 13 * i) % config.vocab_size);
        std::vector<PassRun> draft_runs(static_cast<size_t>(batch)), verify_runs(static_cast<size_t>(batch));
        for (int64_t s = 0; s < batch; ++s) {
          draft_tokens[static_cast<size_t>(s)] = verify_tokens[static_cast<size_t>(s * (gamma + 1))];
          draft_runs[static_cast<size_t>(s)] = PassRun{static_cast<uint64_t>(s + 1), options.context,
                                                       std::span<const int32_t>(&draft_tokens[static_cast<size_t>(s)], 1)};
          verify_runs[static_cast<size_t>(s)] = PassRun{
              static_cast<uint64_t>(s + 1), options.context,
              std::span<const int32_t>(verify_tokens.data() + s * (gamma + 1), static_cast<size_t>(gamma + 1)), {},
              PassRun::Output::all};
        }
        std::vector<double> draft_seconds, verify_seconds, chained_seconds;
        // The engine's cycle (gamma >= 2): the drafts chained on the device, verified from there,
        // one host read. Timed as a whole, beside the step-by-step cycle (a host read a draft).
        std::vector<PassRun> chained_verify = verify_runs;
        const bool chained = gamma >= 2 && gamma <= decode_rules::kMaxGamma;
        for (int64_t i = 0; i < options.steps / 4 + 3; ++i) {
          if (chained) {
            const auto chain_start = std::chrono::steady_clock::now();
            backend->begin_step();
            const std::optional<int64_t> offset = backend->draft_chain(draft_mode, draft_runs, gamma);
            QSPEC_CHECK(offset.has_value(), "bench: the GPU backend did not chain ", gamma, " drafts");
            for (int64_t s = 0; s < batch; ++s) {
              chained_verify[static_cast<size_t>(s)].chain_offset = *offset + s;
              chained_verify[static_cast<size_t>(s)].chain_stride = batch;
            }
            backend->forward(verify_mode, chained_verify);
            if (i >= 3) chained_seconds.push_back(seconds_since(chain_start));
          }
          auto start = std::chrono::steady_clock::now();
          for (int64_t d = 0; d < gamma; ++d) {
            for (int64_t s = 0; s < batch; ++s) draft_runs[static_cast<size_t>(s)].base = options.context + d;
            const PassResult pass = backend->forward(draft_mode, draft_runs);
            for (int64_t s = 0; s < batch; ++s) draft_tokens[static_cast<size_t>(s)] = pass.ids[static_cast<size_t>(s)];
          }
          const double draft = seconds_since(start);
          for (int64_t s = 0; s < batch; ++s) draft_runs[static_cast<size_t>(s)].base = options.context;
          start = std::chrono::steady_clock::now();
          backend->forward(verify_mode, verify_runs);
          const double verify = seconds_since(start);
          if (i >= 3) {  // the first cycles capture graphs
            draft_seconds.push_back(draft);
            verify_seconds.push_back(verify);
          }
        }
        const double draft_ms = median(draft_seconds) * 1e3, verify_ms = median(verify_seconds) * 1e3;
        const double cycle_ms = draft_ms + verify_ms;
        const double chained_cycle_ms = chained ? median(chained_seconds) * 1e3 : cycle_ms;
        const double tokens_per_second = static_cast<double>(batch) * tokens_per_cycle / (chained_cycle_ms * 1e-3);
        const double w4a16_tps = w4a16_step_ms > 0 ? static_cast<double>(batch) / (w4a16_step_ms * 1e-3) : 0;
        const double context = static_cast<double>(options.context) + static_cast<double>(gamma);
        const double verify_floor_ms = (static_cast<double>(gpu.weight_bytes()) +
                                        static_cast<double>(batch) * context * static_cast<double>(gpu.kv_bytes_per_position())) /
                                       ceilings.copy_bytes_per_s * 1e3;
        std::printf("%6lld %6lld %10.3f %10.3f %10.3f %10.3f %7.1f%% %10.2f %12.0f %12.0f %8.3fx %8.1f%%\n",
                    static_cast<long long>(batch), static_cast<long long>(gamma), draft_ms, verify_ms, cycle_ms,
                    chained_cycle_ms, 100.0 * draft_ms / cycle_ms, tokens_per_cycle, tokens_per_second, w4a16_tps,
                    w4a16_tps > 0 ? tokens_per_second / w4a16_tps : 0.0, 100.0 * verify_floor_ms / verify_ms);
        out.push_back({{"draft", draft_name},
                       {"batch", batch},
                       {"gamma", gamma},
                       {"accept_rate", trace ? nlohmann::json() : nlohmann::json(alpha)},
                       {"accept_trace", trace ? nlohmann::json(trace->source) : nlohmann::json()},
                       {"trace_cycles", trace_cycles},
                       {"draft_ms", draft_ms},
                       {"draft_step_ms", draft_ms / static_cast<double>(gamma)},
                       {"verify_ms", verify_ms},
                       {"cycle_ms", cycle_ms},
                       {"step_by_step_cycle_ms", cycle_ms},
                       {"chained_cycle_ms", chained ? nlohmann::json(chained_cycle_ms) : nlohmann::json()},
                       {"tokens_per_second_step_by_step", static_cast<double>(batch) * tokens_per_cycle / (cycle_ms * 1e-3)},
                       {"tokens_per_cycle", tokens_per_cycle},
                       {"tokens_per_second", tokens_per_second},
                       {"w4a16_tokens_per_second", w4a16_tps},
                       {"speedup_vs_w4a16", w4a16_tps > 0 ? tokens_per_second / w4a16_tps : 0.0},
                       {"verify_memory_floor_ms", verify_floor_ms}});
      }
    }
  }
  gpu.set_activations(GpuActivations::f16);
  gpu.set_kv_view(0, 0);
  gpu.set_vocab_subset(0);
  return out;
}

// Multiply-adds of the weights per token (the embedding is a gather, not a GEMM).
double gemm_flops_per_token(const ModelConfig& c) {
  double total = 0;
  for (const GemmShape& shape : step_gemms(c))
    total += 2.0 * static_cast<double>(shape.n) * static_cast<double>(shape.k) * static_cast<double>(shape.per_step);
  return total;
}

// Whether a run of `mode` steps with ARC activations: an ARC mode, or w4a16 verifying ARC drafts.
bool runs_arc_activations(const GpuBenchOptions& options, const RunMode& mode) {
  if (mode.activations.arc) return true;
  if (options.qspec_gammas.empty() || mode.name != "w4a16") return false;
  return std::any_of(options.qspec_drafts.begin(), options.qspec_drafts.end(),
                     [](const std::string& draft) { return bench_draft_mode(draft).activations.arc; });
}

std::unique_ptr<GpuLlama> make_model(const GpuBenchOptions& options, const LlamaModel* checkpoint,
                                     const ModelConfig& config, const RunMode& mode, GpuLlamaOptions gpu_options) {
  if (!options.gemm_policy.empty())
    gpu_options.gemm_policy = std::make_shared<const gemm::PolicyMap>(gemm::PolicyMap::load(options.gemm_policy));
  if (checkpoint != nullptr) return std::make_unique<GpuLlama>(*checkpoint, mode, gpu_options);
  gpu_options.synthetic_weights = options.synthetic_weights;
  gpu_options.synthetic_group = options.synthetic_group;
  gpu_options.kv_cache = options.kv_cache;
  if (runs_arc_activations(options, mode)) {
    QSPEC_CHECK(options.synthetic_arc_channels > 0, "bench: ", mode.name,
                " on a synthetic model needs --synthetic-arc-channels > 0 (the residual channels a site)");
    gpu_options.synthetic_arc_channels = options.synthetic_arc_channels;
  }
  return GpuLlama::synthetic(config, mode, gpu_options, 1);
}

// One decode token for each of `batch` sequences, sequence s feeding (1000 + 17 s) % vocab: the
// runs a decode-step benchmark steps. Not copyable: the runs point into `tokens`.
struct DecodeBatch {
  std::vector<int32_t> tokens;
  std::vector<GpuLlama::Run> runs;
  DecodeBatch(const ModelConfig& config, int64_t batch)
      : tokens(static_cast<size_t>(batch)), runs(static_cast<size_t>(batch)) {
    for (int64_t s = 0; s < batch; ++s) {
      tokens[static_cast<size_t>(s)] = static_cast<int32_t>((1000 + 17 * s) % config.vocab_size);
      runs[static_cast<size_t>(s)] = {s, std::span<const int32_t>(&tokens[static_cast<size_t>(s)], 1)};
    }
  }
  DecodeBatch(const DecodeBatch&) = delete;
  DecodeBatch& operator=(const DecodeBatch&) = delete;
};

// The B tokens of the decode step just run, drawn with sampling filters: on the GPU
// (GpuLlama::sample_rows, only ids come back) against the engine's host path (every logit row
// copied back as f32, Sampler::sample per row on the thread pool). Median of `reps` each; the
// GPU's floor is one read of the rows (B x vocab f16) at the copy bandwidth.
nlohmann::json time_sampling(GpuLlama& gpu, const ModelConfig& config, int64_t batch, double copy_bytes_per_s,
                             int reps) {
  struct Setting {
    const char* name;
    SamplingParams params;
  };
  const std::vector<Setting> settings = {
      {"T=1", {.temperature = 1.0f}},
      {"T=0.8 top_k=40 top_p=0.95", {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f}},
      {"T=0.7 top_p=0.9 min_p=0.05 rep=1.1", {.temperature = 0.7f, .top_p = 0.9f, .min_p = 0.05f, .repetition_penalty = 1.1f}},
  };
  const int64_t vocab = config.vocab_size;
  std::vector<int32_t> history(256);
  for (size_t i = 0; i < history.size(); ++i) history[i] = static_cast<int32_t>((7919 * i) % static_cast<size_t>(vocab));
  nlohmann::json out = nlohmann::json::array();
  for (const Setting& setting : settings) {
    std::vector<Sampler> samplers(static_cast<size_t>(batch), Sampler(setting.params));
    std::vector<GpuLlama::RowSample> rows(static_cast<size_t>(batch));
    std::vector<double> host_s, device_s;
    for (int rep = 0; rep < reps + 1; ++rep) {
      auto start = std::chrono::steady_clock::now();
      const std::vector<float> logits = gpu.step_logits();
      std::vector<int32_t> ids(static_cast<size_t>(batch));
      ThreadPool::global().parallel_for(static_cast<size_t>(batch), 1, [&](size_t begin, size_t end) {
        for (size_t r = begin; r < end; ++r)
          ids[r] = samplers[r].sample(std::span<const float>(logits.data() + r * vocab, static_cast<size_t>(vocab)), history);
      });
      if (rep > 0) host_s.push_back(seconds_since(start));
      for (int64_t r = 0; r < batch; ++r) {
        GpuLlama::RowSample& row = rows[static_cast<size_t>(r)];
        row.row = r;
        row.params = setting.params;
        row.draw = samplers[static_cast<size_t>(r)].next_draw();
        row.penalised_ids = history;
      }
      start = std::chrono::steady_clock::now();
      gpu.sample_rows(rows);
      if (rep > 0) device_s.push_back(seconds_since(start));
    }
    const double host_ms = median(host_s) * 1e3, device_ms = median(device_s) * 1e3;
    const double floor_ms = static_cast<double>(batch * vocab * 2) / copy_bytes_per_s * 1e3;
    std::printf("%6lld  %-36s %10.3f %10.3f %8.1fx %10.4f %8.1f%%\n", static_cast<long long>(batch), setting.name,
                host_ms, device_ms, host_ms / device_ms, floor_ms, 100.0 * floor_ms / device_ms);
    out.push_back({{"batch", batch},
                   {"setting", setting.name},
                   {"host_ms", host_ms},
                   {"gpu_ms", device_ms},
                   {"speedup", host_ms / device_ms},
                   {"gpu_floor_ms", floor_ms},
                   {"gpu_roofline_fraction", floor_ms / device_ms}});
  }
  return out;
}

// Median milliseconds of `steps` decode steps of `batch` sequences at `context` positions (after
// three warm-up steps, the first of which captures the graph).
double decode_step_ms(GpuLlama& gpu, const ModelConfig& config, int64_t batch, int64_t context, int64_t steps) {
  const DecodeBatch decode(config, batch);
  const std::vector<GpuLlama::Run>& runs = decode.runs;
  for (int64_t s = 0; s < batch; ++s) gpu.truncate(s, context);
  for (int w = 0; w < 3; ++w) gpu.step(runs);
  for (int64_t s = 0; s < batch; ++s) gpu.truncate(s, context);
  std::vector<double> step_seconds;
  for (int64_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    gpu.step(runs);
    step_seconds.push_back(seconds_since(start));
  }
  return median(step_seconds) * 1e3;
}

// Median milliseconds of a prefill of `prompt` into slot 0 (four runs, the first a warm-up).
double prefill_ms(GpuLlama& gpu, const std::vector<int32_t>& prompt) {
  std::vector<double> seconds;
  for (int repeat = 0; repeat < 4; ++repeat) {
    gpu.reset(0);
    const auto start = std::chrono::steady_clock::now();
    gpu.forward(prompt);
    if (repeat > 0) seconds.push_back(seconds_since(start));
  }
  return median(seconds) * 1e3;
}

// Random prompt ids of each length (a fixed seed: the same prompts for every policy).
std::vector<std::vector<int32_t>> random_prompts(const ModelConfig& config, const std::vector<int64_t>& lengths) {
  std::mt19937 generator(7);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t length : lengths) {
    prompts.emplace_back(static_cast<size_t>(length));
    for (int32_t& id : prompts.back()) id = token(generator);
  }
  return prompts;
}

// A policy spec of --gemm-ablation: "builtin" (null), "paper-rule", "forced:STRATEGY" or a file.
std::shared_ptr<const gemm::PolicyMap> ablation_policy(const std::string& spec) {
  if (spec == "builtin") return nullptr;
  if (spec == "paper-rule") return std::make_shared<const gemm::PolicyMap>(gemm::PolicyMap::paper_rule());
  if (spec.rfind("forced:", 0) == 0)
    return std::make_shared<const gemm::PolicyMap>(gemm::PolicyMap::forced(gemm::parse_strategy(spec.substr(7))));
  return std::make_shared<const gemm::PolicyMap>(gemm::PolicyMap::load(spec));
}

// Whether a forced strategy runs this mode's activations at all (else its column says n/a).
bool ablation_applies(const std::string& spec, const RunMode& mode) {
  if (spec.rfind("forced:", 0) != 0) return true;
  const gemm::Strategy strategy = gemm::parse_strategy(spec.substr(7));
  return gemm::strategy_supports(strategy, gemm_activations_name(mode));
}

nlohmann::json run_gemm_ablation(const GpuBenchOptions& options, const LlamaModel* checkpoint, const ModelConfig& config) {
  QSPEC_CHECK(options.ablation_repeats >= 1, "bench: --ablation-repeats must be >= 1");
  std::vector<std::shared_ptr<const gemm::PolicyMap>> policies;
  for (const std::string& spec : options.gemm_ablation) policies.push_back(ablation_policy(spec));
  const int64_t max_batch = *std::max_element(options.batch_sizes.begin(), options.batch_sizes.end());
  std::vector<int64_t> lengths;
  for (int64_t p : options.prompt_lengths)
    if (p <= config.max_position_embeddings) lengths.push_back(p);
  const int64_t longest = lengths.empty() ? 1 : *std::max_element(lengths.begin(), lengths.end());
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& mode_name : options.modes) {
    const RunMode mode = parse_run_mode(mode_name);
    QSPEC_CHECK(mode.quantized_weights, "bench --gemm-ablation: mode ", mode_name, " has no 4-bit GEMMs");
    GpuLlamaOptions gpu_options;
    gpu_options.max_seqs = max_batch;
    gpu_options.max_context = std::min<int64_t>(std::max(options.context + options.steps + 8, longest),
                                                config.max_position_embeddings);
    gpu_options.max_step_tokens = std::max<int64_t>({max_batch, longest, 16});
    gpu_options.max_logit_rows = max_batch;
    gpu_options.cuda_graphs = options.cuda_graphs;
    auto gpu = make_model(options, checkpoint, config, mode, gpu_options);
    const size_t points = options.batch_sizes.size() + lengths.size();
    // ms[policy][point]: decode step at each batch, then TTFT at each length; summed over rounds.
    std::vector<std::vector<double>> ms(policies.size(), std::vector<double>(points, 0.0));
    std::vector<std::vector<std::vector<double>>> rounds(policies.size(), std::vector<std::vector<double>>(points));
    const std::vector<std::vector<int32_t>> prompts = random_prompts(config, lengths);
    for (int round = 0; round < options.ablation_repeats; ++round)
      for (size_t i = 0; i < policies.size(); ++i) {
        const size_t p = round % 2 == 0 ? i : policies.size() - 1 - i;
        if (!ablation_applies(options.gemm_ablation[p], mode)) continue;
        gpu->set_gemm_policy(policies[p]);
        size_t point = 0;
        for (int64_t batch : options.batch_sizes) {
          rounds[p][point++].push_back(decode_step_ms(*gpu, config, batch, options.context, options.steps));
        }
        for (const std::vector<int32_t>& prompt : prompts) rounds[p][point++].push_back(prefill_ms(*gpu, prompt));
      }
    gpu->set_gemm_policy(nullptr);
    // Table: a row per point, a column per policy (ms, mean over rounds; n/a where a forced
    // strategy cannot run this mode), then the best forced strategy and each policy's ratio to it.
    std::printf("\n%s GEMM policy ablation (ms; decode step at context %lld, TTFT one prompt; mean of %d rounds)\n",
                mode_name.c_str(), static_cast<long long>(options.context), options.ablation_repeats);
    std::printf("%-12s", "point");
    for (const std::string& spec : options.gemm_ablation)
      std::printf(" %14s", spec.size() > 14 ? spec.substr(spec.size() - 14).c_str() : spec.c_str());
    std::printf(" %14s\n", "best forced");
    nlohmann::json rows = nlohmann::json::array();
    for (size_t point = 0; point < points; ++point) {
      const bool decode = point < options.batch_sizes.size();
      const int64_t value = decode ? options.batch_sizes[point] : lengths[point - options.batch_sizes.size()];
      char label[32];
      std::snprintf(label, sizeof(label), "%s %lld", decode ? "decode B" : "TTFT P", static_cast<long long>(value));
      std::printf("%-12s", label);
      nlohmann::json row = {{"kind", decode ? "decode" : "ttft"}, {decode ? "batch" : "prompt_tokens", value},
                            {"ms", nlohmann::json::object()}, {"rounds_ms", nlohmann::json::object()}};
      double best_forced = 0;
      std::string best_forced_name;
      for (size_t p = 0; p < policies.size(); ++p) {
        const std::vector<double>& r = rounds[p][point];
        if (r.empty()) {
          std::printf(" %14s", "n/a");
          continue;
        }
        double mean = 0;
        for (double v : r) mean += v / static_cast<double>(r.size());
        std::printf(" %14.3f", mean);
        row["ms"][options.gemm_ablation[p]] = mean;
        row["rounds_ms"][options.gemm_ablation[p]] = r;
        if (options.gemm_ablation[p].rfind("forced:", 0) == 0 && (best_forced == 0 || mean < best_forced)) {
          best_forced = mean;
          best_forced_name = options.gemm_ablation[p].substr(7);
        }
      }
      std::printf(" %14s\n", best_forced_name.c_str());
      if (best_forced > 0) row["best_forced"] = {{"strategy", best_forced_name}, {"ms", best_forced}};
      rows.push_back(row);
    }
    out[mode_name] = rows;
  }
  return out;
}

}  // namespace

gemm::PolicyMap refine_policy_in_steps(const gemm::PolicyMap& map, const StepRefineOptions& options,
                                       nlohmann::json* record) {
  QSPEC_CHECK(options.model_dir.empty() != options.synthetic.empty(), "tune: step refinement needs a model or --synthetic");
  QSPEC_CHECK(options.steps > 0, "tune: step refinement needs steps");
  if (options.batches.empty() && options.prompt_lengths.empty()) return map;
  std::unique_ptr<LlamaModel> checkpoint;
  ModelConfig config;
  if (!options.model_dir.empty()) {
    checkpoint = LlamaModel::load(options.model_dir);
    config = checkpoint->config();
  } else {
    config = synthetic_model_config(options.synthetic);
  }
  // Points: (M, whether a decode step); prefills longer than the model's positions or the map's
  // dense range are left out.
  std::vector<std::pair<int64_t, bool>> points;
  for (int64_t batch : options.batches) {
    QSPEC_CHECK(batch >= 1 && batch <= gemm::PolicyMap::kDenseM, "tune: refine batch ", batch, " out of range");
    points.emplace_back(batch, true);
  }
  std::vector<int64_t> lengths;
  for (int64_t length : options.prompt_lengths)
    if (length >= 1 && length <= gemm::PolicyMap::kDenseM && length <= config.max_position_embeddings) {
      points.emplace_back(length, false);
      lengths.push_back(length);
    }
  const std::vector<std::vector<int32_t>> prompts = random_prompts(config, lengths);
  const int64_t max_batch = options.batches.empty() ? 1 : *std::max_element(options.batches.begin(), options.batches.end());
  const int64_t longest = lengths.empty() ? 1 : *std::max_element(lengths.begin(), lengths.end());
  std::vector<int64_t> band_points;
  for (const auto& point : points) band_points.push_back(point.first);
  std::sort(band_points.begin(), band_points.end());
  band_points.erase(std::unique(band_points.begin(), band_points.end()), band_points.end());
  const std::vector<std::pair<int64_t, int64_t>> bands = gemm::step_refine_bands(band_points);
  gemm::PolicyMap refined = map;
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& mode_name : options.modes) {
    const RunMode mode = parse_run_mode(mode_name);
    QSPEC_CHECK(mode.quantized_weights, "tune: step refinement: mode ", mode_name, " has no 4-bit GEMMs");
    const std::string activations = gemm_activations_name(mode);
    if (checkpoint && !checkpoint->has_quantized_weights()) checkpoint->quantize_weights(quant::Format::int4);
    GpuLlamaOptions gpu_options;
    gpu_options.max_seqs = max_batch;
    gpu_options.max_context =
        std::min<int64_t>(std::max(options.context + options.steps + 8, longest), config.max_position_embeddings);
    gpu_options.max_step_tokens = std::max<int64_t>({max_batch, longest, 16});
    gpu_options.max_logit_rows = max_batch;
    std::unique_ptr<GpuLlama> gpu = checkpoint ? std::make_unique<GpuLlama>(*checkpoint, mode, gpu_options)
                                               : GpuLlama::synthetic(config, mode, gpu_options, 1);
    size_t prompt_index = 0;
    for (const auto& [m, decode] : points) {
      const std::vector<int32_t>* prompt = decode ? nullptr : &prompts[prompt_index++];
      // Candidates: the map as it stands, builtin at M, then each contender at M.
      std::vector<std::pair<std::string, std::shared_ptr<const gemm::PolicyMap>>> candidates;
      candidates.emplace_back("map", std::make_shared<const gemm::PolicyMap>(refined));
      for (gemm::Strategy strategy :
           gemm::step_contenders(record ? record->dump() : std::string(), activations, m, options.contender_slack)) {
        if (!gemm::strategy_supports(strategy, activations)) continue;
        gemm::PolicyMap candidate = refined;
        candidate.override_at(activations, m, strategy);
        candidates.emplace_back(std::string(gemm::strategy_name(strategy)), std::make_shared<const gemm::PolicyMap>(candidate));
      }
      const size_t builtin = 1;  // step_contenders puts builtin first
      std::vector<std::vector<double>> rounds_ms(gemm::kStepRefineRounds, std::vector<double>(candidates.size(), 0.0));
      for (int round = 0; round < gemm::kStepRefineRounds; ++round)
        for (size_t i = 0; i < candidates.size(); ++i) {
          const size_t c = round % 2 == 0 ? i : candidates.size() - 1 - i;
          gpu->set_gemm_policy(candidates[c].second);
          rounds_ms[static_cast<size_t>(round)][c] =
              decode ? decode_step_ms(*gpu, config, m, options.context, options.steps) : prefill_ms(*gpu, *prompt);
        }
      gpu->set_gemm_policy(nullptr);
      const std::vector<double> ms = gemm::step_refine_means(rounds_ms);
      size_t best = 0;
      for (size_t c = 1; c < ms.size(); ++c)
        if (ms[c] < ms[best]) best = c;
      const size_t chosen = gemm::step_refine_choice(rounds_ms, builtin, options.min_gain, options.builtin_margin);
      // The band of M this point answers for goes back to builtin unless the point measured a
      // departure faster: where builtin won, or where the map won while naming builtin at M
      // itself (then its departures elsewhere in the band were never in a timed step).
      const auto [band_first, band_last] = bands[static_cast<size_t>(
          std::lower_bound(band_points.begin(), band_points.end(), m) - band_points.begin())];
      const bool band_to_builtin = chosen == builtin || (chosen == 0 && !refined.departs_at(activations, m));
      const std::string taken = chosen == 0 ? "map" : candidates[chosen].first;
      if (band_to_builtin) refined.override_range(activations, band_first, band_last, gemm::Strategy::builtin);
      else if (chosen != 0) refined.override_at(activations, m, gemm::parse_strategy(taken));
      std::printf("refine %-6s %s %4lld: map %.3f ms, builtin %.3f, best %s %.3f (%zu timed) -> %s%s\n",
                  mode_name.c_str(), decode ? "B" : "P", static_cast<long long>(m), ms[0], ms[builtin],
                  candidates[best].first.c_str(), ms[best], candidates.size(), taken.c_str(),
                  band_to_builtin ? (" over M " + std::to_string(band_first) + ".." + std::to_string(band_last)).c_str() : "");
      nlohmann::json times = nlohmann::json::object();
      for (size_t c = 0; c < candidates.size(); ++c) times[candidates[c].first] = ms[c];
      results.push_back({{"mode", mode_name}, {"activations", activations}, {"kind", decode ? "decode" : "prefill"}, {"m", m}, {"step_ms", times},
                         {"rounds_ms", rounds_ms}, {"taken", taken},
                         {"band", band_to_builtin ? nlohmann::json::array({band_first, band_last}) : nlohmann::json()}});
    }
  }
  if (record) (*record)["step_refinement"] = results;
  return refined;
}

// One dataset workload at every batch size (see gpu_bench.h). Graphs for k = 1..B sequences in
// slot order are captured before the clock starts; other orders (slots freed at the tail of a
// run) are captured when first met, inside the timed run.
nlohmann::json run_workload(const GpuBenchOptions& options, const LlamaModel* checkpoint, const ModelConfig& config,
                            const RunMode& mode, const std::string& name) {
  std::ifstream file(options.workloads_file);
  QSPEC_CHECK(file.good(), options.workloads_file, ": cannot open the workloads file (tools/make_workloads.py)");
  nlohmann::json all;
  try {
    all = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    fail(options.workloads_file, ": not JSON: ", e.what());
  }
  QSPEC_CHECK(all.contains("workloads") && all["workloads"].contains(name), options.workloads_file,
              ": no workload '", name, "'");
  std::vector<std::pair<int64_t, int64_t>> requests;  // (prompt, output) tokens
  for (const auto& r : all["workloads"][name]["requests"]) requests.emplace_back(r[0].get<int64_t>(), r[1].get<int64_t>());
  QSPEC_CHECK(!requests.empty(), options.workloads_file, ": workload '", name, "' has no requests");
  const int64_t max_batch = *std::max_element(options.batch_sizes.begin(), options.batch_sizes.end());
  int64_t longest = 0, longest_prompt = 0;
  for (auto [p, o] : requests) {
    longest = std::max(longest, p + o);
    longest_prompt = std::max(longest_prompt, p);
  }
  QSPEC_CHECK(longest <= config.max_position_embeddings, "workload ", name, ": a request needs ", longest,
              " positions; the model holds ", config.max_position_embeddings);
  GpuLlamaOptions gpu_options;
  gpu_options.max_seqs = max_batch;
  gpu_options.max_context = longest;
  gpu_options.max_step_tokens = std::max(longest_prompt, max_batch);
  gpu_options.max_logit_rows = max_batch;
  gpu_options.cuda_graphs = options.cuda_graphs;
  auto gpu = make_model(options, checkpoint, config, mode, gpu_options);
  std::mt19937 generator(11);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::printf("\n%s workload %s (%s): B slots serve B x %lld requests\n", mode.name.c_str(), name.c_str(),
              all["workloads"][name].value("source", "").c_str(), static_cast<long long>(options.requests_per_slot));
  std::printf("%6s %9s %9s %10s %12s %11s %11s %12s\n", "batch", "requests", "out tok", "seconds", "out tok/s",
              "prefill s", "decode s", "mean decode B");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t batch : options.batch_sizes) {
    // Warm-up: the decode graphs of 1..B sequences in slot order at every context bucket.
    std::vector<int32_t> ones(static_cast<size_t>(batch), 1);
    for (int64_t k = 1; k <= batch; ++k)
      for (int64_t bucket = 256;; bucket *= 2) {  // GpuLlama's context buckets: 256, 512, ...
        std::vector<GpuLlama::Run> runs;
        for (int64_t s = 0; s < k; ++s) {
          gpu->truncate(s, std::min(bucket, longest) - 1);
          runs.push_back({s, std::span<const int32_t>(&ones[static_cast<size_t>(s)], 1)});
        }
        gpu->step(runs);
        if (bucket >= longest) break;
      }
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(requests.size()), batch * options.requests_per_slot);
    std::vector<int64_t> remaining(static_cast<size_t>(batch), 0);  // output tokens still to decode; 0: free
    std::vector<int32_t> next_token(static_cast<size_t>(batch), 0);
    int64_t next = 0, output_tokens = 0, decode_steps = 0, decode_rows = 0;
    double prefill_seconds = 0, decode_seconds = 0;
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      for (int64_t s = 0; s < batch && next < count; ++s) {
        if (remaining[static_cast<size_t>(s)] > 0) continue;
        const auto [prompt_tokens, out_tokens] = requests[static_cast<size_t>(next++)];
        std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
        for (int32_t& id : prompt) id = token(generator);
        gpu->truncate(s, 0);
        const GpuLlama::Run run{s, prompt};
        const auto prefill_start = std::chrono::steady_clock::now();
        next_token[static_cast<size_t>(s)] = gpu->step(std::span<const GpuLlama::Run>(&run, 1)).front();
        prefill_seconds += seconds_since(prefill_start);
        ++output_tokens;  // the prompt's step gives the first output token
        remaining[static_cast<size_t>(s)] = out_tokens - 1;
      }
      std::vector<GpuLlama::Run> runs;
      for (int64_t s = 0; s < batch; ++s)
        if (remaining[static_cast<size_t>(s)] > 0)
          runs.push_back({s, std::span<const int32_t>(&next_token[static_cast<size_t>(s)], 1)});
      if (runs.empty()) {
        if (next >= count) break;
        continue;
      }
      const auto decode_start = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = gpu->step(runs);
      decode_seconds += seconds_since(decode_start);
      ++decode_steps;
      decode_rows += static_cast<int64_t>(runs.size());
      for (size_t r = 0; r < runs.size(); ++r) {
        const auto s = static_cast<size_t>(runs[r].seq);
        next_token[s] = ids[r];
        --remaining[s];
        ++output_tokens;
      }
    }
    const double seconds = seconds_since(start);
    const double mean_batch = decode_steps > 0 ? static_cast<double>(decode_rows) / static_cast<double>(decode_steps) : 0;
    std::printf("%6lld %9lld %9lld %10.3f %12.0f %11.3f %11.3f %12.1f\n", static_cast<long long>(batch),
                static_cast<long long>(count), static_cast<long long>(output_tokens), seconds,
                static_cast<double>(output_tokens) / seconds, prefill_seconds, decode_seconds, mean_batch);
    rows.push_back({{"batch", batch},
                    {"requests", count},
                    {"output_tokens", output_tokens},
                    {"seconds", seconds},
                    {"output_tokens_per_second", static_cast<double>(output_tokens) / seconds},
                    {"prefill_seconds", prefill_seconds},
                    {"decode_seconds", decode_seconds},
                    {"decode_steps", decode_steps},
                    {"mean_decode_batch", mean_batch}});
  }
  return {{"source", all["workloads"][name].value("source", "")},
          {"length_method", "tokens = ceil(characters / " + std::to_string(all.value("chars_per_token", 4.0)) + ")"},
          {"requests_per_slot", options.requests_per_slot},
          {"rows", rows}};
}

nlohmann::json run_gpu_bench(const GpuBenchOptions& options) {
  QSPEC_CHECK(options.model_dir.empty() != options.synthetic.empty(),
              "bench --device cuda: give a model directory or --synthetic NAME (one of them)");
  QSPEC_CHECK(!options.batch_sizes.empty() && options.context > 0 && options.steps > 0,
              "bench --device cuda: needs batch sizes, --context > 0 and --steps > 0");
  std::unique_ptr<LlamaModel> checkpoint;
  ModelConfig config;
  std::string model_name;
  if (!options.model_dir.empty()) {
    checkpoint = LlamaModel::load(options.model_dir);
    config = checkpoint->config();
    model_name = options.model_dir;
  } else {
    config = synthetic_model_config(options.synthetic);
    model_name = "synthetic " + options.synthetic;
  }
  void* stream = cuda::create_stream();
  struct StreamGuard {
    void* stream;
    ~StreamGuard() { cuda::destroy_stream(stream); }
  } guard{stream};

  cuda::set_pdl_enabled(options.programmatic_launch);
  const Ceilings ceilings = options.profile_step ? Ceilings{1e12, 1e15} : measure_ceilings(stream);
  if (!options.synthetic.empty()) model_name += std::string(" (") + std::string(quant::format_name(options.synthetic_weights)) + ")";
  std::printf("GPU %s | model %s | copy %.0f GB/s (read + write) | cuBLAS f16 %.0f TFLOP/s\n",
              cuda::device_name().c_str(), model_name.c_str(), ceilings.copy_bytes_per_s / 1e9,
              ceilings.gemm_flops_per_s / 1e12);
  nlohmann::json record = {{"benchmark", "gpu_decode"},
                           {"gpu", cuda::device_name()},
                           {"kv_cache", kv_cache_format_name(options.kv_cache)},
                           {"model", model_name},
                           {"commit", options.commit},
                           {"gemm_policy", options.gemm_policy.empty() ? std::string("built-in crossovers") : options.gemm_policy},
                           {"command", options.command_line},
                           {"context", options.context},
                           {"steps", options.steps},
                           {"cuda_graphs", options.cuda_graphs},
                           {"programmatic_dependent_launch", cuda::pdl_enabled()},
                           {"copy_bytes_per_second", ceilings.copy_bytes_per_s},
                           {"gemm_flops_per_second", ceilings.gemm_flops_per_s},
                           {"synthetic_arc_channels",
                            options.synthetic.empty() ? nlohmann::json() : nlohmann::json(options.synthetic_arc_channels)},
                           {"synthetic_weights", options.synthetic.empty()
                                                     ? nlohmann::json()
                                                     : nlohmann::json(quant::format_name(options.synthetic_weights))},
                           {"gemm_sum_weights", std::string(quant::format_name(options.synthetic_weights)) + " g" +
                                                    std::to_string(options.synthetic_group)},
                           {"modes", nlohmann::json::object()}};
  if (!options.gemm_ablation.empty()) {
    record["gemm_ablation"] = run_gemm_ablation(options, checkpoint.get(), config);
    record["gemm_ablation_policies"] = options.gemm_ablation;
    return record;
  }
  const int64_t max_batch = *std::max_element(options.batch_sizes.begin(), options.batch_sizes.end());
  const double flops_per_token = gemm_flops_per_token(config);

  for (const std::string& mode_name : options.modes) {
    RunMode mode = parse_run_mode(mode_name);
    if (checkpoint && mode.quantized_weights && !checkpoint->has_quantized_weights())
      checkpoint->quantize_weights(quant::Format::int4);
    nlohmann::json mode_record = {{"decode", nlohmann::json::array()}, {"ttft", nlohmann::json::array()}};

    // ---- decode steps ----
    {
      GpuLlamaOptions gpu_options;
      gpu_options.max_seqs = max_batch;
      // Room for the timed steps, and for a chain of kMaxChainSteps (the "chained" column).
      const int64_t positions = options.context + std::max(options.steps, GpuLlama::kMaxChainSteps) + 8;
      gpu_options.max_context = std::min<int64_t>(positions, config.max_position_embeddings);
      QSPEC_CHECK(positions <= config.max_position_embeddings, "bench: --context ", options.context, " + --steps ",
                  options.steps, " (at least ", GpuLlama::kMaxChainSteps, ") exceed the model's context");
      gpu_options.max_step_tokens = std::max<int64_t>(max_batch, 16);
      gpu_options.max_logit_rows = max_batch;
      if (!options.qspec_gammas.empty()) {  // verify steps: gamma + 1 <= 8 tokens and logit rows a sequence
        gpu_options.max_step_tokens = std::max<int64_t>(max_batch * 8, 16);
        gpu_options.max_logit_rows = max_batch * 8;
      }
      gpu_options.cuda_graphs = options.cuda_graphs;
      auto gpu = make_model(options, checkpoint.get(), config, mode, gpu_options);
      std::printf("\n%s decode: weights %.2f GB read per step, %.1f KB of K/V per position; %s\n", mode_name.c_str(),
                  static_cast<double>(gpu->weight_bytes()) / 1e9,
                  static_cast<double>(gpu->kv_bytes_per_position()) / 1e3,
                  options.cuda_graphs ? "CUDA graphs" : "plain launches");
      if (checkpoint == nullptr && runs_arc_activations(options, mode))
        std::printf("synthetic ARC calibration: %lld residual channels a site, random channel orders\n",
                    static_cast<long long>(options.synthetic_arc_channels));
      std::printf("kernel launches: %s\n", cuda::pdl_enabled() ? "programmatic dependent launch (overlapped)"
                                                                : "fully serialized (no PDL)");
      std::printf("%6s %10s %12s %12s %10s %9s %12s %9s %11s\n", "batch", "step ms", "tokens/s", "roofline ms",
                  "of roof", "bound", "GEMM sum ms", "step/sum", "chained ms");
      for (int64_t batch : options.batch_sizes) {
        const DecodeBatch decode(config, batch);
        const std::vector<GpuLlama::Run>& runs = decode.runs;
        auto set_context = [&] {
          for (int64_t s = 0; s < batch; ++s) gpu->truncate(s, options.context);
        };
        set_context();
        for (int i = 0; i < 3; ++i) gpu->step(runs);  // the first captures this batch's graph
        set_context();
        if (options.profile_step) {
          cuda::profiler_start();
          gpu->step(runs);
          cuda::profiler_stop();
          std::printf("%6lld profiled one decode step\n", static_cast<long long>(batch));
          continue;
        }
        std::vector<double> step_seconds;
        for (int64_t i = 0; i < options.steps; ++i) {
          const auto start = std::chrono::steady_clock::now();
          gpu->step(runs);
          step_seconds.push_back(seconds_since(start));
        }
        const double step_ms = median(step_seconds) * 1e3;
        // The same steps chained on the device (GpuLlama::draft_chain: each step's argmax feeds the
        // next, one host read for kMaxChainSteps steps): a step without the host's turn-around
        // (its ids copied back, the next inputs copied in, the graph launched).
        constexpr int64_t kChain = GpuLlama::kMaxChainSteps;
        std::vector<double> chained_seconds;
        for (int64_t i = 0; i < std::max<int64_t>(options.steps / kChain, 2) + 1; ++i) {
          set_context();
          const auto start = std::chrono::steady_clock::now();
          gpu->draft_chain(runs, kChain);
          if (i > 0) chained_seconds.push_back(seconds_since(start) / static_cast<double>(kChain));  // 0 captures
        }
        const double chained_ms = median(chained_seconds) * 1e3;
        const double mean_context = static_cast<double>(options.context) + static_cast<double>(options.steps) / 2.0;
        const double bytes = static_cast<double>(gpu->weight_bytes()) +
                             static_cast<double>(batch) * mean_context * static_cast<double>(gpu->kv_bytes_per_position());
        const double flops = static_cast<double>(batch) *
                             (flops_per_token + 4.0 * mean_context * static_cast<double>(config.q_dim()) *
                                                    static_cast<double>(config.num_layers));
        // Bytes over the copy rate counts each byte once (the copy probe moves read + written).
        const double memory_ms = bytes / ceilings.copy_bytes_per_s * 1e3;
        const double compute_ms = flops / ceilings.gemm_flops_per_s * 1e3;
        const double roofline_ms = std::max(memory_ms, compute_ms);
        nlohmann::json gemms = nlohmann::json::object();
        // Synthetic models: the GEMMs in their weight format and group; checkpoints: int4 g128.
        const double gemm_ms =
            gemm_sum_ms(config, mode, batch, options.synthetic_weights, options.synthetic_group, stream, gemms);
        std::printf("%6lld %10.3f %12.0f %12.3f %9.1f%% %9s %12.3f %9.3f %11.3f\n", static_cast<long long>(batch),
                    step_ms, static_cast<double>(batch) / (step_ms * 1e-3), roofline_ms, 100.0 * roofline_ms / step_ms,
                    memory_ms >= compute_ms ? "memory" : "compute", gemm_ms, step_ms / gemm_ms, chained_ms);
        mode_record["decode"].push_back({{"batch", batch},
                                         {"step_ms", step_ms},
                                         {"tokens_per_second", static_cast<double>(batch) / (step_ms * 1e-3)},
                                         {"bytes", bytes},
                                         {"flops", flops},
                                         {"memory_floor_ms", memory_ms},
                                         {"compute_floor_ms", compute_ms},
                                         {"roofline_fraction", roofline_ms / step_ms},
                                         {"gemm_sum_ms", gemm_ms},
                                         {"chained_step_ms", chained_ms},
                                         {"chained_roofline_fraction", roofline_ms / chained_ms},
                                         {"gemms_alone", gemms}});
      }
      if (options.sampling && !options.profile_step) {
        std::printf("\n%s sampling the decode step's tokens (%lld-entry vocabulary): host = logit rows copied back + "
                    "Sampler on %zu threads; GPU = sample_rows (ids only)\n",
                    mode_name.c_str(), static_cast<long long>(config.vocab_size), ThreadPool::global().size());
        std::printf("%6s  %-36s %10s %10s %9s %10s %9s\n", "batch", "filters", "host ms", "GPU ms", "speed-up",
                    "floor ms", "of floor");
        for (int64_t batch : options.batch_sizes) {
          const DecodeBatch decode(config, batch);
          for (int64_t s = 0; s < batch; ++s) gpu->truncate(s, options.context);
          gpu->step(decode.runs);  // the rows the samplers draw from
          for (auto& entry : time_sampling(*gpu, config, batch, ceilings.copy_bytes_per_s, 10))
            mode_record["sampling"].push_back(entry);
        }
      }
      mode_record["weight_bytes"] = gpu->weight_bytes();
      mode_record["graphs_captured"] = gpu->graphs_captured();
      if (mode_name == "w4a16" && !options.qspec_gammas.empty() && !options.profile_step)
        mode_record["qspec"] = run_qspec_cycles(options, *gpu, config, mode_record["decode"], ceilings);
    }

    // ---- dataset workloads ----
    if (!options.profile_step)
      for (const std::string& workload : options.workloads)
        mode_record["workloads"][workload] = run_workload(options, checkpoint.get(), config, mode, workload);

    // ---- time to first token ----
    if (options.profile_step) {
      record["modes"][mode_name] = mode_record;
      continue;
    }
    std::vector<int64_t> lengths;
    for (int64_t p : options.prompt_lengths)
      if (p <= config.max_position_embeddings) lengths.push_back(p);
    if (!lengths.empty()) {
      const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
      GpuLlamaOptions gpu_options;
      gpu_options.max_seqs = 1;
      gpu_options.max_context = longest;
      gpu_options.max_step_tokens = longest;
      gpu_options.max_logit_rows = 1;
      auto gpu = make_model(options, checkpoint.get(), config, mode, gpu_options);
      std::printf("\n%s time to first token (one sequence, whole prompt in one step)\n", mode_name.c_str());
      std::printf("%8s %10s %12s %12s %10s\n", "prompt", "TTFT ms", "prompt t/s", "roofline ms", "of roof");
      std::mt19937 generator(7);
      std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
      for (int64_t length : lengths) {
        std::vector<int32_t> prompt(static_cast<size_t>(length));
        for (int32_t& id : prompt) id = token(generator);
        std::vector<double> seconds;
        for (int repeat = 0; repeat < 4; ++repeat) {
          gpu->reset(0);
          const auto start = std::chrono::steady_clock::now();
          gpu->forward(prompt);
          if (repeat > 0) seconds.push_back(seconds_since(start));  // the first run warms up
        }
        const double ms = median(seconds) * 1e3;
        const double p = static_cast<double>(length);
        const double flops = p * flops_per_token +
                             2.0 * p * p * static_cast<double>(config.q_dim()) * static_cast<double>(config.num_layers);
        const double bytes = static_cast<double>(gpu->weight_bytes()) + p * static_cast<double>(gpu->kv_bytes_per_position());
        const double roofline_ms = std::max(flops / ceilings.gemm_flops_per_s, bytes / ceilings.copy_bytes_per_s) * 1e3;
        std::printf("%8lld %10.3f %12.0f %12.3f %9.1f%%\n", static_cast<long long>(length), ms, p / (ms * 1e-3),
                    roofline_ms, 100.0 * roofline_ms / ms);
        mode_record["ttft"].push_back(
            {{"prompt_tokens", length}, {"ttft_ms", ms}, {"roofline_ms", roofline_ms}, {"flops", flops}});
      }
    }
    record["modes"][mode_name] = mode_record;
  }
  return record;
}

nlohmann::json run_gpu_replay(const GpuBenchOptions& options, ReplayOptions replay, const std::string& texts_path) {
  QSPEC_CHECK(!options.synthetic.empty(), "bench --device cuda --replay: give --synthetic NAME (a checkpoint replays "
              "its own text with `qspec eval qspec --device cuda`)");
  const std::vector<ReplayText> texts = load_replay_texts(texts_path);
  const ModelConfig config = synthetic_model_config(options.synthetic);
  QuantizationInfo quantization;
  quantization.format = options.synthetic_weights;
  quantization.group_size = options.synthetic_group;
  quantization.method = "synthetic";
  const std::unique_ptr<LlamaModel> model = LlamaModel::without_weights(config, quantization);
  int64_t longest = 0;
  for (const ReplayText& text : texts)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(text.prompt.size() + text.output.size()));
  // Room for the longest text and a verify's drafts past its end.
  const int64_t context = std::min<int64_t>(longest + decode_rules::kMaxGamma + 8, config.max_position_embeddings);
  QSPEC_CHECK(longest <= context, "bench --replay ", texts_path, ": a text of ", longest,
              " tokens exceeds the model's context (", config.max_position_embeddings, ")");
  replay.engine.max_context = context;
  replay.engine.device = "cuda";
  replay.engine.kv_cache = std::string(kv_cache_format_name(options.kv_cache));
  cuda::set_pdl_enabled(options.programmatic_launch);
  const RunMode mode = parse_run_mode(decode_rules::kVerifyMode);
  std::printf("GPU %s | model synthetic %s (%s g%lld) | replaying %zu texts of %s (at most %lld tokens) | %s\n",
              cuda::device_name().c_str(), options.synthetic.c_str(),
              std::string(quant::format_name(options.synthetic_weights)).c_str(),
              static_cast<long long>(options.synthetic_group), texts.size(), texts_path.c_str(),
              static_cast<long long>(longest), options.cuda_graphs ? "CUDA graphs" : "plain launches");
  // One GPU model a batch size (its slots), the previous one freed first.
  std::unique_ptr<GpuLlama> gpu;
  int64_t gpu_batch = 0;
  const ReplayBackendFactory make_backend = [&](int64_t batch) {
    if (!gpu || gpu_batch != batch) {
      gpu.reset();
      EngineOptions engine = replay.engine;
      engine.max_batch_size = batch;
      GpuLlamaOptions gpu_options = engine_gpu_options(engine, context);
      gpu_options.cuda_graphs = options.cuda_graphs;
      gpu = make_model(options, nullptr, config, mode, gpu_options);
      gpu_batch = batch;
    }
    return make_cuda_backend(*gpu, mode, GpuSlots::engine);
  };
  const nlohmann::json rows = run_replay(*model, texts, replay, make_backend);
  return {{"benchmark", "gpu_replay"},
          {"gpu", cuda::device_name()},
          {"model", "synthetic " + options.synthetic},
          {"weights", std::string(quant::format_name(options.synthetic_weights)) + " g" +
                          std::to_string(options.synthetic_group)},
          {"kv_cache", kv_cache_format_name(options.kv_cache)},
          {"texts", texts_path},
          {"text_count", texts.size()},
          {"longest_text", longest},
          {"rounds", replay.rounds},
          {"prefill_first", replay.engine.prefill_first},
          {"ngram_corpus", replay.ngram_corpus},
          {"qspec_costs", replay.qspec_costs},
          {"commit", options.commit},
          {"command", options.command_line},
          {"cuda_graphs", options.cuda_graphs},
          {"rows", rows}};
}

}  // namespace qspec
