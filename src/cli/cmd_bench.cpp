// qspec bench: CPU decode/prefill throughput of a model, with the single-thread run as the
// baseline and the weight-bytes roofline (bytes per token over a measured copy bandwidth), or
// (--modes) each run mode's prefill and decode on the 4-bit weights;
// --device cuda: GPU decode steps per batch size and time-to-first-token (bench/cuda/gpu_bench.h).
// --qspec-costs-out FILE: the step-cost table `--draft auto` plans with (runtime/qspec_costs.h),
// measured on the CPU through the engine's backend (bench/step_costs.h) or taken from the GPU
// bench's own QSpec cycles, merged into FILE when it exists.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <cctype>
#include <thread>

#include "qspec/decode_plan.h"
#include "base/files.h"
#include "base/thread_pool.h"
#include "bench/replay.h"
#include "bench/step_costs.h"
#include "cli/commands.h"
#include "quant/formats.h"
#include "model/llama.h"
#include "qspec/error.h"
#include "runtime/backend.h"
#include "runtime/qspec_costs.h"
#include "bench/cuda/gpu_bench.h"  // GpuBenchOptions (declarations only: builds without CUDA include it too)
#ifdef QSPEC_HAVE_CUDA
#include "model/cuda/llama_gpu.h"  // synthetic_model_config
#endif

namespace qspec::cli {
namespace {

struct BenchArgs {
  std::string model_dir;
  int64_t prompt_tokens = 64;
  int64_t decode_tokens = 128;
  int repeats = 5;
  std::string out_dir;  // "": print the tables only (a JSON record only when asked, -o DIR)
  std::string command_line;
  std::string device = "cpu";
  std::vector<std::string> modes = {"w16a16", "w4a16"};
  std::string weights;     // CPU --modes: 4-bit weight format quantized at load ("" = int4)
  int64_t group_size = 0;  // CPU --modes: int4 group (0 = the model's automatic one)
  // --device cuda: the GPU benchmark's own options, bound straight to their flags.
  GpuBenchOptions gpu;
  bool no_graphs = false;
  bool no_pdl = false;
  // --qspec-costs-out: the step-cost table's file, and the contexts it is measured at.
  std::string qspec_costs_out;
  std::vector<int64_t> costs_contexts;
  std::string costs_acceptance;  // a `qspec eval qspec` result: per-draft acceptance priors
  std::string kv_cache = "f16";  // --kv-cache: the CPU benchmarks' KV cache
  // --replay FILE: recorded text through the engine (bench/replay.h); batch sizes from --batch-sizes.
  std::string replay;
  ReplayOptions replay_options;
};

// Writes `table` to `path`, merged into the table already there (same device and model: its
// other points are kept, the ones measured again replaced), and prints its points.
void write_cost_table(QSpecCostTable table, const std::string& path) {
  if (std::filesystem::exists(path)) {
    QSpecCostTable merged = QSpecCostTable::load(path);
    try {
      merged.merge(table);
      merged.validate(path);
    } catch (const Error& e) {
      fail("bench --qspec-costs-out ", path, ": cannot add these points to the table there (", e.what(),
           "); give another file");
    }
    table = std::move(merged);
  }
  table.save(path);
  std::printf("\nstep costs (ms) for --draft auto, %s, %s:\n", table.device.c_str(), table.model.c_str());
  std::printf("%6s %8s %10s", "batch", "context", "w4a16");
  for (const std::string& d : table.drafts()) std::printf(" %14s", d.c_str());
  for (int64_t g : table.gammas()) std::printf(" %11s", ("verify g" + std::to_string(g)).c_str());
  std::printf("\n");
  for (const StepCostPoint& p : table.points) {
    std::printf("%6lld %8lld %10.3f", static_cast<long long>(p.batch), static_cast<long long>(p.context),
                p.w4a16_step_ms);
    for (const auto& [d, ms] : p.draft_step_ms) std::printf(" %14.3f", ms);
    for (const auto& [g, ms] : p.verify_ms) std::printf(" %11.3f", ms);
    std::printf("\n");
  }
  if (!table.acceptance.empty()) {
    std::printf("acceptance priors:");
    for (const auto& [d, a] : table.acceptance) std::printf(" %s %.3f", d.c_str(), a);
    std::printf("\n");
  }
  std::printf("wrote %s\n", path.c_str());
}

// The `qspec eval qspec` result --qspec-costs-acceptance names, or null.
nlohmann::json read_acceptance(const std::string& path) {
  if (path.empty()) return nullptr;
  std::ifstream file(path);
  QSPEC_CHECK(file.good(), "bench: cannot read --qspec-costs-acceptance ", path);
  try {
    return nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    fail("bench: --qspec-costs-acceptance ", path, " is not JSON: ", e.what());
  }
}

void write_record(const nlohmann::json& record, const std::string& out_dir,
                  const std::string& file_name) {
  if (out_dir.empty()) return;
  std::filesystem::create_directories(out_dir);
  const std::string path = out_dir + "/" + file_name;
  std::ofstream out(path);
  QSPEC_CHECK(out.good(), path, ": cannot write");
  out << record.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
}

// What every CPU record opens with: the benchmark, what ran, where and how.
nlohmann::json cpu_record(const std::string& benchmark, const BenchArgs& args, int64_t threads) {
  return {{"benchmark", benchmark},
          {"model", args.model_dir},
          {"threads", threads},
          {"cpu", shell_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'")},
          {"commit", git_commit()},
          {"command", args.command_line},
          {"prompt_tokens", args.prompt_tokens},
          {"decode_tokens", args.decode_tokens},
          {"repeats", args.repeats},
          {"kv_cache", args.kv_cache}};
}

// A record's file name: PREFIX-<the model directory's name>.json.
std::string record_file(const std::string& prefix, const std::string& model_dir) {
  std::string name = std::filesystem::path(model_dir).filename().string();
  if (name.empty()) name = std::filesystem::path(model_dir).parent_path().filename().string();
  return prefix + "-" + name + ".json";
}

#ifdef QSPEC_HAVE_CUDA
// The GPU benchmark's options as the flags left them (bench --device cuda, and its --replay).
GpuBenchOptions gpu_bench_options(const BenchArgs& args) {
  GpuBenchOptions options = args.gpu;
  options.model_dir = args.model_dir;
  options.modes = args.modes;
  options.cuda_graphs = !args.no_graphs;
  options.programmatic_launch = !args.no_pdl;
  options.command_line = args.command_line;
  options.commit = git_commit();
  // --weights on a synthetic model: its 4-bit format (int4, int4-asym or int4-zp, GpuLlamaOptions::synthetic_weights).
  if (!args.weights.empty()) {
    QSPEC_CHECK(!args.gpu.synthetic.empty(), "bench --device cuda: --weights is for --synthetic models (a checkpoint "
                "brings its own 4-bit weights)");
    options.synthetic_weights = quant::parse_format(args.weights);
  }
  if (args.group_size != 0) {
    QSPEC_CHECK(!args.gpu.synthetic.empty(), "bench --device cuda: --group-size is for --synthetic models (a checkpoint "
                "brings its own 4-bit weights)");
    options.synthetic_group = args.group_size;
  }
  options.kv_cache = kv_cache_flag(args.kv_cache);
  return options;
}

// A GPU record's model in its file name: the synthetic model or checkpoint directory, then its
// weight format, group and KV cache where they are not the defaults.
std::string gpu_record_model_name(const BenchArgs& args, const GpuBenchOptions& options) {
  std::string name = args.gpu.synthetic;
  if (name.empty()) name = std::filesystem::path(args.model_dir).filename().string();
  if (options.synthetic_weights != quant::Format::int4) name += "-" + std::string(quant::format_name(options.synthetic_weights));
  if (options.synthetic_group != 128) name += "-g" + std::to_string(options.synthetic_group);
  if (options.kv_cache != KvCacheFormat::f16) name += "-kv" + std::string(kv_cache_format_name(options.kv_cache));
  return name;
}
#endif

void run_gpu(const BenchArgs& args) {
#ifdef QSPEC_HAVE_CUDA
  GpuBenchOptions options = gpu_bench_options(args);
  const std::string name = gpu_record_model_name(args, options);
  const bool costs = !args.qspec_costs_out.empty();
  ModelShape shape;
  nlohmann::json trace;
  if (costs) {
    QSPEC_CHECK(std::find(options.modes.begin(), options.modes.end(), "w4a16") != options.modes.end() &&
                    !options.qspec_gammas.empty(),
                "bench --qspec-costs-out: the GPU's step costs come from its QSpec cycles: give --modes w4a16 and "
                "--qspec-gammas (and the drafts to price, --qspec-drafts)");
    QSPEC_CHECK(options.accept_trace.empty(),
                "bench --qspec-costs-out: leave out --accept-trace (the bench skips the (draft, gamma) cycles its "
                "trace lacks, and the table needs every one; acceptance priors go in --qspec-costs-acceptance)");
    shape = ModelShape::of(args.gpu.synthetic.empty() ? LlamaModel::load(args.model_dir)->config()
                                                      : synthetic_model_config(args.gpu.synthetic));
    trace = read_acceptance(args.costs_acceptance);
  }
  // One bench run a context (the bench times decode steps at one context); the cost table
  // gathers them.
  const std::vector<int64_t> contexts =
      costs && !args.costs_contexts.empty() ? args.costs_contexts : std::vector<int64_t>{args.gpu.context};
  for (int64_t context : contexts) {
    options.context = context;
    const nlohmann::json record = run_gpu_bench(options);
    if (args.gpu.profile_step) return;
    const std::string gpu = file_name_slug(record["gpu"].get<std::string>());
    write_record(record, args.out_dir,
                 (args.gpu.gemm_ablation.empty() ? "gpu-decode-" : "gemm-ablation-") + name + "-" + gpu +
                     (contexts.size() > 1 ? "-ctx" + std::to_string(context) : std::string()) + ".json");
    if (costs)
      write_cost_table(QSpecCostTable::from_gpu_bench_record(record, shape, name, trace.is_null() ? nullptr : &trace),
                       args.qspec_costs_out);
  }
#else
  fail("bench --device cuda: this qspec was built without the CUDA backend (no nvcc at configure time)");
#endif
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Copy bandwidth (bytes read + written per second) over a buffer the size of the weights:
// the ceiling for a decode step that streams every weight once.
double copy_bandwidth(size_t bytes) {
  std::vector<char> source(bytes, 1), destination(bytes, 0);
  std::vector<double> rates;
  for (int i = 0; i < 7; ++i) {
    auto start = std::chrono::steady_clock::now();
    ThreadPool::global().parallel_for(bytes, 1 << 16, [&](size_t begin, size_t end) {
      std::memcpy(destination.data() + begin, source.data() + begin, end - begin);
    });
    rates.push_back(2.0 * static_cast<double>(bytes) / seconds_since(start));
  }
  return median(rates);
}

struct Throughput {
  double prefill_tokens_per_second;
  double decode_tokens_per_second;
};

Throughput measure(const LlamaModel& model, const BenchArgs& args, const RunMode& mode = RunMode{}) {
  std::mt19937 generator(1234);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(model.config().vocab_size - 1));
  std::vector<int32_t> prompt(args.prompt_tokens);
  for (auto& id : prompt) id = token(generator);
  std::vector<double> prefill, decode;
  std::vector<float> logits;
  for (int repeat = 0; repeat < args.repeats + 1; ++repeat) {  // the first run warms up
    KvCache cache = model.new_cache(args.prompt_tokens + args.decode_tokens, kv_cache_flag(args.kv_cache));
    auto start = std::chrono::steady_clock::now();
    model.forward(prompt, cache, logits, false, mode);
    double prefill_seconds = seconds_since(start);
    start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < args.decode_tokens; ++step) {
      int32_t next = token(generator);
      model.forward(std::span<const int32_t>(&next, 1), cache, logits, false, mode);
    }
    double decode_seconds = seconds_since(start);
    if (repeat == 0) continue;
    prefill.push_back(static_cast<double>(args.prompt_tokens) / prefill_seconds);
    decode.push_back(static_cast<double>(args.decode_tokens) / decode_seconds);
  }
  return {median(prefill), median(decode)};
}

void run_bench(const BenchArgs& args) {
  auto model = LlamaModel::load(args.model_dir);
  QSPEC_CHECK(args.prompt_tokens + args.decode_tokens <= model->config().max_position_embeddings,
              "bench: prompt + decode tokens exceed the model's context");
  const size_t threads = ThreadPool::global().size();
  const double bandwidth = copy_bandwidth(model->weight_bytes());
  Throughput all_threads = measure(*model, args);
  ThreadPool::set_global_threads(1);
  Throughput one_thread = measure(*model, args);
  ThreadPool::set_global_threads(threads);
  // Decode reads every weight once per token: tokens/s <= bandwidth / (2 x weight bytes)
  // since the copy bandwidth counts bytes read plus bytes written.
  const double roofline = bandwidth / 2.0 / static_cast<double>(model->weight_bytes());

  std::printf("model %s, %s weights %.2f MiB, %zu threads, prompt %lld, decode %lld, median of %d\n",
              args.model_dir.c_str(), model->weight_dtype().c_str(),
              static_cast<double>(model->weight_bytes()) / (1 << 20), threads,
              static_cast<long long>(args.prompt_tokens), static_cast<long long>(args.decode_tokens), args.repeats);
  std::printf("%-10s %14s %14s %12s %12s\n", "phase", "1 thread", "all threads", "speedup", "of roofline");
  std::printf("%-10s %10.0f t/s %10.0f t/s %11.2fx %12s\n", "prefill", one_thread.prefill_tokens_per_second,
              all_threads.prefill_tokens_per_second,
              all_threads.prefill_tokens_per_second / one_thread.prefill_tokens_per_second, "-");
  std::printf("%-10s %10.0f t/s %10.0f t/s %11.2fx %11.1f%%\n", "decode", one_thread.decode_tokens_per_second,
              all_threads.decode_tokens_per_second,
              all_threads.decode_tokens_per_second / one_thread.decode_tokens_per_second,
              100.0 * all_threads.decode_tokens_per_second / roofline);
  std::printf("copy bandwidth %.1f GB/s over %.1f MiB -> decode roofline %.0f tokens/s\n", bandwidth / 1e9,
              static_cast<double>(model->weight_bytes()) / (1 << 20), roofline);

  nlohmann::json record = cpu_record("cpu_decode", args, threads);
  record["weight_dtype"] = model->weight_dtype();
  record["weight_bytes"] = model->weight_bytes();
  record["prefill_tokens_per_second"] = {{"one_thread", one_thread.prefill_tokens_per_second},
                                         {"all_threads", all_threads.prefill_tokens_per_second}};
  record["decode_tokens_per_second"] = {{"one_thread", one_thread.decode_tokens_per_second},
                                        {"all_threads", all_threads.decode_tokens_per_second}};
  record["copy_bandwidth_bytes_per_second"] = bandwidth;
  record["decode_roofline_tokens_per_second"] = roofline;
  write_record(record, args.out_dir, record_file("cpu-decode", args.model_dir));
}

// --modes on the CPU: each mode's prefill and decode with all threads, on one set of 4-bit
// weights (quantized once at load when the checkpoint has none).
void run_bench_modes(const BenchArgs& args) {
  auto model = LlamaModel::load(args.model_dir);
  QSPEC_CHECK(args.prompt_tokens + args.decode_tokens <= model->config().max_position_embeddings,
              "bench: prompt + decode tokens exceed the model's context");
  std::vector<RunMode> modes;
  for (const std::string& name : args.modes) modes.push_back(parse_run_mode(name));
  const std::string weights = prepare_model_for_modes(*model, modes, args.weights, args.group_size);
  const size_t threads = ThreadPool::global().size();
  std::printf("model %s, 4-bit weights %s (%.2f MiB), %zu threads, prompt %lld, decode %lld, median of %d\n",
              args.model_dir.c_str(), weights.c_str(), static_cast<double>(model->quantized_weight_bytes()) / (1 << 20),
              threads, static_cast<long long>(args.prompt_tokens), static_cast<long long>(args.decode_tokens),
              args.repeats);
  std::printf("%-16s %14s %14s\n", "mode", "prefill", "decode");
  nlohmann::json results = nlohmann::json::array();
  for (const RunMode& mode : modes) {
    const Throughput throughput = measure(*model, args, mode);
    std::printf("%-16s %10.1f t/s %10.1f t/s\n", mode.name.c_str(), throughput.prefill_tokens_per_second,
                throughput.decode_tokens_per_second);
    std::fflush(stdout);
    results.push_back({{"mode", mode.name},
                       {"prefill_tokens_per_second", throughput.prefill_tokens_per_second},
                       {"decode_tokens_per_second", throughput.decode_tokens_per_second}});
  }
  nlohmann::json record = cpu_record("cpu_modes", args, threads);
  record["quantized_weights"] = weights;
  record["modes"] = results;
  write_record(record, args.out_dir, record_file("cpu-modes", args.model_dir));
}

// --qspec-costs-out on the CPU: the step costs through the engine's CPU backend, on the model's
// 4-bit weights (quantized at load as --weights says when the checkpoint has none).
void run_qspec_costs_cpu(const BenchArgs& args, const CLI::App& command) {
  auto model = LlamaModel::load(args.model_dir);
  StepCostOptions options;
  if (command.count("--batch-sizes") > 0) options.batches = args.gpu.batch_sizes;
  if (!args.costs_contexts.empty()) options.contexts = args.costs_contexts;
  if (command.count("--qspec-gammas") > 0) options.gammas = args.gpu.qspec_gammas;
  if (command.count("--qspec-drafts") > 0) options.drafts = args.gpu.qspec_drafts;
  if (std::find(options.drafts.begin(), options.drafts.end(), decode_rules::kNgramDraft) == options.drafts.end())
    options.drafts.push_back(std::string(decode_rules::kNgramDraft));  // free: it reads no weights
  options.repeats = args.repeats;
  std::vector<RunMode> modes = {parse_run_mode(decode_rules::kVerifyMode)};
  const std::string weights = prepare_model_for_modes(*model, modes, args.weights, args.group_size);
  options.group_size = modes[0].activations.group_size;
  options.kv_cache = kv_cache_flag(args.kv_cache);
  const std::unique_ptr<Backend> backend = make_cpu_backend(*model);
  std::printf("step costs of %s (4-bit weights %s) on %s: batches", args.model_dir.c_str(), weights.c_str(),
              backend->device_name().c_str());
  for (int64_t b : options.batches) std::printf(" %lld", static_cast<long long>(b));
  std::printf(", contexts");
  for (int64_t c : options.contexts) std::printf(" %lld", static_cast<long long>(c));
  std::printf(", median of %d\n", options.repeats);
  ProgressBar bar("qspec costs");
  options.progress = [&](size_t done, size_t total) { bar.update(done, total); };
  QSpecCostTable table = measure_step_costs(*model, *backend, options);
  table.model = std::filesystem::path(args.model_dir).lexically_normal().filename().string();
  if (table.model.empty()) table.model = std::filesystem::path(args.model_dir).lexically_normal().parent_path().filename().string();
  table.commit = git_commit();
  table.command = args.command_line;
  const nlohmann::json trace = read_acceptance(args.costs_acceptance);
  if (!trace.is_null()) {
    const std::vector<std::string> drafts = table.drafts();
    for (const auto& [draft, a] : acceptance_from_trace(trace, args.costs_acceptance))
      if (std::find(drafts.begin(), drafts.end(), draft) != drafts.end()) table.acceptance[draft] = a;
  }
  write_cost_table(std::move(table), args.qspec_costs_out);
}

// The replay's options as the flags left them: its batch sizes are --batch-sizes'.
ReplayOptions replay_options(const BenchArgs& args) {
  ReplayOptions options = args.replay_options;
  options.batch_sizes = args.gpu.batch_sizes;
  options.engine.kv_cache = args.kv_cache;
  return options;
}

// --replay on the GPU: a synthetic full-size model (bench/cuda/gpu_bench.h's run_gpu_replay).
void run_replay_gpu(const BenchArgs& args) {
#ifdef QSPEC_HAVE_CUDA
  const GpuBenchOptions options = gpu_bench_options(args);
  const nlohmann::json record = run_gpu_replay(options, replay_options(args), args.replay);
  write_record(record, args.out_dir,
               "replay-" + gpu_record_model_name(args, options) + "-" + file_name_slug(record["gpu"].get<std::string>()) +
                   ".json");
#else
  (void)args;
  fail("bench --device cuda: this qspec was built without the CUDA backend (no nvcc at configure time)");
#endif
}

// --replay on the CPU: a checkpoint (4-bit at load as --weights says), the engine's CPU backend.
void run_replay_cpu(const BenchArgs& args) {
  auto model = LlamaModel::load(args.model_dir);
  std::vector<RunMode> modes = {parse_run_mode(decode_rules::kVerifyMode)};
  const std::string weights = prepare_model_for_modes(*model, modes, args.weights, args.group_size);
  const std::vector<ReplayText> texts = load_replay_texts(args.replay);
  ReplayOptions options = replay_options(args);
  options.engine.device = "cpu";
  std::printf("%s (4-bit weights %s) on %s | replaying %zu texts of %s\n", args.model_dir.c_str(), weights.c_str(),
              cpu_device_name().c_str(), texts.size(), args.replay.c_str());
  const nlohmann::json rows =
      run_replay(*model, texts, options, [&](int64_t) { return make_cpu_backend(*model); });
  nlohmann::json record = cpu_record("cpu_replay", args, static_cast<int64_t>(ThreadPool::global().size()));
  record.update({{"weights", weights},
                 {"texts", args.replay},
                 {"text_count", texts.size()},
                 {"rounds", options.rounds},
                 {"prefill_first", options.engine.prefill_first},
                 {"ngram_corpus", options.ngram_corpus},
                 {"qspec_costs", options.qspec_costs},
                 {"rows", rows}});
  write_record(record, args.out_dir, record_file("replay", args.model_dir));
}

}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* command = app.add_subcommand("bench", "Measure prefill and decode throughput (CPU, or --device cuda)");
  command->add_option("model,-m,--model", args->model_dir, "Model directory (or --synthetic with --device cuda)");
  command->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  command->add_option("--synthetic", args->gpu.synthetic,
                      "cuda: random weights of a full-size model drawn on the GPU (llama3-8b, llama2-7b, qwen2.5-7b, qwen2.5-7b-nobias)");
  command->add_option("--modes", args->modes,
                      "modes (cpu: each mode's prefill and decode, all threads; cuda: w16a16, w4a16, w4a8, w4a8-fp8, w4a4, w4a4-int4, w4a4-nvfp4, w4a4-mxfp4, and "
                      "w4a4-int4-arc, w4a4-nvfp4-arc, w4a4-mxfp4-arc on ARC checkpoints or --synthetic)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--synthetic-arc-channels", args->gpu.synthetic_arc_channels,
                      "cuda, --synthetic: ARC residual channels a site for the ARC modes (random channel orders; "
                      "other modes run without ARC)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--batch-sizes", args->gpu.batch_sizes, "cuda: decode batch sizes (and --qspec-costs-out's)")->delimiter(',')->capture_default_str();
  command->add_option("--context", args->gpu.context, "cuda: cached positions per sequence during decode steps")
      ->check(CLI::PositiveNumber)->capture_default_str();
  command->add_option("--steps", args->gpu.steps, "cuda: timed decode steps per batch size")
      ->check(CLI::PositiveNumber)->capture_default_str();
  command->add_option("--prompt-lengths", args->gpu.prompt_lengths, "cuda: prompts for time-to-first-token")
      ->delimiter(',')->capture_default_str();
  command->add_option("--workloads", args->gpu.workloads,
                      "cuda: dataset workloads served with continuous batching (gsm8k, humaneval, mbpp, mt-bench)")
      ->delimiter(',');
  command->add_option("--workloads-file", args->gpu.workloads_file, "cuda: prompt/output lengths per dataset")
      ->capture_default_str();
  command->add_option("--qspec-gammas", args->gpu.qspec_gammas,
                      "cuda, mode w4a16: time QSpec cycles (drafts + W4A16 verify) for these draft lengths; "
                      "--qspec-costs-out on the CPU: the verify gammas timed (default 2,4,7)")
      ->delimiter(',')
      ->check(CLI::Range(1, 7));
  command->add_option("--qspec-drafts", args->gpu.qspec_drafts,
                      "cuda: drafts of the QSpec cycles: modes (w4a8, w4a8-fp8, w4a4-int4, w4a4-nvfp4, w4a4-mxfp4), "
                      "MODE@WINDOW[+SINKS] for a sparse view of the cache (w4a16@512: the verify's mode over the last "
                      "512 positions and 16 sinks), each optionally /vN for a vocabulary subset of N lm_head rows "
                      "(w4a8/v16384; synthetic weights score the first N ids); --qspec-costs-out on the CPU: the "
                      "drafts priced (default w4a8; "
                      "ngram always, at cost 0)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--qspec-costs-out", args->qspec_costs_out,
                      "Measure the step costs `--draft auto` plans with on this device (a W4A16 step, each draft's "
                      "step, the verify of each gamma, per batch and context) into this table, merged into the file "
                      "when it exists; bench/policies/" + cost_table_file_name("DEVICE", "MODEL") +
                          " is where --qspec-costs auto finds it. cpu: through the engine's CPU backend (defaults: "
                          "--batch-sizes 1,4, --qspec-costs-contexts 256,2048); cuda: from the QSpec cycles of "
                          "--modes w4a16 --qspec-gammas --qspec-drafts");
  command->add_option("--qspec-costs-acceptance", args->costs_acceptance,
                      "--qspec-costs-out: per-draft acceptance priors for the table, from a `qspec eval qspec` result "
                      "on a real checkpoint (e.g. bench/results/qspec-acceptance-smollm2.json); without them the "
                      "planner assumes 0.5 until a sequence shows its own")
      ->check(CLI::ExistingFile);
  command->add_option("--qspec-costs-contexts", args->costs_contexts,
                      "--qspec-costs-out: the contexts (cached positions a sequence) measured (cuda: one bench run "
                      "each; default --context)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  command->add_option("--gemm-policy", args->gpu.gemm_policy,
                      "cuda: the 4-bit GEMMs follow this policy map (qspec tune); default: the built-in crossovers")
      ->check(CLI::ExistingFile);
  command->add_option("--gemm-ablation", args->gpu.gemm_ablation,
                      "cuda: ADAngel ablation instead of the usual tables: each GEMM policy in turn (builtin, "
                      "paper-rule, forced:STRATEGY, or a map file), decode steps at --batch-sizes and TTFT at "
                      "--prompt-lengths")
      ->delimiter(',');
  command->add_option("--ablation-repeats", args->gpu.ablation_repeats,
                      "cuda: rounds of --gemm-ablation (policy order reversed on odd rounds)")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  command->add_option("--accept-trace", args->gpu.accept_trace,
                      "cuda: tokens per QSpec cycle from the accepted lengths a real checkpoint recorded (a `qspec "
                      "eval qspec` result JSON, e.g. bench/results/qspec-acceptance-smollm2.json)")
      ->check(CLI::ExistingFile);
  command->add_option("--accept-rate", args->gpu.accept_rate,
                      "cuda: per-token draft acceptance for the QSpec tokens/s (1 = every draft kept)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  command->add_option("--requests-per-slot", args->gpu.requests_per_slot, "cuda: a workload serves batch x this many requests")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_flag("--no-graphs", args->no_graphs, "cuda: plain launches instead of CUDA graphs for decode steps");
  command->add_flag("--no-pdl", args->no_pdl,
                    "cuda: fully serialized kernel launches (no programmatic dependent launch), to measure its worth");
  command->add_flag("--sampling", args->gpu.sampling,
                    "cuda: after each decode batch, time drawing its tokens with sampling filters on the GPU against "
                    "copying the logit rows to the host sampler");
  command->add_flag("--profile-step", args->gpu.profile_step,
                    "cuda: run one decode step per batch size inside profiler start/stop (ncu --profile-from-start off)");
  command->add_option("--weights", args->weights,
                      "cpu --modes: 4-bit weight format quantized at load by RTN (default int4; a qspec 4-bit "
                      "checkpoint uses its own): " + quant::weight_format_names() + "; cuda --synthetic: "
                      "int4|int4-asym|int4-zp (random weights, group 128 or --group-size)");
  command->add_option("--group-size", args->group_size,
                      "cpu --modes: int4 group size along K (0: 128, or the largest of 64, 32 dividing every K); "
                      "cuda --synthetic: the random weights' group, 32|64|128 (0: 128)")
      ->capture_default_str();
  command->add_option("--prompt-tokens", args->prompt_tokens, "Prompt length")->capture_default_str();
  command->add_option("--decode-tokens", args->decode_tokens, "Tokens decoded per run")->capture_default_str();
  command->add_option("--repeats", args->repeats, "Timed runs (median reported)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("-o,--out-dir", args->out_dir,
                      "Also write the JSON record into this directory (e.g. bench/results); default: tables only");
  command->add_option("--replay", args->replay,
                      "Replay the texts of a `qspec eval qspec --save-reference` record through the engine: in every "
                      "W4A16 pass each row's next token is the text's, so prompt-lookup drafts and the planner "
                      "(--replay-drafts) see that text's tokens while every pass runs at this model's shapes "
                      "(cuda: --synthetic llama3-8b, ...); plain W4A16 beside each run at every --batch-sizes, "
                      "tokens/s and the ratio (bench/replay.h)")
      ->check(CLI::ExistingFile);
  command->add_option("--replay-drafts", args->replay_options.drafts,
                      "--replay: the QSpec runs beside plain W4A16 (auto, ngram, or a draft spelling as in `eval "
                      "qspec --drafts`; model drafts on random weights are noise)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--replay-gammas", args->replay_options.gammas,
                      "--replay: draft lengths of each draft (auto: the largest it may plan, one run each)")
      ->delimiter(',')
      ->check(CLI::Range(1, static_cast<int>(decode_rules::kMaxGamma)))
      ->capture_default_str();
  command->add_option("--replay-requests", args->replay_options.requests,
                      "--replay: requests a run, the texts in turn, all queued at the start (0: max(16, 4 x batch))")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--replay-waves", args->replay_options.waves,
                      "--replay: instead of --replay-requests, this many full batches a run (at least 8 requests): "
                      "with 1 and long prompts, the drain columns are a full batch decoding without prefill")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--replay-ngram-corpus", args->replay_options.ngram_corpus,
                      "--replay: n-gram lookups (ngram, auto) also in the text of the run's finished requests "
                      "(DecodePlan::ngram_corpus; a text's repeats never)")
      ->transform(CLI::IsMember({"on", "off"}))
      ->default_str("on");
  command->add_flag("--replay-prefill-first", args->replay_options.engine.prefill_first,
                    "--replay: no decoding while a prompt is still prefilling (EngineOptions::prefill_first): with "
                    "--replay-waves 1 every run's drain columns time the same full batch decoding alone");
  command->add_option("--replay-planner-trace", args->replay_options.engine.planner_trace,
                      "--replay: append to this file one JSON line a run, a draft-auto plan and a W4A16 pass "
                      "(EngineOptions::planner_trace: why the planner chose what it did, and the pass times it saw)");
  command->add_option("--replay-rounds", args->replay_options.rounds,
                      "--replay: every run this many times in turn (medians reported)")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  command->add_option("--qspec-costs", args->replay_options.qspec_costs,
                      "--replay, draft auto: the planner's step-cost table (auto: bench/policies' for this device and "
                      "model; none: the planner's fallback; or a file)")
      ->check(CLI::IsMember({"auto", "none"}) | CLI::ExistingFile)
      ->capture_default_str();
  add_kv_cache_option(command, args->kv_cache);
  command->callback([args, command] {
    args->command_line = command_line();
    if (!args->replay.empty()) {
      if (args->device == "cuda") return run_replay_gpu(*args);
      QSPEC_CHECK(!args->model_dir.empty() && args->gpu.synthetic.empty(),
                  "bench --replay: the CPU replays on a model directory (--synthetic is for --device cuda)");
      return run_replay_cpu(*args);
    }
    if (args->device == "cuda") {
      QSPEC_CHECK(cuda_stores_kv_cache(kv_cache_flag(args->kv_cache)), "bench: --kv-cache ", args->kv_cache,
                  ": the CUDA backend has no such KV cache yet (--kv-cache f16 on --device cuda)");
      run_gpu(*args);
      return;
    }
    QSPEC_CHECK(!args->model_dir.empty() && args->gpu.synthetic.empty(),
                "bench: the CPU benchmark needs a model directory (--synthetic is for --device cuda)");
    if (!args->qspec_costs_out.empty()) return run_qspec_costs_cpu(*args, *command);
    QSPEC_CHECK(args->costs_contexts.empty() && args->costs_acceptance.empty(),
                "bench: --qspec-costs-contexts and --qspec-costs-acceptance need --qspec-costs-out");
    if (command->count("--modes") > 0) return run_bench_modes(*args);
    QSPEC_CHECK(command->count("--weights") == 0 && command->count("--group-size") == 0,
                "bench: --weights and --group-size need --modes (the CPU benchmark without it times the "
                "checkpoint's w16a16 forward pass)");
    run_bench(*args);
  });
}

}  // namespace qspec::cli
