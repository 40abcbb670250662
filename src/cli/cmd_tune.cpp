// qspec tune: ADAngel's offline tuner. Times every 4-bit GEMM strategy on a model's GEMM shapes
// (fused qkv, o, fused gate_up, down) over a sweep of M on this GPU and writes the policy map
// (gemm/policy_map.h) that `--gemm-policy FILE` hands to generate, serve and bench; every timing
// goes to a record under bench/results. --check reruns a sample of the map's points and reports
// where the winner disagrees. CUDA builds only.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/files.h"
#include "cli/commands.h"
#include "gemm/policy_map.h"
#include "model/config.h"
#include "model/llama.h"
#include "qspec/error.h"
#ifdef QSPEC_HAVE_CUDA
#include "gemm/cuda/gemm_dispatch.h"
#include "bench/cuda/gpu_bench.h"
#include "model/cuda/llama_gpu.h"
#endif

namespace qspec::cli {
namespace {

struct TuneArgs {
  std::string model_dir;
  std::string synthetic;
  std::vector<std::string> activations = {"f16", "int8"};
  std::vector<int64_t> m_values;
  int reps = 7;  // the isolated sweep: 7 replays a timing halve its time against 15, within its noise
  double min_gain = 0.03;
  std::string out;
  std::string record_dir = "bench/results";
  int64_t group = 0;
  bool check = false;
  std::string without_split_bitwise_out;
  // Tuning inside the step (by default): decode batches and prefill lengths (StepRefineOptions).
  std::vector<int64_t> refine_steps = gemm::step_refine_batches();
  std::vector<int64_t> refine_prefill = gemm::step_refine_prompt_lengths();
  bool no_refine = false;
  std::string from_record;
};

// --from-record: the maps a tuning record implies, on any machine (no GPU): the map tune wrote
// (its isolated timings, then its step refinement replayed), another --min-gain, or the reduced
// set of the ablation (isolated timings only: the refinement timed the whole set).
void maps_from_record(const TuneArgs& args) {
  std::ifstream file(args.from_record);
  QSPEC_CHECK(file.good(), "tune --from-record: cannot read ", args.from_record);
  std::stringstream text;
  text << file.rdbuf();
  gemm::PolicyMap map = gemm::PolicyMap::from_timings(text.str(), {}, args.min_gain, args.from_record);
  // Then what tune measured in whole steps.
  std::printf("replayed %zu step-refinement points\n", map.replay_step_refinement(text.str()));
  QSPEC_CHECK(!args.out.empty(), "tune --from-record: give -o FILE");
  map.command = command_line();
  map.save(args.out);
  std::printf("wrote %s (%zu shapes)\n", args.out.c_str(), map.shapes());
  if (!args.without_split_bitwise_out.empty()) {
    gemm::PolicyMap reduced = gemm::PolicyMap::from_timings(
        text.str(), {gemm::Strategy::split_small_m, gemm::Strategy::bitwise_b1}, args.min_gain, args.from_record);
    reduced.command = command_line() + " (strategy set without split_small_m and bitwise_b1)";
    reduced.save(args.without_split_bitwise_out);
    std::printf("wrote %s (without Split and Bitwise)\n", args.without_split_bitwise_out.c_str());
  }
}

void run_tune(const TuneArgs& args) {
  if (!args.from_record.empty()) {
    maps_from_record(args);
    return;
  }
#ifdef QSPEC_HAVE_CUDA
  QSPEC_CHECK(args.model_dir.empty() != args.synthetic.empty(), "tune: give a model directory or --synthetic NAME");
  ModelConfig config;
  int64_t group = args.group;
  std::string name = args.synthetic;
  if (!args.synthetic.empty()) {
    config = synthetic_model_config(args.synthetic);
    if (group == 0) group = 128;  // the synthetic models' packed group
  } else {
    auto model = LlamaModel::load(args.model_dir);
    config = model->config();
    if (group == 0) group = model->has_quantized_weights() && model->quantization().group_size > 0
                                ? model->quantization().group_size
                                : model->auto_group_size();
    name = std::filesystem::path(args.model_dir).filename().string();
  }
  TuneOptions options;
  options.shapes = {{"qkv", config.q_dim() + 2 * config.kv_dim(), config.hidden_size, group},
                    {"o", config.hidden_size, config.q_dim(), group},
                    {"gate_up", 2 * config.intermediate_size, config.hidden_size, group},
                    {"down", config.hidden_size, config.intermediate_size, group}};
  options.activations = args.activations;
  for (const std::string& a : options.activations) (void)gemm::strategies_for(a);  // validates the names
  options.m_values = args.m_values;
  options.reps = args.reps;
  options.min_gain = args.min_gain;
  ProgressBar bar("tune");
  options.progress = [&](size_t done, size_t total) { bar.update(done, total); };
  nlohmann::json record = {{"benchmark", "qspec tune"}, {"model", name}, {"command", command_line()},
                           {"commit", git_commit()}, {"gpu", cuda::device_name()}};
  gemm::PolicyMap map = tune_w4_policy(options, &record);
  map.commit = git_commit();
  map.command = command_line();

  // The dispatcher's per-call cost: a lookup of the map just made.
  const auto start = std::chrono::steady_clock::now();
  int64_t checksum = 0;
  const int calls = 1000000;
  for (int i = 0; i < calls; ++i)
    checksum += static_cast<int>(map.lookup(i % 2 ? "f16" : "int8", options.shapes[static_cast<size_t>(i % 4)].n,
                                            options.shapes[static_cast<size_t>(i % 4)].k, 1 + i % 512));
  const double lookup_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / calls;
  record["lookup_ns"] = lookup_ns;

  std::printf("\n%s on %s: strategy per M (first M of each range)\n", name.c_str(), map.gpu.c_str());
  for (const auto& shape : options.shapes)
    for (const std::string& a : options.activations) {
      std::printf("  %-8s %-5s n %6lld k %6lld:", shape.name.c_str(), a.c_str(), static_cast<long long>(shape.n),
                  static_cast<long long>(shape.k));
      gemm::Strategy previous = gemm::Strategy::dequant_cublas;
      bool first = true;
      for (int64_t m = 1; m <= 4096; ++m) {
        const gemm::Strategy s = map.lookup(a, shape.n, shape.k, m);
        if (first || s != previous) std::printf(" %lld:%s", static_cast<long long>(m), std::string(gemm::strategy_name(s)).c_str());
        previous = s;
        first = false;
      }
      std::printf("\n");
    }
  std::printf("dispatch lookup: %.0f ns a call (checksum %lld)\n", lookup_ns, static_cast<long long>(checksum));

  if (args.check) {  // rerun every 8th point: does the winner hold?
    TuneOptions again = options;
    again.m_values.clear();
    const std::vector<int64_t> all = args.m_values.empty() ? default_tune_m_values() : args.m_values;
    for (size_t i = 0; i < all.size(); i += 8) again.m_values.push_back(all[i]);
    again.progress = nullptr;
    nlohmann::json check_record;
    tune_w4_policy(again, &check_record);
    size_t agree = 0, points = 0;
    double worst_loss = 0;
    for (const auto& t : check_record["timings"]) {
      ++points;
      const std::string picked(gemm::strategy_name(
          map.lookup(t["activations"].get<std::string>(), t["n"].get<int64_t>(), t["k"].get<int64_t>(), t["m"].get<int64_t>())));
      if (picked == t["best"].get<std::string>()) {
        ++agree;
      } else if (t["us"].contains(picked)) {
        const double loss = t["us"][picked].get<double>() / t["us"][t["best"].get<std::string>()].get<double>() - 1.0;
        worst_loss = std::max(worst_loss, loss);
      }
    }
    std::printf("check: the map's pick is the rerun's winner at %zu of %zu points; worst loss elsewhere %.1f %%\n",
                agree, points, 100.0 * worst_loss);
    record["check"] = {{"points", points}, {"agree", agree}, {"worst_loss", worst_loss}};
  }

  if (!args.no_refine && (!args.refine_steps.empty() || !args.refine_prefill.empty())) {  // inside the step
    StepRefineOptions refine;
    refine.model_dir = args.model_dir;
    refine.synthetic = args.synthetic;
    refine.batches = args.refine_steps;
    refine.prompt_lengths = args.refine_prefill;
    refine.modes.clear();
    for (const std::string& a : options.activations) {
      if (a == "f16") refine.modes.push_back("w4a16");
      else if (a == "int8") refine.modes.push_back("w4a8");
    }
    map = refine_policy_in_steps(map, refine, &record);
    map.gpu = cuda::device_name();
    map.commit = git_commit();
    map.command = command_line();
  }
  if (!args.without_split_bitwise_out.empty()) {  // the ablation's reduced set, from the same timings
    gemm::PolicyMap reduced = gemm::PolicyMap::from_timings(
        record.dump(), {gemm::Strategy::split_small_m, gemm::Strategy::bitwise_b1}, options.min_gain, "tune record");
    // The step-level picks carry over where they are in the reduced set.
    if (record.contains("step_refinement"))
      for (const auto& r : record["step_refinement"]) {
        const std::string taken = r["taken"].get<std::string>();
        if (taken == "map" || taken == "split_small_m" || taken == "bitwise_b1") continue;
        reduced.override_at(r["mode"].get<std::string>() == "w4a16" ? "f16" : "int8", r["m"].get<int64_t>(),
                            gemm::parse_strategy(taken));
      }
    reduced.gpu = map.gpu;
    reduced.commit = map.commit;
    reduced.command = map.command + " (strategy set without split_small_m and bitwise_b1)";
    reduced.save(args.without_split_bitwise_out);
    std::printf("wrote %s (without Split and Bitwise)\n", args.without_split_bitwise_out.c_str());
  }
  const std::string out = args.out.empty() ? "bench/policies/" + file_name_slug(map.gpu) + "-" + name + ".json" : args.out;
  if (std::filesystem::path(out).has_parent_path()) std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  map.save(out);
  std::printf("wrote %s\n", out.c_str());
  if (!args.record_dir.empty()) {
    std::filesystem::create_directories(args.record_dir);
    const std::string path = args.record_dir + "/gemm-tune-" + name + "-" + file_name_slug(map.gpu) + ".json";
    std::ofstream(path) << record.dump(1) << "\n";
    std::printf("wrote %s\n", path.c_str());
  }
#else
  (void)args;
  fail("tune: this qspec was built without the CUDA backend (the tuner times GPU kernels)");
#endif
}

}  // namespace

void register_tune(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  CLI::App* command = app.add_subcommand("tune", "time every 4-bit GEMM strategy on a model's shapes and write the "
                                                 "GPU's policy map (ADAngel)");
  command->add_option("model,-m,--model", args->model_dir, "model directory (its GEMM shapes and group size)");
  command->add_option("--synthetic", args->synthetic, "a well-known model's shapes instead (llama3-8b, llama2-7b, qwen2.5-7b, qwen2.5-7b-nobias)");
  command->add_option("--activations", args->activations, "activation kinds to tune (f16, int8, int4, fp8, nvfp4, mxfp4)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--m-values", args->m_values, "token counts to time, each of them (default: 24 from 1 to 4096, "
                                                    "then midpoints wherever neighbours' winners differ)")
      ->delimiter(',')
      ->check(CLI::Range(1, 65536));
  command->add_option("--reps", args->reps, "graph replays per timing (median)")->check(CLI::Range(3, 1000))->capture_default_str();
  command->add_option("--min-gain", args->min_gain,
                      "a strategy replaces the rule-based default only when this much faster (0.03 = 3 %)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  command->add_option("--group", args->group, "int4 weight group (default: the model's)");
  command->add_option("-o,--out", args->out, "policy map file (default bench/policies/GPU-MODEL.json)");
  command->add_option("--without-split-bitwise", args->without_split_bitwise_out,
                      "also write the map of the same timings without the Split and Bitwise strategies (ablation)");
  command->add_option("--refine-steps", args->refine_steps,
                      "then tune inside whole decode steps at these batch sizes (w4a16 for f16, w4a8 for int8): "
                      "the map, builtin and the isolated timings' contenders at M = B, the fastest kept, builtin "
                      "unless beaten")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  command->add_option("--refine-prefill", args->refine_prefill,
                      "and inside whole prefills of these prompt lengths (M = P), likewise")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  command->add_flag("--no-refine", args->no_refine, "the isolated GEMM timings' map only (no step refinement)");
  command->add_option("--from-record", args->from_record,
                      "no GPU: write the map (-o) a tuning record implies (--min-gain, --without-split-bitwise)")
      ->check(CLI::ExistingFile);
  command->add_option("--record-dir", args->record_dir, "where the timing record goes")->capture_default_str();
  command->add_flag("--check", args->check, "rerun a sample of the points and report disagreement");
  command->callback([args] { run_tune(*args); });
}

}  // namespace qspec::cli
