#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "qspec/error.h"
#include "tokenizer/tokenizer.h"

using nlohmann::json;
using qspec::StreamDecoder;
using qspec::Tokenizer;

namespace {

const std::string kData = QSPEC_TEST_DATA "/tokenizers";
const std::string kGsm = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return json::parse(buffer.str());
}

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("qspec_tok_" + name + "_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  return dir;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The legacy Llama-2 form, patched exactly as tools/make_tokenizer_goldens.py does.
std::string make_legacy_llama() {
  static const std::string dir = [] {
    json j = read_json(kData + "/llama2/tokenizer.json");
    j["normalizer"] = json::parse(R"({"type":"Sequence","normalizers":[
        {"type":"Prepend","prepend":"\u2581"},
        {"type":"Replace","pattern":{"String":" "},"content":"\u2581"}]})");
    j["pre_tokenizer"] = nullptr;
    j["model"]["unk_token"] = "<unk>";
    auto d = temp_dir("legacy");
    write_file(d / "tokenizer.json", j.dump());
    return d.string();
  }();
  return dir;
}

// Metaspace pre-tokenizer (always, split) and Metaspace decoder, as the script's variant.
std::string make_metaspace_llama() {
  static const std::string dir = [] {
    json j = read_json(kData + "/llama2/tokenizer.json");
    j["pre_tokenizer"] = json::parse(
        R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true})");
    j["decoder"] = json::parse(
        R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true})");
    auto d = temp_dir("metaspace");
    write_file(d / "tokenizer.json", j.dump());
    return d.string();
  }();
  return dir;
}

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    if (name == "gsm") slot = Tokenizer::load(kGsm);
    else if (name == "llama2-legacy") slot = Tokenizer::load(make_legacy_llama());
    else if (name == "llama2-metaspace") slot = Tokenizer::load(make_metaspace_llama());
    else slot = Tokenizer::load(kData + "/" + name);
  }
  return *slot;
}

std::string load_error(const std::string& path) {
  try {
    Tokenizer::load(path);
  } catch (const qspec::Error& e) {
    return e.what();
  }
  return "";
}

bool valid_utf8_prefix_free(const std::string& s) {
  // Every returned piece must be complete, valid UTF-8.
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

void check_goldens(const std::string& name) {
  const Tokenizer& tok = tokenizer(name);
  const json goldens = read_json(kData + "/goldens_" + name + ".json");
  ASSERT_GT(goldens["cases"].size(), 40u);
  for (const json& c : goldens["cases"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), ids) << name << ": " << text;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << name << ": " << text;
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>()) << name << ": " << text;
    // Streaming gives the same text, in valid UTF-8 pieces.
    StreamDecoder stream(tok, false);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = stream.push(id);
      EXPECT_TRUE(valid_utf8_prefix_free(piece)) << name << ": " << text;
      streamed += piece;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, c["decoded"].get<std::string>()) << name << ": " << text;
  }
}

}  // namespace

TEST(Tokenizer, GoldensQwen25) { check_goldens("qwen2.5"); }
TEST(Tokenizer, GoldensLlama2) { check_goldens("llama2"); }
TEST(Tokenizer, GoldensLlama2Legacy) { check_goldens("llama2-legacy"); }
TEST(Tokenizer, GoldensLlama2Metaspace) { check_goldens("llama2-metaspace"); }
TEST(Tokenizer, GoldensGsm) { check_goldens("gsm"); }

TEST(Tokenizer, GsmGoldenPrompts) {
  const Tokenizer& tok = tokenizer("gsm");
  const json goldens = read_json(kGsm + "/golden_fp32.json");
  ASSERT_EQ(goldens.size(), 16u);
  for (const json& g : goldens) {
    EXPECT_EQ(tok.encode(g["prompt"].get<std::string>()), g["prompt_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(g["greedy_ids"].get<std::vector<int32_t>>(), true), g["greedy_text"].get<std::string>());
  }
}

TEST(Tokenizer, SpecialIdsFromConfigs) {
  const Tokenizer& qwen = tokenizer("qwen2.5");
  EXPECT_EQ(qwen.bos_id, 151643);  // tokenizer_config bos_token is null: config.json
  EXPECT_EQ(qwen.eos_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_FALSE(qwen.add_bos_by_default);
  EXPECT_TRUE(qwen.is_special(151644));
  EXPECT_EQ(qwen.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(qwen.vocab_size(), 151665);
  const Tokenizer& llama = tokenizer("llama2");
  EXPECT_EQ(llama.bos_id, 1);
  EXPECT_EQ(llama.eos_ids, (std::vector<int32_t>{2}));
  EXPECT_TRUE(llama.add_bos_by_default);
  EXPECT_EQ(llama.encode("Hello world", true), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_EQ(llama.id_to_token(15043), "\xE2\x96\x81Hello");
  const Tokenizer& gsm = tokenizer("gsm");
  EXPECT_EQ(gsm.bos_id, 0);
  EXPECT_EQ(gsm.eos_ids, (std::vector<int32_t>{0}));
  EXPECT_FALSE(gsm.add_bos_by_default);
}

TEST(Tokenizer, AddBosFromTemplateProcessing) {
  json j = read_json(kData + "/llama2/tokenizer.json");
  j["post_processor"] = json::parse(R"({"type":"TemplateProcessing",
      "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
      "pair":[], "special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}})");
  auto dir = temp_dir("template");
  write_file(dir / "tokenizer.json", j.dump());
  write_file(dir / "tokenizer_config.json", R"({"bos_token":{"content":"<s>"},"eos_token":"</s>"})");
  write_file(dir / "generation_config.json", R"({"eos_token_id":[2, 7]})");
  auto tok = Tokenizer::load(dir.string());
  EXPECT_TRUE(tok->add_bos_by_default);
  EXPECT_EQ(tok->bos_id, 1);
  EXPECT_EQ(tok->eos_ids, (std::vector<int32_t>{2, 7}));
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, ByteLevelRoundTrip) {
  const std::vector<std::string> texts = {
      "Hello, world!", "  spaces  \t\n\n  ", "emoji 👨‍👩‍👧‍👦 🇫🇷 done", "中文 العربية עברית",
      "<|im_start|>user\nhi<|im_end|>", "\x7f\x01\x02 control", "a\u0301 (qwen refuses NFD; gsm has no NFC)"};
  for (const char* name : {"qwen2.5", "gsm"}) {
    for (const std::string& text : texts) {
      if (std::string(name) == "qwen2.5" && text.find("a\u0301") != std::string::npos) continue;
      EXPECT_EQ(tokenizer(name).decode(tokenizer(name).encode(text)), text) << name << ": " << text;
    }
  }
}

TEST(Tokenizer, InvalidUtf8InputBecomesReplacementCharacter) {
  const Tokenizer& tok = tokenizer("gsm");
  const std::string bad = std::string("ab\xff") + "c\xe4\xb8";
  EXPECT_EQ(tok.decode(tok.encode(bad)), "ab\xEF\xBF\xBD" "c\xEF\xBF\xBD");
}

TEST(Tokenizer, NfcNormalizerRefusesNonNfcText) {
  try {
    tokenizer("qwen2.5").encode("e\xCC\x81");
    FAIL() << "expected an error";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("NFC"), std::string::npos);
  }
  EXPECT_FALSE(tokenizer("qwen2.5").encode("caf\xC3\xA9").empty());
}

TEST(Tokenizer, StreamDecoderHoldsPartialCharacters) {
  const Tokenizer& tok = tokenizer("qwen2.5");
  const std::string text = "ok 😀🙂 中文 👨‍👩‍👧 end";
  const std::vector<int32_t> ids = tok.encode(text);
  // Emoji split into byte tokens: some single ids decode to incomplete UTF-8.
  bool saw_partial = false;
  for (int32_t id : ids) {
    const std::string piece = tok.decode({id});
    if (!valid_utf8_prefix_free(piece)) saw_partial = true;
  }
  EXPECT_TRUE(saw_partial);
  StreamDecoder stream(tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(valid_utf8_prefix_free(piece)) << "partial UTF-8 emitted";
    out += piece;
  }
  out += stream.flush();
  EXPECT_EQ(out, text);
}

TEST(Tokenizer, StreamDecoderLlamaLeadingSpaceAndByteFallback) {
  const Tokenizer& tok = tokenizer("llama2");
  const std::string text = "Hello 😀 world  x";
  const std::vector<int32_t> ids = tok.encode(text);
  StreamDecoder stream(tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(valid_utf8_prefix_free(piece));
    out += piece;
  }
  out += stream.flush();
  EXPECT_EQ(out, text);
  EXPECT_EQ(out, tok.decode(ids));
}

TEST(Tokenizer, StreamDecoderFlushReplacesInvalidBytes) {
  const Tokenizer& tok = tokenizer("llama2");
  // <0xE4> <0xB8> is an unfinished 3-byte character, <0xFF> is never valid.
  const int32_t e4 = *tok.token_to_id("<0xE4>"), b8 = *tok.token_to_id("<0xB8>");
  const int32_t ff = *tok.token_to_id("<0xFF>"), a = *tok.token_to_id("a");
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(a), "a");
  EXPECT_EQ(stream.push(e4), "");
  EXPECT_EQ(stream.push(b8), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  StreamDecoder stream2(tok);
  EXPECT_EQ(stream2.push(ff), "\xEF\xBF\xBD");
  EXPECT_EQ(stream2.push(e4), "");
  EXPECT_EQ(stream2.push(a), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(stream2.flush(), "");
  EXPECT_EQ(tok.decode({a, e4, b8}), "a\xE4\xB8");  // decode returns the raw bytes
}

TEST(Tokenizer, SkipSpecialInStream) {
  const Tokenizer& tok = tokenizer("qwen2.5");
  const std::vector<int32_t> ids = tok.encode("<|im_start|>hi<|im_end|>");
  StreamDecoder stream(tok, true);
  std::string out;
  for (int32_t id : ids) out += stream.push(id);
  out += stream.flush();
  EXPECT_EQ(out, "hi");
}

TEST(Tokenizer, EncodesHundredKilobytesQuickly) {
  std::string text;
  const json goldens = read_json(kData + "/goldens_qwen2.5.json");
  size_t i = 0;
  while (text.size() < 100000) {
    text += goldens["cases"][i % goldens["cases"].size()]["text"].get<std::string>();
    text += ' ';
    text += std::to_string(i * 7919);
    text += '\n';
    ++i;
  }
  for (const char* name : {"qwen2.5", "llama2", "llama2-legacy", "gsm"}) {
    const Tokenizer& tok = tokenizer(name);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok.encode(text);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 0.5) << name;
    EXPECT_GT(ids.size(), 10000u);
    if (std::string(name) != "llama2-legacy" && std::string(name) != "llama2") {
      EXPECT_EQ(tok.decode(ids), text) << name;
    }
  }
}

TEST(Tokenizer, LoadErrors) {
  auto dir = temp_dir("errors");
  write_file(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
  std::string error = load_error(dir.string());
  EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;
  EXPECT_NE(error.find("malformed JSON"), std::string::npos) << error;

  const std::string model = R"("model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]})";
  write_file(dir / "tokenizer.json", "{" + model + R"(,"normalizer":{"type":"Lowercase"}})");
  error = load_error(dir.string());
  EXPECT_NE(error.find("Lowercase"), std::string::npos) << error;
  EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;

  write_file(dir / "tokenizer.json", "{" + model + R"(,"pre_tokenizer":{"type":"BertPreTokenizer"}})");
  error = load_error(dir.string());
  EXPECT_NE(error.find("BertPreTokenizer"), std::string::npos) << error;

  write_file(dir / "tokenizer.json", "{" + model + R"(,"decoder":{"type":"WordPiece"}})");
  error = load_error(dir.string());
  EXPECT_NE(error.find("WordPiece"), std::string::npos) << error;

  write_file(dir / "tokenizer.json", R"({"model":{"type":"Unigram","vocab":[]}})");
  error = load_error(dir.string());
  EXPECT_NE(error.find("Unigram"), std::string::npos) << error;

  write_file(dir / "tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","b"]]}})");
  error = load_error(dir.string());
  EXPECT_NE(error.find("merge"), std::string::npos) << error;

  write_file(dir / "tokenizer.json", R"({"model":{"type":"BPE","vocab":"oops"}})");
  error = load_error(dir.string());
  EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;

  // Array-form merges and a tiny pipeline: Split + Digits.
  write_file(dir / "tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"1":3,"2":4},
      "merges":[["a","b"]]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"String":" "},"behavior":"Removed","invert":false},
      {"type":"Digits","individual_digits":true}]}})");
  auto tok = Tokenizer::load((dir / "tokenizer.json").string());
  EXPECT_EQ(tok->encode("ab a12b"), (std::vector<int32_t>{2, 0, 3, 4, 1}));
  EXPECT_EQ(load_error((dir / "missing.json").string()).find("cannot open") != std::string::npos, true);
  std::filesystem::remove_all(dir);
}
