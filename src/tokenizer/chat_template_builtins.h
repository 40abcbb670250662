// Built-in filters, tests, methods and functions of the chat template language, shared by
// the parser (which checks names) and the evaluator (which calls them).
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template_impl.h"

namespace qspec::jinja {

// range() and loops refuse to produce more items than this.
constexpr size_t kMaxRange = 1'000'000;

// Evaluated call arguments: f(positional..., name=value...).
struct Args {
  List positional;
  Map keyword;
  SourcePos pos;
  std::string what;  // "filter 'trim'" etc., for error messages

  // The argument at position `index`, else the keyword `name`, else null / fallback.
  const Value* find(size_t index, std::string_view name) const;
  Value get(size_t index, std::string_view name, Value fallback = Value::undefined()) const;
  std::string string_arg(size_t index, std::string_view name, std::string fallback) const;
  int64_t int_arg(size_t index, std::string_view name, int64_t fallback) const;
  // Errors unless there are at most max_positional positional arguments and every keyword
  // argument is one of `names`.
  void expect(size_t max_positional, std::initializer_list<std::string_view> names) const;
};

// for-loop iteration: lists, dict keys, string characters; undefined is empty.
List iterate(const Value& v, SourcePos pos);

std::vector<std::string_view> function_names();

// The name must be known (is_known_*): the parser has checked it.
Value apply_filter(const std::string& name, const Value& operand, const Args& args);
bool apply_test(const std::string& name, const Value& operand, const Args& args);
Value call_function(const std::string& name, const Args& args);
Value call_method(const Value& receiver, const std::string& name, const Args& args);

}  // namespace qspec::jinja
