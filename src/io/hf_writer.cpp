#include "io/hf_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <tuple>
#include <unordered_map>

#include "base/files.h"
#include "qspec/error.h"

namespace qspec::hf {

using nlohmann::json;

// ---- MappedFile ----

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // Regular files only, checked before a blocking open (a FIFO would hang it).
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);
  size_ = static_cast<size_t>(size);
  if (size_ > 0) {
    void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      fail(path, ": cannot map ", size_, " bytes: ", std::strerror(error));
    }
    data_ = static_cast<const uint8_t*>(mapping);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---- permutation ----

int64_t interleaved_source_row(int64_t row, int64_t head_dim) {
  const int64_t half = head_dim / 2, within = row % head_dim;
  return row - within + 2 * (within % half) + within / half;  // new j * half + i <- old 2i + j
}

void interleaved_to_half_rows(float* weight, int64_t n_heads, int64_t head_dim, int64_t cols) {
  QSPEC_CHECK(head_dim % 2 == 0, "RoPE permutation: head_dim ", head_dim, " is odd");
  const size_t row_floats = static_cast<size_t>(cols);
  std::vector<float> head(static_cast<size_t>(head_dim) * row_floats);
  for (int64_t h = 0; h < n_heads; ++h) {
    float* base = weight + static_cast<size_t>(h * head_dim) * row_floats;
    std::copy(base, base + head.size(), head.begin());
    for (int64_t row = 0; row < head_dim; ++row) {
      const float* from = head.data() + static_cast<size_t>(interleaved_source_row(row, head_dim)) * row_floats;
      std::copy(from, from + row_floats, base + static_cast<size_t>(row) * row_floats);
    }
  }
}

// ---- config.json ----

json llama_config_json(const ModelConfig& config) {
  const bool gemma = config.architecture == Architecture::Gemma3;
  QSPEC_CHECK((config.architecture == Architecture::Llama && !config.sliding_window) || (gemma && !config.mlp_bias),
              "config.json writer: only a Llama or Gemma 3 model is written");
  // One attention_bias flag covers q/k/v and o_proj alike.
  QSPEC_CHECK(config.attention_bias == config.attention_output_bias,
              "config.json writer: q/k/v and o_proj biases must come together (attention_bias)");
  QSPEC_CHECK(config.rope.type == "default" || config.rope.type == "linear",
              "config.json writer: rope type '", config.rope.type, "' is not written (default, linear)");
  json out = json::object();
  out["architectures"] = json::array({architecture_name(config.architecture)});
  out["model_type"] = gemma ? "gemma3_text" : "llama";
  out[gemma ? "hidden_activation" : "hidden_act"] = gemma ? "gelu_pytorch_tanh" : "silu";
  out["attention_bias"] = config.attention_bias;
  if (!gemma) out["mlp_bias"] = config.mlp_bias;
  out["vocab_size"] = config.vocab_size;
  out["hidden_size"] = config.hidden_size;
  out["intermediate_size"] = config.intermediate_size;
  out["num_hidden_layers"] = config.num_layers;
  out["num_attention_heads"] = config.num_heads;
  out["num_key_value_heads"] = config.num_kv_heads;
  out["head_dim"] = config.head_dim;
  out["max_position_embeddings"] = config.max_position_embeddings;
  out["rms_norm_eps"] = config.rms_norm_eps;
  out["rope_theta"] = config.rope.theta;
  if (config.rope.type == "linear") {
    out["rope_scaling"] = {{"rope_type", "linear"}, {"type", "linear"}, {"factor", config.rope.factor}};
  }
  if (gemma) {
    QSPEC_CHECK(config.sliding_window && config.rope_local && config.rope_local->type == "default" &&
                    config.query_pre_attn_scalar &&
                    static_cast<int64_t>(config.layer_types.size()) == config.num_layers,
                "config.json writer: a Gemma 3 config needs sliding_window, a local RoPE, query_pre_attn_scalar "
                "and layer_types");
    out["sliding_window"] = *config.sliding_window;
    out["rope_local_base_freq"] = config.rope_local->theta;
    out["query_pre_attn_scalar"] = *config.query_pre_attn_scalar;
    json types = json::array();
    for (LayerType type : config.layer_types) types.push_back(layer_type_name(type));
    out["layer_types"] = types;
    out["final_logit_softcapping"] =
        config.final_logit_softcapping ? json(*config.final_logit_softcapping) : json(nullptr);
    out["attn_logit_softcapping"] = nullptr;
  }
  out["tie_word_embeddings"] = config.tie_word_embeddings;
  out["bos_token_id"] = config.bos_token_id ? json(*config.bos_token_id) : json(nullptr);
  if (config.eos_token_ids.empty()) out["eos_token_id"] = nullptr;
  else if (config.eos_token_ids.size() == 1) out["eos_token_id"] = config.eos_token_ids[0];
  else out["eos_token_id"] = config.eos_token_ids;
  if (config.pad_token_id) out["pad_token_id"] = *config.pad_token_id;
  out["torch_dtype"] = config.torch_dtype;
  return out;
}

// ---- UTF-8 ----

bool is_valid_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

void check_utf8_tokens(const std::vector<std::string>& tokens, const std::string& what) {
  for (size_t id = 0; id < tokens.size(); ++id) {
    QSPEC_CHECK(is_valid_utf8(tokens[id]), what, ": token ", id,
                " is not valid UTF-8 (tokenizer.json needs text)");
  }
}

namespace {

size_t utf8_char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;
}

json added_token(int32_t id, const std::string& content, bool special, bool normalized) {
  return json{{"id", id},          {"content", content}, {"single_word", false},
              {"lstrip", false},   {"rstrip", false},    {"normalized", normalized},
              {"special", special}};
}

json added_tokens_json(const std::vector<std::string>& tokens, const std::vector<TokenKind>& kinds) {
  json list = json::array();
  for (size_t id = 0; id < kinds.size() && id < tokens.size(); ++id) {
    TokenKind kind = kinds[id];
    if (kind == TokenKind::Control || kind == TokenKind::Unknown) {
      list.push_back(added_token(static_cast<int32_t>(id), tokens[id], true, false));
    } else if (kind == TokenKind::UserDefined) {
      list.push_back(added_token(static_cast<int32_t>(id), tokens[id], false, true));
    }
  }
  return list;
}

// Vocabulary object; a token spelled twice keeps its first id (JSON keys are unique).
json vocab_json(const std::vector<std::string>& tokens, const std::string& what) {
  json vocab = json::object();
  size_t duplicates = 0;
  for (size_t id = 0; id < tokens.size(); ++id) {
    auto [it, inserted] = vocab.emplace(tokens[id], static_cast<int64_t>(id));
    (void)it;
    if (!inserted) ++duplicates;
  }
  if (duplicates > 0) {
    warn(what + ": " + std::to_string(duplicates) +
         " token(s) spelled like an earlier one; tokenizer.json maps each spelling to its first id");
  }
  return vocab;
}

json merges_json(const std::vector<std::pair<std::string, std::string>>& merges) {
  bool has_space = false;
  for (const auto& [left, right] : merges) {
    if (left.find(' ') != std::string::npos || right.find(' ') != std::string::npos) {
      has_space = true;
      break;
    }
  }
  json list = json::array();
  for (const auto& [left, right] : merges) {
    if (has_space) list.push_back(json::array({left, right}));  // unambiguous pair form
    else list.push_back(left + " " + right);
  }
  return list;
}

json replace_json(const std::string& from, const std::string& to) {
  return json{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
}

const char* kSpace = "\xe2\x96\x81";  // ▁ U+2581

}  // namespace

// ---- sentencepiece BPE ----

std::vector<std::pair<std::string, std::string>> sentencepiece_merges(const SentencepieceVocab& vocab) {
  const size_t n = vocab.pieces.size();
  QSPEC_CHECK(vocab.scores.size() == n && vocab.kinds.size() == n,
              "sentencepiece vocabulary: pieces, scores and kinds differ in length");
  auto mergeable = [&](size_t id) {
    return vocab.kinds[id] == TokenKind::Normal || vocab.kinds[id] == TokenKind::UserDefined;
  };
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(n * 2);
  for (size_t id = 0; id < n; ++id)
    if (mergeable(id)) ids.emplace(vocab.pieces[id], static_cast<int32_t>(id));

  struct Merge {
    float score;
    int32_t merged, left, right;
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < n; ++id) {
    if (vocab.kinds[id] != TokenKind::Normal) continue;
    const std::string& piece = vocab.pieces[id];
    // Only the first spelling of a piece is reachable.
    auto self = ids.find(piece);
    if (self == ids.end() || self->second != static_cast<int32_t>(id)) continue;
    size_t cut = utf8_char_length(static_cast<unsigned char>(piece[0]));
    while (cut < piece.size()) {
      auto left = ids.find(piece.substr(0, cut));
      auto right = ids.find(piece.substr(cut));
      if (left != ids.end() && right != ids.end())
        merges.push_back({vocab.scores[id], static_cast<int32_t>(id), left->second, right->second});
      cut += utf8_char_length(static_cast<unsigned char>(piece[cut]));
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    return std::tie(a.merged, a.left, a.right) < std::tie(b.merged, b.left, b.right);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Merge& merge : merges) out.emplace_back(vocab.pieces[merge.left], vocab.pieces[merge.right]);
  return out;
}

json sentencepiece_tokenizer_json(const SentencepieceVocab& vocab) {
  check_utf8_tokens(vocab.pieces, "sentencepiece vocabulary");
  json normalizers = json::array();
  if (vocab.add_space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
  normalizers.push_back(replace_json(" ", kSpace));

  json decoders = json::array();
  decoders.push_back(replace_json(kSpace, " "));
  decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  if (vocab.add_space_prefix)
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});

  json post_processor = nullptr;
  if (vocab.add_bos && vocab.bos_id && *vocab.bos_id >= 0 &&
      static_cast<size_t>(*vocab.bos_id) < vocab.pieces.size()) {
    const std::string& bos = vocab.pieces[static_cast<size_t>(*vocab.bos_id)];
    auto special = [&](int type_id) { return json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}}; };
    auto sequence = [](const char* id, int type_id) {
      return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
    };
    post_processor = {
        {"type", "TemplateProcessing"},
        {"single", json::array({special(0), sequence("A", 0)})},
        {"pair", json::array({special(0), sequence("A", 0), special(1), sequence("B", 1)})},
        {"special_tokens", {{bos, {{"id", bos}, {"ids", json::array({*vocab.bos_id})},
                                   {"tokens", json::array({bos})}}}}}};
  }

  json model = {
      {"type", "BPE"},
      {"dropout", nullptr},
      {"unk_token", vocab.unk_id ? json(vocab.pieces.at(static_cast<size_t>(*vocab.unk_id))) : json(nullptr)},
      {"continuing_subword_prefix", nullptr},
      {"end_of_word_suffix", nullptr},
      {"fuse_unk", true},
      {"byte_fallback", true},
      {"ignore_merges", false},
      {"vocab", vocab_json(vocab.pieces, "sentencepiece vocabulary")},
      {"merges", merges_json(sentencepiece_merges(vocab))},
  };
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added_tokens_json(vocab.pieces, vocab.kinds)},
              {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
              {"pre_tokenizer", nullptr},
              {"post_processor", post_processor},
              {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
              {"model", model}};
}

// ---- byte-level BPE ----

namespace {
// GPT-2's pattern (tokenizers' ByteLevel use_regex).
const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3 (tiktoken cl100k style: numbers in groups of up to three).
const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama-3 but every digit on its own.
const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// StarCoder / SmolLM: digits split individually (tokenizers' Digits), then GPT-2's pattern.
const char* kDigitRegex = R"(\p{N})";
}  // namespace

std::vector<std::string> byte_level_split_regexes(const std::string& pre, bool* known) {
  *known = true;
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "phi-2" || pre == "roberta-bpe")
    return {kGpt2Regex};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "dbrx" || pre == "smaug-bpe") return {kLlama3Regex};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return {kQwen2Regex};
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell")
    return {kDigitRegex, kGpt2Regex};
  *known = false;
  return {kGpt2Regex};
}

json byte_level_tokenizer_json(const ByteLevelVocab& vocab) {
  check_utf8_tokens(vocab.tokens, "byte-level BPE vocabulary");
  bool known = true;
  std::vector<std::string> regexes = byte_level_split_regexes(vocab.pre, &known);
  if (!known) {
    warn("unknown pre-tokenizer '" + vocab.pre +
         "' (tokenizer.ggml.pre); using the GPT-2 regex, tokenization may differ from the original");
  }
  json pretokenizers = json::array();
  for (const std::string& regex : regexes) {
    pretokenizers.push_back({{"type", "Split"},
                             {"pattern", {{"Regex", regex}}},
                             {"behavior", "Isolated"},
                             {"invert", false}});
  }
  pretokenizers.push_back(
      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});

  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(vocab.merges.size());
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const std::string& merge = vocab.merges[i];
    size_t space = merge.find(' ');
    QSPEC_CHECK(space != std::string::npos && space > 0 && space + 1 < merge.size() &&
                    merge.find(' ', space + 1) == std::string::npos,
                "byte-level BPE merge ", i, " ('", merge, "') is not two tokens separated by one space");
    QSPEC_CHECK(is_valid_utf8(merge), "byte-level BPE merge ", i, " is not valid UTF-8");
    merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }

  std::vector<TokenKind> kinds = vocab.kinds;
  kinds.resize(vocab.tokens.size(), TokenKind::Normal);
  // Llama-3 takes a pre-token that is a whole vocabulary entry as is (ignore_merges).
  const bool ignore_merges = regexes.size() == 1 && regexes[0] == kLlama3Regex;
  json model = {
      {"type", "BPE"},
      {"dropout", nullptr},
      {"unk_token", nullptr},
      {"continuing_subword_prefix", nullptr},
      {"end_of_word_suffix", nullptr},
      {"fuse_unk", false},
      {"byte_fallback", false},
      {"ignore_merges", ignore_merges},
      {"vocab", vocab_json(vocab.tokens, "byte-level BPE vocabulary")},
      {"merges", merges_json(merges)},
  };
  json normalizer = nullptr;
  if (regexes.size() == 1 && regexes[0] == kQwen2Regex) normalizer = {{"type", "NFC"}};
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added_tokens_json(vocab.tokens, kinds)},
              {"normalizer", normalizer},
              {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", pretokenizers}}},
              {"post_processor",
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
              {"decoder",
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
              {"model", model}};
}

// ---- tokenizer_config.json / generation_config.json ----

namespace {
json token_text(const std::optional<int32_t>& id, const std::vector<std::string>& tokens) {
  if (!id || *id < 0 || static_cast<size_t>(*id) >= tokens.size()) return nullptr;
  return tokens[static_cast<size_t>(*id)];
}
}  // namespace

json tokenizer_config_json(const TokenizerOptions& options, const std::vector<std::string>& tokens) {
  json out = json::object();
  out["add_bos_token"] = options.add_bos;
  out["add_eos_token"] = options.add_eos;
  out["bos_token"] = token_text(options.bos_id, tokens);
  out["eos_token"] = token_text(options.eos_id, tokens);
  out["unk_token"] = token_text(options.unk_id, tokens);
  out["pad_token"] = token_text(options.pad_id, tokens);
  out["clean_up_tokenization_spaces"] = false;
  out["tokenizer_class"] = options.tokenizer_class;
  if (options.tokenizer_class == "LlamaTokenizerFast") out["legacy"] = true;
  if (options.model_max_length > 0) out["model_max_length"] = options.model_max_length;
  if (options.chat_template) {
    QSPEC_CHECK(is_valid_utf8(*options.chat_template), "chat template is not valid UTF-8");
    out["chat_template"] = *options.chat_template;
  }
  return out;
}

json generation_config_json(const TokenizerOptions& options) {
  json out = json::object();
  if (options.bos_id) out["bos_token_id"] = *options.bos_id;
  std::vector<int32_t> eos;
  if (options.eos_id) eos.push_back(*options.eos_id);
  for (int32_t id : options.extra_eos_ids)
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  if (eos.size() == 1) out["eos_token_id"] = eos[0];
  else if (!eos.empty()) out["eos_token_id"] = eos;
  if (options.pad_id) out["pad_token_id"] = *options.pad_id;
  return out;
}

// ---- small utilities ----

double shortest_float(float value) {
  char buffer[64];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, static_cast<double>(value));
    if (std::strtof(buffer, nullptr) == value) return std::strtod(buffer, nullptr);
  }
  return static_cast<double>(value);
}

void write_model_directory(const std::string& out_dir, const SafetensorsWriter& weights,
                           const ModelConfig& config, const nlohmann::json& tokenizer,
                           const TokenizerOptions& options, const std::vector<std::string>& tokens) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  QSPEC_CHECK(!error, out_dir, ": cannot create directory: ", error.message());
  const std::filesystem::path out(out_dir);
  weights.write((out / "model.safetensors").string());
  write_json(out / "config.json", llama_config_json(config));
  write_json(out / "tokenizer.json", tokenizer);
  write_json(out / "tokenizer_config.json", tokenizer_config_json(options, tokens));
  write_json(out / "generation_config.json", generation_config_json(options));
}

void write_json(const std::filesystem::path& path, const json& value) {
  std::string text;
  try {
    text = value.dump(2);
  } catch (const json::exception& error) {
    fail(path.string(), ": cannot serialise JSON: ", error.what());
  }
  text += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path.string(), ": cannot open for writing: ", std::strerror(errno));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) fail(path.string(), ": write failed");
}

void warn(const std::string& message) { std::fprintf(stderr, "qspec: warning: %s\n", message.c_str()); }

}  // namespace qspec::hf
