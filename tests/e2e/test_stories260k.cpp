// llama2.c import end to end: stories260K converted to a Hugging Face directory must
// reproduce llama2.c's own greedy output (models/stories260K/stories260K.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/convert.h"
#include "model/llama.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

TEST(Stories260K, ConvertedGreedyContinuationMatchesLlama2c) {
  const std::string source = QSPEC_SOURCE_DIR "/models/stories260K";
  const auto out_dir = std::filesystem::temp_directory_path() / ("qspec-stories260k-" + std::to_string(::getpid()));
  qspec::convert_llama2c(source + "/stories260K.bin", source + "/tok512.bin", out_dir.string());

  std::ifstream md(source + "/stories260K.md");
  std::stringstream text;
  text << md.rdbuf();
  const std::string marker = "-t 0.0\n";
  const std::string doc = text.str();
  const size_t begin = doc.find(marker);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc.find("\n```", begin);
  const std::string expected = doc.substr(begin + marker.size(), end - begin - marker.size());

  auto model = qspec::LlamaModel::load(out_dir.string());
  auto tokenizer = qspec::Tokenizer::load(out_dir.string());
  ASSERT_TRUE(tokenizer->bos_id.has_value());
  std::vector<int32_t> prompt = tokenizer->encode("", /*add_bos=*/true);
  ASSERT_EQ(prompt, std::vector<int32_t>{*tokenizer->bos_id});
  qspec::GenerationOptions options;
  // llama2.c's run (steps = 256) prints one token per position 0..255 and no eos stop, so
  // 256 greedy tokens are the whole documented text; its first 200 tokens are a prefix of it.
  options.max_new_tokens = 256;
  qspec::GenerationResult result = qspec::generate(*model, prompt, options);
  ASSERT_EQ(result.ids.size(), 256u);
  const std::vector<int32_t> first_200(result.ids.begin(), result.ids.begin() + 200);
  const std::string generated_200 = tokenizer->decode(first_200, /*skip_special=*/true);
  EXPECT_GT(generated_200.size(), 400u);
  EXPECT_EQ(expected.substr(0, generated_200.size()), generated_200);
  std::string generated = tokenizer->decode(result.ids, /*skip_special=*/true);
  while (!generated.empty() && generated.back() == '\n') generated.pop_back();
  EXPECT_EQ(expected, generated);
  std::filesystem::remove_all(out_dir);
}
