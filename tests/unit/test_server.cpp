// The OpenAI-compatible server (src/server) in-process on 127.0.0.1 with an ephemeral port,
// on gsm-synth-llama with RTN int4 weights, driven by cpp-httplib's client: completions equal
// the standalone greedy generate(); streamed chunks concatenate to the same text; chat renders
// the template; every bad request is a 4xx with an OpenAI error object and the server keeps
// serving; a full queue answers 429; /metrics is Prometheus text; a client that disconnects
// mid-stream has its request cancelled and its KV blocks freed; shutdown drains. The
// ServerHardening tests are each named after a defect a hostile client found (issue 48).
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "model/llama.h"
#include "runtime/generate.h"
#include "server/openai_api.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
const std::string kModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
const std::string kName = "gsm-synth-llama";
const std::string kPrompt = "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:";

struct Model {
  std::unique_ptr<qspec::LlamaModel> model;
  std::unique_ptr<qspec::Tokenizer> tokenizer;
  Model() {
    std::signal(SIGPIPE, SIG_IGN);
    model = qspec::LlamaModel::load(kModel);
    model->quantize_weights(qspec::quant::Format::int4);
    tokenizer = qspec::Tokenizer::load(kModel);
  }
};

Model& fixture() {
  static Model instance;
  return instance;
}

// The standalone greedy output of a prompt: ids and text.
struct Reference {
  std::vector<int32_t> ids;
  std::string text, finish_reason;
};

Reference reference(const std::vector<int32_t>& prompt, int64_t max_new_tokens, const std::string& mode = "w4a16",
                    bool ignore_eos = false) {
  qspec::GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  if (!ignore_eos) options.eos_ids = fixture().tokenizer->eos_ids;
  options.mode = qspec::parse_run_mode(mode);
  options.mode.activations.group_size = fixture().model->auto_group_size();
  auto result = qspec::generate(*fixture().model, prompt, options);
  return {result.ids, fixture().tokenizer->decode(result.ids, /*skip_special=*/true),
          qspec::openai_finish_reason(result.finish_reason)};
}

std::vector<int32_t> encode_prompt(const std::string& text) {
  const auto& t = *fixture().tokenizer;
  return t.encode(text, t.bos_id.has_value() && t.add_bos_by_default);
}

// A server on its own thread; destroyed: shutdown + join.
struct Running {
  std::unique_ptr<qspec::Server> server;
  std::thread thread;
  int port = 0;
  Running(qspec::ServerOptions options) {
    server = std::make_unique<qspec::Server>(*fixture().model, *fixture().tokenizer, std::move(options));
    port = server->bind("127.0.0.1", 0);
    thread = std::thread([this] { server->run(); });
  }
  ~Running() {
    server->shutdown();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) const {
    return client().Post(path.c_str(), body, "application/json");
  }
  httplib::Result post(const std::string& path, const json& body) const { return post(path, body.dump()); }
  httplib::Result get(const std::string& path) const { return client().Get(path.c_str()); }
};

qspec::ServerOptions base_options() {
  qspec::ServerOptions o;
  o.model_name = kName;
  o.engine.max_batch_size = 4;
  o.engine.max_waiting = 64;
  o.http.worker_threads = 16;
  o.heartbeat_seconds = 0.05;
  return o;
}

qspec::ServerOptions chat_options() {
  auto o = base_options();
  o.chat_template = qspec::load_server_chat_template(kModel, QSPEC_TEST_DATA "/chat_templates/llama3.jinja");
  return o;
}

// Streams a request; returns the SSE data payloads (the raw body too). abort_after > 0: stop
// reading (closing the connection) after that many data events.
std::vector<std::string> stream(const Running& server, const std::string& path, const json& body,
                                int abort_after = 0, std::string* raw = nullptr) {
  httplib::Client c = server.client();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buffer;
  std::vector<std::string> events;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    if (raw) raw->append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) events.push_back(event.substr(6));
    }
    return abort_after == 0 || static_cast<int>(events.size()) < abort_after;
  };
  httplib::Response res;
  httplib::Error error;
  c.send(req, res, error);
  return events;
}

// Concatenated text of completion (or chat) stream chunks, and the finish reason.
std::pair<std::string, std::string> join_stream(const std::vector<std::string>& events, bool chat) {
  std::string text, finish;
  EXPECT_FALSE(events.empty());
  if (events.empty()) return {};
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], chat ? "chat.completion.chunk" : "text_completion");
    if (chunk["choices"].empty()) continue;  // the usage chunk
    const json& choice = chunk["choices"][0];
    if (chat) {
      if (choice["delta"].contains("content")) text += choice["delta"]["content"].get<std::string>();
    } else {
      text += choice["text"].get<std::string>();
    }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  return {text, finish};
}

// An OpenAI error answer: status and the error object's shape.
void expect_error(const httplib::Result& res, int status, const std::string& param = "", const std::string& code = "") {
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, status) << res->body;
  json body;
  ASSERT_NO_THROW(body = json::parse(res->body)) << res->body;
  ASSERT_TRUE(body.contains("error")) << res->body;
  const json& e = body["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << res->body;
  EXPECT_TRUE(e["type"].is_string()) << res->body;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << res->body;
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << res->body;
  }
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << res->body;
  }
}

// Prometheus text: every sample line "name{labels} value" with a number.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (\S+)$)");
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, sample)) << "bad metrics line: " << line;
    if (!m.empty()) samples[m[1]] = std::stod(m[3]);
  }
  return samples;
}

template <typename Predicate>
// Generous: sanitizer builds on a loaded 2-core CI machine run 10x slower.
bool wait_for(Predicate predicate, double seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return predicate();
}

TEST(Server, CompletionEqualsStandaloneGreedyAndStreamsTheSameText) {
  Running server(base_options());
  const auto prompt = encode_prompt(kPrompt);
  const Reference ref = reference(prompt, 40);
  ASSERT_FALSE(ref.ids.empty());

  auto res = server.post("/v1/completions", json{{"model", kName}, {"prompt", kPrompt}, {"max_tokens", 40},
                                                 {"temperature", 0}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], kName);
  EXPECT_EQ(body["choices"][0]["text"], ref.text);
  EXPECT_EQ(body["choices"][0]["finish_reason"], ref.finish_reason);
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], ref.ids.size());
  EXPECT_EQ(body["usage"]["total_tokens"], prompt.size() + ref.ids.size());
  EXPECT_FALSE(body["usage"].contains("qspec"));

  // The same prompt as token ids.
  res = server.post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], ref.text);

  // Streamed: the chunks concatenate to the same text; usage on request.
  auto events = stream(server, "/v1/completions",
                       json{{"model", kName}, {"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0},
                            {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  auto [text, finish] = join_stream(events, false);
  EXPECT_EQ(text, ref.text);
  EXPECT_EQ(finish, ref.finish_reason);
  EXPECT_GT(events.size(), 3u);  // several text chunks, not one
  ASSERT_GE(events.size(), 2u);
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], ref.ids.size());

  // A length-limited request says "length".
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 3}, {"temperature", 0}});
  ASSERT_TRUE(res);
  body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["choices"][0]["text"], fixture().tokenizer->decode({ref.ids.begin(), ref.ids.begin() + 3}, true));

  // A stop string ends the text before it, with finish_reason "stop".
  ASSERT_GE(ref.text.size(), 8u);
  const std::string stop_at = ref.text.substr(ref.text.size() / 2, 2);
  res = server.post("/v1/completions",
                    json{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {stop_at}}});
  ASSERT_TRUE(res);
  body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["text"], ref.text.substr(0, ref.text.find(stop_at)));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
}

TEST(Server, QSpecModePerRequestMatchesW4A16AndReportsAcceptance) {
  Running server(base_options());
  const auto prompt = encode_prompt(kPrompt);
  const Reference ref = reference(prompt, 32);
  auto res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 32}, {"temperature", 0},
                                                 {"qspec", {{"mode", "qspec"}, {"draft", "w4a8"}, {"gamma", 3}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["text"], ref.text);  // greedy QSpec == greedy w4a16
  const json& q = body["usage"]["qspec"];
  ASSERT_TRUE(q.is_object()) << res->body;
  EXPECT_GT(q["drafted"].get<int64_t>(), 0);
  EXPECT_LE(q["accepted"].get<int64_t>(), q["drafted"].get<int64_t>());
  EXPECT_EQ(q["gamma"], 3);
  EXPECT_NEAR(q["acceptance_rate"].get<double>(),
              static_cast<double>(q["accepted"].get<int64_t>()) / q["drafted"].get<double>(), 1e-9);

  // The metrics see it (published at the end of the engine step that finished it).
  std::map<std::string, double> metrics;
  EXPECT_TRUE(wait_for([&] {
    metrics = parse_prometheus(server.get("/metrics")->body);
    return metrics["qspec_spec_drafted_tokens_total"] > 0;
  }));
  EXPECT_EQ(metrics["qspec_spec_drafted_tokens_total"], q["drafted"].get<double>());
  EXPECT_EQ(metrics["qspec_spec_accepted_length_count"], q["cycles"].get<double>());
  EXPECT_EQ(metrics["qspec_spec_accepted_length_bucket{le=\"+Inf\"}"], q["cycles"].get<double>());

  // A mode that does not exist is a 400 naming it.
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"qspec", {{"mode", "w3a1"}}}});
  expect_error(res, 400);
  EXPECT_NE(res->body.find("w3a1"), std::string::npos);

  // "ngram_corpus": n-gram lookups in earlier requests' text too, or not; W4A16's text either way
  // (the second and third requests repeat the first's prompt, so the corpus holds its text). Not
  // a boolean: a 400 naming it.
  for (bool corpus : {true, true, false}) {
    res = server.post("/v1/completions",
                      json{{"prompt", kPrompt}, {"max_tokens", 32}, {"temperature", 0},
                           {"qspec", {{"mode", "qspec"}, {"draft", "ngram"}, {"ngram_corpus", corpus}}}});
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], ref.text) << "ngram_corpus " << corpus;
  }
  res = server.post("/v1/completions",
                    json{{"prompt", kPrompt}, {"qspec", {{"mode", "qspec"}, {"draft", "ngram"}, {"ngram_corpus", "on"}}}});
  expect_error(res, 400);
  EXPECT_NE(res->body.find("ngram_corpus"), std::string::npos);
}

// "draft": "auto" (and QSpec without a draft: auto is the default) is the planner: W4A16's text,
// and usage.qspec.planner says which plans ran and why; /metrics counts the steps by plan. A
// rule it breaks is a 400 naming the field.
TEST(Server, QSpecDraftAutoMatchesW4A16AndReportsThePlanner) {
  Running server(base_options());
  const Reference ref = reference(encode_prompt(kPrompt), 32);
  for (const json& qspec : {json{{"mode", "qspec"}, {"draft", "auto"}, {"max_gamma", 4}}, json{{"mode", "qspec"}}}) {
    auto res = server.post("/v1/completions",
                           json{{"prompt", kPrompt}, {"max_tokens", 32}, {"temperature", 0}, {"qspec", qspec}});
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json body = json::parse(res->body);
    EXPECT_EQ(body["choices"][0]["text"], ref.text);
    const json& planner = body["usage"]["qspec"]["planner"];
    ASSERT_TRUE(planner.is_object()) << res->body;
    int64_t steps = 0;
    for (const auto& [plan, n] : planner["steps"].items()) steps += n.get<int64_t>();
    EXPECT_GE(steps + body["usage"]["qspec"]["accepted"].get<int64_t>(),
              body["usage"]["completion_tokens"].get<int64_t>() - 1);  // every decode step was planned
    // The last plan's reason names its batch and where its prices came from (a table's measured
    // costs, or without one this engine's own passes, timed or being explored).
    const std::string reason = planner["reason"].get<std::string>();
    EXPECT_NE(reason.find("(batch "), std::string::npos) << planner.dump();
    EXPECT_TRUE(reason.find("costs") != std::string::npos || reason.find("passes") != std::string::npos ||
                reason.find("no step-cost table") != std::string::npos)
        << planner.dump();
  }
  std::map<std::string, double> metrics;
  EXPECT_TRUE(wait_for([&] {
    metrics = parse_prometheus(server.get("/metrics")->body);
    double steps = 0;
    for (const auto& [name, value] : metrics)
      if (name.rfind("qspec_spec_plan_steps_total{plan=", 0) == 0) steps += value;
    return steps > 0;
  }));
  auto res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"qspec", {{"mode", "qspec"}, {"draft", "auto"},
                                                                                  {"draft_window", 64}}}});
  expect_error(res, 400);
  EXPECT_NE(res->body.find("qspec.draft_window"), std::string::npos) << res->body;
  // A vocabulary subset below the smallest, and one the model has no table for: 400s that name
  // the field and say how to make the table.
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"qspec", {{"mode", "qspec"}, {"draft", "w4a8"},
                                                                             {"draft_vocab", 10}}}});
  expect_error(res, 400);
  EXPECT_NE(res->body.find("qspec.draft_vocab"), std::string::npos) << res->body;
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"qspec", {{"mode", "qspec"}, {"draft", "w4a8"},
                                                                             {"draft_vocab", 128}}}});
  expect_error(res, 400);
  EXPECT_NE(res->body.find("tune-draft"), std::string::npos) << res->body;
  // Layer skipping without a skip table (the message says how to make one), and a negative
  // count: 400s naming the field.
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"qspec", {{"mode", "qspec"}, {"draft", "w4a8"},
                                                                             {"draft_skip", 2}}}});
  expect_error(res, 400);
  EXPECT_NE(res->body.find("draft_skip"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("tune-draft"), std::string::npos) << res->body;
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"qspec", {{"mode", "qspec"}, {"draft", "w4a8"},
                                                                             {"draft_skip", -1}}}});
  expect_error(res, 400);
  EXPECT_NE(res->body.find("'draft_skip' must be in"), std::string::npos) << res->body;
}

// serve's default, mode auto, on 4-bit weights: QSpec with the planner as the plan of requests
// that name no mode (W4A16's text, usage.qspec.planner), and /metrics says auto chose it and
// why; a request that names a mode still gets it.
TEST(Server, DefaultPlanChosenByAutoModeIsReported) {
  qspec::ServerOptions options = base_options();
  options.default_plan = qspec::command_plan();
  options.default_plan_choice = qspec::resolve_auto_mode(options.default_plan, /*checkpoint_has_4bit_weights=*/true);
  Running server(options);
  const Reference ref = reference(encode_prompt(kPrompt), 24);
  auto res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["text"], ref.text);
  EXPECT_TRUE(body["usage"]["qspec"]["planner"].is_object()) << res->body;
  res = server.post("/v1/completions",
                    json{{"prompt", kPrompt}, {"max_tokens", 24}, {"temperature", 0}, {"qspec", {{"mode", "w4a16"}}}});
  ASSERT_EQ(res->status, 200) << res->body;
  body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["text"], ref.text);
  EXPECT_FALSE(body["usage"].contains("qspec")) << res->body;
  const std::string text = server.get("/metrics")->body;
  EXPECT_EQ(parse_prometheus(text)["qspec_default_plan_info{mode=\"qspec\",draft=\"auto\",chosen_by=\"auto\"}"], 1)
      << text;
  EXPECT_NE(text.find("# HELP qspec_default_plan_info The plan of requests that name no mode; mode auto: qspec"),
            std::string::npos)
      << text;
}

TEST(Server, ChatRendersTheTemplateAndStreams) {
  Running server(chat_options());
  const json messages = json::array({{{"role", "system"}, {"content", "You solve math problems."}},
                                     {{"role", "user"}, {"content", "Tom has 3 apples and buys 5 more."}}});
  const std::string rendered = server.server->options().chat_template->render(
      {{"system", "You solve math problems."}, {"user", "Tom has 3 apples and buys 5 more."}}, true);
  EXPECT_NE(rendered.find("<|start_header_id|>assistant<|end_header_id|>"), std::string::npos);
  const auto prompt = fixture().tokenizer->encode(rendered, false);
  // The math model ends a chat turn at once; ignore_eos gives it text to stream.
  const Reference ref = reference(prompt, 24, "w4a16", /*ignore_eos=*/true);
  ASSERT_FALSE(ref.text.empty());

  auto res = server.post("/v1/chat/completions", json{{"model", kName}, {"messages", messages}, {"max_tokens", 24},
                                                      {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());

  auto events = stream(server, "/v1/chat/completions",
                       json{{"messages", messages}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true},
                            {"ignore_eos", true}});
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  auto [text, finish] = join_stream(events, true);
  EXPECT_EQ(text, ref.text);
  EXPECT_EQ(finish, ref.finish_reason);

  // Content as a list of text parts is the same conversation.
  json parts = messages;
  parts[1]["content"] = json::array({{{"type", "text"}, {"text", "Tom has 3 apples "}},
                                     {{"type", "text"}, {"text", "and buys 5 more."}}});
  res = server.post("/v1/chat/completions", json{{"messages", parts}, {"max_tokens", 24}, {"temperature", 0},
                                                                 {"ignore_eos", true}});
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["choices"][0]["message"]["content"], ref.text);
}

TEST(Server, ChatWithoutTemplateIs400AndCompletionsStillWork) {
  // A model directory with the fixture's tokenizer_config.json and no chat_template.jinja.
  const std::filesystem::path bare = std::filesystem::path(::testing::TempDir()) / "qspec_server_no_template";
  std::filesystem::create_directories(bare);
  std::filesystem::copy_file(kModel + "/tokenizer_config.json", bare / "tokenizer_config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto options = base_options();
  options.chat_template = qspec::load_server_chat_template(bare.string(), "");
  EXPECT_FALSE(options.chat_template.has_value());
  Running server(std::move(options));
  auto res = server.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  expect_error(res, 400, "messages", "no_chat_template");
  EXPECT_NE(res->body.find("--chat-template"), std::string::npos);
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

// The bundled model chats with its own template (models/gsm-synth-llama/chat_template.jinja):
// a user turn is the "Question: ...\nAnswer:" text it was trained on, so the answer is the
// completion of that text; earlier turns are question / answer pairs, system turns dropped.
TEST(Server, BundledModelChatsWithItsTemplate) {
  auto options = base_options();
  options.chat_template = qspec::load_server_chat_template(kModel, "");
  ASSERT_TRUE(options.chat_template.has_value());
  EXPECT_EQ(options.chat_template->render({{"system", "be brief"}, {"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}},
                                          /*add_generation_prompt=*/true),
            "Question: Q1\nAnswer: A1\n\nQuestion: Q2\nAnswer:");
  Running server(std::move(options));
  const std::string question = "Tom has 3 apples and buys 5 more. How many apples does he have?";
  auto chat = server.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", question}}}},
                                                        {"max_tokens", 24}, {"temperature", 0}});
  auto completion = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_TRUE(chat && completion);
  ASSERT_EQ(chat->status, 200) << chat->body;
  EXPECT_EQ(json::parse(chat->body)["choices"][0]["message"]["content"],
            json::parse(completion->body)["choices"][0]["text"]);
}

TEST(Server, ChatTemplateErrorsAreClearAtStartup) {
  const std::string dir = ::testing::TempDir() + "/qspec_server_templates";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  try {
    qspec::load_server_chat_template(kModel, write("bad.jinja", "{% for m in messages %}{{ m.content }}"));
    FAIL() << "an unterminated for loop parsed";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jinja"), std::string::npos) << e.what();
  }
  try {
    qspec::load_server_chat_template(kModel, write("raises.jinja", "{{ raise_exception('no users here') }}"));
    FAIL() << "a template that always raises was accepted";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no users here"), std::string::npos) << e.what();
  }
  EXPECT_THROW(qspec::load_server_chat_template(kModel, dir + "/missing.jinja"), qspec::Error);
}

TEST(Server, BadRequestsAre4xxWithErrorObjectsAndTheServerKeepsServing) {
  auto options = base_options();
  options.max_body_bytes = 4096;
  options.chat_template = chat_options().chat_template;
  Running server(std::move(options));
  const std::string ok_prompt = kPrompt;
  struct Case {
    const char* path;
    std::string body;
    int status;
    std::string param, code;
  };
  const std::string long_prompt = [] {
    std::string s;
    for (int i = 0; i < 700; ++i) s += " 7 +";
    return s;
  }();
  std::vector<int32_t> long_ids(1024, 5);
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": \"hi\", ", 400, "", "invalid_json"},
      {"/v1/completions", "[1, 2, 3]", 400, "", "invalid_json"},
      {"/v1/completions", "", 400, "", "invalid_json"},
      {"/v1/completions", json{{"max_tokens", 4}}.dump(), 400, "prompt", ""},
      {"/v1/completions", json{{"prompt", 42}}.dump(), 400, "prompt", ""},
      {"/v1/completions", json{{"prompt", {1, "x"}}}.dump(), 400, "prompt", ""},
      {"/v1/completions", json{{"prompt", {1, 100000}}}.dump(), 400, "prompt", ""},
      {"/v1/completions", json{{"prompt", {"a", "b"}}}.dump(), 400, "prompt", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"max_tokens", "8"}}.dump(), 400, "max_tokens", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"max_tokens", 0}}.dump(), 400, "max_tokens", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"max_tokens", -5}}.dump(), 400, "max_tokens", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"max_tokens", 5000}}.dump(), 400, "max_tokens", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"max_tokens", 1010}}.dump(), 400, "max_tokens",
       "context_length_exceeded"},
      {"/v1/completions", json{{"prompt", long_ids}}.dump(), 400, "prompt", "context_length_exceeded"},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"temperature", "hot"}}.dump(), 400, "temperature", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"temperature", 3.5}}.dump(), 400, "temperature", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"top_p", 0}}.dump(), 400, "top_p", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"top_k", -1}}.dump(), 400, "top_k", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"seed", 1.5}}.dump(), 400, "seed", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"stop", 7}}.dump(), 400, "stop", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"stop", {""}}}.dump(), 400, "stop", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"stream", "yes"}}.dump(), 400, "stream", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"n", 2}}.dump(), 400, "n", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"qspec", "fast"}}.dump(), 400, "qspec", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"qspec", {{"gamma", 40}}}}.dump(), 400, "gamma", ""},
      {"/v1/completions", json{{"prompt", ok_prompt}, {"qspec", {{"colour", 1}}}}.dump(), 400, "qspec.colour", ""},
      {"/v1/completions", json{{"model", "gpt-4"}, {"prompt", ok_prompt}}.dump(), 404, "model", "model_not_found"},
      {"/v1/completions", json{{"model", 7}, {"prompt", ok_prompt}}.dump(), 400, "model", ""},
      {"/v1/chat/completions", json{{"messages", "hi"}}.dump(), 400, "messages", ""},
      {"/v1/chat/completions", json{{"messages", json::array()}}.dump(), 400, "messages", ""},
      {"/v1/chat/completions", json{{"messages", {{{"content", "hi"}}}}}.dump(), 400, "messages[0].role", ""},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", 5}}}}}.dump(), 400,
       "messages[0].content", ""},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", long_prompt}}}}}.dump(), 400,
       "messages", "context_length_exceeded"},
      {"/v1/completions", std::string(5000, ' '), 413, "", "body_too_large"},
      {"/v1/nothing", "{}", 404, "", "not_found"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.path) + " " + c.body.substr(0, 120));
    auto res = server.post(c.path, c.body);
    expect_error(res, c.status, c.param, c.code);
  }
  expect_error(server.get("/v1/unknown"), 404);
  // Still serving: a good request and the health check.
  auto res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], reference(encode_prompt(kPrompt), 8).text);
  res = server.get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  auto metrics = parse_prometheus(server.get("/metrics")->body);
  EXPECT_GE(metrics["qspec_http_responses_total{class=\"4xx\"}"], static_cast<double>(cases.size()));
  EXPECT_EQ(metrics["qspec_http_responses_total{class=\"5xx\"}"], 0);
}

TEST(Server, ModelsHealthAndMetricsEndpoints) {
  Running server(base_options());
  auto res = server.get("/v1/models");
  ASSERT_TRUE(res);
  json models = json::parse(res->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], kName);
  EXPECT_EQ(models["data"][0]["object"], "model");
  res = server.get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["status"], "ok");

  ASSERT_EQ(server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0},
                                                {"ignore_eos", true}})
                ->status,
            200);
  EXPECT_TRUE(wait_for([&] {
    return parse_prometheus(server.get("/metrics")->body)["qspec_requests_total{outcome=\"finished\"}"] == 1;
  }));
  res = server.get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  auto m = parse_prometheus(res->body);
  for (const char* name : {"qspec_requests_total{outcome=\"finished\"}", "qspec_generated_tokens_total",
                           "qspec_generated_tokens_per_second", "qspec_requests_waiting", "qspec_requests_running",
                           "qspec_kv_blocks_used", "qspec_kv_blocks_total", "qspec_spec_acceptance_rate",
                           "qspec_spec_accepted_length_count", "qspec_spec_draft_seconds_total",
                           "qspec_spec_verify_seconds_total"})
    EXPECT_TRUE(m.count(name)) << "missing " << name;
  EXPECT_EQ(m["qspec_requests_total{outcome=\"finished\"}"], 1);
  EXPECT_EQ(m["qspec_generated_tokens_total"], 6);
  EXPECT_GT(m["qspec_generated_tokens_per_second"], 0);
  EXPECT_GT(m["qspec_kv_blocks_total"], 0);
  EXPECT_EQ(m["qspec_kv_blocks_used"], 0);
  EXPECT_EQ(m["qspec_requests_running"], 0);
  // Every metric has its TYPE line.
  EXPECT_NE(res->body.find("# TYPE qspec_spec_accepted_length histogram"), std::string::npos);
  EXPECT_NE(res->body.find("# TYPE qspec_generated_tokens_total counter"), std::string::npos);
}

TEST(Server, FullQueueAnswers429AndTheServerRecovers) {
  auto options = base_options();
  options.engine.max_batch_size = 1;
  options.engine.max_waiting = 1;
  options.http.worker_threads = 24;
  Running server(std::move(options));
  const int clients = 10;
  std::vector<int> status(clients, 0);
  std::vector<std::thread> threads;
  std::atomic<int> go{0};
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      ++go;
      while (go < clients) std::this_thread::yield();
      auto res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 200}, {"temperature", 0},
                                                     {"ignore_eos", true}});
      status[i] = res ? res->status : -1;
      if (res && res->status == 429) expect_error(res, 429, "", "queue_full");
    });
  for (auto& t : threads) t.join();
  int ok = 0, refused = 0;
  for (int s : status) {
    ok += s == 200;
    refused += s == 429;
  }
  EXPECT_EQ(ok + refused, clients) << "every answer is 200 or 429";
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1) << "10 concurrent 200-token requests fit a batch of 1 plus a queue of 1";
  auto m = parse_prometheus(server.get("/metrics")->body);
  EXPECT_EQ(m["qspec_requests_total{outcome=\"rejected\"}"], refused);
  EXPECT_EQ(m["qspec_http_responses_429_total"], refused);
  auto res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(Server, ClientDisconnectCancelsTheStreamAndFreesItsBlocks) {
  Running server(base_options());
  auto events = stream(server, "/v1/completions",
                       json{{"prompt", kPrompt}, {"max_tokens", 900}, {"temperature", 0}, {"stream", true},
                            {"ignore_eos", true}},
                       /*abort_after=*/2);
  EXPECT_EQ(events.size(), 2u);
  auto metrics = [&] { return parse_prometheus(server.get("/metrics")->body); };
  EXPECT_TRUE(wait_for([&] {
    auto m = metrics();
    return m["qspec_requests_total{outcome=\"cancelled\"}"] == 1 && m["qspec_kv_blocks_used"] == 0 &&
           m["qspec_requests_running"] == 0;
  })) << server.get("/metrics")->body;
  auto m = metrics();
  EXPECT_EQ(m["qspec_client_disconnects_total"], 1);
  EXPECT_LT(m["qspec_generated_tokens_total"], 900) << "the request ran to its end instead of being cancelled";
  EXPECT_EQ(m["qspec_streams_open"], 0);
}

TEST(Server, ShutdownDrainsStreamsInFlight) {
  auto running = std::make_unique<Running>(base_options());
  std::vector<std::string> events;
  std::thread client([&] {
    events = stream(*running, "/v1/completions",
                    json{{"prompt", kPrompt}, {"max_tokens", 300}, {"temperature", 0}, {"stream", true},
                         {"ignore_eos", true}});
  });
  ASSERT_TRUE(wait_for([&] { return running->server->engine().metrics().running == 1; }));
  running->server->shutdown();  // stop accepting; the stream in flight finishes
  EXPECT_TRUE(wait_for([&] { return !running->server->running(); }, 300));
  client.join();
  auto [text, finish] = join_stream(events, false);
  EXPECT_EQ(finish, "length");
  EXPECT_FALSE(text.empty());
  running->thread.join();
  running->thread = std::thread([] {});
  const auto m = running->server->engine().metrics();
  EXPECT_EQ(m.requests_finished, 1);
  EXPECT_EQ(m.generated_tokens, 300);
  EXPECT_EQ(m.requests_cancelled, 0);
  // No new connections after shutdown.
  httplib::Client c("127.0.0.1", running->port);
  c.set_connection_timeout(1, 0);
  EXPECT_FALSE(c.Get("/health"));
}

// ---- Hardening (issue 48): each test is named after a defect a hostile client found ----

// A raw TCP client: what a hostile client sends, byte for byte.
struct RawClient {
  int fd = -1;
  explicit RawClient(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~RawClient() {
    if (fd >= 0) ::close(fd);
  }
  bool send_bytes(const std::string& bytes) const {
    return fd >= 0 && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }
  // Everything until the server closes or `seconds` pass.
  std::string read_all(double seconds = 30) const {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (fd >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buffer[4096];
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
};

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

void expect_still_serving(const Running& server) {
  auto health = server.get("/health");
  ASSERT_TRUE(health) << "the server stopped answering";
  EXPECT_EQ(health->status, 200);
  auto res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  const auto ref = reference(encode_prompt(kPrompt), 8);
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], ref.text);
}

TEST(ServerHardening, InvalidUtf8InThePathIs404NotAnAbort) {
  Running server(base_options());
  RawClient raw(server.port);
  ASSERT_TRUE(raw.send_bytes("GET /%FF%FE\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string response = raw.read_all();
  EXPECT_EQ(status_of(response), 404) << response;
  EXPECT_NE(response.find("\"not_found\""), std::string::npos) << response;
  EXPECT_NE(response.find("\xef\xbf\xbd"), std::string::npos) << "the bad bytes become U+FFFD: " << response;
  expect_still_serving(server);
}

TEST(ServerHardening, InvalidUtf8InTheBodyIs400Not500) {
  Running server(base_options());
  for (const std::string& body : {std::string("{\"prompt\": \"a\xff\xfe b\", \"max_tokens\": 4}"),
                                  std::string("{\"prompt\": \"hi\", \"max_tokens\": 4, \"stop\": [\"\xc3\"]}"),
                                  std::string("{\"prompt\": \"hi\", \"model\": \"\xed\xa0\x80\"}")}) {
    auto res = server.post("/v1/completions", body);
    expect_error(res, 400);
  }
  expect_still_serving(server);
}

TEST(ServerHardening, GzipBodyIsCappedAtItsDecodedSize) {
  auto options = base_options();
  options.max_body_bytes = 1 << 20;
  Running server(std::move(options));
  // 64 MiB of JSON whitespace around a valid request gzips to ~64 KiB.
  std::string body = "{\"prompt\": \"hi\", \"max_tokens\": 4" + std::string(64 << 20, ' ') + "}";
  httplib::Client c = server.client();
  c.set_compress(true);
  const auto start = std::chrono::steady_clock::now();
  auto res = c.Post("/v1/completions", body, "application/json");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_error(res, 413, "", "body_too_large");
  EXPECT_LT(seconds, 20.0) << "refused as it streams in, not after decoding it all";
  expect_still_serving(server);
}

TEST(ServerHardening, ChunkedBodyOverTheCapIs413) {
  auto options = base_options();
  options.max_body_bytes = 64 << 10;
  Running server(std::move(options));
  httplib::Client c = server.client();
  const std::string piece(16 << 10, ' ');
  size_t sent = 0;
  auto res = c.Post(
      "/v1/completions",
      [&](size_t, httplib::DataSink& sink) {
        if (sent == 0) sink.write("{\"prompt\": \"hi\"", 15);
        if (sent < (4u << 20)) {
          sink.write(piece.data(), piece.size());
          sent += piece.size();
        } else {
          sink.write("}", 1);
          sink.done();
        }
        return true;
      },
      "application/json");
  expect_error(res, 413, "", "body_too_large");
  expect_still_serving(server);
}

TEST(ServerHardening, DeclaredBodyOverTheCapIs413BeforeItIsRead) {
  auto options = base_options();
  options.max_body_bytes = 4096;
  Running server(std::move(options));
  RawClient raw(server.port);  // declares 10 GB and sends none of it
  ASSERT_TRUE(raw.send_bytes("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n"));
  const auto start = std::chrono::steady_clock::now();
  const std::string response = raw.read_all(20);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(status_of(response), 413) << response;
  EXPECT_NE(response.find("body_too_large"), std::string::npos) << response;
  EXPECT_LT(seconds, 5.0);
  expect_still_serving(server);
}

TEST(ServerHardening, SlowHeaderClientsDoNotStarveTheServer) {
  auto options = base_options();
  options.http.worker_threads = 4;
  options.http.request_timeout_seconds = 3;
  Running server(std::move(options));
  // 24 clients (6x the workers) each sending one header byte every 200 ms.
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 24; ++i) slow.push_back(std::make_unique<RawClient>(server.port));
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (size_t i = 0; !stop && i < 1000; ++i) {
      for (auto& c : slow) c->send_bytes(std::string(1, i < head.size() ? head[i] : 'a'));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (int i = 0; i < 5; ++i) {
    httplib::Client c("127.0.0.1", server.port);
    c.set_read_timeout(2, 0);
    c.set_connection_timeout(2, 0);
    auto health = c.Get("/health");
    ASSERT_TRUE(health) << "GET /health starved by slow clients";
    EXPECT_EQ(health->status, 200);
  }
  // Past the request timeout every slow client has had its 408 and been closed.
  std::string answer;
  for (auto& c : slow) answer = c->read_all(10);
  stop = true;
  trickle.join();
  EXPECT_EQ(status_of(answer), 408) << answer;
  EXPECT_NE(answer.find("request_timeout"), std::string::npos) << answer;
  expect_still_serving(server);
}

TEST(ServerHardening, SlowClientDoesNotHoldTheShutdownDrain) {
  auto options = base_options();
  options.http.request_timeout_seconds = 60;
  auto running = std::make_unique<Running>(std::move(options));
  RawClient slow(running->port);
  ASSERT_TRUE(slow.send_bytes("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"));
  RawClient slow_body(running->port);  // a head that is in, a body that never comes
  ASSERT_TRUE(slow_body.send_bytes("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  running->server->shutdown();
  running->thread.join();
  running->thread = std::thread([] {});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "the drain waited for a client that sends nothing";
}

TEST(ServerHardening, DrainIsBoundedByTheDrainTimeout) {
  auto options = base_options();
  options.http.drain_timeout_seconds = 0;  // requests in flight at shutdown are cancelled at once
  auto running = std::make_unique<Running>(std::move(options));
  std::optional<httplib::Result> result;
  std::thread client([&] {
    result.emplace(running->post("/v1/completions",
                                 json{{"prompt", kPrompt}, {"max_tokens", 900}, {"temperature", 0}, {"ignore_eos", true}}));
  });
  const bool started = wait_for([&] { return running->server->engine().metrics().running == 1; });
  running->server->shutdown();
  running->thread.join();
  running->thread = std::thread([] {});
  client.join();
  ASSERT_TRUE(started);
  ASSERT_TRUE(result.has_value());
  expect_error(*result, 503);
  const auto m = running->server->engine().metrics();
  EXPECT_EQ(m.requests_cancelled, 1);
  EXPECT_LT(m.generated_tokens, 900);
}

TEST(ServerHardening, RequestNotSentWithinTheDeadlineIs408) {
  auto options = base_options();
  options.http.request_timeout_seconds = 1;
  Running server(std::move(options));
  RawClient raw(server.port);
  ASSERT_TRUE(raw.send_bytes("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"pr"));
  const auto start = std::chrono::steady_clock::now();
  const std::string response = raw.read_all(20);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(status_of(response), 408) << response;
  EXPECT_LT(seconds, 10.0);
  expect_still_serving(server);
}

TEST(ServerHardening, ConnectionsOverTheBoundGet503) {
  auto options = base_options();
  options.http.max_connections = 4;
  Running server(std::move(options));
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<RawClient>(server.port));
  ASSERT_TRUE(wait_for([&] { return server.server->metrics_text().find("qspec_http_connections_open 4") != std::string::npos; }, 10));
  RawClient extra(server.port);
  ASSERT_TRUE(extra.send_bytes("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string response = extra.read_all(10);
  EXPECT_EQ(status_of(response), 503) << response;
  EXPECT_NE(response.find("too_many_connections"), std::string::npos) << response;
  idle.clear();  // the bound frees up again
  ASSERT_TRUE(wait_for([&] { return server.server->metrics_text().find("qspec_http_connections_open 0") != std::string::npos; }, 10));
  expect_still_serving(server);
}

TEST(ServerHardening, HeadsOverTheCapsAre431) {
  auto options = base_options();
  options.http.max_header_bytes = 8 << 10;
  options.http.max_header_count = 20;
  Running server(std::move(options));
  {
    std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 30; ++i) head += "X-H" + std::to_string(i) + ": v\r\n";
    RawClient raw(server.port);
    ASSERT_TRUE(raw.send_bytes(head + "\r\n"));
    const std::string response = raw.read_all();
    EXPECT_EQ(status_of(response), 431) << response;
  }
  {
    std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 40; ++i) head += "X-Big" + std::to_string(i) + ": " + std::string(1000, 'a') + "\r\n";
    RawClient raw(server.port);
    raw.send_bytes(head + "\r\n");
    const std::string response = raw.read_all();
    EXPECT_EQ(status_of(response), 431) << response;
  }
  expect_still_serving(server);
}

TEST(ServerHardening, ApiKeyIsCheckedOnEveryRouteButHealth) {
  auto options = base_options();
  options.api_key = "sk-test-123";
  Running server(std::move(options));
  httplib::Client c = server.client();
  expect_error(c.Get("/v1/models"), 401, "", "invalid_api_key");
  expect_error(c.Get("/metrics"), 401, "", "invalid_api_key");
  expect_error(c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 4}}.dump(), "application/json"), 401,
               "", "invalid_api_key");
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  httplib::Headers wrong = {{"Authorization", "Bearer sk-test-124"}};
  expect_error(c.Get("/v1/models", wrong), 401, "", "invalid_api_key");
  httplib::Headers right = {{"Authorization", "Bearer sk-test-123"}};
  auto models = c.Get("/v1/models", right);
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  auto res = c.Post("/v1/completions", right, json{{"prompt", kPrompt}, {"max_tokens", 8}, {"temperature", 0}}.dump(),
                    "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], reference(encode_prompt(kPrompt), 8).text);
}

// A 401 before a request's body is read closes the connection; the response must say so, or a
// keep-alive client (the OpenAI SDK's pool) sends its next request on the closing connection and
// gets no answer at all (a CI failure of OpenaiClient.PythonSdk).
TEST(ServerHardening, AnswerBeforeTheBodySaysTheConnectionCloses) {
  auto options = base_options();
  options.api_key = "sk-test-123";
  Running server(std::move(options));
  const std::string body = json{{"prompt", kPrompt}, {"max_tokens", 4}}.dump();
  {
    RawClient raw(server.port);
    ASSERT_TRUE(raw.send_bytes("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-wrong\r\n"
                               "Content-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string response = raw.read_all(10);
    EXPECT_EQ(status_of(response), 401) << response;
    const std::string head = response.substr(0, response.find("\r\n\r\n"));
    EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << head;
  }
  {  // without a body nothing is left unread: the connection stays open for the next request
    RawClient raw(server.port);
    ASSERT_TRUE(raw.send_bytes("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
                               "Connection: close\r\n\r\n"));
    const std::string response = raw.read_all(10);
    EXPECT_EQ(status_of(response), 401) << response;
    EXPECT_NE(response.find("HTTP/1.1 200"), std::string::npos) << response;
  }
  {  // any answer of the guard before the body (here a CORS preflight that sent one) closes likewise
    RawClient raw(server.port);
    ASSERT_TRUE(raw.send_bytes("OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: https://a.example\r\n"
                               "Access-Control-Request-Method: POST\r\nContent-Length: 5\r\n\r\nhello"));
    const std::string response = raw.read_all(10);
    EXPECT_EQ(status_of(response), 204) << response;
    EXPECT_NE(response.find("\r\nConnection: close"), std::string::npos) << response;
  }
  // A kept-alive answer's Keep-Alive header states the server's own limits (not httplib's 5 / 5).
  httplib::Client keep = server.client();
  keep.set_keep_alive(true);
  auto health = keep.Get("/health");
  ASSERT_TRUE(health);
  const qspec::HttpLimits limits;
  EXPECT_EQ(health->get_header_value("Keep-Alive"),
            "timeout=" + std::to_string(static_cast<int>(std::ceil(limits.keep_alive_seconds))) +
                ", max=" + std::to_string(limits.max_requests_per_connection));
}

// CORS (--allowed-origins): off by default; "*" answers any origin, a list only its own (and
// says Vary: Origin); a preflight gets 204 before the API key check, and a 401 still carries the
// origin so the page can read it.
TEST(ServerHardening, CorsAnswersAllowedOriginsAndPreflights) {
  const httplib::Headers from_app = {{"Origin", "https://app.example.com"}};
  const httplib::Headers preflight = {{"Origin", "https://app.example.com"},
                                      {"Access-Control-Request-Method", "POST"},
                                      {"Access-Control-Request-Headers", "authorization, content-type"}};
  {  // default: no CORS headers; a preflight is answered 204 without them (the browser refuses)
    Running server(base_options());
    httplib::Client c = server.client();
    auto models = c.Get("/v1/models", from_app);
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 200);
    EXPECT_FALSE(models->has_header("Access-Control-Allow-Origin"));
    auto pre = c.Options("/v1/chat/completions", preflight);
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204);
    EXPECT_FALSE(pre->has_header("Access-Control-Allow-Origin"));
  }
  {  // any origin, with an API key
    auto options = base_options();
    options.allowed_origins = {"*"};
    options.api_key = "sk-test-123";
    Running server(std::move(options));
    httplib::Client c = server.client();
    auto pre = c.Options("/v1/chat/completions", preflight);
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204) << pre->body;
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "*");
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Methods"), "GET, POST, OPTIONS");
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
    EXPECT_FALSE(pre->get_header_value("Access-Control-Max-Age").empty());
    auto denied = c.Get("/v1/models", from_app);
    ASSERT_TRUE(denied);
    EXPECT_EQ(denied->status, 401);
    EXPECT_EQ(denied->get_header_value("Access-Control-Allow-Origin"), "*");
    httplib::Headers with_key = from_app;
    with_key.emplace("Authorization", "Bearer sk-test-123");
    auto res = c.Post("/v1/completions", with_key,
                      json{{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}}.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "*");
    // A plain OPTIONS (no preflight headers) is no CORS request: the key check and the routes as before.
    auto plain = c.Options("/v1/models", from_app);
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->status, 401);
  }
  {  // a list: its origins echoed, with Vary; another origin gets no Allow-Origin
    auto options = base_options();
    options.allowed_origins = {"http://localhost:3000", "https://app.example.com"};
    Running server(std::move(options));
    httplib::Client c = server.client();
    auto ok = c.Get("/v1/models", from_app);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "https://app.example.com");
    EXPECT_EQ(ok->get_header_value("Vary"), "Origin");
    auto other = c.Get("/v1/models", httplib::Headers{{"Origin", "https://evil.example.net"}});
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 200);
    EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
    EXPECT_EQ(other->get_header_value("Vary"), "Origin");
    auto stream = c.Post("/v1/completions", from_app,
                         json{{"prompt", kPrompt}, {"max_tokens", 4}, {"stream", true}}.dump(), "application/json");
    ASSERT_TRUE(stream);
    EXPECT_EQ(stream->status, 200);
    EXPECT_EQ(stream->get_header_value("Access-Control-Allow-Origin"), "https://app.example.com");
  }
  EXPECT_NO_THROW(qspec::check_allowed_origins({"*", "http://localhost:3000", "https://a.b"}, "--allowed-origins"));
  for (const char* bad : {"", "localhost:3000", "https://", "https://app.example.com/", "ftp://x", "https://a b"})
    EXPECT_THROW(qspec::check_allowed_origins({bad}, "--allowed-origins"), qspec::Error) << bad;
}

TEST(ServerHardening, TlsServesHttpsAndRefusesBadKeyFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("qspec-tls-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const std::string command = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -keyout " + key +
                              " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "openssl (Debian: openssl) makes the test certificate";
  {
    auto options = base_options();
    options.tls = qspec::TlsFiles{cert, key};
    Running server(std::move(options));
    httplib::SSLClient c("127.0.0.1", server.port);
    c.enable_server_certificate_verification(false);
    c.set_read_timeout(120, 0);
    auto res = c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 8}, {"temperature", 0}}.dump(),
                      "application/json");
    ASSERT_TRUE(res) << "no HTTPS answer";
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], reference(encode_prompt(kPrompt), 8).text);
    // Plain HTTP to the TLS port gets no answer, and the server keeps serving HTTPS.
    RawClient raw(server.port);
    raw.send_bytes("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(status_of(raw.read_all(10)), 0);
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
  auto options = base_options();
  options.tls = qspec::TlsFiles{cert, cert};  // a certificate where the key should be
  try {
    qspec::Server server(*fixture().model, *fixture().tokenizer, std::move(options));
    FAIL() << "a key file without a key was accepted";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ssl-keyfile"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Server, TokenizeAndDetokenizeRoundTrip) {
  auto options = chat_options();
  Running server(std::move(options));
  auto res = server.post("/tokenize", json{{"prompt", kPrompt}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json tokens = json::parse(res->body);
  EXPECT_EQ(tokens["tokens"].get<std::vector<int32_t>>(), encode_prompt(kPrompt));
  EXPECT_EQ(tokens["count"], encode_prompt(kPrompt).size());
  res = server.post("/detokenize", json{{"tokens", tokens["tokens"]}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_NE(json::parse(res->body)["prompt"].get<std::string>().find(kPrompt), std::string::npos) << res->body;
  // Messages are rendered with the chat template first.
  res = server.post("/tokenize", json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_GT(json::parse(res->body)["count"].get<int64_t>(), 2);
  expect_error(server.post("/detokenize", json{{"tokens", {1, -5}}}), 400, "tokens");
  expect_error(server.post("/tokenize", json{{"max_tokens", 3}}), 400, "prompt");
}

TEST(Server, MaxContextBoundsEveryRequest) {
  auto options = base_options();
  options.engine.max_context = 64;  // --max-model-len / --ctx-size
  Running server(std::move(options));
  auto models = server.get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["max_model_len"], 64);
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += " 7 +";
  expect_error(server.post("/v1/completions", json{{"prompt", long_prompt}, {"max_tokens", 4}}), 400);
  // A prompt that fits, with max_tokens past the context: refused, naming the bound.
  auto res = server.post("/v1/completions",
                         json{{"prompt", kPrompt}, {"max_tokens", 60}, {"temperature", 0}, {"ignore_eos", true}});
  expect_error(res, 400, "max_tokens", "context_length_exceeded");
  EXPECT_NE(res->body.find("maximum context length is 64 tokens"), std::string::npos) << res->body;
  // Within it: served, up to the last position.
  const int64_t prompt_tokens = static_cast<int64_t>(encode_prompt(kPrompt).size());
  res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 64 - prompt_tokens},
                                            {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 64 - prompt_tokens);
}

TEST(ServerHardening, ServeBytesAnswersRawRequestsWithoutASocket) {
  Running server(base_options());
  const std::string out = server.server->serve_bytes("GET /%FF HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(out), 404) << out;
  // Keep-alive: two requests on one connection get two answers.
  const std::string two = server.server->serve_bytes(
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(two), 200) << two;
  EXPECT_NE(two.find(kName), std::string::npos) << two;
  static const char kGarbage[] = "\x00\x01 / HTTP/9\r\n\r\n";  // a NUL first: the size says where it ends
  const std::string garbage = server.server->serve_bytes(std::string(kGarbage, sizeof kGarbage - 1));
  EXPECT_EQ(status_of(garbage), 400) << garbage;
}

}  // namespace

// The 8-bit KV cache (--kv-cache int8, engine-wide): a QSpec request whose draft reads only the
// high nibbles (qspec.draft_kv4) runs there, and /metrics names the format; on an f16 cache the
// same request is a 400 naming the field, before it runs.
TEST(Server, Kv4DraftsNeedTheInt8KvCache) {
  const json request{{"prompt", kPrompt},
                     {"max_tokens", 16},
                     {"temperature", 0},
                     {"qspec", {{"mode", "qspec"}, {"draft", "w4a8"}, {"draft_kv4", true}}}};
  {
    Running server(base_options());
    auto res = server.post("/v1/completions", request);
    expect_error(res, 400);
    EXPECT_NE(res->body.find("draft_kv4"), std::string::npos) << res->body;
    EXPECT_NE(res->body.find("--kv-cache int8"), std::string::npos) << res->body;
    res = server.post("/v1/completions", json{{"prompt", kPrompt}, {"qspec", {{"draft_kv4", "yes"}}}});
    expect_error(res, 400, "draft_kv4");
    const std::map<std::string, double> metrics = parse_prometheus(server.get("/metrics")->body);
    EXPECT_EQ(metrics.count("qspec_kv_cache_info{format=\"f16\"}"), 1u);
  }
  qspec::ServerOptions options = base_options();
  options.engine.kv_cache = "int8";
  Running server(options);
  auto res = server.post("/v1/completions", request);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_GT(body["usage"]["completion_tokens"].get<int64_t>(), 0) << res->body;
  const std::map<std::string, double> metrics = parse_prometheus(server.get("/metrics")->body);
  EXPECT_EQ(metrics.count("qspec_kv_cache_info{format=\"int8\"}"), 1u);
  EXPECT_GT(metrics.at("qspec_kv_cache_bytes"), 0.0);
}
