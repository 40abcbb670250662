// qspec::Error: the one exception type thrown at API boundaries. The message names the
// file, tensor or field at fault so a user can act on it.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace qspec {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

// Throws qspec::Error with the streamed parts concatenated: fail("tensor ", name, ": bad shape").
template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(detail::concat(std::forward<Parts>(parts)...));
}

}  // namespace qspec

// QSPEC_CHECK(cond, parts...): throw qspec::Error(parts...) unless cond holds.
#define QSPEC_CHECK(cond, ...)                  \
  do {                                          \
    if (!(cond)) ::qspec::fail(__VA_ARGS__);    \
  } while (0)
