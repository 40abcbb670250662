// Helpers shared by the importers (llama2.c, GGUF): a read-only file mapping, the Q/K row
// permutation between interleaved and rotate_half RoPE, and writers for the files of a
// Hugging Face style directory (config.json, tokenizer.json, tokenizer_config.json,
// generation_config.json).
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"

namespace qspec::hf {

// A whole file mapped read-only (an empty file maps to size 0, data nullptr).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws qspec::Error naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reorders the rows of a [n_heads * head_dim, cols] projection, head by head, from the
// interleaved RoPE layout (llama2.c, Meta, GGUF: pairs (2i, 2i+1) rotate together) to the
// Hugging Face rotate_half layout (pairs (i, i + head_dim/2)): new row i = old row 2i, new
// row i + head_dim/2 = old row 2i + 1. This is the permutation transformers'
// convert_llama_weights_to_hf applies, and the inverse of the one convert_hf_to_gguf applies.
void interleaved_to_half_rows(float* weight, int64_t n_heads, int64_t head_dim, int64_t cols);
// The same permutation for one row: the old (interleaved) row that new row `row` comes from.
int64_t interleaved_source_row(int64_t row, int64_t head_dim);

// config.json for an imported model: LlamaForCausalLM, or Gemma3ForCausalLM (layer_types,
// local RoPE base, query_pre_attn_scalar), with rope scaling none or linear; throws
// qspec::Error for a config it would write wrongly.
nlohmann::json llama_config_json(const ModelConfig& config);

// Kinds of vocabulary entries; the values are GGUF's tokenizer.ggml.token_type.
enum class TokenKind : int32_t {
  Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

// A sentencepiece BPE vocabulary (Llama-2 / llama2.c): pieces with '▁' for spaces, byte
// pieces spelled <0xAB>, scores (higher merges first).
struct SentencepieceVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<TokenKind> kinds;
  std::optional<int32_t> unk_id;
  std::optional<int32_t> bos_id;  // for the TemplateProcessing post-processor
  bool add_space_prefix = true;   // Prepend "▁" normalizer + Strip decoder
  bool add_bos = true;
};
// tokenizer.json for a sentencepiece-style BPE: normalizer Prepend("▁") + Replace(" ", "▁"),
// no pre-tokenizer, BPE with byte_fallback, merges derived from the scores the way
// sentencepiece's BPE applies them (every piece that is the concatenation of two others is a
// merge, ranked by the merged piece's score, highest first).
nlohmann::json sentencepiece_tokenizer_json(const SentencepieceVocab& vocab);
// The merges alone, as (left, right) pairs in rank order (exposed for tests).
std::vector<std::pair<std::string, std::string>> sentencepiece_merges(
    const SentencepieceVocab& vocab);

// A byte-level BPE vocabulary (GPT-2 / Llama-3 / Qwen2 / SmolLM): tokens in the GPT-2
// byte-to-unicode alphabet, merges "left right" in rank order, and the llama.cpp name of
// the pre-tokenizer (tokenizer.ggml.pre).
struct ByteLevelVocab {
  std::vector<std::string> tokens;
  std::vector<std::string> merges;
  std::vector<TokenKind> kinds;  // empty: all normal
  std::string pre = "default";
};
// The pre-tokenizer regexes for a tokenizer.ggml.pre name; unknown names get the GPT-2 regex
// and *known = false.
std::vector<std::string> byte_level_split_regexes(const std::string& pre, bool* known);
nlohmann::json byte_level_tokenizer_json(const ByteLevelVocab& vocab);

// Special tokens and tokenizer options for tokenizer_config.json / generation_config.json.
struct TokenizerOptions {
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  std::vector<int32_t> extra_eos_ids;  // e.g. GGUF eot/eom: generation stops on them too
  bool add_bos = false;
  bool add_eos = false;
  std::optional<std::string> chat_template;
  std::string tokenizer_class = "PreTrainedTokenizerFast";
  int64_t model_max_length = 0;  // 0: not written
};
nlohmann::json tokenizer_config_json(const TokenizerOptions& options,
                                     const std::vector<std::string>& tokens);
nlohmann::json generation_config_json(const TokenizerOptions& options);

// Checks that every token is valid UTF-8 (JSON needs it); throws naming `what` and the id.
void check_utf8_tokens(const std::vector<std::string>& tokens, const std::string& what);
bool is_valid_utf8(const std::string& text);

// The shortest decimal that reads back as the same float (1e-05 rather than
// 9.999999747378752e-06 for a value stored as float32).
double shortest_float(float value);

// Writes JSON (2-space indent) to path; throws qspec::Error on I/O failure.
void write_json(const std::filesystem::path& path, const nlohmann::json& value);

// Writes a converted model as a Hugging Face directory: creates out_dir, then
// model.safetensors (from `weights`), config.json, tokenizer.json, tokenizer_config.json and
// generation_config.json. Shared by the llama2.c and GGUF importers.
void write_model_directory(const std::string& out_dir, const SafetensorsWriter& weights,
                           const ModelConfig& config, const nlohmann::json& tokenizer,
                           const TokenizerOptions& options, const std::vector<std::string>& tokens);

// Prints a warning line on stderr ("qspec: warning: ...").
void warn(const std::string& message);

}  // namespace qspec::hf
