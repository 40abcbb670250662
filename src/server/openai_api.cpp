// OpenAI request parsing (unsupported options refused by name) and the server's response objects.
#include "server/openai_api.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "ops/sample.h"
#include "runtime/qspec.h"
#include "tokenizer/tokenizer.h"

namespace qspec {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message, const std::string& code = "") {
  throw ApiError(400, message, "invalid_request_error", param, code);
}

// The field, or nullptr when it is absent or null (OpenAI treats null as "not given").
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string type_name(const json& value) {
  if (value.is_boolean()) return "a boolean";
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

int64_t get_int(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number_integer()) bad(name, std::string("'") + name + "' must be an integer, got " + type_name(*v));
  int64_t x;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                       : static_cast<int64_t>(u);
  } else {
    x = v->get<int64_t>();
  }
  if (x < lo || x > hi)
    bad(name, std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                  "], got " + std::to_string(x));
  return x;
}

double get_number(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, std::string("'") + name + "' must be a number, got " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(name, std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                  "], got " + v->dump());
  return x;
}

bool get_bool(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, std::string("'") + name + "' must be a boolean, got " + type_name(*v));
  return v->get<bool>();
}

std::string get_string(const json& body, const char* name, const std::string& fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_string()) bad(name, std::string("'") + name + "' must be a string, got " + type_name(*v));
  return v->get<std::string>();
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
std::string message_content(const json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(param, "'" + param + "' must be a string or a list of text parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(param, "'" + param + "': only {\"type\": \"text\", \"text\": ...} parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<int32_t> chat_prompt(const json& body, const ApiContext& context) {
  const json* messages = field(body, "messages");
  if (!messages) bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty list");
  std::vector<ChatMessage> conversation;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(param, "'" + param + "' must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      bad(param + ".role", "'" + param + ".role' must be a string");
    conversation.push_back({m["role"].get<std::string>(), message_content(m.contains("content") ? m["content"] : json(), i)});
  }
  if (!context.options.chat_template)
    throw ApiError(400,
                   "this model has no chat template: use /v1/completions, or start the server with "
                   "--chat-template FILE",
                   "invalid_request_error", "messages", "no_chat_template");
  std::string rendered;
  try {
    rendered = context.options.chat_template->render(conversation, /*add_generation_prompt=*/true);
  } catch (const Error& e) {
    bad("messages", std::string("chat template: ") + e.what());
  }
  // The template writes the special tokens it wants (bos included), as transformers'
  // apply_chat_template(tokenize=True) does.
  return context.tokenizer.encode(rendered, /*add_bos=*/false);
}

// add_special_tokens = false: text is encoded without the model's bos (vLLM's /tokenize option).
std::vector<int32_t> completion_prompt(const json& body, const ApiContext& context, bool add_special_tokens = true) {
  const json* prompt = field(body, "prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  auto encode_text = [&](const std::string& text) {
    const Tokenizer& t = context.tokenizer;
    const bool add_bos = add_special_tokens && t.bos_id.has_value() && (text.empty() || t.add_bos_by_default);
    return t.encode(text, add_bos);
  };
  if (prompt->is_string()) return encode_text(prompt->get<std::string>());
  if (prompt->is_array()) {
    if (prompt->empty()) bad("prompt", "'prompt' is an empty list");
    if ((*prompt)[0].is_string()) {
      if (prompt->size() != 1) bad("prompt", "batched prompts are not supported: send one prompt per request");
      return encode_text((*prompt)[0].get<std::string>());
    }
    // [[ids]]: a batch of one token-id prompt (what lm-eval's tokenized requests send).
    const bool nested = (*prompt)[0].is_array();
    if (nested && prompt->size() != 1) bad("prompt", "batched prompts are not supported: send one prompt per request");
    const json& list = nested ? (*prompt)[0] : *prompt;
    if (list.empty()) bad("prompt", "'prompt' is an empty list");
    std::vector<int32_t> ids;
    for (const json& id : list) {
      if (!id.is_number_integer()) bad("prompt", "'prompt' must be a string or a list of token ids (integers)");
      // JSON parsing stores non-negative integers as unsigned.
      const int64_t x = id.is_number_unsigned()
                            ? static_cast<int64_t>(std::min<uint64_t>(id.get<uint64_t>(), uint64_t{1} << 40))
                            : id.get<int64_t>();
      if (x < 0 || x >= context.tokenizer.vocab_size())
        bad("prompt", "token id " + id.dump() + " is outside the vocabulary [0, " +
                          std::to_string(context.tokenizer.vocab_size()) + ")");
      ids.push_back(static_cast<int32_t>(x));
    }
    return ids;
  }
  bad("prompt", "'prompt' must be a string or a list of token ids, got " + type_name(*prompt));
}

// ---- OpenAI options this server does not implement ----
// A request may carry one at its neutral value (what the API does when the field is absent;
// null always counts as absent), as clients that send every default do. Any other value is a
// 400 naming the field: a client gets what it asked for or an error, never a silent default.
// Fields OpenAI defines that do not change the completion (user, metadata, store,
// service_tier, parallel_tool_calls, prompt_cache_key, safety_identifier) and fields it does
// not define are accepted and ignored.
enum class Endpoint { both, chat, completions };

struct RefusedField {
  const char* name;
  Endpoint endpoint;
  const char* accepted;  // the neutral values, for the message
  bool (*is_neutral)(const json& value);
};

bool only_null(const json&) { return false; }
bool is_zero(const json& v) { return v.is_number() && v.get<double>() == 0.0; }
bool is_one(const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; }
bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_empty_string(const json& v) { return v.is_string() && v.get_ref<const std::string&>().empty(); }
bool is_empty_list(const json& v) { return v.is_array() && v.empty(); }
bool is_none_or_auto(const json& v) { return v == "none" || v == "auto"; }  // no tools, so no calls
bool is_text_format(const json& v) { return v == json{{"type", "text"}}; }
bool is_text_modality(const json& v) { return v == json::array({"text"}); }

constexpr RefusedField kRefusedFields[] = {
    {"n", Endpoint::both, "1 (one choice per request)", is_one},
    {"best_of", Endpoint::both, "1", is_one},
    {"echo", Endpoint::chat, "false", is_false},
    {"suffix", Endpoint::both, "\"\"", is_empty_string},
    // Completions take the number of top logprobs in "logprobs" (chat: top_logprobs).
    {"top_logprobs", Endpoint::completions, "0", is_zero},
    {"tools", Endpoint::both, "[]", is_empty_list},
    {"tool_choice", Endpoint::both, "\"none\" or \"auto\"", is_none_or_auto},
    {"functions", Endpoint::both, "[]", is_empty_list},
    {"function_call", Endpoint::both, "\"none\" or \"auto\"", is_none_or_auto},
    {"response_format", Endpoint::both, "{\"type\": \"text\"}", is_text_format},
    {"modalities", Endpoint::both, "[\"text\"]", is_text_modality},
    {"audio", Endpoint::both, "null", only_null},
    {"prediction", Endpoint::both, "null", only_null},
    {"web_search_options", Endpoint::both, "null", only_null},
    {"reasoning_effort", Endpoint::both, "null", only_null},
    {"verbosity", Endpoint::both, "null", only_null},
};

void refuse_unsupported_fields(const json& body, bool chat) {
  for (const RefusedField& refused : kRefusedFields) {
    if (refused.endpoint == (chat ? Endpoint::completions : Endpoint::chat)) continue;
    const json* value = field(body, refused.name);
    if (!value || refused.is_neutral(*value)) continue;
    std::string shown = value->dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    bad(refused.name, std::string("'") + refused.name + "' = " + shown +
                          " is not supported by this server (it accepts only " + refused.accepted + ")");
  }
}

std::vector<std::string> stop_strings(const json& body) {
  const json* stop = field(body, "stop");
  std::vector<std::string> out;
  if (!stop) return out;
  if (stop->is_string()) {
    out.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > 16) bad("stop", "'stop' holds at most 16 strings");
    for (const json& s : *stop) {
      if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or a list of strings, got " + type_name(*stop));
  }
  for (const std::string& s : out)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
  return out;
}

// logit_bias: {"token id": bias in [-100, 100]} (OpenAI's shape; ids as strings).
std::vector<std::pair<int32_t, float>> logit_bias(const json& body, int64_t vocab) {
  std::vector<std::pair<int32_t, float>> out;
  const json* biases = field(body, "logit_bias");
  if (!biases) return out;
  if (!biases->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
  if (static_cast<int64_t>(biases->size()) > vocab) bad("logit_bias", "'logit_bias' has more entries than the vocabulary");
  for (auto it = biases->begin(); it != biases->end(); ++it) {
    const std::string& key = it.key();
    char* end = nullptr;
    const long long id = key.empty() ? -1 : std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id >= vocab)
      bad("logit_bias", "'logit_bias' key '" + key.substr(0, 40) + "' is not a token id in [0, " + std::to_string(vocab) + ")");
    if (!it->is_number() || !std::isfinite(it->get<double>()) || std::abs(it->get<double>()) > kMaxLogitBias)
      bad("logit_bias", "'logit_bias' values must be numbers in [-" + std::to_string(static_cast<int>(kMaxLogitBias)) +
                            ", " + std::to_string(static_cast<int>(kMaxLogitBias)) + "], got " + it->dump() + " for '" +
                            key + "'");
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(it->get<double>()));
  }
  return out;
}

// "logprobs" / "top_logprobs" into request.logprobs (the top count, -1 none); echo's prompt
// scoring into request.prompt_logprobs.
void parse_logprobs(const json& body, bool chat, ApiRequest& out) {
  Request& r = out.request;
  if (chat) {
    const bool wanted = get_bool(body, "logprobs", false);
    const int64_t top = get_int(body, "top_logprobs", 0, 0, kMaxTopLogprobs);
    if (top > 0 && !wanted)
      bad("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    r.logprobs = wanted ? static_cast<int32_t>(top) : -1;
  } else {
    r.logprobs = static_cast<int32_t>(get_int(body, "logprobs", -1, 0, kMaxTopLogprobs));
  }
  // Echo scores the prompt when logprobs are asked for, and always when nothing is generated
  // (the engine then has only the prompt to run).
  r.prompt_logprobs = out.echo && (r.logprobs >= 0 || r.max_new_tokens == 0);
}

// A token's text as the logprobs show it (special tokens written out, as vLLM does).
std::string token_text(const Tokenizer& tokenizer, int32_t id) { return tokenizer.decode({id}, /*skip_special=*/false); }

// Characters (code points) of UTF-8 text, as Python's len counts text_offset.
int64_t code_points(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

json completion_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries, bool null_first,
                              int64_t& text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (size_t i = 0; i < entries.size(); ++i) {
    const TokenLogprob& e = entries[i];
    const std::string text = token_text(tokenizer, e.id);
    tokens.push_back(text);
    offsets.push_back(text_offset);
    text_offset += code_points(text);
    if (i == 0 && null_first) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(e.logprob);
    // The most likely tokens and the chosen one (vLLM's dict); texts that collide keep the first.
    json top = json::object();
    for (const auto& [id, logprob] : e.top) {
      const std::string key = token_text(tokenizer, id);
      if (!top.contains(key)) top[key] = logprob;
    }
    if (!top.contains(text)) top[text] = e.logprob;
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

json chat_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries, int32_t top) {
  auto entry = [&](int32_t id, float logprob) {
    const std::string text = token_text(tokenizer, id);
    json bytes = json::array();
    for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
    return json{{"token", text}, {"logprob", logprob}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const TokenLogprob& e : entries) {
    json item = entry(e.id, e.logprob);
    json alternatives = json::array();
    for (size_t k = 0; k < e.top.size() && static_cast<int32_t>(k) < top; ++k)
      alternatives.push_back(entry(e.top[k].first, e.top[k].second));
    item["top_logprobs"] = alternatives;
    content.push_back(std::move(item));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  json error = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) error["param"] = param;
  if (!code.empty()) error["code"] = code;
  return json{{"error", error}};
}

std::string openai_finish_reason(const std::string& reason) {
  if (reason == "eos" || reason == "stop") return "stop";
  if (reason == "length" || reason == "context") return "length";
  return reason;
}

json usage_json(const RequestMetrics& metrics, bool qspec) {
  json usage = {{"prompt_tokens", metrics.prompt_tokens},
                {"completion_tokens", metrics.generated_tokens},
                {"total_tokens", metrics.prompt_tokens + metrics.generated_tokens}};
  if (qspec) {
    const QSpecMetrics& q = metrics.qspec;
    json counters = qspec_counters_json(q);
    counters.update({{"gamma", q.gamma},
                     {"mean_accepted_length", q.mean_accepted_length()},
                     {"draft_seconds", q.draft_seconds},
                     {"verify_seconds", q.verify_seconds}});
    // Draft auto: which plans ran (steps by plan), the gain predicted for the cycles, and why.
    if (!q.plan_steps.empty()) counters["planner"] = qspec_planner_json(q);
    usage["qspec"] = counters;
  }
  return usage;
}

namespace {
// A request body: a JSON object, or a 400 saying why not.
json parse_body(const std::string& text) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "invalid_request_error", "",
                   "invalid_json");
  }
  if (!body.is_object()) bad("", "the body must be a JSON object, got " + type_name(body), "invalid_json");
  return body;
}
}  // namespace

json tokenize_response(const std::string& text, const ApiContext& context) {
  const json body = parse_body(text);
  const bool chat = field(body, "messages") != nullptr;
  if (chat && field(body, "prompt")) bad("prompt", "give 'prompt' or 'messages', not both");
  const std::vector<int32_t> ids =
      chat ? chat_prompt(body, context) : completion_prompt(body, context, get_bool(body, "add_special_tokens", true));
  return {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", context.context_length}};
}

json tokenizer_info_response(const ApiContext& context) {
  const Tokenizer& t = context.tokenizer;
  const json bos = t.bos_id ? json(t.id_to_token(*t.bos_id)) : json(nullptr);
  const json eos = t.eos_ids.empty() ? json(nullptr) : json(t.id_to_token(t.eos_ids.front()));
  json info = {{"tokenizer_class", "qspec"},
               {"bos_token", bos},
               {"eos_token", eos},
               {"pad_token", eos},
               {"add_bos_token", t.add_bos_by_default && t.bos_id.has_value()},
               {"model_max_length", context.context_length},
               {"vocab_size", t.vocab_size()},
               {"chat_template", nullptr}};
  if (context.options.chat_template) info["chat_template"] = context.options.chat_template->source();
  return info;
}

json detokenize_response(const std::string& text, const ApiContext& context) {
  const json body = parse_body(text);
  const json* tokens = field(body, "tokens");
  if (!tokens || !tokens->is_array()) bad("tokens", "'tokens' must be a list of token ids");
  std::vector<int32_t> ids;
  const int64_t vocab = context.tokenizer.vocab_size();
  for (const json& id : *tokens) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
      bad("tokens", "'tokens' must hold token ids in [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return {{"prompt", context.tokenizer.decode(ids, /*skip_special=*/false)}};
}

ApiRequest parse_api_request(const std::string& text, bool chat, const ApiContext& context) {
  const json body = parse_body(text);

  const ServerOptions& options = context.options;
  const std::string model = get_string(body, "model", options.model_name);
  if (model != options.model_name)
    throw ApiError(404, "the model '" + model + "' does not exist; this server serves '" + options.model_name + "'",
                   "invalid_request_error", "model", "model_not_found");
  refuse_unsupported_fields(body, chat);

  ApiRequest out;
  out.chat = chat;
  out.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    out.include_usage = get_bool(*so, "include_usage", false);
  }
  Request& r = out.request;
  r.prompt = chat ? chat_prompt(body, context) : completion_prompt(body, context);
  if (!chat) {
    const json* prompt = field(body, "prompt");
    const bool text = prompt->is_string() || (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_string());
    out.echo_text = !text ? context.tokenizer.decode(r.prompt, /*skip_special=*/false)
                    : prompt->is_string() ? prompt->get<std::string>()
                                          : (*prompt)[0].get<std::string>();
  }
  const int64_t n_ctx = context.context_length;
  const int64_t prompt_tokens = static_cast<int64_t>(r.prompt.size());
  if (prompt_tokens == 0) bad(chat ? "messages" : "prompt", "the prompt is empty");
  if (prompt_tokens >= n_ctx)
    bad(chat ? "messages" : "prompt",
        "the prompt has " + std::to_string(prompt_tokens) + " tokens; this model's maximum context length is " +
            std::to_string(n_ctx) + " tokens (prompt and completion together)",
        "context_length_exceeded");

  // max_tokens: completions default 16 (as OpenAI), chat defaults to the rest of the context.
  const char* max_name = "max_tokens";
  if (chat && field(body, "max_completion_tokens") && !field(body, "max_tokens")) max_name = "max_completion_tokens";
  const int64_t fallback = chat ? n_ctx - prompt_tokens : std::min<int64_t>(16, n_ctx - prompt_tokens);
  out.echo = !chat && get_bool(body, "echo", false);
  const int64_t max_tokens = get_int(body, max_name, fallback, 0, n_ctx);
  if (max_tokens == 0 && !out.echo)
    bad(max_name, std::string("'") + max_name + "' must be >= 1 (0 only with \"echo\": true, to score the prompt)");
  if (prompt_tokens + max_tokens > n_ctx)
    bad(max_name,
        "this model's maximum context length is " + std::to_string(n_ctx) + " tokens; the request asks for " +
            std::to_string(prompt_tokens + max_tokens) + " (" + std::to_string(prompt_tokens) + " in the prompt, " +
            std::to_string(max_tokens) + " in the completion)",
        "context_length_exceeded");
  r.max_new_tokens = max_tokens;

  SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(get_number(body, "temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(get_number(body, "top_p", 1.0, 0.0, 1.0));
  if (s.top_p <= 0.0f) bad("top_p", "'top_p' must be in (0, 1]");
  s.top_k = static_cast<int32_t>(get_int(body, "top_k", 0, 0, std::numeric_limits<int32_t>::max()));
  s.min_p = static_cast<float>(get_number(body, "min_p", 0.0, 0.0, 1.0));
  s.repetition_penalty = static_cast<float>(get_number(body, "repetition_penalty", 1.0, 0.01, 100.0));
  s.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", 0.0, -kMaxPenalty, kMaxPenalty));
  s.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", 0.0, -kMaxPenalty, kMaxPenalty));
  s.logit_bias = logit_bias(body, context.tokenizer.vocab_size());
  // Without a seed a sampled request draws anew each time (as OpenAI's and vLLM's do).
  s.seed = field(body, "seed") ? static_cast<uint64_t>(get_int(body, "seed", 0, std::numeric_limits<int64_t>::min(),
                                                               std::numeric_limits<int64_t>::max()))
                               : Sampler::random_seed();
  r.stop = stop_strings(body);
  parse_logprobs(body, chat, out);
  r.ignore_eos = get_bool(body, "ignore_eos", false);

  DecodePlan& plan = r.plan;
  plan = options.default_plan;
  if (const json* ext = field(body, "qspec")) {
    if (!ext->is_object()) bad("qspec", "'qspec' must be an object like {\"mode\": \"qspec\", \"gamma\": 4}");
    for (auto it = ext->begin(); it != ext->end(); ++it) {
      static const char* known[] = {"mode",      "draft",     "gamma",     "adaptive_gamma", "max_gamma",
                                    "ngram_max", "ngram_min", "draft_window", "draft_sinks", "draft_vocab",
                                    "draft_skip", "draft_kv4", "ngram_corpus", "ignore_eos"};
      bool ok = false;
      for (const char* k : known) ok = ok || it.key() == k;
      if (!ok) bad("qspec." + it.key(), "unknown field 'qspec." + it.key() + "'");
    }
    plan.mode = get_string(*ext, "mode", plan.mode);
    plan.draft = get_string(*ext, "draft", plan.draft);
    plan.gamma = get_int(*ext, "gamma", plan.gamma, 1, decode_rules::kMaxGamma);
    plan.adaptive_gamma = get_bool(*ext, "adaptive_gamma", plan.adaptive_gamma);
    plan.max_gamma = get_int(*ext, "max_gamma", std::max(plan.max_gamma, plan.gamma), 1, decode_rules::kMaxGamma);
    plan.ngram_max = get_int(*ext, "ngram_max", plan.ngram_max, 1, decode_rules::kMaxNgram);
    plan.ngram_min = get_int(*ext, "ngram_min", std::min(plan.ngram_min, plan.ngram_max), 1, decode_rules::kMaxNgram);
    plan.draft_window = get_int(*ext, "draft_window", plan.draft_window, 0, std::numeric_limits<int32_t>::max());
    plan.draft_sinks = get_int(*ext, "draft_sinks", plan.draft_sinks, 0, decode_rules::kMaxDraftSinks);
    plan.draft_vocab = get_int(*ext, "draft_vocab", plan.draft_vocab, 0, std::numeric_limits<int32_t>::max());
    plan.draft_skip = get_int(*ext, "draft_skip", plan.draft_skip, 0, std::numeric_limits<int32_t>::max());
    plan.draft_kv4 = get_bool(*ext, "draft_kv4", plan.draft_kv4);
    plan.ngram_corpus = get_bool(*ext, "ngram_corpus", plan.ngram_corpus);
    r.ignore_eos = get_bool(*ext, "ignore_eos", r.ignore_eos);
  }
  try {
    validate(plan, "qspec.");
  } catch (const DecodePlanError& e) {
    bad("qspec." + e.field, e.what());
  }
  return out;
}

}  // namespace qspec
