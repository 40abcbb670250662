// Tokenizer::load and the tokenizer.json pipeline: added tokens, normalizer, pre-tokenizer,
// BPE model, decoder; bos/eos from the config files beside tokenizer.json.
//
// bos/eos choices:
//  * bos_id: tokenizer_config.json bos_token (string or {"content": ...}) when it names a
//    token; otherwise generation_config.json bos_token_id; otherwise config.json bos_token_id.
//  * eos_ids: union, in this order, of tokenizer_config.json eos_token,
//    generation_config.json eos_token_id and config.json eos_token_id (int or list).
//  * add_bos_by_default: tokenizer_config.json add_bos_token when present; otherwise true
//    when tokenizer.json's post_processor is a TemplateProcessing (possibly inside a
//    Sequence) whose single template inserts the bos token; otherwise false.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <new>
#include <stdexcept>

#include "base/files.h"
#include "base/limits.h"
#include "qspec/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace qspec {

namespace fs = std::filesystem;
using tok::json;

namespace {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Leftmost-longest matching of a set of added tokens.
class AddedMatcher {
 public:
  void add(const AddedToken* token, std::string content) {
    if (content.empty()) return;
    entries_.push_back({token, std::move(content)});
  }
  void finish() {
    std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      return a.content.size() > b.content.size();
    });
    for (uint32_t i = 0; i < entries_.size(); ++i)
      by_first_[static_cast<uint8_t>(entries_[i].content[0])].push_back(i);
  }
  bool empty() const { return entries_.empty(); }
  // First match at or after `from`: (begin, end, token) or token == nullptr.
  const AddedToken* find(std::string_view text, size_t from, size_t& begin, size_t& end) const {
    for (size_t i = from; i < text.size(); ++i) {
      const auto& candidates = by_first_[static_cast<uint8_t>(text[i])];
      for (uint32_t index : candidates) {
        const Entry& e = entries_[index];
        if (text.compare(i, e.content.size(), e.content) == 0) {
          begin = i;
          end = i + e.content.size();
          return e.token;
        }
      }
    }
    return nullptr;
  }

 private:
  struct Entry {
    const AddedToken* token;
    std::string content;
  };
  std::vector<Entry> entries_;
  std::vector<uint32_t> by_first_[256];
};

struct Segment {
  size_t begin, end;
  int32_t id;  // -1: text to tokenize
};

uint32_t code_point_before(std::string_view text, size_t pos) {
  size_t start = pos;
  while (start > 0 && (static_cast<uint8_t>(text[start - 1]) & 0xC0) == 0x80) --start;
  if (start > 0) --start;
  size_t p = start;
  uint32_t cp = 0;
  tok::utf8_next(text, p, cp);
  return cp;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  return !tok::is_unicode_whitespace(cp);
}

// Splits `text` around the added tokens found by `matcher`, honouring lstrip/rstrip/single_word
// roughly as HF's AddedVocabulary does.
void split_added(std::string_view text, const AddedMatcher& matcher, std::vector<Segment>& out) {
  size_t start = 0;
  size_t search = 0;
  if (!matcher.empty()) {
    size_t begin = 0, end = 0;
    while (const AddedToken* token = matcher.find(text, search, begin, end)) {
      search = end;
      if (token->single_word) {
        const bool space_before = begin == 0 || !is_word_char(code_point_before(text, begin));
        size_t p = end;
        uint32_t cp = 0;
        const bool space_after = end == text.size() || !tok::utf8_next(text, p, cp) || !is_word_char(cp);
        if (!space_before || !space_after) continue;
      }
      if (token->lstrip) {
        while (begin > start) {
          const uint32_t cp = code_point_before(text, begin);
          if (!tok::is_unicode_whitespace(cp)) break;
          size_t width = 1;
          while ((static_cast<uint8_t>(text[begin - width]) & 0xC0) == 0x80) ++width;
          begin -= width;
        }
      }
      if (token->rstrip) {
        size_t p = end;
        uint32_t cp = 0;
        while (p < text.size()) {
          size_t q = p;
          if (!tok::utf8_next(text, q, cp) || !tok::is_unicode_whitespace(cp)) break;
          p = q;
        }
        end = p;
        search = end;
      }
      if (begin > start) out.push_back({start, begin, -1});
      out.push_back({begin, end, token->id});
      start = end;
    }
  }
  if (start < text.size()) out.push_back({start, text.size(), -1});
}

// tokenizer.json (required) or a config file beside it (null when absent), read with a size
// cap from a regular file only.
json read_json(const fs::path& file, bool required, uint64_t max_bytes) {
  std::error_code ec;
  if (!required && !fs::exists(file, ec)) return json();
  std::string text;
  try {
    text = read_text_file(file.string(), max_bytes);
  } catch (const Error& e) {
    fail("tokenizer: ", e.what());
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("tokenizer: ", file.string(), ": malformed JSON: ", e.what());
  }
}

std::optional<std::string> token_content(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return std::nullopt;
}

// bos_token_id / eos_token_id of generation_config.json or config.json: an integer or a list
// of integers, each in the vocabulary [0, vocab_size); `where` names the file and field.
std::vector<int32_t> token_ids(const json& value, int32_t vocab_size, const std::string& where) {
  std::vector<int32_t> ids;
  const auto add = [&](const json& v) {
    if (!v.is_number_integer()) return;  // non-integers: not an id (as before)
    const bool in_vocab = v.is_number_unsigned() ? v.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                                                 : v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab_size;
    if (!in_vocab)
      fail("tokenizer: ", where, " = ", v.dump(), " is outside the tokenizer's vocabulary [0, ", vocab_size, ")");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  };
  if (value.is_array()) {
    for (const json& v : value) add(v);
  } else {
    add(value);
  }
  return ids;
}

bool template_inserts(const json& processor, const std::string& bos) {
  if (!processor.is_object()) return false;
  const std::string type = processor.value("type", std::string());
  if (type == "Sequence" && processor.contains("processors")) {
    for (const json& p : processor["processors"])
      if (template_inserts(p, bos)) return true;
    return false;
  }
  if (type != "TemplateProcessing" || !processor.contains("single")) return false;
  const json& single = processor["single"];
  if (!single.is_array() || single.empty()) return false;
  const json& first = single.front();
  return first.is_object() && first.contains("SpecialToken") &&
         first["SpecialToken"].value("id", std::string()) == bos;
}

class HfTokenizer : public Tokenizer {
 public:
  HfTokenizer(const json& root, const std::string& file) : file_(file) {
    if (!root.is_object()) fail("tokenizer ", file, ": not a tokenizer.json object");
    if (!root.contains("model")) fail("tokenizer ", file, ": no \"model\"");
    bpe_ = std::make_unique<tok::Bpe>(root["model"], file);
    normalizer_ = tok::make_normalizer(root.value("normalizer", json()), file);
    pre_tokenizer_ = tok::make_pre_tokenizer(root.value("pre_tokenizer", json()), file);
    decoder_ = tok::make_decoder(root.value("decoder", json()), file);
    vocab_size_ = static_cast<int32_t>(bpe_->id_to_token().size());
    if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
      for (const json& spec : root["added_tokens"]) {
        AddedToken token;
        const int64_t id = spec.at("id").get<int64_t>();
        // vocab_size_ (and a table of that many entries) follows the largest id.
        if (id < 0 || id >= kMaxVocabSize)
          fail("tokenizer ", file, ": added_tokens: token ", spec.value("content", json()).dump(), " has id ", id,
               ", outside [0, ", kMaxVocabSize, ")");
        token.id = static_cast<int32_t>(id);
        token.content = spec.at("content").get<std::string>();
        token.special = spec.value("special", false);
        token.lstrip = spec.value("lstrip", false);
        token.rstrip = spec.value("rstrip", false);
        token.single_word = spec.value("single_word", false);
        token.normalized = spec.value("normalized", !token.special);
        added_.push_back(std::move(token));
      }
    }
    for (const AddedToken& token : added_) {
      vocab_size_ = std::max(vocab_size_, token.id + 1);
      added_by_content_[token.content] = token.id;
    }
    added_by_id_.assign(static_cast<size_t>(vocab_size_), -1);
    for (size_t i = 0; i < added_.size(); ++i) added_by_id_[added_[i].id] = static_cast<int32_t>(i);
    for (const AddedToken& token : added_) {
      if (!token.normalized || !normalizer_) {
        raw_matcher_.add(&token, token.content);
      } else {
        std::string content = token.content;
        normalizer_->apply(content);
        normalized_matcher_.add(&token, content);
      }
    }
    raw_matcher_.finish();
    normalized_matcher_.finish();
    post_processor_ = root.value("post_processor", json());
  }

  void load_configs(const fs::path& dir) {
    const json tc = read_json(dir / "tokenizer_config.json", false, kMaxConfigJsonBytes);
    const json gen = read_json(dir / "generation_config.json", false, kMaxConfigJsonBytes);
    const json config = read_json(dir / "config.json", false, kMaxConfigJsonBytes);
    const auto source_name = [&](const json* source) {
      return (dir / (source == &gen ? "generation_config.json" : "config.json")).string();
    };
    const auto field = [](const json& j, const char* name) {
      return j.is_object() && j.contains(name) ? j[name] : json();
    };
    std::optional<std::string> bos_content = token_content(field(tc, "bos_token"));
    if (bos_content) bos_id = token_to_id(*bos_content);
    // Every id is checked, even those a file before it overrides: each file is read by others.
    for (const json* source : {&gen, &config}) {
      const std::vector<int32_t> ids =
          token_ids(field(*source, "bos_token_id"), vocab_size_, source_name(source) + ": field 'bos_token_id'");
      if (!bos_id && !ids.empty()) bos_id = ids.front();
    }
    const auto add_eos = [&](int32_t id) {
      if (std::find(eos_ids.begin(), eos_ids.end(), id) == eos_ids.end()) eos_ids.push_back(id);
    };
    if (auto eos = token_content(field(tc, "eos_token")))
      if (auto id = token_to_id(*eos)) add_eos(*id);
    for (const json* source : {&gen, &config})
      for (int32_t id :
           token_ids(field(*source, "eos_token_id"), vocab_size_, source_name(source) + ": field 'eos_token_id'"))
        add_eos(id);
    const json add_bos = field(tc, "add_bos_token");
    if (add_bos.is_boolean()) {
      add_bos_by_default = add_bos.get<bool>();
    } else if (bos_id) {
      add_bos_by_default = template_inserts(post_processor_, id_to_token(*bos_id));
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::string sanitized;
    if (!tok::is_valid_utf8(text)) {
      sanitized = tok::to_valid_utf8(text);
      text = sanitized;
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 2);
    if (add_bos && bos_id) ids.push_back(*bos_id);
    std::vector<Segment> segments;
    split_added(text, raw_matcher_, segments);
    std::vector<Segment> inner;
    std::vector<tok::Piece> pieces;
    for (const Segment& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      std::string normalized(text.substr(segment.begin, segment.end - segment.begin));
      if (normalizer_) normalizer_->apply(normalized);
      inner.clear();
      split_added(normalized, normalized_matcher_, inner);
      for (const Segment& part : inner) {
        if (part.id >= 0) {
          ids.push_back(part.id);
          continue;
        }
        pieces.clear();
        pieces.push_back({normalized.substr(part.begin, part.end - part.begin),
                          segment.begin == 0 && part.begin == 0});
        if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
        for (const tok::Piece& piece : pieces) bpe_->encode_word(piece.text, ids);
      }
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    DecodeState state;
    std::string out;
    for (int32_t id : ids) decode_step(id, skip_special, state, out);
    if (decoder_.strip_stop > 0) {
      const std::string& content = decoder_.strip_content;
      for (size_t i = 0; i < decoder_.strip_stop && out.size() >= content.size() &&
                         out.compare(out.size() - content.size(), content.size(), content) == 0;
           ++i)
        out.resize(out.size() - content.size());
    }
    return out;
  }

  void decode_step(int32_t id, bool skip_special, DecodeState& state,
                   std::string& out) const override {
    if (id < 0 || id >= vocab_size_) return;
    const int32_t added = added_by_id_[id];
    if (added >= 0 && skip_special && added_[added].special) return;
    std::string token = added >= 0 ? added_[added].content
                        : static_cast<size_t>(id) < bpe_->id_to_token().size()
                            ? bpe_->id_to_token()[id]
                            : std::string();
    if (added < 0 && token.empty()) return;  // hole in the vocab
    if (decoder_.join_with_space) {
      if (state.tokens > 0) out += ' ';
      out += token;
      ++state.tokens;
      return;
    }
    for (const auto& step : decoder_.per_token) step->apply(token, state.tokens);
    ++state.tokens;
    if (!state.started) {
      state.started = true;
      state.strip_pending = decoder_.strip_content.empty() ? 0 : decoder_.strip_start;
    }
    size_t begin = 0;
    const std::string& content = decoder_.strip_content;
    while (state.strip_pending > 0 && begin < token.size()) {
      if (token.compare(begin, content.size(), content) == 0) {
        begin += content.size();
        --state.strip_pending;
      } else {
        state.strip_pending = 0;
      }
    }
    out.append(token, begin, std::string::npos);
  }

  int32_t vocab_size() const override { return vocab_size_; }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (const auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end())
      return it->second;
    return bpe_->token_to_id(token);
  }

  std::string id_to_token(int32_t id) const override {
    if (id < 0 || id >= vocab_size_) return {};
    if (added_by_id_[id] >= 0) return added_[added_by_id_[id]].content;
    const auto& tokens = bpe_->id_to_token();
    return static_cast<size_t>(id) < tokens.size() ? tokens[id] : std::string();
  }

  bool is_special(int32_t id) const override {
    if (id < 0 || id >= vocab_size_) return false;
    return added_by_id_[id] >= 0 && added_[added_by_id_[id]].special;
  }

 private:
  std::string file_;
  std::unique_ptr<tok::Bpe> bpe_;
  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  tok::DecoderChain decoder_;
  std::vector<AddedToken> added_;  // never resized after construction: matchers point into it
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::vector<int32_t> added_by_id_;  // id -> index in added_, or -1
  AddedMatcher raw_matcher_, normalized_matcher_;
  json post_processor_;
  int32_t vocab_size_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  std::unique_ptr<HfTokenizer> tokenizer;
  try {
    const json root = read_json(file, true, kMaxTokenizerJsonBytes);
    tokenizer = std::make_unique<HfTokenizer>(root, file.string());
    tokenizer->load_configs(file.parent_path().empty() ? fs::path(".") : file.parent_path());
  } catch (const json::exception& e) {
    fail("tokenizer ", file.string(), ": unexpected content: ", e.what());
  } catch (const std::bad_alloc&) {
    fail("tokenizer ", file.string(), ": out of memory while loading the tokenizer");
  } catch (const std::length_error& e) {
    fail("tokenizer ", file.string(), ": out of memory while loading the tokenizer (", e.what(), ")");
  }
  return tokenizer;
}

void Tokenizer::check_model_vocab(int64_t model_vocab_size, const std::string& model_dir) const {
  // Every id the tokenizer produces (bos and eos included, which load() kept below
  // vocab_size()) must index the model's embedding and logits.
  QSPEC_CHECK(vocab_size() <= model_vocab_size, model_dir, ": the tokenizer has ", vocab_size(),
              " tokens but config.json's vocab_size is ", model_vocab_size,
              " (ids past it would index beyond the embedding)");
}

}  // namespace qspec
