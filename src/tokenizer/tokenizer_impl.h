// Internals of the tokenizer: UTF-8 helpers, the PCRE2 regex wrapper, normalizers,
// pre-tokenizers, the BPE model and decoders. Not part of the public interface.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qspec::tok {

using json = nlohmann::json;

// ---- UTF-8 ----
// Decodes the character at `pos` when it is well-formed UTF-8 (no overlongs, no surrogates),
// advancing `pos`; returns false (pos unchanged) otherwise.
bool utf8_next(std::string_view text, size_t& pos, uint32_t& code_point);
void append_utf8(std::string& out, uint32_t code_point);
bool is_valid_utf8(std::string_view text);
// Length of the longest prefix of `text` that could still become valid UTF-8 with more bytes:
// returns the number of trailing bytes that form an incomplete (but so far valid) character.
size_t incomplete_utf8_tail(std::string_view text);
// Invalid byte sequences replaced by U+FFFD (maximal subparts, as Python/Rust lossy decoding).
std::string to_valid_utf8(std::string_view text);
bool is_unicode_whitespace(uint32_t code_point);

// GPT-2 byte-level alphabet: byte -> code point, and code point -> byte (-1 when none).
uint32_t byte_to_code_point(uint8_t byte);
int code_point_to_byte(uint32_t code_point);

// True when `text` (valid UTF-8) is already in NFC by the Unicode quick-check (no characters
// with NFC_QC No/Maybe and combining marks in canonical order).
bool is_nfc_quick(std::string_view text);

// ---- regex (PCRE2, UTF + UCP) ----
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-overlapping matches as (begin, end) byte offsets, left to right; empty matches dropped.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// ---- pipeline pieces ----
struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original text (Metaspace "first")
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& text) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const json& spec, const std::string& file);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their sub-pieces; empty pieces are dropped.
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& spec, const std::string& file);

// Decoding is a chain of per-token steps, then sequence-level steps after a Fuse (only Strip is
// supported there). Each token's output depends only on its text and its index in the sequence,
// plus a leading strip over the start of the fused text, so streaming is exact.
class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  virtual void apply(std::string& token, size_t index) const = 0;
};
struct DecoderChain {
  std::vector<std::unique_ptr<TokenDecoder>> per_token;
  bool join_with_space = false;  // no decoder at all: HF joins the tokens with ' '
  std::string strip_content;     // sequence-level Strip after Fuse
  size_t strip_start = 0;
  size_t strip_stop = 0;
};
DecoderChain make_decoder(const json& spec, const std::string& file);

// ---- BPE model ----
class Bpe {
 public:
  Bpe(const json& model, const std::string& file);
  // Appends the ids of one pre-token.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t byte_ids_[256];
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace qspec::tok
