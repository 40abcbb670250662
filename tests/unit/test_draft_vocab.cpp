// The draft vocabulary table and the draft lm_head over its subset (model/draft_vocab.h,
// LlamaModel::draft_head, issue 50 diet 4): the ranking, the file and its checks against the
// checkpoint, the subset's logits, the engine's and the command line's errors for a missing,
// foreign or too short table, and `qspec tune-draft` end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "model/draft_vocab.h"
#include "model/llama.h"
#include "cli_run.h"
#include "model_dir_copy.h"
#include "ops/sample.h"
#include "qspec/decode_plan.h"
#include "qspec/engine.h"
#include "qspec/error.h"

namespace {

namespace fs = std::filesystem;
using qspec_test::error_of;
using qspec_test::run_qspec;

class DraftVocab : public ModelDirCopy {
 protected:
  DraftVocab() : ModelDirCopy("draft-vocab") {}
  // A table of the copied checkpoint: its ids in reverse order (any ranking will do here).
  qspec::DraftVocabTable reverse_table(const qspec::LlamaModel& model, int64_t rows) const {
    std::vector<int32_t> ranked;
    for (int64_t id = model.config().vocab_size - 1; id >= 0; --id) ranked.push_back(static_cast<int32_t>(id));
    return qspec::make_draft_vocab_table(model, ranked, rows, {"test"}, 0);
  }
};

}  // namespace

// Counts rank ids, most frequent first; ties and unseen ids by lower id; `first` leads.
TEST(DraftVocabRanking, RanksByCountWithFirstIdsLeading) {
  const std::vector<std::vector<int32_t>> text = {{3, 3, 5, 1}, {5, 3, 6}};
  EXPECT_EQ(qspec::rank_token_frequencies(text, 8), (std::vector<int32_t>{3, 5, 1, 6, 0, 2, 4, 7}));
  const std::vector<int32_t> first = {7, 3};
  EXPECT_EQ(qspec::rank_token_frequencies(text, 8, first), (std::vector<int32_t>{7, 3, 5, 1, 6, 0, 2, 4}));
  EXPECT_THROW(qspec::rank_token_frequencies(text, 6), qspec::Error);  // id 6 is outside a vocabulary of 6
}

// The scatter's CPU twin: subset values at their ids, -inf elsewhere, row by row.
TEST(DraftVocabRanking, ScatterPutsSubsetLogitsAtTheirIds) {
  const float subset[] = {1.5f, -2.0f, 0.25f, 7.0f, 8.0f, 9.0f};
  const int32_t ids[] = {4, 0, 2};
  std::vector<float> out(2 * 5, 123.0f);
  qspec::cpu::scatter_subset_logits(subset, 2, 3, ids, 5, out.data());
  const float inf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(out, (std::vector<float>{-2.0f, inf, 0.25f, inf, 1.5f, 8.0f, inf, 9.0f, inf, 7.0f}));
}

// Written beside the checkpoint, read back at load, and the subset's logits are the whole
// lm_head's on its ids (the same rows, the same dot products) and -inf elsewhere.
TEST_F(DraftVocab, TableRoundTripsThroughTheCheckpointAndSubsetLogitsAreTheFullOnes) {
  auto model = qspec::LlamaModel::load(dir_.string());
  EXPECT_EQ(model->draft_vocab(), nullptr);
  const qspec::DraftVocabTable table = reverse_table(*model, 100);
  qspec::write_draft_vocab_table(table, dir_.string());
  auto loaded = qspec::LlamaModel::load(dir_.string());
  ASSERT_NE(loaded->draft_vocab(), nullptr);
  EXPECT_EQ(loaded->draft_vocab()->ids, table.ids);
  EXPECT_EQ(loaded->draft_vocab()->lm_head_fingerprint, qspec::draft_vocab_fingerprint(*model));

  const int64_t vocab = loaded->config().vocab_size;
  const std::vector<int32_t> tokens = {1, 17, 42, 5};
  qspec::RunMode full, subset;
  subset.vocab_subset = 80;
  std::vector<float> want, got;
  qspec::KvCache a = loaded->new_cache(8), b = loaded->new_cache(8);
  loaded->forward(tokens, a, want, true, full);
  loaded->forward(tokens, b, got, true, subset);
  ASSERT_EQ(got.size(), want.size());
  std::vector<bool> in_subset(static_cast<size_t>(vocab), false);
  for (int64_t j = 0; j < 80; ++j) in_subset[static_cast<size_t>(table.ids[static_cast<size_t>(j)])] = true;
  for (size_t i = 0; i < got.size(); ++i) {
    if (in_subset[i % static_cast<size_t>(vocab)]) EXPECT_EQ(got[i], want[i]) << i;
    else EXPECT_EQ(got[i], -std::numeric_limits<float>::infinity()) << i;
  }
  EXPECT_EQ(loaded->draft_head(80)->rows(), 80);
  EXPECT_EQ(loaded->draft_head(80), loaded->draft_head(80));  // made once
}

// A table made for another model: each identity field, named with the file, at load.
TEST_F(DraftVocab, TableForAnotherModelIsAnErrorAtLoadNamingTheField) {
  {
    auto model = qspec::LlamaModel::load(dir_.string());
    qspec::write_draft_vocab_table(reverse_table(*model, 100), dir_.string());
  }
  const std::string file(qspec::kDraftVocabFile);
  const nlohmann::json good = read_json(file);
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"vocab_size", 32000}, {"hidden_size", 4096}, {"num_layers", 2}, {"architecture", "MistralForCausalLM"},
           {"lm_head_fingerprint", "0123456789abcdef"}}) {
    nlohmann::json broken = good;
    broken[field] = value;
    write_json(file, broken);
    const std::string message = error_of([&] { qspec::LlamaModel::load(dir_.string()); });
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find("'" + field + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("another model"), std::string::npos) << message;
  }
  // Malformed: a repeated id, one outside the vocabulary, a missing field.
  nlohmann::json broken = good;
  broken["ids"][1] = broken["ids"][0];
  write_json(file, broken);
  EXPECT_NE(error_of([&] { qspec::LlamaModel::load(dir_.string()); }).find("appears twice"), std::string::npos);
  broken = good;
  broken["ids"][3] = 100000;
  write_json(file, broken);
  EXPECT_NE(error_of([&] { qspec::LlamaModel::load(dir_.string()); }).find("'ids'[3]"), std::string::npos);
  broken = good;
  broken.erase("lm_head_fingerprint");
  write_json(file, broken);
  EXPECT_NE(error_of([&] { qspec::LlamaModel::load(dir_.string()); }).find("missing field 'lm_head_fingerprint'"),
            std::string::npos);
  // Too short for any subset.
  broken = good;
  broken["ids"] = nlohmann::json(std::vector<int32_t>{1, 2, 3});
  write_json(file, broken);
  EXPECT_NE(error_of([&] { qspec::LlamaModel::load(dir_.string()); }).find("at least"), std::string::npos);
}

// Requests for a subset: without a table (the message says how to make one), beyond the table,
// below the smallest subset; each refused at submit, naming draft_vocab.
TEST_F(DraftVocab, EngineRefusesSubsetsTheTableCannotServe) {
  auto model = qspec::LlamaModel::load(dir_.string());
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::Engine engine(*model, nullptr);
  auto submit = [&](int64_t draft_vocab) {
    return error_of([&] {
      qspec::Request r;
      r.prompt = {1, 2, 3};
      r.max_new_tokens = 4;
      r.plan.mode = "qspec";
      r.plan.draft = "w4a8";
      r.plan.draft_vocab = draft_vocab;
      engine.submit(r, [](const qspec::TokenEvent&) {});
    });
  };
  std::string message = submit(128);
  EXPECT_NE(message.find("draft_vocab"), std::string::npos) << message;
  EXPECT_NE(message.find(std::string(qspec::kDraftVocabFile)), std::string::npos) << message;
  EXPECT_NE(message.find("qspec tune-draft"), std::string::npos) << message;
  model->set_draft_vocab(reverse_table(*model, 200));
  message = submit(201);
  EXPECT_NE(message.find("draft_vocab 201 is outside"), std::string::npos) << message;
  message = submit(qspec::decode_rules::kMinDraftVocab - 1);
  EXPECT_NE(message.find("draft_vocab"), std::string::npos) << message;
  EXPECT_EQ(submit(200), "");
  for (int step = 0; step < 16; ++step) engine.step();  // it runs (4 tokens)
  EXPECT_EQ(engine.metrics().requests_finished, 1);
}

// `qspec tune-draft` writes the table; generate with --draft-vocab then runs QSpec with it and
// prints W4A16's tokens; without a table, or with --draft-vocab beyond it, generate fails naming
// the table.
TEST_F(DraftVocab, TuneDraftCommandThenGenerateWithTheSubset) {
  int code = 0;
  const std::string dir = "'" + dir_.string() + "'";
  const std::string generate = "generate " + dir + " -p 'Question: Tom has 3 apples' -n 24 ";
  std::string out = run_qspec(generate + "--mode qspec --draft w4a8 --draft-vocab 128", code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("qspec tune-draft"), std::string::npos) << out;

  out = run_qspec("tune-draft " + dir + " --calibration '" QSPEC_SOURCE_DIR
                  "/data/calibration/gsm-synth-self.txt' --vocab 300",
                  code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find(std::string(qspec::kDraftVocabFile)), std::string::npos) << out;
  const nlohmann::json table = read_json(std::string(qspec::kDraftVocabFile));
  EXPECT_EQ(table["ids"].size(), 300u);
  EXPECT_EQ(table["format"], std::string(qspec::kDraftVocabFormat));

  const std::string w4a16 = run_qspec(generate + "--mode w4a16", code, true);
  ASSERT_EQ(code, 0) << w4a16;
  const std::string subset = run_qspec(generate + "--mode qspec --draft w4a8 --draft-vocab 128", code, true);
  ASSERT_EQ(code, 0) << subset;
  EXPECT_FALSE(w4a16.empty());
  EXPECT_EQ(subset, w4a16);
  out = run_qspec(generate + "--mode qspec --draft w4a8 --draft-vocab 301", code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("draft_vocab 301 is outside"), std::string::npos) << out;
}
