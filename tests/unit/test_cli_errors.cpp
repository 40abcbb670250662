// The qspec command on broken checkpoints: each one is a clear error on stderr that names
// the file or field at fault and a non-zero exit code, never a crash (these run under
// ASan + UBSan in CI too, where a memory error would abort the process with a signal).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "model_dir_copy.h"

namespace fs = std::filesystem;

namespace {

const fs::path kModelDir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

struct CommandResult {
  bool exited = false;  // false: killed by a signal (a crash)
  int exit_code = -1;
  std::string stderr_text;
};

// Runs the qspec binary with `args`, stdout discarded, stderr captured.
CommandResult run_qspec(const std::string& args) {
  static int counter = 0;
  const fs::path err_file =
      fs::temp_directory_path() / ("qspec-cli-err-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  const std::string command = std::string(QSPEC_BINARY) + " " + args + " >/dev/null 2>'" + err_file.string() + "'";
  const int status = std::system(command.c_str());
  CommandResult result;
  // std::system runs /bin/sh, which reports a child killed by signal N as exit code 128 + N.
  result.exited = WIFEXITED(status) && WEXITSTATUS(status) < 128;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  std::stringstream text;
  text << in.rdbuf();
  result.stderr_text = text.str();
  fs::remove(err_file);
  return result;
}

// A writable copy of the bundled checkpoint in a fresh temporary directory.
class BrokenCheckpoint : public ModelDirCopy {
 protected:
  BrokenCheckpoint() : ModelDirCopy("broken") {}

  // Expects both `info` and `generate` to fail cleanly with a message containing `needle`.
  void expect_clean_failure(const std::string& needle) {
    for (const std::string& subcommand : {std::string("info '") + dir_.string() + "'",
                                          std::string("generate '") + dir_.string() + "' -p 'Question:' -n 4"}) {
      CommandResult result = run_qspec(subcommand);
      EXPECT_TRUE(result.exited) << subcommand << " crashed:\n" << result.stderr_text;
      EXPECT_EQ(result.exit_code, 1) << subcommand << ":\n" << result.stderr_text;
      EXPECT_NE(result.stderr_text.find("qspec: error:"), std::string::npos) << result.stderr_text;
      EXPECT_NE(result.stderr_text.find(needle), std::string::npos)
          << subcommand << ": expected the message to name '" << needle << "':\n" << result.stderr_text;
    }
  }

};

const char* kShard3 = "model-00003-of-00003.safetensors";

}  // namespace

TEST(CliErrors, IntactCopyRuns) {
  CommandResult result = run_qspec("info '" + kModelDir.string() + "'");
  EXPECT_TRUE(result.exited);
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
}

TEST(CliErrors, FamiliarFlagsModelAndThreadsAfterTheSubcommand) {
  // llama.cpp's -m / --model and -t after the subcommand.
  CommandResult result = run_qspec("generate -m '" + kModelDir.string() + "' -n 2 -t 1 -p 'Question: 1 + 1?'");
  EXPECT_TRUE(result.exited);
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  result = run_qspec("info --model '" + kModelDir.string() + "'");
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
}

// The default mode, auto, on the bundled 16-bit checkpoint: its own W16A16 (QSpec needs 4-bit
// weights), said on stderr; chat and serve take the same default. (test_quantize_cli.cpp: auto
// on a 4-bit checkpoint.)
TEST(CliErrors, DefaultModeOnASixteenBitCheckpointIsW16A16) {
  CommandResult result = run_qspec("generate '" + kModelDir.string() + "' -n 2 -p 'Question: 1 + 1?'");
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("[qspec] mode auto: w16a16"), std::string::npos) << result.stderr_text;
  EXPECT_EQ(result.stderr_text.find("[qspec] planner"), std::string::npos) << result.stderr_text;
  for (const char* command : {"generate", "chat", "serve"}) {
    const fs::path help = fs::temp_directory_path() / ("qspec-help-" + std::to_string(::getpid()));
    std::system((std::string(QSPEC_BINARY) + " " + command + " --help >'" + help.string() + "'").c_str());
    std::ifstream in(help);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(help);
    EXPECT_NE(text.find("--mode TEXT=auto"), std::string::npos) << command << ":\n" << text;
  }
}

// generate with prompt-lookup drafts: no draft mode is prepared, and the QSpec summary names
// the draft (it once read a draft mode that n-gram plans do not have).
TEST(CliErrors, GenerateWithNgramDraftsRunsAndReports) {
  CommandResult result = run_qspec("generate '" + kModelDir.string() +
                                   "' --mode qspec --draft ngram --gamma 4 -n 24 -p 'Question: 12 pens in 4 boxes?'");
  EXPECT_TRUE(result.exited) << result.stderr_text;
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("draft ngram gamma 4"), std::string::npos) << result.stderr_text;
  result = run_qspec("generate '" + kModelDir.string() + "' --mode qspec --draft ngram --ngram-min 4 --ngram-max 2 "
                     "-n 4 -p 'Question: 1 + 1?'");
  EXPECT_EQ(result.exit_code, 1) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("--ngram_min: must be in 1..ngram_max"), std::string::npos) << result.stderr_text;
}

// A mistyped command or flag: a `qspec: error:` line with the closest name.
TEST(CliErrors, TyposGetDidYouMean) {
  CommandResult result = run_qspec("genrate x");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.stderr_text.find("qspec: error:"), std::string::npos) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("did you mean `qspec generate`?"), std::string::npos) << result.stderr_text;
  result = run_qspec("generate '" + kModelDir.string() + "' --tempreature 1 -p hi");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.stderr_text.find("did you mean --temperature?"), std::string::npos) << result.stderr_text;
  result = run_qspec("serve '" + kModelDir.string() + "' --max-batch 4");
  EXPECT_NE(result.stderr_text.find("did you mean --max-batch-size?"), std::string::npos) << result.stderr_text;
  result = run_qspec("eval gsm '" + kModelDir.string() + "' --modes qspec");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.stderr_text.find("qspec eval qspec MODEL"), std::string::npos) << result.stderr_text;
}

// A GGUF or llama2.c file where a model directory belongs: the error says how to convert it.
TEST(CliErrors, NonDirectoryCheckpointsPointToConvert) {
  const fs::path dir = fs::temp_directory_path() / ("qspec-convert-hint-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "model.gguf", std::ios::binary) << "GGUF\x03\0\0\0";
  CommandResult result = run_qspec("info '" + (dir / "model.gguf").string() + "'");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.stderr_text.find("is a GGUF file: convert it first, qspec convert gguf"), std::string::npos)
      << result.stderr_text;
  result = run_qspec("info '" + dir.string() + "'");  // a directory holding one
  EXPECT_NE(result.stderr_text.find("qspec convert gguf"), std::string::npos) << result.stderr_text;
  // --all-4bit only with --keep-4bit, refused before the file is read.
  result = run_qspec("convert gguf '" + (dir / "model.gguf").string() + "' '" + (dir / "out").string() + "' --all-4bit");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.stderr_text.find("--all-4bit applies to --keep-4bit conversions only"), std::string::npos)
      << result.stderr_text;
  EXPECT_FALSE(fs::exists(dir / "out"));
  fs::remove(dir / "model.gguf");
  std::ofstream(dir / "stories.bin", std::ios::binary) << std::string(4096, '\1');
  std::ofstream(dir / "tok512.bin", std::ios::binary) << std::string(16, '\1');
  result = run_qspec("info '" + dir.string() + "'");
  EXPECT_NE(result.stderr_text.find("stories.bin' looks like a llama2.c checkpoint: convert it first"),
            std::string::npos)
      << result.stderr_text;
  fs::remove_all(dir);
}

TEST(CliErrors, PromptFromStandardInputWithDashF) {
  const fs::path prompt = fs::temp_directory_path() / ("qspec-prompt-" + std::to_string(::getpid()));
  std::ofstream(prompt) << "Question: 2 + 2?";
  CommandResult from_stdin = run_qspec("generate '" + kModelDir.string() + "' -n 3 -f - < '" + prompt.string() + "'");
  EXPECT_EQ(from_stdin.exit_code, 0) << from_stdin.stderr_text;
  EXPECT_NE(from_stdin.stderr_text.find("[qspec] prompt "), std::string::npos) << from_stdin.stderr_text;
  CommandResult device = run_qspec("generate '" + kModelDir.string() + "' -n 3 -f /dev/zero");
  EXPECT_EQ(device.exit_code, 1) << device.stderr_text;
  EXPECT_NE(device.stderr_text.find("qspec: error: /dev/zero"), std::string::npos) << device.stderr_text;
  fs::remove(prompt);
}

TEST(CliErrors, CpuBenchRunsModesAndRefusesUnknownOnes) {
  const fs::path out = fs::temp_directory_path() / ("qspec-bench-modes-" + std::to_string(::getpid()));
  CommandResult result = run_qspec("bench '" + kModelDir.string() +
                                   "' --modes w4a16,w4a8 --prompt-tokens 4 --decode-tokens 2 --repeats 1 --out-dir '" +
                                   out.string() + "'");
  EXPECT_TRUE(result.exited);
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  std::ifstream record_file(out / ("cpu-modes-" + kModelDir.filename().string() + ".json"));
  const std::string record((std::istreambuf_iterator<char>(record_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(record.find("\"w4a16\""), std::string::npos) << record;
  EXPECT_NE(record.find("\"w4a8\""), std::string::npos) << record;
  fs::remove_all(out);
  CommandResult unknown = run_qspec("bench '" + kModelDir.string() + "' --modes w3a7 --out-dir ''");
  EXPECT_EQ(unknown.exit_code, 1) << unknown.stderr_text;
  EXPECT_NE(unknown.stderr_text.find("qspec: error: unknown mode 'w3a7'"), std::string::npos) << unknown.stderr_text;
  // --weights without --modes would be silently ignored by the w16a16 benchmark: refused.
  CommandResult weights = run_qspec("bench '" + kModelDir.string() + "' --weights nvfp4 --out-dir ''");
  EXPECT_EQ(weights.exit_code, 1) << weights.stderr_text;
  EXPECT_NE(weights.stderr_text.find("qspec: error: bench: --weights and --group-size need --modes"),
            std::string::npos)
      << weights.stderr_text;
}

// The ids `generate --print-ids` printed on stderr ("ids: 5 17 ..."), or "" when there were none.
std::string printed_ids(const std::string& stderr_text) {
  const size_t at = stderr_text.find("\nids:");
  if (at == std::string::npos) return "";
  return stderr_text.substr(at + 1, stderr_text.find('\n', at + 1) - at - 1);
}

// `--mode qspec` means the planner (draft auto) unless a draft is named: its greedy output is
// --mode w4a16's, and it says what it plans with and which plans ran. With a step-cost table from
// `bench --qspec-costs-out` (the CPU's, through the engine's backend) the same; a broken table is
// refused naming the file and the field at fault.
TEST(CliErrors, GenerateQSpecDefaultsToThePlannerAndBenchWritesItsCostTable) {
  const std::string generate = "generate '" + kModelDir.string() +
                               "' -n 40 --temperature 0 --print-ids -p 'Question: A box holds 12 pens. How many pens "
                               "are in 4 boxes?\nAnswer:' ";
  CommandResult plain = run_qspec(generate + "--mode w4a16");
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  ASSERT_NE(printed_ids(plain.stderr_text), "");
  CommandResult planned = run_qspec(generate + "--mode qspec --qspec-costs none");
  ASSERT_EQ(planned.exit_code, 0) << planned.stderr_text;
  EXPECT_EQ(printed_ids(planned.stderr_text), printed_ids(plain.stderr_text));
  EXPECT_NE(planned.stderr_text.find("[qspec] draft auto: no step-cost table"), std::string::npos) << planned.stderr_text;
  // Which plans ran and why the last one: without a table the planner times plain steps first,
  // then explores lookups, then prices with the passes it measured.
  EXPECT_NE(planned.stderr_text.find("[qspec] planner: "), std::string::npos) << planned.stderr_text;
  EXPECT_NE(planned.stderr_text.find(" steps; mean predicted gain"), std::string::npos) << planned.stderr_text;
  EXPECT_NE(planned.stderr_text.find("last plan: "), std::string::npos) << planned.stderr_text;

  const fs::path costs = fs::temp_directory_path() / ("qspec-cli-costs-" + std::to_string(::getpid()) + ".json");
  fs::remove(costs);
  CommandResult bench = run_qspec("-t 1 bench '" + kModelDir.string() + "' --qspec-costs-out '" + costs.string() +
                                  "' --batch-sizes 1,2 --qspec-costs-contexts 32,128 --qspec-gammas 1,3 "
                                  "--qspec-drafts w4a8,w4a16@16+4 --repeats 1");
  ASSERT_EQ(bench.exit_code, 0) << bench.stderr_text;
  std::ifstream table_file(costs);
  const nlohmann::json table = nlohmann::json::parse(table_file);
  EXPECT_EQ(table["format"], "qspec-step-costs");
  ASSERT_EQ(table["points"].size(), 4u);
  for (const auto& point : table["points"]) {
    EXPECT_GT(point["w4a16_step_ms"].get<double>(), 0);
    EXPECT_EQ(point["draft_step_ms"].size(), 3u);  // w4a8, the windowed draft, ngram (free)
    EXPECT_EQ(point["draft_step_ms"]["ngram"], 0.0);
    EXPECT_EQ(point["verify_ms"].size(), 2u);
  }
  // Measured again at one more batch: merged into the file.
  bench = run_qspec("-t 1 bench '" + kModelDir.string() + "' --qspec-costs-out '" + costs.string() +
                    "' --batch-sizes 4 --qspec-costs-contexts 32,128 --qspec-gammas 1,3 --qspec-drafts w4a8,w4a16@16+4 "
                    "--repeats 1");
  ASSERT_EQ(bench.exit_code, 0) << bench.stderr_text;
  std::ifstream merged_file(costs);
  EXPECT_EQ(nlohmann::json::parse(merged_file)["points"].size(), 6u);
  CommandResult tabled = run_qspec("-t 1 " + generate + "--mode qspec --qspec-costs '" + costs.string() + "'");
  ASSERT_EQ(tabled.exit_code, 0) << tabled.stderr_text;
  EXPECT_EQ(printed_ids(tabled.stderr_text), printed_ids(plain.stderr_text));
  EXPECT_NE(tabled.stderr_text.find("[qspec] draft auto: step costs " + costs.string()), std::string::npos)
      << tabled.stderr_text;
  // Another draft set cannot be merged into it.
  bench = run_qspec("-t 1 bench '" + kModelDir.string() + "' --qspec-costs-out '" + costs.string() +
                    "' --batch-sizes 8 --qspec-costs-contexts 32 --qspec-gammas 1,3 --qspec-drafts w4a8 --repeats 1");
  EXPECT_EQ(bench.exit_code, 1) << bench.stderr_text;
  EXPECT_NE(bench.stderr_text.find("cannot add these points"), std::string::npos) << bench.stderr_text;
  // A broken table: the file and the field.
  nlohmann::json broken = table;
  broken["points"][1]["verify_ms"]["3"] = "slow";
  std::ofstream(costs) << broken.dump();
  CommandResult refused = run_qspec(generate + "--mode qspec --qspec-costs '" + costs.string() + "'");
  EXPECT_EQ(refused.exit_code, 1) << refused.stderr_text;
  EXPECT_NE(refused.stderr_text.find(costs.string() + ": points[1].verify_ms.3: expected a number"), std::string::npos)
      << refused.stderr_text;
  fs::remove(costs);
}

TEST_F(BrokenCheckpoint, TruncatedShard) {
  fs::resize_file(dir_ / kShard3, fs::file_size(dir_ / kShard3) / 2);
  expect_clean_failure(kShard3);
}

TEST_F(BrokenCheckpoint, HeaderLengthLies) {
  std::fstream file(dir_ / kShard3, std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t huge = uint64_t{1} << 40;
  file.write(reinterpret_cast<const char*>(&huge), sizeof huge);
  file.close();
  expect_clean_failure(kShard3);
}

TEST_F(BrokenCheckpoint, DataOffsetsPointPastTheEnd) {
  // Rewrite the header of shard 3 in place with an end offset past the data.
  std::fstream file(dir_ / kShard3, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  file.read(reinterpret_cast<char*>(&header_len), sizeof header_len);
  std::string header(header_len, '\0');
  file.read(header.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json parsed = nlohmann::json::parse(header);
  std::string victim;
  for (auto& [name, info] : parsed.items())
    if (name != "__metadata__") victim = name;
  ASSERT_FALSE(victim.empty());
  parsed[victim]["data_offsets"][1] = parsed[victim]["data_offsets"][1].get<uint64_t>() + 1000000;
  std::string rewritten = parsed.dump();
  ASSERT_LE(rewritten.size(), header_len);
  rewritten.resize(header_len, ' ');  // the format allows trailing spaces in the header
  file.seekp(sizeof header_len);
  file.write(rewritten.data(), static_cast<std::streamsize>(rewritten.size()));
  file.close();
  expect_clean_failure(victim);
}

// Issue 51's bad input: a family, rope scaling or layer type this engine would run wrongly
// fails at load, the message naming the field.
TEST_F(BrokenCheckpoint, UnsupportedArchitectureNamesTheField) {
  nlohmann::json config = read_json("config.json");
  config["architectures"] = {"Gemma3ForConditionalGeneration"};
  write_json("config.json", config);
  expect_clean_failure("unsupported architecture 'Gemma3ForConditionalGeneration' in field 'architectures'");
}

TEST_F(BrokenCheckpoint, UnknownRopeScalingTypeNamesTheField) {
  nlohmann::json config = read_json("config.json");
  config["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  write_json("config.json", config);
  expect_clean_failure("unsupported rope type 'longrope' in 'rope_scaling'");
}

TEST_F(BrokenCheckpoint, UnknownLayerTypeNamesTheField) {
  nlohmann::json config = read_json("config.json");
  std::vector<std::string> types(config["num_hidden_layers"].get<size_t>(), "full_attention");
  types[3] = "chunked_attention";
  config["layer_types"] = types;
  write_json("config.json", config);
  expect_clean_failure("field 'layer_types'[3] = 'chunked_attention' is not a supported layer type");
}

TEST_F(BrokenCheckpoint, WrongShapeTensor) {
  // The config says hidden 256; a config claiming 320 makes every bound tensor the wrong shape.
  nlohmann::json config = read_json("config.json");
  config["hidden_size"] = 320;
  write_json("config.json", config);
  expect_clean_failure("model.embed_tokens.weight");
}

TEST_F(BrokenCheckpoint, MissingShard) {
  fs::remove(dir_ / kShard3);
  expect_clean_failure(kShard3);
}

TEST_F(BrokenCheckpoint, UnknownArchitecture) {
  nlohmann::json config = read_json("config.json");
  config["architectures"] = {"GPTNeoXForCausalLM"};
  write_json("config.json", config);
  expect_clean_failure("GPTNeoXForCausalLM");
}

TEST_F(BrokenCheckpoint, MalformedConfigJson) {
  std::ofstream(dir_ / "config.json") << "{\"architectures\": [\"LlamaForCausalLM\"], ";
  expect_clean_failure("config.json");
}

TEST_F(BrokenCheckpoint, MalformedTokenizerJson) {
  std::ofstream(dir_ / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": 7}}";
  CommandResult result = run_qspec("generate '" + dir_.string() + "' -p 'Question:' -n 4");
  EXPECT_TRUE(result.exited) << result.stderr_text;
  EXPECT_EQ(result.exit_code, 1) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("tokenizer.json"), std::string::npos) << result.stderr_text;
}

TEST_F(BrokenCheckpoint, PromptLongerThanTheContext) {
  std::string prompt;
  for (int i = 0; i < 400; ++i) prompt += "Question: Dan has 35 coins. ";  // > 1024 tokens
  CommandResult result = run_qspec("generate '" + dir_.string() + "' -p '" + prompt + "' -n 4");
  EXPECT_TRUE(result.exited) << result.stderr_text;
  EXPECT_EQ(result.exit_code, 1) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("context"), std::string::npos) << result.stderr_text;
}
