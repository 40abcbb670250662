// The paged KV cache (runtime/kv_cache.h), batched forward passes over it, and the
// continuous-batching engine (qspec/engine.h) on gsm-synth-llama with RTN int4 weights:
// batch composition, staggered arrivals, chunked prefill and preemption never change a
// sequence's tokens; greedy QSpec equals greedy W4A16; sampling equals the single-sequence
// paths at the same seed; stop strings, cancellation and bad requests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "gsm_synth_fixture.h"
#include "model/llama.h"
#include "qspec/engine.h"
#include "runtime/backend.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "runtime/qspec.h"
#include "runtime/qspec_costs.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string& kModel = qspec_test::kGsmSynthModel;

struct Fixture : qspec_test::GsmSynthInt4 {
  Fixture() : GsmSynthInt4(5) {}
};

Fixture& fixture() {
  static Fixture instance;
  return instance;
}

qspec::RunMode mode(const std::string& name) {
  qspec::RunMode m = qspec::parse_run_mode(name);
  m.activations.group_size = fixture().model->auto_group_size();
  return m;
}

std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                               const qspec::SamplingParams& sampling = {}, const std::string& run_mode = "w4a16") {
  qspec::GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.eos_ids = fixture().tokenizer->eos_ids;
  options.mode = mode(run_mode);
  options.sampling = sampling;
  return qspec::generate(*fixture().model, prompt, options).ids;
}

// A step-cost table for the fixture on this machine (this process's CPU device name): at batch
// 1-2 a w4a8 step costs a tenth of a W4A16 step and a verify token 5 % of one, so drafts pay; from
// batch 3 on a draft step costs three W4A16 steps and a verify token two, so nothing does. A run
// whose batch grows and shrinks then has plain steps and cycles (ARC drafts, which this
// checkpoint cannot run, are listed to be skipped).
qspec::QSpecCostTable switching_table() {
  qspec::QSpecCostTable t;
  t.device = qspec::cpu_device_name();
  t.model = "gsm-synth-llama";
  t.shape = qspec::ModelShape::of(fixture().model->config());
  for (int64_t context : {16, 512})
    for (int64_t batch : {1, 2, 3, 8}) {
      qspec::StepCostPoint p;
      p.batch = batch;
      p.context = context;
      p.w4a16_step_ms = 1.0;
      const bool pays = batch <= 2;
      for (int64_t g : {1, 3, 5}) p.verify_ms[g] = 1.0 + (pays ? 0.05 : 2.0) * static_cast<double>(g);
      p.draft_step_ms = {{"ngram", 0.0}, {"w4a8", pays ? 0.1 : 3.0}, {"w4a4-nvfp4-arc", 0.1}};
      t.points.push_back(p);
    }
  return t;
}

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".json")).string();
}

// Collects each request's events.
struct Outputs {
  std::mutex mutex;
  std::map<qspec::RequestId, std::vector<int32_t>> tokens;
  std::map<qspec::RequestId, std::string> text, finish_reason;
  std::map<qspec::RequestId, qspec::RequestMetrics> metrics;
  std::map<qspec::RequestId, int> finished_events;

  qspec::TokenCallback callback() {
    return [this](const qspec::TokenEvent& event) {
      std::lock_guard lock(mutex);
      auto& ids = tokens[event.id];
      ids.insert(ids.end(), event.tokens.begin(), event.tokens.end());
      text[event.id] += event.text;
      if (event.finished) {
        ++finished_events[event.id];
        finish_reason[event.id] = event.finish_reason;
        EXPECT_NE(event.metrics, nullptr);
        if (event.metrics) metrics[event.id] = *event.metrics;
      }
    };
  }
};

// A request in `run_mode`; QSpec drafts in the cheapest named draft (these tests cover the draft
// passes; draft auto, the default, has its own tests below).
qspec::Request request(const std::vector<int32_t>& prompt, int64_t max_new_tokens, const std::string& run_mode = "w4a16") {
  qspec::Request r;
  r.prompt = prompt;
  r.max_new_tokens = max_new_tokens;
  r.plan.mode = run_mode;
  if (r.plan.qspec()) r.plan.draft = std::string(qspec::decode_rules::kCheapestDraft);
  return r;
}

// ---- the paged KV cache ----

TEST(PagedKv, PoolAllocatesReleasesAndRefusesMisuse) {
  qspec::KvBlockPool pool(2, 8, 4, 16);
  EXPECT_EQ(pool.free_blocks(), 4);
  qspec::SequenceKv a, b;
  EXPECT_EQ(a.blocks_needed(pool, 33), 3);
  ASSERT_TRUE(a.reserve(pool, 33));
  EXPECT_EQ(a.block_table(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_FALSE(b.reserve(pool, 17));  // needs 2, one free: nothing taken
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_TRUE(b.block_table().empty());
  a.set_length(33, pool);
  a.truncate(pool, 16);  // roll back: block 2 freed
  EXPECT_EQ(a.length(), 16);
  EXPECT_EQ(a.block_table().size(), 1u);
  EXPECT_EQ(pool.free_blocks(), 3);
  ASSERT_TRUE(b.reserve(pool, 17));
  EXPECT_THROW(a.set_length(17, pool), qspec::Error);  // past the reserved blocks
  EXPECT_THROW(a.truncate(pool, 40), qspec::Error);
  a.release(pool);
  b.release(pool);
  EXPECT_EQ(pool.free_blocks(), 4);
  EXPECT_THROW(pool.release(0), qspec::Error);  // double free
  EXPECT_THROW(pool.release(9), qspec::Error);
  for (int i = 0; i < 4; ++i) pool.allocate();
  EXPECT_THROW(pool.allocate(), qspec::Error);
  EXPECT_THROW(qspec::KvBlockPool(2, 8, 0, 16), qspec::Error);
  // Accounting only (the GPU engine's pool): the same block bookkeeping, no rows on the host.
  qspec::KvBlockPool counting(2, 8, 4, 16, /*with_storage=*/false);
  EXPECT_EQ(counting.bytes(), 0u);
  EXPECT_EQ(counting.key_pools()[1], nullptr);
  qspec::SequenceKv c;
  ASSERT_TRUE(c.reserve(counting, 40));
  EXPECT_EQ(counting.used_blocks(), 3);
  c.release(counting);
  EXPECT_EQ(counting.free_blocks(), 4);
}

// Several sequences in one batched pass over scattered paged blocks give exactly the logits
// and K/V rows each gets alone on a contiguous cache.
TEST(PagedKv, BatchedForwardOverPagedBlocksEqualsEachSequenceAlone) {
  const qspec::LlamaModel& model = *fixture().model;
  const auto& c = model.config();
  for (const char* name : {"w16a16", "w4a16", "w4a4-nvfp4"}) {
    qspec::KvBlockPool pool(c.num_layers, c.kv_dim(), 64, 16);
    // Scatter: take blocks in a shuffled order so tables are not contiguous.
    std::vector<int32_t> taken;
    for (int i = 0; i < 64; ++i) taken.push_back(pool.allocate());
    std::shuffle(taken.begin(), taken.end(), std::mt19937(7));
    for (int32_t b : taken) pool.release(b);
    std::vector<qspec::SequenceKv> sequences(3);
    std::vector<std::vector<int32_t>> tokens;
    for (int s = 0; s < 3; ++s) {
      tokens.push_back(fixture().prompts[static_cast<size_t>(s)]);
      ASSERT_TRUE(sequences[s].reserve(pool, 64));
    }
    // Prefill all three together, then two decode steps of one token each, batched.
    std::vector<qspec::SequenceChunk> chunks;
    for (int s = 0; s < 3; ++s)
      chunks.push_back({tokens[s], 0, sequences[s].blocks(pool), qspec::SequenceChunk::Logits::all});
    std::vector<float> batched;
    model.forward_batch(chunks, batched, mode(name));
    size_t offset = 0;
    for (int s = 0; s < 3; ++s) {
      qspec::KvCache alone = model.new_cache(64);
      std::vector<float> logits;
      model.forward(tokens[s], alone, logits, /*all_logits=*/true, mode(name));
      ASSERT_LE(offset + logits.size(), batched.size());
      EXPECT_TRUE(std::equal(logits.begin(), logits.end(), batched.begin() + static_cast<long>(offset)))
          << name << " sequence " << s;
      offset += logits.size();
      const qspec::KvBlocks blocks = sequences[s].blocks(pool);
      bool rows_equal = true;
      for (int64_t l = 0; l < c.num_layers; ++l)
        for (int64_t p = 0; p < static_cast<int64_t>(tokens[s].size()); ++p)
          rows_equal &= std::equal(alone.keys(l) + p * c.kv_dim(), alone.keys(l) + (p + 1) * c.kv_dim(),
                                   blocks.keys[l] + blocks.row(p) * c.kv_dim()) &&
                        std::equal(alone.values(l) + p * c.kv_dim(), alone.values(l) + (p + 1) * c.kv_dim(),
                                   blocks.values[l] + blocks.row(p) * c.kv_dim());
      EXPECT_TRUE(rows_equal) << name << " sequence " << s;
    }
    EXPECT_EQ(offset, batched.size());
  }
}

// A QSpec cycle on the paged cache: draft rows written in W4A4, the verify pass overwrites
// them in W4A16, rejected rows are rolled back: the committed rows equal plain W4A16 decoding.
TEST(PagedKv, RollbackAndOverwriteLeaveTheCacheOfPlainW4A16Decoding) {
  const qspec::LlamaModel& model = *fixture().model;
  const auto& c = model.config();
  const std::vector<int32_t>& prompt = fixture().prompts[1];
  const std::vector<int32_t> ids = reference(prompt, 6);
  ASSERT_EQ(ids.size(), 6u);
  qspec::KvBlockPool pool(c.num_layers, c.kv_dim(), 16, 4);  // small blocks: the cycle crosses block edges
  qspec::SequenceKv seq;
  const int64_t base = static_cast<int64_t>(prompt.size());
  ASSERT_TRUE(seq.reserve(pool, base + 6));
  std::vector<float> logits;
  qspec::SequenceChunk prefill{prompt, 0, seq.blocks(pool), qspec::SequenceChunk::Logits::last};
  model.forward_batch({&prefill, 1}, logits, mode("w4a16"));
  seq.set_length(base, pool);
  // Drafts: write rows base.. in W4A4 (d0 = the true next token, then two wrong ones).
  const std::vector<int32_t> drafts = {ids[1], ids[2], static_cast<int32_t>((ids[3] + 1) % c.vocab_size)};
  std::vector<int32_t> inputs = {ids[0], drafts[0], drafts[1]};
  for (int64_t i = 0; i < 3; ++i) {
    qspec::SequenceChunk step{std::span<const int32_t>(&inputs[i], 1), base + i, seq.blocks(pool),
                              qspec::SequenceChunk::Logits::last};
    model.forward_batch({&step, 1}, logits, mode("w4a4-nvfp4"));
  }
  // Verify [ids0, d0, d1, d2] in W4A16 over the same rows, then keep ids0, d0, d1 (d2 rejected).
  std::vector<int32_t> verify = {ids[0], drafts[0], drafts[1], drafts[2]};
  qspec::SequenceChunk pass{verify, base, seq.blocks(pool), qspec::SequenceChunk::Logits::all};
  model.forward_batch({&pass, 1}, logits, mode("w4a16"));
  const int64_t used_before = pool.used_blocks();
  seq.truncate(pool, base + 3);
  EXPECT_LE(pool.used_blocks(), used_before);
  EXPECT_EQ(seq.capacity(pool), (base + 3 + 3) / 4 * 4);
  // Plain W4A16 decoding of prompt, ids0, ids1, ids2.
  qspec::KvCache plain = model.new_cache(base + 3);
  model.forward(prompt, plain, logits, false, mode("w4a16"));
  for (int i = 0; i < 3; ++i) model.forward(std::span<const int32_t>(&ids[i], 1), plain, logits, false, mode("w4a16"));
  const qspec::KvBlocks blocks = seq.blocks(pool);
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int64_t p = 0; p < base + 3; ++p) {
      ASSERT_TRUE(std::equal(plain.keys(l) + p * c.kv_dim(), plain.keys(l) + (p + 1) * c.kv_dim(),
                             blocks.keys[l] + blocks.row(p) * c.kv_dim()))
          << "layer " << l << " position " << p;
      ASSERT_TRUE(std::equal(plain.values(l) + p * c.kv_dim(), plain.values(l) + (p + 1) * c.kv_dim(),
                             blocks.values[l] + blocks.row(p) * c.kv_dim()))
          << "layer " << l << " position " << p;
    }
}

// ---- the engine ----

// Greedy W4A16 through the engine equals single-sequence decoding at batch sizes 1, 3 and 16,
// with requests arriving while others run.
TEST(Engine, GreedyOutputIsIndependentOfBatchSizeAndArrivals) {
  const auto& prompts = fixture().prompts;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(reference(p, 32));
  for (int64_t batch : {1, 3, 16}) {
    qspec::EngineOptions options;
    options.max_batch_size = batch;
    qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
    Outputs out;
    std::vector<qspec::RequestId> ids;
    for (int round = 0; round < 2; ++round)
      for (size_t i = 0; i < prompts.size(); ++i) {
        ids.push_back(engine.submit(request(prompts[i], 32), out.callback()));
        for (size_t s = 0; s < i % 3; ++s) engine.step();  // staggered arrivals
      }
    engine.run_until_idle();
    for (size_t k = 0; k < ids.size(); ++k) {
      EXPECT_EQ(out.tokens[ids[k]], expected[k % prompts.size()]) << "batch " << batch << " request " << k;
      EXPECT_EQ(out.finished_events[ids[k]], 1);
    }
    const qspec::EngineMetrics m = engine.metrics();
    EXPECT_EQ(m.requests_finished, static_cast<int64_t>(ids.size()));
    EXPECT_EQ(m.kv_blocks_used, 0);
    EXPECT_EQ(m.running + m.waiting, 0);
    if (batch > 1) {
      int64_t batched_steps = 0;
      for (size_t b = 2; b < m.batch_size_histogram.size(); ++b) batched_steps += m.batch_size_histogram[b];
      EXPECT_GT(batched_steps, 0) << "continuous batching never ran two sequences together";
    }
  }
}

// Every draft: each low-precision mode, n-gram lookup, and sparse views of the cache (a window of
// the last positions with or without sinks, far shorter than the ~20-token prompts' contexts).
TEST(Engine, GreedyQSpecEqualsW4A16ForEveryDraftModeUnderBatching) {
  const auto& prompts = fixture().prompts;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(reference(p, 24));
  struct Draft {
    const char* mode;
    int64_t window = 0, sinks = 0;
  };
  for (const Draft& draft : {Draft{"w4a8"}, Draft{"w4a8-fp8"}, Draft{"w4a4-int4"}, Draft{"w4a4-nvfp4"},
                             Draft{"w4a4-mxfp4"}, Draft{"ngram"}, Draft{"w4a16", 6, 2}, Draft{"w4a8", 8, 0}})
    for (int64_t gamma : {1, 3, 6}) {
      qspec::EngineOptions options;
      options.max_batch_size = 3;
      qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
      Outputs out;
      std::vector<qspec::RequestId> ids;
      for (size_t i = 0; i < prompts.size(); ++i) {
        qspec::Request r = request(prompts[i], 24, "qspec");
        r.plan.draft = draft.mode;
        r.plan.draft_window = draft.window;
        r.plan.draft_sinks = draft.sinks;
        r.plan.gamma = gamma;
        r.plan.adaptive_gamma = i == 4;  // one sequence with adaptive gamma in the mix
        ids.push_back(engine.submit(r, out.callback()));
        engine.step();
      }
      engine.run_until_idle();
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(out.tokens[ids[i]], expected[i])
            << draft.mode << " window " << draft.window << " gamma " << gamma << " request " << i;
        const qspec::QSpecMetrics& q = out.metrics[ids[i]].qspec;
        EXPECT_GT(q.cycles, 0);
        EXPECT_EQ(q.accepted + q.rejected, q.drafted);
        int64_t cycles = 0;
        for (int64_t n : q.accepted_histogram) cycles += n;
        EXPECT_EQ(cycles, q.cycles);
      }
      EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
    }
}

// Draft auto: whatever the planner picks step by step (plain W4A16 steps, w4a8 cycles, n-gram
// cycles, as the batch grows and shrinks), greedy output is W4A16's, token for token; the metrics
// say which plans ran and why. With the switching table every kind of step runs; without a table
// (the fallback) the outputs are W4A16's as well.
TEST(Engine, DraftAutoGreedyEqualsW4A16WhateverThePlannerPicks) {
  const auto& prompts = fixture().prompts;
  const std::vector<int64_t> lengths = {16, 48, 24, 56, 32};
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(reference(prompts[i], lengths[i]));
  const std::string table_file = temp_file("qspec-engine-switching-costs");
  switching_table().save(table_file);
  // N-gram drafts only, with a verify token at 1 % of a step: whatever lookups the probe has
  // seen accepted pay, so n-gram cycles run.
  qspec::QSpecCostTable ngram = switching_table();
  for (qspec::StepCostPoint& p : ngram.points) {
    p.draft_step_ms = {{"ngram", 0.0}};
    for (auto& [g, ms] : p.verify_ms) ms = 1.0 + 0.01 * static_cast<double>(g);
  }
  const std::string ngram_file = temp_file("qspec-engine-ngram-costs");
  ngram.save(ngram_file);
  for (const std::string& costs : {table_file, ngram_file, std::string("none")}) {
    qspec::EngineOptions options;
    options.max_batch_size = 5;
    options.qspec_costs = costs;
    qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
    if (costs == table_file) {
      EXPECT_NE(engine.qspec_planner().find("drafts ngram, w4a8"), std::string::npos) << engine.qspec_planner();
      EXPECT_NE(engine.qspec_planner().find("skipped w4a4-nvfp4-arc"), std::string::npos) << engine.qspec_planner();
    } else if (costs == "none") {
      EXPECT_NE(engine.qspec_planner().find("no step-cost table"), std::string::npos) << engine.qspec_planner();
    }
    Outputs out;
    std::vector<qspec::RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      qspec::Request r = request(prompts[i], lengths[i], "qspec");
      r.plan.draft = std::string(qspec::decode_rules::kAutoDraft);
      r.plan.max_gamma = 5;
      ids.push_back(engine.submit(r, out.callback()));
      for (int s = 0; s < 3; ++s) engine.step();  // the batch grows one sequence at a time
    }
    engine.run_until_idle();
    qspec::QSpecMetrics total;
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(out.tokens[ids[i]], expected[i]) << costs << " request " << i;
      const qspec::QSpecMetrics& q = out.metrics[ids[i]].qspec;
      EXPECT_EQ(q.accepted + q.rejected, q.drafted);
      int64_t steps = 0;
      for (const auto& [plan, n] : q.plan_steps) steps += n;
      const int64_t plain = q.plan_steps.count("w4a16") ? q.plan_steps.at("w4a16") : 0;
      // Every decode step was planned: one token a plain step, a cycle's accepted + 1 (an eos
      // among them ends the output there).
      EXPECT_EQ(steps - plain, q.cycles) << costs << " request " << i;
      EXPECT_GE(plain + q.cycles + q.accepted, static_cast<int64_t>(expected[i].size()) - 1)
          << costs << " request " << i;
      EXPECT_FALSE(q.plan_reason.empty());
      total.add(q);
    }
    const std::string what = costs == table_file ? "switching table" : costs == ngram_file ? "n-gram table" : "none";
    std::printf("draft auto, costs %s: %s\n", what.c_str(), qspec::describe_planner_metrics(total).c_str());
    EXPECT_EQ(engine.metrics().qspec.plan_steps, total.plan_steps);
    EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
    if (costs == table_file) {
      EXPECT_GT(total.plan_steps["w4a16"], 0) << "the batch of 3 and more never ran plain";
      int64_t w4a8_cycles = 0;
      for (const auto& [plan, n] : total.plan_steps)
        if (plan.rfind("w4a8 g", 0) == 0) w4a8_cycles += n;
      EXPECT_GT(w4a8_cycles, 0) << "the batch of 1-2 never drafted in w4a8";
      EXPECT_GT(total.accepted, 0);
      EXPECT_GT(total.mean_predicted_gain(), 1.05);
    }
    if (costs == ngram_file) {
      int64_t ngram_cycles = 0;
      for (const auto& [plan, n] : total.plan_steps)
        if (plan.rfind("ngram g", 0) == 0) ngram_cycles += n;
      EXPECT_GT(ngram_cycles, 0) << "the n-gram draft never ran";
      EXPECT_EQ(total.draft_steps, 0);  // no draft passes
    }
  }
  std::filesystem::remove(table_file);
  std::filesystem::remove(ngram_file);
}

// Sampled requests with draft auto: cycles of a model draft (its distributions q go to the
// rejection sampler) and plain steps (the acceptor's picks) mix without error, and the run is
// reproducible: the same seeds give the same tokens.
TEST(Engine, DraftAutoSamplesThroughPlainStepsAndCycles) {
  const auto& prompts = fixture().prompts;
  const std::string table_file = temp_file("qspec-engine-sampling-costs");
  switching_table().save(table_file);
  auto run = [&] {
    qspec::EngineOptions options;
    options.max_batch_size = 5;
    options.qspec_costs = table_file;
    qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
    Outputs out;
    std::vector<qspec::RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      qspec::Request r = request(prompts[i], 64, "qspec");
      r.plan.draft = "auto";
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 20;
      r.sampling.seed = 7 + i;
      ids.push_back(engine.submit(r, out.callback()));
      engine.step();  // the batch grows past 2 (plain steps) and drains (cycles)
    }
    engine.run_until_idle();
    std::vector<std::vector<int32_t>> tokens;
    qspec::QSpecMetrics total;
    for (qspec::RequestId id : ids) {
      EXPECT_TRUE(out.finish_reason[id] == "length" || out.finish_reason[id] == "eos") << out.finish_reason[id];
      tokens.push_back(out.tokens[id]);
      total.add(out.metrics[id].qspec);
    }
    std::printf("draft auto, sampled: %s\n", qspec::describe_planner_metrics(total).c_str());
    EXPECT_GT(total.cycles, 0);
    EXPECT_GT(total.plan_steps["w4a16"], 0);
    return tokens;
  };
  EXPECT_EQ(run(), run());
  std::filesystem::remove(table_file);
}

// A table for another device or another model, or a broken one, is refused when the engine is
// built, naming what does not match.
TEST(Engine, DraftAutoRefusesACostTableOfAnotherDeviceOrModel) {
  auto refused = [](const qspec::QSpecCostTable& table, const std::string& fragment) {
    const std::string file = temp_file("qspec-engine-bad-costs");
    std::ofstream(file) << table.to_json().dump();
    qspec::EngineOptions options;
    options.qspec_costs = file;
    try {
      qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
      ADD_FAILURE() << "an engine was built over a table it should refuse (" << fragment << ")";
    } catch (const qspec::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    std::filesystem::remove(file);
  };
  qspec::QSpecCostTable other_device = switching_table();
  other_device.device = "NVIDIA H200";
  refused(other_device, "was measured on 'NVIDIA H200'");
  qspec::QSpecCostTable other_model = switching_table();
  other_model.shape.hidden *= 2;
  refused(other_model, "is for a model with");
  qspec::QSpecCostTable broken = switching_table();
  broken.points[3].w4a16_step_ms = 0;
  refused(broken, "points[3].w4a16_step_ms: must be > 0");
  // A table none of whose drafts runs here (ARC drafts on a checkpoint without ARC): plain W4A16.
  qspec::QSpecCostTable arc_only = switching_table();
  for (qspec::StepCostPoint& p : arc_only.points) p.draft_step_ms = {{"w4a4-nvfp4-arc", 0.01}};
  const std::string arc_file = temp_file("qspec-engine-arc-costs");
  arc_only.save(arc_file);
  qspec::EngineOptions arc_options;
  arc_options.qspec_costs = arc_file;
  qspec::Engine arc_engine(*fixture().model, fixture().tokenizer.get(), arc_options);
  EXPECT_NE(arc_engine.qspec_planner().find("drafts none"), std::string::npos) << arc_engine.qspec_planner();
  Outputs out;
  qspec::Request plain = request(fixture().prompts[1], 16, "qspec");
  plain.plan.draft = "auto";
  const qspec::RequestId id = arc_engine.submit(plain, out.callback());
  arc_engine.run_until_idle();
  EXPECT_EQ(out.tokens[id], reference(fixture().prompts[1], 16));
  EXPECT_EQ(out.metrics[id].qspec.cycles, 0);
  EXPECT_EQ(out.metrics[id].qspec.plan_steps.size(), 1u);  // "w4a16" only
  std::filesystem::remove(arc_file);
  // A request for draft auto names its broken rule.
  qspec::Engine engine(*fixture().model, fixture().tokenizer.get());
  qspec::Request r = request(fixture().prompts[0], 8, "qspec");
  r.plan.draft = "auto";
  r.plan.kv_overwrite = false;
  EXPECT_THROW(engine.submit(r, {}), qspec::DecodePlanError);
}

TEST(Engine, ChunkedPrefillAndPreemptionKeepTheTokens) {
  const auto& prompts = fixture().prompts;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(reference(p, 40));
  for (const char* run_mode : {"w4a16", "qspec"}) {
    qspec::EngineOptions options;
    options.max_batch_size = 5;
    options.prefill_chunk = 5;     // prompts of ~20 tokens take several steps
    options.max_batch_tokens = 12;
    options.kv_block_size = 4;
    options.kv_blocks = 40;        // 160 rows for 5 sequences of ~60: someone must be preempted
    qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
    Outputs out;
    std::vector<qspec::RequestId> ids;
    for (const auto& p : prompts) ids.push_back(engine.submit(request(p, 40, run_mode), out.callback()));
    engine.run_until_idle();
    int64_t preemptions = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(out.tokens[ids[i]], expected[i]) << run_mode << " request " << i;
      preemptions += out.metrics[ids[i]].preemptions;
    }
    EXPECT_GT(preemptions, 0) << run_mode << ": the pool was meant to run out";
    EXPECT_EQ(engine.metrics().preemptions, preemptions);
    EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
  }
}

// Log-probabilities: the prompt's from the prefill rows (each position once, whatever the
// chunking and preemption), the output's from the rows the tokens came from; QSpec's are the
// verify's, equal to plain W4A16's. A scoring-only request (max_new_tokens 0) ends with its prompt.
TEST(Engine, LogprobsSurviveChunkingAndPreemptionAndQSpecGivesW4A16s) {
  const auto& prompts = fixture().prompts;
  struct Scores {
    std::map<qspec::RequestId, std::vector<qspec::TokenLogprob>> prompt, output;
  };
  auto run = [&](const qspec::EngineOptions& options, const std::string& run_mode, int64_t max_new_tokens,
                 std::vector<qspec::RequestId>& ids, Outputs& out) {
    auto scores = std::make_shared<Scores>();
    qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
    ids.clear();
    for (const auto& p : prompts) {
      qspec::Request r = request(p, max_new_tokens, run_mode);
      r.logprobs = 3;
      r.prompt_logprobs = true;
      ids.push_back(engine.submit(r, [scores, callback = out.callback()](const qspec::TokenEvent& event) {
        EXPECT_EQ(event.logprobs.size(), event.tokens.size());
        for (size_t i = 0; i < event.tokens.size(); ++i) EXPECT_EQ(event.logprobs[i].id, event.tokens[i]);
        auto& prompt = scores->prompt[event.id];
        prompt.insert(prompt.end(), event.prompt_logprobs.begin(), event.prompt_logprobs.end());
        auto& output = scores->output[event.id];
        output.insert(output.end(), event.logprobs.begin(), event.logprobs.end());
        callback(event);
      }));
    }
    engine.run_until_idle();
    EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
    return scores;
  };
  std::vector<qspec::RequestId> plain_ids, small_ids, qspec_ids, score_ids;
  Outputs plain_out, small_out, qspec_out, score_out;
  const auto plain = run({}, "w4a16", 24, plain_ids, plain_out);
  qspec::EngineOptions small;
  small.max_batch_size = 5;
  small.prefill_chunk = 5;
  small.max_batch_tokens = 12;
  small.kv_block_size = 4;
  small.kv_blocks = 30;
  const auto chunked = run(small, "w4a16", 24, small_ids, small_out);
  const auto verified = run({}, "qspec", 24, qspec_ids, qspec_out);
  const auto scored = run({}, "w4a16", 0, score_ids, score_out);
  int64_t preemptions = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const auto& prompt = plain->prompt.at(plain_ids[i]);
    ASSERT_EQ(prompt.size(), prompts[i].size() - 1);
    for (size_t k = 0; k < prompt.size(); ++k) {
      EXPECT_EQ(prompt[k].id, prompts[i][k + 1]);
      EXPECT_LE(prompt[k].logprob, 0.0f);
      ASSERT_EQ(prompt[k].top.size(), 3u);
      EXPECT_GE(prompt[k].top[0].second, prompt[k].logprob);
    }
    const auto& output = plain->output.at(plain_ids[i]);
    ASSERT_EQ(output.size(), plain_out.tokens[plain_ids[i]].size());
    for (const auto& lp : output) EXPECT_EQ(lp.top[0].first, lp.id);  // greedy
    // Chunked prefill and preemption: the same entries, each prompt position once.
    preemptions += small_out.metrics[small_ids[i]].preemptions;
    auto same = [](const std::vector<qspec::TokenLogprob>& a, const std::vector<qspec::TokenLogprob>& b,
                   float tolerance) {
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        EXPECT_EQ(a[k].id, b[k].id);
        EXPECT_NEAR(a[k].logprob, b[k].logprob, tolerance);
        ASSERT_EQ(a[k].top.size(), b[k].top.size());
        for (size_t t = 0; t < a[k].top.size(); ++t) EXPECT_EQ(a[k].top[t].first, b[k].top[t].first);
      }
    };
    same(chunked->prompt.at(small_ids[i]), prompt, 1e-4f);
    same(chunked->output.at(small_ids[i]), output, 1e-4f);
    // QSpec: the verify's logprobs are W4A16's.
    same(verified->prompt.at(qspec_ids[i]), prompt, 1e-4f);
    same(verified->output.at(qspec_ids[i]), output, 1e-4f);
    // Scoring only: the prompt's entries, no tokens, "length".
    same(scored->prompt.at(score_ids[i]), prompt, 0.0f);
    EXPECT_TRUE(score_out.tokens[score_ids[i]].empty());
    EXPECT_EQ(score_out.finish_reason[score_ids[i]], "length");
    EXPECT_EQ(score_out.finished_events[score_ids[i]], 1);
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to run out";

  // Out of range, and scoring-only without prompt logprobs, are refused.
  qspec::Engine engine(*fixture().model, fixture().tokenizer.get());
  qspec::Request bad = request(prompts[0], 4);
  bad.logprobs = qspec::kMaxTopLogprobs + 1;
  EXPECT_THROW(engine.submit(bad, {}), qspec::Error);
  bad = request(prompts[0], 0);
  EXPECT_THROW(engine.submit(bad, {}), qspec::Error);
}

// Sampling: each request's own seeded state, so the engine reproduces generate() and
// qspec_generate() at any batch size.
TEST(Engine, SamplingMatchesTheSingleSequencePathsAtAnyBatchSize) {
  const auto& prompts = fixture().prompts;
  qspec::SamplingParams sampling;
  sampling.temperature = 0.9f;
  sampling.top_p = 0.95f;
  for (int64_t batch : {1, 4}) {
    qspec::EngineOptions options;
    options.max_batch_size = batch;
    qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
    Outputs out;
    std::vector<qspec::RequestId> plain, speculative;
    for (size_t i = 0; i < prompts.size(); ++i) {
      qspec::Request r = request(prompts[i], 24);
      r.sampling = sampling;
      r.sampling.seed = 100 + i;
      plain.push_back(engine.submit(r, out.callback()));
      r.plan.mode = "qspec";
      r.plan.draft = std::string(qspec::decode_rules::kCheapestDraft);
      r.plan.gamma = 3;
      speculative.push_back(engine.submit(r, out.callback()));
    }
    engine.run_until_idle();
    for (size_t i = 0; i < prompts.size(); ++i) {
      qspec::SamplingParams s = sampling;
      s.seed = 100 + i;
      EXPECT_EQ(out.tokens[plain[i]], reference(prompts[i], 24, s)) << "batch " << batch << " request " << i;
      qspec::GenerationOptions g;
      g.max_new_tokens = 24;
      g.sampling = s;
      g.eos_ids = fixture().tokenizer->eos_ids;
      qspec::QSpecOptions q;
      q.draft = mode("w4a4-nvfp4");
      q.verify = mode("w4a16");
      q.gamma = 3;
      EXPECT_EQ(out.tokens[speculative[i]], qspec::qspec_generate(*fixture().model, prompts[i], g, q).ids)
          << "batch " << batch << " request " << i;
    }
  }
}

TEST(Engine, NoOverwriteAblationMatchesTheSingleSequencePath) {
  const std::vector<int32_t>& prompt = fixture().prompts[3];
  qspec::GenerationOptions g;
  g.max_new_tokens = 32;
  g.eos_ids = fixture().tokenizer->eos_ids;
  qspec::QSpecOptions q;
  q.draft = mode("w4a4-int4");
  q.verify = mode("w4a16");
  q.gamma = 4;
  q.overwrite_kv = false;
  const qspec::QSpecResult single = qspec::qspec_generate(*fixture().model, prompt, g, q);
  qspec::Engine engine(*fixture().model, fixture().tokenizer.get());
  Outputs out;
  qspec::Request r = request(prompt, 32, "qspec");
  r.plan.draft = "w4a4-int4";
  r.plan.kv_overwrite = false;
  const qspec::RequestId id = engine.submit(r, out.callback());
  engine.submit(request(fixture().prompts[0], 32, "qspec"), out.callback());  // a neighbour with overwrite
  engine.run_until_idle();
  EXPECT_EQ(out.tokens[id], single.ids);
  EXPECT_EQ(out.metrics[id].qspec.accepted, single.metrics.accepted);
  EXPECT_EQ(out.metrics[id].qspec.cycles, single.metrics.cycles);
}

TEST(Engine, StreamsTextAndStopsAtStopStringsAndIds) {
  const std::vector<int32_t>& prompt = fixture().prompts[1];
  const std::vector<int32_t> ids = reference(prompt, 40);
  const std::string full = fixture().tokenizer->decode(ids, /*skip_special=*/true);
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(6, 3);
  qspec::Engine engine(*fixture().model, fixture().tokenizer.get());
  Outputs out;
  qspec::Request with_stop = request(prompt, 40);
  with_stop.stop = {"never appears zq", stop};
  const qspec::RequestId a = engine.submit(with_stop, out.callback());
  const qspec::RequestId b = engine.submit(request(prompt, 40), out.callback());
  qspec::Request with_stop_id = request(prompt, 40, "qspec");
  with_stop_id.stop_ids = {ids[5]};
  const qspec::RequestId c = engine.submit(with_stop_id, out.callback());
  engine.run_until_idle();
  EXPECT_EQ(out.text[a], full.substr(0, full.find(stop)));
  EXPECT_EQ(out.finish_reason[a], "stop");
  EXPECT_EQ(out.text[b], full);
  EXPECT_EQ(out.tokens[b], ids);
  const size_t first = static_cast<size_t>(std::find(ids.begin(), ids.end(), ids[5]) - ids.begin());
  EXPECT_EQ(out.tokens[c], std::vector<int32_t>(ids.begin(), ids.begin() + first + 1));
  EXPECT_EQ(out.finish_reason[c], "stop");
}

TEST(Engine, CancelFreesTheRequestAndLeavesOthersAlone) {
  const auto& prompts = fixture().prompts;
  qspec::Engine engine(*fixture().model, fixture().tokenizer.get());
  Outputs out;
  qspec::Request long_request = request(prompts[0], 200);
  long_request.ignore_eos = true;
  const qspec::RequestId a = engine.submit(long_request, out.callback());
  const qspec::RequestId b = engine.submit(request(prompts[1], 24), out.callback());
  for (int i = 0; i < 5; ++i) engine.step();
  EXPECT_TRUE(engine.cancel(a));
  engine.run_until_idle();
  EXPECT_EQ(out.finish_reason[a], "cancelled");
  EXPECT_LT(out.tokens[a].size(), 200u);
  EXPECT_EQ(out.tokens[b], reference(prompts[1], 24));
  EXPECT_FALSE(engine.cancel(a));
  EXPECT_FALSE(engine.cancel(9999));
  const qspec::EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.requests_cancelled, 1);
  EXPECT_EQ(m.requests_finished, 1);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

TEST(Engine, RejectsBadRequestsWithClearErrors) {
  const auto& c = fixture().model->config();
  qspec::EngineOptions options;
  options.max_waiting = 2;
  qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
  const std::vector<int32_t>& prompt = fixture().prompts[0];
  auto expect_error = [&](qspec::Request r, const std::string& fragment) {
    try {
      engine.submit(std::move(r), {});
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const qspec::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(request({}, 8), "prompt is empty");
  expect_error(request({1, -3}, 8), "outside the vocabulary");
  expect_error(request({1, static_cast<int32_t>(c.vocab_size)}, 8), "outside the vocabulary");
  expect_error(request(std::vector<int32_t>(static_cast<size_t>(c.max_position_embeddings), 1), 8), "context");
  expect_error(request(prompt, 0), "max_new_tokens");
  expect_error(request(prompt, 8, "w5a5"), "mode");
  expect_error(request(prompt, 8, "w4a4-nvfp4-arc"), "ARC");
  qspec::Request r = request(prompt, 8, "qspec");
  r.plan.draft = "w4a16";
  expect_error(r, "not a low-precision");
  r = request(prompt, 8, "qspec");
  r.plan.gamma = 0;
  expect_error(r, "gamma");
  r = request(prompt, 8, "qspec");  // a draft window that covers the whole context is no diet
  r.plan.draft_window = c.max_position_embeddings;
  expect_error(r, "draft_window");
  r = request(prompt, 8);
  r.sampling.temperature = -1;
  expect_error(r, "temperature");
  r = request(prompt, 8);
  r.sampling.top_p = 0;
  expect_error(r, "top_p");
  r = request(prompt, 8);
  r.stop = {""};
  expect_error(r, "empty stop");
  EXPECT_EQ(engine.metrics().requests_rejected, 13);
  // No tokenizer: stop strings refused.
  qspec::Engine bare(*fixture().model, nullptr);
  r = request(prompt, 8);
  r.stop = {"x"};
  EXPECT_THROW(bare.submit(r, {}), qspec::Error);
  // A bounded queue says so instead of growing.
  engine.submit(request(prompt, 4), {});
  engine.submit(request(prompt, 4), {});
  EXPECT_THROW(engine.submit(request(prompt, 4), {}), qspec::QueueFull);
  engine.run_until_idle();
  EXPECT_NO_THROW(engine.submit(request(prompt, 4), {}));
  engine.run_until_idle();
  // A request larger than the pool.
  qspec::EngineOptions small;
  small.kv_blocks = 2;
  qspec::Engine tiny(*fixture().model, nullptr, small);
  try {
    tiny.submit(request(prompt, 100), {});
    ADD_FAILURE() << "a request larger than the KV pool was accepted";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV rows"), std::string::npos) << e.what();
  }
}

// The device option: unknown devices, and cuda in a build without the CUDA backend, fail when
// the engine is built (the GPU engine itself is tested under the gpu label).
TEST(Engine, DeviceOptionIsCheckedAtConstruction) {
  Fixture& f = fixture();
  qspec::EngineOptions options;
  options.device = "tpu";
  try {
    qspec::Engine engine(*f.model, f.tokenizer.get(), options);
    ADD_FAILURE() << "device tpu accepted";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu or cuda"), std::string::npos) << e.what();
  }
#ifndef QSPEC_HAVE_CUDA
  options.device = "cuda";
  try {
    qspec::Engine engine(*f.model, f.tokenizer.get(), options);
    ADD_FAILURE() << "device cuda accepted without the CUDA backend";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("without the CUDA backend"), std::string::npos) << e.what();
  }
#endif
}

// The background thread: requests from several threads, streamed back, drained on stop.
TEST(Engine, BackgroundThreadServesConcurrentSubmitters) {
  const auto& prompts = fixture().prompts;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(reference(p, 16));
  qspec::EngineOptions options;
  options.max_batch_size = 4;
  qspec::Engine engine(*fixture().model, fixture().tokenizer.get(), options);
  engine.start();
  Outputs out;
  std::mutex ids_mutex;
  std::vector<std::pair<qspec::RequestId, size_t>> ids;
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t)
    clients.emplace_back([&, t] {
      for (size_t i = 0; i < prompts.size(); ++i) {
        const size_t which = (i + static_cast<size_t>(t)) % prompts.size();
        qspec::Request r = request(prompts[which], 16, (i + t) % 2 ? "qspec" : "w4a16");
        const qspec::RequestId id = engine.submit(r, out.callback());
        std::lock_guard lock(ids_mutex);
        ids.emplace_back(id, which);
      }
    });
  for (auto& client : clients) client.join();
  engine.stop(/*drain=*/true);
  ASSERT_EQ(ids.size(), 3 * prompts.size());
  for (const auto& [id, which] : ids) {
    EXPECT_EQ(out.tokens[id], expected[which]) << "request " << id;
    EXPECT_EQ(out.finished_events[id], 1);
  }
  EXPECT_THROW(engine.submit(request(prompts[0], 4), {}), qspec::Error);  // stopped
}

}  // namespace
