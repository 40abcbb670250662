// The qspec command under an address-space limit: running out of memory mid-load is a clean
// `qspec: error:`, never an uncaught std::bad_alloc. An end-to-end test because it needs the
// release build: the sanitizer build reserves terabytes of shadow memory, so no ulimit -v fits it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../unit/cli_run.h"
#include "base/limits.h"

namespace fs = std::filesystem;
using nlohmann::json;

TEST(CliLimits, OutOfMemoryWhileLoadingIsAQspecError) {
  // A model within every bound whose F16 embedding (1 GiB, a sparse file) becomes a 2 GiB f32
  // copy at load, under a 2.5 GiB address-space limit: std::bad_alloc mid-load.
  const fs::path dir = fs::temp_directory_path() / ("qspec-cli-oom-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int64_t vocab = qspec::kMaxVocabSize, hidden = 128;
  const uint64_t embedding_bytes = static_cast<uint64_t>(vocab * hidden * 2);
  std::ofstream(dir / "config.json") << json{{"architectures", {"LlamaForCausalLM"}},
                                             {"vocab_size", vocab},
                                             {"hidden_size", hidden},
                                             {"intermediate_size", hidden},
                                             {"num_hidden_layers", 1},
                                             {"num_attention_heads", 1}}
                                            .dump();
  const json header = {
      {"model.embed_tokens.weight", {{"dtype", "F16"}, {"shape", {vocab, hidden}}, {"data_offsets", {0, embedding_bytes}}}},
      {"model.layers.0.input_layernorm.weight",
       {{"dtype", "F16"}, {"shape", {hidden}}, {"data_offsets", {embedding_bytes, embedding_bytes + 2 * hidden}}}}};
  const std::string header_text = header.dump();
  {
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    uint64_t length = header_text.size();
    for (int i = 0; i < 8; ++i, length >>= 8) out.put(static_cast<char>(length & 0xff));
    out << header_text;
  }
  fs::resize_file(dir / "model.safetensors", 8 + header_text.size() + embedding_bytes + 2 * hidden);

  int exit_code = -1;
  const std::string output = qspec_test::run_qspec("info '" + dir.string() + "'", exit_code, false, "ulimit -v 2500000; ");
  fs::remove_all(dir);
  EXPECT_EQ(exit_code, 1) << output;  // 1: an error; 2 an internal error; 128 + N a signal
  EXPECT_NE(output.find("qspec: error: "), std::string::npos) << output;
  EXPECT_NE(output.find(dir.string() + ": out of memory while loading the model"), std::string::npos) << output;
  EXPECT_EQ(output.find("internal error"), std::string::npos) << output;
}
