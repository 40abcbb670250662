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
  // Every file is read with a size cap from a regular file only; token ids (vocab, added
  // tokens, bos/eos) must lie below base/limits.h's kMaxVocabSize and bos/eos ids inside the
  // vocabulary. Errors name the file and field.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  virtual ~Tokenizer() = default;

  // Where the tokenizer meets a model: throws an Error naming model_dir unless every id the
  // tokenizer can produce (vocab_size()) indexes the model's vocabulary.
  void check_model_vocab(int64_t model_vocab_size, const std::string& model_dir) const;

  // Text -> ids. Special/added tokens written in the text are matched as tokens.
  // Invalid UTF-8 in `text` is replaced by U+FFFD before tokenizing.
  // add_bos prepends bos when the tokenizer has one (llama-2 style); the post_processor of
  // tokenizer.json is not applied otherwise.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const = 0;
  // Ids -> bytes of text (may contain incomplete UTF-8 at the end; see StreamDecoder).
  // Ids outside the vocabulary are skipped, as HF does.
  // skip_special drops special tokens such as <|endoftext|>.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;

  // Incremental decoding: decode(ids) is the concatenation of what decode_step appends for
  // each id in order, starting from a fresh DecodeState (a decoder's trailing Strip after Fuse,
  // if any, is the one thing only decode() applies). The default re-decodes the single id.
  struct DecodeState {
    size_t tokens = 0;          // tokens decoded so far (skipped special tokens excluded)
    size_t strip_pending = 0;   // leading strip characters still to remove
    bool started = false;       // strip_pending has been initialised
  };
  virtual void decode_step(int32_t id, bool skip_special, DecodeState& state,
                           std::string& out) const {
    if (skip_special && is_special(id)) return;
    out += decode({id}, skip_special);
    ++state.tokens;
  }

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
  Tokenizer::DecodeState state_;
  std::string pending_;  // decoded bytes not yet returned (an unfinished UTF-8 character)
};

}  // namespace qspec
