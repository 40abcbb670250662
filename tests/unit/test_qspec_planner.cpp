// The `--draft auto` planner's parts, on hand-made numbers: the step-cost table (JSON, validation
// naming the field at fault, interpolation, merging, the table a GPU bench record implies, where
// `--qspec-costs auto` finds one), the acceptance estimate and the n-gram probe, and the
// planner's choice (plain W4A16 where every draft is slower, a draft where the costs and the
// acceptance say it pays, the fallback without a table).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qspec/error.h"
#include "runtime/qspec_costs.h"
#include "runtime/qspec_planner.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using qspec::PlannerSequence;
using qspec::QSpecCostTable;
using qspec::QSpecPlanner;

const qspec::ModelShape kShape{30, 576, 1536, 9, 3, 64, 49152};

// One point: the W4A16 step, the verify at gammas 1 and 3 (linear in tokens: step x (1 + r g)),
// and each draft's step.
qspec::StepCostPoint point(int64_t batch, int64_t context, double step, double verify_token_cost,
                           std::map<std::string, double> drafts) {
  qspec::StepCostPoint p;
  p.batch = batch;
  p.context = context;
  p.w4a16_step_ms = step;
  for (int64_t g : {1, 3}) p.verify_ms[g] = step * (1.0 + verify_token_cost * static_cast<double>(g));
  p.draft_step_ms = std::move(drafts);
  return p;
}

QSpecCostTable table_of(std::vector<qspec::StepCostPoint> points) {
  QSpecCostTable t;
  t.device = "cpu: Test CPU, 2 threads";
  t.model = "smol";
  t.shape = kShape;
  t.points = std::move(points);
  return t;
}

// H200-like: every draft step costs at least the W4A16 step and a verify token ~7 % of a step.
QSpecCostTable gpu_like() {
  std::vector<qspec::StepCostPoint> points;
  for (int64_t context : {512, 4096})
    for (int64_t batch : {1, 16, 64}) {
      const double step = 2.0 + 0.1 * static_cast<double>(batch) + (context > 512 ? 1.0 : 0.0);
      points.push_back(point(batch, context, step, 0.4, {{"ngram", 0.0}, {"w4a8", 1.4 * step}, {"w4a4-nvfp4", step}}));
    }
  return table_of(points);
}

// A sequence for `planner`'s candidates: the same acceptance and proposable drafts for each.
PlannerSequence sequence(const QSpecPlanner& planner, int64_t context, double acceptance, int64_t proposable = 8,
                         int64_t room = 8) {
  PlannerSequence s;
  s.context = context;
  s.room = room;
  s.acceptance.assign(planner.candidates().size(), acceptance);
  s.proposable.assign(planner.candidates().size(), proposable);
  return s;
}

int candidate(const QSpecPlanner& planner, const std::string& draft) {
  for (size_t c = 0; c < planner.candidates().size(); ++c)
    if (planner.candidates()[c].draft == draft) return static_cast<int>(c);
  return -1;
}

// The field a bad table is refused for: the error's text after the source.
std::string refusal(const std::string& text) {
  try {
    QSpecCostTable::from_json(text, "costs.json");
  } catch (const qspec::Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("costs.json: ", 0), 0u) << message;  // names the file first
    return message;
  }
  return "";
}

}  // namespace

// ---- the table ----

TEST(QSpecCosts, JsonRoundTripsAndTheFileNameNamesDeviceAndModel) {
  QSpecCostTable t = gpu_like();
  t.acceptance["w4a8"] = 0.93;
  t.commit = "abc";
  const QSpecCostTable back = QSpecCostTable::from_json(t.to_json().dump(), "round trip");
  EXPECT_EQ(back.device, t.device);
  EXPECT_EQ(back.shape, t.shape);
  EXPECT_EQ(back.acceptance, t.acceptance);
  ASSERT_EQ(back.points.size(), t.points.size());
  for (size_t i = 0; i < t.points.size(); ++i) {
    EXPECT_EQ(back.points[i].verify_ms, t.points[i].verify_ms);
    EXPECT_EQ(back.points[i].draft_step_ms, t.points[i].draft_step_ms);
  }
  EXPECT_EQ(back.drafts(), (std::vector<std::string>{"ngram", "w4a4-nvfp4", "w4a8"}));
  EXPECT_EQ(back.gammas(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(qspec::cost_table_file_name("NVIDIA H200", "llama3-8b"), "qspec-costs-nvidia-h200-llama3-8b.json");
  EXPECT_EQ(qspec::cost_table_file_name("cpu: AMD EPYC 7B13, 2 threads", "smollm2"),
            "qspec-costs-cpu-amd-epyc-7b13-2-threads-smollm2.json");
}

TEST(QSpecCosts, InterpolatesLinearInBatchAndLogContextAndClampsAtTheEdges) {
  const QSpecCostTable t = table_of({point(1, 256, 10, 0.5, {{"w4a8", 4}}), point(9, 256, 50, 0.5, {{"w4a8", 20}}),
                                     point(1, 4096, 30, 0.5, {{"w4a8", 12}}), point(9, 4096, 90, 0.5, {{"w4a8", 36}})});
  EXPECT_DOUBLE_EQ(t.at(1, 256).w4a16_step_ms, 10);
  EXPECT_DOUBLE_EQ(t.at(5, 256).w4a16_step_ms, 30);                 // halfway in batch
  EXPECT_DOUBLE_EQ(t.at(5, 256).draft_step_ms.at("w4a8"), 12);
  EXPECT_NEAR(t.at(1, 1024).w4a16_step_ms, 20, 1e-9);               // halfway in log(context)
  EXPECT_NEAR(t.at(5, 1024).w4a16_step_ms, 0.5 * (30 + 60), 1e-9);  // both at once
  EXPECT_DOUBLE_EQ(t.at(64, 100000).w4a16_step_ms, 90);             // beyond the grid: its edge
  EXPECT_DOUBLE_EQ(t.at(0.5, 16).w4a16_step_ms, 10);
  // The verify: linear between measured gammas, from the W4A16 step at gamma 0.
  const qspec::StepCosts c = t.at(1, 256);
  EXPECT_DOUBLE_EQ(c.verify(0), 10);
  EXPECT_DOUBLE_EQ(c.verify(1), 15);
  EXPECT_DOUBLE_EQ(c.verify(2), 20);
  EXPECT_DOUBLE_EQ(c.verify(3), 25);
  EXPECT_DOUBLE_EQ(c.verify(0.5), 12.5);
  EXPECT_DOUBLE_EQ(c.verify(5), 35);  // past gamma 3: the last slope
}

TEST(QSpecCosts, MergeReplacesPointsAndRefusesAnotherDeviceOrModel) {
  QSpecCostTable a = table_of({point(1, 512, 2, 0.1, {{"ngram", 0}})});
  QSpecCostTable b = table_of({point(1, 512, 3, 0.1, {{"ngram", 0}}), point(1, 4096, 5, 0.1, {{"ngram", 0}})});
  b.acceptance["ngram"] = 0.4;
  a.merge(b);
  ASSERT_EQ(a.points.size(), 2u);
  EXPECT_DOUBLE_EQ(a.points[0].w4a16_step_ms, 3);  // measured again: replaced
  EXPECT_EQ(a.points[1].context, 4096);
  EXPECT_DOUBLE_EQ(a.acceptance.at("ngram"), 0.4);
  QSpecCostTable other_device = b;
  other_device.device = "NVIDIA H200";
  EXPECT_THROW(a.merge(other_device), qspec::Error);
  QSpecCostTable other_model = b;
  other_model.shape.layers = 32;
  EXPECT_THROW(a.merge(other_model), qspec::Error);
}

// Each malformed table is refused naming the file and the field at fault.
TEST(QSpecCosts, BadTablesAreRefusedNamingTheField) {
  const json good = gpu_like().to_json();
  ASSERT_EQ(refusal(good.dump()), "");
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    return refusal(j.dump());
  };
  auto expect = [](const std::string& message, const std::string& fragment) {
    EXPECT_NE(message.find(fragment), std::string::npos) << "wanted '" << fragment << "' in: " << message;
  };
  expect(refusal("{not json"), "not JSON");
  expect(with([](json& j) { j["format"] = "qspec-gemm-policy"; }), "not a qspec step-cost table");
  expect(with([](json& j) { j["version"] = 2; }), "version");
  expect(with([](json& j) { j.erase("device"); }), "missing \"device\"");
  expect(with([](json& j) { j["shape"].erase("vocab"); }), "shape: missing \"vocab\"");
  expect(with([](json& j) { j["points"] = json::array(); }), "points: empty");
  expect(with([](json& j) { j["points"][2].erase("w4a16_step_ms"); }), "points[2]: missing \"w4a16_step_ms\"");
  expect(with([](json& j) { j["points"][1]["w4a16_step_ms"] = "fast"; }), "points[1].w4a16_step_ms: expected a number");
  expect(with([](json& j) { j["points"][1]["w4a16_step_ms"] = -1; }), "points[1].w4a16_step_ms: must be > 0");
  expect(with([](json& j) { j["points"][0]["batch"] = 0; }), "points[0].batch: must be >= 1");
  expect(with([](json& j) { j["points"][0]["context"] = 1.5; }), "points[0].context: expected a whole number");
  expect(with([](json& j) { j["points"][3]["verify_ms"]["x"] = 1; }), "points[3].verify_ms: key \"x\" is not a gamma");
  expect(with([](json& j) { j["points"][3]["verify_ms"]["40"] = 1; }), "points[3].verify_ms: gamma 40 is not in 1..");
  expect(with([](json& j) { j["points"][4]["verify_ms"].erase("3"); }),
         "points[4].verify_ms: gammas {1} differ from points[0]'s {1,3}");
  expect(with([](json& j) { j["points"][5]["draft_step_ms"].erase("w4a8"); }), "points[5].draft_step_ms: drafts");
  expect(with([](json& j) { j["points"][0]["draft_step_ms"]["w9a9"] = 1; }), "points[0].draft_step_ms: draft \"w9a9\"");
  expect(with([](json& j) { j["points"][0]["draft_step_ms"]["auto"] = 1; }), "draft \"auto\"");
  expect(with([](json& j) { j["points"][0]["draft_step_ms"]["w4a16@256"] = 1; }), "is spelled \"w4a16@256+16\"");
  expect(with([](json& j) { j["points"][0]["draft_step_ms"]["ngram"] = -0.5; }), "draft_step_ms.ngram: must be >= 0");
  expect(with([](json& j) { j["points"][1]["batch"] = 1; }), "points[1]: a second point at batch 1, context 512");
  expect(with([](json& j) { j["acceptance"] = {{"w4a8", 1.5}}; }), "acceptance.w4a8: must be in [0, 1]");
}

// The GPU's table comes from `qspec bench --device cuda`'s record: the W4A16 decode steps, and
// each QSpec row's draft step and verify (means over what repeats), ngram at cost 0; priors from
// the acceptance trace the bench replayed.
TEST(QSpecCosts, FromAGpuBenchRecord) {
  json qspec_rows = json::array();
  for (int64_t batch : {1, 16})
    for (const char* draft : {"w4a8", "w4a16@256+16"})
      for (int64_t gamma : {1, 3}) {
        const double b = static_cast<double>(batch);
        qspec_rows.push_back({{"draft", draft},
                              {"batch", batch},
                              {"gamma", gamma},
                              {"draft_step_ms", (std::string(draft) == "w4a8" ? 3.0 : 2.0) + 0.1 * b + 0.01 * gamma},
                              {"verify_ms", 2.5 + 0.1 * b + 0.2 * gamma + (std::string(draft) == "w4a8" ? 0.02 : 0.0)}});
      }
  const json record = {
      {"gpu", "NVIDIA H200"},
      {"context", 4096},
      {"commit", "abc1234"},
      {"command", "qspec bench --device cuda ..."},
      {"modes",
       {{"w4a16",
         {{"decode", {{{"batch", 1}, {"step_ms", 2.1}}, {{"batch", 16}, {"step_ms", 4.9}}, {{"batch", 64}, {"step_ms", 12.0}}}},
          {"qspec", qspec_rows}}}}}};
  const json trace = {{"results",
                       {{{"draft", "w4a8"}, {"gamma", 2}, {"kv_overwrite", true}, {"accepted_histogram", {1, 1, 8}}},
                        {{"draft", "w4a8"}, {"gamma", 2}, {"kv_overwrite", false}, {"accepted_histogram", {9, 0, 0}}},
                        {{"draft", "w4a4-int4"}, {"gamma", 1}, {"accepted_histogram", {1, 1}}}}}};
  const QSpecCostTable t = QSpecCostTable::from_gpu_bench_record(record, kShape, "llama3-8b", &trace);
  EXPECT_EQ(t.device, "NVIDIA H200");
  EXPECT_EQ(t.model, "llama3-8b");
  ASSERT_EQ(t.points.size(), 2u);  // batch 64 has no QSpec rows
  const qspec::StepCostPoint& p = t.points[1];
  EXPECT_EQ(p.batch, 16);
  EXPECT_EQ(p.context, 4096);
  EXPECT_DOUBLE_EQ(p.w4a16_step_ms, 4.9);
  EXPECT_NEAR(p.verify_ms.at(3), 2.5 + 1.6 + 0.6 + 0.01, 1e-12);  // the mean over both drafts
  EXPECT_NEAR(p.draft_step_ms.at("w4a8"), 3.0 + 1.6 + 0.02, 1e-12);  // the mean over both gammas
  EXPECT_DOUBLE_EQ(p.draft_step_ms.at("ngram"), 0.0);
  // w4a8 with overwrite: 8 cycles kept both (16 kept), one kept one then a rejection, one rejected
  // at once: 17 kept, 2 rejections. The no-overwrite rows and drafts the table lacks do not count.
  ASSERT_EQ(t.acceptance.size(), 1u);
  EXPECT_NEAR(t.acceptance.at("w4a8"), 17.0 / 19.0, 1e-12);
  json no_qspec = record;
  no_qspec["modes"]["w4a16"].erase("qspec");
  EXPECT_THROW(QSpecCostTable::from_gpu_bench_record(no_qspec, kShape, "x"), qspec::Error);
}

TEST(QSpecCosts, AutoFindsTheTableOfThisDeviceAndModelAndRefusesABrokenOne) {
  const fs::path dir = fs::temp_directory_path() / ("qspec-costs-find-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  write("a-policy.json", R"({"format": "qspec-gemm-policy", "version": 1, "entries": []})");
  write("b-notes.json", "[1, 2, 3]");
  write("c-broken-text.json", "{not json");
  QSpecCostTable other = gpu_like();
  other.device = "NVIDIA H100";
  write("d-other-gpu.json", other.to_json().dump());
  QSpecCostTable mine = gpu_like();
  mine.device = "NVIDIA H200";
  write("e-mine.json", mine.to_json().dump());
  EXPECT_EQ(qspec::find_cost_table({"/no/such/dir", dir.string()}, "NVIDIA H200", kShape), (dir / "e-mine.json").string());
  EXPECT_EQ(qspec::find_cost_table({dir.string()}, "NVIDIA A100", kShape), "");
  qspec::ModelShape another = kShape;
  another.hidden = 4096;
  EXPECT_EQ(qspec::find_cost_table({dir.string()}, "NVIDIA H200", another), "");
  // The KV cache it was measured on: an int8 engine takes the int8 table, an f16 one the f16 table
  // (a file without "kv_cache" is an f16 table, as every table before the 8-bit cache).
  EXPECT_EQ(qspec::find_cost_table({dir.string()}, "NVIDIA H200", kShape, qspec::KvCacheFormat::int8), "");
  QSpecCostTable mine_int8 = mine;
  mine_int8.kv_cache = qspec::KvCacheFormat::int8;
  write("f-mine-int8.json", mine_int8.to_json().dump());
  EXPECT_EQ(qspec::find_cost_table({dir.string()}, "NVIDIA H200", kShape, qspec::KvCacheFormat::int8),
            (dir / "f-mine-int8.json").string());
  EXPECT_EQ(qspec::find_cost_table({dir.string()}, "NVIDIA H200", kShape), (dir / "e-mine.json").string());
  EXPECT_EQ(QSpecCostTable::from_json(mine_int8.to_json().dump(), "t").kv_cache, qspec::KvCacheFormat::int8);
  json no_format = mine.to_json();
  no_format.erase("kv_cache");
  EXPECT_EQ(QSpecCostTable::from_json(no_format.dump(), "t").kv_cache, qspec::KvCacheFormat::f16);
  json bad_format = mine.to_json();
  bad_format["kv_cache"] = "int4";
  EXPECT_THROW(QSpecCostTable::from_json(bad_format.dump(), "t"), qspec::Error);
  QSpecCostTable merged = mine;
  EXPECT_THROW(merged.merge(mine_int8), qspec::Error);
  fs::remove(dir / "f-mine-int8.json");
  // A file that says it is a cost table but is broken: an error naming it, not a silent skip.
  json broken = mine.to_json();
  broken["points"][0].erase("verify_ms");
  write("a0-broken-table.json", broken.dump());
  try {
    qspec::find_cost_table({dir.string()}, "NVIDIA H200", kShape);
    ADD_FAILURE() << "a broken cost table was skipped";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a0-broken-table.json: points[0].verify_ms"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// ---- acceptance ----

TEST(QSpecPlanner, AcceptanceIsAnEmaOfFirstDraftsKeptWithAPrior) {
  const double d = qspec::planner_rules::kAcceptanceDecay;
  qspec::DraftAcceptance a;
  EXPECT_DOUBLE_EQ(a.estimate(0.5), 0.5);  // nothing seen: the prior
  a.observe(3, true);                        // first draft kept (then 2 more, then a rejection)
  EXPECT_NEAR(a.estimate(0.5, 4), (1 + 0.5 * 4 * d) / (1 + 4 * d), 1e-12);
  a.observe(0, true);  // first draft rejected
  EXPECT_NEAR(a.estimate(0.0, 0.0), d / (d + 1), 1e-12);
  EXPECT_NEAR(a.estimate(0.2, 4), (d + 0.2 * 4 * d * d) / (d + 1 + 4 * d * d), 1e-12);
  a.observe(0, false);  // nothing proposed, nothing decided: only the decay
  EXPECT_NEAR(a.estimate(0.0, 0.0), d * d / (d * d + d), 1e-12);
  for (int i = 0; i < 200; ++i) a.observe(0, true);  // then every draft rejected: it forgets
  EXPECT_LT(a.estimate(0.5, 0), 1e-6);
  EXPECT_LT(a.estimate(0.5), 1e-6);  // and so does the prior: a sequence's own evidence decides
  // A steady acceptance is estimated without bias however strong the prior was.
  qspec::DraftAcceptance steady;
  for (int i = 0; i < 100; ++i) steady.observe(i % 2, true);  // every other first draft kept
  EXPECT_NEAR(steady.estimate(0.0, 100.0), 0.5, 0.03);
}

// Drafts after a kept one have their own rate (the continuation): prompt lookups keep few first
// drafts but most of the rest. The model's yield is 1 + a (1 + c + ... + c^(g-1)).
TEST(QSpecPlanner, ContinuationIsTheRateOfDraftsAfterAKeptOne) {
  EXPECT_DOUBLE_EQ(qspec::expected_tokens(0.4, 0.4, 0), 1.0);
  EXPECT_NEAR(qspec::expected_tokens(0.4, 0.4, 3), (1 - std::pow(0.4, 4)) / 0.6, 1e-12);  // geometric
  EXPECT_NEAR(qspec::expected_tokens(0.4, 0.8, 4), 1 + 0.4 * (1 + 0.8 + 0.64 + 0.512), 1e-12);
  EXPECT_DOUBLE_EQ(qspec::expected_tokens(1.0, 1.0, 5), 6.0);
  qspec::DraftAcceptance a;
  EXPECT_DOUBLE_EQ(a.continuation(0.3), 0.3);  // nothing seen: the prior
  // Lookups as Qwen2.5-7B's at batch 4 (H200, gamma 4: of 766 cycles 452 kept none, 87 one, 47
  // two, 43 three, 137 all; 41 % first drafts kept, 75 % of the later ones): here a steady pattern
  // of five cycles, none, none, none, all four, two then a rejection: 2 / 5 first drafts kept,
  // 4 / 5 of the later ones decided.
  for (int i = 0; i < 200; ++i)
    for (int64_t kept : {0, 0, 0, 4, 2}) a.observe(kept, kept < 4);
  const double first = a.estimate(0.0), next = a.continuation(first);
  EXPECT_NEAR(first, 0.4, 0.1);  // an average over ~10 cycles: the phase of the pattern shows
  EXPECT_NEAR(next, 0.8, 0.1);
  // They yield 1 + 6 / 5 = 2.2 tokens a cycle; the model says about that, the geometric run at the
  // first draft's rate 1.65.
  EXPECT_NEAR(qspec::expected_tokens(0.4, 0.8, 4), 2.2, 0.03);
  EXPECT_NEAR(qspec::expected_tokens(0.4, 0.4, 4), 1.6496, 1e-9);
}

// The probe checks what prompt lookup would have proposed against the tokens that came, and
// files each outcome under the length of the suffix the lookup matched.
TEST(QSpecPlanner, NgramProbeMeasuresLookupAcceptanceOnCommittedTokens) {
  qspec::NgramAcceptance acceptance;
  qspec::NgramProbe probe;
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 9, 1, 2};  // "1 2" recurs: proposes 3 4 5 9 (a match of 2)
  probe.update(tokens, 4, 1, 3, acceptance);
  EXPECT_EQ(acceptance.pooled.evidence(), 0);
  tokens.push_back(3);  // agrees so far: undecided
  probe.update(tokens, 4, 1, 3, acceptance);
  EXPECT_EQ(acceptance.pooled.evidence(), 0);
  tokens.push_back(4);
  tokens.push_back(7);  // 3 4 kept, then 7 instead of 5: two kept and a rejection
  probe.update(tokens, 4, 1, 3, acceptance);
  // The first draft kept; of the later ones decided, one kept and one rejected.
  EXPECT_DOUBLE_EQ(acceptance.pooled.estimate(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(acceptance.pooled.continuation(0, 0), 0.5);
  EXPECT_DOUBLE_EQ(acceptance.by_match[1].estimate(0, 0), 1.0);  // filed under a match of 2
  EXPECT_DOUBLE_EQ(acceptance.by_match[1].continuation(0, 0), 0.5);
  EXPECT_EQ(acceptance.by_match[0].evidence(), 0);
  // A new proposal from the tokens now: "7" never occurred before, "4 7" neither: nothing.
  tokens.push_back(1);  // "1" recurs at the end (a match of 1): proposes 2 3 4 7 ...
  probe.update(tokens, 4, 1, 3, acceptance);  // (the empty proposal resolves nothing; this proposes)
  for (int32_t t : {2, 3, 4, 7}) tokens.push_back(t);
  probe.update(tokens, 4, 1, 3, acceptance);  // all four kept
  const double d = qspec::planner_rules::kAcceptanceDecay;
  EXPECT_DOUBLE_EQ(acceptance.pooled.estimate(0, 0), 1.0);
  EXPECT_NEAR(acceptance.pooled.continuation(0, 0), (d + 3) / (2 * d + 3), 1e-12);
  EXPECT_DOUBLE_EQ(acceptance.by_match[0].estimate(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(acceptance.by_match[0].continuation(0, 0), 1.0);
  // A lookup is weighed by its class: a class without evidence starts from the pooled estimate.
  EXPECT_DOUBLE_EQ(acceptance.estimate(1, 0.0), acceptance.by_match[0].estimate(acceptance.pooled.estimate(0.0)));
  EXPECT_NEAR(acceptance.estimate(3, 0.0), acceptance.pooled.estimate(0.0), 1e-12);  // no match of 3+ seen yet
  EXPECT_NEAR(acceptance.continuation(3, 0.0), acceptance.pooled.continuation(acceptance.estimate(3, 0.0)), 1e-12);
  EXPECT_EQ(qspec::NgramAcceptance::match_class(7), qspec::planner_rules::kNgramMatchClasses - 1);
}

// The engine's population estimate (every sequence's probe outcomes, a longer memory) is the
// prior of a sequence's own: a new sequence starts where the engine's lookups have been, and
// its own outcomes take over.
TEST(QSpecPlanner, NgramProbeFeedsTheEnginesPopulationEstimate) {
  qspec::NgramAcceptance population(qspec::planner_rules::kPopulationAcceptanceDecay);
  for (int s = 0; s < 3; ++s) {  // three sequences whose lookups of "1 2" keep 3 4, then miss
    qspec::NgramAcceptance own;
    qspec::NgramProbe probe;
    std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 9, 1, 2};
    probe.update(tokens, 4, 1, 3, own, nullptr, &population);
    for (int32_t t : {3, 4, 7}) tokens.push_back(t);
    probe.update(tokens, 4, 1, 3, own, nullptr, &population);
    EXPECT_DOUBLE_EQ(own.by_match[1].estimate(0, 0), 1.0);
  }
  // Each outcome decides 3 drafts (the first kept, the second kept, the third rejected); 0.99 a step.
  EXPECT_NEAR(population.by_match[1].evidence(), 3 * (1 + 0.99 + 0.99 * 0.99), 1e-12);
  // Every first draft kept: well above the n-gram prior of 0, which still weighs 4 x 0.99^3 drafts.
  const double w = qspec::planner_rules::kPriorWeight * 0.99 * 0.99 * 0.99, kept = 1 + 0.99 + 0.99 * 0.99;
  const double pooled_first = kept / (kept + w);
  EXPECT_NEAR(population.estimate(2, 0.0), (kept + pooled_first * w) / (kept + w), 1e-12);
  EXPECT_GT(population.estimate(2, 0.0), 0.6);
  // A new sequence with no outcomes of its own: the population's estimates.
  const qspec::NgramAcceptance fresh;
  const double first = population.estimate(2, 0.0), next = population.continuation(2, 0.0);
  EXPECT_DOUBLE_EQ(fresh.estimate(2, first), first);
  EXPECT_DOUBLE_EQ(fresh.continuation(2, first, next), next);
  EXPECT_GT(next, 0.4);  // half the later drafts kept, the prior's weight pulling toward the first's
  EXPECT_LT(next, first);
  // Without a continuation prior, a fresh sequence's continuation is its first draft's (geometric).
  EXPECT_DOUBLE_EQ(fresh.continuation(2, first), first);
}

// ---- the planner ----

// Where every draft costs a W4A16 step or more (the H200 today), nothing pays, even at full
// acceptance: plain W4A16, with the best draft's prediction in the reason.
TEST(QSpecPlanner, PicksW4A16WhenEveryDraftIsSlower) {
  QSpecCostTable t = gpu_like();
  for (auto& p : t.points) p.draft_step_ms.erase("ngram");
  for (auto& p : t.points)
    for (auto& [g, ms] : p.verify_ms) ms = p.w4a16_step_ms * (1.0 + 1.2 * static_cast<double>(g));  // a verify token > a step
  const QSpecPlanner planner(t, {}, "gpu.json");
  for (int64_t batch : {1, 8, 64})
    for (int64_t context : {300, 2048, 8192}) {
      const std::vector<PlannerSequence> seqs(static_cast<size_t>(batch), sequence(planner, context, 1.0));
      const qspec::StepPlan plan = planner.plan(seqs);
      EXPECT_FALSE(plan.speculates()) << batch << " " << context << ": " << plan.reason;
      EXPECT_EQ(plan.label, "w4a16");
      EXPECT_LT(plan.predicted_gain, 1.0);
      EXPECT_EQ(plan.reason.rfind("w4a16: best draft ", 0), 0u) << plan.reason;
      EXPECT_NE(plan.reason.find("drafts to propose in " + std::to_string(batch) + " of " + std::to_string(batch)),
                std::string::npos)
          << plan.reason;
    }
}

// The predicted gain is the model's formula: (sum of E / cycle) / (B / step).
TEST(QSpecPlanner, PredictedGainIsExpectedTokensOverCycleCost) {
  const QSpecPlanner planner(table_of({point(1, 512, 10, 0.5, {{"ngram", 0}, {"w4a8", 2}})}));
  const int w4a8 = candidate(planner, "w4a8"), ngram = candidate(planner, "ngram");
  ASSERT_GE(w4a8, 0);
  ASSERT_GE(ngram, 0);
  const std::vector<PlannerSequence> one{sequence(planner, 512, 0.8)};
  // gamma 3: E = 1 + .8 + .64 + .512; cycle = 3 x 2 + verify(3) = 6 + 25.
  const double e3 = 1 + 0.8 + 0.64 + 0.512;
  EXPECT_NEAR(planner.predicted_gain(one, w4a8, 3), (e3 / 31.0) / (1.0 / 10.0), 1e-12);
  EXPECT_NEAR(planner.predicted_gain(one, ngram, 3), (e3 / 25.0) / (1.0 / 10.0), 1e-12);
  // An n-gram lookup with one draft caps its gamma (and its verify) at 1: E = 1.8, cycle 15.
  const std::vector<PlannerSequence> short_lookup{sequence(planner, 512, 0.8, /*proposable=*/1)};
  EXPECT_NEAR(planner.predicted_gain(short_lookup, ngram, 3), (1.8 / 15.0) * 10.0, 1e-12);
  // Two sequences, one accepting everything and one nothing: E = 4 + 1 over verify(3) = 25.
  std::vector<PlannerSequence> two{sequence(planner, 512, 1.0), sequence(planner, 512, 0.0)};
  EXPECT_NEAR(planner.predicted_gain(two, ngram, 3), (5.0 / 25.0) / (2.0 / 10.0), 1e-12);
  // A sequence with room for one more token only: its cycle has no draft.
  const std::vector<PlannerSequence> ending{sequence(planner, 512, 0.9, 8, /*room=*/0)};
  EXPECT_NEAR(planner.predicted_gain(ending, ngram, 3), 1.0, 1e-12);
}

// A cheap verify and a sequence whose lookups are being accepted: n-gram drafts pay, and the
// planner takes the gamma with the best prediction. A cheap draft step with high acceptance:
// the model draft. Low acceptance: plain again.
TEST(QSpecPlanner, PicksADraftWhereTheTableAndTheAcceptanceSayItPays) {
  const QSpecPlanner planner(table_of({point(1, 512, 10, 0.1, {{"ngram", 0}, {"w4a8", 1}}),
                                       point(4, 512, 20, 0.1, {{"ngram", 0}, {"w4a8", 2}})}),
                             std::vector<std::string>{"ngram"});
  ASSERT_EQ(planner.candidates().size(), 1u);  // only the drafts it was given
  const qspec::StepPlan plan = planner.plan(std::vector<PlannerSequence>{sequence(planner, 512, 0.8)});
  ASSERT_TRUE(plan.speculates()) << plan.reason;
  EXPECT_EQ(plan.gamma, 3);  // the largest measured: its gain grows with gamma here
  EXPECT_EQ(plan.label, "ngram g3");
  EXPECT_NEAR(plan.predicted_gain, (1 + 0.8 + 0.64 + 0.512) / 13.0 * 10.0, 1e-12);
  EXPECT_NE(plan.reason.find("predicted 2.27x"), std::string::npos) << plan.reason;
  // No lookup (no n-gram recurs): nothing to verify but the token, no gain.
  EXPECT_FALSE(planner.plan(std::vector<PlannerSequence>{sequence(planner, 512, 0.8, /*proposable=*/0)}).speculates());

  const QSpecPlanner both(table_of({point(1, 512, 10, 0.1, {{"w4a8", 1}})}));
  EXPECT_EQ(both.candidates()[0].prior, qspec::planner_rules::kDefaultAcceptancePrior);
  qspec::StepPlan high = both.plan(std::vector<PlannerSequence>{sequence(both, 512, 0.95)});
  ASSERT_TRUE(high.speculates()) << high.reason;
  EXPECT_EQ(high.label, "w4a8 g3");
  qspec::StepPlan low = both.plan(std::vector<PlannerSequence>{sequence(both, 512, 0.05)});
  EXPECT_FALSE(low.speculates()) << low.reason;
  EXPECT_NE(low.reason.find("< 1.05x"), std::string::npos) << low.reason;
}

// Gains just above 1 are not enough: the margin keeps a model's error from becoming a loss.
TEST(QSpecPlanner, SpeculatesOnlyAboveTheMargin) {
  // ngram at gamma 1: E = 1 + a over verify(1) = 1.2 steps: gain (1 + a) / 1.2.
  const QSpecPlanner planner(table_of({point(1, 512, 10, 0.2, {{"ngram", 0}})}));
  auto gain_at = [&](double a) { return planner.plan(std::vector<PlannerSequence>{sequence(planner, 512, a, 1)}); };
  EXPECT_FALSE(gain_at(0.22).speculates());  // 1.017x
  EXPECT_FALSE(gain_at(0.25).speculates());  // 1.042x
  EXPECT_TRUE(gain_at(0.28).speculates());   // 1.067x
}

// Without a table: n-gram drafts only, only once a sequence has shown (probed) acceptance (the
// prior is 0), and only once the batch size's plain steps are timed; until its verify passes are
// timed too it explores, a verify token priced at kExploreVerifyTokenCost of a step.
TEST(QSpecPlanner, FallsBackToProvenNgramDraftsWithoutATable) {
  QSpecPlanner planner(std::nullopt);
  EXPECT_FALSE(planner.has_table());
  ASSERT_EQ(planner.candidates().size(), 1u);
  EXPECT_EQ(planner.candidates()[0].draft, "ngram");
  EXPECT_EQ(planner.candidates()[0].prior, 0.0);
  EXPECT_NE(planner.describe().find("no step-cost table"), std::string::npos);
  qspec::DraftAcceptance proven;
  for (int i = 0; i < 20; ++i) proven.observe(4, false);  // estimate 0.90
  const std::vector<PlannerSequence> sure = {sequence(planner, 100, proven.estimate(0.0))};
  // No plain step timed at this batch size yet: plain, whatever the acceptance.
  qspec::StepPlan plan = planner.plan(sure);
  EXPECT_FALSE(plan.speculates()) << plan.reason;
  EXPECT_NE(plan.reason.find("timing plain steps"), std::string::npos) << plan.reason;
  planner.observe_pass(1, 1, 0.030);  // the class's warm-up: not timed
  for (int i = 0; i < 3; ++i) planner.observe_pass(1, 1, 0.010);
  EXPECT_FALSE(planner.plan(sure).speculates()) << "three plain steps are not enough";
  planner.observe_pass(1, 1, 0.010);
  // A sequence with nothing proven yet: its estimate is the prior's 0, nothing to gain.
  qspec::DraftAcceptance fresh;
  plan = planner.plan(std::vector<PlannerSequence>{sequence(planner, 100, fresh.estimate(0.0))});
  EXPECT_FALSE(plan.speculates()) << plan.reason;
  // Proven lookups speculate, exploring: at 0.1 of a step a verify token, 0.4 acceptance pays
  // ((1 + 0.4) / 1.1 = 1.27x at gamma 1).
  plan = planner.plan(sure);
  ASSERT_TRUE(plan.speculates()) << plan.reason;
  EXPECT_EQ(plan.label.rfind("ngram g", 0), 0u);
  const std::vector<PlannerSequence> some = {sequence(planner, 100, 0.4, 4)};
  plan = planner.plan(some);
  ASSERT_TRUE(plan.speculates()) << plan.reason;
  EXPECT_NE(plan.reason.find("exploring"), std::string::npos) << plan.reason;
  // Its verify passes timed on a CPU-like device (a token 60 % of a step): the measured price
  // rules, and 0.4 no longer pays; 0.9 still does.
  planner.observe_pass(1, 3, 0.060);  // the first verify pass: warm-up, not timed
  for (int i = 0; i < 3; ++i) planner.observe_pass(1, 3, 0.022);
  EXPECT_TRUE(planner.plan(some).speculates()) << "three timed verify passes are not enough";
  planner.observe_pass(1, 3, 0.022);
  plan = planner.plan(some);
  EXPECT_FALSE(plan.speculates()) << plan.reason;
  EXPECT_NE(plan.reason.find("measured passes"), std::string::npos) << plan.reason;
  EXPECT_TRUE(planner.plan(sure).speculates());
  // Plain for kRemeasureAfterPlainSteps steps at the measured price: one small cycle at the
  // exploring price re-measures it, and the verify pass that follows makes it current again.
  for (int64_t i = 1; i < qspec::planner_rules::kRemeasureAfterPlainSteps; ++i) planner.observe_pass(1, 1, 0.010);
  EXPECT_FALSE(planner.plan(some).speculates()) << planner.plan(some).reason;
  planner.observe_pass(1, 1, 0.010);
  plan = planner.plan(some);
  ASSERT_TRUE(plan.speculates()) << plan.reason;
  EXPECT_LE(plan.gamma, qspec::planner_rules::kRemeasureMaxGamma);
  EXPECT_NE(plan.reason.find("re-measuring"), std::string::npos) << plan.reason;
  planner.observe_pass(1, 2, 0.016);
  EXPECT_FALSE(planner.plan(some).speculates()) << planner.plan(some).reason;
  // Another batch size starts over: its plain steps first.
  std::vector<PlannerSequence> four(4, sure[0]);
  EXPECT_NE(planner.plan(four).reason.find("timing plain steps"), std::string::npos);
  EXPECT_FALSE(planner.plan({}).speculates());
}

// The engine's own passes, timed: a plain step's time and a line through what verify passes add
// per batch-size class, used once a class has enough of both.
TEST(QSpecPlanner, MeasuredPassCostsFitWhatVerifiesAddPerBatchClass) {
  qspec::MeasuredPassCosts costs;
  EXPECT_FALSE(costs.verify_cost(1).has_value());
  // Each kind's first pass is the class's warm-up (a new batch size allocating): not timed.
  costs.observe(1, 1, 0.050), costs.observe(1, 5, 0.080);
  for (int i = 0; i < 3; ++i) costs.observe(1, 1, 0.002);   // plain steps, batch 1: 2 ms
  for (int i = 0; i < 4; ++i) costs.observe(1, 5, 0.0024);  // verifies of 4 drafts: +0.4 ms
  EXPECT_FALSE(costs.verify_cost(1).has_value()) << "three plain steps are not enough";
  costs.observe(1, 1, 0.002);
  ASSERT_TRUE(costs.verify_cost(1).has_value());
  // One draft count seen: no intercept to tell apart, proportional (0.1 ms of a 2 ms step a token).
  EXPECT_NEAR(costs.verify_cost(1)->per_token, 0.05, 1e-9);
  EXPECT_NEAR(costs.verify_cost(1)->fixed, 0.0, 1e-9);
  // Batch 5-8: leaving the plain step costs 0.5 ms, each verify token 0.05 ms more.
  EXPECT_FALSE(costs.verify_cost(8).has_value());
  for (int i = 0; i < 6; ++i)
    costs.observe(6, 6, 0.002), costs.observe(6, 8, 0.0026), costs.observe(6, 14, 0.0029);
  ASSERT_TRUE(costs.verify_cost(5).has_value());
  EXPECT_NEAR(costs.verify_cost(8)->fixed, 0.25, 1e-6);
  EXPECT_NEAR(costs.verify_cost(8)->per_token, 0.025, 1e-6);
  EXPECT_FALSE(costs.verify_cost(9).has_value());
  // Nonsense passes are ignored; verifies faster than the step count as free, never negative.
  costs.observe(0, 1, 1.0), costs.observe(4, 2, 1.0), costs.observe(1, 1, 0.0);
  EXPECT_NEAR(costs.verify_cost(1)->per_token, 0.05, 1e-9);
  for (int i = 0; i < 400; ++i) costs.observe(1, 3, 0.001);
  EXPECT_NEAR(costs.verify_cost(1)->per_token, 0.0, 1e-6);
  EXPECT_NEAR(costs.verify_cost(1)->fixed, 0.0, 1e-6);
}

// Without a table the planner learns what a verify token costs from the engine's passes: on a
// GPU-like device (a token 5 % of a step) lookups kept 40 % of the time pay, which the fallback's
// price (0.75 of a step) refuses.
TEST(QSpecPlanner, WithoutATableTheFallbackPricesWithMeasuredPasses) {
  QSpecPlanner planner(std::nullopt);
  const std::vector<PlannerSequence> one = {sequence(planner, 100, 0.4, 4)};
  EXPECT_FALSE(planner.plan(one).speculates()) << planner.plan(one).reason;
  for (int i = 0; i < 8; ++i) planner.observe_pass(1, 1, 0.002), planner.observe_pass(1, 3, 0.0022);
  const qspec::StepPlan plan = planner.plan(one);
  ASSERT_TRUE(plan.speculates()) << plan.reason;
  EXPECT_NE(plan.reason.find("measured passes"), std::string::npos) << plan.reason;
  // The passes seen verify 3 tokens, in the 3-4-token bucket (+0.1 of a step): gamma 3 (4 tokens)
  // costs what gamma 2 does, so (1 + 0.4 + 0.16 + 0.064) / 1.10 beats 1.56 / 1.10, 1.40 / 1.05
  // (the line: 2 tokens, 1 verify token) and gamma 4's 1.650 / 1.20 (5 tokens, the next bucket,
  // not yet timed: the line, 0.05 a verify token).
  EXPECT_EQ(plan.gamma, 3) << plan.reason;
  EXPECT_NEAR(plan.predicted_gain, 1.624 / 1.10, 1e-6) << plan.reason;
  // A CPU-like device (a token 60 % of a step): the same lookups do not pay.
  QSpecPlanner cpu(std::nullopt);
  for (int i = 0; i < 8; ++i) cpu.observe_pass(1, 1, 0.010), cpu.observe_pass(1, 3, 0.022);
  EXPECT_FALSE(cpu.plan(one).speculates()) << cpu.plan(one).reason;
  // A planner with a table keeps the table's costs.
  QSpecPlanner tabled(gpu_like());
  const qspec::StepPlan before = tabled.plan(std::vector<PlannerSequence>{sequence(tabled, 100, 0.4, 4)});
  for (int i = 0; i < 8; ++i) tabled.observe_pass(1, 1, 0.002), tabled.observe_pass(1, 3, 0.2);
  EXPECT_EQ(tabled.plan(std::vector<PlannerSequence>{sequence(tabled, 100, 0.4, 4)}).predicted_gain,
            before.predicted_gain);
}

// A verify pass's price is a staircase in its tokens (the GEMMs' token tiles): each bucket of a
// pass's tokens (1, 2, 3-4, 5-8, 9-16, ...) is priced by its own passes once timed, flat within
// it, and an untimed bucket by the line through all, kept between its timed neighbours.
TEST(QSpecPlanner, VerifyPassesArePricedByTheBucketOfTheirTokens) {
  qspec::MeasuredPassCosts costs;
  costs.observe(4, 4, 0.050), costs.observe(4, 8, 0.080);  // the class's warm-ups
  for (int i = 0; i < 6; ++i) {
    costs.observe(4, 4, 0.002);                             // plain steps: 2 ms
    costs.observe(4, 8, 0.0024), costs.observe(4, 7, 0.0024);  // 5-8 tokens: +0.4 ms
    costs.observe(4, 12, 0.005);                            // 9-16 tokens: +3 ms
  }
  const auto verify = costs.verify_cost(4);
  ASSERT_TRUE(verify.has_value());
  EXPECT_NEAR(verify->extra(8, 4), 0.2, 1e-6);
  EXPECT_NEAR(verify->extra(6, 2), 0.2, 1e-6);  // flat within the bucket
  EXPECT_NEAR(verify->extra(12, 8), 1.5, 1e-6);
  EXPECT_NEAR(verify->extra(16, 12), 1.5, 1e-6);
  // 17-32 tokens, never timed: the line through the passes, never below the 9-16 bucket's price.
  const double line = verify->fixed + verify->per_token * 20;
  EXPECT_NEAR(verify->extra(24, 20), std::max(line, 1.5), 1e-6);
  EXPECT_GE(verify->extra(24, 20), 1.5);
  // A bucket not seen for kRemeasureAfterPlainSteps of the class's passes is untimed again (a
  // price never paid is never re-timed otherwise): the line prices it until its passes come back.
  // (The 5-8 bucket's last pass came one before the 9-16 bucket's.)
  for (int64_t i = 0; i < qspec::planner_rules::kRemeasureAfterPlainSteps - 1; ++i) costs.observe(4, 4, 0.002);
  EXPECT_NEAR(costs.verify_cost(4)->extra(8, 4), verify->extra(8, 4), 1e-6) << "not stale yet";
  costs.observe(4, 4, 0.002);
  const auto stale = costs.verify_cost(4);
  ASSERT_TRUE(stale.has_value());
  EXPECT_NEAR(stale->extra(12, 8), 1.5, 1e-6);  // still timed
  // Untimed below the one timed bucket: the line, at most that bucket's price scaled by tokens.
  EXPECT_NEAR(stale->extra(8, 4), std::min(std::max(stale->fixed + stale->per_token * 4, 0.0), 1.5 * 4 / 8), 1e-6);
  costs.observe(4, 8, 0.0024);  // one pass of the 5-8 bucket: timed again (its old passes still count)
  EXPECT_NEAR(costs.verify_cost(4)->extra(8, 4), 0.2, 1e-6);

  // Below every timed bucket, an untimed one is priced at most at the lowest timed one's mean
  // scaled by verify tokens (optimistic, so that it gets timed): only 9-16 tokens timed here.
  qspec::MeasuredPassCosts upper;
  upper.observe(4, 4, 0.050), upper.observe(4, 12, 0.080);
  for (int i = 0; i < 6; ++i) upper.observe(4, 4, 0.002), upper.observe(4, 12, 0.005);
  const auto upper_verify = upper.verify_cost(4);
  ASSERT_TRUE(upper_verify.has_value());
  EXPECT_NEAR(upper_verify->extra(12, 8), 1.5, 1e-6);
  EXPECT_NEAR(upper_verify->extra(8, 4), 1.5 * 4 / 8, 1e-6);
  EXPECT_NEAR(upper_verify->extra(24, 20), std::max(upper_verify->fixed + upper_verify->per_token * 20, 1.5), 1e-6);

  // The planner takes one draft a sequence (8 tokens, +0.2 of a step) where a line through the
  // same passes would price a 9th token near 0.2 + its slope: the 9-16 bucket costs 1.5 steps.
  QSpecPlanner planner(std::nullopt);
  planner.observe_pass(4, 4, 0.050), planner.observe_pass(4, 8, 0.080);
  for (int i = 0; i < 6; ++i)
    planner.observe_pass(4, 4, 0.002), planner.observe_pass(4, 8, 0.0024), planner.observe_pass(4, 7, 0.0024),
        planner.observe_pass(4, 12, 0.005);
  const std::vector<PlannerSequence> four(4, sequence(planner, 100, 0.9, 4));
  const qspec::StepPlan plan = planner.plan(four);
  ASSERT_TRUE(plan.speculates()) << plan.reason;
  const std::vector<int64_t> counts = plan.gammas.empty() ? std::vector<int64_t>(4, plan.gamma) : plan.gammas;
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 1, 1, 1})) << plan.reason;
  EXPECT_NE(plan.reason.find("a verify of 8 tokens"), std::string::npos) << plan.reason;
  EXPECT_NEAR(plan.predicted_gain, (4 + 4 * 0.9) / 1.2 / 4, 1e-9) << plan.reason;
}

// Prompt lookup costs no draft passes, so each sequence takes its own draft count: the drafts
// most likely kept across the batch, as many as the verify's price pays for.
TEST(QSpecPlanner, LookupsTakeEachSequencesOwnDraftCount) {
  QSpecPlanner planner(std::nullopt);
  planner.observe_pass(2, 2, 0.010), planner.observe_pass(2, 6, 0.020);  // the class's warm-ups
  for (int i = 0; i < 8; ++i) planner.observe_pass(2, 2, 0.002), planner.observe_pass(2, 6, 0.0024);
  // A verify pass of 6 tokens (the 5-8-token bucket): 0.4 ms more than a 2 ms step.
  PlannerSequence sure = sequence(planner, 100, 0.9, 4), unlikely = sequence(planner, 100, 0.02, 4);
  const std::vector<PlannerSequence> batch = {sure, unlikely};
  const qspec::StepPlan plan = planner.plan(batch);
  ASSERT_TRUE(plan.speculates()) << plan.reason;
  // The sure lookup's 4 drafts, and the unlikely one's 2 that still fit the 8-token bucket's
  // price; its 3rd would start the next bucket (the line's price there: 0.05 a verify token).
  EXPECT_EQ(plan.gammas, (std::vector<int64_t>{4, 2})) << plan.reason;
  EXPECT_EQ(plan.gamma, 4);
  const double sure_tokens = qspec::expected_tokens(0.9, 0.9, 4), unlikely_tokens = qspec::expected_tokens(0.02, 0.02, 2);
  EXPECT_NEAR(plan.predicted_gain, ((sure_tokens + unlikely_tokens) / (1 + 4 * 0.05)) / 2, 1e-9) << plan.reason;
  // One gamma for both would verify the unlikely lookup's 4 drafts too.
  EXPECT_LT(planner.predicted_gain(batch, 0, 4), plan.predicted_gain);
  EXPECT_NE(plan.reason.find("2-4 drafts a sequence, a verify of 8 tokens"), std::string::npos) << plan.reason;
  // Where every sequence's lookups are alike, the counts are alike.
  const qspec::StepPlan alike = planner.plan(std::vector<PlannerSequence>{sure, sure});
  const std::vector<int64_t> counts =
      alike.gammas.empty() ? std::vector<int64_t>(2, alike.gamma) : alike.gammas;
  EXPECT_EQ(counts, (std::vector<int64_t>{4, 4})) << alike.reason;
}

// A planner over a table refuses drafts the table lacks and takes the table's priors.
TEST(QSpecPlanner, CandidatesComeFromTheTableWithItsPriors) {
  QSpecCostTable t = gpu_like();
  t.acceptance["w4a8"] = 0.91;
  const QSpecPlanner planner(t, std::vector<std::string>{"w4a8", "ngram"}, "t.json");
  ASSERT_EQ(planner.candidates().size(), 2u);
  EXPECT_DOUBLE_EQ(planner.candidates()[0].prior, 0.91);
  EXPECT_DOUBLE_EQ(planner.candidates()[1].prior, 0.0);  // n-gram: probed, never assumed
  EXPECT_NE(planner.describe().find("t.json"), std::string::npos);
  EXPECT_THROW(QSpecPlanner(t, std::vector<std::string>{"w4a4-int4"}, "t.json"), qspec::Error);
  // None of its drafts runs here: plain W4A16 only.
  const QSpecPlanner none(t, std::vector<std::string>{}, "t.json");
  EXPECT_TRUE(none.candidates().empty());
  const qspec::StepPlan plain = none.plan(std::vector<PlannerSequence>{sequence(none, 512, 1.0)});
  EXPECT_FALSE(plain.speculates());
  EXPECT_NE(plain.reason.find("no draft to price"), std::string::npos) << plain.reason;
  PlannerSequence wrong = sequence(planner, 512, 0.9);
  wrong.acceptance.pop_back();
  EXPECT_THROW(planner.plan(std::vector<PlannerSequence>{wrong}), qspec::Error);
}

// The step-cost tables committed in bench/policies load (every field valid) and say how they
// were made.
TEST(QSpecCosts, CommittedTablesLoad) {
  int tables = 0;
  for (const auto& item : fs::directory_iterator(std::string(QSPEC_SOURCE_DIR) + "/bench/policies")) {
    if (item.path().filename().string().rfind("qspec-costs-", 0) != 0) continue;
    const QSpecCostTable t = QSpecCostTable::load(item.path().string());
    EXPECT_FALSE(t.command.empty()) << item.path();
    EXPECT_FALSE(t.model.empty()) << item.path();
    ++tables;
  }
  EXPECT_GE(tables, 1);
}
