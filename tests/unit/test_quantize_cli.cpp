// qspec quantize IN OUT on bad input: a clear `qspec: error:` (exit code 1, never a crash),
// no OUT directory (nor a leftover OUT.partial-* beside it), and IN byte for byte as it was.
// Plus successful runs (RTN; GPTQ + ARC on a little calibration text) whose output loads,
// matches the in-process quantization, and runs `qspec eval gsm`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/llama.h"
#include "model/quant_checkpoint.h"
#include "model/quantize.h"
#include "qspec/error.h"
#include "quant/quantized_linear.h"

namespace fs = std::filesystem;

namespace {

const fs::path kModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
const fs::path kCalibration = QSPEC_SOURCE_DIR "/data/calibration/gsm-synth-self.txt";
const std::string kSmallCalibration = " --calib-samples 4 --calib-length 64";

struct QspecRun {
  bool exited = false;  // false: killed by a signal (a crash)
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string quoted(const fs::path& path) {
  std::string text(1, '\'');
  text += path.string();
  text += '\'';
  return text;
}

// Every entry under `dir`, relative path -> "dir" or size and FNV-1a hash of the bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> entries;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(entry.path(), dir).string();
    if (entry.is_directory()) {
      entries[name] = "dir";
      continue;
    }
    const std::string bytes = slurp(entry.path());
    uint64_t hash = 1469598103934665603ull;
    for (unsigned char byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
    entries[name] = std::to_string(bytes.size()) + ":" + std::to_string(hash);
  }
  return entries;
}

class QuantizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("qspec-quantize-cli-" + std::to_string(::getpid()) + "-" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "work");
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return dir_ / name;
  }

  QspecRun qspec(const std::string& args) {
    const std::string command = std::string(QSPEC_BINARY) + " " + args + " >'" + (dir_ / "stdout").string() +
                                "' 2>'" + (dir_ / "stderr").string() + "'";
    const int status = std::system(command.c_str());
    QspecRun run;
    run.exited = WIFEXITED(status) && WEXITSTATUS(status) < 128;  // /bin/sh: signal N -> 128 + N
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.out = slurp(dir_ / "stdout");
    run.err = slurp(dir_ / "stderr");
    return run;
  }

  // Nothing named like a staging directory of `out` beside it.
  static void expect_no_partial(const fs::path& out) {
    const fs::path parent = out.parent_path();
    if (!fs::is_directory(parent)) return;
    for (const auto& entry : fs::directory_iterator(parent))
      EXPECT_EQ(entry.path().filename().string().find(".partial-"), std::string::npos)
          << "leftover staging directory " << entry.path();
  }

  // `quantize IN OUT extra` fails cleanly naming `needle`; OUT is not created and IN is
  // untouched.
  void expect_rejected(const fs::path& in, const std::string& extra, const std::string& needle) {
    const fs::path out = dir_ / "work" / "out";
    const auto before = snapshot(in);
    const std::string args = "quantize " + quoted(in) + " " + quoted(out) + " " + extra;
    const QspecRun run = qspec(args);
    EXPECT_TRUE(run.exited) << args << " crashed:\n" << run.err;
    EXPECT_EQ(run.exit_code, 1) << args << ":\n" << run.err;
    EXPECT_NE(run.err.find("qspec: error:"), std::string::npos) << args << ":\n" << run.err;
    EXPECT_NE(run.err.find(needle), std::string::npos) << args << ": expected '" << needle << "' in:\n" << run.err;
    EXPECT_FALSE(fs::exists(out)) << args << " left " << out;
    expect_no_partial(out);
    EXPECT_TRUE(before == snapshot(in)) << args << " changed the input directory " << in;
  }

  fs::path dir_;
};

}  // namespace

TEST_F(QuantizeCli, OutputAlreadyExists) {
  const fs::path out = dir_ / "work" / "out";
  fs::create_directories(out / "sub");
  std::ofstream(out / "keep.txt") << "precious";
  const auto out_before = snapshot(out);
  const auto in_before = snapshot(kModel);
  const QspecRun run = qspec("quantize " + quoted(kModel) + " " + quoted(out));
  EXPECT_TRUE(run.exited) << run.err;
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("qspec: error:"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find(out.string() + ": already exists"), std::string::npos) << run.err;
  EXPECT_TRUE(out_before == snapshot(out)) << "the existing output directory was changed";
  EXPECT_TRUE(in_before == snapshot(kModel));
  expect_no_partial(out);
  // An existing plain file is refused too.
  fs::remove_all(out);
  std::ofstream(out) << "a file";
  const QspecRun file_run = qspec("quantize " + quoted(kModel) + " " + quoted(out));
  EXPECT_EQ(file_run.exit_code, 1) << file_run.err;
  EXPECT_NE(file_run.err.find("already exists"), std::string::npos) << file_run.err;
  EXPECT_EQ(slurp(out), "a file");
}

TEST_F(QuantizeCli, GptqWithoutCalibration) {
  expect_rejected(kModel, "--method gptq", "--method gptq needs calibration text: --calib FILE");
}

TEST_F(QuantizeCli, ArcWithoutCalibration) {
  expect_rejected(kModel, "--arc --format nvfp4", "--arc needs calibration text: --calib FILE");
}

TEST_F(QuantizeCli, EmptyCalibrationFile) {
  const fs::path calib = write("empty.txt", "");
  expect_rejected(kModel, "--method gptq --calib " + quoted(calib), "empty.txt: calibration file is empty");
}

TEST_F(QuantizeCli, BinaryCalibrationFile) {
  const fs::path nul = write("nul.txt", std::string("Question: Dan has\0\0\0 coins.", 27));
  expect_rejected(kModel, "--method gptq --calib " + quoted(nul), "nul.txt: calibration file is not UTF-8 text");
  const fs::path latin1 = write("latin1.txt", "Question: caf\xe9 has 3 coins and finds 4 more.");
  expect_rejected(kModel, "--arc --calib " + quoted(latin1), "latin1.txt: calibration file is not UTF-8 text");
}

TEST_F(QuantizeCli, MissingCalibrationFile) {
  expect_rejected(kModel, "--method gptq --calib " + quoted(dir_ / "absent.txt"),
                  "absent.txt: cannot open calibration file");
}

TEST_F(QuantizeCli, CalibrationIsADirectory) {
  fs::create_directories(dir_ / "calib-dir");
  expect_rejected(kModel, "--method gptq --calib " + quoted(dir_ / "calib-dir"), "calib-dir: is a directory");
}

TEST_F(QuantizeCli, CalibrationTooShortOrNoSamples) {
  const fs::path one = write("one.txt", "7");
  expect_rejected(kModel, "--method gptq --calib " + quoted(one), "one.txt: calibration text has 1 token");
  expect_rejected(kModel, "--method gptq --calib-samples 0 --calib " + quoted(kCalibration),
                  "need at least one calibration sample");
}

TEST_F(QuantizeCli, ArcWithPerChannelInt4) {
  expect_rejected(kModel, "--format int4-channel --arc --calib " + quoted(kCalibration) + kSmallCalibration,
                  "int4-channel has one scale per row");
}

TEST_F(QuantizeCli, GroupSizeThatDividesNoLayer) {
  // hidden 256 and intermediate 704 = 11 x 64: neither 48 nor 128 divides every K.
  expect_rejected(kModel, "--format int4 --group-size 48", "48");
  expect_rejected(kModel, "--format int4 --group-size 128", "704");
}

TEST_F(QuantizeCli, UnsupportedShapeOfATokenizerlessModel) {
  // The tiny test models have no tokenizer (RTN needs none) and intermediate 160, which is
  // not a multiple of 64.
  const fs::path tiny = QSPEC_TEST_DATA "/tiny/llama-linear-bias";
  expect_rejected(tiny, "--format int4 --group-size 64", "160");
}

TEST_F(QuantizeCli, UnknownOrNonWeightFormat) {
  expect_rejected(kModel, "--format int5", "int5");
  expect_rejected(kModel, "--format fp8", "--format fp8 is not a weight format");
}

TEST_F(QuantizeCli, BadOptionValues) {
  expect_rejected(kModel, "--method gptq --damp 0 --calib " + quoted(kCalibration), "--damp 0");
  expect_rejected(kModel, "--arc --arc-tau 0 --calib " + quoted(kCalibration) + kSmallCalibration, "tau");
  // CLI11 rejects an unknown method while parsing (its own message, exit code 105).
  const fs::path out = dir_ / "work" / "out";
  const QspecRun run = qspec("quantize " + quoted(kModel) + " " + quoted(out) + " --method awq");
  EXPECT_TRUE(run.exited) << run.err;
  EXPECT_NE(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("awq"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(QuantizeCli, MissingInputDirectory) {
  const fs::path out = dir_ / "work" / "out";
  const QspecRun run = qspec("quantize " + quoted(dir_ / "no-such-model") + " " + quoted(out));
  EXPECT_TRUE(run.exited) << run.err;
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("qspec: error:"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("no-such-model"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(QuantizeCli, OutputParentMissing) {
  // Found only when the checkpoint is written, after quantizing: still nothing is left.
  const fs::path out = dir_ / "work" / "missing" / "out";
  const auto before = snapshot(kModel);
  const QspecRun run = qspec("quantize " + quoted(kModel) + " " + quoted(out));
  EXPECT_TRUE(run.exited) << run.err;
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("qspec: error:"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("does not exist"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(dir_ / "work" / "missing"));
  EXPECT_TRUE(fs::is_empty(dir_ / "work"));
  EXPECT_TRUE(before == snapshot(kModel));
}

TEST_F(QuantizeCli, FourBitCheckpointAsInput) {
  const fs::path quantized = dir_ / "int4-ckpt";
  {
    auto model = qspec::LlamaModel::load(kModel.string());
    qspec::quantize_model(*model, {}, nullptr);
    model->save_quantized(quantized.string());
  }
  expect_rejected(quantized, "", "holds 4-bit weights already");
  expect_rejected(quantized, "--format nvfp4 --method gptq --calib " + quoted(kCalibration) + kSmallCalibration,
                  "holds 4-bit weights already");
}

TEST_F(QuantizeCli, RtnRunLoadsMatchesInProcessAndEvaluates) {
  const fs::path out = dir_ / "work" / "rtn";
  const auto before = snapshot(kModel);
  const QspecRun run = qspec("quantize " + quoted(kModel) + " " + quoted(out) + " --format int4");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(before == snapshot(kModel));
  EXPECT_NE(run.out.find("-> " + out.string() + ": int4 g64 rtn"), std::string::npos) << run.out;
  expect_no_partial(out);
  const nlohmann::json manifest = nlohmann::json::parse(slurp(out / qspec::kQuantManifestFile));
  EXPECT_EQ(manifest["format"], "int4");
  EXPECT_EQ(manifest["group_size"], 64);
  EXPECT_EQ(manifest["method"], "rtn");
  EXPECT_TRUE(manifest.contains("tool") && manifest.contains("command")) << manifest.dump();
  EXPECT_TRUE(fs::is_regular_file(out / "eval_problems.jsonl"));

  // The CLI's checkpoint is the in-process quantization, bit for bit.
  auto loaded = qspec::LlamaModel::load(out.string());
  auto reference = qspec::LlamaModel::load(kModel.string());
  qspec::quantize_model(*reference, {}, nullptr);
  EXPECT_EQ(loaded->quantized_format(), "int4 g64 rtn");
  const std::vector<int32_t> prompt = {314, 26, 473, 307, 221, 19, 21, 409};
  const qspec::RunMode mode = qspec::parse_run_mode("w4a16");
  std::vector<float> a, b;
  qspec::KvCache cache_a = loaded->new_cache(8), cache_b = reference->new_cache(8);
  loaded->forward(prompt, cache_a, a, false, mode);
  reference->forward(prompt, cache_b, b, false, mode);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  const QspecRun eval = qspec("eval gsm " + quoted(out) + " --limit 2 --modes w4a16");
  EXPECT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("w4a16"), std::string::npos) << eval.out;
  // w16a16 needs the 16-bit projections the 4-bit checkpoint does not have.
  const QspecRun w16 = qspec("eval gsm " + quoted(out) + " --limit 1 --modes w16a16");
  EXPECT_TRUE(w16.exited) << w16.err;
  EXPECT_EQ(w16.exit_code, 1) << w16.err;
  EXPECT_NE(w16.err.find("16-bit weights"), std::string::npos) << w16.err;
  // Default settings take the format from the checkpoint (mode auto): on these 4-bit weights
  // QSpec with the planner, whose greedy output is --mode w4a16's token for token; it says so.
  const std::string generate = "generate " + quoted(out) +
                               " -n 40 --temperature 0 --print-ids -p 'Question: A box holds 12 pens. How many pens "
                               "are in 4 boxes?\nAnswer:'";
  const QspecRun gen = qspec(generate);
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_NE(gen.err.find("[qspec] mode auto: qspec"), std::string::npos) << gen.err;
  EXPECT_NE(gen.err.find("[qspec] planner: "), std::string::npos) << gen.err;
  const QspecRun w4a16 = qspec(generate + " --mode w4a16");
  ASSERT_EQ(w4a16.exit_code, 0) << w4a16.err;
  EXPECT_NE(w4a16.err.find("mode w4a16"), std::string::npos) << w4a16.err;
  EXPECT_EQ(w4a16.err.find("mode auto"), std::string::npos) << w4a16.err;
  EXPECT_EQ(w4a16.err.find("[qspec] planner"), std::string::npos) << w4a16.err;
  auto ids_line = [](const std::string& err) {
    const size_t at = err.find("\nids:");
    return at == std::string::npos ? std::string() : err.substr(at + 1, err.find('\n', at + 1) - at - 1);
  };
  ASSERT_NE(ids_line(w4a16.err), "") << w4a16.err;
  EXPECT_EQ(ids_line(gen.err), ids_line(w4a16.err));
  // A mode name that is none: a clear error before anything runs.
  const QspecRun typo = qspec("generate " + quoted(out) + " --mode w5a16 -n 1 -p hi");
  EXPECT_EQ(typo.exit_code, 1) << typo.err;
  EXPECT_NE(typo.err.find("qspec: error: --mode: unknown mode 'w5a16'"), std::string::npos) << typo.err;
  const QspecRun eval_default = qspec("eval gsm " + quoted(out) + " --limit 1");
  EXPECT_EQ(eval_default.exit_code, 0) << eval_default.err;
  EXPECT_NE(eval_default.out.find("w4a16"), std::string::npos) << eval_default.out;
  EXPECT_EQ(eval_default.out.find("w16a16"), std::string::npos) << eval_default.out;
}

TEST_F(QuantizeCli, OutputWithATrailingSlash) {
  const fs::path out = dir_ / "work" / "slash";
  const QspecRun run = qspec("quantize " + quoted(kModel) + " '" + out.string() + "/' --format mxfp4");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  expect_no_partial(out);
  EXPECT_EQ(qspec::LlamaModel::load(out.string())->quantized_format(), "mxfp4 rtn");
  // And an existing OUT/ is refused like OUT.
  const QspecRun again = qspec("quantize " + quoted(kModel) + " '" + out.string() + "/' --format mxfp4");
  EXPECT_EQ(again.exit_code, 1) << again.err;
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;
}

TEST_F(QuantizeCli, GptqArcRunLoadsAndEvaluates) {
  const fs::path out = dir_ / "work" / "gptq-arc";
  const auto before = snapshot(kModel);
  const QspecRun run = qspec("quantize " + quoted(kModel) + " " + quoted(out) +
                             " --format nvfp4 --method gptq --arc --calib " + quoted(kCalibration) +
                             " --calib-samples 2 --calib-length 32");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(before == snapshot(kModel));
  EXPECT_NE(run.out.find("nvfp4 gptq + arc"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("ARC: 32 sites"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("calibration: 2 sequences"), std::string::npos) << run.err;
  expect_no_partial(out);
  const nlohmann::json manifest = nlohmann::json::parse(slurp(out / qspec::kQuantManifestFile));
  EXPECT_EQ(manifest["method"], "gptq");
  EXPECT_EQ(manifest["details"]["calibration"]["sequences"], 2);
  EXPECT_EQ(manifest["details"]["calibration"]["source"], kCalibration.string());
  EXPECT_EQ(manifest["details"]["arc"]["sites"].size(), 32u);

  auto loaded = qspec::LlamaModel::load(out.string());
  EXPECT_TRUE(loaded->has_arc());
  EXPECT_EQ(loaded->quantized_format(), "nvfp4 gptq + arc");

  const QspecRun info = qspec("info " + quoted(out));
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("quantization:   nvfp4 gptq + arc, "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("calibration:    " + kCalibration.string() + ", 2 sequences"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("gptq:           {"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("arc:            tau 0.125 x max"), std::string::npos) << info.out;

  const QspecRun eval = qspec("eval gsm " + quoted(out) + " --limit 2 --modes w4a16");
  EXPECT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("nvfp4 gptq + arc"), std::string::npos) << eval.out;
  EXPECT_NE(eval.out.find("w4a16"), std::string::npos) << eval.out;
}
