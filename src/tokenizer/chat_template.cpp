// ChatTemplate: the public face of the chat template renderer (lexer, parser and evaluator
// are in chat_template_*.cpp), and loading a template from a model directory.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/files.h"
#include "qspec/error.h"
#include "tokenizer/chat_template_impl.h"

namespace qspec {

ChatTemplate ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.source_ = source;
  t.template_ = std::make_shared<const jinja::Template>(jinja::parse_template(jinja::tokenize(source)));
  return t;
}

namespace {

template <typename Json>
void add_variables(jinja::Map& variables, const Json& object, const char* what) {
  if (object.is_null()) return;
  QSPEC_CHECK(object.is_object(), "chat template: ", what, " must be a JSON object, got ", object.type_name());
  for (const auto& [key, value] : object.items()) jinja::set_entry(variables, key, jinja::Value::from_json(value));
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  jinja::Map variables;
  add_variables(variables, defaults_, "defaults");
  add_variables(variables, extra, "extra variables");
  jinja::List list;
  for (const ChatMessage& m : messages)
    list.push_back(jinja::Value::map({{"role", jinja::Value::string(m.role)}, {"content", jinja::Value::string(m.content)}}));
  jinja::set_entry(variables, "messages", jinja::Value::list(std::move(list)));
  jinja::set_entry(variables, "add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  return jinja::render_template(*template_, variables);
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& variables) const {
  jinja::Map map;
  add_variables(map, defaults_, "defaults");
  add_variables(map, variables, "variables");
  return jinja::render_template(*template_, map);
}

namespace {

// tokenizer_config.json or chat_template.jinja of a model directory: capped, regular files only.
std::string read_text(const std::filesystem::path& path) { return read_text_file(path.string(), kMaxConfigJsonBytes); }

// The template text from tokenizer_config.json's chat_template (string or named list).
std::string template_text(const nlohmann::json& value, const std::string& file) {
  if (value.is_string()) return value.get<std::string>();
  QSPEC_CHECK(value.is_array(), file, ": chat_template must be a string or a list of {name, template}");
  for (const auto& entry : value) {
    QSPEC_CHECK(entry.is_object() && entry.contains("name") && entry.contains("template") &&
                    entry["template"].is_string(),
                file, ": chat_template list entries must be {\"name\": ..., \"template\": \"...\"}");
    if (entry["name"] == "default") return entry["template"].get<std::string>();
  }
  fail(file, ": chat_template has no template named \"default\"");
}

void set_token_defaults(ChatTemplate& t, const nlohmann::json& config, const std::string& file) {
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const nlohmann::json& token = config[key];
    if (token.is_string()) {
      t.set_default(key, token);
    } else {
      QSPEC_CHECK(token.is_object() && token.contains("content") && token["content"].is_string(), file, ": ", key,
                  " must be a string or an object with a \"content\" string");
      t.set_default(key, token["content"]);
    }
  }
}

}  // namespace

ChatTemplate load_chat_template(const std::string& model_dir) {
  std::filesystem::path dir(model_dir);
  std::string file = (dir / "tokenizer_config.json").string();
  QSPEC_CHECK(std::filesystem::exists(file), file, ": not found (needed for the chat template)");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_text(file));
  } catch (const nlohmann::json::exception& e) {
    fail(file, ": malformed JSON: ", e.what());
  }
  QSPEC_CHECK(config.is_object(), file, ": expected a JSON object");
  std::string source_file = file, source;
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    source = template_text(config["chat_template"], file);
  } else {
    source_file = (dir / "chat_template.jinja").string();
    QSPEC_CHECK(std::filesystem::exists(source_file), file, ": no chat_template (and no chat_template.jinja beside it)");
    source = read_text(source_file);
  }
  ChatTemplate t;
  try {
    t = ChatTemplate::parse(source);
  } catch (const Error& e) {
    fail(source_file, ": ", e.what());
  }
  set_token_defaults(t, config, file);
  return t;
}

}  // namespace qspec
