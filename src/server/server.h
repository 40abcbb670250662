// The OpenAI-compatible HTTP server: one continuous-batching Engine on its background thread,
// HTTP/1.1 from cpp-httplib (one worker thread per open connection).
//
//   POST /v1/completions        prompt (text or token ids), non-streaming or SSE streaming
//   POST /v1/chat/completions   messages rendered with the chat template, same two forms
//   GET  /v1/models             the one served model
//   GET  /health                200 while serving, 503 while draining
//   GET  /metrics               Prometheus text: requests, tokens, queue, KV blocks, QSpec
//   POST /tokenize, /detokenize vLLM's: text or messages -> ids, ids -> text
//   GET  /tokenizer_info        vLLM's: special tokens, bos, context, chat template (lm-eval's
//                               remote tokenizer)
//
// Request fields: model, prompt | messages, max_tokens (chat: also max_completion_tokens),
// temperature, top_p, seed, stop (string or list), stream, stream_options.include_usage, n (1
// only), logprobs (chat: and top_logprobs), echo (completions; with max_tokens 0 it scores the
// prompt), presence_penalty, frequency_penalty, logit_bias, and the extensions top_k, min_p, repetition_penalty, ignore_eos and
//   "qspec": {"mode": "qspec" | "w4a16" | ..., "draft": "auto" | "w4a4-nvfp4" | "ngram" | ...,
//             "gamma": 4, "adaptive_gamma": false, "max_gamma": 8, "ngram_max": 3, "ngram_min": 1,
//             "draft_window": 0, "draft_sinks": 16, "draft_vocab": 0, "draft_skip": 0, "draft_kv4": false,
//             "ngram_corpus": true}
//   (draft_kv4 needs the server's --kv-cache int8; on an f16 cache it is a 400)
//   ("auto", the default draft, is the planner: its usage.qspec.planner says which plans ran
//   and why.)
// Every bad request is a 4xx with {"error": {"message", "type", "param", "code"}}; a full
// queue is 429; a field the server does not implement is a 400 naming it. A streaming client
// that disconnects has its request cancelled (its KV blocks go back to the pool).
// The connection layer (server/http_front.h) bounds what a client can cost: a deadline to
// send each request, caps on its head and on its body's decoded size (413 as it streams in,
// chunked and gzip bodies too), a bounded connection count (503 beyond); it terminates TLS.
// With an API key every route but /health wants `Authorization: Bearer KEY` (401 otherwise).
// shutdown() stops accepting connections and lets the requests in flight finish within
// http.drain_timeout_seconds (then they are cancelled); run() then drains the engine and returns.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qspec/engine.h"
#include "qspec/error.h"
#include "server/http_limits.h"
#include "tokenizer/chat_template.h"

namespace qspec {

class LlamaModel;
class Tokenizer;

// An error answered to the client: HTTP status and the OpenAI error object's fields.
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message, std::string type = "invalid_request_error",
           std::string param = "", std::string code = "")
      : Error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type, param, code;  // "" = null
};

// The access log's line format (--log-format): "[qspec] peer METHOD "route" status prompt=P
// completion=C 0.123s", or one JSON object a line.
enum class LogFormat { text, json };

// Throws qspec::Error naming `flag` unless each origin is "*" or a browser origin
// ("http://host[:port]" or "https://host[:port]", no path), as --allowed-origins takes them.
void check_allowed_origins(const std::vector<std::string>& origins, const std::string& flag);

struct ServerOptions {
  std::string model_name = "qspec";   // the id clients pass as "model"
  DecodePlan default_plan;             // requests without "qspec": {...} (qspec/decode_plan.h)
  // Why default_plan is what it is, when --mode auto chose it (resolve_auto_mode's words); "":
  // the mode was named. /metrics shows it.
  std::string default_plan_choice;
  size_t max_body_bytes = size_t{1} << 20;  // the decoded body (after chunking and gzip); 413 beyond
  HttpLimits http;                    // connections, deadlines, head caps, drain (server/http_limits.h)
  std::optional<TlsFiles> tls;        // serve HTTPS with this certificate and key
  std::string api_key;                // "": no authentication
  // CORS (browser pages on other origins calling the API): the origins answered with
  // Access-Control-Allow-Origin, "*" for any (check_allowed_origins); empty: none, no CORS headers.
  std::vector<std::string> allowed_origins;
  bool access_log = false;            // a line on stderr per request: peer, method, route, status, tokens, latency
  LogFormat log_format = LogFormat::text;
  double heartbeat_seconds = 1.0;     // SSE comment after this long without tokens (finds closed clients)
  EngineOptions engine;
  std::optional<ChatTemplate> chat_template;  // none: /v1/chat/completions answers 400
};

class Server {
 public:
  // The model and tokenizer must outlive the server; the model is ready for the modes it
  // will be asked for (prepare_model_for_modes). Starts the engine thread.
  Server(const LlamaModel& model, const Tokenizer& tokenizer, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket (port 0: an ephemeral port); returns the port. Throws
  // qspec::Error when the address cannot be bound.
  int bind(const std::string& host, int port);
  // Serves until shutdown(); then waits for the requests in flight, drains the engine and
  // returns.
  void run();
  // Stops accepting connections (thread-safe, callable from any thread, more than once).
  void shutdown();
  bool running() const;

  Engine& engine();
  const ServerOptions& options() const;

  // Handlers without HTTP, for tests: the /metrics text.
  std::string metrics_text() const;
  // For tests and the fuzz target: `input` as the bytes one connection sent, through the
  // real parsing, limits and routes; returns the bytes written back (no socket involved).
  std::string serve_bytes(std::string_view input);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Loads the chat template for `qspec serve`: `override_file` when given, else the model
// directory's (tokenizer_config.json chat_template or chat_template.jinja). Returns nullopt
// when the model has none and no override is given; throws qspec::Error naming the file when
// a template exists but does not parse or fails to render a one-message conversation.
std::optional<ChatTemplate> load_server_chat_template(const std::string& model_dir, const std::string& override_file);

}  // namespace qspec
