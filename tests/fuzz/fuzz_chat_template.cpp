// libFuzzer target for the chat template renderer: parses the input as a template and, when
// it parses, renders it on a small conversation. Any failure must be a qspec::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "qspec/error.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    qspec::ChatTemplate t = qspec::ChatTemplate::parse(source);
    t.render({{"system", "sys"}, {"user", " hi "}, {"assistant", "yo"}}, true,
             {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"n", 3}, {"d", {{"k", {1, 2}}}}});
  } catch (const qspec::Error&) {
  }
  return 0;
}
