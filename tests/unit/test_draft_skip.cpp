// Layer-skipping drafts (model/draft_skip.h, RunMode::skip_layers, issue 50 diet 3): the spelling
// "MODE[@W+S][/vN]/sN" and its rules, the skip table's file and its checks against the
// checkpoint, a skipping pass (skipped layers write no K/V), the greedy search against a pass
// through the table, the engine's errors, and `qspec tune-draft` end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/draft_skip.h"
#include "model/llama.h"
#include "cli_run.h"
#include "model_dir_copy.h"
#include "qspec/decode_plan.h"
#include "qspec/engine.h"
#include "qspec/error.h"
#include "tokenizer/calibration_text.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using qspec_test::error_of;
using qspec_test::run_qspec;

// A table of `model` skipping `order` (agreements made up: only the order matters to a pass).
qspec::DraftSkipTable table_of(const qspec::LlamaModel& model, std::vector<int32_t> order) {
  qspec::DraftSkipTable table;
  static_cast<qspec::DraftTableIdentity&>(table) = qspec::draft_table_identity(model, {"test"}, 0);
  table.draft_mode = "w4a16";
  table.target_mode = "w4a16";
  table.agreement.assign(order.size() + 1, 0.5);
  table.order = std::move(order);
  return table;
}

qspec::RunMode mode_of(const qspec::LlamaModel& model, const std::string& name, int64_t skip = 0) {
  qspec::RunMode mode = qspec::parse_run_mode(name);
  mode.activations.group_size = model.auto_group_size();
  mode.skip_layers = skip;
  return mode;
}

class DraftSkip : public ModelDirCopy {
 protected:
  DraftSkip() : ModelDirCopy("draft-skip") {}
};

}  // namespace

// "/sN" after the view and the vocabulary subset; draft_spec spells it back; the run mode's key
// tells skipping passes apart.
TEST(DraftSkipSpelling, ParsesComposesAndRoundTrips) {
  qspec::DecodePlan plan;
  plan.mode = "qspec";
  qspec::set_draft_spec(plan, "w4a16@256+8/v4096/s6");
  EXPECT_EQ(plan.draft, "w4a16");
  EXPECT_EQ(plan.draft_window, 256);
  EXPECT_EQ(plan.draft_sinks, 8);
  EXPECT_EQ(plan.draft_vocab, 4096);
  EXPECT_EQ(plan.draft_skip, 6);
  EXPECT_EQ(qspec::draft_spec(plan), "w4a16@256+8/v4096/s6");
  EXPECT_NO_THROW(qspec::validate(plan));
  qspec::set_draft_spec(plan, "w4a8/s3");
  EXPECT_EQ(plan.draft, "w4a8");
  EXPECT_EQ(plan.draft_vocab, 0);
  EXPECT_EQ(plan.draft_skip, 3);
  EXPECT_EQ(qspec::draft_spec(plan), "w4a8/s3");
  // The verify's own mode is a draft when it skips layers.
  qspec::set_draft_spec(plan, "w4a16/s2");
  EXPECT_NO_THROW(qspec::validate(plan));
  for (const char* bad : {"w4a8/s", "w4a8/sx", "w4a8/s-1", "w4a8/s2/v4096", "w4a8/x3"})
    EXPECT_THROW(qspec::set_draft_spec(plan, bad), qspec::DecodePlanError) << bad;
  qspec::RunMode mode = qspec::parse_run_mode("w4a8");
  const std::string plain = mode.key();
  mode.skip_layers = 2;
  EXPECT_NE(mode.key(), plain);
  EXPECT_EQ(mode.key(), plain + "/s2");
}

// Skipping with the planner, the n-gram draft or the no-overwrite ablation, or a negative count:
// each refused naming its field.
TEST(DraftSkipSpelling, ValidateRefusesSkipsThatCannotRun) {
  auto field_of = [](const qspec::DecodePlan& plan) {
    try {
      qspec::validate(plan);
    } catch (const qspec::DecodePlanError& e) {
      return e.field;
    }
    return std::string();
  };
  qspec::DecodePlan plan;
  plan.mode = "qspec";
  plan.draft = "auto";
  plan.draft_skip = 2;
  EXPECT_EQ(field_of(plan), "draft_skip");
  plan.draft = "ngram";
  EXPECT_EQ(field_of(plan), "draft_skip");
  plan.draft = "w4a8";
  plan.draft_skip = -1;
  EXPECT_EQ(field_of(plan), "draft_skip");
  plan.draft_skip = 2;
  plan.kv_overwrite = false;
  EXPECT_EQ(field_of(plan), "kv_overwrite");
  plan.kv_overwrite = true;
  EXPECT_EQ(field_of(plan), "");
}

// A skipping pass leaves the skipped layers' K/V rows unwritten and changes the logits; a pass
// through the table equals the layers run by hand without them.
TEST_F(DraftSkip, SkippedLayersWriteNoKvAndArePassedOver) {
  auto model = qspec::LlamaModel::load(dir_.string());
  model->quantize_weights(qspec::quant::Format::int4);
  const int64_t layers = model->config().num_layers;
  model->set_draft_skip(table_of(*model, {3, 5}));
  EXPECT_EQ(model->skipped_layers(1), (std::vector<bool>{false, false, false, true, false, false, false, false}));
  const std::vector<int32_t> tokens = {1, 17, 42, 5, 63, 9};
  const int64_t n = static_cast<int64_t>(tokens.size()), kv = model->config().kv_dim();
  std::vector<float> full, skipped;
  qspec::KvCache full_cache = model->new_cache(16), cache = model->new_cache(16);
  model->forward(tokens, full_cache, full, true, mode_of(*model, "w4a16"));
  model->forward(tokens, cache, skipped, true, mode_of(*model, "w4a16", 2));
  EXPECT_NE(full, skipped);
  for (int64_t l = 0; l < layers; ++l) {
    const bool was_skipped = l == 3 || l == 5;
    const float* keys = cache.keys(l);
    const bool written = std::any_of(keys, keys + n * kv, [](float v) { return v != 0.0f; });
    EXPECT_EQ(written, !was_skipped) << "layer " << l;
  }
  // By hand: embedding, the kept layers, the head.
  qspec::KvCache by_hand = model->new_cache(16);
  const int64_t hidden = model->config().hidden_size;
  std::vector<float> x(static_cast<size_t>(n * hidden));
  std::vector<int32_t> positions;
  for (int64_t t = 0; t < n; ++t) {
    model->input_embedding(tokens[t], &x[t * hidden]);
    positions.push_back(static_cast<int32_t>(t));
  }
  const qspec::RunMode w4a16 = mode_of(*model, "w4a16");
  qspec::LlamaModel::Workspace workspace = model->make_workspace(n);
  for (int64_t l = 0; l < layers; ++l)
    if (l != 3 && l != 5) model->run_layer(l, x.data(), n, positions.data(), by_hand, w4a16, nullptr, workspace);
  std::vector<float> logits;
  model->output_logits(x.data(), n, w4a16, workspace, logits);
  EXPECT_EQ(logits, skipped);
}

// The table round-trips through the checkpoint directory; a table for another model, or a
// malformed one, is an error at load naming the file and the field.
TEST_F(DraftSkip, TableRoundTripsAndForeignOrMalformedTablesAreErrorsAtLoad) {
  {
    auto model = qspec::LlamaModel::load(dir_.string());
    EXPECT_EQ(model->draft_skip(), nullptr);
    qspec::write_draft_skip_table(table_of(*model, {6, 2, 4}), dir_.string());
  }
  auto loaded = qspec::LlamaModel::load(dir_.string());
  ASSERT_NE(loaded->draft_skip(), nullptr);
  EXPECT_EQ(loaded->draft_skip()->order, (std::vector<int32_t>{6, 2, 4}));
  EXPECT_EQ(loaded->draft_skip()->agreement.size(), 4u);
  EXPECT_EQ(loaded->draft_skip()->draft_mode, "w4a16");
  const std::string file(qspec::kDraftSkipFile);
  const nlohmann::json good = read_json(file);
  EXPECT_EQ(good["format"], std::string(qspec::kDraftSkipFormat));
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"vocab_size", 32000}, {"hidden_size", 4096}, {"num_layers", 30}, {"architecture", "MistralForCausalLM"},
           {"lm_head_fingerprint", "0123456789abcdef"}}) {
    nlohmann::json broken = good;
    broken[field] = value;
    write_json(file, broken);
    const std::string message = error_of([&] { qspec::LlamaModel::load(dir_.string()); });
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find("'" + field + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("another model"), std::string::npos) << message;
  }
  auto expect_load_error = [&](const nlohmann::json& broken, const std::string& words) {
    write_json(file, broken);
    const std::string message = error_of([&] { qspec::LlamaModel::load(dir_.string()); });
    EXPECT_NE(message.find(words), std::string::npos) << message;
    EXPECT_NE(message.find(file), std::string::npos) << message;
  };
  nlohmann::json broken = good;
  broken["order"][1] = broken["order"][0];
  expect_load_error(broken, "appears twice");
  broken = good;
  broken["order"][2] = 8;
  expect_load_error(broken, "'order'[2]");
  broken = good;
  broken["order"] = nlohmann::json(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  expect_load_error(broken, "field 'order'");
  broken = good;
  broken["agreement"].push_back(0.1);
  expect_load_error(broken, "field 'agreement'");
  broken = good;
  broken.erase("draft_mode");
  expect_load_error(broken, "missing field 'draft_mode'");
  broken = good;
  broken["format"] = "qspec-draft-vocab-1";
  expect_load_error(broken, "field 'format'");
}

// Requests for skipping without a table (the message says how to make one), beyond the table,
// or with the no-overwrite ablation: refused at submit, naming draft_skip / kv_overwrite.
TEST_F(DraftSkip, EngineRefusesSkipsTheTableCannotServe) {
  auto model = qspec::LlamaModel::load(dir_.string());
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::Engine engine(*model, nullptr);
  auto submit = [&](int64_t draft_skip, bool overwrite = true) {
    return error_of([&] {
      qspec::Request r;
      r.prompt = {1, 2, 3};
      r.max_new_tokens = 4;
      r.plan.mode = "qspec";
      r.plan.draft = "w4a8";
      r.plan.draft_skip = draft_skip;
      r.plan.kv_overwrite = overwrite;
      engine.submit(r, [](const qspec::TokenEvent&) {});
    });
  };
  std::string message = submit(2);
  EXPECT_NE(message.find("draft_skip"), std::string::npos) << message;
  EXPECT_NE(message.find(std::string(qspec::kDraftSkipFile)), std::string::npos) << message;
  EXPECT_NE(message.find("qspec tune-draft"), std::string::npos) << message;
  model->set_draft_skip(table_of(*model, {6, 2}));
  message = submit(3);
  EXPECT_NE(message.find("draft_skip 3 is outside 1..2"), std::string::npos) << message;
  message = submit(2, false);
  EXPECT_NE(message.find("kv_overwrite"), std::string::npos) << message;
  EXPECT_EQ(submit(2), "");
  for (int step = 0; step < 16; ++step) engine.step();  // it runs (4 tokens)
  EXPECT_EQ(engine.metrics().requests_finished, 1);
}

// The search's agreement at every size is what a pass through the table it made gives: the
// cached residual streams it starts candidates from change nothing. Against itself (w4a16 vs
// w4a16) nothing skipped agrees everywhere.
TEST_F(DraftSkip, SearchAgreementEqualsPassesThroughItsTable) {
  auto model = qspec::LlamaModel::load(dir_.string());
  model->quantize_weights(qspec::quant::Format::int4);
  auto tokenizer = qspec::Tokenizer::load(dir_.string());
  const qspec::CalibrationSet text = qspec::load_calibration_text(
      QSPEC_SOURCE_DIR "/data/calibration/gsm-synth-self.txt", *tokenizer, 2, 64);
  const qspec::RunMode target = mode_of(*model, "w4a16"), draft = mode_of(*model, "w4a8");
  int64_t heard = 0;
  qspec::DraftSkipTable table = qspec::search_draft_skip(
      *model, text.sequences, draft, target, 3, [&](int64_t, int32_t, double, double) { ++heard; });
  EXPECT_EQ(heard, 3);
  ASSERT_EQ(table.order.size(), 3u);
  ASSERT_EQ(table.agreement.size(), 4u);
  EXPECT_EQ(table.draft_mode, "w4a8");
  static_cast<qspec::DraftTableIdentity&>(table) = qspec::draft_table_identity(*model, {"test"}, 0);
  model->set_draft_skip(table);
  auto picks = [&](const std::vector<int32_t>& tokens, const qspec::RunMode& mode) {
    qspec::KvCache cache = model->new_cache(static_cast<int64_t>(tokens.size()));
    std::vector<float> logits;
    model->forward(tokens, cache, logits, true, mode);
    std::vector<int32_t> ids;
    const int64_t vocab = model->config().vocab_size;
    for (size_t t = 0; t < tokens.size(); ++t)
      ids.push_back(static_cast<int32_t>(std::max_element(&logits[t * vocab], &logits[(t + 1) * vocab]) - &logits[t * vocab]));
    return ids;
  };
  for (int64_t k = 0; k <= 3; ++k) {
    qspec::RunMode skipping = draft;
    skipping.skip_layers = k;
    int64_t same = 0, count = 0;
    for (const auto& sequence : text.sequences) {
      const std::vector<int32_t> want = picks(sequence, target), got = picks(sequence, skipping);
      for (size_t t = 0; t < want.size(); ++t) same += want[t] == got[t], ++count;
    }
    EXPECT_DOUBLE_EQ(table.agreement[static_cast<size_t>(k)], static_cast<double>(same) / static_cast<double>(count))
        << "skipping " << k;
  }
  const qspec::DraftSkipTable itself = qspec::search_draft_skip(*model, text.sequences, target, target, 1);
  EXPECT_DOUBLE_EQ(itself.agreement[0], 1.0);
  EXPECT_NE(error_of([&] { qspec::search_draft_skip(*model, text.sequences, draft, target, 8); }).find("--skip-max"),
            std::string::npos);
}

// `qspec tune-draft` writes the skip table beside the vocabulary table; generate with
// --draft-skip then runs QSpec with it and prints W4A16's tokens; beyond the table it fails
// naming the table.
TEST_F(DraftSkip, TuneDraftCommandThenGenerateSkippingLayers) {
  int code = 0;
  const std::string dir = "'" + dir_.string() + "'";
  const std::string generate = "generate " + dir + " -p 'Question: Tom has 3 apples' -n 24 ";
  std::string out = run_qspec(generate + "--mode qspec --draft w4a8 --draft-skip 2", code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("qspec tune-draft"), std::string::npos) << out;

  out = run_qspec("tune-draft " + dir + " --calibration '" QSPEC_SOURCE_DIR
                  "/data/calibration/gsm-synth-self.txt' --vocab 300 --skip-max 3 --skip-tokens 200 --skip-mode w4a8",
                  code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find(std::string(qspec::kDraftSkipFile)), std::string::npos) << out;
  const nlohmann::json table = read_json(std::string(qspec::kDraftSkipFile));
  EXPECT_EQ(table["format"], std::string(qspec::kDraftSkipFormat));
  EXPECT_EQ(table["order"].size(), 3u);
  EXPECT_EQ(table["agreement"].size(), 4u);
  EXPECT_EQ(table["calibration_tokens"], 200);
  EXPECT_EQ(table["draft_mode"], "w4a8");
  EXPECT_EQ(table["num_layers"], 8);

  const std::string w4a16 = run_qspec(generate + "--mode w4a16", code, true);
  ASSERT_EQ(code, 0) << w4a16;
  EXPECT_FALSE(w4a16.empty());
  for (const char* draft : {"--draft w4a8 --draft-skip 2", "--draft w4a16 --draft-skip 3 --draft-vocab 128"}) {
    const std::string skipping = run_qspec(generate + "--mode qspec " + draft, code, true);
    ASSERT_EQ(code, 0) << skipping;
    EXPECT_EQ(skipping, w4a16) << draft;
  }
  out = run_qspec(generate + "--mode qspec --draft w4a8 --draft-skip 4", code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("draft_skip 4 is outside 1..3"), std::string::npos) << out;
}
