// Internals of the chat template renderer (see chat_template.h): the Value type the
// evaluator works on, the lexer's tokens, the AST the parser builds, and the entry points
// of the three stages (tokenize -> parse -> render). Only the chat_template*.cpp files
// include this header.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "qspec/error.h"

namespace qspec::jinja {

// ---- positions and errors ----

struct SourcePos {
  int line = 1;
  int column = 1;
};

// Throws qspec::Error("chat template LINE:COL: parts...").
template <typename... Parts>
[[noreturn]] void fail_at(SourcePos pos, Parts&&... parts) {
  fail("chat template ", pos.line, ":", pos.column, ": ", std::forward<Parts>(parts)...);
}

// ---- values ----

struct Value;
using List = std::vector<Value>;
using Map = std::vector<std::pair<std::string, Value>>;  // keeps insertion order, as Python

struct Undefined {
  std::string name;  // what was looked up ("foo", "message.bar"), for error messages
};
struct Namespace {
  std::shared_ptr<Map> attributes;  // shared: `set ns.x = ...` is seen by every copy
};
struct Function {
  std::string name;  // one of the built-in global functions
};

struct Value {
  using Data = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
                            std::shared_ptr<const List>, std::shared_ptr<const Map>, Namespace,
                            Function>;
  Data data;

  static Value undefined(std::string name = {}) { return {Undefined{std::move(name)}}; }
  static Value none() { return {nullptr}; }
  static Value boolean(bool b) { return {b}; }
  static Value integer(int64_t i) { return {i}; }
  static Value number(double d) { return {d}; }
  static Value string(std::string s) { return {std::move(s)}; }
  static Value list(List items) { return {std::make_shared<const List>(std::move(items))}; }
  static Value map(Map entries) { return {std::make_shared<const Map>(std::move(entries))}; }
  static Value from_json(const nlohmann::json& j);          // objects: sorted keys
  static Value from_json(const nlohmann::ordered_json& j);  // objects: in their order

  bool is_undefined() const { return std::holds_alternative<Undefined>(data); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(data); }
  bool is_bool() const { return std::holds_alternative<bool>(data); }
  bool is_int() const { return std::holds_alternative<int64_t>(data); }
  bool is_double() const { return std::holds_alternative<double>(data); }
  bool is_number() const { return is_int() || is_double() || is_bool(); }  // bool is an int, as in Python
  bool is_string() const { return std::holds_alternative<std::string>(data); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<const List>>(data); }
  bool is_map() const { return std::holds_alternative<std::shared_ptr<const Map>>(data); }
  bool is_namespace() const { return std::holds_alternative<Namespace>(data); }
  bool is_function() const { return std::holds_alternative<Function>(data); }

  const std::string& str() const { return std::get<std::string>(data); }
  const List& items() const { return *std::get<std::shared_ptr<const List>>(data); }
  const Map& entries() const { return *std::get<std::shared_ptr<const Map>>(data); }
  Map& ns_attributes() const { return *std::get<Namespace>(data).attributes; }
  const std::string& undefined_name() const { return std::get<Undefined>(data).name; }
  int64_t as_int() const { return is_bool() ? int64_t{std::get<bool>(data)} : std::get<int64_t>(data); }
  double as_double() const { return is_double() ? std::get<double>(data) : double(as_int()); }

  bool truthy() const;
  std::string to_string() const;  // Python str(); undefined prints as ""
  std::string repr() const;       // Python repr(), used for items inside lists and dicts
  std::string type_name() const;  // "string", "list", ... for error messages
};

const Value* find_entry(const Map& map, std::string_view key);
// Sets or adds map[key] (a new key goes last).
void set_entry(Map& map, const std::string& key, Value value);
bool values_equal(const Value& a, const Value& b);
std::string python_float_repr(double d);
// json.dumps(value, ensure_ascii=False, indent=indent) (indent < 0: one line), as the
// `tojson` filter of Hugging Face transformers. Throws for undefined and namespaces.
std::string to_json_text(const Value& value, int indent);
// Splits a UTF-8 string into code points (invalid bytes stay single characters).
std::vector<std::string> utf8_chars(const std::string& s);

// ---- tokens ----

enum class TokenKind {
  Text,             // template text between tags (whitespace control already applied)
  OutputBegin,      // {{
  OutputEnd,        // }}
  StatementBegin,   // {%
  StatementEnd,     // %}
  Name,             // identifiers and keywords (if, and, true, none, ...)
  String,           // text holds the decoded value
  Integer,
  Float,
  Operator,         // text holds the operator: "==", "(", "|", ...
  End,
};

struct Token {
  TokenKind kind;
  std::string text;
  SourcePos pos;
  int64_t int_value = 0;
  double float_value = 0;
};

std::vector<Token> tokenize(std::string_view source);

// ---- AST ----

enum class Op { Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Concat, Eq, Ne, Lt, Gt, Le, Ge, In, NotIn };

enum class ExprKind {
  Literal,      // value
  Name,         // name
  List,         // args: the items
  Dict,         // args: key, value, key, value, ...
  Attribute,    // args[0].name
  Index,        // args[0][args[1]]
  Slice,        // args[0][args[1]:args[2]:args[3]] (absent parts are null)
  Call,         // name(args..., kwargs...): a built-in global function
  Method,       // args[0].name(args[1..], kwargs...)
  Filter,       // args[0] | name(args[1..], kwargs...)
  Test,         // args[0] is [not] name(args[1..])
  Not,          // not args[0]
  Negate,       // -args[0]
  Plus,         // +args[0]
  Binary,       // args[0] op args[1]
  Compare,      // args[0] ops[0] args[1] ops[1] args[2] ... (chained, as Python)
  And,          // args[0] and args[1]
  Or,           // args[0] or args[1]
  Conditional,  // args[0] if args[1] else args[2] (args[2] null: undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  SourcePos pos;
  std::string name;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Op op = Op::Add;
  std::vector<Op> ops;
  bool negated = false;
};

enum class NodeKind {
  Text,      // text
  Output,    // {{ expr }}
  If,        // branches: (condition, body); a null condition is the else branch
  For,       // for targets in expr [if condition]: body [else: else_body]
  Set,       // set targets[0] = expr, or set targets[0].targets[1] = expr (namespace)
  SetBlock,  // set targets[0] %} body {% endset
  Break,
  Continue,
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  SourcePos pos;
  std::string text;
  std::vector<std::string> targets;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

struct Template {
  Body body;
};

Template parse_template(std::vector<Token> tokens);

// ---- evaluation ----

// Names the parser accepts; the evaluator implements exactly these.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
bool is_known_method(std::string_view name);
bool is_known_function(std::string_view name);

// Renders with `variables` (JSON object entries) over the built-in functions.
std::string render_template(const Template& tmpl, const Map& variables);

}  // namespace qspec::jinja
