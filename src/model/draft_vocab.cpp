// The draft vocabulary table (model/draft_vocab.h): ranking, identity, and its JSON file; and
// what every draft table shares (DraftTableIdentity, the JSON file's reading and writing).
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

DraftTableIdentity draft_table_identity(const LlamaModel& model, std::vector<std::string> calibration,
                                        int64_t calibration_tokens) {
  const ModelConfig& c = model.config();
  DraftTableIdentity identity;
  identity.model = std::filesystem::path(model.dir()).filename().string();
  if (identity.model.empty()) identity.model = model.dir();
  identity.architecture = c.architecture_name;
  identity.vocab_size = c.vocab_size;
  identity.hidden_size = c.hidden_size;
  identity.num_layers = c.num_layers;
  identity.lm_head_fingerprint = draft_vocab_fingerprint(model);
  identity.calibration = std::move(calibration);
  identity.calibration_tokens = calibration_tokens;
  return identity;
}

void write_draft_table_identity(const DraftTableIdentity& identity, std::string_view format, nlohmann::json& j) {
  j["format"] = format;
  j["model"] = identity.model;
  j["architecture"] = identity.architecture;
  j["vocab_size"] = identity.vocab_size;
  j["hidden_size"] = identity.hidden_size;
  j["num_layers"] = identity.num_layers;
  j["lm_head_fingerprint"] = identity.lm_head_fingerprint;
  j["calibration"] = identity.calibration;
  j["calibration_tokens"] = identity.calibration_tokens;
}

DraftTableIdentity read_draft_table_identity(const nlohmann::json& j, std::string_view format, const std::string& path) {
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
  QSPEC_CHECK(text("format") == format, path, ": field 'format' is '", text("format"), "', expected '", format, "'");
  DraftTableIdentity identity;
  identity.model = text("model");
  identity.architecture = text("architecture");
  identity.vocab_size = number("vocab_size");
  identity.hidden_size = number("hidden_size");
  identity.num_layers = number("num_layers");
  identity.lm_head_fingerprint = text("lm_head_fingerprint");
  identity.calibration_tokens = number("calibration_tokens");
  const nlohmann::json& calibration = field("calibration");
  QSPEC_CHECK(calibration.is_array(), path, ": field 'calibration' must be a list of file names");
  for (const nlohmann::json& name : calibration) {
    QSPEC_CHECK(name.is_string(), path, ": field 'calibration' must be a list of file names");
    identity.calibration.push_back(name.get<std::string>());
  }
  QSPEC_CHECK(identity.vocab_size > 0, path, ": field 'vocab_size' must be > 0, got ", identity.vocab_size);
  QSPEC_CHECK(identity.num_layers > 0, path, ": field 'num_layers' must be > 0, got ", identity.num_layers);
  return identity;
}

void check_draft_table_identity(const DraftTableIdentity& identity, const LlamaModel& model, const std::string& source) {
  const ModelConfig& c = model.config();
  auto mismatch = [&](const char* field, const auto& theirs, const auto& ours) {
    fail(source, ": field '", field, "' is ", theirs, " but the model in ", model.dir(), " has ", ours,
         ": this table was made for another model ('", identity.model, "'); remake it with `qspec "
         "tune-draft ", model.dir(), " --calibration FILE`");
  };
  if (identity.vocab_size != c.vocab_size) mismatch("vocab_size", identity.vocab_size, c.vocab_size);
  if (identity.hidden_size != c.hidden_size) mismatch("hidden_size", identity.hidden_size, c.hidden_size);
  if (identity.num_layers != c.num_layers) mismatch("num_layers", identity.num_layers, c.num_layers);
  if (identity.architecture != c.architecture_name) mismatch("architecture", identity.architecture, c.architecture_name);
  const std::string fingerprint = draft_vocab_fingerprint(model);
  if (identity.lm_head_fingerprint != fingerprint)
    mismatch("lm_head_fingerprint", identity.lm_head_fingerprint, fingerprint);
}

nlohmann::json read_draft_table_json(const std::string& path, uint64_t max_bytes, std::string_view what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path, max_bytes));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not a JSON ", what, " (", e.what(), ")");
  }
  QSPEC_CHECK(j.is_object(), path, ": a ", what, " is a JSON object");
  return j;
}

void write_draft_table_json(const nlohmann::json& j, const std::string& dir, std::string_view file,
                            std::string_view what) {
  const std::filesystem::path path = std::filesystem::path(dir) / file;
  const std::filesystem::path staging = path.string() + ".tmp";
  {
    std::ofstream out(staging);
    QSPEC_CHECK(out.good(), staging.string(), ": cannot write the ", what);
    out << j.dump() << "\n";
    QSPEC_CHECK(out.good(), staging.string(), ": cannot write the ", what);
  }
  std::filesystem::rename(staging, path);  // whole or not at all
}

DraftVocabTable make_draft_vocab_table(const LlamaModel& model, std::span<const int32_t> ranked, int64_t rows,
                                       std::vector<std::string> calibration, int64_t calibration_tokens) {
  QSPEC_CHECK(rows >= 1 && rows <= static_cast<int64_t>(ranked.size()), "draft vocabulary: --vocab ", rows,
              " outside 1..", ranked.size(), " (the vocabulary)");
  DraftVocabTable table;
  static_cast<DraftTableIdentity&>(table) = draft_table_identity(model, std::move(calibration), calibration_tokens);
  table.ids.assign(ranked.begin(), ranked.begin() + rows);
  return table;
}

void write_draft_vocab_table(const DraftVocabTable& table, const std::string& dir) {
  nlohmann::json j;
  write_draft_table_identity(table, kDraftVocabFormat, j);
  j["ids"] = table.ids;
  write_draft_table_json(j, dir, kDraftVocabFile, "draft vocabulary table");
}

DraftVocabTable read_draft_vocab_table(const std::string& path) {
  const nlohmann::json j = read_draft_table_json(path, kMaxDraftVocabFileBytes, "draft vocabulary table");
  DraftVocabTable table;
  static_cast<DraftTableIdentity&>(table) = read_draft_table_identity(j, kDraftVocabFormat, path);
  QSPEC_CHECK(j.contains("ids"), path, ": missing field 'ids'");
  const nlohmann::json& ids = j["ids"];
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
  check_draft_table_identity(table, model, source);
}

std::string missing_draft_vocab_message(const std::string& model_dir) {
  return model_dir + " has no draft vocabulary table (" +
         (std::filesystem::path(model_dir) / kDraftVocabFile).string() +
         "): make one with `qspec tune-draft " + model_dir + " --calibration FILE`";
}

}  // namespace qspec
