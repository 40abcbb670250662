// Chat template parser: recursive descent from tokens to the AST of chat_template_impl.h.
// Operator precedence follows Jinja, lowest first:
//   `x if c else y`, or, and, not, comparisons (== != < > <= >= in, not in; chained),
//   + -, ~, * / // %, **, unary - +, then filters `|f` and tests `is t`, then postfix
//   `.name`, `[index]`, `[a:b:c]`, `.method(...)`.
// Statements: if/elif/else/endif, for/else/endfor (with an `if` filter and tuple targets),
// set (name, namespace attribute, block form), break, continue, and transformers'
// generation/endgeneration (rendered as its body). Anything else is an error naming the
// construct and its position.
#include <algorithm>
#include <array>

#include "tokenizer/chat_template_impl.h"

namespace qspec::jinja {
namespace {

// Expression and block nesting beyond this is refused (the evaluator recurses as deep).
constexpr int kMaxDepth = 200;

bool is_reserved(std::string_view name) {
  static constexpr std::array<std::string_view, 7> kReserved = {"and", "or", "not", "in", "is", "if", "else"};
  return std::find(kReserved.begin(), kReserved.end(), name) != kReserved.end();
}

bool is_unsupported_statement(std::string_view name) {
  static constexpr std::array<std::string_view, 13> kUnsupported = {
      "macro", "call", "filter", "include", "import", "from", "extends",
      "block", "with", "raw", "autoescape", "do", "trans"};
  return std::find(kUnsupported.begin(), kUnsupported.end(), name) != kUnsupported.end();
}

ExprPtr make_expr(ExprKind kind, SourcePos pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

NodePtr make_node(NodeKind kind, SourcePos pos) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->pos = pos;
  return n;
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::Text: return "template text";
    case TokenKind::OutputBegin: return "'{{'";
    case TokenKind::OutputEnd: return "'}}'";
    case TokenKind::StatementBegin: return "'{%'";
    case TokenKind::StatementEnd: return "'%}'";
    case TokenKind::String: return "string literal";
    case TokenKind::Integer:
    case TokenKind::Float: return "number " + t.text;
    case TokenKind::End: return "end of template";
    default: return "'" + t.text + "'";
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Template run() {
    Template tmpl;
    tmpl.body = parse_body({}, nullptr);
    return tmpl;
  }

 private:
  std::vector<Token> tokens_;
  size_t at_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;

  // RAII nesting counter.
  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& parser, SourcePos pos) : p(parser) {
      if (++p.depth_ > kMaxDepth) fail_at(pos, "nesting too deep (more than ", kMaxDepth, " levels)");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // ---- token helpers ----

  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(at_ + ahead, tokens_.size() - 1)]; }
  const Token& next() { return tokens_[at_ < tokens_.size() - 1 ? at_++ : at_]; }

  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Operator && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Name && peek(ahead).text == name;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void unexpected(std::string_view expected) const {
    fail_at(peek().pos, "expected ", expected, ", found ", describe(peek()));
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) unexpected("'" + std::string(op) + "'");
  }
  void expect_kind(TokenKind kind, std::string_view what) {
    if (peek().kind != kind) unexpected(what);
    next();
  }
  void expect_statement_end() { expect_kind(TokenKind::StatementEnd, "'%}'"); }
  std::string expect_identifier(std::string_view what) {
    if (peek().kind != TokenKind::Name || is_reserved(peek().text)) unexpected(what);
    return next().text;
  }

  // ---- statements ----

  struct Block {
    std::string opener;  // "if", "for", ...; empty for the template itself
    SourcePos pos;
    std::string end;  // "endif", ...
  };
  std::vector<Block> blocks_;

  // RAII entry on the stack of open blocks, for error messages.
  struct OpenBlock {
    Parser& p;
    OpenBlock(Parser& parser, Block block) : p(parser) { p.blocks_.push_back(std::move(block)); }
    ~OpenBlock() { p.blocks_.pop_back(); }
  };

  [[noreturn]] void misplaced(SourcePos pos, const std::string& name) const {
    const Block& inner = blocks_.back();
    if (inner.opener.empty()) fail_at(pos, "unexpected '", name, "' (no open block it could belong to)");
    fail_at(pos, "unexpected '", name, "': the innermost open block is '", inner.opener, "' at ", inner.pos.line, ":",
            inner.pos.column, " (expected '", inner.end, "')");
  }

  // Parses nodes until `{% name` with name in `terminators` (consumed up to the name, which
  // goes to *found) or the end of the template (an error unless terminators is empty).
  Body parse_body(std::vector<std::string_view> terminators, std::string* found, SourcePos opened = {},
                  std::string_view opener = {}) {
    DepthGuard guard(*this, peek().pos);
    OpenBlock block(*this, {std::string(opener), opened, terminators.empty() ? "" : std::string(terminators.back())});
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::End) {
        if (terminators.empty()) return body;
        fail_at(opened, "unclosed '", opener, "' (expected '", terminators.back(), "' before the end of the template)");
      }
      if (t.kind == TokenKind::StatementBegin && peek(1).kind == TokenKind::Name &&
          std::find(terminators.begin(), terminators.end(), peek(1).text) != terminators.end()) {
        next();
        *found = next().text;
        return body;
      }
      parse_node(body);
    }
  }

  void parse_node(Body& body) {
    const Token& t = next();
    if (t.kind == TokenKind::Text) {
      auto node = make_node(NodeKind::Text, t.pos);
      node->text = t.text;
      body.push_back(std::move(node));
    } else if (t.kind == TokenKind::OutputBegin) {
      auto node = make_node(NodeKind::Output, t.pos);
      node->expr = parse_expression();
      expect_kind(TokenKind::OutputEnd, "'}}'");
      body.push_back(std::move(node));
    } else {
      parse_statement(body);  // the lexer only emits Text, OutputBegin, StatementBegin here
    }
  }

  void parse_statement(Body& body) {
    if (peek().kind != TokenKind::Name) unexpected("a statement name after '{%'");
    const Token& t = next();
    const std::string& name = t.text;
    if (name == "if") return body.push_back(parse_if(t.pos));
    if (name == "for") return body.push_back(parse_for(t.pos));
    if (name == "set") return body.push_back(parse_set(t.pos));
    if (name == "break" || name == "continue") return body.push_back(parse_loop_control(t.pos, name));
    if (name == "generation") return parse_generation(t.pos, body);
    if (is_unsupported_statement(name)) fail_at(t.pos, "unsupported statement '", name, "'");
    if (name == "elif" || name == "else" || name.starts_with("end")) misplaced(t.pos, name);
    fail_at(t.pos, "unknown statement '", name, "'");
  }

  NodePtr parse_if(SourcePos pos) {
    auto node = make_node(NodeKind::If, pos);
    ExprPtr condition = parse_expression();
    while (true) {
      expect_statement_end();
      std::string found;
      Body branch = parse_body({"elif", "else", "endif"}, &found, pos, "if");
      node->branches.emplace_back(std::move(condition), std::move(branch));
      if (found == "endif") break;
      if (found == "else") {
        expect_statement_end();
        node->branches.emplace_back(nullptr, parse_body({"endif"}, &found, pos, "if"));
        break;
      }
      condition = parse_expression();
    }
    expect_statement_end();
    return node;
  }

  NodePtr parse_for(SourcePos pos) {
    auto node = make_node(NodeKind::For, pos);
    do {
      node->targets.push_back(expect_identifier("a loop variable name"));
    } while (accept_op(","));
    if (!accept_name("in")) unexpected("'in'");
    node->expr = parse_expression(false);
    if (accept_name("if")) node->condition = parse_expression(false);
    if (is_name("recursive")) fail_at(peek().pos, "unsupported: recursive for loops");
    expect_statement_end();
    ++loop_depth_;
    std::string found;
    node->body = parse_body({"else", "endfor"}, &found, pos, "for");
    --loop_depth_;
    if (found == "else") {
      expect_statement_end();
      node->else_body = parse_body({"endfor"}, &found, pos, "for");
    }
    expect_statement_end();
    return node;
  }

  NodePtr parse_set(SourcePos pos) {
    auto node = make_node(NodeKind::Set, pos);
    node->targets.push_back(expect_identifier("a variable name after 'set'"));
    if (accept_op(".")) node->targets.push_back(expect_identifier("an attribute name"));
    if (is_op(",")) fail_at(peek().pos, "unsupported: tuple assignment in 'set'");
    if (peek().kind == TokenKind::StatementEnd && node->targets.size() == 1) {
      next();
      node->kind = NodeKind::SetBlock;
      std::string found;
      node->body = parse_body({"endset"}, &found, pos, "set");
      expect_statement_end();
      return node;
    }
    expect_op("=");
    node->expr = parse_expression();
    expect_statement_end();
    return node;
  }

  NodePtr parse_loop_control(SourcePos pos, const std::string& name) {
    if (loop_depth_ == 0) fail_at(pos, "'", name, "' outside of a for loop");
    expect_statement_end();
    return make_node(name == "break" ? NodeKind::Break : NodeKind::Continue, pos);
  }

  // transformers' {% generation %} marks assistant text for masks; it renders its body.
  void parse_generation(SourcePos pos, Body& body) {
    expect_statement_end();
    std::string found;
    Body inner = parse_body({"endgeneration"}, &found, pos, "generation");
    expect_statement_end();
    for (auto& node : inner) body.push_back(std::move(node));
  }

  // ---- expressions ----

  ExprPtr parse_expression(bool allow_conditional = true) {
    DepthGuard guard(*this, peek().pos);
    ExprPtr expr = parse_or();
    while (allow_conditional && is_name("if")) {
      auto cond = make_expr(ExprKind::Conditional, next().pos);
      cond->args.push_back(std::move(expr));
      cond->args.push_back(parse_or());
      cond->args.push_back(accept_name("else") ? parse_expression() : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(ExprKind kind, SourcePos pos, ExprPtr left, ExprPtr right) {
    auto e = make_expr(kind, pos);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  // A left-associative chain of the keyword operator `word` (or, and) over what parse_next parses.
  ExprPtr parse_keyword_level(std::string_view word, ExprKind kind, ExprPtr (Parser::*parse_next)()) {
    ExprPtr left = (this->*parse_next)();
    while (is_name(word)) {
      SourcePos pos = next().pos;
      left = binary(kind, pos, std::move(left), (this->*parse_next)());
    }
    return left;
  }

  ExprPtr parse_or() { return parse_keyword_level("or", ExprKind::Or, &Parser::parse_and); }
  ExprPtr parse_and() { return parse_keyword_level("and", ExprKind::And, &Parser::parse_not); }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    DepthGuard guard(*this, peek().pos);
    auto e = make_expr(ExprKind::Not, next().pos);
    e->args.push_back(parse_not());
    return e;
  }

  // The comparison operator at the cursor (consumed), if any.
  bool accept_compare_op(Op& op) {
    static const std::pair<std::string_view, Op> kOps[] = {{"==", Op::Eq}, {"!=", Op::Ne}, {"<", Op::Lt},
                                                           {">", Op::Gt},  {"<=", Op::Le}, {">=", Op::Ge}};
    for (const auto& [text, value] : kOps) {
      if (accept_op(text)) {
        op = value;
        return true;
      }
    }
    if (accept_name("in")) {
      op = Op::In;
      return true;
    }
    if (!is_name("not") || !is_name("in", 1)) return false;
    next();
    next();
    op = Op::NotIn;
    return true;
  }

  ExprPtr parse_compare() {
    SourcePos pos = peek().pos;
    ExprPtr first = parse_math1();
    Op op;
    if (!accept_compare_op(op)) return first;
    auto e = make_expr(ExprKind::Compare, pos);
    e->args.push_back(std::move(first));
    do {
      e->ops.push_back(op);
      e->args.push_back(parse_math1());
    } while (accept_compare_op(op));
    return e;
  }

  // One left-associative level of binary operators.
  template <typename Next>
  ExprPtr parse_binary_level(std::initializer_list<std::pair<std::string_view, Op>> ops, Next parse_next) {
    ExprPtr left = (this->*parse_next)();
    while (true) {
      auto it = std::find_if(ops.begin(), ops.end(), [&](const auto& o) { return is_op(o.first); });
      if (it == ops.end()) return left;
      SourcePos pos = next().pos;
      auto e = binary(ExprKind::Binary, pos, std::move(left), (this->*parse_next)());
      e->op = it->second;
      left = std::move(e);
    }
  }

  ExprPtr parse_math1() { return parse_binary_level({{"+", Op::Add}, {"-", Op::Sub}}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return parse_binary_level({{"~", Op::Concat}}, &Parser::parse_math2); }
  ExprPtr parse_math2() {
    return parse_binary_level({{"*", Op::Mul}, {"/", Op::Div}, {"//", Op::FloorDiv}, {"%", Op::Mod}},
                              &Parser::parse_pow);
  }
  ExprPtr parse_pow() { return parse_binary_level({{"**", Op::Pow}}, &Parser::parse_unary_filtered); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filters) {
    DepthGuard guard(*this, peek().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make_expr(t.text == "-" ? ExprKind::Negate : ExprKind::Plus, t.pos);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filters ? parse_filters_and_tests(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::Name: return parse_name();
      case TokenKind::String: return parse_strings();
      case TokenKind::Integer: return literal(Value::integer(next().int_value), t.pos);
      case TokenKind::Float: return literal(Value::number(next().float_value), t.pos);
      case TokenKind::Operator:
        if (t.text == "(") return parse_parenthesized();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    unexpected("an expression");
  }

  ExprPtr literal(Value value, SourcePos pos) {
    auto e = make_expr(ExprKind::Literal, pos);
    e->value = std::move(value);
    return e;
  }

  ExprPtr keyword_literal(Value value) {
    SourcePos pos = next().pos;
    return literal(std::move(value), pos);
  }

  ExprPtr parse_name() {
    const Token& t = peek();
    if (t.text == "true" || t.text == "True") return keyword_literal(Value::boolean(true));
    if (t.text == "false" || t.text == "False") return keyword_literal(Value::boolean(false));
    if (t.text == "none" || t.text == "None") return keyword_literal(Value::none());
    std::string name = expect_identifier("an expression");
    if (!is_op("(")) {
      auto e = make_expr(ExprKind::Name, t.pos);
      e->name = name;
      return e;
    }
    if (!is_known_function(name)) fail_at(t.pos, "unknown function '", name, "()'");
    auto e = make_expr(ExprKind::Call, t.pos);
    e->name = name;
    parse_call_arguments(*e);
    return e;
  }

  // Adjacent string literals concatenate, as in Python.
  ExprPtr parse_strings() {
    SourcePos pos = peek().pos;
    std::string text;
    while (peek().kind == TokenKind::String) text += next().text;
    return literal(Value::string(std::move(text)), pos);
  }

  ExprPtr parse_parenthesized() {
    SourcePos pos = next().pos;
    if (accept_op(")")) return make_expr(ExprKind::List, pos);  // () is an empty tuple
    ExprPtr first = parse_expression();
    if (accept_op(")")) return first;
    auto tuple = make_expr(ExprKind::List, pos);  // tuples are lists here
    tuple->args.push_back(std::move(first));
    while (accept_op(",") && !is_op(")")) tuple->args.push_back(parse_expression());
    expect_op(")");
    return tuple;
  }

  // Comma-separated items up to the operator `close` (consumed; a trailing comma is allowed):
  // parse_item parses each.
  template <typename ParseItem>
  void parse_separated(std::string_view close, ParseItem parse_item) {
    while (!is_op(close)) {
      parse_item();
      if (!accept_op(",")) break;
    }
    expect_op(close);
  }

  ExprPtr parse_list() {
    auto e = make_expr(ExprKind::List, next().pos);
    parse_separated("]", [&] { e->args.push_back(parse_expression()); });
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make_expr(ExprKind::Dict, next().pos);
    parse_separated("}", [&] {
      e->args.push_back(parse_expression());
      expect_op(":");
      e->args.push_back(parse_expression());
    });
    return e;
  }

  // ( positional..., name=value... )
  void parse_call_arguments(Expr& call) {
    expect_op("(");
    parse_separated(")", [&] {
      if (peek().kind == TokenKind::Name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call.kwargs.emplace_back(key, parse_expression());
      } else {
        if (!call.kwargs.empty()) fail_at(peek().pos, "positional argument after keyword argument");
        call.args.push_back(parse_expression());
      }
    });
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        e = parse_attribute(std::move(e));
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        fail_at(peek().pos, "only built-in functions and methods can be called");
      } else {
        return e;
      }
    }
  }

  // The name after '.', '|' or 'is' (the caller consumed those), and where it stands.
  std::string expect_operation_name(SourcePos& pos, const char* what) {
    pos = peek().pos;
    if (peek().kind != TokenKind::Name) unexpected(what);
    return next().text;
  }

  // A named operation on an operand (attribute, method, filter, test): the operand its first argument.
  ExprPtr named_operation(ExprKind kind, SourcePos pos, std::string name, ExprPtr operand) {
    auto e = make_expr(kind, pos);
    e->name = std::move(name);
    e->args.push_back(std::move(operand));
    return e;
  }

  ExprPtr parse_attribute(ExprPtr object) {
    next();
    SourcePos pos;
    std::string name = expect_operation_name(pos, "an attribute name after '.'");
    bool call = is_op("(");
    if (call && !is_known_method(name)) fail_at(pos, "unknown method '.", name, "()'");
    auto e = named_operation(call ? ExprKind::Method : ExprKind::Attribute, pos, name, std::move(object));
    if (call) parse_call_arguments(*e);
    return e;
  }

  ExprPtr parse_subscript(ExprPtr object) {
    SourcePos pos = next().pos;
    ExprPtr start = is_op(":") ? nullptr : parse_expression();
    if (accept_op("]")) {
      auto e = make_expr(ExprKind::Index, pos);
      e->args.push_back(std::move(object));
      e->args.push_back(std::move(start));
      return e;
    }
    expect_op(":");
    auto e = make_expr(ExprKind::Slice, pos);
    e->args.push_back(std::move(object));
    e->args.push_back(std::move(start));
    e->args.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression());
    e->args.push_back(accept_op(":") && !is_op("]") ? parse_expression() : nullptr);
    expect_op("]");
    return e;
  }

  ExprPtr parse_filters_and_tests(ExprPtr e) {
    while (is_op("|") || is_name("is")) e = is_op("|") ? parse_filter(std::move(e)) : parse_test(std::move(e));
    return e;
  }

  ExprPtr parse_filter(ExprPtr operand) {
    next();
    SourcePos pos;
    std::string name = expect_operation_name(pos, "a filter name after '|'");
    if (!is_known_filter(name)) fail_at(pos, "unknown filter '", name, "'");
    auto e = named_operation(ExprKind::Filter, pos, name, std::move(operand));
    if (is_op("(")) parse_call_arguments(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr operand) {
    next();
    bool negated = accept_name("not");
    SourcePos pos;
    std::string name = expect_operation_name(pos, "a test name after 'is'");
    if (!is_known_test(name)) fail_at(pos, "unknown test '", name, "'");
    auto e = named_operation(ExprKind::Test, pos, name, std::move(operand));
    e->negated = negated;
    if (is_op("(")) parse_call_arguments(*e);
    if (!e->kwargs.empty()) fail_at(pos, "test '", name, "' takes no keyword arguments");
    return e;
  }
};

}  // namespace

Template parse_template(std::vector<Token> tokens) { return Parser(std::move(tokens)).run(); }

}  // namespace qspec::jinja
