// The chat template Value type: conversion from JSON, truthiness, equality, and the
// Python-style str()/repr()/json.dumps() text forms.
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/chat_template_impl.h"

namespace qspec::jinja {

namespace {

template <typename Json>
Value value_from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
    }
    case Json::value_t::number_float: return Value::number(j.template get<double>());
    case Json::value_t::string: return Value::string(j.template get<std::string>());
    case Json::value_t::array: {
      List items;
      for (const auto& item : j) items.push_back(value_from_json(item));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      Map entries;
      for (const auto& [key, item] : j.items()) entries.emplace_back(key, value_from_json(item));
      return Value::map(std::move(entries));
    }
    default: return Value::undefined();  // binary / discarded: not produced by JSON text
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool() || is_int()) return as_int() != 0;
  if (is_double()) return as_double() != 0.0;
  if (is_string()) return !str().empty();
  if (is_list()) return !items().empty();
  if (is_map()) return !entries().empty();
  return true;  // namespaces and functions
}

std::string Value::type_name() const {
  static const char* const kNames[] = {"undefined", "none", "bool", "int", "float", "string",
                                       "list", "dict", "namespace", "function"};
  return kNames[data.index()];
}

const Value* find_entry(const Map& map, std::string_view key) {
  for (const auto& [k, v] : map)
    if (k == key) return &v;
  return nullptr;
}

void set_entry(Map& map, const std::string& key, Value value) {
  for (auto& [k, v] : map) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  map.emplace_back(key, std::move(value));
}

namespace {

bool maps_equal(const Map& a, const Map& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, value] : a) {
    const Value* other = find_entry(b, key);
    if (!other || !values_equal(value, *other)) return false;
  }
  return true;
}

bool lists_equal(const List& a, const List& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!values_equal(a[i], b[i])) return false;
  return true;
}

}  // namespace

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_double() || b.is_double()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.data.index() != b.data.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (a.is_list()) return lists_equal(a.items(), b.items());
  if (a.is_map()) return maps_equal(a.entries(), b.entries());
  if (a.is_namespace()) return &a.ns_attributes() == &b.ns_attributes();
  return std::get<Function>(a.data).name == std::get<Function>(b.data).name;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, result.ptr);  // shortest round-trip digits: "-1.2345e+02"
  std::string sign = sci[0] == '-' ? "-" : "";
  size_t e = sci.find('e');
  std::string digits;
  for (size_t i = sign.size(); i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exponent = std::stoi(sci.substr(e + 1));
  if (exponent < -4 || exponent >= 16) {  // Python's repr switches to exponent form here
    std::string out = sign;
    out += digits[0];
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char exp_text[16];
    std::snprintf(exp_text, sizeof exp_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_text;
  }
  std::string out = sign;
  if (exponent < 0) return out.append("0.").append(size_t(-exponent - 1), '0').append(digits);
  size_t whole = size_t(exponent) + 1;
  if (digits.size() < whole) digits.append(whole - digits.size(), '0');
  out.append(digits, 0, whole).append(".");
  return digits.size() > whole ? out.append(digits, whole) : out.append("0");
}

namespace {

std::string python_string_repr(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += char(c);
    }
  }
  return out + quote;
}

std::string join_reprs(const List& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i].repr();
  return out + "]";
}

std::string map_repr(const Map& entries) {
  std::string out = "{";
  for (size_t i = 0; i < entries.size(); ++i)
    out += (i ? ", " : "") + python_string_repr(entries[i].first) + ": " + entries[i].second.repr();
  return out + "}";
}

}  // namespace

std::string Value::to_string() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return std::get<bool>(data) ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_double()) return python_float_repr(as_double());
  if (is_string()) return str();
  if (is_list()) return join_reprs(items());
  if (is_map()) return map_repr(entries());
  if (is_namespace()) return "<Namespace " + map_repr(ns_attributes()) + ">";
  return "<built-in function " + std::get<Function>(data).name + ">";
}

std::string Value::repr() const {
  return is_string() ? python_string_repr(str()) : to_string();
}

// ---- JSON text ----

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

std::string json_number(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return python_float_repr(d);
}

void write_json(const Value& value, int indent, int level, std::string& out);

// Writes "[...]"/"{...}" around count items, write_item(i) writing each one.
template <typename WriteItem>
void write_container(char open, char close, size_t count, int indent, int level, std::string& out,
                     WriteItem write_item) {
  out += open;
  if (count == 0) {
    out += close;
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) out += indent < 0 ? ", " : ",";
    if (indent >= 0) out.append(1, '\n').append(size_t(indent) * size_t(level + 1), ' ');
    write_item(i);
  }
  if (indent >= 0) out.append(1, '\n').append(size_t(indent) * size_t(level), ' ');
  out += close;
}

void write_json(const Value& value, int indent, int level, std::string& out) {
  if (value.is_undefined()) fail("tojson: value is undefined", value.undefined_name().empty() ? "" : ": ",
                                 value.undefined_name());
  if (value.is_none()) {
    out += "null";
  } else if (value.is_bool()) {
    out += std::get<bool>(value.data) ? "true" : "false";
  } else if (value.is_int()) {
    out += std::to_string(value.as_int());
  } else if (value.is_double()) {
    out += json_number(value.as_double());
  } else if (value.is_string()) {
    out += json_string(value.str());
  } else if (value.is_list()) {
    const List& items = value.items();
    write_container('[', ']', items.size(), indent, level, out,
                    [&](size_t i) { write_json(items[i], indent, level + 1, out); });
  } else if (value.is_map()) {
    const Map& entries = value.entries();
    write_container('{', '}', entries.size(), indent, level, out, [&](size_t i) {
      out += json_string(entries[i].first) + ": ";
      write_json(entries[i].second, indent, level + 1, out);
    });
  } else {
    fail("tojson: a ", value.type_name(), " is not JSON serializable");
  }
}

}  // namespace

std::string to_json_text(const Value& value, int indent) {
  std::string out;
  write_json(value, indent, 0, out);
  return out;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + len > s.size()) len = 1;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) len = 1;
    chars.push_back(s.substr(i, len));
    i += len;
  }
  return chars;
}

}  // namespace qspec::jinja
