// Decoders of a tokenizer.json, as a chain of per-token steps plus a sequence-level strip.
// Outputs are raw bytes: byte-level and byte-fallback tokens may leave incomplete UTF-8, which
// decode() returns as is (HF replaces it with U+FFFD; StreamDecoder::flush does that).
#include "qspec/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace qspec::tok {

namespace {

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  if (from.empty() || text.find(from) == std::string::npos) return;
  std::string out;
  size_t last = 0, pos;
  while ((pos = text.find(from, last)) != std::string::npos) {
    out.append(text, last, pos - last);
    out += to;
    last = pos + from.size();
  }
  out.append(text, last);
  text = std::move(out);
}

class ByteLevelDecoder : public TokenDecoder {
 public:
  void apply(std::string& token, size_t) const override {
    std::string bytes;
    bytes.reserve(token.size());
    size_t pos = 0;
    uint32_t cp;
    while (pos < token.size()) {
      int byte = -1;
      if (utf8_next(token, pos, cp)) byte = code_point_to_byte(cp);
      if (byte < 0) return;  // not byte-level text (e.g. an added token with a space): keep as is
      bytes.push_back(static_cast<char>(byte));
    }
    token = std::move(bytes);
  }
};

class ReplaceDecoder : public TokenDecoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void apply(std::string& token, size_t) const override { replace_all(token, from_, to_); }

 private:
  std::string from_, to_;
};

class ByteFallbackDecoder : public TokenDecoder {
 public:
  void apply(std::string& token, size_t) const override {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return;
    const auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = hex(token[3]), lo = hex(token[4]);
    if (hi < 0 || lo < 0) return;
    token.assign(1, static_cast<char>(hi * 16 + lo));
  }
};

class StripDecoder : public TokenDecoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::string& token, size_t) const override {
    size_t begin = 0, end = token.size();
    for (size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0; ++i)
      begin += content_.size();
    for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                       token.compare(end - content_.size(), content_.size(), content_) == 0;
         ++i)
      end -= content_.size();
    token = token.substr(begin, end - begin);
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// HF Metaspace decoder: the replacement becomes ' ', except in the first token, where (with a
// prepend scheme other than never) every replacement character is dropped.
class MetaspaceDecoder : public TokenDecoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void apply(std::string& token, size_t index) const override {
    replace_all(token, replacement_, index == 0 && strip_first_ ? "" : " ");
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

std::string type_of(const json& spec) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    return "<missing type>";
  return spec["type"].get<std::string>();
}

void add_decoder(const json& spec, const std::string& file, DecoderChain& chain, bool& fused) {
  const std::string type = type_of(spec);
  if (type == "Sequence") {
    for (const json& part : spec.at("decoders")) add_decoder(part, file, chain, fused);
    return;
  }
  if (type == "Fuse") {
    fused = true;
    return;
  }
  if (type == "Strip") {
    std::string content = spec.value("content", std::string(" "));
    const size_t start = spec.value("start", size_t{0}), stop = spec.value("stop", size_t{0});
    if (fused) {
      if (!chain.strip_content.empty() && (chain.strip_start || chain.strip_stop))
        fail("tokenizer ", file, ": unsupported decoder: two Strip steps after Fuse");
      chain.strip_content = content;
      chain.strip_start = start;
      chain.strip_stop = stop;
    } else {
      chain.per_token.push_back(std::make_unique<StripDecoder>(content, start, stop));
    }
    return;
  }
  if (fused)
    fail("tokenizer ", file, ": unsupported decoder: ", type, " after Fuse (only Strip is)");
  if (type == "ByteLevel") {
    chain.per_token.push_back(std::make_unique<ByteLevelDecoder>());
  } else if (type == "ByteFallback") {
    chain.per_token.push_back(std::make_unique<ByteFallbackDecoder>());
  } else if (type == "Replace") {
    const json& pattern = spec.at("pattern");
    if (!pattern.contains("String"))
      fail("tokenizer ", file, ": unsupported decoder: Replace with a Regex pattern");
    chain.per_token.push_back(std::make_unique<ReplaceDecoder>(
        pattern["String"].get<std::string>(), spec.at("content").get<std::string>()));
  } else if (type == "Metaspace") {
    bool strip_first = true;
    if (spec.contains("prepend_scheme") && spec["prepend_scheme"].is_string())
      strip_first = spec["prepend_scheme"].get<std::string>() != "never";
    else
      strip_first = spec.value("add_prefix_space", true);
    const std::string replacement =
        spec.contains("replacement") ? spec["replacement"].get<std::string>() : "\xE2\x96\x81";
    chain.per_token.push_back(std::make_unique<MetaspaceDecoder>(replacement, strip_first));
  } else {
    fail("tokenizer ", file, ": unsupported decoder type '", type, "'");
  }
}

}  // namespace

DecoderChain make_decoder(const json& spec, const std::string& file) {
  DecoderChain chain;
  if (spec.is_null()) {
    chain.join_with_space = true;
    return chain;
  }
  bool fused = false;
  add_decoder(spec, file, chain, fused);
  return chain;
}

}  // namespace qspec::tok
