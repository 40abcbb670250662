// qspec chat MODEL: an interactive conversation (llama-cli's -cnv): the model's chat template
// over the history, each reply streamed as it decodes, /reset, /system, /exit.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/files.h"
#include "cli/commands.h"
#include "model/llama.h"
#include "ops/sample.h"
#include "qspec/engine.h"
#include "qspec/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

struct ChatArgs {
  std::string model_dir;
  std::string system;          // the system message ("" = none)
  std::string chat_template;   // a template file instead of the checkpoint's
  int64_t max_tokens = 512;    // a reply's limit
  SamplingParams sampling = [] {
    SamplingParams s;
    s.temperature = 0.8f;  // llama-cli's conversation default; --temperature 0 for greedy
    return s;
  }();
  bool seed_given = false;
  DecodePlan plan = command_plan();
  std::string weights;
  int64_t group_size = 0;
  int64_t max_context = 0;
  std::string device = "cpu";
  std::string qspec_costs = "auto";  // --draft auto's step-cost table
  std::string kv_cache = "f16";      // --kv-cache
};

constexpr const char* kHelp =
    "commands: /reset (forget the conversation), /system TEXT (a new system message, and reset), "
    "/exit (or end of input)";

void run_chat(const ChatArgs& args) {
  DecodePlan plan = args.plan;
  if (plan.mode != decode_rules::kAutoMode) validate(plan, "--");
  auto model = LlamaModel::load(args.model_dir);
  const std::string auto_choice = resolve_auto_mode(plan, model->has_quantized_weights());
  validate(plan, "--");
  check_plan_kv_cache(plan, args.kv_cache);
  if (!auto_choice.empty()) std::fprintf(stderr, "[qspec] %s\n", auto_choice.c_str());
  std::vector<RunMode> modes;
  for (const std::string& name : plan.modes()) modes.push_back(parse_run_mode(name));
  prepare_model_for_modes(*model, modes, args.weights, args.group_size);
  auto tokenizer = Tokenizer::load(args.model_dir);
  tokenizer->check_model_vocab(model->config().vocab_size, args.model_dir);
  ChatTemplate chat = load_chat_template(args.model_dir);  // throws naming what is missing
  if (!args.chat_template.empty()) {
    const nlohmann::json defaults = chat.defaults();  // the model's special tokens
    chat = ChatTemplate::parse(read_text_file(args.chat_template, kMaxConfigJsonBytes));
    for (auto it = defaults.begin(); it != defaults.end(); ++it) chat.set_default(it.key(), it.value());
  }

  EngineOptions options;
  options.max_batch_size = 1;
  options.device = args.device;
  if (args.device == "cuda") options.gpu_mode = plan.qspec() ? plan.verify : plan.mode;
  options.max_context = args.max_context;
  options.qspec_costs = args.qspec_costs;
  options.kv_cache = args.kv_cache;
  Engine engine(*model, tokenizer.get(), options);
  if (plan.auto_draft()) std::fprintf(stderr, "[qspec] draft auto: %s\n", engine.qspec_planner().c_str());

  SamplingParams sampling = args.sampling;
  choose_seed(sampling, args.seed_given);
  std::fprintf(stderr, "[qspec] chat with %s, mode %s%s%s, context %lld; %s\n", args.model_dir.c_str(),
               plan.mode.c_str(), plan.qspec() ? ", draft " : "", plan.qspec() ? plan.draft.c_str() : "",
               static_cast<long long>(engine.context_limit()), kHelp);

  std::string system = args.system;
  std::vector<ChatMessage> history;
  std::string line;
  for (;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.clear();
      std::fputs("[conversation reset]\n", stdout);
      continue;
    }
    if (line.rfind("/system", 0) == 0 && (line.size() == 7 || line[7] == ' ')) {
      system = line.size() > 8 ? line.substr(8) : "";
      history.clear();
      std::fputs("[system message set; conversation reset]\n", stdout);
      continue;
    }
    if (line[0] == '/' && line.rfind("//", 0) != 0) {
      std::printf("%s (// starts a message with /)\n", kHelp);
      continue;
    }
    if (line.rfind("//", 0) == 0) line.erase(0, 1);

    std::vector<ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", system});
    messages.insert(messages.end(), history.begin(), history.end());
    messages.push_back({"user", line});
    Request request;
    request.prompt = tokenizer->encode(chat.render(messages, /*add_generation_prompt=*/true), /*add_bos=*/false);
    request.sampling = sampling;
    request.sampling.seed = sampling.seed + history.size();  // a new draw each turn, repeatable with --seed
    request.max_new_tokens = args.max_tokens;
    request.plan = plan;
    std::string reply, finish_reason, error;
    try {
      engine.submit(request, [&](const TokenEvent& event) {
        std::fputs(event.text.c_str(), stdout);
        std::fflush(stdout);
        reply += event.text;
        if (event.finished) finish_reason = event.finish_reason, error = event.error;
      });
    } catch (const Error& e) {  // the conversation outgrew the context: say so, keep the session
      std::printf("[%s; /reset starts over]\n", e.what());
      continue;
    }
    engine.run_until_idle();
    QSPEC_CHECK(finish_reason != "error", "chat: ", error);
    std::fputs(finish_reason == "length" || finish_reason == "context" ? " [...]\n" : "\n", stdout);
    history.push_back({"user", line});
    history.push_back({"assistant", reply});
  }
  std::fputs("\n", stdout);
}

}  // namespace

void register_chat(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* command = app.add_subcommand("chat", "An interactive conversation with the model's chat template");
  add_model_argument(command, args->model_dir);
  command->add_option("--system", args->system, "System message");
  command->add_option("--chat-template", args->chat_template, "Jinja chat template file (instead of the model's)");
  command->add_option("-n,--max-tokens", args->max_tokens, "Tokens a reply may take")->capture_default_str();
  add_sampling_options(command, args->sampling, args->seed_given);
  add_mode_option(command, args->plan.mode, "Weights and activations");
  add_qspec_options(command, args->plan, /*adaptive=*/false, "--mode qspec: ", args->qspec_costs);
  add_kv_cache_option(command, args->kv_cache);
  command->add_option("--weights", args->weights, "4-bit weight format when the checkpoint has none (RTN at load)");
  command->add_option("--group-size", args->group_size, "int4 group size (0: automatic)");
  command->add_option("-c,--ctx-size", args->max_context, "Positions the conversation may hold (0: the model's)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  command->callback([args] { run_chat(*args); });
}

}  // namespace qspec::cli
