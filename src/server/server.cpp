// The OpenAI-compatible server: routes, streaming, metrics, API key (server/server.h).
#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "base/files.h"
#include "model/llama.h"
#include "server/http_front.h"
#include "server/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace qspec {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* kJson = "application/json";

// What the engine thread hands to the HTTP thread of one request.
struct Pending {
  std::mutex mutex;
  std::condition_variable changed;
  std::string text;        // not yet taken by the HTTP thread
  std::string all_text;    // everything (non-streaming answers)
  bool finished = false;
  std::string finish_reason, error;
  RequestMetrics metrics;
  std::vector<TokenLogprob> logprobs, prompt_logprobs;  // everything so far (the request asked)
};

// The engine may call back after the HTTP side has gone (a cancelled stream): the callback
// owns the state too.
TokenCallback pending_callback(std::shared_ptr<Pending> pending) {
  return [pending](const TokenEvent& event) {
    {
      std::lock_guard lock(pending->mutex);
      pending->text += event.text;
      pending->all_text += event.text;
      pending->logprobs.insert(pending->logprobs.end(), event.logprobs.begin(), event.logprobs.end());
      pending->prompt_logprobs.insert(pending->prompt_logprobs.end(), event.prompt_logprobs.begin(),
                                      event.prompt_logprobs.end());
      if (event.finished) {
        pending->finished = true;
        pending->finish_reason = event.finish_reason;
        pending->error = event.error;
        if (event.metrics) pending->metrics = *event.metrics;
      }
    }
    pending->changed.notify_all();
  };
}

// What the access log line of the request on this connection thread says beyond httplib's
// request and response: set by the handlers, read and reset by the logger (the same thread:
// httplib logs after writing the response, a stream included).
struct AccessRecord {
  std::optional<Clock::time_point> start;  // the head was read (the pre-routing guard)
  int64_t prompt_tokens = -1, completion_tokens = -1;  // generation routes
};
thread_local AccessRecord t_access;

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull));
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buffer;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Every JSON the server writes: invalid UTF-8 (a request path, a token piece, an echoed
// field) becomes U+FFFD instead of an exception.
std::string json_text(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& value) { return "data: " + json_text(value) + "\n\n"; }

// Compares without an early exit, so the time taken says nothing about the key.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0 && !b.empty();
}

// Templates and their config: regular files only, capped (a FIFO or /dev/zero is an error).
std::string read_file(const std::string& path) { return read_text_file(path, kMaxConfigJsonBytes); }

// Prometheus metric lines.
struct PromText {
  std::string out;
  void header(const std::string& name, const char* type, const std::string& help) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, double value, const std::string& labels = "") {
    char number[64];
    std::snprintf(number, sizeof number, "%.17g", value);
    out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number + "\n";
  }
  void metric(const std::string& name, const char* type, const char* help, double value) {
    header(name, type, help);
    sample(name, value);
  }
};

// What a CORS preflight may ask for (Access-Control-Allow-Methods), and how long a browser may
// keep its answer.
constexpr const char* kCorsMethods = "GET, POST, OPTIONS";
constexpr const char* kCorsMaxAgeSeconds = "600";

}  // namespace

void check_allowed_origins(const std::vector<std::string>& origins, const std::string& flag) {
  for (const std::string& origin : origins) {
    if (origin == "*") continue;
    const size_t scheme = origin.rfind("http://", 0) == 0 ? 7 : origin.rfind("https://", 0) == 0 ? 8 : 0;
    const std::string_view host = std::string_view(origin).substr(scheme);
    const bool host_ok = !host.empty() && host.find_first_of("/?#, \t\r\n") == std::string_view::npos;
    QSPEC_CHECK(scheme > 0 && host_ok, flag, ": '", origin,
                "' is not an origin: give \"*\" or origins such as https://app.example.com or http://localhost:3000 "
                "(scheme, host and port, no path), comma-separated");
  }
}

struct Server::Impl {
  const LlamaModel& model;
  const Tokenizer& tokenizer;
  ServerOptions options;
  Engine engine;
  HttpFront http;
  std::atomic<bool> draining{false};
  std::atomic<bool> bound{false};
  std::atomic<bool> serving{false};
  Clock::time_point started = Clock::now();
  // HTTP-level counters.
  std::atomic<int64_t> responses_2xx{0}, responses_4xx{0}, responses_5xx{0}, responses_429{0};
  std::atomic<int64_t> disconnects{0}, streams_open{0};

  Impl(const LlamaModel& m, const Tokenizer& t, ServerOptions o)
      : model(m), tokenizer(t), options(std::move(o)), engine(m, &t, options.engine), http(options.http, options.tls) {
    setup_routes();
    engine.start();
  }

  ApiContext context() const { return ApiContext{options, tokenizer, engine.context_limit()}; }

  void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                  const std::string& param = "", const std::string& code = "") {
    res.status = status;
    res.set_content(json_text(error_json(message, type, param, code)), kJson);
  }

  void send_api_error(httplib::Response& res, const ApiError& e) {
    send_error(res, e.status, e.what(), e.type, e.param, e.code);
  }

  // Submits to the engine; engine-side refusals become 4xx/429/503.
  RequestId submit(const Request& request, const std::shared_ptr<Pending>& pending) {
    if (draining) throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    try {
      return engine.submit(request, pending_callback(pending));
    } catch (const QueueFull& e) {
      throw ApiError(429, std::string("the server is overloaded, retry later (") + e.what() + ")",
                     "rate_limit_error", "", "queue_full");
    } catch (const Error& e) {
      if (draining) throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
      throw ApiError(400, e.what(), "invalid_request_error");
    }
  }

  json choice_json(bool chat, const std::string& text, const json& finish_reason, const json& logprobs) const {
    json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    else
      choice["text"] = text;
    return choice;
  }

  json chunk_json(bool chat, const std::string& id, int64_t created, const std::string& text, bool first,
                  const json& finish_reason, const json& logprobs = nullptr) const {
    json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
    if (chat) {
      json delta = json::object();
      if (first) delta["role"] = "assistant";
      if (!text.empty() || first) delta["content"] = text;
      choice["delta"] = delta;
    } else {
      choice["text"] = text;
    }
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", options.model_name},
            {"choices", json::array({choice})}};
  }

  // The body as it streams in, de-chunked and decompressed, capped at max_body_bytes: false
  // (with the answer in `res`) when it is over the cap or does not arrive.
  bool read_body(const httplib::ContentReader& reader, httplib::Response& res, std::string& body) {
    bool too_large = false;
    const bool ok = reader([&](const char* data, size_t size) {
      if (body.size() + size > options.max_body_bytes) {
        too_large = true;
        return false;  // stop reading: the rest is never buffered
      }
      body.append(data, size);
      return true;
    });
    if (ok && !too_large) return true;
    HttpFront::close_after_response(res);  // what is left of the body stays unread
    if (too_large) {
      send_error(res, 413, body_too_large_message(), "invalid_request_error", "", "body_too_large");
    } else if (HttpFront::read_failure_status() == 503) {
      send_error(res, 503, "the server is shutting down", "server_error", "", "shutting_down");
    } else if (HttpFront::read_failure_status() == 408) {
      send_error(res, 408, "the request body was not received within the request timeout", "invalid_request_error",
                 "", "request_timeout");
    } else {
      send_error(res, 400, "the request body could not be read (truncated, bad chunking or bad compression)",
                 "invalid_request_error");
    }
    return false;
  }

  std::string body_too_large_message() const {
    return "the request body is larger than " + std::to_string(options.max_body_bytes) +
           " bytes (--max-body-bytes; decoded size)";
  }

  void handle_generation(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                         bool chat) {
    std::string body;
    if (!read_body(reader, res, body)) return;
    ApiRequest api;
    try {
      api = parse_api_request(body, chat, context());
    } catch (const ApiError& e) {
      return send_api_error(res, e);
    } catch (const Error& e) {
      return send_error(res, 400, e.what(), "invalid_request_error");
    }
    auto pending = std::make_shared<Pending>();
    RequestId id;
    try {
      id = submit(api.request, pending);
    } catch (const ApiError& e) {
      return send_api_error(res, e);
    }
    const bool qspec = api.request.plan.qspec();
    const std::string response_id = random_id(chat ? "chatcmpl-" : "cmpl-");
    const int64_t created = unix_time();
    // Logprobs in the response's shape, for entries [from, to) of the output's and (echo) the
    // prompt's; the first prompt token has none.
    const int32_t top = api.request.logprobs;
    const bool echo = api.echo;
    const int32_t first_prompt_id = api.request.prompt.front();
    auto logprobs_json = [this, chat, top, echo, first_prompt_id](const std::vector<TokenLogprob>& prompt_part,
                                                                 bool with_first, const std::vector<TokenLogprob>& output,
                                                                 int64_t& text_offset) -> json {
      if (top < 0) return nullptr;
      if (chat) return chat_logprobs_json(tokenizer, output, top);
      std::vector<TokenLogprob> entries;
      if (echo && with_first) entries.push_back(TokenLogprob{first_prompt_id, 0.0f, {}});
      if (echo) entries.insert(entries.end(), prompt_part.begin(), prompt_part.end());
      entries.insert(entries.end(), output.begin(), output.end());
      return completion_logprobs_json(tokenizer, entries, echo && with_first, text_offset);
    };

    if (!api.stream) {
      std::unique_lock lock(pending->mutex);
      pending->changed.wait(lock, [&] { return pending->finished; });
      t_access.prompt_tokens = pending->metrics.prompt_tokens;
      t_access.completion_tokens = pending->metrics.generated_tokens;
      if (pending->finish_reason == "error")
        return send_error(res, 500, "generation failed: " + pending->error, "server_error");
      if (pending->finish_reason == "cancelled")
        return send_error(res, 503, "the request was cancelled (server shutting down)", "server_error");
      int64_t text_offset = 0;
      const json logprobs = logprobs_json(pending->prompt_logprobs, true, pending->logprobs, text_offset);
      json body = {{"id", response_id},
                   {"object", chat ? "chat.completion" : "text_completion"},
                   {"created", created},
                   {"model", options.model_name},
                   {"choices", json::array({choice_json(chat, (echo ? api.echo_text : "") + pending->all_text,
                                                        openai_finish_reason(pending->finish_reason), logprobs)})},
                   {"usage", usage_json(pending->metrics, qspec)}};
      res.status = 200;
      res.set_content(json_text(body), kJson);
      return;
    }

    // Server-sent events: one chunk per step that produced text, a last chunk with the
    // finish_reason, usage when asked for, then [DONE].
    ++streams_open;
    auto done = std::make_shared<std::atomic<bool>>(false);
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    const bool include_usage = api.include_usage;
    const std::string echo_text = echo ? api.echo_text : "";
    const bool score_prompt = api.request.prompt_logprobs;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, pending, done, chat, response_id, created, qspec, include_usage, logprobs_json, echo_text,
         score_prompt](size_t, httplib::DataSink& sink) {
          bool first = true;
          size_t logprobs_sent = 0, prompt_logprobs_sent = 0;
          int64_t text_offset = 0;
          auto write = [&](const std::string& data) { return sink.write(data.data(), data.size()); };
          for (;;) {
            std::string text;
            bool finished = false, ready = true;
            std::vector<TokenLogprob> new_logprobs, new_prompt_logprobs;
            const bool lead = first && !chat && !echo_text.empty();  // the echoed prompt goes first
            {
              std::unique_lock lock(pending->mutex);
              pending->changed.wait_for(lock, std::chrono::duration<double>(options.heartbeat_seconds), [&] {
                return !pending->text.empty() || pending->finished || pending->logprobs.size() > logprobs_sent;
              });
              // Echo with prompt logprobs: the first chunk waits until the prompt is scored (an
              // output token or the end comes after its last chunk).
              ready = !lead || !score_prompt || pending->finished || !pending->logprobs.empty();
              if (ready) {
                text.swap(pending->text);
                finished = pending->finished;
                new_logprobs.assign(pending->logprobs.begin() + static_cast<std::ptrdiff_t>(logprobs_sent),
                                    pending->logprobs.end());
                new_prompt_logprobs.assign(
                    pending->prompt_logprobs.begin() + static_cast<std::ptrdiff_t>(prompt_logprobs_sent),
                    pending->prompt_logprobs.end());
              }
            }
            logprobs_sent += new_logprobs.size();
            prompt_logprobs_sent += new_prompt_logprobs.size();
            bool ok;
            if (ready && (!text.empty() || (first && chat) || lead || !new_logprobs.empty())) {
              const json logprobs = logprobs_json(new_prompt_logprobs, first, new_logprobs, text_offset);
              ok = write(sse(chunk_json(chat, response_id, created, (lead ? echo_text : "") + text, first, nullptr,
                                        logprobs)));
              first = false;
            } else if (!finished) {
              ok = write(": keep-alive\n\n");  // finds a client that has gone away
            } else {
              ok = true;
            }
            if (!ok) return false;  // the client disconnected: the releaser cancels
            if (finished) break;
          }
          std::string reason, error;
          RequestMetrics metrics;
          {
            std::lock_guard lock(pending->mutex);
            reason = pending->finish_reason, error = pending->error, metrics = pending->metrics;
          }
          t_access.prompt_tokens = metrics.prompt_tokens;
          t_access.completion_tokens = metrics.generated_tokens;
          bool ok;
          if (reason == "error" || reason == "cancelled") {
            ok = write(sse(error_json(reason == "error" ? "generation failed: " + error : "the request was cancelled",
                                      "server_error", "", "")));
          } else {
            json last = chunk_json(chat, response_id, created, "", false, openai_finish_reason(reason));
            if (qspec) last["usage"] = usage_json(metrics, qspec);  // the acceptance statistics
            ok = write(sse(last));
            if (ok && include_usage) {
              json usage = chunk_json(chat, response_id, created, "", false, nullptr);
              usage["choices"] = json::array();
              usage["usage"] = usage_json(metrics, qspec);
              ok = write(sse(usage));
            }
          }
          ok = ok && write("data: [DONE]\n\n");
          if (!ok) return false;
          done->store(true);
          sink.done();
          return true;
        },
        [this, pending, done, id](bool) {
          --streams_open;
          if (!done->load()) {
            bool finished;
            {
              std::lock_guard lock(pending->mutex);
              finished = pending->finished;
            }
            if (!finished) {
              ++disconnects;
              engine.cancel(id);
            }
          }
        });
  }

  // CORS (--allowed-origins): a request from an allowed origin gets Access-Control-Allow-Origin on
  // its answer, whatever the answer (a 401 too, so a page can read why). A preflight (OPTIONS with
  // Access-Control-Request-Method) is answered here with 204, before the API key check: browsers
  // send it without credentials. True when the request was a preflight (answered).
  bool answer_cors(const httplib::Request& req, httplib::Response& res) const {
    const bool preflight = req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method");
    if (options.allowed_origins.empty() || !req.has_header("Origin")) {
      if (preflight) res.status = 204;  // no CORS here: the browser refuses the call itself
      return preflight;
    }
    const std::string origin = req.get_header_value("Origin");
    const auto& allowed = options.allowed_origins;
    const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
    if (any) {
      res.set_header("Access-Control-Allow-Origin", "*");
    } else {
      res.set_header("Vary", "Origin");  // the answer depends on it: caches must keep them apart
      if (std::find(allowed.begin(), allowed.end(), origin) != allowed.end())
        res.set_header("Access-Control-Allow-Origin", origin);
    }
    if (!preflight) return false;
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", kCorsMethods);
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
    res.set_header("Access-Control-Max-Age", kCorsMaxAgeSeconds);
    return true;
  }

  // The API key check, before every route but /health (which load balancers probe).
  httplib::Server::HandlerResponse check_api_key(const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string header = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const bool has_bearer = header.size() > prefix.size() && header.compare(0, prefix.size(), prefix) == 0;
    if (has_bearer && same_secret(header.substr(prefix.size()), options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401,
               has_bearer ? "incorrect API key provided" : "an API key is required: send 'Authorization: Bearer KEY'",
               "invalid_request_error", "", "invalid_api_key");
    res.set_header("WWW-Authenticate", "Bearer");  // the front closes the connection if a body was sent
    return httplib::Server::HandlerResponse::Handled;
  }

  void setup_routes() {
    // The decoded body is capped by read_body; this makes httplib refuse a declared
    // Content-Length beyond the cap before reading it.
    http.set_payload_max_length(options.max_body_bytes);
    http.set_request_guard([this](const httplib::Request& req, httplib::Response& res) {
      t_access = AccessRecord{Clock::now()};
      if (answer_cors(req, res)) return httplib::Server::HandlerResponse::Handled;
      return check_api_key(req, res);
    });
    http.set_error_body([](int status, const std::string& message, const std::string& code) {
      return json_text(error_json(message, status >= 500 ? "server_error" : "invalid_request_error", "", code));
    });
    // Past the drain timeout, requests still running are cancelled (their handlers answer 503).
    http.set_drain_timeout_callback([this] { engine.stop(/*drain=*/false); });

    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) { handle_generation(req, res, reader, false); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                handle_generation(req, res, reader, true);
              });
    // vLLM's /tokenize and /detokenize (what a client needs to count tokens or map ids back).
    auto json_route = [this](json (*respond)(const std::string&, const ApiContext&)) {
      return [this, respond](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
        std::string body;
        if (!read_body(reader, res, body)) return;
        try {
          res.set_content(json_text(respond(body, context())), kJson);
        } catch (const ApiError& e) {
          send_api_error(res, e);
        } catch (const Error& e) {
          send_error(res, 400, e.what(), "invalid_request_error");
        }
      };
    };
    http.Post("/tokenize", json_route(&tokenize_response));
    http.Post("/detokenize", json_route(&detokenize_response));
    http.Get("/tokenizer_info", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(json_text(tokenizer_info_response(context())), kJson);
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json model_json = {{"id", options.model_name},
                         {"object", "model"},
                         {"created", unix_time()},
                         {"owned_by", "qspec"},
                         {"max_model_len", engine.context_limit()}};
      res.set_content(json_text(json{{"object", "list"}, {"data", json::array({model_json})}}), kJson);
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (draining) {
        res.status = 503;
        res.set_content(json_text(json{{"status", "draining"}}), kJson);
      } else {
        res.set_content(json_text(json{{"status", "ok"}}), kJson);
      }
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
    });
    // Anything that reaches here without a body (unknown route, body too large, bad HTTP):
    // the OpenAI error object. httplib calls this outside its own try block, so nothing may
    // escape it.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      try {
        HttpFront::close_after_response(res);  // the request may not have been read to its end
        if (const int status = HttpFront::read_failure_status()) res.status = status;
        std::string message = "HTTP error " + std::to_string(res.status);
        std::string code;
        if (res.status == 400) message = "malformed HTTP request";
        if (res.status == 404) message = "no route " + req.method + " " + req.path, code = "not_found";
        if (res.status == 405) message = "method " + req.method + " is not allowed on " + req.path;
        if (res.status == 408) message = "the request was not received within the request timeout", code = "request_timeout";
        if (res.status == 413) message = body_too_large_message(), code = "body_too_large";
        if (res.status == 414) message = "the request URI is too long";
        if (res.status == 431)
          message = "too many header fields or header bytes (at most " +
                    std::to_string(options.http.max_header_count) + " fields, " +
                    std::to_string(options.http.max_header_bytes) + " bytes)",
          code = "header_too_large";
        res.set_content(json_text(error_json(message, res.status >= 500 ? "server_error" : "invalid_request_error", "", code)),
                        kJson);
      } catch (...) {
        res.set_content("{\"error\": {\"message\": \"HTTP error\", \"type\": \"server_error\", \"param\": null, \"code\": null}}",
                        kJson);
      }
    });
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = std::string("internal error: ") + e.what();
      } catch (...) {
      }
      try {
        send_error(res, 500, message, "server_error");
      } catch (...) {
        res.status = 500;
      }
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      if (options.access_log) write_access_log(req, res);
      t_access = AccessRecord{};
      if (res.status == 429) ++responses_429;
      if (res.status >= 500)
        ++responses_5xx;
      else if (res.status >= 400)
        ++responses_4xx;
      else
        ++responses_2xx;
    });
  }

  // One line a request on stderr, as llama.cpp's and vLLM's servers write: peer, method, route,
  // status, prompt / completion tokens (generation routes), latency from the request head to
  // the response's end; ServerOptions::log_format picks text or one JSON object.
  void write_access_log(const httplib::Request& req, const httplib::Response& res) const {
    const double latency = t_access.start ? std::chrono::duration<double>(Clock::now() - *t_access.start).count() : 0.0;
    std::string line;
    if (options.log_format == LogFormat::json) {
      json record = {{"time", unix_time()},         {"remote", req.remote_addr}, {"method", req.method},
                     {"route", req.path},           {"status", res.status},      {"latency_s", latency},
                     {"prompt_tokens", nullptr},    {"completion_tokens", nullptr}};
      if (t_access.prompt_tokens >= 0) record["prompt_tokens"] = t_access.prompt_tokens;
      if (t_access.completion_tokens >= 0) record["completion_tokens"] = t_access.completion_tokens;
      line = json_text(record);
    } else {
      char tokens[64] = "";
      if (t_access.prompt_tokens >= 0)
        std::snprintf(tokens, sizeof tokens, " prompt=%lld completion=%lld", static_cast<long long>(t_access.prompt_tokens),
                      static_cast<long long>(t_access.completion_tokens));
      char tail[64];
      std::snprintf(tail, sizeof tail, " %.3fs", latency);
      line = "[qspec] " + req.remote_addr + " " + req.method + " " + json_text(json(req.path)) + " " +
             std::to_string(res.status) + tokens + tail;
    }
    line += "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of concurrent requests do not interleave
  }

  std::string metrics_text() const {
    const EngineMetrics m = engine.metrics();
    PromText p;
    p.header("qspec_requests_total", "counter", "Engine requests by outcome");
    p.sample("qspec_requests_total", static_cast<double>(m.requests_submitted), "outcome=\"submitted\"");
    p.sample("qspec_requests_total", static_cast<double>(m.requests_finished), "outcome=\"finished\"");
    p.sample("qspec_requests_total", static_cast<double>(m.requests_cancelled), "outcome=\"cancelled\"");
    p.sample("qspec_requests_total", static_cast<double>(m.requests_failed), "outcome=\"failed\"");
    p.sample("qspec_requests_total", static_cast<double>(m.requests_rejected), "outcome=\"rejected\"");
    p.header("qspec_http_responses_total", "counter", "HTTP responses by status class");
    p.sample("qspec_http_responses_total", static_cast<double>(responses_2xx.load()), "class=\"2xx\"");
    p.sample("qspec_http_responses_total", static_cast<double>(responses_4xx.load()), "class=\"4xx\"");
    p.sample("qspec_http_responses_total", static_cast<double>(responses_5xx.load()), "class=\"5xx\"");
    p.metric("qspec_http_responses_429_total", "counter", "Requests refused because the queue was full",
             static_cast<double>(responses_429.load()));
    p.metric("qspec_client_disconnects_total", "counter", "Streams cancelled because the client went away",
             static_cast<double>(disconnects.load()));
    p.metric("qspec_prompt_tokens_total", "counter", "Prompt tokens of submitted requests",
             static_cast<double>(m.prompt_tokens));
    p.metric("qspec_generated_tokens_total", "counter", "Generated tokens", static_cast<double>(m.generated_tokens));
    p.metric("qspec_generated_tokens_per_second", "gauge", "Generated tokens per second of engine busy time",
             m.generated_tokens_per_second());
    p.metric("qspec_engine_busy_seconds_total", "counter", "Time the engine spent in steps", m.busy_seconds);
    p.metric("qspec_engine_steps_total", "counter", "Scheduling steps", static_cast<double>(m.steps));
    p.metric("qspec_engine_forward_passes_total", "counter", "Forward passes", static_cast<double>(m.forward_passes));
    p.metric("qspec_preemptions_total", "counter", "Sequences whose KV blocks were taken back",
             static_cast<double>(m.preemptions));
    p.metric("qspec_requests_waiting", "gauge", "Requests queued for a batch slot (queue depth)",
             static_cast<double>(m.waiting));
    p.metric("qspec_requests_running", "gauge", "Requests in the running batch", static_cast<double>(m.running));
    p.metric("qspec_kv_blocks_used", "gauge", "KV cache blocks in use", static_cast<double>(m.kv_blocks_used));
    p.metric("qspec_kv_blocks_total", "gauge", "KV cache blocks in the pool", static_cast<double>(m.kv_blocks_total));
    p.metric("qspec_kv_block_usage_ratio", "gauge", "Fraction of KV blocks in use",
             m.kv_blocks_total > 0 ? static_cast<double>(m.kv_blocks_used) / static_cast<double>(m.kv_blocks_total)
                                   : 0.0);
    // The engine-wide KV cache format (--kv-cache) and the bytes its host pool holds.
    p.header("qspec_kv_cache_info", "gauge", "The KV cache's format (--kv-cache): f16 or int8");
    p.sample("qspec_kv_cache_info", 1.0, "format=\"" + options.engine.kv_cache + "\"");
    p.metric("qspec_kv_cache_bytes", "gauge", "Bytes of the KV cache's host pool (0 when its rows are on the GPU)",
             static_cast<double>(m.kv_cache_bytes));
    const QSpecMetrics& q = m.qspec;
    p.metric("qspec_spec_drafted_tokens_total", "counter", "QSpec draft tokens offered for verification",
             static_cast<double>(q.drafted));
    p.metric("qspec_spec_accepted_tokens_total", "counter", "QSpec draft tokens accepted",
             static_cast<double>(q.accepted));
    p.metric("qspec_spec_acceptance_rate", "gauge", "QSpec accepted / drafted over finished requests",
             q.acceptance_rate());
    p.metric("qspec_spec_draft_seconds_total", "counter", "QSpec time in draft passes", q.draft_seconds);
    p.metric("qspec_spec_verify_seconds_total", "counter", "QSpec time in verify passes", q.verify_seconds);
    // Accepted draft tokens per verify cycle, as a cumulative histogram.
    p.header("qspec_spec_accepted_length", "histogram", "QSpec accepted draft tokens per cycle");
    int64_t cumulative = 0;
    for (size_t k = 0; k < q.accepted_histogram.size(); ++k) {
      cumulative += q.accepted_histogram[k];
      p.sample("qspec_spec_accepted_length_bucket", static_cast<double>(cumulative), "le=\"" + std::to_string(k) + "\"");
    }
    p.sample("qspec_spec_accepted_length_bucket", static_cast<double>(q.cycles), "le=\"+Inf\"");
    p.sample("qspec_spec_accepted_length_sum", static_cast<double>(q.accepted));
    p.sample("qspec_spec_accepted_length_count", static_cast<double>(q.cycles));
    // Draft auto: sequence steps by the plan the planner chose ("w4a16" plain, or "DRAFT gGAMMA").
    if (!q.plan_steps.empty()) {
      p.header("qspec_spec_plan_steps_total", "counter",
               "Draft auto: decode steps of finished requests by the planner's plan");
      for (const auto& [plan, steps] : q.plan_steps)
        p.sample("qspec_spec_plan_steps_total", static_cast<double>(steps), "plan=\"" + plan + "\"");
    }
    // The plan of requests that name no mode, and whether --mode auto chose it (and why): QSpec
    // with the planner, say, whose plan_steps above show where it speculated.
    const DecodePlan& plan = options.default_plan;
    p.header("qspec_default_plan_info", "gauge",
             options.default_plan_choice.empty() ? "The plan of requests that name no mode (--mode)"
                                                 : "The plan of requests that name no mode; " +
                                                       options.default_plan_choice);
    p.sample("qspec_default_plan_info", 1.0,
             "mode=\"" + plan.mode + "\",draft=\"" + (plan.qspec() ? draft_spec(plan) : std::string()) +
                 "\",chosen_by=\"" + (options.default_plan_choice.empty() ? "flag" : "auto") + "\"");
    p.header("qspec_batch_size_steps_total", "counter", "Engine steps by running sequences");
    for (size_t b = 0; b < m.batch_size_histogram.size(); ++b)
      if (m.batch_size_histogram[b] > 0)
        p.sample("qspec_batch_size_steps_total", static_cast<double>(m.batch_size_histogram[b]),
                 "size=\"" + std::to_string(b) + "\"");
    p.metric("qspec_streams_open", "gauge", "Streaming responses in progress", static_cast<double>(streams_open.load()));
    const HttpFrontStats h = http.stats();
    p.metric("qspec_http_connections_open", "gauge", "Open client connections", static_cast<double>(h.connections_open));
    p.metric("qspec_http_connections_total", "counter", "Client connections accepted",
             static_cast<double>(h.connections_accepted));
    p.metric("qspec_http_connections_refused_total", "counter", "Connections answered 503 over --max-connections",
             static_cast<double>(h.connections_refused));
    p.metric("qspec_http_request_timeouts_total", "counter", "Requests not received within --request-timeout (408)",
             static_cast<double>(h.request_timeouts));
    p.metric("qspec_http_heads_too_large_total", "counter", "Requests whose headers were over the caps (431)",
             static_cast<double>(h.heads_too_large));
    p.metric("qspec_http_tls_handshake_failures_total", "counter", "TLS handshakes that failed or timed out",
             static_cast<double>(h.tls_handshake_failures));
    p.metric("qspec_uptime_seconds", "gauge", "Seconds since the server started",
             std::chrono::duration<double>(Clock::now() - started).count());
    return p.out;
  }
};

Server::Server(const LlamaModel& model, const Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, tokenizer, std::move(options))) {}

Server::~Server() {
  shutdown();
  impl_->engine.stop(/*drain=*/false);
}

int Server::bind(const std::string& host, int port) {
  int bound_port = port;
  if (port == 0) {
    bound_port = impl_->http.bind_to_any_port(host);
    QSPEC_CHECK(bound_port > 0, "serve: cannot bind an ephemeral port on ", host);
  } else {
    QSPEC_CHECK(impl_->http.bind_to_port(host, port), "serve: cannot bind ", host, ":", port,
                " (address in use or not available)");
  }
  impl_->http.widen_listen_backlog();
  impl_->bound = true;
  return bound_port;
}

void Server::run() {
  QSPEC_CHECK(impl_->bound, "serve: bind() before run()");
  impl_->serving = true;
  if (!impl_->draining) impl_->http.listen_after_bind();
  impl_->serving = false;
  // The HTTP workers have finished (their requests are done); let the engine finish too.
  impl_->engine.stop(/*drain=*/true);
}

void Server::shutdown() {
  impl_->draining = true;
  // run() may be between its check of `draining` and the listen loop's start; stop() only
  // takes effect on a running loop.
  while (impl_->serving && !impl_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
}

bool Server::running() const { return impl_->http.is_running(); }
Engine& Server::engine() { return impl_->engine; }
const ServerOptions& Server::options() const { return impl_->options; }
std::string Server::metrics_text() const { return impl_->metrics_text(); }
std::string Server::serve_bytes(std::string_view input) { return impl_->http.serve_bytes(input); }

std::optional<ChatTemplate> load_server_chat_template(const std::string& model_dir, const std::string& override_file) {
  namespace fs = std::filesystem;
  const fs::path config_path = fs::path(model_dir) / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(config_path)) {
    try {
      config = nlohmann::json::parse(read_file(config_path.string()));
    } catch (const nlohmann::json::exception& e) {
      fail(config_path.string(), ": malformed JSON: ", e.what());
    }
  }
  std::optional<ChatTemplate> chat;
  if (!override_file.empty()) {
    try {
      chat = ChatTemplate::parse(read_file(override_file));
    } catch (const Error& e) {
      fail("--chat-template ", override_file, ": ", e.what());
    }
    // The model's special tokens, as load_chat_template sets them.
    for (const char* name : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (!config.is_object() || !config.contains(name)) continue;
      const nlohmann::json& v = config[name];
      if (v.is_string()) chat->set_default(name, v);
      if (v.is_object() && v.contains("content") && v["content"].is_string()) chat->set_default(name, v["content"]);
    }
  } else {
    const bool has = (config.is_object() && config.contains("chat_template") && !config["chat_template"].is_null()) ||
                     fs::exists(fs::path(model_dir) / "chat_template.jinja");
    if (!has) return std::nullopt;
    try {
      chat = load_chat_template(model_dir);
    } catch (const Error& e) {
      fail(e.what(), " (give a template that works with --chat-template FILE)");
    }
  }
  try {
    chat->render({{"user", "Hello"}}, /*add_generation_prompt=*/true);
  } catch (const Error& e) {
    fail(override_file.empty() ? model_dir : override_file,
         ": the chat template fails on a one-message conversation: ", e.what(),
         " (give a template that works with --chat-template FILE)");
  }
  return chat;
}

}  // namespace qspec
