// Chat template renderer: the six model-family templates in tests/data/chat_templates,
// goldens from Python Jinja2 (tools/make_chat_template_goldens.py), language features,
// loading from a model directory, and errors (malformed templates, runtime errors, limits).
#include <gtest/gtest.h>

#include <ctime>
#include <functional>
#include <random>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/gemma3_chat_template.h"
#include "qspec/error.h"
#include "tokenizer/chat_template.h"

using nlohmann::json;
using nlohmann::ordered_json;
using qspec::ChatMessage;
using qspec::ChatTemplate;

namespace {

const std::string kData = QSPEC_TEST_DATA "/chat_templates";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

ChatTemplate fixture(const std::string& name) { return ChatTemplate::parse(read_file(kData + "/" + name + ".jinja")); }

const std::vector<ChatMessage> kConversation = {
    {"system", "You are a concise assistant."},
    {"user", "What is 2 + 2?"},
    {"assistant", "4."},
    {"user", "And 3 + 3?"},
};

// Renders a template with variables given as JSON text (object key order kept).
std::string render(const std::string& source, const std::string& variables = "{}") {
  return ChatTemplate::parse(source).render_json(ordered_json::parse(variables));
}

// The qspec::Error message of parsing (and rendering) `source`, or "" when it succeeds.
std::string error_of(const std::string& source, const std::string& variables = "{}") {
  try {
    render(source, variables);
  } catch (const qspec::Error& e) {
    return e.what();
  }
  return "";
}

// ---- the five model-family templates, expected strings written out by hand ----

TEST(ChatTemplateModels, Llama3) {
  ChatTemplate t = fixture("llama3");
  json tokens = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  const std::string expected =
      "<|begin_of_text|>"
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a concise assistant.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nAnd 3 + 3?<|eot_id|>";
  EXPECT_EQ(t.render(kConversation, false, tokens), expected);
  EXPECT_EQ(t.render(kConversation, true, tokens), expected + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // `| trim` on the content only
  EXPECT_EQ(t.render({{"user", "  hi \n"}}, false, tokens),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
}

TEST(ChatTemplateModels, Llama2Chat) {
  ChatTemplate t = fixture("llama2-chat");
  json tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are a concise assistant.\n<</SYS>>\n\nWhat is 2 + 2? [/INST]"
      " 4. </s>"
      "<s>[INST] And 3 + 3? [/INST]";
  EXPECT_EQ(t.render(kConversation, false, tokens), expected);
  EXPECT_EQ(t.render(kConversation, true, tokens), expected);  // the template ignores it
  // .strip() on the content, no system message
  EXPECT_EQ(t.render({{"user", " hi "}, {"assistant", " hello\n"}}, false, tokens),
            "<s>[INST] hi [/INST] hello </s>");
}

TEST(ChatTemplateModels, Llama2ChatRolesMustAlternate) {
  ChatTemplate t = fixture("llama2-chat");
  try {
    t.render({{"user", "a"}, {"user", "b"}}, true, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    FAIL() << "no exception";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate user/assistant/user/assistant/..."),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplateModels, MistralInstruct) {
  ChatTemplate t = fixture("mistral-instruct");
  json tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  const std::string expected =
      "<s> [INST] You are a concise assistant.\n\nWhat is 2 + 2? [/INST]"
      " 4.</s>"
      " [INST] And 3 + 3? [/INST]";
  EXPECT_EQ(t.render(kConversation, false, tokens), expected);
  EXPECT_EQ(t.render(kConversation, true, tokens), expected);
  EXPECT_THROW(t.render({{"assistant", "a"}}, false, tokens), qspec::Error);
  EXPECT_THROW(t.render({{"user", "a"}, {"tool", "b"}}, false, tokens), qspec::Error);
}

TEST(ChatTemplateModels, Qwen25) {
  ChatTemplate t = fixture("qwen2.5");
  json tokens = {{"eos_token", "<|im_end|>"}};
  const std::string expected =
      "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
      "<|im_start|>assistant\n4.<|im_end|>\n"
      "<|im_start|>user\nAnd 3 + 3?<|im_end|>\n";
  EXPECT_EQ(t.render(kConversation, false, tokens), expected);
  EXPECT_EQ(t.render(kConversation, true, tokens), expected + "<|im_start|>assistant\n");
  // Without a system message the template adds its default one.
  EXPECT_EQ(t.render({{"user", "Hi"}}, true, tokens),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateModels, Qwen25ToolsBranchRenders) {
  // Only the no-tools path is required to match, but the tools branches run too.
  ChatTemplate t = fixture("qwen2.5");
  ordered_json vars = ordered_json::parse(R"({
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "18C"},
      {"role": "tool", "content": "sunny"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true
  })");
  const std::string out = t.render_json(vars);
  EXPECT_NE(out.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                     "{\"type\": \"object\"}}}\n</tools>"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                     "\"Paris\"}}\n</tool_call><|im_end|>\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n"
                     "</tool_response><|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << out;
}

TEST(ChatTemplateModels, SmolLM2) {
  ChatTemplate t = fixture("smollm2");
  json tokens = {{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}};
  const std::string expected =
      "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
      "<|im_start|>assistant\n4.<|im_end|>\n"
      "<|im_start|>user\nAnd 3 + 3?<|im_end|>\n";
  EXPECT_EQ(t.render(kConversation, false, tokens), expected);
  EXPECT_EQ(t.render(kConversation, true, tokens), expected + "<|im_start|>assistant\n");
  EXPECT_EQ(t.render({{"user", "Hi"}}, false, tokens),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n");
}

// Gemma 3: the system message becomes the first user turn's prefix, "assistant" is "model",
// contents are trimmed; the GGUF importer's built-in copy is the same text.
TEST(ChatTemplateModels, Gemma3) {
  ChatTemplate t = fixture("gemma3");
  json tokens = {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}};
  const std::string expected =
      "<bos><start_of_turn>user\nYou are a concise assistant.\n\nWhat is 2 + 2?<end_of_turn>\n"
      "<start_of_turn>model\n4.<end_of_turn>\n"
      "<start_of_turn>user\nAnd 3 + 3?<end_of_turn>\n";
  EXPECT_EQ(t.render(kConversation, false, tokens), expected);
  EXPECT_EQ(t.render(kConversation, true, tokens), expected + "<start_of_turn>model\n");
  EXPECT_EQ(read_file(kData + "/gemma3.jinja"), qspec::kGemma3ChatTemplate);
}

TEST(ChatTemplateModels, ParseOnceRenderMany) {
  ChatTemplate t = fixture("smollm2");
  ChatTemplate copy = t;  // copies share the parsed template
  for (int i = 0; i < 3; ++i) {
    std::string content = "message " + std::to_string(i);
    EXPECT_EQ(copy.render({{"system", "s"}, {"user", content}}, false),
              "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\n" + content + "<|im_end|>\n");
  }
  EXPECT_EQ(t.source(), read_file(kData + "/smollm2.jinja"));
}

// ---- goldens from Python Jinja2 ----

ordered_json goldens() { return ordered_json::parse(read_file(kData + "/goldens.json")); }

void check_golden(const std::function<std::string()>& run, const ordered_json& entry) {
  if (entry.contains("error")) {
    EXPECT_THROW(run(), qspec::Error) << "Jinja2: " << entry["message"].get<std::string>();
    return;
  }
  try {
    EXPECT_EQ(run(), entry["expected"].get<std::string>());
  } catch (const qspec::Error& e) {
    ADD_FAILURE() << "threw: " << e.what();
  }
}

TEST(ChatTemplateGoldens, Conversations) {
  ordered_json g = goldens();
  ASSERT_GE(g["conversations"].size(), 50u);
  for (const auto& entry : g["conversations"]) {
    std::string name = entry["template"];
    SCOPED_TRACE(name + " / " + entry["conversation"].get<std::string>() +
                 (entry["add_generation_prompt"].get<bool>() ? " / generation prompt" : ""));
    ChatTemplate t = fixture(name);
    ordered_json vars = g["tokens"][name];
    vars["messages"] = g["conversations_messages"][entry["conversation"].get<std::string>()];
    vars["add_generation_prompt"] = entry["add_generation_prompt"];
    check_golden([&] { return t.render_json(vars); }, entry);
  }
}

TEST(ChatTemplateGoldens, Snippets) {
  ordered_json g = goldens();
  ASSERT_GE(g["snippets"].size(), 60u);
  for (const auto& entry : g["snippets"]) {
    SCOPED_TRACE(entry["name"].get<std::string>() + ": " + entry["template"].get<std::string>());
    check_golden([&] { return ChatTemplate::parse(entry["template"].get<std::string>()).render_json(entry["variables"]); }, entry);
  }
}

// ---- language features (more in the goldens' snippets) ----

TEST(ChatTemplateSyntax, WhitespaceControl) {
  EXPECT_EQ(render("a  {%- if true %} b {% endif -%}  c"), "a b c");
  EXPECT_EQ(render("a \n {{- 'x' -}} \n b"), "axb");
  EXPECT_EQ(render("a {#- note -#} b"), "ab");
  // trim_blocks and lstrip_blocks, as transformers renders chat templates
  EXPECT_EQ(render("{% for m in ['a', 'b'] %}\n  {% if m %}\n{{ m }}\n  {% endif %}\n{% endfor %}\n"), "a\nb\n");
  EXPECT_EQ(render("x {% if true %}y{% endif %}"), "x y");  // not at a line start: kept
  EXPECT_EQ(render("  {{ 'v' }}\n"), "  v");               // {{ }} is not lstripped; trailing newline dropped
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(ChatTemplateSyntax, LoopVariables) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.first }}{{ '.' if loop.last }}"
                   "{{ loop.index0 }} {% endfor %}",
                   R"({"xs": ["a", "b", "c"]})"),
            "1/3!0 2/31 3/3.2 ");
  EXPECT_EQ(render("{% for x in [1, 2] %}{% for y in 'ab' %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}"),
            "121|122|");
  EXPECT_EQ(render("{% for x in xs if x != 2 %}{{ x }}{{ loop.revindex }}{% else %}none{% endfor %}",
                   R"({"xs": [1, 2, 3]})"),
            "1231");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}"
                   "{% endif %}{{ i }}{% endfor %}"),
            "02");
}

TEST(ChatTemplateSyntax, NamespaceSet) {
  EXPECT_EQ(render("{% set ns = namespace(sys='', n=0) %}{% for m in messages %}{% if m.role == 'system' %}"
                   "{% set ns.sys = m.content %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.sys }}:{{ ns.n }}",
                   R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]})"),
            "S:2");
  // a plain set inside a loop does not leak out of it
  EXPECT_EQ(render("{% set n = 0 %}{% for i in [1, 2] %}{% set n = n + i %}{% endfor %}{{ n }}"), "0");
  EXPECT_EQ(render("{% set x %}a{{ 1 + 1 }}b{% endset %}{{ x }}"), "a2b");
}

TEST(ChatTemplateSyntax, Filters) {
  EXPECT_EQ(render("[{{ '  a \n' | trim }}]{{ 'abc' | length }}{{ [1, 2] | length }}{{ 'ab' | upper }}{{ 'AB' | lower }}"
                   "{{ 'hello world' | capitalize }}"),
            "[a]32ABabHello world");
  EXPECT_EQ(render("{{ x | tojson }}", R"({"x": {"b": [1, 2.5, null], "a": "é\"<>"}})"),
            R"({"b": [1, 2.5, null], "a": "é\"<>"})");
  EXPECT_EQ(render("{{ missing | default('d') }}{{ '' | default('e', true) }}{{ 'v' | default('x') }}"), "dev");
  EXPECT_EQ(render("{{ ['a', 'b'] | join('-') }} {{ 'a,b' | replace(',', ';') }} {{ [4, 5] | first }}"), "a-b a;b 4");
}

TEST(ChatTemplateSyntax, Tests) {
  EXPECT_EQ(render("{{ x is defined }}{{ y is defined }}{{ y is not defined }}{{ n is none }}{{ x is string }}"
                   "{{ x is not string }}",
                   R"({"x": "s", "n": null})"),
            "TrueFalseTrueTrueTrueFalse");
}

TEST(ChatTemplateSyntax, MemberAccessAndSlicing) {
  const char* vars = R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                                      {"role": "assistant", "content": "A"}]})";
  EXPECT_EQ(render("{{ messages[0]['role'] }} {{ messages[1].content }} {{ messages[-1].role }}", vars),
            "system U assistant");
  EXPECT_EQ(render("{% for m in messages[1:] %}{{ m.role[0] }}{% endfor %} {{ (messages | length) }}"
                   " {{ messages[:1] | length }} {{ 'abcdef'[1:4] }} {{ 'abc'[::-1] }}",
                   vars),
            "ua 3 1 bcd cba");
}

TEST(ChatTemplateSyntax, StringMethods) {
  EXPECT_EQ(render("[{{ ' x '.strip() }}] {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} "
                   "{{ 'a b  c'.split() }} {{ 'a,b'.split(',')[1] }} {{ 'x</think>y'.split('</think>')[-1].strip() }}"),
            "[x] True True ['a', 'b', 'c'] b y");
}

TEST(ChatTemplateSyntax, OperatorsAndLiterals) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 'a' ~ 1 }} {{ 'x' in 'xyz' }} "
                   "{{ 2 not in [1] }} {{ not true or 1 < 2 }} {{ 'a\\tb\\n' }}"),
            "7 3 1 3.5 a1 True True True a\tb\n");
  EXPECT_EQ(render("{{ True }}{{ none is none }}{{ None }}{{ [1, 'a'] }}"), "TrueTrueNone[1, 'a']");
}

TEST(ChatTemplateSyntax, GenerationBlockRendersItsBody) {
  EXPECT_EQ(render("{% for m in ['a', 'b'] %}{% generation %}{{ m }}{% endgeneration %}{% endfor %}"), "ab");
}

TEST(ChatTemplateSyntax, StrftimeNow) {
  char expected[64];
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(expected, sizeof expected, "%Y", &local);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), expected);
  // the Llama-3.2 date idiom
  std::string out = render(
      "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
      "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}"
      "{%- endif %}{%- endif %}Today Date: {{ date_string }}");
  std::strftime(expected, sizeof expected, "%d %b %Y", &local);
  EXPECT_EQ(out, std::string("Today Date: ") + expected);
  EXPECT_EQ(render("{{ date_string }}", R"({"date_string": "1 Jan 2025"})"), "1 Jan 2025");
}

TEST(ChatTemplateSyntax, ExtraVariablesAndDefaults) {
  ChatTemplate t = ChatTemplate::parse("{{ bos_token }}{{ messages | length }}{{ add_generation_prompt }}{{ x }}");
  EXPECT_EQ(t.render({{"user", "a"}}, true), "1True");
  t.set_default("bos_token", "<s>");
  EXPECT_EQ(t.render({{"user", "a"}}, false, {{"x", 5}}), "<s>1False5");
  EXPECT_EQ(t.render({}, false, {{"bos_token", "[B]"}}), "[B]0False");
  EXPECT_THROW(t.render({}, false, json::array({1})), qspec::Error);
}

// ---- undefined values ----

TEST(ChatTemplateUndefined, ReadsAsEmpty) {
  EXPECT_EQ(render("[{{ nothing }}][{% if nothing %}x{% endif %}][{{ nothing | length }}][{{ nothing ~ 'a' }}]"),
            "[][][0][a]");
  EXPECT_EQ(render("[{{ m.missing }}][{{ m.missing is defined }}][{{ l[5] }}]", R"({"m": {}, "l": []})"),
            "[][False][]");
  EXPECT_EQ(render("{% for x in nothing %}x{% endfor %}"), "");
}

TEST(ChatTemplateUndefined, AttributeOfUndefinedIsAnError) {
  std::string e = error_of("{{ 1 }}\n  {{ foo.bar }}");
  EXPECT_NE(e.find("chat template 2:10: 'foo' is undefined (reading its attribute 'bar')"), std::string::npos) << e;
  e = error_of("{{ m.a.b }}", R"({"m": {}})");
  EXPECT_NE(e.find("'m.a' is undefined"), std::string::npos) << e;
  e = error_of("{{ messages[3]['role'] }}", R"({"messages": []})");
  EXPECT_NE(e.find("'messages[3]' is undefined"), std::string::npos) << e;
  EXPECT_NE(error_of("{{ foo.strip() }}").find("'foo' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ foo + 1 }}").find("'foo' is undefined"), std::string::npos);
}

// ---- runtime errors ----

TEST(ChatTemplateRuntime, RaiseExceptionIsAQspecError) {
  std::string e = error_of("{% if messages | length == 0 %}{{ raise_exception('No messages!') }}{% endif %}",
                           R"({"messages": []})");
  EXPECT_NE(e.find("No messages!"), std::string::npos) << e;
  EXPECT_NE(e.find("chat template 1:"), std::string::npos) << e;
}

TEST(ChatTemplateRuntime, TypeErrors) {
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand types for +: string and int"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 < 'a' }}").find("'<' is not supported between int and string"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.a = 2 %}").find("not a namespace()"), std::string::npos);
  EXPECT_NE(error_of("{{ 5 | length }}").find("has no length"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a'.get('x') }}").find("a string has no method 'get'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' | trim(1, 2) }}").find("takes at most 1 argument"), std::string::npos);
  EXPECT_NE(error_of("{{ x | tojson }}").find("tojson"), std::string::npos);
  EXPECT_NE(error_of("{% for a, b in [1] %}{% endfor %}").find("cannot unpack"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
}

// ---- malformed templates: a qspec::Error naming the problem and where it is ----

struct Malformed {
  const char* source;
  const char* message;  // expected in the error, position included
};

TEST(ChatTemplateErrors, MalformedTemplatesReportPosition) {
  const Malformed cases[] = {
      {"{% if true %}x", "chat template 1:4: unclosed 'if' (expected 'endif'"},
      {"{% for x in y %}x", "chat template 1:4: unclosed 'for' (expected 'endfor'"},
      {"a\n{% if a %}{% for x in y %}{% endif %}",
       "2:30: unexpected 'endif': the innermost open block is 'for' at 2:14 (expected 'endfor')"},
      {"{% endfor %}", "1:4: unexpected 'endfor'"},
      {"x {% else %}", "1:6: unexpected 'else'"},
      {"{% endif %}", "1:4: unexpected 'endif'"},
      {"{{ x", "1:1: unclosed tag '{{'"},
      {"ab\n  {% if x", "2:3: unclosed tag '{%'"},
      {"{# comment", "1:1: unclosed comment"},
      {"{{ x | nofilter }}", "1:8: unknown filter 'nofilter'"},
      {"{{ x is nosuchtest }}", "1:9: unknown test 'nosuchtest'"},
      {"{% frobnicate %}", "1:4: unknown statement 'frobnicate'"},
      {"{% macro m() %}{% endmacro %}", "1:4: unsupported statement 'macro'"},
      {"{% include 'x.j2' %}", "1:4: unsupported statement 'include'"},
      {"{% raw %}x{% endraw %}", "1:4: unsupported statement 'raw'"},
      {"{{ 'abc }}", "1:4: unterminated string literal"},
      {"{{ \"abc\\\" }}", "1:4: unterminated string literal"},
      {"{{ 1 + }}", "1:8: expected an expression, found '}}'"},
      {"{{ (1 + 2 }}", "1:11: unexpected '}' ('(' is open)"},
      {"{{ (1 + 2", "1:4: unclosed '('"},
      {"{{ (1 + 2) + 3) }}", "1:15: unexpected ')'"},
      {"{{ [1, 2) }}", "1:9: unexpected ')' ('[' is open)"},
      {"{{ [1, 2 }}", "1:10: unexpected '}' ('[' is open)"},
      {"{{ }}", "1:4: expected an expression, found '}}'"},
      {"{{ x y }}", "1:6: expected '}}', found 'y'"},
      {"{{ x @ y }}", "1:6: unexpected character '@'"},
      {"{{ foo(1) }}", "1:4: unknown function 'foo()'"},
      {"{{ x.frob() }}", "1:6: unknown method '.frob()'"},
      {"{{ x[0](1) }}", "1:8: only built-in functions and methods can be called"},
      {"{% for in x %}{% endfor %}", "1:8: expected a loop variable name, found 'in'"},
      {"{% for x y %}{% endfor %}", "1:10: expected 'in', found 'y'"},
      {"{% set %}", "1:8: expected a variable name after 'set', found '%}'"},
      {"{% set x == 1 %}", "1:10: expected '=', found '=='"},
      {"{% set x %}abc", "1:4: unclosed 'set' (expected 'endset'"},
      {"{% if %}{% endif %}", "1:7: expected an expression, found '%}'"},
      {"{% break %}", "1:4: 'break' outside of a for loop"},
      {"{% for x in y recursive %}{% endfor %}", "1:15: unsupported: recursive for loops"},
      {"{{ 'a' if }}", "1:11: expected an expression, found '}}'"},
      {"{{ x | }}", "1:8: expected a filter name after '|', found '}}'"},
      {"{{ x. }}", "1:7: expected an attribute name after '.', found '}}'"},
      {"{{ '\\x4' }}", "1:5: invalid \\x escape"},
      {"{{ 123456789012345678901234 }}", "1:4: integer literal too large"},
      {"{{ 9223372036854775808 }}", "1:4: integer literal too large"},
      {"{% %}", "1:4: expected a statement name after '{%', found '%}'"},
      {"{{ and }}", "1:4: expected an expression, found 'and'"},
      {"{{ f(a=1, 2) }}", "1:4: unknown function 'f()'"},
      {"{{ namespace(a=1, 2) }}", "1:19: positional argument after keyword argument"},
      {"{% if x %}{% elif %}{% endif %}", "1:19: expected an expression, found '%}'"},
      {"{% if x %}{% else %}{% else %}{% endif %}", "1:24: unexpected 'else': the innermost open block is 'if' at 1:4"},
      {"{{ x }}{% endfor %}{% for x in y %}", "1:11: unexpected 'endfor'"},
  };
  ASSERT_GE(std::size(cases), 20u);
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.source);
    try {
      ChatTemplate::parse(c.source);
      ADD_FAILURE() << "parsed without error";
    } catch (const qspec::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << "got: " << e.what();
    }
  }
}

TEST(ChatTemplateErrors, TruncatedTemplatesNeverCrash) {
  // Every prefix of the real templates either parses or throws qspec::Error.
  for (const char* name : {"qwen2.5", "mistral-instruct", "llama2-chat"}) {
    std::string source = read_file(kData + "/" + name + ".jinja");
    int errors = 0;
    for (size_t n = 0; n <= source.size(); ++n) {
      try {
        ChatTemplate::parse(source.substr(0, n));
      } catch (const qspec::Error&) {
        ++errors;
      }
    }
    EXPECT_GT(errors, 0) << name;
  }
}

TEST(ChatTemplateErrors, MutatedTemplatesNeverCrash) {
  // Random edits of the real templates: each parses and renders, or throws qspec::Error.
  const std::string alphabet = "{}%#-+()[]'\".,:|~=<>!*/ \n\\abefilnorstx019_";
  std::mt19937 rng(1234);
  int rendered = 0, errors = 0;
  for (const char* name : {"qwen2.5", "mistral-instruct", "llama2-chat", "llama3", "smollm2"}) {
    const std::string original = read_file(kData + "/" + name + ".jinja");
    for (int trial = 0; trial < 400; ++trial) {
      std::string source = original;
      for (int edit = 0; edit < 1 + int(rng() % 3); ++edit) {
        size_t at = rng() % (source.size() + 1);
        char c = alphabet[rng() % alphabet.size()];
        switch (rng() % 3) {
          case 0: source.insert(at, 1, c); break;
          case 1: if (at < source.size()) source[at] = c; break;
          default: if (at < source.size()) source.erase(at, 1 + rng() % 8); break;
        }
      }
      try {
        ChatTemplate::parse(source).render(kConversation, true, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
        ++rendered;
      } catch (const qspec::Error&) {
        ++errors;
      }
    }
  }
  EXPECT_GT(rendered, 0);
  EXPECT_GT(errors, 0);
}

// ---- limits ----

TEST(ChatTemplateLimits, NestingDepth) {
  auto nested_parens = [](int n) { return "{{ " + std::string(size_t(n), '(') + "1" + std::string(size_t(n), ')') + " }}"; };
  EXPECT_EQ(render(nested_parens(40)), "1");
  EXPECT_NE(error_of(nested_parens(100000)).find("nesting too deep"), std::string::npos);
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_NE(error_of(nots + "x }}").find("nesting too deep"), std::string::npos);
  std::string ifs, endifs;
  for (int i = 0; i < 100000; ++i) ifs += "{% if true %}", endifs += "{% endif %}";
  EXPECT_NE(error_of(ifs + "x" + endifs).find("nesting too deep"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}").find("nesting too deep"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '-') + "1 }}").find("nesting too deep"), std::string::npos);
  ifs.clear(), endifs.clear();
  for (int i = 0; i < 30; ++i) ifs += "{% if true %}", endifs += "{% endif %}";
  EXPECT_EQ(render(ifs + "x" + endifs), "x");
}

TEST(ChatTemplateLimits, RunawayOutputAndLoops) {
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ range(100000000) | length }}").find("range()"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}")
                .find("loop iterations"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}").find("exceeds"), std::string::npos);
  // Empty sequences times a huge count are empty at once (the fuzzer's "" * 2 ** 55 looped 2^55 times).
  EXPECT_EQ(render("{{ 2 ** 55 * '' }}|{{ '' * 2 ** 62 }}|{{ ([] * 2 ** 60) | length }}|{{ 'ab' * 0 }}"), "||0|");
  // Lists are bounded in items as range() is (the fuzzer's messages * 10000000 took seconds and gigabytes).
  EXPECT_NE(error_of("{{ (messages * 10000000) | length }}", R"({"messages": [1, 2, 3]})").find("too large"),
            std::string::npos);
  EXPECT_EQ(render("{{ ([1, 2] * 500000) | length }}"), "1000000");
  EXPECT_NE(error_of("{% set a = [1] * 1000000 %}{{ (a + a) | length }}").find("too large"), std::string::npos);
}

// ---- loading from a model directory ----

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("qspec_chat_" + name + "_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(ChatTemplateLoad, Qwen25TokenizerConfig) {
  ChatTemplate t = qspec::load_chat_template(QSPEC_TEST_DATA "/tokenizers/qwen2.5");
  EXPECT_EQ(t.source(), read_file(kData + "/qwen2.5.jinja"));
  EXPECT_EQ(t.defaults().at("eos_token"), "<|im_end|>");
  EXPECT_FALSE(t.defaults().contains("bos_token"));  // null in the file
  EXPECT_EQ(t.render({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateLoad, NamedTemplateListAndTokenObjects) {
  auto dir = temp_dir("list");
  json config = {
      {"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
      {"eos_token", "<E>"},
      {"chat_template", json::array({{{"name", "tool_use"}, {"template", "tools"}},
                                     {{"name", "default"}, {"template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}}})},
  };
  write_file(dir / "tokenizer_config.json", config.dump());
  ChatTemplate t = qspec::load_chat_template(dir.string());
  EXPECT_EQ(t.render({{"user", "hi"}}, false), "<B>hi<E>");
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplateLoad, ChatTemplateJinjaFile) {
  auto dir = temp_dir("jinja");
  write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  write_file(dir / "chat_template.jinja", "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\n");
  EXPECT_EQ(qspec::load_chat_template(dir.string()).render({{"user", "a"}}, false), "a</s>");
  std::filesystem::remove_all(dir);
}

std::string load_error(const std::filesystem::path& dir) {
  try {
    qspec::load_chat_template(dir.string());
  } catch (const qspec::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplateLoad, ErrorsNameTheFile) {
  auto dir = temp_dir("errors");
  std::string file = (dir / "tokenizer_config.json").string();
  EXPECT_NE(load_error(dir).find(file + ": not found"), std::string::npos) << load_error(dir);
  write_file(file, "{not json");
  EXPECT_NE(load_error(dir).find(file + ": malformed JSON"), std::string::npos) << load_error(dir);
  write_file(file, "[1]");
  EXPECT_NE(load_error(dir).find(file + ": expected a JSON object"), std::string::npos) << load_error(dir);
  write_file(file, R"({"eos_token": "</s>"})");
  EXPECT_NE(load_error(dir).find(file + ": no chat_template"), std::string::npos) << load_error(dir);
  write_file(file, R"({"chat_template": 5})");
  EXPECT_NE(load_error(dir).find(file + ": chat_template must be"), std::string::npos) << load_error(dir);
  write_file(file, R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  EXPECT_NE(load_error(dir).find("no template named \"default\""), std::string::npos) << load_error(dir);
  write_file(file, R"({"chat_template": "{% if x %}"})");
  EXPECT_NE(load_error(dir).find(file + ": chat template 1:4: unclosed 'if'"), std::string::npos) << load_error(dir);
  write_file(file, R"({"chat_template": "x", "bos_token": 5})");
  EXPECT_NE(load_error(dir).find(file + ": bos_token must be"), std::string::npos) << load_error(dir);
  std::filesystem::remove_all(dir);
}

}  // namespace
