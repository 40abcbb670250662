// PCRE2 regex wrapper, normalizers and pre-tokenizers of a tokenizer.json.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "qspec/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace qspec::tok {

// ---------------------------------------------------------------- regex
Regex::Regex(const std::string& pattern, const std::string& where) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail(where, ": cannot compile regex '", pattern, "' at offset ", error_offset, ": ",
         reinterpret_cast<const char*>(message));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  struct MatchData {
    pcre2_match_data* data;
    MatchData() : data(pcre2_match_data_create(4, nullptr)) {}
    ~MatchData() { pcre2_match_data_free(data); }
  };
  thread_local MatchData match;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  // The text is valid UTF-8 (encode sanitises it first): skip PCRE2's check, which is
  // otherwise repeated on the whole subject at every call.
  while (offset <= text.size()) {
    const int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                                          match.data, nullptr)
                        : pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                                      match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer: regex match failed (PCRE2 error ", rc, ")");
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      offset = end;
    } else {
      // Empty match: step over one character.
      if (offset >= text.size()) break;
      size_t next = offset;
      uint32_t cp;
      if (!utf8_next(text, next, cp)) next = offset + 1;
      offset = next;
    }
  }
}

namespace {

std::string type_of(const json& spec) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    return "<missing type>";
  return spec["type"].get<std::string>();
}

std::string pattern_of(const json& spec, const std::string& what, bool& is_regex) {
  const json& pattern = spec.at("pattern");
  if (pattern.contains("String")) {
    is_regex = false;
    return pattern["String"].get<std::string>();
  }
  if (pattern.contains("Regex")) {
    is_regex = true;
    return pattern["Regex"].get<std::string>();
  }
  fail(what, ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

// Splits by a literal or regex: (begin, end, is_match) over the whole text.
class Matcher {
 public:
  Matcher(std::string pattern, bool is_regex, const std::string& where) : literal_(pattern) {
    if (is_regex) regex_ = std::make_unique<Regex>(pattern, where);
  }
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
    if (regex_) return regex_->find_all(text, out);
    if (literal_.empty()) return;
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      out.emplace_back(pos, pos + literal_.size());
      pos += literal_.size();
    }
  }
  void replace_all(std::string& text, const std::string& content) const {
    std::vector<std::pair<size_t, size_t>> matches;
    find_all(text, matches);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text.size());
    size_t last = 0;
    for (auto [begin, end] : matches) {
      out.append(text, last, begin - last);
      out += content;
      last = end;
    }
    out.append(text, last);
    text = std::move(out);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// A "Sequence" normalizer (Input: the text) or pre-tokenizer (Input: the pieces): its parts in
// order, each applied to what the one before left.
template <class Part, class Input>
class Sequence : public Part {
 public:
  std::vector<std::unique_ptr<Part>> parts;
  void apply(Input& input) const override {
    for (const auto& part : parts) part->apply(input);
  }
};

// A "Sequence" spec: `make` (make_normalizer or make_pre_tokenizer) on each entry of its array
// `key`, dropping the entries it makes nothing of (null).
template <class Part, class Input>
std::unique_ptr<Part> make_sequence(const json& spec, const char* key, const std::string& file,
                                    std::unique_ptr<Part> (*make)(const json&, const std::string&)) {
  auto sequence = std::make_unique<Sequence<Part, Input>>();
  for (const json& entry : spec.at(key))
    if (auto part = make(entry, file)) sequence->parts.push_back(std::move(part));
  return sequence;
}

// ---------------------------------------------------------------- normalizers

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void apply(std::string& text) const override {
    if (!text.empty()) text = prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const json& spec, const std::string& file) {
    bool is_regex = false;
    std::string pattern = pattern_of(spec, file + ": Replace normalizer", is_regex);
    matcher_ = std::make_unique<Matcher>(pattern, is_regex, file + ": Replace normalizer");
    content_ = spec.at("content").get<std::string>();
  }
  void apply(std::string& text) const override { matcher_->replace_all(text, content_); }

 private:
  std::unique_ptr<Matcher> matcher_;
  std::string content_;
};

// NFC: only text that is already in NFC (by the Unicode quick check) is accepted unchanged;
// anything needing composition or reordering is refused rather than tokenized wrongly.
class NfcNormalizer : public Normalizer {
 public:
  explicit NfcNormalizer(std::string file) : file_(std::move(file)) {}
  void apply(std::string& text) const override {
    if (!is_nfc_quick(text))
      fail("tokenizer ", file_,
           ": the NFC normalizer is only implemented for text already in NFC, and this text "
           "has decomposed or non-canonically ordered characters; normalize the text to NFC "
           "first");
  }

 private:
  std::string file_;
};

// ---------------------------------------------------------------- pre-tokenizers
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior behavior_of(const std::string& name, const std::string& file) {
  if (name == "Removed") return Behavior::Removed;
  if (name == "Isolated") return Behavior::Isolated;
  if (name == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::MergedWithNext;
  if (name == "Contiguous") return Behavior::Contiguous;
  fail("tokenizer ", file, ": unsupported Split behavior '", name, "'");
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Applies a split behaviour to (sorted, non-overlapping) matches over `text`, as HF does.
void split_piece(const Piece& piece, const Matcher& matcher, Behavior behavior, bool invert,
                 std::vector<Piece>& out) {
  const std::string& text = piece.text;
  std::vector<std::pair<size_t, size_t>> matches;
  matcher.find_all(text, matches);
  std::vector<Span> spans;
  size_t last = 0;
  for (auto [begin, end] : matches) {
    if (begin > last) spans.push_back({last, begin, invert});
    spans.push_back({begin, end, !invert});
    last = end;
  }
  if (last < text.size()) spans.push_back({last, text.size(), invert});

  std::vector<std::pair<size_t, size_t>> kept;
  switch (behavior) {
    case Behavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) kept.emplace_back(s.begin, s.end);
      break;
    case Behavior::Isolated:
      for (const Span& s : spans) kept.emplace_back(s.begin, s.end);
      break;
    case Behavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty())
          kept.back().second = s.end;
        else
          kept.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool previous_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !previous_match && !kept.empty())
          kept.back().first = s.begin;
        else
          kept.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case Behavior::Contiguous: {
      int previous = -1;
      for (const Span& s : spans) {
        if (previous == static_cast<int>(s.is_match) && !kept.empty())
          kept.back().second = s.end;
        else
          kept.emplace_back(s.begin, s.end);
        previous = s.is_match;
      }
      break;
    }
  }
  for (auto [begin, end] : kept) {
    if (end > begin) out.push_back({text.substr(begin, end - begin), piece.at_start && begin == 0});
  }
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Matcher> matcher, Behavior behavior, bool invert)
      : matcher_(std::move(matcher)), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    for (const Piece& piece : pieces) split_piece(piece, *matcher_, behavior_, invert_, out);
    pieces = std::move(out);
  }

 private:
  std::unique_ptr<Matcher> matcher_;
  Behavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& file)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      regex_ = std::make_unique<Matcher>(kGpt2Pattern, true, file + ": ByteLevel pre-tokenizer");
  }
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> split;
    split.reserve(pieces.size());
    for (Piece& piece : pieces) {
      if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' '))
        piece.text = " " + piece.text;
      if (regex_)
        split_piece(piece, *regex_, Behavior::Isolated, false, split);
      else if (!piece.text.empty())
        split.push_back(std::move(piece));
    }
    for (Piece& piece : split) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (unsigned char c : piece.text) append_utf8(mapped, byte_to_code_point(c));
      piece.text = std::move(mapped);
    }
    pieces = std::move(split);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Matcher> regex_;
};

enum class PrependScheme { Always, First, Never };

PrependScheme prepend_scheme_of(const json& spec, const std::string& file) {
  if (spec.contains("prepend_scheme") && spec["prepend_scheme"].is_string()) {
    const std::string scheme = spec["prepend_scheme"].get<std::string>();
    if (scheme == "always") return PrependScheme::Always;
    if (scheme == "first") return PrependScheme::First;
    if (scheme == "never") return PrependScheme::Never;
    fail("tokenizer ", file, ": unsupported Metaspace prepend_scheme '", scheme, "'");
  }
  // Older files: add_prefix_space (default true).
  return spec.value("add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;
}

std::string replacement_of(const json& spec) {
  return spec.contains("replacement") ? spec["replacement"].get<std::string>()
                                      : std::string("\xE2\x96\x81");
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(const json& spec, const std::string& file)
      : replacement_(replacement_of(spec)),
        scheme_(prepend_scheme_of(spec, file)),
        split_(spec.value("split", true)),
        space_(" ", false, file),
        on_replacement_(replacement_, false, file) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size());
    for (Piece& piece : pieces) {
      space_.replace_all(piece.text, replacement_);
      const bool starts = piece.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::Always ||
                      (scheme_ == PrependScheme::First && piece.at_start)))
        piece.text = replacement_ + piece.text;
      if (split_)
        split_piece(piece, on_replacement_, Behavior::MergedWithNext, false, out);
      else if (!piece.text.empty())
        out.push_back(std::move(piece));
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Matcher space_;
  Matcher on_replacement_;
};

}  // namespace

// ---------------------------------------------------------------- factories
std::unique_ptr<Normalizer> make_normalizer(const json& spec, const std::string& file) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec);
  if (type == "Sequence") return make_sequence<Normalizer, std::string>(spec, "normalizers", file, make_normalizer);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(spec.at("prepend").get<std::string>());
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(spec, file);
  if (type == "NFC") return std::make_unique<NfcNormalizer>(file);
  fail("tokenizer ", file, ": unsupported normalizer type '", type, "'");
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& spec, const std::string& file) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec);
  if (type == "Sequence")
    return make_sequence<PreTokenizer, std::vector<Piece>>(spec, "pretokenizers", file, make_pre_tokenizer);
  if (type == "Split") {
    bool is_regex = false;
    std::string pattern = pattern_of(spec, "tokenizer " + file + ": Split pre-tokenizer", is_regex);
    auto matcher = std::make_unique<Matcher>(pattern, is_regex, "tokenizer " + file + ": Split");
    return std::make_unique<SplitPreTokenizer>(
        std::move(matcher), behavior_of(spec.at("behavior").get<std::string>(), file),
        spec.value("invert", false));
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(spec.value("add_prefix_space", true),
                                                   spec.value("use_regex", true), file);
  if (type == "Metaspace") return std::make_unique<MetaspacePreTokenizer>(spec, file);
  if (type == "Digits") {
    auto matcher = std::make_unique<Matcher>(R"(\p{N})", true, "tokenizer " + file + ": Digits");
    return std::make_unique<SplitPreTokenizer>(
        std::move(matcher),
        spec.value("individual_digits", false) ? Behavior::Isolated : Behavior::Contiguous, false);
  }
  if (type == "Whitespace") {
    auto matcher = std::make_unique<Matcher>(R"(\w+|[^\w\s]+)", true, "tokenizer " + file);
    return std::make_unique<SplitPreTokenizer>(std::move(matcher), Behavior::Removed, true);
  }
  if (type == "WhitespaceSplit") {
    auto matcher = std::make_unique<Matcher>(R"(\s+)", true, "tokenizer " + file);
    return std::make_unique<SplitPreTokenizer>(std::move(matcher), Behavior::Removed, false);
  }
  fail("tokenizer ", file, ": unsupported pre_tokenizer type '", type, "'");
}

}  // namespace qspec::tok
