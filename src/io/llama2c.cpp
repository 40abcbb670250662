// llama2.c import: the legacy (version 0) checkpoint of llama2.c's run.c and its
// tokenizer.bin, written out as a Hugging Face Llama directory.
//
// Checkpoint: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
// a negative vocab_size means the classifier is not shared with the embedding), then f32
// arrays token_embedding[vocab][dim], rms_att[L][dim], wq[L][dim][dim],
// wk[L][kv_dim][dim], wv[L][kv_dim][dim], wo[L][dim][dim], rms_ffn[L][dim],
// w1[L][hidden][dim], w2[L][dim][hidden], w3[L][hidden][dim], rms_final[dim],
// freq_cis_real[seq_len][head_size/2], freq_cis_imag[same], and wcls[vocab][dim] when not
// shared. Matrices are [out][in], as torch.nn.Linear stores them.
//
// Tokenizer: int32 max_token_length, then per token f32 score, int32 length, bytes.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "io/convert.h"
#include "io/hf_writer.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "qspec/error.h"

namespace qspec {

namespace {

struct Llama2cHeader {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& path) {
  uint64_t out;
  QSPEC_CHECK(!__builtin_mul_overflow(a, b, &out), path, ": tensor sizes overflow");
  return out;
}

bool is_byte_piece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return false;
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return hex(piece[3]) && hex(piece[4]);
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  size_t pos = 0;
  while ((pos = text.find(from, pos)) != std::string::npos) {
    text.replace(pos, from.size(), to);
    pos += to.size();
  }
  return text;
}

hf::SentencepieceVocab read_tokenizer_bin(const std::string& path, int64_t vocab_size) {
  hf::MappedFile file(path);
  const uint8_t* data = file.data();
  const size_t size = file.size();
  size_t at = 0;
  auto read_i32 = [&](const char* what, int64_t index) {
    if (size - at < 4) fail(path, ": truncated reading ", what, " of token ", index, " at byte ", at);
    int32_t value;
    std::memcpy(&value, data + at, 4);
    at += 4;
    return value;
  };
  QSPEC_CHECK(size >= 4, path, ": truncated (", size, " bytes): no max_token_length");
  int32_t max_token_length = read_i32("max_token_length", -1);
  QSPEC_CHECK(max_token_length > 0, path, ": max_token_length ", max_token_length, " must be positive");

  hf::SentencepieceVocab vocab;
  vocab.pieces.reserve(static_cast<size_t>(vocab_size));
  for (int64_t id = 0; id < vocab_size; ++id) {
    int32_t score_bits = read_i32("score", id);
    float score;
    std::memcpy(&score, &score_bits, 4);
    QSPEC_CHECK(std::isfinite(score), path, ": token ", id, " has a non-finite score");
    int32_t length = read_i32("length", id);
    QSPEC_CHECK(length >= 0 && static_cast<size_t>(length) <= size - at, path, ": token ", id,
                " claims ", length, " bytes but ", size - at, " remain");
    std::string piece(reinterpret_cast<const char*>(data + at), static_cast<size_t>(length));
    at += static_cast<size_t>(length);
    vocab.pieces.push_back(std::move(piece));
    vocab.scores.push_back(score);
  }
  QSPEC_CHECK(at == size, path, ": ", size - at, " bytes left after ", vocab_size,
              " tokens (does the tokenizer belong to this model?)");

  // llama2.c's export: ids 0, 1, 2 are <unk>, <s> and </s> (bos/eos are written as
  // "\n<s>\n" / "\n</s>\n" so run.c prints them as line breaks); spaces are ' ' where
  // sentencepiece has '▁'; byte pieces are <0xAB>.
  vocab.kinds.assign(vocab.pieces.size(), hf::TokenKind::Normal);
  QSPEC_CHECK(vocab_size >= 3, path, ": vocabulary of ", vocab_size, " tokens has no <unk>, <s>, </s>");
  const char* specials[3] = {"<unk>", "<s>", "</s>"};
  for (size_t id = 0; id < 3; ++id) {
    vocab.pieces[id] = specials[id];
    vocab.kinds[id] = id == 0 ? hf::TokenKind::Unknown : hf::TokenKind::Control;
  }
  for (size_t id = 3; id < vocab.pieces.size(); ++id) {
    std::string& piece = vocab.pieces[id];
    if (is_byte_piece(piece)) {
      vocab.kinds[id] = hf::TokenKind::Byte;
    } else {
      piece = replace_all(piece, " ", "\xe2\x96\x81");
    }
  }
  vocab.unk_id = 0;
  vocab.bos_id = 1;
  vocab.add_space_prefix = true;
  vocab.add_bos = true;
  return vocab;
}

}  // namespace

void convert_llama2c(const std::string& model_bin, const std::string& tokenizer_bin,
                     const std::string& out_dir, const ProgressFn& progress) {
  hf::MappedFile file(model_bin);
  const std::string& path = model_bin;
  QSPEC_CHECK(file.size() >= sizeof(Llama2cHeader), path, ": truncated (", file.size(),
              " bytes): the llama2.c header needs 28");
  uint32_t magic;
  std::memcpy(&magic, file.data(), 4);
  QSPEC_CHECK(magic != 0x616b3432u, path,
              ": llama2.c version 1/2 export (magic 'ak42') is not supported; export with "
              "--version 0 (legacy) instead");
  Llama2cHeader header;
  std::memcpy(&header, file.data(), sizeof header);
  const bool shared_classifier = header.vocab_size > 0;
  const int64_t vocab_size = std::abs(static_cast<int64_t>(header.vocab_size));
  QSPEC_CHECK(header.dim > 0 && header.hidden_dim > 0 && header.n_layers > 0 && header.n_heads > 0 &&
                  header.n_kv_heads > 0 && vocab_size > 0 && header.seq_len > 0,
              path, ": not a llama2.c checkpoint (header dim=", header.dim, " hidden_dim=",
              header.hidden_dim, " n_layers=", header.n_layers, " n_heads=", header.n_heads,
              " n_kv_heads=", header.n_kv_heads, " vocab_size=", header.vocab_size,
              " seq_len=", header.seq_len, ")");
  QSPEC_CHECK(header.dim % header.n_heads == 0, path, ": dim ", header.dim,
              " is not a multiple of n_heads ", header.n_heads);
  QSPEC_CHECK(header.n_heads % header.n_kv_heads == 0, path, ": n_heads ", header.n_heads,
              " is not a multiple of n_kv_heads ", header.n_kv_heads);
  const int64_t dim = header.dim, hidden = header.hidden_dim, layers = header.n_layers;
  const int64_t head_dim = dim / header.n_heads;
  QSPEC_CHECK(head_dim % 2 == 0, path, ": head size ", head_dim, " is odd (RoPE needs pairs)");
  const int64_t kv_dim = head_dim * header.n_kv_heads;

  // Expected size, every product checked (the header values are untrusted).
  auto mul = [&](std::initializer_list<uint64_t> factors) {
    uint64_t out = 1;
    for (uint64_t factor : factors) out = checked_mul(out, factor, path);
    return out;
  };
  const uint64_t L = static_cast<uint64_t>(layers), D = static_cast<uint64_t>(dim),
                 H = static_cast<uint64_t>(hidden), K = static_cast<uint64_t>(kv_dim),
                 V = static_cast<uint64_t>(vocab_size), S = static_cast<uint64_t>(header.seq_len),
                 HD = static_cast<uint64_t>(head_dim);
  struct Array {
    const char* name;
    uint64_t floats;
  };
  const Array arrays[] = {
      {"token_embedding", mul({V, D})}, {"rms_att", mul({L, D})},      {"wq", mul({L, D, D})},
      {"wk", mul({L, K, D})},           {"wv", mul({L, K, D})},        {"wo", mul({L, D, D})},
      {"rms_ffn", mul({L, D})},         {"w1", mul({L, H, D})},        {"w2", mul({L, D, H})},
      {"w3", mul({L, H, D})},           {"rms_final", D},              {"freq_cis_real", mul({S, HD / 2})},
      {"freq_cis_imag", mul({S, HD / 2})}, {"wcls", shared_classifier ? 0 : mul({V, D})},
  };
  uint64_t total_floats = 0;
  for (const Array& array : arrays) {
    QSPEC_CHECK(!__builtin_add_overflow(total_floats, array.floats, &total_floats), path,
                ": tensor sizes overflow");
  }
  const uint64_t expected = checked_mul(total_floats, 4, path) + sizeof(Llama2cHeader);
  QSPEC_CHECK(file.size() == expected, path, ": ", file.size(), " bytes, but the header (dim=", dim,
              " hidden_dim=", hidden, " n_layers=", layers, " n_heads=", header.n_heads,
              " n_kv_heads=", header.n_kv_heads, " vocab_size=", header.vocab_size, " seq_len=",
              header.seq_len, ") implies ", expected,
              file.size() < expected ? " (truncated?)" : " (not a legacy llama2.c checkpoint?)");

  // Offsets of each array (in floats from the first weight).
  const float* base = reinterpret_cast<const float*>(file.data() + sizeof(Llama2cHeader));
  const float* pointers[std::size(arrays)];
  {
    const float* at = base;
    for (size_t i = 0; i < std::size(arrays); ++i) {
      pointers[i] = at;
      at += arrays[i].floats;
    }
  }
  enum { kEmbed, kRmsAtt, kWq, kWk, kWv, kWo, kRmsFfn, kW1, kW2, kW3, kRmsFinal, kFreqR, kFreqI, kWcls };

  hf::SentencepieceVocab vocab = read_tokenizer_bin(tokenizer_bin, vocab_size);

  const size_t total_steps = static_cast<size_t>(layers) + 3;
  size_t step = 0;
  auto report = [&] {
    ++step;
    if (progress) progress(step, total_steps);
  };

  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  auto add = [&](const std::string& name, std::vector<int64_t> shape, const float* data) {
    size_t count = 1;
    for (int64_t extent : shape) count *= static_cast<size_t>(extent);
    writer.add(name, DType::F32, std::move(shape), data, count * sizeof(float));
  };
  // Every array is 4-byte aligned in memory: mmap is page aligned and the header is 28 bytes.
  add("model.embed_tokens.weight", {vocab_size, dim}, pointers[kEmbed]);
  report();
  std::vector<float> scratch;
  for (int64_t l = 0; l < layers; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    const size_t ul = static_cast<size_t>(l);
    add(prefix + "input_layernorm.weight", {dim}, pointers[kRmsAtt] + ul * D);
    add(prefix + "post_attention_layernorm.weight", {dim}, pointers[kRmsFfn] + ul * D);

    const float* wq = pointers[kWq] + ul * D * D;
    scratch.assign(wq, wq + D * D);
    hf::interleaved_to_half_rows(scratch.data(), header.n_heads, head_dim, dim);
    add(prefix + "self_attn.q_proj.weight", {dim, dim}, scratch.data());

    const float* wk = pointers[kWk] + ul * K * D;
    scratch.assign(wk, wk + K * D);
    hf::interleaved_to_half_rows(scratch.data(), header.n_kv_heads, head_dim, dim);
    add(prefix + "self_attn.k_proj.weight", {kv_dim, dim}, scratch.data());

    add(prefix + "self_attn.v_proj.weight", {kv_dim, dim}, pointers[kWv] + ul * K * D);
    add(prefix + "self_attn.o_proj.weight", {dim, dim}, pointers[kWo] + ul * D * D);
    add(prefix + "mlp.gate_proj.weight", {hidden, dim}, pointers[kW1] + ul * H * D);
    add(prefix + "mlp.down_proj.weight", {dim, hidden}, pointers[kW2] + ul * D * H);
    add(prefix + "mlp.up_proj.weight", {hidden, dim}, pointers[kW3] + ul * H * D);
    report();
  }
  add("model.norm.weight", {dim}, pointers[kRmsFinal]);
  if (!shared_classifier) add("lm_head.weight", {vocab_size, dim}, pointers[kWcls]);

  ModelConfig config;
  config.architecture_name = architecture_name(Architecture::Llama);
  config.vocab_size = vocab_size;
  config.hidden_size = dim;
  config.intermediate_size = hidden;
  config.num_layers = layers;
  config.num_heads = header.n_heads;
  config.num_kv_heads = header.n_kv_heads;
  config.head_dim = head_dim;
  config.max_position_embeddings = header.seq_len;
  config.rms_norm_eps = 1e-5;
  config.rope.theta = 10000.0;
  config.tie_word_embeddings = shared_classifier;
  config.bos_token_id = 1;
  config.eos_token_ids = {2};
  config.torch_dtype = "float32";

  hf::TokenizerOptions options;
  options.bos_id = 1;
  options.eos_id = 2;
  options.unk_id = 0;
  options.add_bos = true;
  options.add_eos = false;
  options.tokenizer_class = "LlamaTokenizerFast";
  options.model_max_length = header.seq_len;

  nlohmann::json tokenizer = hf::sentencepiece_tokenizer_json(vocab);
  report();

  hf::write_model_directory(out_dir, writer, config, tokenizer, options, vocab.pieces);
  report();
}

}  // namespace qspec
