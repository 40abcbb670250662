// parse_api_request: OpenAI options the server does not implement are a 400 naming the field unless neutral (issue 48, item 6); logprobs, echo and their limits (issue 52).
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/openai_api.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
const std::string kModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
constexpr int64_t kContextLength = 1024;  // gsm-synth-llama's max_position_embeddings

struct Fixture {
  std::unique_ptr<qspec::Tokenizer> tokenizer = qspec::Tokenizer::load(kModel);
  qspec::ServerOptions options;
  Fixture() {
    options.model_name = "gsm-synth-llama";
    options.chat_template = qspec::load_server_chat_template(kModel, QSPEC_TEST_DATA "/chat_templates/llama3.jinja");
  }
};

const Fixture& fixture() {
  static const Fixture instance;
  return instance;
}

// A valid body for the endpoint, with `extra`'s fields added.
json body_with(bool chat, const json& extra) {
  json body = chat ? json{{"messages", {{{"role", "user"}, {"content", "Tom has 3 apples."}}}}, {"max_tokens", 4}}
                   : json{{"prompt", "Question: Tom has 3 apples.\nAnswer:"}, {"max_tokens", 4}};
  for (const auto& [key, value] : extra.items()) body[key] = value;
  return body;
}

qspec::ApiRequest parse(bool chat, const json& extra) {
  const qspec::ApiContext context{fixture().options, *fixture().tokenizer, kContextLength};
  return qspec::parse_api_request(body_with(chat, extra).dump(), chat, context);
}

const char* endpoint(bool chat) { return chat ? "/v1/chat/completions" : "/v1/completions"; }

struct Case {
  std::string field;
  json value;
};

// Expects parse to refuse `field` = `value` with a 400 invalid_request_error naming it.
void expect_refused(bool chat, const std::string& field, const json& value) {
  SCOPED_TRACE(std::string(endpoint(chat)) + " " + field + " = " + value.dump());
  try {
    parse(chat, json{{field, value}});
    ADD_FAILURE() << "accepted";
  } catch (const qspec::ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.param, field);
    EXPECT_NE(std::string(error.what()).find("'" + field + "'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("is not supported by this server"), std::string::npos) << error.what();
  }
}

// Non-neutral values of options neither endpoint implements.
const std::vector<Case> kRefusedOnBoth = {
    {"n", 2},
    {"n", 0},
    {"best_of", 3},
    {"suffix", "\n\nThe end."},
    {"tools", json::array({{{"type", "function"}, {"function", {{"name", "add"}, {"parameters", json::object()}}}}})},
    {"tool_choice", "required"},
    {"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}},
    {"functions", json::array({{{"name", "add"}, {"parameters", json::object()}}})},
    {"function_call", {{"name", "add"}}},
    {"response_format", {{"type", "json_object"}}},
    {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", json::object()}}}}},
    {"modalities", json::array({"text", "audio"})},
    {"audio", {{"voice", "alloy"}, {"format", "wav"}}},
    {"prediction", {{"type", "content"}, {"content", "Tom"}}},
    {"web_search_options", json::object()},
    {"reasoning_effort", "high"},
    {"verbosity", "low"},
};

// Neutral values: what the API does when the field is absent.
const std::vector<Case> kNeutralOnBoth = {
    {"n", 1},
    {"best_of", 1},
    {"echo", false},
    {"suffix", ""},
    {"suffix", nullptr},
    {"top_logprobs", 0},
    {"top_logprobs", nullptr},
    {"presence_penalty", 0},
    {"presence_penalty", 0.0},
    {"frequency_penalty", 0},
    {"logit_bias", json::object()},
    {"logit_bias", nullptr},
    {"tools", json::array()},
    {"tool_choice", "none"},
    {"tool_choice", "auto"},
    {"functions", json::array()},
    {"function_call", "none"},
    {"function_call", "auto"},
    {"response_format", {{"type", "text"}}},
    {"modalities", json::array({"text"})},
    {"audio", nullptr},
    {"prediction", nullptr},
    {"reasoning_effort", nullptr},
    {"logprobs", nullptr},
};

}  // namespace

TEST(OpenaiApi, UnsupportedOptionsAreA400NamingTheField) {
  for (bool chat : {false, true})
    for (const Case& c : kRefusedOnBoth) expect_refused(chat, c.field, c.value);
}

// Expects parse to answer 400 naming `param` with a message containing `words`.
void expect_bad(bool chat, const json& extra, const std::string& param, const std::string& words) {
  SCOPED_TRACE(std::string(endpoint(chat)) + " " + extra.dump());
  try {
    parse(chat, extra);
    ADD_FAILURE() << "accepted";
  } catch (const qspec::ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.param, param);
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

TEST(OpenaiApi, LogprobsAndEchoParse) {
  // Completions: logprobs is the number of alternatives (0: the chosen token's alone).
  EXPECT_EQ(parse(false, json::object()).request.logprobs, -1);
  EXPECT_EQ(parse(false, json{{"logprobs", 0}}).request.logprobs, 0);
  EXPECT_EQ(parse(false, json{{"logprobs", qspec::kMaxTopLogprobs}}).request.logprobs, qspec::kMaxTopLogprobs);
  EXPECT_FALSE(parse(false, json{{"logprobs", 1}}).request.prompt_logprobs);
  // Echo scores the prompt when logprobs are asked for, or when nothing is generated.
  const qspec::ApiRequest echo = parse(false, json{{"logprobs", 1}, {"echo", true}, {"max_tokens", 0}});
  EXPECT_TRUE(echo.echo);
  EXPECT_TRUE(echo.request.prompt_logprobs);
  EXPECT_EQ(echo.request.max_new_tokens, 0);
  EXPECT_EQ(echo.echo_text, "Question: Tom has 3 apples.\nAnswer:");
  EXPECT_TRUE(parse(false, json{{"echo", true}, {"max_tokens", 0}}).request.prompt_logprobs);
  EXPECT_FALSE(parse(false, json{{"echo", true}}).request.prompt_logprobs);
  // Chat: a boolean and top_logprobs beside it.
  EXPECT_EQ(parse(true, json{{"logprobs", true}}).request.logprobs, 0);
  EXPECT_EQ(parse(true, json{{"logprobs", true}, {"top_logprobs", 5}}).request.logprobs, 5);
  EXPECT_EQ(parse(true, json{{"logprobs", false}, {"top_logprobs", 0}}).request.logprobs, -1);
  // A batch of one token-id prompt (lm-eval's tokenized requests) is the prompt.
  const qspec::ApiRequest ids = parse(false, json{{"prompt", json::array({json::array({5, 6, 7})})}});
  EXPECT_EQ(ids.request.prompt, (std::vector<int32_t>{5, 6, 7}));
}

TEST(OpenaiApi, PenaltiesAndLogitBiasParse) {
  const qspec::SamplingParams s =
      parse(false, json{{"presence_penalty", 0.5}, {"frequency_penalty", -1}, {"logit_bias", {{"5", 100}, {"7", -2.5}}}})
          .request.sampling;
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -1.0f);
  ASSERT_EQ(s.logit_bias.size(), 2u);
  EXPECT_EQ(s.logit_bias[0], (std::pair<int32_t, float>{5, 100.0f}));
  EXPECT_EQ(s.logit_bias[1], (std::pair<int32_t, float>{7, -2.5f}));
  EXPECT_TRUE(parse(true, json{{"logit_bias", json::object()}}).request.sampling.logit_bias.empty());
  expect_bad(false, json{{"presence_penalty", 2.5}}, "presence_penalty", "[-2");
  expect_bad(true, json{{"frequency_penalty", -3}}, "frequency_penalty", "[-2");
  expect_bad(false, json{{"logit_bias", {{"5", 101}}}}, "logit_bias", "[-100, 100]");
  expect_bad(false, json{{"logit_bias", {{"abc", 1}}}}, "logit_bias", "not a token id");
  expect_bad(false, json{{"logit_bias", {{"100000", 1}}}}, "logit_bias", "not a token id");
  expect_bad(false, json{{"logit_bias", {{"-1", 1}}}}, "logit_bias", "not a token id");
  expect_bad(false, json{{"logit_bias", json::array({1})}}, "logit_bias", "must be an object");
}

TEST(OpenaiApi, LogprobsLimitsAreA400) {
  const std::string most = std::to_string(qspec::kMaxTopLogprobs);
  expect_bad(true, json{{"logprobs", true}, {"top_logprobs", 30}}, "top_logprobs", "[0, " + most + "]");
  expect_bad(true, json{{"top_logprobs", 5}}, "top_logprobs", "needs \"logprobs\": true");
  expect_bad(true, json{{"logprobs", 1}}, "logprobs", "must be a boolean");
  expect_bad(false, json{{"logprobs", 21}}, "logprobs", "[0, " + most + "]");
  expect_bad(false, json{{"logprobs", -1}}, "logprobs", "[0, " + most + "]");
  expect_bad(false, json{{"logprobs", true}}, "logprobs", "must be an integer");
  // max_tokens 0 only scores a prompt that is echoed.
  expect_bad(false, json{{"max_tokens", 0}}, "max_tokens", "0 only with \"echo\": true");
  // Chat has no echo; completions take the top count in logprobs, not top_logprobs.
  expect_refused(true, "echo", true);
  expect_refused(false, "top_logprobs", 2);
  expect_bad(false, json{{"prompt", json::array({json::array({1}), json::array({2})})}}, "prompt", "batched prompts");
}

TEST(OpenaiApi, NeutralValuesOfUnsupportedOptionsAreAccepted) {
  for (bool chat : {false, true}) {
    json all = json::object();
    for (const Case& c : kNeutralOnBoth) {
      SCOPED_TRACE(std::string(endpoint(chat)) + " " + c.field + " = " + c.value.dump());
      EXPECT_NO_THROW(parse(chat, json{{c.field, c.value}}));
      all[c.field] = c.value;
    }
    if (chat) {
      EXPECT_NO_THROW(parse(chat, json{{"logprobs", false}}));
      all["logprobs"] = false;
    }
    SCOPED_TRACE(std::string(endpoint(chat)) + " all neutral values together: " + all.dump());
    const qspec::ApiRequest request = parse(chat, all);
    EXPECT_EQ(request.chat, chat);
    EXPECT_FALSE(request.request.prompt.empty());
    EXPECT_EQ(request.request.max_new_tokens, 4);
  }
}

TEST(OpenaiApi, HarmlessAndUnknownFieldsAreIgnored) {
  // Fields OpenAI clients send that do not change the completion, and fields OpenAI does not
  // define at all.
  const json harmless = {{"user", "user-1234"},
                         {"metadata", {{"session", "abc"}}},
                         {"store", false},
                         {"service_tier", "auto"},
                         {"parallel_tool_calls", true},
                         {"prompt_cache_key", "k"},
                         {"safety_identifier", "s"},
                         {"stream_options", nullptr},
                         {"some_future_field", {1, 2, 3}}};
  for (bool chat : {false, true}) {
    SCOPED_TRACE(endpoint(chat));
    EXPECT_NO_THROW(parse(chat, harmless));
  }
}

TEST(OpenaiApi, RefusalComesWithTheAcceptedValues) {
  try {
    parse(/*chat=*/false, json{{"best_of", 3}});
    ADD_FAILURE() << "accepted";
  } catch (const qspec::ApiError& error) {
    EXPECT_EQ(std::string(error.what()), "'best_of' = 3 is not supported by this server (it accepts only 1)");
  }
  try {  // a long value is shortened in the message
    parse(/*chat=*/true, json{{"prediction", {{"type", "content"}, {"content", std::string(200, 'x')}}}});
    ADD_FAILURE() << "accepted";
  } catch (const qspec::ApiError& error) {
    EXPECT_EQ(error.param, "prediction");
    EXPECT_LT(std::string(error.what()).size(), 160u) << error.what();
  }
}

namespace {

TEST(OpenaiApi, SeedIsTheClientsOrANewOneEachRequest) {
  const auto seeded_a = parse(false, json{{"seed", 42}, {"temperature", 0.8}});
  const auto seeded_b = parse(false, json{{"seed", 42}, {"temperature", 0.8}});
  EXPECT_EQ(seeded_a.request.sampling.seed, 42u);
  EXPECT_EQ(seeded_b.request.sampling.seed, 42u);
  // Without a seed each request draws its own (OpenAI and vLLM do not repeat a sampled answer).
  const auto a = parse(false, json{{"temperature", 0.8}});
  const auto b = parse(false, json{{"temperature", 0.8}});
  EXPECT_NE(a.request.sampling.seed, b.request.sampling.seed);
}

}  // namespace
