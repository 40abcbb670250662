// Environment switches (base/env.h).
#include "base/env.h"

#include <cstdlib>
#include <string>

#include "qspec/error.h"

namespace qspec {

std::optional<bool> env_switch(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string value(text);
  QSPEC_CHECK(value == "0" || value == "1", name, ": '", value, "' is not 0 or 1");
  return value == "1";
}

}  // namespace qspec
