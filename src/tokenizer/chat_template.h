// Chat templates: renders a conversation into a prompt with the Jinja `chat_template` of a
// Hugging Face tokenizer_config.json. The template is parsed once into a syntax tree and
// can be rendered many times (render is const and thread-safe).
//
// A Jinja subset, rendered as transformers does (trim_blocks and lstrip_blocks on):
//   * {{ expr }}, {% if/elif/else/endif %}, {% for x in xs [if cond] %} / {% else %} /
//     {% endfor %} (tuple targets `for k, v in ...`, loop.index, index0, revindex,
//     revindex0, first, last, length, previtem, nextitem), {% set x = expr %},
//     {% set ns = namespace(a=...) %} with {% set ns.a = expr %}, {% set x %}...{% endset %},
//     {% break %}, {% continue %}, {% generation %}, comments {# #}, whitespace control
//     {%- -%} {{- -}} {#- -#} and {%+ +%};
//   * literals: strings (Python escapes), integers, floats, true/false/none (any case
//     Jinja accepts), lists, dicts, tuples (as lists);
//   * operators: + - * / // % ** ~, == != < > <= >= (chained), in, not in, and, or, not,
//     `a if c else b`, `is [not] test`, `|filter`, .attr, [index], [a:b:c];
//   * filters: trim length count upper lower capitalize title string tojson default/d join
//     replace first last list items int safe;
//   * tests: defined undefined none string number integer float boolean true false mapping
//     sequence iterable callable even odd divisibleby lower upper eq equalto ne;
//   * methods: strings strip lstrip rstrip startswith endswith split replace join upper
//     lower capitalize title; dicts get items keys values;
//   * functions: raise_exception(msg) (throws qspec::Error with msg), strftime_now(format)
//     (the local time), namespace(...), range(...).
// Anything else (macros, includes, unknown filters...) is a qspec::Error at parse time
// naming the construct and its line:column. Undefined variables are falsy and render as "";
// reading an attribute or item of an undefined value is an error. Case mapping is ASCII only.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qspec {

namespace jinja {
struct Template;
}

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // Throws qspec::Error ("chat template LINE:COL: ...") for syntax errors and unsupported
  // constructs.
  static ChatTemplate parse(const std::string& source);

  // The template's variables are: defaults() (bos_token, eos_token... from
  // load_chat_template), then the entries of `extra` (a JSON object or null; for instance
  // tools, date_string), then `messages` (a list of {role, content}) and
  // `add_generation_prompt`. Throws qspec::Error for errors while rendering, including the
  // template's own raise_exception().
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = {}) const;
  // Renders with exactly these variables (a JSON object) over defaults(): for messages
  // that carry more than role and content (tool calls, tools). ordered_json keeps the
  // order of object keys, which `tojson` and dict loops show (nlohmann::json sorts them).
  std::string render_json(const nlohmann::ordered_json& variables) const;

  const std::string& source() const { return source_; }
  const nlohmann::json& defaults() const { return defaults_; }
  void set_default(const std::string& name, nlohmann::json value) { defaults_[name] = std::move(value); }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Template> template_;
  nlohmann::json defaults_ = nlohmann::json::object();
};

// Reads the chat template of a Hugging Face model directory: `chat_template` of
// tokenizer_config.json (a string, or a list of {name, template} from which "default" is
// taken), else a chat_template.jinja file beside it. bos_token, eos_token, pad_token and
// unk_token (strings or {"content": ...} objects) become defaults(). Throws qspec::Error
// naming the file when it is missing or malformed or has no chat template.
ChatTemplate load_chat_template(const std::string& model_dir);

}  // namespace qspec
