// Chat template lexer: splits the source into text and tag tokens, applying whitespace
// control as Hugging Face transformers renders chat templates (Jinja with trim_blocks and
// lstrip_blocks on):
//   * `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` after it;
//   * trim_blocks: the first newline after `%}` or `#}` is removed (`+%}` keeps it);
//   * lstrip_blocks: spaces and tabs between the start of a line and `{%` or `{#` are removed
//     (`{%+` keeps them);
//   * newlines are normalised to "\n" and one trailing newline of the template is dropped.
// Comments produce no tokens.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "tokenizer/chat_template_impl.h"

namespace qspec::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // Jinja's keep_trailing_newline=False
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// How a tag ends: the whitespace control it asks for on the text that follows.
enum class After { Keep, Trim, StripAll };  // Keep: `}}`, `+%}`; Trim: `%}`/`#}`; StripAll: `-...`

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_text_and_tag();
    tokens_.push_back({TokenKind::End, "", pos_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  After after_ = After::Keep;
  bool line_starting_ = true;  // the text to come starts a line (template start or trimmed newline)
  std::vector<size_t> brackets_;  // offsets of the brackets open in the current tag

  SourcePos pos_at(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    return {int(it - line_starts_.begin()) + 1, int(offset - *it) + 1};
  }

  void add(TokenKind kind, std::string text, size_t offset) { tokens_.push_back({kind, std::move(text), pos_at(offset)}); }

  // ---- text and tag boundaries ----

  void lex_text_and_tag() {
    size_t tag = find_tag(pos_);
    std::string text = src_.substr(pos_, tag - pos_);
    apply_after(text);
    if (tag == src_.size()) {
      emit_text(text);
      pos_ = tag;
      return;
    }
    char kind = src_[tag + 1];
    char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
    apply_before(text, kind, modifier);
    emit_text(text);
    pos_ = tag + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
    if (kind == '#') {
      lex_comment(tag);
    } else {
      lex_tag(tag, kind);
    }
  }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) add(TokenKind::Text, text, pos_);
  }

  // Whitespace control from the end of the previous tag.
  void apply_after(std::string& text) const {
    if (after_ == After::StripAll) {
      size_t first = 0;
      while (first < text.size() && is_space(text[first])) ++first;
      text.erase(0, first);
    } else if (after_ == After::Trim && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
  }

  // Whitespace control from the beginning of the next tag.
  void apply_before(std::string& text, char kind, char modifier) const {
    if (modifier == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
      return;
    }
    if (kind == '{' || modifier == '+') return;  // lstrip_blocks is for {% and {# only
    size_t line_start = text.rfind('\n');
    line_start = line_start == std::string::npos ? 0 : line_start + 1;
    if (line_start == 0 && !line_starting_) return;
    bool blank = std::all_of(text.begin() + long(line_start), text.end(), is_space);
    if (blank) text.erase(line_start);
  }

  // Reads the tag closer at pos_ (`-` or `+` already checked by the caller) and records
  // what it asks of the following text.
  void close_tag(char kind, size_t closer) {
    char modifier = src_[closer];
    size_t end = closer + (modifier == '-' || modifier == '+' ? 3 : 2);
    if (modifier == '-') {
      after_ = After::StripAll;
    } else if (modifier == '+' || kind == '{') {
      after_ = After::Keep;
    } else {
      after_ = After::Trim;
    }
    line_starting_ = after_ == After::Trim && end < src_.size() && src_[end] == '\n';
    pos_ = end;
  }

  void lex_comment(size_t open) {
    size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail_at(pos_at(open), "unclosed comment '{#' (no '#}')");
    size_t closer = close;
    if (close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+')) closer = close - 1;
    pos_ = closer;
    close_tag('#', closer);
  }

  // ---- inside {{ }} and {% %} ----

  // The closer of a tag of this kind at `at` ("}}" / "%}", optionally with "-" or "+"),
  // or npos.
  size_t closer_at(size_t at, char kind) const {
    char end = kind == '{' ? '}' : '%';
    size_t i = at;
    if (i < src_.size() && (src_[i] == '-' || (src_[i] == '+' && kind == '%'))) ++i;
    if (i + 1 < src_.size() && src_[i] == end && src_[i + 1] == '}') return at;
    return std::string::npos;
  }

  void lex_tag(size_t open, char kind) {
    add(kind == '{' ? TokenKind::OutputBegin : TokenKind::StatementBegin, "", open);
    brackets_.clear();  // open brackets: "}}" inside them is two closing braces
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size() && !brackets_.empty())
        fail_at(pos_at(brackets_.back()), "unclosed '", src_[brackets_.back()], "'");
      if (pos_ >= src_.size())
        fail_at(pos_at(open), "unclosed tag '", kind == '{' ? "{{" : "{%", "' (no '",
                kind == '{' ? "}}" : "%}", "' before the end of the template)");
      if (brackets_.empty() && closer_at(pos_, kind) != std::string::npos) {
        add(kind == '{' ? TokenKind::OutputEnd : TokenKind::StatementEnd, "", pos_);
        close_tag(kind, pos_);
        return;
      }
      lex_token();
    }
  }

  void lex_token() {
    char c = src_[pos_];
    if (is_name_start(c)) return lex_name();
    if (is_digit(c)) return lex_number();
    if (c == '\'' || c == '"') return lex_string();
    lex_operator();
  }

  void lex_name() {
    size_t start = pos_;
    while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
    add(TokenKind::Name, src_.substr(start, pos_ - start), start);
  }

  void lex_number() {
    size_t start = pos_;
    while (pos_ < src_.size() && is_digit(src_[pos_])) ++pos_;
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      for (++pos_; pos_ < src_.size() && is_digit(src_[pos_]);) ++pos_;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t digits = pos_ + 1 + (pos_ + 1 < src_.size() && (src_[pos_ + 1] == '+' || src_[pos_ + 1] == '-'));
      if (digits < src_.size() && is_digit(src_[digits])) {
        is_float = true;
        for (pos_ = digits; pos_ < src_.size() && is_digit(src_[pos_]);) ++pos_;
      }
    }
    std::string text = src_.substr(start, pos_ - start);
    Token token{is_float ? TokenKind::Float : TokenKind::Integer, text, pos_at(start)};
    if (is_float) {
      token.float_value = std::strtod(text.c_str(), nullptr);  // inf when out of range
    } else {
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), token.int_value);
      if (ec != std::errc() || end != text.data() + text.size())
        fail_at(token.pos, "integer literal too large: ", text);
    }
    tokens_.push_back(std::move(token));
  }

  void lex_string() {
    size_t start = pos_;
    char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) fail_at(pos_at(start), "unterminated string literal");
      char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\\') {
        lex_escape(value);
      } else {
        value += c;
      }
    }
    add(TokenKind::String, std::move(value), start);
  }

  // Python escape sequences (the backslash is consumed); unknown ones are kept as written.
  void lex_escape(std::string& value) {
    size_t at = pos_ - 1;
    if (pos_ >= src_.size()) fail_at(pos_at(at), "unterminated string literal");
    char c = src_[pos_++];
    switch (c) {
      case 'n': value += '\n'; return;
      case 't': value += '\t'; return;
      case 'r': value += '\r'; return;
      case '\\': value += '\\'; return;
      case '\'': value += '\''; return;
      case '"': value += '"'; return;
      case 'a': value += '\a'; return;
      case 'b': value += '\b'; return;
      case 'f': value += '\f'; return;
      case 'v': value += '\v'; return;
      case '\n': return;  // line continuation
      case 'x': return append_utf8(value, read_hex(2, at));
      case 'u': return append_utf8(value, read_hex(4, at));
      case 'U': return append_utf8(value, read_hex(8, at));
      default: break;
    }
    if (c >= '0' && c <= '7') {
      uint32_t cp = uint32_t(c - '0');
      for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k)
        cp = cp * 8 + uint32_t(src_[pos_++] - '0');
      return append_utf8(value, cp);
    }
    value += '\\';
    value += c;
  }

  void track_bracket(char c) {
    if (c == '(' || c == '[' || c == '{') brackets_.push_back(pos_);
    if (c != ')' && c != ']' && c != '}') return;
    char open = c == ')' ? '(' : c == ']' ? '[' : '{';
    if (brackets_.empty() || src_[brackets_.back()] != open)
      fail_at(pos_at(pos_), "unexpected '", c, "'",
              brackets_.empty() ? std::string() : std::string(" ('") + src_[brackets_.back()] + "' is open)");
    brackets_.pop_back();
  }

  uint32_t read_hex(int digits, size_t at) {
    uint32_t cp = 0;
    for (int k = 0; k < digits; ++k) {
      if (pos_ >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[pos_])))
        fail_at(pos_at(at), "invalid \\", src_[at + 1], " escape in string literal");
      char h = char(std::tolower(static_cast<unsigned char>(src_[pos_++])));
      cp = cp * 16 + uint32_t(is_digit(h) ? h - '0' : h - 'a' + 10);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      fail_at(pos_at(at), "invalid code point in \\", src_[at + 1], " escape");
    return cp;
  }

  void lex_operator() {
    static const char* const kTwoChar[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (const char* op : kTwoChar) {
      if (src_.compare(pos_, 2, op) == 0) {
        add(TokenKind::Operator, op, pos_);
        pos_ += 2;
        return;
      }
    }
    char c = src_[pos_];
    if (std::string_view("+-*/%<>=()[]{}.,:|~").find(c) == std::string_view::npos)
      fail_at(pos_at(pos_), "unexpected character '", c, "' in tag");
    track_bracket(c);
    add(TokenKind::Operator, std::string(1, c), pos_);
    ++pos_;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace qspec::jinja
