// Hostile model directories (issue 48, item 5): each test copies gsm-synth-llama, breaks one thing and expects a qspec::Error naming the file or field, never a hang, bad_alloc or a silent load.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "base/files.h"
#include "model_dir_copy.h"
#include "base/limits.h"
#include "model/config.h"
#include "model/llama.h"
#include "qspec/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kModelDir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
constexpr auto kHangTimeout = std::chrono::seconds(10);

// The message of the qspec::Error that `load` throws; "" when it returns. Any other exception
// (std::bad_alloc, std::length_error, a json error) is a test failure: it is what these tests
// guard against.
std::string error_of(const std::function<void()>& load) {
  try {
    load();
  } catch (const qspec::Error& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected a qspec::Error, got " << typeid(error).name() << ": " << error.what();
    return std::string("(not a qspec::Error) ") + error.what();
  }
  return "";
}

// error_of on a thread of its own. A load still running after kHangTimeout is blocked on one of
// `fifos` (the hang under test): that is a failure, and the FIFOs' write ends are then opened and
// closed until the load returns, so the test itself never hangs.
std::string error_of_without_hanging(const std::function<void()>& load, const std::vector<fs::path>& fifos) {
  auto result = std::async(std::launch::async, [&] { return error_of(load); });
  if (result.wait_for(kHangTimeout) == std::future_status::timeout) {
    ADD_FAILURE() << "the load blocked for " << kHangTimeout.count() << " s on a FIFO";
    while (result.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout) {
      for (const fs::path& fifo : fifos) {
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // ENXIO while no reader
        if (fd >= 0) ::close(fd);
      }
    }
  }
  return result.get();
}

void load_model(const fs::path& dir) { qspec::LlamaModel::load(dir.string()); }
void load_tokenizer(const fs::path& dir) { qspec::Tokenizer::load(dir.string()); }

// A writable copy of gsm-synth-llama in a fresh temporary directory.
class HostileModelDir : public ModelDirCopy {
 protected:
  HostileModelDir() : ModelDirCopy("hostile") {}
  void set_config(const std::string& key, const json& value) const {
    json config = read_json("config.json");
    config[key] = value;
    write_json("config.json", config);
  }
  // Puts a FIFO where `name` was.
  fs::path make_fifo(const std::string& name) const {
    const fs::path path = dir_ / name;
    fs::remove(path);
    EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
    return path;
  }
  // Makes `name` a symbolic link to `target`.
  void link_to(const std::string& name, const fs::path& target) const {
    fs::remove(dir_ / name);
    fs::create_symlink(target, dir_ / name);
  }
  // Makes `name` a sparse file of `bytes` zero bytes (no disk space, no time).
  void make_sparse(const std::string& name, uint64_t bytes) const {
    fs::remove(dir_ / name);
    { std::ofstream(dir_ / name) << ""; }
    fs::resize_file(dir_ / name, bytes);
  }
  // Restores `name` from the bundled model.
  void restore(const std::string& name) const {
    fs::remove(dir_ / name);
    fs::copy_file(kModelDir / name, dir_ / name);
  }
};

// Every JSON/text file a loader reads from a model directory, with a load that reads it.
struct ReadFile {
  std::string name;
  std::function<void(const fs::path&)> load;
};
std::vector<ReadFile> every_read_file() {
  return {{"config.json", load_model},
          {"config.json", load_tokenizer},  // for bos/eos ids
          {"model.safetensors.index.json", load_model},
          {"qspec_quant.json", load_model},  // its presence alone makes the checkpoint a 4-bit one
          {"tokenizer.json", load_tokenizer},
          {"tokenizer_config.json", load_tokenizer},
          {"generation_config.json", load_tokenizer},
          {"tokenizer_config.json", [](const fs::path& dir) { qspec::load_chat_template(dir.string()); }}};
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

}  // namespace

// ---- 1. A FIFO in place of a file: an Error, never a blocking open ----

TEST_F(HostileModelDir, FifoInPlaceOfShardIsAnErrorNotAHang) {
  const fs::path fifo = make_fifo("model-00002-of-00003.safetensors");
  const std::string error = error_of_without_hanging([&] { load_model(dir_); }, {fifo});
  EXPECT_TRUE(contains(error, "model-00002-of-00003.safetensors: not a regular file")) << error;
}

TEST_F(HostileModelDir, FifoInPlaceOfTokenizerJsonIsAnErrorNotAHang) {
  const fs::path fifo = make_fifo("tokenizer.json");
  const std::string error = error_of_without_hanging([&] { load_tokenizer(dir_); }, {fifo});
  EXPECT_TRUE(contains(error, "tokenizer.json: not a regular file")) << error;
}

TEST_F(HostileModelDir, FifoInPlaceOfAnyJsonFileIsAnErrorNotAHang) {
  for (const ReadFile& file : every_read_file()) {
    SCOPED_TRACE(file.name);
    const fs::path fifo = make_fifo(file.name);
    const std::string error = error_of_without_hanging([&] { file.load(dir_); }, {fifo});
    EXPECT_TRUE(contains(error, file.name + ": not a regular file")) << error;
    if (file.name == "qspec_quant.json") fs::remove(fifo); else restore(file.name);
  }
}

TEST_F(HostileModelDir, OpenRegularFileRefusesFifoDirectoryAndDevice) {
  const fs::path fifo = make_fifo("pipe");
  for (const fs::path& path : {fifo, dir_, fs::path("/dev/zero")}) {
    const std::string error = error_of_without_hanging([&] { qspec::open_regular_file(path.string(), nullptr); }, {fifo});
    EXPECT_TRUE(contains(error, path.string() + ": not a regular file")) << error;
  }
}

// ---- 2. A JSON file linked to /dev/zero, or absurdly large: an Error, never an endless read ----

TEST_F(HostileModelDir, ConfigJsonLinkedToDevZeroIsAnErrorNotAnEndlessRead) {
  link_to("config.json", "/dev/zero");
  const std::string error = error_of([&] { load_model(dir_); });
  EXPECT_TRUE(contains(error, "config.json: not a regular file")) << error;
}

TEST_F(HostileModelDir, TokenizerJsonLinkedToDevZeroIsAnErrorNotAnEndlessRead) {
  link_to("tokenizer.json", "/dev/zero");
  const std::string error = error_of([&] { load_tokenizer(dir_); });
  EXPECT_TRUE(contains(error, "tokenizer.json: not a regular file")) << error;
}

TEST_F(HostileModelDir, AnyJsonFileLinkedToDevZeroIsAnErrorNotAnEndlessRead) {
  for (const ReadFile& file : every_read_file()) {
    SCOPED_TRACE(file.name);
    link_to(file.name, "/dev/zero");
    const std::string error = error_of([&] { file.load(dir_); });
    EXPECT_TRUE(contains(error, file.name + ": not a regular file")) << error;
    if (file.name == "qspec_quant.json") fs::remove(dir_ / file.name); else restore(file.name);
  }
}

TEST_F(HostileModelDir, OversizedJsonFilesAreAnErrorNotAnEndlessRead) {
  make_sparse("tokenizer.json", qspec::kMaxTokenizerJsonBytes + 1);
  std::string error = error_of([&] { load_tokenizer(dir_); });
  EXPECT_TRUE(contains(error, "tokenizer.json")) << error;
  EXPECT_TRUE(contains(error, "larger than the " + std::to_string(qspec::kMaxTokenizerJsonBytes))) << error;
  restore("tokenizer.json");

  make_sparse("config.json", qspec::kMaxConfigJsonBytes + 1);
  error = error_of([&] { load_model(dir_); });
  EXPECT_TRUE(contains(error, "config.json")) << error;
  EXPECT_TRUE(contains(error, "larger than the " + std::to_string(qspec::kMaxConfigJsonBytes))) << error;
}

// ---- 3. Config sizes: bounded, and checked against the tensors before anything is allocated ----

TEST_F(HostileModelDir, HugeNumHiddenLayersIsAnErrorBeforeAllocating) {
  set_config("num_hidden_layers", int64_t{1} << 40);
  const std::string error = error_of([&] { load_model(dir_); });
  EXPECT_TRUE(contains(error, "config.json: field 'num_hidden_layers' = 1099511627776 exceeds the supported maximum " +
                                  std::to_string(qspec::kMaxLayers)))
      << error;
}

TEST_F(HostileModelDir, NumHiddenLayersBeyondTheCheckpointIsAnErrorBeforeAllocating) {
  set_config("num_hidden_layers", qspec::kMaxLayers);  // within bounds, but the checkpoint has 8
  const std::string error = error_of([&] { load_model(dir_); });
  EXPECT_TRUE(contains(error, "config.json: num_hidden_layers = " + std::to_string(qspec::kMaxLayers))) << error;
  EXPECT_TRUE(contains(error, "no tensors for layer 8")) << error;
}

TEST_F(HostileModelDir, EveryConfigSizeIsBounded) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"}) {
    SCOPED_TRACE(field);
    restore("config.json");
    set_config(field, int64_t{1} << 40);
    const std::string error = error_of([&] { load_model(dir_); });
    EXPECT_TRUE(contains(error, std::string("config.json: field '") + field + "' = 1099511627776 exceeds")) << error;
  }
}

// ---- 4. Token ids of tokenizer.json: bounded, and within the model's vocabulary ----

TEST_F(HostileModelDir, AddedTokenIdNearInt32MaxIsAnError) {
  json tokenizer = read_json("tokenizer.json");
  tokenizer["added_tokens"].push_back({{"id", 2147483646}, {"content", "<|huge|>"}, {"special", true}});
  write_json("tokenizer.json", tokenizer);
  const std::string error = error_of([&] { load_tokenizer(dir_); });
  EXPECT_TRUE(contains(error, "tokenizer.json: added_tokens: token \"<|huge|>\" has id 2147483646")) << error;
}

TEST_F(HostileModelDir, VocabTokenIdBeyondTheCapIsAnError) {
  json tokenizer = read_json("tokenizer.json");
  tokenizer["model"]["vocab"]["zzzz"] = (int64_t{1} << 30) - 1;
  write_json("tokenizer.json", tokenizer);
  const std::string error = error_of([&] { load_tokenizer(dir_); });
  EXPECT_TRUE(contains(error, "tokenizer.json: model: token 'zzzz' has id 1073741823")) << error;
}

TEST_F(HostileModelDir, TokenizerLargerThanTheModelVocabIsAnError) {
  json tokenizer = read_json("tokenizer.json");
  tokenizer["added_tokens"].push_back({{"id", 600}, {"content", "<|extra|>"}, {"special", true}});
  write_json("tokenizer.json", tokenizer);
  auto loaded = qspec::Tokenizer::load(dir_.string());  // on its own, a 601-token tokenizer is fine
  EXPECT_EQ(loaded->vocab_size(), 601);
  const qspec::ModelConfig config = qspec::load_model_config(dir_.string());
  const std::string error = error_of([&] { loaded->check_model_vocab(config.vocab_size, dir_.string()); });
  EXPECT_TRUE(contains(error, "the tokenizer has 601 tokens but config.json's vocab_size is 477")) << error;
}

// ---- 5. A config with fewer layers than the checkpoint ----

TEST_F(HostileModelDir, ConfigWithFewerLayersThanTheCheckpointIsAnError) {
  set_config("num_hidden_layers", 7);
  const std::string error = error_of([&] { load_model(dir_); });
  EXPECT_TRUE(contains(error, "tensor 'model.layers.7.")) << error;
  EXPECT_TRUE(contains(error, "num_hidden_layers = 7")) << error;
}

// ---- 6. Special token ids outside the vocabulary; an absurd context length ----

TEST_F(HostileModelDir, EosAndBosTokenIdsOutsideTheVocabInConfigJsonAreErrors) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"eos_token_id", 477}, {"eos_token_id", json::array({0, 100000})}, {"eos_token_id", -1},
           {"bos_token_id", 477}, {"bos_token_id", int64_t{1} << 40}}) {
    SCOPED_TRACE(field + " = " + value.dump());
    restore("config.json");
    set_config(field, value);
    const std::string error = error_of([&] { load_model(dir_); });
    EXPECT_TRUE(contains(error, "config.json: field '" + field + "'")) << error;
    EXPECT_TRUE(contains(error, "outside the vocabulary [0, 477)")) << error;
  }
}

TEST_F(HostileModelDir, EosAndBosTokenIdsOutsideTheVocabInGenerationConfigAreErrors) {
  for (const char* field : {"eos_token_id", "bos_token_id"}) {
    SCOPED_TRACE(field);
    restore("generation_config.json");
    json generation = read_json("generation_config.json");
    generation[field] = 5000;
    write_json("generation_config.json", generation);
    const std::string error = error_of([&] { load_tokenizer(dir_); });
    EXPECT_TRUE(contains(error, std::string("generation_config.json: field '") + field + "' = 5000 is outside")) << error;
  }
}

TEST_F(HostileModelDir, MaxPositionEmbeddingsOf1e12IsAnError) {
  set_config("max_position_embeddings", int64_t{1000000000000});
  const std::string error = error_of([&] { load_model(dir_); });
  EXPECT_TRUE(contains(error, "config.json: field 'max_position_embeddings' = 1000000000000 exceeds the supported "
                              "maximum " + std::to_string(qspec::kMaxPositionEmbeddings)))
      << error;
  restore("config.json");
  set_config("max_position_embeddings", qspec::kMaxPositionEmbeddings);  // the limit itself loads
  EXPECT_EQ(error_of([&] { load_model(dir_); }), "");
}

// ---- 7. The command line: `qspec: error:`, never an uncaught exception ----

namespace {

struct CommandResult {
  int status = -1;
  std::string stderr_text;
};

// Runs `qspec info DIR`, stdout discarded.
CommandResult run_qspec_info(const fs::path& dir) {
  const fs::path err_file = fs::temp_directory_path() / ("qspec-hostile-stderr-" + std::to_string(::getpid()));
  const std::string command = std::string(QSPEC_BINARY) + " info '" + dir.string() +
                              "' >/dev/null 2>'" + err_file.string() + "'";
  CommandResult result;
  result.status = std::system(command.c_str());
  std::ifstream in(err_file);
  std::stringstream text;
  text << in.rdbuf();
  result.stderr_text = text.str();
  fs::remove(err_file);
  return result;
}

// A clean `qspec: error:` (exit code 1) that names `needle`, never "internal error" (exit 2).
void expect_qspec_error(const CommandResult& result, const std::string& needle) {
  // std::system runs /bin/sh, which reports a child killed by signal N as exit code 128 + N.
  ASSERT_TRUE(WIFEXITED(result.status) && WEXITSTATUS(result.status) < 128) << result.stderr_text;
  EXPECT_EQ(WEXITSTATUS(result.status), 1) << result.stderr_text;
  EXPECT_TRUE(contains(result.stderr_text, "qspec: error: ")) << result.stderr_text;
  EXPECT_TRUE(contains(result.stderr_text, needle)) << result.stderr_text;
  EXPECT_FALSE(contains(result.stderr_text, "internal error")) << result.stderr_text;
}

}  // namespace

TEST_F(HostileModelDir, CliReportsHugeNumHiddenLayersAsAQspecError) {
  set_config("num_hidden_layers", int64_t{1} << 40);
  expect_qspec_error(run_qspec_info(dir_), "num_hidden_layers");
}

// Out of memory while loading: tests/e2e/test_cli_limits.cpp (under a ulimit, which the sanitizer
// build's shadow memory cannot run under).
