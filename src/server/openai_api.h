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
  // completions "echo": the prompt's text leads the answer (and, with logprobs, its tokens lead
  // the logprobs, the first one's null): request.prompt_logprobs is set then.
  bool echo = false;
  std::string echo_text;       // the prompt as text (a token-id prompt decoded)
  Request request;             // prompt ids, sampling, limits, mode; request.logprobs: the top count
};

struct ApiContext {
  const ServerOptions& options;
  const Tokenizer& tokenizer;
  int64_t context_length = 0;  // the model's max_position_embeddings
};

// Parses the body of POST /v1/completions (chat = false) or /v1/chat/completions. OpenAI
// options the server does not implement (tools, response formats, n > 1, ...: kRefusedFields
// in openai_api.cpp) are accepted only at their neutral values and otherwise refused with a
// 400 whose param names the field.
//
// Log-probabilities are the model's (TokenLogprob, qspec/sampling.h: log-softmax of the
// engine's own logits at temperature 1, before penalties and filters, vLLM's default; the
// W4A16 verify's in QSpec). Completions: "logprobs": N (0..kMaxTopLogprobs) gives OpenAI's
// legacy {tokens, token_logprobs, top_logprobs, text_offset}, each top_logprobs dict holding
// the N most likely tokens and the chosen one (as vLLM); with "echo": true the prompt's tokens
// come first (the first one's entries null), and "max_tokens": 0 scores the prompt alone (what
// lm-eval's loglikelihood requests send). Chat: "logprobs": true and "top_logprobs": N give
// OpenAI's {"content": [{token, logprob, bytes, top_logprobs}]}.
ApiRequest parse_api_request(const std::string& body, bool chat, const ApiContext& context);

// POST /tokenize (vLLM's shape): {"prompt": text or ids, "add_special_tokens": true} or
// {"messages": [...]} (rendered with the chat template) -> {"tokens": [...], "count": n,
// "max_model_len": context}, the ids a completion of it would start from (without the bos when
// add_special_tokens is false).
nlohmann::json tokenize_response(const std::string& body, const ApiContext& context);
// GET /tokenizer_info (vLLM's; lm-eval's remote tokenizer reads it): the special tokens, whether
// a bos is added, the context length, the chat template's source.
nlohmann::json tokenizer_info_response(const ApiContext& context);
// POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (special tokens kept).
nlohmann::json detokenize_response(const std::string& body, const ApiContext& context);

// {"error": {"message", "type", "param", "code"}} ("" fields are null).
nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code);

// "eos"/"stop" -> "stop", "length"/"context" -> "length", others as they are.
std::string openai_finish_reason(const std::string& engine_reason);

// The logprobs object of a completions choice (or stream chunk) for `entries`; `null_first`:
// the first entry is the prompt's first token (no logprob). `text_offset` is the offset of the
// first token's text and advances past the last.
nlohmann::json completion_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries,
                                        bool null_first, int64_t& text_offset);
// The logprobs object of a chat choice (or stream chunk): {"content": [...], "refusal": null}.
nlohmann::json chat_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries, int32_t top);

// usage: prompt/completion/total tokens, plus "qspec" acceptance statistics for QSpec requests.
nlohmann::json usage_json(const RequestMetrics& metrics, bool qspec);

}  // namespace qspec
