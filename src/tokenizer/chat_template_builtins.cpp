// Built-ins of the chat template language: filters (`x | trim`), tests (`x is defined`),
// methods (`s.strip()`, `d.get('k')`) and global functions (`raise_exception(...)`,
// `strftime_now(...)`, `namespace(...)`, `range(...)`).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>

#include "tokenizer/chat_template_builtins.h"

namespace qspec::jinja {

// ---- arguments ----

const Value* Args::find(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : keyword)
    if (key == name) return &value;
  return nullptr;
}

Value Args::get(size_t index, std::string_view name, Value fallback) const {
  const Value* v = find(index, name);
  return v ? *v : std::move(fallback);
}

void Args::expect(size_t max_positional, std::initializer_list<std::string_view> names) const {
  if (positional.size() > max_positional)
    fail_at(pos, what, " takes at most ", max_positional, " argument", max_positional == 1 ? "" : "s", ", got ",
            positional.size());
  for (const auto& [key, value] : keyword)
    if (std::find(names.begin(), names.end(), key) == names.end())
      fail_at(pos, what, " has no argument named '", key, "'");
}

std::string Args::string_arg(size_t index, std::string_view name, std::string fallback) const {
  const Value* v = find(index, name);
  if (!v || v->is_none() || v->is_undefined()) return fallback;
  if (!v->is_string()) fail_at(pos, what, ": argument '", name, "' must be a string, got ", v->type_name());
  return v->str();
}

int64_t Args::int_arg(size_t index, std::string_view name, int64_t fallback) const {
  const Value* v = find(index, name);
  if (!v || v->is_none() || v->is_undefined()) return fallback;
  if (!v->is_int() && !v->is_bool()) fail_at(pos, what, ": argument '", name, "' must be an integer, got ", v->type_name());
  return v->as_int();
}

// ---- string helpers ----

namespace {

constexpr std::string_view kWhitespace = " \t\n\r\v\f";

std::string strip(const std::string& s, std::string_view chars, bool left, bool right) {
  size_t begin = left ? s.find_first_not_of(chars) : 0;
  if (begin == std::string::npos) return "";
  size_t end = right ? s.find_last_not_of(chars) + 1 : s.size();
  return s.substr(begin, end - begin);
}

std::string map_chars(std::string s, int (*f)(int)) {
  for (char& c : s) c = char(f(static_cast<unsigned char>(c)));
  return s;
}

std::string capitalize(const std::string& s) {
  std::string out = map_chars(s, ::tolower);
  if (!out.empty()) out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    bool alpha = std::isalpha(static_cast<unsigned char>(c));
    c = char(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    start = !alpha;
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python puts `to` before every character and at the end
    int64_t n = 0;
    for (const auto& c : utf8_chars(s)) out += (count < 0 || n++ < count ? to : "") + c;
    return out + (count < 0 || n < count ? to : "");
  }
  size_t at = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t hit = s.find(from, at);
    if (hit == std::string::npos) break;
    out += s.substr(at, hit - at) + to;
    at = hit + from.size();
  }
  return out + s.substr(at);
}

// Python str.split: no separator splits on whitespace runs and drops empty parts.
List split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  List parts;
  if (sep) {
    if (sep->empty()) fail("split(): empty separator");
    size_t at = 0;
    size_t hit = s.find(*sep);
    while (hit != std::string::npos && (maxsplit < 0 || int64_t(parts.size()) < maxsplit)) {
      parts.push_back(Value::string(s.substr(at, hit - at)));
      at = hit + sep->size();
      hit = s.find(*sep, at);
    }
    parts.push_back(Value::string(s.substr(at)));
    return parts;
  }
  size_t at = s.find_first_not_of(kWhitespace);
  while (at != std::string::npos) {
    if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
      parts.push_back(Value::string(strip(s.substr(at), kWhitespace, false, true)));
      break;
    }
    size_t end = std::min(s.find_first_of(kWhitespace, at), s.size());
    parts.push_back(Value::string(s.substr(at, end - at)));
    at = s.find_first_not_of(kWhitespace, end);
  }
  return parts;
}

bool affix_matches(const Value& affix, const std::string& s, bool prefix, const Args& args) {
  if (affix.is_list()) {
    return std::any_of(affix.items().begin(), affix.items().end(),
                       [&](const Value& a) { return affix_matches(a, s, prefix, args); });
  }
  if (!affix.is_string()) fail_at(args.pos, args.what, ": expected a string, got ", affix.type_name());
  return prefix ? s.starts_with(affix.str()) : s.ends_with(affix.str());
}

}  // namespace

// ---- iteration and sizes ----

List iterate(const Value& v, SourcePos pos) {
  if (v.is_list()) return v.items();
  if (v.is_undefined()) return {};
  if (v.is_map()) {
    List keys;
    for (const auto& entry : v.entries()) keys.push_back(Value::string(entry.first));
    return keys;
  }
  if (v.is_string()) {
    List chars;
    for (auto& c : utf8_chars(v.str())) chars.push_back(Value::string(std::move(c)));
    return chars;
  }
  fail_at(pos, "cannot iterate over a ", v.type_name());
}

namespace {

int64_t length_of(const Value& v, SourcePos pos) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return int64_t(utf8_chars(v.str()).size());
  if (v.is_list()) return int64_t(v.items().size());
  if (v.is_map()) return int64_t(v.entries().size());
  fail_at(pos, "a ", v.type_name(), " has no length");
}

List map_items(const Value& v, SourcePos pos) {
  if (v.is_undefined()) return {};
  if (!v.is_map()) fail_at(pos, "items: expected a dict, got ", v.type_name());
  List items;
  for (const auto& [key, value] : v.entries()) items.push_back(Value::list({Value::string(key), value}));
  return items;
}

Value first_or_last(const Value& v, bool first, SourcePos pos) {
  List items = iterate(v, pos);
  if (items.empty()) return Value::undefined();
  return first ? items.front() : items.back();
}

Value to_int(const Value& v, const Args& args) {
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_double()) return Value::integer(int64_t(v.as_double()));
  if (v.is_string()) {
    std::string s = strip(v.str(), kWhitespace, true, true);
    char* end = nullptr;
    long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::integer(i);
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::integer(int64_t(d));
  }
  return Value::integer(args.int_arg(0, "default", 0));
}

// ---- filters ----

using FilterFn = Value (*)(const Value&, const Args&);

Value filter_trim(const Value& v, const Args& a) {
  a.expect(1, {"chars"});
  return Value::string(strip(v.to_string(), a.string_arg(0, "chars", std::string(kWhitespace)), true, true));
}

Value filter_default(const Value& v, const Args& a) {
  a.expect(2, {"default_value", "boolean"});
  bool use_default = v.is_undefined() || (a.get(1, "boolean", Value::boolean(false)).truthy() && !v.truthy());
  return use_default ? a.get(0, "default_value", Value::string("")) : v;
}

Value filter_join(const Value& v, const Args& a) {
  a.expect(1, {"d"});
  std::string sep = a.string_arg(0, "d", ""), out;
  List items = iterate(v, a.pos);
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i].to_string();
  return Value::string(out);
}

Value filter_tojson(const Value& v, const Args& a) {
  a.expect(1, {"indent", "ensure_ascii", "separators", "sort_keys"});
  return Value::string(to_json_text(v, int(a.int_arg(0, "indent", -1))));
}

Value filter_replace(const Value& v, const Args& a) {
  a.expect(3, {"old", "new", "count"});
  return Value::string(replace_all(v.to_string(), a.string_arg(0, "old", ""), a.string_arg(1, "new", ""),
                                   a.int_arg(2, "count", -1)));
}

template <std::string (*F)(const std::string&)>
Value string_filter(const Value& v, const Args& a) {
  a.expect(0, {});
  return Value::string(F(v.to_string()));
}

std::string upper(const std::string& s) { return map_chars(s, ::toupper); }
std::string lower(const std::string& s) { return map_chars(s, ::tolower); }
std::string identity(const std::string& s) { return s; }

const std::pair<std::string_view, FilterFn> kFilters[] = {
    {"trim", filter_trim},
    {"length", [](const Value& v, const Args& a) { a.expect(0, {}); return Value::integer(length_of(v, a.pos)); }},
    {"count", [](const Value& v, const Args& a) { a.expect(0, {}); return Value::integer(length_of(v, a.pos)); }},
    {"upper", string_filter<upper>},
    {"lower", string_filter<lower>},
    {"capitalize", string_filter<capitalize>},
    {"title", string_filter<title>},
    {"string", string_filter<identity>},
    {"tojson", filter_tojson},
    {"default", filter_default},
    {"d", filter_default},
    {"join", filter_join},
    {"replace", filter_replace},
    {"first", [](const Value& v, const Args& a) { a.expect(0, {}); return first_or_last(v, true, a.pos); }},
    {"last", [](const Value& v, const Args& a) { a.expect(0, {}); return first_or_last(v, false, a.pos); }},
    {"list", [](const Value& v, const Args& a) { a.expect(0, {}); return Value::list(iterate(v, a.pos)); }},
    {"items", [](const Value& v, const Args& a) { a.expect(0, {}); return Value::list(map_items(v, a.pos)); }},
    {"int", [](const Value& v, const Args& a) { a.expect(1, {"default"}); return to_int(v, a); }},
    {"safe", [](const Value& v, const Args& a) { a.expect(0, {}); return v; }},
};

// ---- tests ----

using TestFn = bool (*)(const Value&, const Args&);

bool test_parity(const Value& v, const Args& a, int64_t remainder) {
  a.expect(0, {});
  if (!v.is_int() && !v.is_bool()) fail_at(a.pos, a.what, ": expected an integer, got ", v.type_name());
  return ((v.as_int() % 2) + 2) % 2 == remainder;
}

bool test_divisibleby(const Value& v, const Args& a) {
  a.expect(1, {"num"});
  int64_t n = a.int_arg(0, "num", 0);
  if (n == 0 || (!v.is_int() && !v.is_bool())) fail_at(a.pos, a.what, ": needs an integer and a nonzero divisor");
  return v.as_int() % n == 0;
}

bool test_string_case(const Value& v, const Args& a, std::string (*f)(const std::string&)) {
  a.expect(0, {});
  return v.is_string() && f(v.str()) == v.str();
}

#define QSPEC_TYPE_TEST(name, expr) \
  {name, [](const Value& v, const Args& a) { a.expect(0, {}); return bool(expr); }}

const std::pair<std::string_view, TestFn> kTests[] = {
    QSPEC_TYPE_TEST("defined", !v.is_undefined()),
    QSPEC_TYPE_TEST("undefined", v.is_undefined()),
    QSPEC_TYPE_TEST("none", v.is_none()),
    QSPEC_TYPE_TEST("string", v.is_string()),
    QSPEC_TYPE_TEST("number", v.is_number()),
    QSPEC_TYPE_TEST("integer", v.is_int()),
    QSPEC_TYPE_TEST("float", v.is_double()),
    QSPEC_TYPE_TEST("boolean", v.is_bool()),
    QSPEC_TYPE_TEST("true", v.is_bool() && v.as_int()),
    QSPEC_TYPE_TEST("false", v.is_bool() && !v.as_int()),
    QSPEC_TYPE_TEST("mapping", v.is_map()),
    QSPEC_TYPE_TEST("sequence", v.is_list() || v.is_string() || v.is_map()),
    QSPEC_TYPE_TEST("iterable", v.is_list() || v.is_string() || v.is_map()),
    QSPEC_TYPE_TEST("callable", v.is_function()),
    {"even", [](const Value& v, const Args& a) { return test_parity(v, a, 0); }},
    {"odd", [](const Value& v, const Args& a) { return test_parity(v, a, 1); }},
    {"divisibleby", test_divisibleby},
    {"lower", [](const Value& v, const Args& a) { return test_string_case(v, a, lower); }},
    {"upper", [](const Value& v, const Args& a) { return test_string_case(v, a, upper); }},
    {"eq", [](const Value& v, const Args& a) { a.expect(1, {}); return values_equal(v, a.get(0, "")); }},
    {"equalto", [](const Value& v, const Args& a) { a.expect(1, {}); return values_equal(v, a.get(0, "")); }},
    {"ne", [](const Value& v, const Args& a) { a.expect(1, {}); return !values_equal(v, a.get(0, "")); }},
};

#undef QSPEC_TYPE_TEST

// ---- methods ----

Value string_method(const std::string& s, const std::string& name, const Args& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    a.expect(1, {});
    std::string chars = a.string_arg(0, "chars", std::string(kWhitespace));
    return Value::string(strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    a.expect(1, {});
    return Value::boolean(affix_matches(a.get(0, ""), s, name == "startswith", a));
  }
  if (name == "split") {
    a.expect(2, {"sep", "maxsplit"});
    const Value* sep = a.find(0, "sep");
    bool has_sep = sep && !sep->is_none();
    std::string sep_text = has_sep ? a.string_arg(0, "sep", "") : "";
    return Value::list(split(s, has_sep ? &sep_text : nullptr, a.int_arg(1, "maxsplit", -1)));
  }
  if (name == "replace") return filter_replace(Value::string(s), a);
  if (name == "join") return filter_join(a.get(0, "iterable"), Args{{Value::string(s)}, {}, a.pos, a.what});
  static const std::pair<std::string_view, std::string (*)(const std::string&)> kCase[] = {
      {"upper", upper}, {"lower", lower}, {"capitalize", capitalize}, {"title", title}};
  for (const auto& [method, f] : kCase) {
    if (name == method) {
      a.expect(0, {});
      return Value::string(f(s));
    }
  }
  fail_at(a.pos, "a string has no method '", name, "'");
}

Value map_method(const Map& m, const Value& self, const std::string& name, const Args& a) {
  if (name == "get") {
    a.expect(2, {});
    Value key = a.get(0, "");
    const Value* found = key.is_string() ? find_entry(m, key.str()) : nullptr;
    return found ? *found : a.get(1, "", Value::none());
  }
  a.expect(0, {});
  if (name == "items") return Value::list(map_items(self, a.pos));
  List out;
  for (const auto& [key, value] : m) out.push_back(name == "keys" ? Value::string(key) : value);
  if (name == "keys" || name == "values") return Value::list(std::move(out));
  fail_at(a.pos, "a dict has no method '", name, "'");
}

constexpr std::string_view kMethods[] = {"strip", "lstrip",  "rstrip", "startswith", "endswith",
                                         "split", "replace", "join",   "upper",      "lower",
                                         "capitalize", "title", "get", "items",      "keys",
                                         "values"};

// ---- functions ----

Value fn_raise_exception(const Args& a) {
  a.expect(1, {});
  fail_at(a.pos, "raise_exception: ", a.get(0, "").to_string());
}

Value fn_strftime_now(const Args& a) {
  a.expect(1, {});
  std::string format = a.string_arg(0, "format", "");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
  if (n == 0 && !format.empty()) fail_at(a.pos, "strftime_now: cannot format '", format, "'");
  return Value::string(std::string(buf, n));
}

Value fn_namespace(const Args& a) {  // any keyword arguments
  if (a.positional.size() > 1) fail_at(a.pos, "namespace() takes at most 1 positional argument");
  auto attributes = std::make_shared<Map>();
  if (!a.positional.empty()) {
    if (!a.positional[0].is_map()) fail_at(a.pos, "namespace(): the positional argument must be a dict");
    *attributes = a.positional[0].entries();
  }
  for (const auto& [key, value] : a.keyword) set_entry(*attributes, key, value);
  return {Namespace{attributes}};
}

Value fn_range(const Args& a) {
  a.expect(3, {});
  if (a.positional.empty()) fail_at(a.pos, "range() needs at least one argument");
  bool one = a.positional.size() == 1;
  int64_t start = one ? 0 : a.int_arg(0, "start", 0);
  int64_t stop = a.int_arg(one ? 0 : 1, "stop", 0);
  int64_t step = a.int_arg(2, "step", 1);
  if (step == 0) fail_at(a.pos, "range(): step must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= kMaxRange) fail_at(a.pos, "range(): more than ", kMaxRange, " items");
    out.push_back(Value::integer(i));
  }
  return Value::list(std::move(out));
}

const std::pair<std::string_view, Value (*)(const Args&)> kFunctions[] = {
    {"raise_exception", fn_raise_exception},
    {"strftime_now", fn_strftime_now},
    {"namespace", fn_namespace},
    {"range", fn_range},
};

template <typename Table>
auto lookup(const Table& table, std::string_view name) -> decltype(std::begin(table)) {
  return std::find_if(std::begin(table), std::end(table), [&](const auto& entry) { return entry.first == name; });
}

}  // namespace

bool is_known_filter(std::string_view name) { return lookup(kFilters, name) != std::end(kFilters); }
bool is_known_test(std::string_view name) { return lookup(kTests, name) != std::end(kTests); }
bool is_known_function(std::string_view name) { return lookup(kFunctions, name) != std::end(kFunctions); }
bool is_known_method(std::string_view name) {
  return std::find(std::begin(kMethods), std::end(kMethods), name) != std::end(kMethods);
}

std::vector<std::string_view> function_names() {
  std::vector<std::string_view> names;
  for (const auto& entry : kFunctions) names.push_back(entry.first);
  return names;
}

Value apply_filter(const std::string& name, const Value& operand, const Args& args) {
  return lookup(kFilters, name)->second(operand, args);
}

bool apply_test(const std::string& name, const Value& operand, const Args& args) {
  return lookup(kTests, name)->second(operand, args);
}

Value call_function(const std::string& name, const Args& args) { return lookup(kFunctions, name)->second(args); }

Value call_method(const Value& receiver, const std::string& name, const Args& args) {
  if (receiver.is_string()) return string_method(receiver.str(), name, args);
  if (receiver.is_map()) return map_method(receiver.entries(), receiver, name, args);
  fail_at(args.pos, "a ", receiver.type_name(), " has no method '", name, "'");
}

}  // namespace qspec::jinja
