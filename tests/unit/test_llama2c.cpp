// llama2.c importer: tensor names, shapes and placement on a hand-made checkpoint, the Q/K
// row permutation (interleaved RoPE == rotate_half RoPE after it), the tokenizer.json built
// from tokenizer.bin, and stories260K's converted vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/convert.h"
#include "io/safetensors.h"
#include "qspec/error.h"
#include "tokenizer/tokenizer.h"
#include "cli_run.h"  // error_of

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("qspec-llama2c-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

using qspec_test::error_of;

// A tiny llama2.c checkpoint: dim 8, hidden 12, 2 layers, 2 heads (head size 4), 1 kv head,
// vocab 8 with an unshared classifier (negative vocab_size), seq_len 4.
struct TinyLlama2c {
  int32_t dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 8, seq_len = 4;
  int32_t head_dim() const { return dim / heads; }
  int32_t kv_dim() const { return head_dim() * kv_heads; }
  // name -> values, in file order
  std::vector<std::pair<std::string, std::vector<float>>> arrays;

  explicit TinyLlama2c(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto make = [&](const std::string& name, size_t n) {
      std::vector<float> values(n);
      for (float& v : values) v = normal(rng);
      arrays.emplace_back(name, std::move(values));
    };
    const size_t D = dim, H = hidden, L = layers, K = kv_dim(), V = vocab;
    make("token_embedding", V * D);
    make("rms_att", L * D);
    make("wq", L * D * D);
    make("wk", L * K * D);
    make("wv", L * K * D);
    make("wo", L * D * D);
    make("rms_ffn", L * D);
    make("w1", L * H * D);
    make("w2", L * D * H);
    make("w3", L * H * D);
    make("rms_final", D);
    make("freq_cis_real", static_cast<size_t>(seq_len) * head_dim() / 2);
    make("freq_cis_imag", static_cast<size_t>(seq_len) * head_dim() / 2);
    make("wcls", V * D);
  }
  const std::vector<float>& get(const std::string& name) const {
    for (const auto& [n, v] : arrays)
      if (n == name) return v;
    throw std::runtime_error("no array " + name);
  }
  void write(const fs::path& path, size_t drop_bytes = 0) const {
    std::string bytes;
    int32_t header[7] = {dim, hidden, layers, heads, kv_heads, -vocab, seq_len};
    bytes.append(reinterpret_cast<const char*>(header), sizeof header);
    for (const auto& [name, values] : arrays)
      bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    bytes.resize(bytes.size() - drop_bytes);
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
};

void write_tokenizer_bin(const fs::path& path, const std::vector<std::pair<std::string, float>>& tokens,
                         size_t extra_bytes = 0) {
  std::string bytes;
  auto put = [&](const void* data, size_t n) { bytes.append(static_cast<const char*>(data), n); };
  int32_t max_len = 0;
  for (const auto& token : tokens) max_len = std::max<int32_t>(max_len, static_cast<int32_t>(token.first.size()));
  put(&max_len, 4);
  for (const auto& [piece, score] : tokens) {
    int32_t len = static_cast<int32_t>(piece.size());
    put(&score, 4);
    put(&len, 4);
    put(piece.data(), piece.size());
  }
  bytes.append(extra_bytes, '\0');
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const std::vector<std::pair<std::string, float>> kTinyVocab = {
    {"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}, {"<0x0A>", 0.0f},
    {" a", -1.0f},   {" ", -5.0f},      {"a", -6.0f},        {"b", -7.0f},
};

std::vector<float> tensor_values(const qspec::TensorView& view) {
  EXPECT_EQ(view.dtype, qspec::DType::F32) << view.name;
  std::vector<float> out(view.nbytes / sizeof(float));
  std::memcpy(out.data(), view.data, view.nbytes);
  return out;
}

// y = W x for a row-major [rows, cols] W.
std::vector<double> matvec(const std::vector<float>& w, const std::vector<float>& x, size_t rows, size_t offset = 0) {
  const size_t cols = x.size();
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) y[r] += static_cast<double>(w[offset + r * cols + c]) * x[c];
  return y;
}

}  // namespace

TEST(Llama2c, TensorNamesShapesAndPlacement) {
  fs::path dir = temp_dir("names");
  TinyLlama2c model(7);
  model.write(dir / "model.bin");
  write_tokenizer_bin(dir / "tok.bin", kTinyVocab);
  std::vector<std::pair<size_t, size_t>> progress;
  qspec::convert_llama2c((dir / "model.bin").string(), (dir / "tok.bin").string(), (dir / "out").string(),
                         [&](size_t done, size_t total) { progress.emplace_back(done, total); });
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().first, progress.back().second);

  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json"})
    EXPECT_TRUE(fs::exists(dir / "out" / file)) << file;

  auto st = qspec::SafetensorsFile::open((dir / "out" / "model.safetensors").string());
  const int64_t D = model.dim, H = model.hidden, K = model.kv_dim(), V = model.vocab;
  std::map<std::string, std::vector<int64_t>> want = {
      {"model.embed_tokens.weight", {V, D}}, {"model.norm.weight", {D}}, {"lm_head.weight", {V, D}}};
  for (int l = 0; l < model.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    want[p + "input_layernorm.weight"] = {D};
    want[p + "post_attention_layernorm.weight"] = {D};
    want[p + "self_attn.q_proj.weight"] = {D, D};
    want[p + "self_attn.k_proj.weight"] = {K, D};
    want[p + "self_attn.v_proj.weight"] = {K, D};
    want[p + "self_attn.o_proj.weight"] = {D, D};
    want[p + "mlp.gate_proj.weight"] = {H, D};
    want[p + "mlp.up_proj.weight"] = {H, D};
    want[p + "mlp.down_proj.weight"] = {D, H};
  }
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto& view : st->tensors()) {
    got[view.name] = view.shape;
    EXPECT_EQ(view.dtype, qspec::DType::F32) << view.name;
  }
  EXPECT_EQ(got, want);

  // Unpermuted tensors are copied verbatim from their slot of the file.
  auto slice = [&](const std::string& array, size_t layer, size_t per_layer) {
    const auto& all = model.get(array);
    return std::vector<float>(all.begin() + layer * per_layer, all.begin() + (layer + 1) * per_layer);
  };
  EXPECT_EQ(tensor_values(*st->find("model.embed_tokens.weight")), model.get("token_embedding"));
  EXPECT_EQ(tensor_values(*st->find("lm_head.weight")), model.get("wcls"));
  EXPECT_EQ(tensor_values(*st->find("model.norm.weight")), model.get("rms_final"));
  EXPECT_EQ(tensor_values(*st->find("model.layers.1.input_layernorm.weight")), slice("rms_att", 1, D));
  EXPECT_EQ(tensor_values(*st->find("model.layers.1.post_attention_layernorm.weight")), slice("rms_ffn", 1, D));
  EXPECT_EQ(tensor_values(*st->find("model.layers.1.self_attn.v_proj.weight")), slice("wv", 1, K * D));
  EXPECT_EQ(tensor_values(*st->find("model.layers.1.self_attn.o_proj.weight")), slice("wo", 1, D * D));
  EXPECT_EQ(tensor_values(*st->find("model.layers.1.mlp.gate_proj.weight")), slice("w1", 1, H * D));
  EXPECT_EQ(tensor_values(*st->find("model.layers.1.mlp.down_proj.weight")), slice("w2", 1, D * H));
  EXPECT_EQ(tensor_values(*st->find("model.layers.1.mlp.up_proj.weight")), slice("w3", 1, H * D));

  // q/k rows: HF row h*hd + i <- llama2.c row h*hd + 2i; HF row h*hd + hd/2 + i <- h*hd + 2i + 1.
  const size_t hd = model.head_dim(), half = hd / 2;
  for (int l = 0; l < model.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    struct Case {
      const char* hf;
      const char* array;
      size_t heads;
    } cases[] = {{"q_proj.weight", "wq", static_cast<size_t>(model.heads)},
                 {"k_proj.weight", "wk", static_cast<size_t>(model.kv_heads)}};
    for (const Case& c : cases) {
      const std::vector<float> src = slice(c.array, l, c.heads * hd * D);
      const std::vector<float> dst = tensor_values(*st->find(p + c.hf));
      for (size_t h = 0; h < c.heads; ++h)
        for (size_t i = 0; i < half; ++i)
          for (size_t j = 0; j < 2; ++j)
            for (size_t col = 0; col < static_cast<size_t>(D); ++col)
              ASSERT_EQ(dst[(h * hd + j * half + i) * D + col], src[(h * hd + 2 * i + j) * D + col])
                  << c.hf << " layer " << l << " head " << h << " i " << i << " j " << j;
    }
  }
  fs::remove_all(dir);
}

// Interleaved RoPE (llama2.c) on the original q/k equals rotate_half RoPE (transformers) on
// the converted q/k, so attention scores match.
TEST(Llama2c, PermutedQkGiveSameAttentionScoresUnderRotateHalf) {
  fs::path dir = temp_dir("rope");
  TinyLlama2c model(11);
  model.write(dir / "model.bin");
  write_tokenizer_bin(dir / "tok.bin", kTinyVocab);
  qspec::convert_llama2c((dir / "model.bin").string(), (dir / "tok.bin").string(), (dir / "out").string());
  auto st = qspec::SafetensorsFile::open((dir / "out" / "model.safetensors").string());

  const size_t D = model.dim, hd = model.head_dim(), half = hd / 2, K = model.kv_dim();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> xq(D), xk(D);
  for (float& v : xq) v = normal(rng);
  for (float& v : xk) v = normal(rng);
  const int pos_q = 3, pos_k = 1;
  auto theta = [&](size_t i, int pos) { return pos * std::pow(10000.0, -2.0 * static_cast<double>(i) / hd); };

  for (int l = 0; l < model.layers; ++l) {
    // llama2.c: rotate (2i, 2i+1).
    std::vector<double> q = matvec(model.get("wq"), xq, D, l * D * D);
    std::vector<double> k = matvec(model.get("wk"), xk, K, l * K * D);
    auto rope_pairs = [&](std::vector<double>& v, int pos) {
      for (size_t base = 0; base < v.size(); base += hd)
        for (size_t i = 0; i < half; ++i) {
          double c = std::cos(theta(i, pos)), s = std::sin(theta(i, pos));
          double a = v[base + 2 * i], b = v[base + 2 * i + 1];
          v[base + 2 * i] = a * c - b * s;
          v[base + 2 * i + 1] = a * s + b * c;
        }
    };
    rope_pairs(q, pos_q);
    rope_pairs(k, pos_k);
    // transformers: rotate (i, i + hd/2) of the converted projections.
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    std::vector<double> q2 = matvec(tensor_values(*st->find(p + "q_proj.weight")), xq, D);
    std::vector<double> k2 = matvec(tensor_values(*st->find(p + "k_proj.weight")), xk, K);
    auto rope_half = [&](std::vector<double>& v, int pos) {
      for (size_t base = 0; base < v.size(); base += hd)
        for (size_t i = 0; i < half; ++i) {
          double c = std::cos(theta(i, pos)), s = std::sin(theta(i, pos));
          double a = v[base + i], b = v[base + i + half];
          v[base + i] = a * c - b * s;
          v[base + i + half] = a * s + b * c;
        }
    };
    rope_half(q2, pos_q);
    rope_half(k2, pos_k);
    const size_t group = static_cast<size_t>(model.heads / model.kv_heads);
    for (size_t h = 0; h < static_cast<size_t>(model.heads); ++h) {
      const size_t kv = h / group;
      double score = 0, score2 = 0;
      for (size_t d = 0; d < hd; ++d) {
        score += q[h * hd + d] * k[kv * hd + d];
        score2 += q2[h * hd + d] * k2[kv * hd + d];
      }
      EXPECT_NEAR(score, score2, 1e-9 * (1 + std::fabs(score))) << "layer " << l << " head " << h;
    }
  }
  fs::remove_all(dir);
}

TEST(Llama2c, ConfigAndTokenizerFiles) {
  fs::path dir = temp_dir("tok");
  TinyLlama2c model(5);
  model.write(dir / "model.bin");
  write_tokenizer_bin(dir / "tok.bin", kTinyVocab);
  qspec::convert_llama2c((dir / "model.bin").string(), (dir / "tok.bin").string(), (dir / "out").string());

  json config = read_json(dir / "out" / "config.json");
  EXPECT_EQ(config["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["hidden_size"], 8);
  EXPECT_EQ(config["intermediate_size"], 12);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 2);
  EXPECT_EQ(config["num_key_value_heads"], 1);
  EXPECT_EQ(config["head_dim"], 4);
  EXPECT_EQ(config["vocab_size"], 8);
  EXPECT_EQ(config["max_position_embeddings"], 4);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);
  EXPECT_EQ(config["rope_theta"], 10000.0);
  EXPECT_EQ(config["bos_token_id"], 1);
  EXPECT_EQ(config["eos_token_id"], 2);
  EXPECT_EQ(config["torch_dtype"], "float32");

  json tok = read_json(dir / "out" / "tokenizer.json");
  const json& vocab = tok["model"]["vocab"];
  EXPECT_EQ(tok["model"]["type"], "BPE");
  EXPECT_EQ(tok["model"]["byte_fallback"], true);
  EXPECT_EQ(tok["model"]["unk_token"], "<unk>");
  EXPECT_EQ(vocab["<unk>"], 0);
  EXPECT_EQ(vocab["<s>"], 1);
  EXPECT_EQ(vocab["</s>"], 2);
  EXPECT_EQ(vocab["<0x0A>"], 3);
  EXPECT_EQ(vocab["\xe2\x96\x81" "a"], 4);  // " a" -> "▁a"
  EXPECT_EQ(vocab["\xe2\x96\x81"], 5);
  EXPECT_FALSE(vocab.contains(" a"));
  // "▁a" = "▁" + "a" is the only merge.
  EXPECT_EQ(tok["model"]["merges"], json::array({"\xe2\x96\x81 a"}));
  ASSERT_EQ(tok["added_tokens"].size(), 3u);
  for (int id = 0; id < 3; ++id) {
    EXPECT_EQ(tok["added_tokens"][id]["id"], id);
    EXPECT_EQ(tok["added_tokens"][id]["special"], true);
  }
  EXPECT_EQ(tok["added_tokens"][1]["content"], "<s>");
  EXPECT_EQ(tok["normalizer"]["type"], "Sequence");
  EXPECT_EQ(tok["normalizer"]["normalizers"][0], json({{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}}));
  EXPECT_EQ(tok["normalizer"]["normalizers"][1]["type"], "Replace");
  EXPECT_TRUE(tok["pre_tokenizer"].is_null());
  const json& decoders = tok["decoder"]["decoders"];
  ASSERT_EQ(decoders.size(), 4u);
  EXPECT_EQ(decoders[0]["type"], "Replace");
  EXPECT_EQ(decoders[1]["type"], "ByteFallback");
  EXPECT_EQ(decoders[2]["type"], "Fuse");
  EXPECT_EQ(decoders[3], json({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}));

  json tok_config = read_json(dir / "out" / "tokenizer_config.json");
  EXPECT_EQ(tok_config["bos_token"], "<s>");
  EXPECT_EQ(tok_config["eos_token"], "</s>");
  EXPECT_EQ(tok_config["unk_token"], "<unk>");
  EXPECT_EQ(tok_config["add_bos_token"], true);
  json gen = read_json(dir / "out" / "generation_config.json");
  EXPECT_EQ(gen["bos_token_id"], 1);
  EXPECT_EQ(gen["eos_token_id"], 2);
  fs::remove_all(dir);
}

TEST(Llama2c, RejectsBrokenInputs) {
  fs::path dir = temp_dir("bad");
  TinyLlama2c model(1);
  model.write(dir / "short.bin", 4);
  model.write(dir / "model.bin");
  write_tokenizer_bin(dir / "tok.bin", kTinyVocab);
  std::string error = error_of([&] {
    qspec::convert_llama2c((dir / "short.bin").string(), (dir / "tok.bin").string(), (dir / "o1").string());
  });
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  EXPECT_NE(error.find("short.bin"), std::string::npos) << error;

  // Too few tokens for the model's vocab_size.
  write_tokenizer_bin(dir / "tok5.bin", {kTinyVocab.begin(), kTinyVocab.begin() + 5});
  error = error_of([&] {
    qspec::convert_llama2c((dir / "model.bin").string(), (dir / "tok5.bin").string(), (dir / "o2").string());
  });
  EXPECT_NE(error.find("tok5.bin"), std::string::npos) << error;
  // Bytes left over after vocab_size tokens.
  write_tokenizer_bin(dir / "tok_extra.bin", kTinyVocab, 3);
  error = error_of([&] {
    qspec::convert_llama2c((dir / "model.bin").string(), (dir / "tok_extra.bin").string(), (dir / "o3").string());
  });
  EXPECT_NE(error.find("left after"), std::string::npos) << error;
  // A header that is not llama2.c.
  {
    std::ofstream out(dir / "junk.bin", std::ios::binary);
    int32_t header[7] = {0, -3, 1, 1, 1, 8, 4};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
  }
  error = error_of([&] {
    qspec::convert_llama2c((dir / "junk.bin").string(), (dir / "tok.bin").string(), (dir / "o4").string());
  });
  EXPECT_NE(error.find("not a llama2.c checkpoint"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir / "o1" / "model.safetensors"));
  fs::remove_all(dir);
}

// The bundled stories260K: shapes from its header, and the tokenizer built from tok512.bin
// encodes as llama2.c's run.c does (ids from run.c's encode, computed offline).
TEST(Llama2c, Stories260KVocabularyAndEncoding) {
  const std::string source = QSPEC_SOURCE_DIR "/models/stories260K";
  fs::path dir = temp_dir("stories");
  qspec::convert_llama2c(source + "/stories260K.bin", source + "/tok512.bin", dir.string());

  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["intermediate_size"], 172);
  EXPECT_EQ(config["num_hidden_layers"], 5);
  EXPECT_EQ(config["num_attention_heads"], 8);
  EXPECT_EQ(config["num_key_value_heads"], 4);
  EXPECT_EQ(config["vocab_size"], 512);
  EXPECT_EQ(config["max_position_embeddings"], 512);
  EXPECT_EQ(config["tie_word_embeddings"], true);

  auto st = qspec::SafetensorsFile::open((dir / "model.safetensors").string());
  EXPECT_EQ(st->find("lm_head.weight"), nullptr);
  ASSERT_NE(st->find("model.layers.4.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(st->find("model.layers.4.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(st->find("model.layers.4.mlp.down_proj.weight")->shape, (std::vector<int64_t>{64, 172}));

  json tok = read_json(dir / "tokenizer.json");
  const json& vocab = tok["model"]["vocab"];
  EXPECT_EQ(vocab.size(), 512u);
  EXPECT_EQ(vocab["<s>"], 1);
  EXPECT_EQ(vocab["<0x00>"], 3);
  EXPECT_EQ(vocab["<0xFF>"], 258);
  EXPECT_EQ(vocab["\xe2\x96\x81t"], 259);
  EXPECT_EQ(vocab["\xe2\x96\x81"], 410);
  // Highest score first: " t" (score -0) is the first merge, "he" (-1) the second.
  ASSERT_GE(tok["model"]["merges"].size(), 2u);
  EXPECT_EQ(tok["model"]["merges"][0], "\xe2\x96\x81 t");
  EXPECT_EQ(tok["model"]["merges"][1], "h e");

  auto tokenizer = qspec::Tokenizer::load(dir.string());
  ASSERT_TRUE(tokenizer->bos_id.has_value());
  EXPECT_EQ(*tokenizer->bos_id, 1);
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const std::vector<int32_t> run_c_ids = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};
  EXPECT_EQ(tokenizer->encode(text), run_c_ids);
  EXPECT_EQ(tokenizer->decode(run_c_ids), text);
  const std::vector<int32_t> fallback_ids = {346, 306, 414, 263, 304, 341, 443, 410, 475, 479, 472, 410, 198, 191};
  EXPECT_EQ(tokenizer->encode("Hello world! 123 \xc3\xbc"), fallback_ids);
  EXPECT_EQ(tokenizer->decode(fallback_ids), "Hello world! 123 \xc3\xbc");
  fs::remove_all(dir);
}
