// The layer skip table (model/draft_skip.h): its JSON file and its checks.
#include "model/draft_skip.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/llama.h"
#include "qspec/error.h"

namespace qspec {
namespace {
// A table is a few numbers a layer: 1 MiB holds thousands of layers.
constexpr uint64_t kMaxDraftSkipFileBytes = uint64_t{1} << 20;
constexpr std::string_view kWhat = "draft skip table";
}  // namespace

void write_draft_skip_table(const DraftSkipTable& table, const std::string& dir) {
  nlohmann::json j;
  write_draft_table_identity(table, kDraftSkipFormat, j);
  j["draft_mode"] = table.draft_mode;
  j["target_mode"] = table.target_mode;
  j["order"] = table.order;
  j["agreement"] = table.agreement;
  write_draft_table_json(j, dir, kDraftSkipFile, kWhat);
}

DraftSkipTable read_draft_skip_table(const std::string& path) {
  const nlohmann::json j = read_draft_table_json(path, kMaxDraftSkipFileBytes, kWhat);
  DraftSkipTable table;
  static_cast<DraftTableIdentity&>(table) = read_draft_table_identity(j, kDraftSkipFormat, path);
  for (const char* name : {"draft_mode", "target_mode", "order", "agreement"})
    QSPEC_CHECK(j.contains(name), path, ": missing field '", name, "'");
  QSPEC_CHECK(j["draft_mode"].is_string(), path, ": field 'draft_mode' must be a string");
  QSPEC_CHECK(j["target_mode"].is_string(), path, ": field 'target_mode' must be a string");
  table.draft_mode = j["draft_mode"].get<std::string>();
  table.target_mode = j["target_mode"].get<std::string>();
  const nlohmann::json& order = j["order"];
  // A draft keeps at least one layer: skipping all of them is the embedding alone.
  QSPEC_CHECK(order.is_array() && static_cast<int64_t>(order.size()) < table.num_layers, path,
              ": field 'order' must be a list of fewer than num_layers (", table.num_layers, ") layer ids");
  std::vector<bool> seen(static_cast<size_t>(table.num_layers), false);
  for (size_t i = 0; i < order.size(); ++i) {
    QSPEC_CHECK(order[i].is_number_integer(), path, ": field 'order'[", i, "] must be an integer");
    const int64_t layer = order[i].get<int64_t>();
    QSPEC_CHECK(layer >= 0 && layer < table.num_layers, path, ": field 'order'[", i, "] = ", layer,
                " is not a layer of [0, ", table.num_layers, ")");
    QSPEC_CHECK(!seen[static_cast<size_t>(layer)], path, ": field 'order'[", i, "] = ", layer, " appears twice");
    seen[static_cast<size_t>(layer)] = true;
    table.order.push_back(static_cast<int32_t>(layer));
  }
  const nlohmann::json& agreement = j["agreement"];
  QSPEC_CHECK(agreement.is_array() && agreement.size() == order.size() + 1, path,
              ": field 'agreement' must hold order's length + 1 (", order.size() + 1, ") numbers");
  for (size_t i = 0; i < agreement.size(); ++i) {
    QSPEC_CHECK(agreement[i].is_number() && agreement[i].get<double>() >= 0 && agreement[i].get<double>() <= 1, path,
                ": field 'agreement'[", i, "] must be a number in [0, 1]");
    table.agreement.push_back(agreement[i].get<double>());
  }
  return table;
}

void check_draft_skip_table(const DraftSkipTable& table, const LlamaModel& model, const std::string& source) {
  check_draft_table_identity(table, model, source);
}

namespace {
// The calibration tokens of a search as one batch: every sequence with its own cache.
struct SearchBatch {
  std::vector<KvCache> caches;
  std::vector<LlamaModel::Segment> segments;
  std::vector<int32_t> positions;
  std::vector<int32_t> tokens;
  int64_t count = 0;
};

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}
}  // namespace

DraftSkipTable search_draft_skip(const LlamaModel& model, std::span<const std::vector<int32_t>> sequences,
                                 const RunMode& draft, const RunMode& target, int64_t max_skip,
                                 const DraftSkipProgress& progress) {
  const ModelConfig& c = model.config();
  const int64_t layers = c.num_layers, hidden = c.hidden_size, vocab = c.vocab_size;
  QSPEC_CHECK(max_skip >= 1 && max_skip < layers, "draft skip search: --skip-max ", max_skip, " outside 1..",
              layers - 1, " (a draft keeps at least one of the ", layers, " layers)");
  SearchBatch batch;
  batch.caches.reserve(sequences.size());
  for (const std::vector<int32_t>& sequence : sequences) {
    const int64_t n = static_cast<int64_t>(sequence.size());
    if (n == 0) continue;
    QSPEC_CHECK(n <= c.max_position_embeddings, "draft skip search: a calibration sequence of ", n,
                " tokens exceeds the model's context of ", c.max_position_embeddings);
    batch.caches.push_back(model.new_cache(n));
    batch.segments.push_back(LlamaModel::Segment{batch.count, n, batch.caches.back().blocks()});
    for (int64_t t = 0; t < n; ++t) batch.positions.push_back(static_cast<int32_t>(t));
    batch.tokens.insert(batch.tokens.end(), sequence.begin(), sequence.end());
    batch.count += n;
  }
  QSPEC_CHECK(batch.count > 0, "draft skip search: no calibration tokens");
  const int64_t count = batch.count;
  LlamaModel::Workspace workspace = model.make_workspace(count);
  std::vector<float> embedded(static_cast<size_t>(count * hidden));
  for (int64_t t = 0; t < count; ++t) model.input_embedding(batch.tokens[static_cast<size_t>(t)], &embedded[t * hidden]);
  std::vector<float> logits;
  // The layers from `first` on (the skipped ones left out) over x in place, then each position's pick.
  auto picks = [&](std::vector<float>& x, int64_t first, const std::vector<bool>& skipped, const RunMode& mode,
                   std::vector<std::vector<float>>* inputs) {
    for (int64_t l = first; l < layers; ++l) {
      if (inputs) (*inputs)[static_cast<size_t>(l)] = x;
      if (!skipped[static_cast<size_t>(l)])
        model.run_layer(l, x.data(), count, batch.positions.data(), batch.segments, mode, nullptr, workspace);
    }
    model.output_logits(x.data(), count, mode, workspace, logits);
    std::vector<int32_t> ids(static_cast<size_t>(count));
    for (int64_t t = 0; t < count; ++t) ids[static_cast<size_t>(t)] = argmax(&logits[static_cast<size_t>(t * vocab)], vocab);
    return ids;
  };
  const std::vector<bool> none(static_cast<size_t>(layers), false);
  std::vector<float> x = embedded;
  const std::vector<int32_t> reference = picks(x, 0, none, target, nullptr);
  auto agreement = [&](const std::vector<int32_t>& ids) {
    int64_t same = 0;
    for (int64_t t = 0; t < count; ++t) same += ids[static_cast<size_t>(t)] == reference[static_cast<size_t>(t)];
    return static_cast<double>(same) / static_cast<double>(count);
  };

  DraftSkipTable table;
  table.draft_mode = draft.name;
  table.target_mode = target.name;
  std::vector<bool> skipped = none;
  // The residual stream at each layer's input with the chosen layers skipped.
  std::vector<std::vector<float>> inputs(static_cast<size_t>(layers));
  x = embedded;
  table.agreement.push_back(agreement(picks(x, 0, skipped, draft, &inputs)));
  const auto start = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < max_skip; ++k) {
    int32_t best = -1;
    double best_agreement = -1;
    for (int64_t l = 0; l < layers; ++l) {
      if (skipped[static_cast<size_t>(l)]) continue;
      // Skipping l: the layers before it run as they did, so start from its input.
      skipped[static_cast<size_t>(l)] = true;
      x = inputs[static_cast<size_t>(l)];
      const double a = agreement(picks(x, l + 1, skipped, draft, nullptr));
      skipped[static_cast<size_t>(l)] = false;
      if (a > best_agreement) best = static_cast<int32_t>(l), best_agreement = a;  // ties: the lower layer
    }
    skipped[static_cast<size_t>(best)] = true;
    table.order.push_back(best);
    // The chosen set's inputs from the chosen layer on, and its agreement (best_agreement's).
    x = inputs[static_cast<size_t>(best)];
    (void)picks(x, best, skipped, draft, &inputs);
    table.agreement.push_back(best_agreement);
    if (progress)
      progress(k + 1, best, best_agreement,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return table;
}

std::string missing_draft_skip_message(const std::string& model_dir) {
  return model_dir + " has no draft skip table (" + (std::filesystem::path(model_dir) / kDraftSkipFile).string() +
         "): make one with `qspec tune-draft " + model_dir + " --calibration FILE`";
}

}  // namespace qspec
