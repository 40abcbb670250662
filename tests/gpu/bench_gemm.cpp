// qspec_gpu_bench: device-to-device copy bandwidth, then the W4A16 GEMM (small-M kernel, tiled
// kernel, dequantize + cuBLAS) and cuBLAS's f16 GEMM on the Llama-3-8B linear shapes over M, as a
// table and JSON (GPU, commit, command, every timing).
//
// Method (docs/perf-journal/perf-notes-journal-2026.md): random weights generated on the GPU; enough copies of each
// weight set to cover 3x the L2 cache, launched round-robin so every launch streams its
// weights from device memory (as consecutive layers do in a decode step); each timed replay is
// a CUDA graph of one launch per copy (at least 8), timed with CUDA events; 3 warm-up runs;
// the median over 25 replays, divided by the launches in the graph.
//
// usage: qspec_gpu_bench OUT.json [--quick] [--group 128] [--weights int4] [--shapes qkv,o,...] [--ms 1,2,16]
//        [--variants 1,3] [--x-staging 1,2] [--tiles 1,2,3,4] [--splits 0,4,8] [--no-baselines] [--profile]
//        [--int8] [--x-packed] [--w8a16 G]
// --variants: small-M kernel variants (m <= 128; 5, the preload kernel, m <= 16 on sm_90a); --tiles: tiled kernel tiles (every m; 5 = wgmma, sm_90a; 0 = the
// launcher's choice by m; rows w4a16_tiled_<rows>x<tokens>); --splits applies to both (0 = the
// heuristic; the tiled kernel caps splits by its workspace, sized for its own heuristic).
// --weights int4|int4-asym|int4-zp: the weight format (cuda::make_synthetic_w4a16, as synthetic
// models); int4-asym / int4-zp time only the W4A16 paths that run them (w4a16_runs_zero_points).
// --profile: no timing, each selected W4A16 launch twice without graphs (for ncu).
// --w8a16 G: W8A16 rows too (int8-group weights of group G, ops/w8a16_pack.h: w8a16_kernel, and
// w8a16_dequant_cublas beyond 16 tokens), bytes = int8 codes + f32 scales + x + y.
// --int8: W4A8 instead (int8 activations quantized on the GPU, the tiled kernel's tiles), with
// the measured mma.sync peaks (s8, f16) and cuBLAS's plain int8 GEMM (int8 weights, int32 out) as
// the baseline; rows report TOP/s and the fraction of the s8 peak (the large-M, compute-bound view).
// The same run times W4A8-fp8: as f16 values on f16 mma (w4a8fp8_tiled_*, w4a8fp8_small_m), as
// e4m3 codes on e4m3 mma.sync (w4a8fp8_e4m3_*) and on e4m3 wgmma (w4a8fp8_wgmma_*), and the
// W4A16 tiled kernel (w4a16_tiled_*). On sm_90a the wgmma GEMM as dispatched
// (w4a8_s8_wgmma_128x128: the unpack kernel, then the GEMM; the fused kernel with
// QSPEC_W4S8_FUSED=1), the unpack kernel + GEMM explicitly (w4a8_s8_wgmma_unpack_kernel), the fused
// kernel (w4a8_s8_wgmma_fused_v0 and --fused-variants), the cooperative kernel (the unpack spread
// over the GEMM's blocks: w4a8_s8_wgmma_coop, w4a8fp8_wgmma_coop), the register-A kernel (A
// fragments unpacked in the mma threads: w4a8_s8_wgmma_rs_v0 and --register-variants) and the GEMM
// alone on weights unpacked once (--wgmma-variants).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "ops/cuda/device_info.h"
#include "ops/cuda/ops.h"
#include "ops/cuda/synthetic_w4a16.h"
#include "qspec/error.h"

#ifndef QSPEC_GIT_COMMIT
#define QSPEC_GIT_COMMIT "unknown"
#endif

namespace {

namespace cuda = qspec::cuda;

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Shape {
  const char* name;
  int64_t n, k;
  bool probe = false;  // runs only when --shapes names it
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT.json [--quick] [--group G]\n", argv[0]);
    return 2;
  }
  const std::string out_path = argv[1];
  bool quick = false, baselines = true, profile = false, int8 = false;
  bool x_packed = false;  // --x-packed: also the wgmma tiles' instances for x in the packed k order
  std::string shape_filter;
  std::vector<int64_t> ms_override;
  std::vector<int> wgmma_variants = {0};  // --wgmma-variants: the wgmma GEMM tiles timed alone
  std::vector<int> fused_variants = {0};  // the fused wgmma kernel's tiles: 0 and --fused-variants
  std::vector<int> register_variants = {0};  // the register-A wgmma kernel's: 0 and --register-variants
  std::vector<int> variants = {1, 2, 3, 4, 5};
  std::vector<int> x_stagings = {0};  // --x-staging 1,2: x through shared memory / from global
  std::vector<int> tiles = {1, 2, 3, 4};
  std::vector<int64_t> split_list = {0};  // 0: the launcher's heuristic
  auto parse_list = [](const std::string& text) {
    std::vector<int64_t> values;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find(',', start);
      if (end == std::string::npos) end = text.size();
      values.push_back(std::atoll(text.substr(start, end - start).c_str()));
      start = end + 1;
    }
    return values;
  };
  int64_t group = 128, w8a16_group = 0;
  qspec::quant::Format weight_format = qspec::quant::Format::int4;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") quick = true;
    else if (arg == "--no-baselines") baselines = false;
    else if (arg == "--profile") profile = true;
    else if (arg == "--int8") int8 = true;
    else if (arg == "--x-packed") x_packed = true;
    else if (arg == "--shapes" && i + 1 < argc) shape_filter = "," + std::string(argv[++i]) + ",";
    else if (arg == "--ms" && i + 1 < argc) ms_override = parse_list(argv[++i]);
    else if (arg == "--fused-variants" && i + 1 < argc) {
      fused_variants.assign(1, 0);
      for (int64_t v : parse_list(argv[++i])) fused_variants.push_back(static_cast<int>(v));
    } else if (arg == "--register-variants" && i + 1 < argc) {
      register_variants.assign(1, 0);
      for (int64_t v : parse_list(argv[++i])) register_variants.push_back(static_cast<int>(v));
    } else if (arg == "--wgmma-variants" && i + 1 < argc) {
      wgmma_variants.clear();
      for (int64_t v : parse_list(argv[++i])) wgmma_variants.push_back(static_cast<int>(v));
    }
    else if (arg == "--splits" && i + 1 < argc) split_list = parse_list(argv[++i]);
    else if (arg == "--x-staging" && i + 1 < argc) {
      x_stagings.clear();
      for (int64_t v : parse_list(argv[++i])) x_stagings.push_back(static_cast<int>(v));
    } else if (arg == "--variants" && i + 1 < argc) {
      variants.clear();
      for (int64_t v : parse_list(argv[++i])) variants.push_back(static_cast<int>(v));
    }
    else if (arg == "--tiles" && i + 1 < argc) {
      tiles.clear();
      for (int64_t v : parse_list(argv[++i])) tiles.push_back(static_cast<int>(v));
    }
    else if (arg == "--group" && i + 1 < argc) group = std::atoll(argv[++i]);
    else if (arg == "--w8a16" && i + 1 < argc) w8a16_group = std::atoll(argv[++i]);
    else if (arg == "--weights" && i + 1 < argc) {
      try {
        weight_format = qspec::quant::parse_format(argv[++i]);
      } catch (const qspec::Error& error) {
        std::fprintf(stderr, "--weights: %s\n", error.what());
        return 2;
      }
    }
  }
  const bool zero_points = weight_format != qspec::quant::Format::int4;
  if (zero_points && int8) {
    std::fprintf(stderr, "--int8 runs int4 weights only (the GPU's W4A8 kernels refuse zero points)\n");
    return 2;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  const char* commit_env = std::getenv("QSPEC_COMMIT");
  const std::string commit = commit_env != nullptr && *commit_env ? commit_env : QSPEC_GIT_COMMIT;

  try {
    if (cuda::device_count() == 0) {
      std::fprintf(stderr, "no CUDA GPU\n");
      return 1;
    }
    const std::string gpu = cuda::device_name();
    const size_t l2 = cuda::l2_cache_bytes();
    std::printf("GPU %s, %d SMs, L2 %.1f MB, commit %s\n", gpu.c_str(), cuda::multiprocessor_count(), l2 / 1e6,
                commit.c_str());
    void* stream = cuda::create_stream();
    const int reps = 25, warmup = 3;

    // 1. Copy bandwidth: 1 GiB device to device, counting bytes read + written; the best of
    // cudaMemcpyAsync and a 16-byte-vector copy kernel is the roofline. Also a read-only pass.
    const size_t copy_bytes = size_t{1} << 30;
    double copy_gbps = 0, memcpy_gbps = 0, kernel_copy_gbps = 0, read_gbps = 0;
    {
      cuda::DeviceMemory a(copy_bytes), b(copy_bytes), sink(16);
      cuda::fill_random_u32(a.as<uint32_t>(), copy_bytes / 4, 1, stream);
      const cuda::ReplayTimes t1 = cuda::time_replays(
          [&](void* s, int) { cuda::copy_device_to_device(b.get(), a.get(), copy_bytes, s); }, 1, warmup, reps, stream);
      memcpy_gbps = 2.0 * copy_bytes / (median(t1.ms) * 1e-3) / 1e9;
      const cuda::ReplayTimes t2 = cuda::time_replays(
          [&](void* s, int) { cuda::copy_kernel(b.get(), a.get(), copy_bytes, s); }, 1, warmup, reps, stream);
      kernel_copy_gbps = 2.0 * copy_bytes / (median(t2.ms) * 1e-3) / 1e9;
      const cuda::ReplayTimes t3 = cuda::time_replays(
          [&](void* s, int) { cuda::read_kernel(a.get(), copy_bytes, sink.as<uint32_t>(), s); }, 1, warmup, reps,
          stream);
      read_gbps = 1.0 * copy_bytes / (median(t3.ms) * 1e-3) / 1e9;
      copy_gbps = std::max(memcpy_gbps, kernel_copy_gbps);
      std::printf("copy 1 GiB (read + write, median of %d): cudaMemcpyAsync %.0f GB/s, copy kernel %.0f GB/s; "
                  "read-only kernel %.0f GB/s; roofline = copy %.0f GB/s\n",
                  reps, memcpy_gbps, kernel_copy_gbps, read_gbps, copy_gbps);
    }

    double s8_peak = 0, f16_peak = 0, e4m3_peak = 0, wgmma_peak = 0;
    if (int8) {
      s8_peak = cuda::mma_sync_peak_tops(cuda::MmaType::s8, stream);
      f16_peak = cuda::mma_sync_peak_tops(cuda::MmaType::f16, stream);
      if (cuda::compute_capability() >= 89) e4m3_peak = cuda::mma_sync_peak_tops(cuda::MmaType::e4m3, stream);
      if (cuda::compute_capability() == 90) wgmma_peak = cuda::wgmma_s8_peak_tops(stream);
      std::printf("mma.sync peak: s8 %.0f TOP/s, f16 %.0f TFLOP/s, e4m3 %.0f TFLOP/s; wgmma s8 peak %.0f TOP/s\n",
                  s8_peak, f16_peak, e4m3_peak, wgmma_peak);
    }
    const std::vector<Shape> shapes = {{"qkv", 4096 + 2 * 1024, 4096},
                                       {"o", 4096, 4096},
                                       {"gate_up", 2 * 14336, 4096},
                                       {"down", 4096, 14336},
                                       {"lm_head", 128256, 4096},
                                       // Probes: qkv and gate_up widened until the preload kernel's
                                       // one-token plan has 264 blocks (two a multiprocessor on 132)
                                       // instead of 192 / 224 (some multiprocessors one block, some two):
                                       // is a one-token GEMM bound by the busiest multiprocessor's bytes
                                       // or by device memory?
                                       {"qkv_264", 264 * 32, 4096, true},
                                       {"gate_up_264", 264 * 128, 4096, true}};
    std::vector<int64_t> ms = {1, 2, 4, 8, 16, 32, 64, 128, 512, 2048};
    if (quick) ms = {1, 16, 64, 512};
    if (!ms_override.empty()) ms = ms_override;
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    cuda::Blas blas;
    nlohmann::json results = nlohmann::json::array();

    std::printf("\n%-8s %5s %-24s %10s %9s %7s %9s %s\n", "shape", "M", "path", "time_us", "GB/s", "of_copy",
                "TFLOP/s", "graph");
    for (const Shape& shape : shapes) {
      if (shape_filter.empty() ? shape.probe
                               : shape_filter.find("," + std::string(shape.name) + ",") == std::string::npos)
        continue;
      const int64_t row_blocks = (shape.n + 15) / 16;
      const size_t code_bytes = static_cast<size_t>(row_blocks * shape.k * 8);
      const size_t scale_bytes = cuda::synthetic_w4a16_scale_bytes(shape.n, shape.k, group, weight_format);
      const size_t w4_bytes = code_bytes + scale_bytes;
      const size_t w16_bytes = static_cast<size_t>(shape.n * shape.k * 2);
      const int w16_copies = cuda::weight_copies_beyond_l2(w16_bytes);
      // Scales: f16 in [0.001, 0.01].
      const cuda::SyntheticW4A16Copies w4 =
          cuda::make_synthetic_w4a16_copies(shape.n, shape.k, group, weight_format, 0.001f, 0.01f, 100, stream);
      const std::vector<cuda::W4A16Weights>& views = w4.views;
      const int w4_copies = static_cast<int>(views.size());
      std::vector<cuda::DeviceMemory> w16;
      for (int c = 0; c < w16_copies; ++c) {
        w16.emplace_back(w16_bytes);
        cuda::fill_random_f16(w16.back().as<uint16_t>(), w16_bytes / 2, -0.05f, 0.05f, 300 + c, stream);
      }
      // --w8a16 G: int8-group weights of that group (random codes, scales in [0.001, 0.01]) in the
      // W8A16 layout (ops/w8a16_pack.h), as many copies as cover 3x the L2 cache.
      const size_t w8_code_bytes = static_cast<size_t>(row_blocks * 16 * shape.k);
      const size_t w8_scale_count = w8a16_group > 0 ? static_cast<size_t>(row_blocks * 16 * (shape.k / w8a16_group)) : 0;
      const size_t w8a16_bytes = w8_code_bytes + 4 * w8_scale_count;
      std::vector<cuda::DeviceMemory> w8_codes, w8_scales;
      std::vector<cuda::W8A16Weights> w8_views;
      if (w8a16_group > 0 && !int8) {
        std::vector<float> scales(w8_scale_count);
        for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.001f + 0.009f * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
        for (int c = 0; c < cuda::weight_copies_beyond_l2(w8a16_bytes); ++c) {
          w8_codes.emplace_back(w8_code_bytes);
          cuda::fill_random_u32(w8_codes.back().as<uint32_t>(), w8_code_bytes / 4, 500 + c, stream);
          w8_scales.emplace_back(scales.size() * 4);
          cuda::copy_to_device(w8_scales.back().get(), scales.data(), scales.size() * 4);
          w8_views.push_back({w8_codes.back().get(), w8_scales.back().as<float>(), shape.n, shape.k, w8a16_group});
        }
      }
      cuda::DeviceMemory x(static_cast<size_t>(max_m * shape.k) * 2), y(static_cast<size_t>(max_m * shape.n) * 2);
      cuda::fill_random_f16(x.as<uint16_t>(), static_cast<size_t>(max_m * shape.k), -1.0f, 1.0f, 7, stream);
      const size_t small_ws = cuda::w4a16_workspace_bytes(64, shape.n, shape.k, cuda::W4A16Path::small_m);
      size_t tiled_ws = 0;
      for (int64_t m : ms) tiled_ws = std::max(tiled_ws, cuda::w4a16_workspace_bytes(m, shape.n, shape.k, cuda::W4A16Path::tiled));
      const size_t dequant_ws = cuda::w4a16_workspace_bytes(1, shape.n, shape.k, cuda::W4A16Path::dequant_cublas);
      cuda::DeviceMemory small_workspace(small_ws), tiled_workspace(tiled_ws), dequant_workspace(dequant_ws);
      cuda::w4a16_workspace_init(small_workspace.get(), small_ws, stream);
      cuda::w4a16_workspace_init(tiled_workspace.get(), tiled_ws, stream);
      // --int8: the activations as int8 codes + token scales (quantized once), int8 weights and
      // an int32 output for cuBLAS's int8 GEMM.
      std::optional<cuda::DeviceMemory> xq, x_scales, w8, y32, wgmma_workspace, w8_unpacked, xf8, xf8_scales,
          e4m3_unpacked, xf16_values, xf16_scales;
      const size_t wgmma_ws = cuda::w4_s8_wgmma_workspace_bytes(shape.n, shape.k);
      if (int8) {
        xq.emplace(static_cast<size_t>(max_m * shape.k));
        x_scales.emplace(static_cast<size_t>(max_m) * 4);
        cuda::quantize_int8_rows(x.as<uint16_t>(), max_m, shape.k, shape.k, xq->as<int8_t>(), shape.k,
                                 x_scales->as<float>(), stream);
        xf8.emplace(static_cast<size_t>(max_m * shape.k));
        xf8_scales.emplace(static_cast<size_t>(max_m) * 4);
        xf16_values.emplace(static_cast<size_t>(max_m * shape.k) * 2);
        xf16_scales.emplace(static_cast<size_t>(max_m) * 4);
        if (cuda::w4_s8_wgmma_supports(views[0], qspec::quant::Format::int8)) {
          wgmma_workspace.emplace(wgmma_ws);
          cuda::w4a16_workspace_init(wgmma_workspace->get(), wgmma_ws, stream);
          w8_unpacked.emplace(static_cast<size_t>(row_blocks * 16 * shape.k));
          cuda::w4_unpack_s8(views[0], w8_unpacked->as<int8_t>(), stream);
          e4m3_unpacked.emplace(static_cast<size_t>(row_blocks * 16 * shape.k));
          cuda::w4_unpack_e4m3(views[0], e4m3_unpacked->as<uint8_t>(), stream);
        }
        if (baselines) {
          w8.emplace(static_cast<size_t>(shape.n * shape.k));
          cuda::fill_random_u32(w8->as<uint32_t>(), static_cast<size_t>(shape.n * shape.k) / 4, 400, stream);
          y32.emplace(static_cast<size_t>(max_m * shape.n) * 4);
        }
      }
      cuda::stream_synchronize(stream);

      for (int64_t m : ms) {
        const double flops = 2.0 * m * shape.n * shape.k;
        const double io_bytes = static_cast<double>(m * shape.k * (int8 ? 1 : 2) + m * shape.n * 2);
        auto report = [&](const std::string& path, const cuda::ReplayTimes& t, double weight_bytes, int batch) {
          const double seconds = median(t.ms) * 1e-3;
          const double bytes = weight_bytes + io_bytes;
          const double gbps = bytes / seconds / 1e9;
          std::printf("%-8s %5lld %-24s %10.2f %9.0f %6.1f%% %9.1f %s\n", shape.name, static_cast<long long>(m),
                      path.c_str(), seconds * 1e6, gbps, 100.0 * gbps / copy_gbps, flops / seconds / 1e12,
                      t.graph ? "yes" : "no");
          std::vector<float> sorted = t.ms;
          std::sort(sorted.begin(), sorted.end());
          const double tops = flops / seconds / 1e12;
          const double peak = int8 ? s8_peak : 0.0;
          // The row's own operand type: e4m3 for the fp8 rows, f16 for the W4A16 rows, else s8.
          // (fp8 as f16 values runs f16 mma: rows w4a8fp8_tiled_*, w4a8fp8_small_m.)
          const bool fp8_row = path.rfind("w4a8fp8_e4m3", 0) == 0 || path.rfind("w4a8fp8_wgmma", 0) == 0;
          const bool f16_row = path.rfind("w4a16", 0) == 0 || (path.rfind("w4a8fp8", 0) == 0 && !fp8_row);
          const double own_peak = !int8 ? 0.0 : fp8_row ? e4m3_peak : f16_row ? f16_peak : s8_peak;
          const char* own_type = fp8_row ? "e4m3" : f16_row ? "f16" : "s8";
          if (peak > 0)
            std::printf("%-8s %5s %-24s %10s %9s %7s %8.1f%% of the s8 mma.sync peak, %.1f%% of wgmma's, %.1f%% of %s mma.sync's\n",
                        "", "", "", "", "", "", 100.0 * tops / peak, wgmma_peak > 0 ? 100.0 * tops / wgmma_peak : 0.0,
                        own_peak > 0 ? 100.0 * tops / own_peak : 0.0, own_type);
          results.push_back({{"shape", shape.name},
                             {"n", shape.n},
                             {"k", shape.k},
                             {"m", m},
                             {"group", group},
                             {"path", path},
                             {"median_us", seconds * 1e6},
                             {"min_us", sorted.front() * 1e3},
                             {"max_us", sorted.back() * 1e3},
                             {"bytes", bytes},
                             {"gbps", gbps},
                             {"fraction_of_copy_bw", gbps / copy_gbps},
                             {"tflops", flops / seconds / 1e12},
                             {"graph", t.graph},
                             {"fraction_of_s8_mma_peak", peak > 0 ? nlohmann::json(tops / peak) : nlohmann::json()},
                             {"own_mma_type", own_type},
                             {"fraction_of_own_mma_peak", own_peak > 0 ? nlohmann::json(tops / own_peak) : nlohmann::json()},
                             {"fraction_of_s8_wgmma_peak",
                              int8 && wgmma_peak > 0 ? nlohmann::json(tops / wgmma_peak) : nlohmann::json()},
                             {"launches_per_replay", batch}});
          std::fflush(stdout);
        };
        const int w4_batch = std::max(8, w4_copies), w16_batch = std::max(8, w16_copies);
        if (int8) {
          const cuda::QuantizedActivations xa = cuda::int8_activations(xq->as<int8_t>(), x_scales->as<float>(), shape.k);
          // W4A8-fp8: as e4m3 codes (xf: the wgmma kernel's operand; on the tiled kernel e4m3
          // mma.sync, w4a8fp8_e4m3_*) and as f16 values (xf16: f16 mma, w4a8fp8_*), with the W4A16
          // kernel (f16 mma) beside them.
          const cuda::QuantizedActivations xf = cuda::quantize_activations(
              qspec::quant::Format::fp8, 0, x.as<uint16_t>(), max_m, shape.k, shape.k, xf8->get(), shape.k,
              xf8_scales->as<float>(), 0, stream, {}, true);
          const cuda::QuantizedActivations xf16 = cuda::quantize_activations(
              qspec::quant::Format::fp8, 0, x.as<uint16_t>(), max_m, shape.k, shape.k, xf16_values->get(), shape.k,
              xf16_scales->as<float>(), 0, stream);
          // One W4 launch a graph entry, round-robin over the weight copies, reported under `path`.
          auto time_w4 = [&](const std::string& path, auto&& launch) {
            report(path, cuda::time_replays(launch, w4_batch, warmup, reps, stream), static_cast<double>(w4_bytes),
                   w4_batch);
          };
          const std::pair<const cuda::QuantizedActivations*, const char*> quantized_inputs[] = {
              {&xa, "w4a8"}, {&xf, "w4a8fp8_e4m3"}, {&xf16, "w4a8fp8"}};
          for (int tile : tiles) {
            const cuda::W4A16TiledConfig config{tile, 0};
            const std::string tile_name = cuda::w4a16_tiled_tile_name(tile);
            if (cuda::w4a16_is_wgmma_tile(tile) && !cuda::w4a16_wgmma_tile_runs_here()) continue;
            for (const auto& [act, name] : quantized_inputs) {
              if (cuda::w4a16_is_wgmma_tile(tile)) continue;  // plain f16 activations only
              time_w4(std::string(name) + "_tiled_" + tile_name, [&](void* s, int i) {
                cuda::w4_quantized_gemm_tiled(*act, m, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                              tiled_workspace.get(), tiled_ws, s, config);
              });
            }
            time_w4("w4a16_tiled_" + tile_name, [&](void* s, int i) {
              cuda::w4a16_gemm_tiled(x.as<uint16_t>(), m, shape.k, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                     tiled_workspace.get(), tiled_ws, s, config);
            });
          }
          if (m <= 64)  // the small-M kernel (decode sizes)
            for (const auto& [act, name] : quantized_inputs)
              time_w4(std::string(name) + "_small_m", [&](void* s, int i) {
                cuda::w4_quantized_gemm_small_m(*act, m, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                                small_workspace.get(), small_ws, s);
              });
          for (int wide_tile : {1, 2}) {
            if (!cuda::w4_s8_wide_supports(views[0], qspec::quant::Format::int8)) break;
            time_w4(wide_tile == 1 ? "w4a8_s8_wide_128x128" : "w4a8_s8_wide_128x64", [&](void* s, int i) {
              cuda::w4_quantized_gemm_s8_wide(xa, m, views[i % w4_copies], y.as<uint16_t>(), shape.n, s, wide_tile);
            });
          }
          if (wgmma_workspace) {
            // As dispatched (s8_wgmma_128x128): the unpack of the int4 weights to int8 (fp8: to e4m3
            // codes, e4m3 wgmma), then the GEMM.
            for (const auto& [act, name] :
                 {std::pair{&xa, "w4a8_s8_wgmma_128x128"}, std::pair{&xf, "w4a8fp8_wgmma_128x128"}})
              time_w4(name, [&](void* s, int i) {
                cuda::w4_quantized_gemm_s8_wgmma(*act, m, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                                 wgmma_workspace->get(), wgmma_ws, s);
              });
            // The unpack kernel, then the GEMM (the dispatched path, written out): the A/B of the
            // unpack inside the kernel.
            time_w4("w4a8_s8_wgmma_unpack_kernel", [&](void* s, int i) {
              cuda::w4_unpack_s8(views[i % w4_copies], w8_unpacked->as<int8_t>(), s);
              cuda::w4_s8_gemm_unpacked(xa, m, views[i % w4_copies], w8_unpacked->as<int8_t>(), y.as<uint16_t>(),
                                        shape.n, s);
            });
            // The fused kernel (unpack inside): the default tile and --fused-variants.
            for (int variant : fused_variants)
              time_w4("w4a8_s8_wgmma_fused_v" + std::to_string(variant), [&](void* s, int i) {
                cuda::w4_s8_gemm_fused(xa, m, views[i % w4_copies], y.as<uint16_t>(), shape.n, s, variant);
              });
            // The register-A kernel: the default tile and --register-variants.
            for (int variant : register_variants)
              time_w4("w4a8_s8_wgmma_rs_v" + std::to_string(variant), [&](void* s, int i) {
                cuda::w4_s8_gemm_registers(xa, m, views[i % w4_copies], y.as<uint16_t>(), shape.n, s, variant);
              });
            // The cooperative kernel (the GEMM's blocks unpack into the workspace as they go), on int8
            // and on fp8 (e4m3 codes).
            if (cuda::w4_s8_cooperative_supports(views[0])) {
              time_w4("w4a8_s8_wgmma_coop", [&](void* s, int i) {
                cuda::w4_s8_gemm_cooperative(xa, m, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                             wgmma_workspace->get(), wgmma_ws, s);
              });
              time_w4("w4a8fp8_wgmma_coop", [&](void* s, int i) {
                cuda::w4_s8_gemm_cooperative(xf, m, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                             wgmma_workspace->get(), wgmma_ws, s);
              });
            }
            // The GEMM alone on weights unpacked once (the int8 weights are read, n x k bytes), each
            // variant with --wgmma-variants.
            for (int variant : wgmma_variants) {
              const cuda::ReplayTimes g = cuda::time_replays(
                  [&](void* s, int) {
                    cuda::w4_s8_gemm_unpacked(xa, m, views[0], w8_unpacked->as<int8_t>(), y.as<uint16_t>(), shape.n, s,
                                              variant);
                  },
                  8, warmup, reps, stream);
              report("w4a8_s8_wgmma_gemm_only" + (variant ? "_v" + std::to_string(variant) : std::string()), g,
                     static_cast<double>(shape.n * shape.k), 8);
            }
            // W4A8-fp8's GEMM alone, on weights unpacked once to e4m3 codes.
            const cuda::ReplayTimes fg = cuda::time_replays(
                [&](void* s, int) {
                  cuda::w4_s8_gemm_unpacked(xf, m, views[0], e4m3_unpacked->as<int8_t>(), y.as<uint16_t>(), shape.n,
                                            s);
                },
                8, warmup, reps, stream);
            report("w4a8fp8_wgmma_gemm_only", fg, static_cast<double>(shape.n * shape.k), 8);
          }
          if (baselines) {
            const cuda::ReplayTimes t = cuda::time_replays(
                [&](void* s, int) {
                  cuda::gemm_s8_cublas(blas, xq->as<int8_t>(), m, shape.k, w8->as<int8_t>(), shape.n,
                                       y32->as<int32_t>(), s);
                },
                8, warmup, reps, stream);
            report("cublas_s8_int32_out", t, static_cast<double>(shape.n * shape.k), 8);
          }
          continue;
        }
        if (m <= 128) {
          for (int variant : variants)
          for (int64_t splits : split_list)
          for (int staging : x_stagings) {
            if (variant >= 2 && m > 32) continue;  // m > 32 always runs the 8-warp kernel
            if (variant == 5 && (m > 16 || !cuda::w4a16_preload_supported(views[0]))) continue;  // else variant 1
            if (variant >= 3 && staging != 0) continue;  // the ring kernels always stage x
            if (zero_points && variant != 5) continue;      // only the preload kernel has zero-point instances
            const cuda::W4A16SmallMConfig config{variant, static_cast<int>(splits), staging};
            if (profile) {
              for (int i = 0; i < 2; ++i)
                cuda::w4a16_gemm_small_m(x.as<uint16_t>(), m, shape.k, views[i % w4_copies], y.as<uint16_t>(),
                                         shape.n, small_workspace.get(), small_ws, stream, config);
              cuda::stream_synchronize(stream);
              std::printf("profiled %s m %lld variant %d\n", shape.name, static_cast<long long>(m), variant);
              continue;
            }
            const cuda::ReplayTimes t = cuda::time_replays(
                [&](void* s, int i) {
                  cuda::w4a16_gemm_small_m(x.as<uint16_t>(), m, shape.k, views[i % w4_copies], y.as<uint16_t>(),
                                           shape.n, small_workspace.get(), small_ws, s, config);
                },
                w4_batch, warmup, reps, stream);
            report((m > 32 ? std::string("w4a16_small_m") : "w4a16_small_m_v" + std::to_string(variant)) +
                       (splits > 0 ? "_s" + std::to_string(splits) : "") +
                       (staging == 1 ? "_xs" : staging == 2 ? "_xg" : ""),
                   t,
                   static_cast<double>(w4_bytes), w4_batch);
          }
        }
        // --x-packed: the wgmma tiles' instances for x in the packed k order too (no quad
        // transposes; x's order does not change the time), with or without zero points.
        for (int tile : tiles)
          for (int64_t splits : split_list)
            for (bool packed : {false, true}) {
              if (packed && !(x_packed && cuda::w4a16_is_wgmma_tile(tile))) continue;
              if (cuda::w4a16_is_wgmma_tile(tile) && !cuda::w4a16_wgmma_tile_runs_here()) continue;
              if (zero_points && !cuda::w4a16_tile_has_zero_points(tile)) continue;
              const cuda::W4A16TiledConfig config{tile, static_cast<int>(splits), packed};
              const std::string name = "w4a16_tiled_" + cuda::w4a16_tiled_tile_name(tile) +
                                       (splits > 0 ? "_s" + std::to_string(splits) : "") + (packed ? "_x_packed" : "");
              if (profile) {
                for (int i = 0; i < 2; ++i)
                  cuda::w4a16_gemm_tiled(x.as<uint16_t>(), m, shape.k, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                         tiled_workspace.get(), tiled_ws, stream, config);
                cuda::stream_synchronize(stream);
                std::printf("profiled %s m %lld %s\n", shape.name, static_cast<long long>(m), name.c_str());
                continue;
              }
              const cuda::ReplayTimes t = cuda::time_replays(
                  [&](void* s, int i) {
                    cuda::w4a16_gemm_tiled(x.as<uint16_t>(), m, shape.k, views[i % w4_copies], y.as<uint16_t>(),
                                           shape.n, tiled_workspace.get(), tiled_ws, s, config);
                  },
                  w4_batch, warmup, reps, stream);
              report(name, t, static_cast<double>(w4_bytes), w4_batch);
            }
        if (baselines && !profile) {
          const cuda::ReplayTimes t = cuda::time_replays(
              [&](void* s, int i) {
                cuda::w4a16_gemm(blas, x.as<uint16_t>(), m, shape.k, views[i % w4_copies], y.as<uint16_t>(), shape.n,
                                 dequant_workspace.get(), dequant_ws, s, cuda::W4A16Path::dequant_cublas);
              },
              w4_batch, warmup, reps, stream);
          report("w4a16_dequant_cublas", t, static_cast<double>(w4_bytes), w4_batch);
        }
        if (!w8_views.empty() && !profile) {
          const int copies = static_cast<int>(w8_views.size()), batch = std::max(8, copies);
          for (auto path : {cuda::W8A16Path::kernel, cuda::W8A16Path::dequant_cublas}) {
            if (path == cuda::W8A16Path::dequant_cublas && (!baselines || m <= 16)) continue;
            const cuda::ReplayTimes t = cuda::time_replays(
                [&](void* s, int i) {
                  cuda::w8a16_gemm(blas, x.as<uint16_t>(), m, shape.k, w8_views[i % copies], y.as<uint16_t>(), shape.n,
                                   dequant_workspace.get(), dequant_ws, s, path);
                },
                batch, warmup, reps, stream);
            report(path == cuda::W8A16Path::kernel ? "w8a16_kernel" : "w8a16_dequant_cublas", t,
                   static_cast<double>(w8a16_bytes), batch);
          }
        }
        // The f16 weights' GEMM on one W16Kernel, streamed over the weight copies.
        auto time_w16 = [&](cuda::W16Kernel kernel, const std::string& name) {
          const cuda::ReplayTimes t = cuda::time_replays(
              [&](void* s, int i) {
                cuda::linear_w16(blas, x.as<uint16_t>(), m, shape.k, w16[i % w16_copies].as<uint16_t>(), shape.n,
                                 y.as<uint16_t>(), cuda::Dtype16::f16, s, kernel);
              },
              w16_batch, warmup, reps, stream);
          report(name, t, static_cast<double>(w16_bytes), w16_batch);
        };
        if (baselines && !profile) time_w16(cuda::W16Kernel::cublas, "cublas_f16");
        if (baselines && !profile &&
            cuda::linear_w16_small_m_takes(x.as<uint16_t>(), m, shape.k, w16[0].as<uint16_t>(), y.as<uint16_t>()))
          time_w16(cuda::W16Kernel::small_m, "w16_small_m_k" + std::to_string(cuda::linear_w16_small_m_k_slices(shape.k)));
      }
    }
    cuda::destroy_stream(stream);

    nlohmann::json record = {{"benchmark", int8 ? "w4a8_gemm" : "w4a16_gemm"},
                             {"s8_mma_sync_peak_tops", int8 ? nlohmann::json(s8_peak) : nlohmann::json()},
                             {"f16_mma_sync_peak_tflops", int8 ? nlohmann::json(f16_peak) : nlohmann::json()},
                             {"e4m3_mma_sync_peak_tflops", int8 && e4m3_peak > 0 ? nlohmann::json(e4m3_peak) : nlohmann::json()},
                             {"s8_wgmma_peak_tops", int8 && wgmma_peak > 0 ? nlohmann::json(wgmma_peak) : nlohmann::json()},
                             {"gpu", gpu},
                             {"commit", commit},
                             {"command", command},
                             {"copy_bandwidth_gbps", copy_gbps},
                             {"memcpy_gbps", memcpy_gbps},
                             {"copy_kernel_gbps", kernel_copy_gbps},
                             {"read_kernel_gbps", read_gbps},
                             {"weights", std::string(qspec::quant::format_name(weight_format)) + ", group " +
                                             std::to_string(group) + ", f16 scales, random (generated on the GPU)"},
                             {"method", "median of 25 CUDA-graph replays (events), each replay one launch per weight "
                                        "copy (copies cover 3x L2), 3 warm-up runs; bytes = 4-bit weights + scales "
                                        "(f16 weights for cublas_f16) + x + y"},
                             {"results", results}};
    std::ofstream out(out_path);
    out << record.dump(2) << "\n";
    std::printf("\nwrote %s\n", out_path.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "qspec_gpu_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
