// libFuzzer target for the HTTP server's whole request -> response path: the input is the
// bytes one client connection sends (request line, headers, body, pipelined requests), served
// through the real connection limits, parsing, routes and handlers of `qspec serve` on the
// bundled model (no socket: Server::serve_bytes). Checks that every answer is a well-formed
// HTTP/1.1 response and none is a 500; a crash, hang or sanitizer report is a finding too.
// The model is $QSPEC_FUZZ_MODEL, by default models/gsm-synth-llama of this source tree.
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "base/thread_pool.h"
#include "model/llama.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string source_root() { return QSPEC_FUZZ_SOURCE_ROOT; }  // set by tests/CMakeLists.txt

struct Served {
  std::unique_ptr<qspec::LlamaModel> model;
  std::unique_ptr<qspec::Tokenizer> tokenizer;
  std::unique_ptr<qspec::Server> server;
  Served() {
    std::signal(SIGPIPE, SIG_IGN);
    const char* env = std::getenv("QSPEC_FUZZ_MODEL");
    const std::string dir = env ? env : source_root() + "/models/gsm-synth-llama";
    model = qspec::LlamaModel::load(dir);
    model->quantize_weights(qspec::quant::Format::int4);
    tokenizer = qspec::Tokenizer::load(dir);
    qspec::ServerOptions options;
    options.model_name = "m";
    options.max_body_bytes = 64 << 10;
    options.engine.max_batch_size = 4;
    options.engine.max_waiting = 16;
    options.heartbeat_seconds = 0.01;
    options.api_key = "";  // every route reachable
    options.chat_template =
        qspec::load_server_chat_template(dir, source_root() + "/tests/data/chat_templates/llama3.jinja");
    server = std::make_unique<qspec::Server>(*model, *tokenizer, std::move(options));
  }
};

Served* served_instance = nullptr;
void served_server_stop() {
  if (served_instance != nullptr) served_instance->server.reset();
}

Served& served() {
  // Never destroyed, but its server (and with it the engine thread) is stopped at exit by a
  // handler registered after the statics the engine uses exist (the CPU thread pool made first),
  // so it runs before their destructors. Left running, an engine thread still busy with a fuzzed
  // request could use the pool while exit destroys it (a rare crash after the last input, which
  // libFuzzer reports against an empty unit).
  static Served* instance = [] {
    qspec::ThreadPool::global();
    served_instance = new Served();
    std::atexit(served_server_stop);
    return served_instance;
  }();
  return *instance;
}

// Every "HTTP/1.1 NNN" status line in the output; aborts on a malformed one or a 500.
void check_responses(const std::string& out) {
  size_t pos = 0;
  while ((pos = out.find("HTTP/1.1 ", pos)) != std::string::npos) {
    if (pos != 0 && out.compare(pos - 2, 2, "\r\n") != 0 && out.compare(pos - 1, 1, "}") != 0) {
      pos += 9;  // inside a body (an echoed string), not a status line
      continue;
    }
    if (pos + 12 > out.size()) break;
    const std::string code = out.substr(pos + 9, 3);
    for (char c : code)
      if (c < '0' || c > '9') {
        std::fprintf(stderr, "malformed status line: %s\n", out.substr(pos, 40).c_str());
        std::abort();
      }
    if (code == "500") {
      std::fprintf(stderr, "a 500 answer:\n%s\n", out.c_str());
      std::abort();
    }
    pos += 12;
  }
  if (!out.empty() && out.rfind("HTTP/1.1 ", 0) != 0) {
    std::fprintf(stderr, "output does not start with a status line: %s\n", out.substr(0, 60).c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (256 << 10)) return 0;
  const std::string out = served().server->serve_bytes(std::string_view(reinterpret_cast<const char*>(data), size));
  check_responses(out);
  return 0;
}
