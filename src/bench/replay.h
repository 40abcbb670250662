// Recorded text replayed through the engine at another model's shapes (`qspec bench --replay`):
// the acceptance of a real checkpoint's text, the speed of a full-size model. A ReplayBackend
// wraps the engine's backend and, in every pass of the target (verify) mode, replaces each output
// row's argmax id by the token the recorded text has at the position that row predicts. The
// engine then emits the recorded text token for token, while every pass runs, and is timed, at
// the wrapped backend's shapes; its prompt-lookup drafts and its planner (`--draft auto`) see
// exactly the tokens they saw on the real model, so their choices, their acceptance and the
// cycles' costs are those of serving that text on this device. Model drafts (w4a8, ...) keep
// their own argmax ids: on a synthetic model they are noise and get rejected, so only drafts that
// read no weights (ngram, and auto's plans over it) replay a real acceptance.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "qspec/engine.h"
#include "runtime/backend.h"

namespace qspec {

// One recorded request: its prompt ids and the ids the model answered (greedy W4A16).
struct ReplayText {
  std::vector<int32_t> prompt, output;
};

// The prompts and outputs of a `qspec eval qspec --save-reference FILE` record. Throws naming the
// file and field when it is not one, or holds no text with an output.
std::vector<ReplayText> load_replay_texts(const std::string& path);

class ReplayBackend final : public Backend {
 public:
  // target_key: RunMode::key() of the passes to replay (the engine's verify mode, w4a16).
  ReplayBackend(std::unique_ptr<Backend> inner, std::string target_key, int64_t vocab);

  // Request `sequence` (Engine::submit's id) replays `text` (not owned) from its first pass on.
  void follow(uint64_t sequence, const ReplayText* text);
  // Output rows whose id came from a recorded text so far.
  int64_t replayed_rows() const { return replayed_rows_; }

  void check_mode(const RunMode& mode, const std::string& field) const override { inner_->check_mode(mode, field); }
  bool kv_in_pool() const override { return inner_->kv_in_pool(); }
  std::string device_name() const override { return inner_->device_name(); }
  PassResult forward(const RunMode& mode, std::span<const PassRun> runs) override;
  // The wrapped model's rows of the last pass; refused after a pass with replayed rows (its ids
  // are the text's, its rows the model's: replay greedy requests without log-probabilities).
  std::vector<float> logits() override;
  std::optional<int64_t> draft_chain(const RunMode& mode, std::span<const PassRun> runs, int64_t steps) override {
    return inner_->draft_chain(mode, runs, steps);
  }
  void begin_step() override { inner_->begin_step(); }
  const std::vector<int32_t>& chain_ids() const override { return inner_->chain_ids(); }
  bool scores_prompts() const override { return inner_->scores_prompts(); }
  bool samples_on_device() const override { return false; }  // a greedy replay draws nothing
  void release(uint64_t sequence) override;

 private:
  std::unique_ptr<Backend> inner_;
  std::string target_key_;
  int64_t vocab_;
  std::map<uint64_t, const ReplayText*> texts_;
  // The last pass's rows, taken from the inner backend when it gave no ids (the CPU's): logits()
  // hands them on, as the inner backend gives each pass's rows once.
  bool rows_from_inner_ = false;
  std::vector<float> rows_;
  bool last_replayed_ = false;  // the last pass had replayed rows
  int64_t replayed_rows_ = 0;
};

struct ReplayOptions {
  std::vector<int64_t> batch_sizes = {1};
  // QSpec runs beside plain W4A16: set_draft_spec spellings (ngram, auto, w4a8, ...) x gammas
  // (auto: its largest gamma, DecodePlan::max_gamma).
  std::vector<std::string> drafts = {"auto"};
  std::vector<int64_t> gammas = {4};
  // Requests a run: each text in turn, as often as it takes (0: max(16, 4 x batch)), all queued
  // at the start, so the engine keeps `batch` sequences running until the queue drains.
  int64_t requests = 0;
  // > 0 (instead of requests): waves x batch requests, at least 8, so a run is that many full
  // batches (long prompts: one wave, then the drain metric is a full batch's decoding).
  int64_t waves = 0;
  int rounds = 3;  // every run this many times, the runs of a round in turn; medians reported
  std::string qspec_costs = "auto";  // EngineOptions::qspec_costs for auto
  // DecodePlan::ngram_corpus of the QSpec runs' requests. A text's repeats in a run (more requests
  // than texts) never use it: the corpus would hold that very text.
  bool ngram_corpus = true;
  // max_batch_size is set per batch size; prefill_first makes the drain columns a batch's
  // decoding alone (with waves = 1: the same full batch for every run).
  EngineOptions engine;
};

// Builds the engine's inner backend for a batch size (a GPU model holds max_batch_size slots).
using ReplayBackendFactory = std::function<std::unique_ptr<Backend>(int64_t batch)>;

// Every (batch, run) of `options` through an Engine over `model` (its shapes and format; the
// weights may live in the backend only) and a ReplayBackend over make_backend(batch). Prints a
// table; returns its rows. Each run's outputs are checked against the texts (a replay that did
// not emit its text throws: the wrapper or the engine is wrong).
nlohmann::json run_replay(const LlamaModel& model, const std::vector<ReplayText>& texts,
                          const ReplayOptions& options, const ReplayBackendFactory& make_backend);

}  // namespace qspec
