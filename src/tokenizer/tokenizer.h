// Tokenizer from a Hugging Face tokenizer.json: byte-level BPE (GPT-2 / Llama-3 / Qwen2
// style, Split regex pre-tokenizer through PCRE2 + ByteLevel) and sentencepiece-style BPE
// (Llama-2 / TinyLlama: Metaspace or Prepend+Replace normalizer, byte fallback), with added
// and special tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qspec {

class Tokenizer {
 public:
  // Loads tokenizer.json, and bos/eos from tokenizer_config.json / generation_config.json /
  // config.json when they sit beside it. `path` is the file or its directory.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  virtual ~Tokenizer() = default;

  // Text -> ids. Special/added tokens written in the text are matched as tokens.
  // add_bos prepends bos when the tokenizer has one (llama-2 style); the post_processor of
  // tokenizer.json is not applied otherwise.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const = 0;
  // Ids -> bytes of text (may contain incomplete UTF-8 at the end; see StreamDecoder).
  // skip_special drops special tokens such as <|endoftext|>.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;

  std::optional<int32_t> bos_id;
  // Whether callers should prepend bos to a prompt (tokenizer_config add_bos_token, or a
  // TemplateProcessing post_processor that inserts it).
  bool add_bos_by_default = false;
  std::vector<int32_t> eos_ids;  // generation stops on any of them
};

// Incremental decoding for streaming: feed ids one at a time, get back only complete UTF-8
// characters (bytes of an unfinished character are held back until it completes).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);  // returns the newly completed text (maybe empty)
  std::string flush();           // whatever is held back (invalid bytes become U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t emitted_bytes_ = 0;
};

}  // namespace qspec
