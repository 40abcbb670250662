// qspec eval gsm / eval ppl on bad input: each is a clear `qspec: error:` naming the file
// (and line) at fault, exit code 1, never a crash; plus short successful runs of both
// subcommands and of the `eval MODEL` alias on the bundled model.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

const std::string kModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

struct QspecRun {
  bool exited = false;  // false: killed by a signal (a crash)
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class EvalCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qspec-eval-cli-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
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

  void expect_error(const std::string& args, const std::string& needle) {
    const QspecRun run = qspec(args);
    EXPECT_TRUE(run.exited) << args << " crashed:\n" << run.err;
    EXPECT_EQ(run.exit_code, 1) << args << ":\n" << run.err;
    EXPECT_NE(run.err.find("qspec: error:"), std::string::npos) << args << ":\n" << run.err;
    EXPECT_NE(run.err.find(needle), std::string::npos) << args << ": expected '" << needle << "' in:\n" << run.err;
  }

  std::string gsm(const fs::path& file, const std::string& extra = "") {
    return "eval gsm '" + kModel + "' '" + file.string() + "' --modes w16a16 -n 4 " + extra;
  }
  std::string ppl(const fs::path& file, const std::string& extra = "", const std::string& modes = "w16a16") {
    return "eval ppl '" + kModel + "' --data '" + file.string() + "' --modes " + modes + " " + extra;
  }

  fs::path dir_;
};

const char* kProblem = R"({"question": "Dan has 3 coins and finds 4 more. How many coins does he have?", "answer": "3 + 4 = 7\n#### 7"})";

}  // namespace

TEST_F(EvalCli, GsmMissingFile) { expect_error(gsm(dir_ / "absent.jsonl"), "absent.jsonl: no such problems file"); }

TEST_F(EvalCli, GsmEmptyFile) { expect_error(gsm(write("empty.jsonl", "")), "empty.jsonl: empty problems file"); }

TEST_F(EvalCli, GsmBlankLinesOnly) { expect_error(gsm(write("blank.jsonl", "\n\n  \n")), "blank.jsonl: no problems"); }

TEST_F(EvalCli, GsmBinaryFile) {
  expect_error(gsm(write("binary.jsonl", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10))), "binary.jsonl: binary data");
  expect_error(gsm(write("latin1.jsonl", "{\"question\": \"caf\xe9\", \"answer\": \"#### 1\"}\n")),
               "latin1.jsonl: not UTF-8 text");
}

TEST_F(EvalCli, GsmBadJsonLineNamesTheLine) {
  const fs::path file = write("bad.jsonl", std::string(kProblem) + "\n" + kProblem + "\n{\"question\": \"x\", \n");
  expect_error(gsm(file), "bad.jsonl:3: not JSON");
  expect_error(gsm(write("fields.jsonl", std::string(kProblem) + "\n{\"question\": 5, \"answer\": \"#### 1\"}\n")),
               "fields.jsonl:2: expected an object");
}

TEST_F(EvalCli, GsmFewShotNeedsEnoughShots) {
  const fs::path problems = write("problems.jsonl", std::string(kProblem) + "\n");
  expect_error(gsm(problems, "--few-shot 2"), "--few-shot 2 needs --shots");
  const fs::path shots = write("shots.jsonl", std::string(kProblem) + "\n");
  expect_error(gsm(problems, "--few-shot 2 --shots '" + shots.string() + "'"), "fewer than --few-shot 2");
  expect_error(gsm(problems, "--few-shot 1 --shots '" + (dir_ / "none.jsonl").string() + "'"),
               "none.jsonl: no such shots file");
}

TEST_F(EvalCli, GsmBadMode) {
  expect_error("eval gsm '" + kModel + "' --modes w16a16,w3a3 --limit 1", "w3a3");
}

TEST_F(EvalCli, PplMissingFile) { expect_error(ppl(dir_ / "absent.raw"), "absent.raw: no such data file"); }

TEST_F(EvalCli, PplEmptyFile) { expect_error(ppl(write("empty.raw", "")), "empty.raw: empty data file"); }

TEST_F(EvalCli, PplBinaryOrNotUtf8) {
  expect_error(ppl(write("zeros.raw", std::string(64, '\0'))), "zeros.raw: binary data");
  expect_error(ppl(write("latin1.raw", "na\xefve caf\xe9 text")), "latin1.raw: not UTF-8 text");
  expect_error(ppl(write("truncated.raw", "ends in half a character \xe2\x82")), "truncated.raw: not UTF-8 text");
}

TEST_F(EvalCli, PplFewerThanTwoTokens) { expect_error(ppl(write("one.raw", "7")), "one.raw: 1 token"); }

TEST_F(EvalCli, PplDirectoryAsData) { expect_error(ppl(dir_), "is a directory"); }

TEST_F(EvalCli, PplStrideNotBelowContext) {
  const fs::path text = write("text.raw", "Question: Dan has 35 coins. He gives 5 away. How many are left?\n");
  expect_error(ppl(text, "--context 8 --stride 8"), "stride");
  expect_error(ppl(text, "--context 100000"), "exceeds the model's");
}

TEST_F(EvalCli, PplRunsAndWritesReport) {
  std::string text;
  for (int i = 0; i < 6; ++i) text += "Question: Dan has " + std::to_string(30 + i) + " coins. He gives 5 away.\n";
  const fs::path data = write("text.raw", text);
  const fs::path out = dir_ / "ppl.json";
  const QspecRun run = qspec(ppl(data, "--context 32 --stride 8 -o '" + out.string() + "'", "w16a16,w4a16"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("w4a16"), std::string::npos) << run.out;
  const nlohmann::json report = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(report["benchmark"], "eval_ppl");
  EXPECT_EQ(report["data_file"], data.string());
  EXPECT_EQ(report["parameters"]["context"], 32);
  EXPECT_EQ(report["parameters"]["stride"], 8);
  ASSERT_EQ(report["results"].size(), 2u);
  const int64_t tokens = report["parameters"]["tokens"];
  for (const auto& row : report["results"]) {
    EXPECT_EQ(row["tokens_scored"], tokens - 1);
    EXPECT_GT(row["perplexity"].get<double>(), 1.0);
  }
  EXPECT_NE(report["command"].get<std::string>().find("eval ppl"), std::string::npos);
}

TEST_F(EvalCli, GsmRunsAndWritesReport) {
  const fs::path problems = write("problems.jsonl", std::string(kProblem) + "\n" + kProblem + "\n");
  const fs::path out = dir_ / "gsm.json";
  const QspecRun run = qspec(gsm(problems, "--few-shot 1 --shots '" + problems.string() + "' -o '" + out.string() + "'"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(report["benchmark"], "eval_gsm");
  EXPECT_EQ(report["problems"], 2);
  EXPECT_EQ(report["parameters"]["few_shot"], 1);
  ASSERT_EQ(report["results"].size(), 1u);
  EXPECT_TRUE(report["results"][0].contains("flexible_match"));
  EXPECT_TRUE(report["results"][0].contains("exact_match"));
}

// --chat: the model's chat template over the question (the bundled model's chat_template.jinja);
// a model without one (a copy without the file), or shots beside it, is a clear error.
TEST_F(EvalCli, GsmChatPromptsWithTheModelsTemplate) {
  const fs::path problems = write("problems.jsonl", std::string(kProblem) + "\n");
  expect_error(gsm(problems, "--chat --few-shot 1 --shots '" + problems.string() + "'"), "--few-shot");
  const fs::path bare = dir_ / "model";
  fs::copy(kModel, bare, fs::copy_options::recursive);
  fs::remove(bare / "chat_template.jinja");
  expect_error("eval gsm '" + bare.string() + "' '" + problems.string() + "' --modes w16a16 -n 4 --chat",
               "chat_template");
  const fs::path out = dir_ / "gsm.json";
  const QspecRun run = qspec(gsm(problems, "--chat -o '" + out.string() + "'"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("chat template"), std::string::npos) << run.out;
  const nlohmann::json report = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(report["parameters"]["prompt"], "chat template, user: {question}");
  ASSERT_EQ(report["results"].size(), 1u);
  EXPECT_EQ(report["results"][0]["problems"], 1);
  EXPECT_GT(report["results"][0]["generated_tokens"].get<int64_t>(), 0);
}

TEST_F(EvalCli, EvalModelAliasRunsGsm) {
  const QspecRun run = qspec("eval '" + kModel + "' --limit 1 -n 4 --modes w16a16");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("1 problems"), std::string::npos) << run.out;
  expect_error("eval", "eval gsm MODEL");
}

// eval qspec through the engine: a saved W4A16 reference is reused by later shards, and a
// reference made from other problems or another length budget is refused, not misused.
TEST_F(EvalCli, QSpecReferenceSavedReusedAndChecked) {
  const fs::path problems = write("problems.jsonl", std::string(kProblem) + "\n" + kProblem + "\n");
  const fs::path reference = dir_ / "reference.json", out = dir_ / "qspec.json";
  const std::string base = "eval qspec '" + kModel + "' '" + problems.string() + "' -n 12 --drafts w4a8 --gammas 2 "
                           "--batch-sizes 2 --kv-overwrite on";
  QspecRun run = qspec(base + " --save-reference '" + reference.string() + "'");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  run = qspec(base + " --reference '" + reference.string() + "' -o '" + out.string() + "'");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(slurp(out));
  ASSERT_EQ(report["results"].size(), 1u);
  EXPECT_EQ(report["results"][0]["identical_to_w4a16"].get<int>() + report["results"][0]["exact_logit_ties"].get<int>(), 2);
  EXPECT_EQ(report["mismatches"], 0);
  EXPECT_TRUE(report["baseline_w4a16"].empty());  // the plain runs were skipped
  expect_error(base + " --limit 1 --reference '" + reference.string() + "'", "its prompts are not this run's problems");
  expect_error("eval qspec '" + kModel + "' '" + problems.string() + "' -n 13 --drafts w4a8 --gammas 2 --reference '" +
                   reference.string() + "'",
               "made with max_tokens 12");
  expect_error(base + " --reference '" + write("bad.json", "{\"max_tokens\": 12").string() + "'",
               "not a reference file");
}

// eval qspec with n-gram drafts beside a mode: no mode is prepared for them, the no-overwrite
// ablation is skipped for them (it has no draft rows), and their outputs equal W4A16's.
TEST_F(EvalCli, QSpecNgramDraftsRunBesideModeDrafts) {
  const fs::path problems = write("problems.jsonl", std::string(kProblem) + "\n" + kProblem + "\n");
  const fs::path out = dir_ / "qspec.json";
  const QspecRun run = qspec("eval qspec '" + kModel + "' '" + problems.string() + "' -n 16 --drafts ngram,w4a8 "
                             "--gammas 3 --batch-sizes 2 --kv-overwrite both -o '" + out.string() + "'");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(slurp(out));
  ASSERT_EQ(report["results"].size(), 3u);  // ngram (overwrite on), w4a8 on and off
  EXPECT_EQ(report["results"][0]["draft"], "ngram");
  EXPECT_EQ(report["results"][0]["kv_overwrite"], true);
  EXPECT_EQ(report["results"][0]["identical_to_w4a16"].get<int>() + report["results"][0]["exact_logit_ties"].get<int>(), 2);
  EXPECT_EQ(report["mismatches"], 0);
  expect_error("eval qspec '" + kModel + "' '" + problems.string() + "' --drafts ngram --device cuda --kv-overwrite off",
               "runs on the CPU only");
}
