// Chat template evaluator: walks the AST with a stack of variable scopes and writes the
// output. Semantics follow Jinja as transformers uses it: undefined names are falsy and
// print as "", reading an attribute or item of an undefined value is an error; a for loop
// body gets a fresh scope each iteration (so `set` inside a loop does not leak out; use a
// namespace); operators follow Python (int/float arithmetic, `+` on strings and lists).
#include <algorithm>
#include <cmath>
#include <optional>

#include "tokenizer/chat_template_builtins.h"

namespace qspec::jinja {
namespace {

constexpr size_t kMaxOutput = size_t(64) << 20;   // bytes of rendered text
constexpr size_t kMaxIterations = 1'000'000;      // loop iterations in one render

enum class Flow { Normal, Break, Continue };

// "message.content", "messages[0]": how an expression reads, for error messages.
std::string expr_text(const Expr& e) {
  if (e.kind == ExprKind::Name) return e.name;
  if (e.kind == ExprKind::Attribute) return expr_text(*e.args[0]) + "." + e.name;
  if (e.kind == ExprKind::Index) {
    const Expr& index = *e.args[1];
    return expr_text(*e.args[0]) + "[" + (index.kind == ExprKind::Literal ? index.value.repr() : "...") + "]";
  }
  if (e.kind == ExprKind::Literal) return e.value.repr();
  return "(expression)";
}

[[noreturn]] void undefined_error(const Value& v, SourcePos pos, std::string_view doing) {
  fail_at(pos, "'", v.undefined_name(), "' is undefined (", doing, ")");
}

// ---- arithmetic and comparison ----

[[noreturn]] void type_error(const char* op, const Value& a, const Value& b, SourcePos pos) {
  fail_at(pos, "unsupported operand types for ", op, ": ", a.type_name(), " and ", b.type_name());
}

const char* op_text(Op op) {
  static const char* const kText[] = {"+", "-", "*",  "/",  "//", "%", "**", "~",
                                      "==", "!=", "<", ">", "<=", ">=", "in", "not in"};
  return kText[int(op)];
}

// a op b for op in + - *, failing on overflow.
int64_t checked(Op op, int64_t a, int64_t b, SourcePos pos) {
  int64_t r = 0;
  bool overflow = op == Op::Add   ? __builtin_add_overflow(a, b, &r)
                  : op == Op::Sub ? __builtin_sub_overflow(a, b, &r)
                                  : __builtin_mul_overflow(a, b, &r);
  if (overflow) fail_at(pos, "integer overflow");
  return r;
}

Value integer_op(Op op, int64_t a, int64_t b, SourcePos pos) {
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Mul: return Value::integer(checked(op, a, b, pos));
    case Op::FloorDiv:
    case Op::Mod: {
      if (b == 0) fail_at(pos, "integer division or modulo by zero");
      if (a == INT64_MIN && b == -1) fail_at(pos, "integer overflow");
      int64_t q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) --q, m += b;  // Python floors
      return Value::integer(op == Op::FloorDiv ? q : m);
    }
    case Op::Pow: {
      if (b < 0) return Value::number(std::pow(double(a), double(b)));
      int64_t result = 1;
      for (int64_t base = a, e = b; e > 0; e >>= 1) {  // by squaring
        if (e & 1) result = checked(Op::Mul, result, base, pos);
        if (e > 1) base = checked(Op::Mul, base, base, pos);
      }
      return Value::integer(result);
    }
    default: break;
  }
  fail_at(pos, "bad integer operator");  // Div is done in floating point by the caller
}

Value float_op(Op op, double a, double b, SourcePos pos) {
  if (b == 0 && (op == Op::Div || op == Op::FloorDiv || op == Op::Mod)) fail_at(pos, "float division by zero");
  switch (op) {
    case Op::Add: return Value::number(a + b);
    case Op::Sub: return Value::number(a - b);
    case Op::Mul: return Value::number(a * b);
    case Op::Div: return Value::number(a / b);
    case Op::FloorDiv: return Value::number(std::floor(a / b));
    case Op::Mod: {
      double m = std::fmod(a, b);
      return Value::number(m != 0 && ((m < 0) != (b < 0)) ? m + b : m);
    }
    case Op::Pow: return Value::number(std::pow(a, b));
    default: break;
  }
  fail_at(pos, "bad float operator");
}

Value numeric_op(Op op, const Value& a, const Value& b, SourcePos pos) {
  if (a.is_double() || b.is_double() || op == Op::Div) return float_op(op, a.as_double(), b.as_double(), pos);
  return integer_op(op, a.as_int(), b.as_int(), pos);
}

// s * n, list * n (Python repetition).
Value repeat(const Value& seq, int64_t n, SourcePos pos) {
  size_t count = size_t(std::max<int64_t>(n, 0));
  size_t unit = seq.is_string() ? seq.str().size() : seq.items().size();
  // A string up to the rendered text's bound, a list up to range()'s (its items are values, not
  // bytes: 60 M of them took gigabytes).
  const size_t most = seq.is_string() ? kMaxOutput : kMaxRange;
  if (unit && count > most / unit) fail_at(pos, "repetition result too large");
  // An empty sequence repeated is empty, however large the count: not a loop of `count` appends
  // ("" * 2 ** 55 ran for hours; found by the fuzzer).
  if (unit == 0) count = 0;
  if (seq.is_string()) {
    std::string out;
    for (size_t i = 0; i < count; ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  List out;
  for (size_t i = 0; i < count; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out));
}

Value add(const Value& a, const Value& b, SourcePos pos) {
  if (a.is_string() && b.is_string()) return Value::string(a.str() + b.str());
  if (a.is_list() && b.is_list()) {
    if (a.items().size() + b.items().size() > kMaxRange) fail_at(pos, "list concatenation too large");
    List out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return Value::list(std::move(out));
  }
  if (a.is_number() && b.is_number()) return numeric_op(Op::Add, a, b, pos);
  type_error("+", a, b, pos);
}

Value multiply(const Value& a, const Value& b, SourcePos pos) {
  bool a_seq = a.is_string() || a.is_list(), b_seq = b.is_string() || b.is_list();
  if (a_seq && (b.is_int() || b.is_bool())) return repeat(a, b.as_int(), pos);
  if (b_seq && (a.is_int() || a.is_bool())) return repeat(b, a.as_int(), pos);
  if (a.is_number() && b.is_number()) return numeric_op(Op::Mul, a, b, pos);
  type_error("*", a, b, pos);
}

Value binary_op(Op op, const Value& a, const Value& b, SourcePos pos) {
  if (op == Op::Concat) return Value::string(a.to_string() + b.to_string());
  if (a.is_undefined()) undefined_error(a, pos, std::string("operand of ") + op_text(op));
  if (b.is_undefined()) undefined_error(b, pos, std::string("operand of ") + op_text(op));
  if (op == Op::Add) return add(a, b, pos);
  if (op == Op::Mul) return multiply(a, b, pos);
  if (a.is_number() && b.is_number()) return numeric_op(op, a, b, pos);
  type_error(op_text(op), a, b, pos);
}

bool contains(const Value& container, const Value& item, SourcePos pos) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) fail_at(pos, "'in <string>' needs a string on the left, got ", item.type_name());
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.items())
      if (values_equal(v, item)) return true;
    return false;
  }
  if (container.is_map()) return item.is_string() && find_entry(container.entries(), item.str());
  fail_at(pos, "'in' needs a string, list or dict on the right, got ", container.type_name());
}

// a < b etc.: numbers with numbers, strings with strings.
bool order(Op op, const Value& a, const Value& b, SourcePos pos) {
  if (a.is_undefined()) undefined_error(a, pos, std::string("operand of ") + op_text(op));
  if (b.is_undefined()) undefined_error(b, pos, std::string("operand of ") + op_text(op));
  int cmp;
  if (a.is_number() && b.is_number()) {
    cmp = (a.is_double() || b.is_double()) ? (a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double())
                                           : (a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int());
  } else if (a.is_string() && b.is_string()) {
    cmp = a.str().compare(b.str());
  } else {
    fail_at(pos, "'", op_text(op), "' is not supported between ", a.type_name(), " and ", b.type_name());
  }
  switch (op) {
    case Op::Lt: return cmp < 0;
    case Op::Gt: return cmp > 0;
    case Op::Le: return cmp <= 0;
    default: return cmp >= 0;
  }
}

bool compare(Op op, const Value& a, const Value& b, SourcePos pos) {
  switch (op) {
    case Op::Eq: return values_equal(a, b);
    case Op::Ne: return !values_equal(a, b);
    case Op::In: return contains(b, a, pos);
    case Op::NotIn: return !contains(b, a, pos);
    default: return order(op, a, b, pos);
  }
}

// ---- indexing ----

Value get_attribute(const Value& object, const std::string& name, const std::string& text, SourcePos pos) {
  if (object.is_undefined()) undefined_error(object, pos, "reading its attribute '" + name + "'");
  const Value* found = nullptr;
  if (object.is_map()) found = find_entry(object.entries(), name);
  if (object.is_namespace()) found = find_entry(object.ns_attributes(), name);
  return found ? *found : Value::undefined(text);
}

// Python index normalisation: -1 is the last item; npos when out of range.
size_t list_index(const Value& index, size_t size) {
  if (!index.is_int() && !index.is_bool()) return std::string::npos;
  int64_t i = index.as_int();
  if (i < 0) i += int64_t(size);
  return i >= 0 && i < int64_t(size) ? size_t(i) : std::string::npos;
}

Value get_item(const Value& object, const Value& index, const std::string& text, SourcePos pos) {
  if (object.is_undefined()) undefined_error(object, pos, "reading an item of it");
  if (index.is_string() && (object.is_map() || object.is_namespace()))
    return get_attribute(object, index.str(), text, pos);
  if (object.is_list()) {
    size_t i = list_index(index, object.items().size());
    if (i != std::string::npos) return object.items()[i];
  }
  if (object.is_string()) {
    std::vector<std::string> chars = utf8_chars(object.str());
    size_t i = list_index(index, chars.size());
    if (i != std::string::npos) return Value::string(chars[i]);
  }
  return Value::undefined(text);
}

// The indices a Python slice [start:stop:step] selects from a sequence of `size` items.
std::vector<size_t> slice_indices(int64_t size, const Value& start_v, const Value& stop_v, const Value& step_v,
                                  SourcePos pos) {
  auto bound = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail_at(pos, "slice ", what, " must be an integer, got ", v.type_name());
    return v.as_int();
  };
  int64_t step = bound(step_v, "step").value_or(1);
  if (step == 0) fail_at(pos, "slice step cannot be zero");
  int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? size : size - 1;
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v < 0 ? *v + size : *v;
    return std::clamp(i, lower, upper);
  };
  int64_t start = clamp(bound(start_v, "start"), step > 0 ? lower : upper);
  int64_t stop = clamp(bound(stop_v, "stop"), step > 0 ? upper : lower);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(size_t(i));
  return out;
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step, SourcePos pos) {
  if (object.is_undefined()) undefined_error(object, pos, "slicing it");
  if (object.is_list()) {
    List out;
    for (size_t i : slice_indices(int64_t(object.items().size()), start, stop, step, pos))
      out.push_back(object.items()[i]);
    return Value::list(std::move(out));
  }
  if (object.is_string()) {
    std::vector<std::string> chars = utf8_chars(object.str());
    std::string out;
    for (size_t i : slice_indices(int64_t(chars.size()), start, stop, step, pos)) out += chars[i];
    return Value::string(std::move(out));
  }
  fail_at(pos, "cannot slice a ", object.type_name());
}

// ---- the renderer ----

class Renderer {
 public:
  explicit Renderer(const Map& variables) {
    scopes_.emplace_back();
    for (std::string_view name : function_names())
      set_entry(scopes_.back(), std::string(name), {Function{std::string(name)}});
    for (const auto& [key, value] : variables) set_entry(scopes_.back(), key, value);
    scopes_.emplace_back();  // the template's own top-level `set`s
  }

  std::string run(const Body& body) {
    std::string out;
    render_body(body, out);
    return out;
  }

 private:
  std::vector<Map> scopes_;  // small: a vector beats a hash map here
  size_t iterations_ = 0;

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (const Value* found = find_entry(*it, name)) return *found;
    return Value::undefined(name);
  }

  // ---- statements ----

  Flow render_body(const Body& body, std::string& out) {
    for (const NodePtr& node : body) {
      Flow flow = render_node(*node, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  Flow render_node(const Node& node, std::string& out) {
    switch (node.kind) {
      case NodeKind::Text: append(out, node.text, node.pos); break;
      case NodeKind::Output: append(out, eval(*node.expr).to_string(), node.pos); break;
      case NodeKind::If: return render_if(node, out);
      case NodeKind::For: render_for(node, out); break;
      case NodeKind::Set: render_set(node); break;
      case NodeKind::SetBlock: render_set_block(node); break;
      case NodeKind::Break: return Flow::Break;
      case NodeKind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  static void append(std::string& out, const std::string& text, SourcePos pos) {
    if (out.size() + text.size() > kMaxOutput) fail_at(pos, "rendered text exceeds ", kMaxOutput, " bytes");
    out += text;
  }

  Flow render_if(const Node& node, std::string& out) {
    for (const auto& [condition, body] : node.branches)
      if (!condition || eval(*condition).truthy()) return render_body(body, out);
    return Flow::Normal;
  }

  void render_for(const Node& node, std::string& out) {
    List items = loop_items(node);
    if (items.empty()) {
      render_body(node.else_body, out);
      return;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (++iterations_ > kMaxIterations) fail_at(node.pos, "more than ", kMaxIterations, " loop iterations");
      scopes_.emplace_back();
      bind_targets(node, items[i]);
      set_entry(scopes_.back(), "loop", loop_variable(items, i));
      Flow flow = render_body(node.body, out);
      scopes_.pop_back();
      if (flow == Flow::Break) break;
    }
  }

  // The iterable's items, less those the loop's `if` filter rejects.
  List loop_items(const Node& node) {
    List items = iterate(eval(*node.expr), node.expr->pos);
    if (!node.condition) return items;
    List kept;
    for (Value& item : items) {
      scopes_.emplace_back();
      bind_targets(node, item);
      bool keep = eval(*node.condition).truthy();
      scopes_.pop_back();
      if (keep) kept.push_back(std::move(item));
    }
    return kept;
  }

  void bind_targets(const Node& node, const Value& item) {
    if (node.targets.size() == 1) {
      set_entry(scopes_.back(), node.targets[0], item);
      return;
    }
    if (!item.is_list() || item.items().size() != node.targets.size())
      fail_at(node.pos, "cannot unpack a ", item.type_name(), " into ", node.targets.size(), " loop variables");
    for (size_t k = 0; k < node.targets.size(); ++k) set_entry(scopes_.back(), node.targets[k], item.items()[k]);
  }

  static Value loop_variable(const List& items, size_t i) {
    int64_t n = int64_t(items.size()), k = int64_t(i);
    Map loop = {{"index", Value::integer(k + 1)},     {"index0", Value::integer(k)},
                {"revindex", Value::integer(n - k)},  {"revindex0", Value::integer(n - k - 1)},
                {"first", Value::boolean(k == 0)},    {"last", Value::boolean(k == n - 1)},
                {"length", Value::integer(n)},        {"depth", Value::integer(1)},
                {"depth0", Value::integer(0)}};
    if (i > 0) loop.emplace_back("previtem", items[i - 1]);
    if (i + 1 < items.size()) loop.emplace_back("nextitem", items[i + 1]);
    return Value::map(std::move(loop));
  }

  void render_set(const Node& node) {
    Value value = eval(*node.expr);
    if (node.targets.size() == 1) {
      set_entry(scopes_.back(), node.targets[0], std::move(value));
      return;
    }
    Value ns = lookup(node.targets[0]);
    if (!ns.is_namespace())
      fail_at(node.pos, "cannot set attribute '", node.targets[1], "' of '", node.targets[0], "': a ", ns.type_name(),
              ", not a namespace()");
    set_entry(ns.ns_attributes(), node.targets[1], std::move(value));
  }

  void render_set_block(const Node& node) {
    std::string text;
    render_body(node.body, text);
    set_entry(scopes_.back(), node.targets[0], Value::string(std::move(text)));
  }

  // ---- expressions ----

  Value eval(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Literal: return e.value;
      case ExprKind::Name: return lookup(e.name);
      case ExprKind::List: return eval_list(e);
      case ExprKind::Dict: return eval_dict(e);
      case ExprKind::Attribute: return get_attribute(eval(*e.args[0]), e.name, expr_text(e), e.pos);
      case ExprKind::Index: return eval_index(e);
      case ExprKind::Slice: return eval_slice(e);
      case ExprKind::Call: return call_function(e.name, eval_args(e, 0, "function '" + e.name + "()'"));
      case ExprKind::Method: return eval_method(e);
      case ExprKind::Filter: return eval_filter(e);
      case ExprKind::Test: return eval_test(e);
      case ExprKind::Not: return Value::boolean(!eval(*e.args[0]).truthy());
      case ExprKind::Negate:
      case ExprKind::Plus: return eval_sign(e);
      case ExprKind::Binary: return eval_binary(e);
      case ExprKind::Compare: return eval_compare(e);
      case ExprKind::And:
      case ExprKind::Or: return eval_logic(e);
      case ExprKind::Conditional: return eval_conditional(e);
    }
    fail_at(e.pos, "bad expression");
  }

  // Operands are evaluated left to right (so the first error is the one reported).
  Value eval_index(const Expr& e) {
    Value object = eval(*e.args[0]);
    Value index = eval(*e.args[1]);
    return get_item(object, index, expr_text(e), e.pos);
  }

  Value eval_slice(const Expr& e) {
    Value object = eval(*e.args[0]);
    Value bounds[3];
    for (int k = 0; k < 3; ++k) bounds[k] = e.args[size_t(k) + 1] ? eval(*e.args[size_t(k) + 1]) : Value::none();
    return slice(object, bounds[0], bounds[1], bounds[2], e.pos);
  }

  Value eval_filter(const Expr& e) {
    Value operand = eval(*e.args[0]);
    return apply_filter(e.name, operand, eval_args(e, 1, "filter '" + e.name + "'"));
  }

  Value eval_test(const Expr& e) {
    Value operand = eval(*e.args[0]);
    return Value::boolean(apply_test(e.name, operand, eval_args(e, 1, "test '" + e.name + "'")) != e.negated);
  }

  Value eval_binary(const Expr& e) {
    Value left = eval(*e.args[0]);
    Value right = eval(*e.args[1]);
    return binary_op(e.op, left, right, e.pos);
  }

  Value eval_list(const Expr& e) {
    List items;
    for (const ExprPtr& item : e.args) items.push_back(eval(*item));
    return Value::list(std::move(items));
  }

  Value eval_dict(const Expr& e) {
    Map entries;
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      Value key = eval(*e.args[i]);
      if (!key.is_string()) fail_at(e.args[i]->pos, "dict keys must be strings, got ", key.type_name());
      set_entry(entries, key.str(), eval(*e.args[i + 1]));
    }
    return Value::map(std::move(entries));
  }

  Args eval_args(const Expr& e, size_t first, std::string what) {
    Args args{{}, {}, e.pos, std::move(what)};
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [key, value] : e.kwargs) args.keyword.emplace_back(key, eval(*value));
    return args;
  }

  Value eval_method(const Expr& e) {
    Value receiver = eval(*e.args[0]);
    if (receiver.is_undefined()) undefined_error(receiver, e.pos, "calling its method '" + e.name + "()'");
    return call_method(receiver, e.name, eval_args(e, 1, "method '" + e.name + "()'"));
  }

  Value eval_sign(const Expr& e) {
    Value v = eval(*e.args[0]);
    if (v.is_undefined()) undefined_error(v, e.pos, "operand of unary minus");
    if (!v.is_number()) fail_at(e.pos, "bad operand type for unary ", e.kind == ExprKind::Negate ? "-" : "+", ": ",
                                v.type_name());
    if (e.kind == ExprKind::Plus) return v.is_double() ? v : Value::integer(v.as_int());
    if (v.is_double()) return Value::number(-v.as_double());
    return integer_op(Op::Sub, 0, v.as_int(), e.pos);
  }

  Value eval_compare(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1]);
      if (!compare(e.ops[i], left, right, e.pos)) return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }

  Value eval_logic(const Expr& e) {
    Value left = eval(*e.args[0]);
    bool short_circuit = e.kind == ExprKind::And ? !left.truthy() : left.truthy();
    return short_circuit ? left : eval(*e.args[1]);
  }

  Value eval_conditional(const Expr& e) {
    if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
    return e.args[2] ? eval(*e.args[2]) : Value::undefined();
  }
};

}  // namespace

std::string render_template(const Template& tmpl, const Map& variables) { return Renderer(variables).run(tmpl.body); }

}  // namespace qspec::jinja
