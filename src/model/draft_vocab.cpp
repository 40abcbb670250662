// The draft vocabulary table (model/draft_vocab.h): ranking, identity, and its JSON file.
#include "model/draft_vocab.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/files.h"
#include "model/llama.h"
#include "qspec/error.h"

namespace qspec {
namespace {
// lm_head rows the fingerprint hashes, evenly spaced over the vocabulary: enough to tell two
// checkpoints apart, cheap at load even for a 128 K x 4096 head.
constexpr int64_t kFingerprintRows = 16;
// A table file is a list of ids: 2 MiB holds a 256 K vocabulary's ranking.
constexpr uint64_t kMaxDraftVocabFileBytes = uint64_t{8} << 20;
}  // namespace

std::vector<int32_t> rank_token_frequencies(std::span<const std::vector<int32_t>> sequences, int64_t vocab_size,
                                            std::span<const int32_t> first) {
  QSPEC_CHECK(vocab_size > 0, "draft vocabulary: vocab_size must be > 0, got ", vocab_size);
  std::vector<int64_t> counts(static_cast<size_t>(vocab_size), 0);
  for (const std::vector<int32_t>& sequence : sequences)
    for (int32_t id : sequence) {
      QSPEC_CHECK(id >= 0 && id < vocab_size, "draft vocabulary: calibration token id ", id,
                  " is outside the vocabulary [0, ", vocab_size, ")");
      ++counts[static_cast<size_t>(id)];
    }
  std::vector<int32_t> ranked(static_cast<size_t>(vocab_size));
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) {
    return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)];
  });
  std::vector<int32_t> out;
  std::vector<bool> placed(static_cast<size_t>(vocab_size), false);
  for (int32_t id : first) {
    QSPEC_CHECK(id >= 0 && id < vocab_size, "draft vocabulary: token id ", id, " is outside the vocabulary [0, ",
                vocab_size, ")");
    if (placed[static_cast<size_t>(id)]) continue;
    placed[static_cast<size_t>(id)] = true;
    out.push_back(id);
  }
  for (int32_t id : ranked)
    if (!placed[static_cast<size_t>(id)]) out.push_back(id);
  return out;
}

std::string draft_vocab_fingerprint(const LlamaModel& model) {
  const WeightMatrix& head = model.lm_head();
  uint64_t hash = 1469598103934665603ull;  // FNV-1a 64
  std::vector<float> row(static_cast<size_t>(head.cols));
  for (int64_t i = 0; i < kFingerprintRows; ++i) {
    head.row_to_f32(i * (head.rows - 1) / (kFingerprintRows - 1), row.data());
    for (float value : row) {
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof bits);
      for (int byte = 0; byte < 4; ++byte) {
        hash ^= (bits >> (8 * byte)) & 0xffu;
        hash *= 1099511628211ull;
      }
    }
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

DraftVocabTable make_draft_vocab_table(const LlamaModel& model, std::span<const int32_t> ranked, int64_t rows,
                                       std::vector<std::string> calibration, int64_t calibration_tokens) {
  const ModelConfig& c = model.config();
  QSPEC_CHECK(rows >= 1 && rows <= static_cast<int64_t>(ranked.size()), "draft vocabulary: --vocab ", rows,
              " outside 1..", ranked.size(), " (the vocabulary)");
  DraftVocabTable table;
  table.model = std::filesystem::path(model.dir()).filename().string();
  if (table.model.empty()) table.model = model.dir();
  table.architecture = c.architecture_name;
  table.vocab_size = c.vocab_size;
  table.hidden_size = c.hidden_size;
  table.num_layers = c.num_layers;
  table.lm_head_fingerprint = draft_vocab_fingerprint(model);
  table.calibration = std::move(calibration);
  table.calibration_tokens = calibration_tokens;
  table.ids.assign(ranked.begin(), ranked.begin() + rows);
  return table;
}

void write_draft_vocab_table(const DraftVocabTable& table, const std::string& dir) {
  nlohmann::json j;
  j["format"] = kDraftVocabFormat;
  j["model"] = table.model;
  j["architecture"] = table.architecture;
  j["vocab_size"] = table.vocab_size;
  j["hidden_size"] = table.hidden_size;
  j["num_layers"] = table.num_layers;
  j["lm_head_fingerprint"] = table.lm_head_fingerprint;
  j["calibration"] = table.calibration;
  j["calibration_tokens"] = table.calibration_tokens;
  j["ids"] = table.ids;
  const std::filesystem::path path = std::filesystem::path(dir) / kDraftVocabFile;
  const std::filesystem::path staging = path.string() + ".tmp";
  {
    std::ofstream out(staging);
    QSPEC_CHECK(out.good(), staging.string(), ": cannot write the draft vocabulary table");
    out << j.dump() << "\n";
    QSPEC_CHECK(out.good(), staging.string(), ": cannot write the draft vocabulary table");
  }
  std::filesystem::rename(staging, path);  // whole or not at all
}

DraftVocabTable read_draft_vocab_table(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path, kMaxDraftVocabFileBytes));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not a JSON draft vocabulary table (", e.what(), ")");
  }
  QSPEC_CHECK(j.is_object(), path, ": a draft vocabulary table is a JSON object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    QSPEC_CHECK(j.contains(name), path, ": missing field '", name, "'");
    return j[name];
  };
  auto text = [&](const char* name) {
    const nlohmann::json& v = field(name);
    QSPEC_CHECK(v.is_string(), path, ": field '", name, "' must be a string");
    return v.get<std::string>();
  };
  auto number = [&](const char* name) {
    const nlohmann::json& v = field(name);
    QSPEC_CHECK(v.is_number_integer(), path, ": field '", name, "' must be an integer");
    return v.get<int64_t>();
  };
  QSPEC_CHECK(text("format") == kDraftVocabFormat, path, ": field 'format' is '", text("format"), "', expected '",
              kDraftVocabFormat, "'");
  DraftVocabTable table;
  table.model = text("model");
  table.architecture = text("architecture");
  table.vocab_size = number("vocab_size");
  table.hidden_size = number("hidden_size");
  table.num_layers = number("num_layers");
  table.lm_head_fingerprint = text("lm_head_fingerprint");
  table.calibration_tokens = number("calibration_tokens");
  const nlohmann::json& calibration = field("calibration");
  QSPEC_CHECK(calibration.is_array(), path, ": field 'calibration' must be a list of file names");
  for (const nlohmann::json& name : calibration) {
    QSPEC_CHECK(name.is_string(), path, ": field 'calibration' must be a list of file names");
    table.calibration.push_back(name.get<std::string>());
  }
  QSPEC_CHECK(table.vocab_size > 0, path, ": field 'vocab_size' must be > 0, got ", table.vocab_size);
  const nlohmann::json& ids = field("ids");
  QSPEC_CHECK(ids.is_array() && !ids.empty() && static_cast<int64_t>(ids.size()) <= table.vocab_size, path,
              ": field 'ids' must be a list of 1..vocab_size (", table.vocab_size, ") token ids");
  std::vector<bool> seen(static_cast<size_t>(table.vocab_size), false);
  for (size_t i = 0; i < ids.size(); ++i) {
    QSPEC_CHECK(ids[i].is_number_integer(), path, ": field 'ids'[", i, "] must be an integer");
    const int64_t id = ids[i].get<int64_t>();
    QSPEC_CHECK(id >= 0 && id < table.vocab_size, path, ": field 'ids'[", i, "] = ", id,
                " is outside the vocabulary [0, ", table.vocab_size, ")");
    QSPEC_CHECK(!seen[static_cast<size_t>(id)], path, ": field 'ids'[", i, "] = ", id, " appears twice");
    seen[static_cast<size_t>(id)] = true;
    table.ids.push_back(static_cast<int32_t>(id));
  }
  return table;
}

void check_draft_vocab_table(const DraftVocabTable& table, const LlamaModel& model, const std::string& source) {
  const ModelConfig& c = model.config();
  auto mismatch = [&](const char* field, const auto& theirs, const auto& ours) {
    fail(source, ": field '", field, "' is ", theirs, " but the model in ", model.dir(), " has ", ours,
         ": this draft vocabulary table was made for another model ('", table.model, "'); remake it with `qspec "
         "tune-draft ", model.dir(), " --calibration FILE`");
  };
  if (table.vocab_size != c.vocab_size) mismatch("vocab_size", table.vocab_size, c.vocab_size);
  if (table.hidden_size != c.hidden_size) mismatch("hidden_size", table.hidden_size, c.hidden_size);
  if (table.num_layers != c.num_layers) mismatch("num_layers", table.num_layers, c.num_layers);
  if (table.architecture != c.architecture_name) mismatch("architecture", table.architecture, c.architecture_name);
  const std::string fingerprint = draft_vocab_fingerprint(model);
  if (table.lm_head_fingerprint != fingerprint) mismatch("lm_head_fingerprint", table.lm_head_fingerprint, fingerprint);
}

std::string missing_draft_vocab_message(const std::string& model_dir) {
  return model_dir + " has no draft vocabulary table (" +
         (std::filesystem::path(model_dir) / kDraftVocabFile).string() +
         "): make one with `qspec tune-draft " + model_dir + " --calibration FILE`";
}

}  // namespace qspec
