// qspec generate MODEL: one prompt through the engine (any mode or QSpec), printed as it decodes.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "base/files.h"
#include "cli/commands.h"
#include "quant/formats.h"
#include "model/llama.h"
#include "ops/sample.h"
#include "qspec/engine.h"
#include "qspec/error.h"
#include "runtime/generate.h"
#include "runtime/qspec.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::string prompt_file;
  int64_t max_tokens = 128;
  SamplingParams sampling;
  bool stream = false;
  bool ignore_eos = false;
  bool print_ids = false;
  std::string bos = "auto";
  DecodePlan plan = command_plan();
  std::string weights;  // "" = int4, or the checkpoint's own 4-bit weights
  int64_t group_size = 0;
  bool no_kv_overwrite = false;  // --mode qspec: the paper's no-overwrite ablation
  int64_t max_context = 0;       // -c / --ctx-size: positions the sequence may hold (0: the model's)
  bool seed_given = false;       // --seed on the command line (else a sampled run draws a seed)
  std::vector<std::string> stop;
  std::string device = "cpu";
  std::string gemm_policy = "auto";
  std::string qspec_costs = "auto";  // --draft auto's step-cost table
  std::string kv_cache = "f16";      // --kv-cache
};

void run_generate(const GenerateArgs& args) {
  std::string prompt = args.prompt;
  // A prompt file: "-" is standard input (as llama.cpp's -f -); either is capped.
  constexpr uint64_t kMaxPromptBytes = uint64_t{64} << 20;
  if (args.prompt_file == "-") {
    std::string text(1 << 16, '\0');
    prompt.clear();
    while (std::cin.read(text.data(), static_cast<std::streamsize>(text.size())) || std::cin.gcount() > 0) {
      prompt.append(text.data(), static_cast<size_t>(std::cin.gcount()));
      QSPEC_CHECK(prompt.size() <= kMaxPromptBytes, "-f -: the prompt on standard input is over ", kMaxPromptBytes,
                  " bytes");
    }
  } else if (!args.prompt_file.empty()) {
    prompt = read_text_file(args.prompt_file, kMaxPromptBytes);
  }
  DecodePlan plan = args.plan;
  plan.kv_overwrite = !args.no_kv_overwrite;
  const bool auto_mode = plan.mode == decode_rules::kAutoMode;
  if (!auto_mode) validate(plan, "--");  // bad flags fail before the model loads
  auto model = LlamaModel::load(args.model_dir);
  const std::string auto_choice = resolve_auto_mode(plan, model->has_quantized_weights());
  if (auto_mode) {
    validate(plan, "--");
    std::fprintf(stderr, "[qspec] %s\n", auto_choice.c_str());
  }
  check_plan_kv_cache(plan, args.kv_cache);
  const bool use_qspec = plan.qspec();
  std::vector<RunMode> modes;
  for (const std::string& name : plan.modes()) modes.push_back(parse_run_mode(name));
  const std::string weights = prepare_model_for_modes(*model, modes, args.weights, args.group_size);
  if (use_qspec && plan.auto_draft()) {
    std::fprintf(stderr, "[qspec] weights %s, qspec: draft auto (the planner, gamma up to %lld), verify %s\n",
                 weights.c_str(), static_cast<long long>(plan.max_gamma), plan.verify.c_str());
  } else if (use_qspec) {
    std::fprintf(stderr, "[qspec] weights %s, qspec: draft %s, verify %s, gamma %lld%s%s\n", weights.c_str(),
                 plan.draft.c_str(), plan.verify.c_str(), static_cast<long long>(plan.gamma),
                 plan.adaptive_gamma ? " (adaptive)" : "", plan.kv_overwrite ? "" : ", no KV overwrite");
  } else if (modes[0].quantized_weights) {
    std::fprintf(stderr, "[qspec] weights %s, mode %s\n", weights.c_str(), modes[0].name.c_str());
  }
  auto tokenizer = Tokenizer::load(args.model_dir);
  tokenizer->check_model_vocab(model->config().vocab_size, args.model_dir);
  // An empty prompt needs a start token; llama-2 style tokenizers always want one.
  bool add_bos = args.bos == "on" || (args.bos == "auto" && (prompt.empty() || tokenizer->add_bos_by_default));
  if (!tokenizer->bos_id) add_bos = false;

  // One request through the continuous-batching engine: the same path the server takes.
  EngineOptions engine_options;
  engine_options.max_batch_size = 1;
  if (args.device == "cuda") {
    engine_options.device = "cuda";
    // The engine refuses modes the GPU does not run; QSpec verifies in w4a16 (drafts: w4a8).
    engine_options.gpu_mode = use_qspec ? plan.verify : plan.mode;
    engine_options.gpu_gemm_policy = args.gemm_policy;
  }
  engine_options.max_context = args.max_context;
  engine_options.qspec_costs = args.qspec_costs;
  engine_options.kv_cache = args.kv_cache;
  Engine engine(*model, tokenizer.get(), engine_options);
  if (plan.auto_draft()) std::fprintf(stderr, "[qspec] draft auto: %s\n", engine.qspec_planner().c_str());
  Request request;
  request.prompt = tokenizer->encode(prompt, add_bos);
  request.sampling = args.sampling;
  choose_seed(request.sampling, args.seed_given);
  request.max_new_tokens = args.max_tokens;
  request.ignore_eos = args.ignore_eos;
  request.stop = args.stop;
  request.plan = plan;

  std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  std::vector<int32_t> ids;
  std::string text, finish_reason, error;
  RequestMetrics metrics;
  engine.submit(request, [&](const TokenEvent& event) {
    ids.insert(ids.end(), event.tokens.begin(), event.tokens.end());
    if (args.stream) {
      std::fputs(event.text.c_str(), stdout);
      std::fflush(stdout);
    } else {
      text += event.text;
    }
    if (event.finished) {
      finish_reason = event.finish_reason;
      error = event.error;
      if (event.metrics) metrics = *event.metrics;
    }
  });
  engine.run_until_idle();
  QSPEC_CHECK(finish_reason != "error", "generate: ", error);
  if (!args.stream) std::fputs(text.c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (args.print_ids) {
    std::fprintf(stderr, "ids:");
    for (int32_t id : ids) std::fprintf(stderr, " %d", id);
    std::fprintf(stderr, "\n");
  }
  const double ttft = metrics.time_to_first_token;
  std::fprintf(stderr,
               "[qspec] prompt %lld tokens, first token after %.1f ms | generated %lld tokens, decode %.1f tok/s | "
               "finish: %s\n",
               static_cast<long long>(metrics.prompt_tokens), ttft * 1e3,
               static_cast<long long>(metrics.generated_tokens), metrics.decode_tokens_per_second(),
               finish_reason.c_str());
  if (use_qspec) {
    QSpecOptions described;
    described.draft.name = plan.draft;  // a mode, or ngram (no mode: modes holds the verify only)
    described.overwrite_kv = !args.no_kv_overwrite;
    std::fprintf(stderr, "[qspec] %s\n", describe_qspec_metrics(metrics.qspec, described).c_str());
    if (plan.auto_draft())
      std::fprintf(stderr, "[qspec] planner: %s\n", describe_planner_metrics(metrics.qspec).c_str());
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* command = app.add_subcommand("generate", "Generate a continuation of a prompt");
  add_model_argument(command, args->model_dir);
  command->add_option("-p,--prompt", args->prompt, "Prompt text");
  command->add_option("-c,--ctx-size", args->max_context,
                      "Positions the sequence may hold, prompt and output (0: the model's context)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("-f,--prompt-file", args->prompt_file, "Read the prompt from a file ('-': standard input)");
  command->add_option("-n,--max-tokens", args->max_tokens, "Maximum new tokens")->capture_default_str();
  add_sampling_options(command, args->sampling, args->seed_given);
  command->add_option("--bos", args->bos, "Prepend the bos token: auto|on|off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  command->add_flag("--stream", args->stream, "Print tokens as they are generated");
  command->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past end-of-sequence");
  command->add_flag("--print-ids", args->print_ids, "Print the generated token ids to stderr");
  add_mode_option(command, args->plan.mode, "Weights and activations");
  add_qspec_options(command, args->plan, /*adaptive=*/true, "--mode qspec: ", args->qspec_costs);
  add_kv_cache_option(command, args->kv_cache);
  command->add_option("--gemm-policy", args->gemm_policy,
                      "cuda: a GEMM policy map from `qspec tune` on this GPU; auto: the one in bench/policies "
                      "(or $QSPEC_GEMM_POLICY_DIR) for this GPU and model, if any; none: built-in crossovers")
      ->check(CLI::IsMember({"auto", "none"}) | CLI::ExistingFile)
      ->capture_default_str();
  command->add_option("--device", args->device, "Where the model runs: cpu, or cuda (modes w16a16, w4a16, w4a8*, w4a4*, and qspec with a w4a8* / w4a4* draft)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  command->add_option("--stop", args->stop, "Stop string (repeatable): the output ends before it");
  command->add_flag("--no-kv-overwrite", args->no_kv_overwrite,
                    "--mode qspec: keep the draft K/V of accepted tokens (the paper's ablation; output then "
                    "differs from w4a16)");
  command->add_option("--weights", args->weights,
                      "4-bit weight format for w4* modes, quantized at load by RTN (default int4; a qspec "
                      "4-bit checkpoint uses its own): " + quant::weight_format_names());
  command->add_option("--group-size", args->group_size, "int4 group size along K (0: 128, or the largest of 64, 32 dividing every K)")->capture_default_str();
  command->callback([args] { run_generate(*args); });
}

}  // namespace qspec::cli
