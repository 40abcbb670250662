// The OpenAI request/response JSON of the server (no HTTP here): parses and validates a
// completions or chat completions body into an engine Request, and builds the response
// objects and stream chunks. Every rejection is an ApiError (status 4xx) naming the field.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qspec/engine.h"
#include "server/server.h"

namespace qspec {

class Tokenizer;

struct ApiRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  Request request;             // prompt ids, sampling, limits, mode
};

struct ApiContext {
  const ServerOptions& options;
  const Tokenizer& tokenizer;
  int64_t context_length = 0;  // the model's max_position_embeddings
};

// Parses the body of POST /v1/completions (chat = false) or /v1/chat/completions. OpenAI
// options the server does not implement (logprobs, penalties, logit_bias, tools, response
// formats, n > 1, ...: kRefusedFields in openai_api.cpp) are accepted only at their neutral
// values and otherwise refused with a 400 whose param names the field.
ApiRequest parse_api_request(const std::string& body, bool chat, const ApiContext& context);

// POST /tokenize (vLLM's shape): {"prompt": text or ids} or {"messages": [...]} (rendered with
// the chat template) -> {"tokens": [...], "count": n, "max_model_len": context}, the ids a
// completion of it would start from.
nlohmann::json tokenize_response(const std::string& body, const ApiContext& context);
// POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (special tokens kept).
nlohmann::json detokenize_response(const std::string& body, const ApiContext& context);

// {"error": {"message", "type", "param", "code"}} ("" fields are null).
nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code);

// "eos"/"stop" -> "stop", "length"/"context" -> "length", others as they are.
std::string openai_finish_reason(const std::string& engine_reason);

// usage: prompt/completion/total tokens, plus "qspec" acceptance statistics for QSpec requests.
nlohmann::json usage_json(const RequestMetrics& metrics, bool qspec);

}  // namespace qspec
