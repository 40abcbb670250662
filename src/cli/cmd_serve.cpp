// qspec serve MODEL: the OpenAI-compatible HTTP server (src/server/server.h).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/commands.h"
#include "model/llama.h"
#include "qspec/engine.h"
#include "qspec/error.h"
#include "server/http_limits.h"
#ifdef QSPEC_HAVE_SERVER
#include "server/server.h"
#endif
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

struct ServeArgs {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_name;  // "" = the model directory's name
  DecodePlan plan = command_plan();  // the default of requests that name none
  std::string weights;
  int64_t group_size = 0;
  std::string chat_template;
  size_t max_body_bytes = size_t{1} << 20;
  int64_t max_queue = 256;
  HttpLimits http;
  std::string api_key;  // --api-key, else $QSPEC_API_KEY
  std::vector<std::string> allowed_origins;  // --allowed-origins (CORS)
  std::string ssl_certfile, ssl_keyfile;
  bool no_access_log = false;
  std::string log_format = "text";
  EngineOptions engine = [] {
    EngineOptions e;
    e.qspec_costs = "auto";  // --draft auto's step-cost table: the one for this device and model
    return e;
  }();
};

// Whether `host` only reaches this machine (no API key needed there).
bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

std::atomic<int> g_signal{0};

[[maybe_unused]] void on_signal(int signal) {
  if (g_signal.exchange(signal) != 0) _exit(128 + signal);  // a second signal: leave now
}

void run_serve(const ServeArgs& args) {
#ifndef QSPEC_HAVE_SERVER
  fail("qspec serve: this qspec was built without the HTTP server (configured with -DQSPEC_SERVER=OFF; "
       "rebuild with cpp-httplib installed)");
#else
  // Which modes requests may ask for: the default, and QSpec's verify and draft (any request
  // may ask for QSpec), so the draft and gamma must be valid whatever the default mode. Bad
  // flags fail before the model loads; auto is known once it has.
  DecodePlan plan = args.plan;
  const bool auto_mode = plan.mode == decode_rules::kAutoMode;
  if (!auto_mode) validate(plan, "--");
  DecodePlan as_qspec = plan;
  as_qspec.mode = decode_rules::kQSpecMode;
  validate(as_qspec, "--");
  check_plan_kv_cache(as_qspec, args.engine.kv_cache);  // the engine-wide cache every request shares
  check_allowed_origins(args.allowed_origins, "--allowed-origins");

  auto model = LlamaModel::load(args.model_dir);
  const std::string auto_choice = resolve_auto_mode(plan, model->has_quantized_weights());
  if (auto_mode) {
    validate(plan, "--");
    std::fprintf(stderr, "[qspec] default %s\n", auto_choice.c_str());
  }
  std::vector<RunMode> modes;
  if (!plan.qspec()) modes.push_back(parse_run_mode(plan.mode));
  for (const std::string& name : as_qspec.modes()) modes.push_back(parse_run_mode(name));
  const std::string weights = prepare_model_for_modes(*model, modes, args.weights, args.group_size);
  auto tokenizer = Tokenizer::load(args.model_dir);
  tokenizer->check_model_vocab(model->config().vocab_size, args.model_dir);

  ServerOptions options;
  options.model_name = args.model_name;
  if (options.model_name.empty())
    options.model_name = std::filesystem::path(args.model_dir).lexically_normal().filename().string();
  if (options.model_name.empty())
    options.model_name = std::filesystem::path(args.model_dir).lexically_normal().parent_path().filename().string();
  options.default_plan = plan;
  options.default_plan_choice = auto_choice;
  options.max_body_bytes = args.max_body_bytes;
  options.http = args.http;
  options.api_key = args.api_key;
  options.allowed_origins = args.allowed_origins;
  options.access_log = !args.no_access_log;
  options.log_format = args.log_format == "json" ? LogFormat::json : LogFormat::text;
  if (options.api_key.empty())
    if (const char* key = std::getenv("QSPEC_API_KEY")) options.api_key = key;
  QSPEC_CHECK(args.ssl_certfile.empty() == args.ssl_keyfile.empty(),
              "--ssl-certfile and --ssl-keyfile go together (a PEM certificate chain and its private key)");
  if (!args.ssl_certfile.empty()) options.tls = TlsFiles{args.ssl_certfile, args.ssl_keyfile};
  options.engine = args.engine;
  options.engine.max_waiting = args.max_queue;
  // The GPU engine runs one mode, the default's (the engine refuses one the GPU does not run);
  // requests for another get a 400.
  // QSpec requests verify in the plan's verify mode there.
  if (options.engine.device == "cuda") options.engine.gpu_mode = plan.qspec() ? plan.verify : plan.mode;
  options.chat_template = load_server_chat_template(args.model_dir, args.chat_template);
  if (!options.chat_template)
    std::fprintf(stderr, "[qspec] %s has no chat template: /v1/chat/completions answers 400 (--chat-template FILE)\n",
                 args.model_dir.c_str());

  // Signals: the first SIGINT/SIGTERM sets a flag that a watcher thread turns into a
  // graceful shutdown (stop accepting, finish what runs); a second one exits at once.
  std::signal(SIGPIPE, SIG_IGN);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  const bool tls = options.tls.has_value();
  const bool has_key = !options.api_key.empty();
  // Descriptors for --max-connections: the soft limit up to the hard one (often 1024 soft,
  // far more hard), and the bound lowered to fit when even that is short.
  {
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
      if (files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
        getrlimit(RLIMIT_NOFILE, &files);
      }
      constexpr rlim_t kReserved = 64;  // model files, pipes, the listening socket
      if (files.rlim_cur != RLIM_INFINITY && static_cast<rlim_t>(options.http.max_connections) + kReserved > files.rlim_cur) {
        const int fit = static_cast<int>(files.rlim_cur > kReserved * 2 ? files.rlim_cur - kReserved : files.rlim_cur / 2);
        std::fprintf(stderr, "[qspec] warning: --max-connections %d lowered to %d (open-file limit %llu)\n",
                     options.http.max_connections, fit, static_cast<unsigned long long>(files.rlim_cur));
        options.http.max_connections = fit;
      }
    }
  }
  Server server(*model, *tokenizer, std::move(options));
  const int port = server.bind(args.host, args.port);
  if (!has_key && !is_loopback(args.host))
    std::fprintf(stderr,
                 "[qspec] warning: listening on %s without an API key: anyone who can reach this address can use "
                 "the model (--api-key KEY or QSPEC_API_KEY)\n",
                 args.host.c_str());
  std::fprintf(stderr,
               "[qspec] serving %s as '%s': mode %s (draft %s, gamma %lld), weights %s, batch %lld, queue %lld, "
               "context %lld\n",
               args.model_dir.c_str(), server.options().model_name.c_str(), plan.mode.c_str(),
               plan.draft.c_str(), static_cast<long long>(plan.gamma), weights.c_str(),
               static_cast<long long>(args.engine.max_batch_size), static_cast<long long>(args.max_queue),
               static_cast<long long>(server.engine().context_limit()));
  // Any request may ask for QSpec with draft auto (the default draft), so say what it plans with.
  std::fprintf(stderr, "[qspec] draft auto: %s\n", server.engine().qspec_planner().c_str());
  std::fprintf(stderr, "[qspec] listening on %s://%s:%d%s\n", tls ? "https" : "http", args.host.c_str(), port,
               has_key ? " (API key required)" : "");
  std::fflush(stderr);

  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    while (!finished) {
      if (g_signal != 0) {
        std::fprintf(stderr, "[qspec] signal %d: not accepting connections, draining %lld running and %lld waiting requests\n",
                     g_signal.load(), static_cast<long long>(server.engine().metrics().running),
                     static_cast<long long>(server.engine().metrics().waiting));
        std::fflush(stderr);
        while (!finished) {  // until run() has noticed
          server.shutdown();
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  server.run();
  finished = true;
  watcher.join();
  const EngineMetrics m = server.engine().metrics();
  std::fprintf(stderr, "[qspec] stopped: %lld requests finished, %lld cancelled, %lld generated tokens\n",
               static_cast<long long>(m.requests_finished), static_cast<long long>(m.requests_cancelled),
               static_cast<long long>(m.generated_tokens));
#endif
}

}  // namespace

void register_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* command = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, metrics)");
  add_model_argument(command, args->model_dir);
  command->add_option("--host", args->host, "Address to listen on")->capture_default_str();
  command->add_option("--port", args->port, "Port (0: an ephemeral port, printed at start-up)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  command->add_option("--served-model-name", args->model_name, "The model id clients send (default: the directory name)");
  add_mode_option(command, args->plan.mode, "Default mode of requests (\"qspec\": {\"mode\": ...} overrides)");
  add_qspec_options(command, args->plan, /*adaptive=*/false, "Default QSpec ", args->engine.qspec_costs);
  add_kv_cache_option(command, args->engine.kv_cache);
  command->add_option("--weights", args->weights, "4-bit weight format (RTN at load; default int4)");
  command->add_option("--group-size", args->group_size, "int4 group size along K (0: automatic)");
  command->add_option("--chat-template", args->chat_template,
                      "Jinja chat template file (overrides the checkpoint's chat_template)");
  command->add_option("--max-body-bytes", args->max_body_bytes, "Largest request body (413 beyond)")
      ->capture_default_str();
  command->add_option("--max-queue", args->max_queue, "Requests waiting for a batch slot before 429 (0: no bound)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--max-batch-size", args->engine.max_batch_size, "Running sequences at a time")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--max-batch-tokens", args->engine.max_batch_tokens, "Tokens of one engine step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--kv-blocks", args->engine.kv_blocks, "KV cache blocks (0: automatic)")->capture_default_str();
  command->add_option("--device", args->engine.device, "Where the model runs: cpu, or cuda (modes w16a16, w4a16, w4a8*, w4a4*, and qspec with a w4a8* / w4a4* draft)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  command->add_option("-c,--ctx-size,--max-model-len,--gpu-max-context", args->engine.max_context,
                      "Positions a sequence may hold, prompt and output (0: the model's context; it sizes the KV cache)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  args->engine.gpu_gemm_policy = "auto";
  command->add_option("--gemm-policy", args->engine.gpu_gemm_policy,
                      "cuda: a GEMM policy map from `qspec tune` on this GPU; auto: the one in bench/policies "
                      "(or $QSPEC_GEMM_POLICY_DIR) for this GPU and model, if any; none: built-in crossovers")
      ->check(CLI::IsMember({"auto", "none"}) | CLI::ExistingFile)
      ->capture_default_str();
  command->add_option("--http-threads", args->http.worker_threads,
                      "HTTP worker threads: requests served at once (a stream holds one; idle connections hold none)")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  command->add_option("--max-connections", args->http.max_connections,
                      "Open client connections, idle ones included (503 beyond)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command->add_option("--request-timeout", args->http.request_timeout_seconds,
                      "Seconds a client has to send one request, headers and body (408 beyond)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  command->add_option("--drain-timeout", args->http.drain_timeout_seconds,
                      "On SIGTERM / SIGINT: seconds the requests in flight get to finish before they are cancelled")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  command->add_option("--api-key", args->api_key,
                      "Require 'Authorization: Bearer KEY' on every route but /health (default: $QSPEC_API_KEY)");
  command->add_option("--allowed-origins", args->allowed_origins,
                      "CORS: browser origins allowed to call the API, comma-separated (https://app.example.com, "
                      "http://localhost:3000), or '*' for any (default: none, no CORS headers)")
      ->delimiter(',');
  command->add_flag("--no-access-log", args->no_access_log,
                    "No line per request on stderr (peer, method, route, status, prompt/completion tokens, latency)");
  command->add_option("--log-format", args->log_format, "The access log's lines: text, or one JSON object a line")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  command->add_option("--ssl-certfile", args->ssl_certfile, "Serve HTTPS: the PEM certificate (chain)")
      ->check(CLI::ExistingFile);
  command->add_option("--ssl-keyfile", args->ssl_keyfile, "Serve HTTPS: the PEM private key of --ssl-certfile")
      ->check(CLI::ExistingFile);
  command->callback([args] { run_serve(*args); });
}

}  // namespace qspec::cli
