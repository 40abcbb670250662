// The step-cost table of `--draft auto` (runtime/qspec_costs.h): JSON in and out, validation
// naming the field at fault, interpolation, and the table a GPU bench record implies.
#include "runtime/qspec_costs.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/files.h"
#include "qspec/decode_plan.h"
#include "qspec/error.h"

namespace qspec {
namespace {

using json = nlohmann::json;

// The KV cache a table or bench record names in "kv_cache" (or fail naming the file).
KvCacheFormat kv_cache_named(const std::string& name, const std::string& source) {
  const std::optional<KvCacheFormat> format = parse_kv_cache_format(name);
  QSPEC_CHECK(format, source, ": kv_cache: \"", name, "\" (expected f16 or int8)");
  return *format;
}

// A number at `field` of `object` (or fail naming where).
double number_at(const json& object, const char* field, const std::string& where) {
  QSPEC_CHECK(object.is_object() && object.contains(field), where, ": missing \"", field, "\"");
  const json& value = object[field];
  QSPEC_CHECK(value.is_number(), where, ".", field, ": expected a number, got ", value.dump());
  return value.get<double>();
}

int64_t integer_at(const json& object, const char* field, const std::string& where) {
  const double value = number_at(object, field, where);
  QSPEC_CHECK(value == std::floor(value) && std::abs(value) < 9e15, where, ".", field, ": expected a whole number, got ",
              value);
  return static_cast<int64_t>(value);
}

// Linear interpolation of equally long cost vectors.
std::vector<double> lerp(const std::vector<double>& a, const std::vector<double>& b, double t) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + (b[i] - a[i]) * t;
  return out;
}

// Where `x` falls among increasing `keys`: the bracketing indices and the fraction between
// them (clamped to the ends).
struct Bracket {
  size_t lo = 0, hi = 0;
  double t = 0;
};
template <typename Key, typename Map>
Bracket bracket(const std::vector<Key>& keys, double x, Map map) {
  Bracket b;
  if (keys.size() == 1 || x <= static_cast<double>(keys.front())) return b;
  if (x >= static_cast<double>(keys.back())) {
    b.lo = b.hi = keys.size() - 1;
    return b;
  }
  while (b.lo + 1 < keys.size() && static_cast<double>(keys[b.lo + 1]) <= x) ++b.lo;
  b.hi = std::min(b.lo + 1, keys.size() - 1);
  if (b.hi == b.lo) return b;
  const double x0 = map(static_cast<double>(keys[b.lo])), x1 = map(static_cast<double>(keys[b.hi]));
  b.t = x1 > x0 ? (map(x) - x0) / (x1 - x0) : 0.0;
  return b;
}

// A draft spec in its canonical spelling, or fail naming where.
void check_draft_spec(const std::string& spec, const std::string& where) {
  const DecodePlan plan = cost_table_draft_plan(spec, where);
  QSPEC_CHECK(draft_spec(plan) == spec, where, ": draft \"", spec, "\" is spelled \"", draft_spec(plan),
              "\" (the spelling requests and records use)");
}

}  // namespace

DecodePlan cost_table_draft_plan(const std::string& spec, const std::string& where) {
  DecodePlan plan;
  plan.mode = std::string(decode_rules::kQSpecMode);
  try {
    set_draft_spec(plan, spec);
    QSPEC_CHECK(!plan.auto_draft(), "\"auto\" is the planner, not a draft");
    validate(plan);
  } catch (const Error& e) {
    fail(where, ": draft \"", spec, "\": ", e.what());
  }
  return plan;
}

ModelShape ModelShape::of(const ModelConfig& c) {
  return {c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size};
}

std::string ModelShape::describe() const {
  return detail::concat(layers, " layers, hidden ", hidden, ", intermediate ", intermediate, ", ", heads, " heads (",
                        kv_heads, " kv) of ", head_dim, ", vocabulary ", vocab);
}

double StepCosts::verify(double gamma) const {
  // Knots: (0, the W4A16 step), then each measured gamma.
  std::vector<double> xs{0.0}, ys{w4a16_step_ms};
  for (size_t i = 0; i < gammas.size(); ++i) {
    xs.push_back(static_cast<double>(gammas[i]));
    ys.push_back(verify_ms[i]);
  }
  size_t i = 0;
  while (i + 2 < xs.size() && xs[i + 1] < gamma) ++i;
  const double t = (gamma - xs[i]) / (xs[i + 1] - xs[i]);
  return std::max(0.0, ys[i] + (ys[i + 1] - ys[i]) * std::max(t, 0.0));
}

std::vector<std::string> QSpecCostTable::drafts() const {
  std::vector<std::string> out;
  if (!points.empty())
    for (const auto& [draft, ms] : points.front().draft_step_ms) out.push_back(draft);
  return out;
}

std::vector<int64_t> QSpecCostTable::gammas() const {
  std::vector<int64_t> out;
  if (!points.empty())
    for (const auto& [gamma, ms] : points.front().verify_ms) out.push_back(gamma);
  return out;
}

StepCosts QSpecCostTable::at(double batch, double context) const {
  QSPEC_CHECK(!points.empty(), "qspec costs: the table has no points");
  const std::vector<int64_t> gamma_list = gammas();
  const std::vector<std::string> draft_list = drafts();
  // A point's costs as one vector: the step, the verify at each gamma, each draft's step.
  auto flat = [&](const StepCostPoint& p) {
    std::vector<double> v{p.w4a16_step_ms};
    for (int64_t g : gamma_list) v.push_back(p.verify_ms.at(g));
    for (const std::string& d : draft_list) v.push_back(p.draft_step_ms.at(d));
    return v;
  };
  std::map<int64_t, std::vector<const StepCostPoint*>> rows;  // by context, each sorted by batch
  for (const StepCostPoint& p : points) rows[p.context].push_back(&p);
  std::vector<int64_t> contexts;
  for (auto& [c, row] : rows) {
    std::sort(row.begin(), row.end(), [](const auto* a, const auto* b) { return a->batch < b->batch; });
    contexts.push_back(c);
  }
  auto row_at = [&](int64_t c) {
    const auto& row = rows.at(c);
    std::vector<int64_t> batches;
    for (const auto* p : row) batches.push_back(p->batch);
    const Bracket b = bracket(batches, batch, [](double x) { return x; });
    return lerp(flat(*row[b.lo]), flat(*row[b.hi]), b.t);
  };
  const Bracket c = bracket(contexts, context, [](double x) { return std::log(std::max(x, 1.0)); });
  const std::vector<double> v = lerp(row_at(contexts[c.lo]), row_at(contexts[c.hi]), c.t);
  StepCosts costs;
  size_t i = 0;
  costs.w4a16_step_ms = v[i++];
  for (int64_t g : gamma_list) {
    costs.gammas.push_back(g);
    costs.verify_ms.push_back(v[i++]);
  }
  for (const std::string& d : draft_list) costs.draft_step_ms[d] = v[i++];
  return costs;
}

void QSpecCostTable::merge(const QSpecCostTable& other) {
  QSPEC_CHECK(other.device == device, "qspec costs: cannot merge a table measured on '", other.device,
              "' into one measured on '", device, "'");
  QSPEC_CHECK(other.kv_cache == kv_cache, "qspec costs: cannot merge a table measured on an ",
              kv_cache_format_name(other.kv_cache), " KV cache into one measured on an ", kv_cache_format_name(kv_cache));
  QSPEC_CHECK(other.shape == shape, "qspec costs: cannot merge a table of a model with ", other.shape.describe(),
              " into one of ", shape.describe());
  for (const StepCostPoint& p : other.points) {
    auto same = std::find_if(points.begin(), points.end(),
                             [&](const StepCostPoint& q) { return q.batch == p.batch && q.context == p.context; });
    if (same != points.end()) *same = p;
    else points.push_back(p);
  }
  std::sort(points.begin(), points.end(), [](const StepCostPoint& a, const StepCostPoint& b) {
    return a.context != b.context ? a.context < b.context : a.batch < b.batch;
  });
  for (const auto& [draft, a] : other.acceptance) acceptance[draft] = a;
  if (!other.commit.empty()) commit = other.commit;
  if (!other.command.empty()) command = command.empty() ? other.command : command + " ; " + other.command;
}

void QSpecCostTable::validate(const std::string& source) const {
  QSPEC_CHECK(!device.empty(), source, ": device: empty (the machine the costs were measured on)");
  QSPEC_CHECK(shape.layers > 0 && shape.hidden > 0 && shape.vocab > 0, source, ": shape: the model's shapes are missing");
  QSPEC_CHECK(!points.empty(), source, ": points: empty (no measured step)");
  for (const auto& [draft, a] : acceptance) {
    check_draft_spec(draft, source + ": acceptance");
    QSPEC_CHECK(std::isfinite(a) && a >= 0 && a <= 1, source, ": acceptance.", draft, ": must be in [0, 1], got ", a);
  }
  std::set<std::pair<int64_t, int64_t>> seen;
  const StepCostPoint& first = points.front();
  for (size_t i = 0; i < points.size(); ++i) {
    const StepCostPoint& p = points[i];
    const std::string where = source + ": points[" + std::to_string(i) + "]";
    QSPEC_CHECK(p.batch >= 1, where, ".batch: must be >= 1, got ", p.batch);
    QSPEC_CHECK(p.context >= 1, where, ".context: must be >= 1, got ", p.context);
    QSPEC_CHECK(seen.insert({p.batch, p.context}).second, where, ": a second point at batch ", p.batch, ", context ",
                p.context);
    QSPEC_CHECK(std::isfinite(p.w4a16_step_ms) && p.w4a16_step_ms > 0, where, ".w4a16_step_ms: must be > 0, got ",
                p.w4a16_step_ms);
    QSPEC_CHECK(!p.verify_ms.empty(), where, ".verify_ms: empty (no verify measured)");
    for (const auto& [gamma, ms] : p.verify_ms) {
      QSPEC_CHECK(gamma >= 1 && gamma <= decode_rules::kMaxGamma, where, ".verify_ms: gamma ", gamma, " is not in 1..",
                  decode_rules::kMaxGamma);
      QSPEC_CHECK(std::isfinite(ms) && ms > 0, where, ".verify_ms.", gamma, ": must be > 0, got ", ms);
    }
    for (const auto& [draft, ms] : p.draft_step_ms) {
      if (i == 0) check_draft_spec(draft, where + ".draft_step_ms");
      QSPEC_CHECK(std::isfinite(ms) && ms >= 0, where, ".draft_step_ms.", draft, ": must be >= 0, got ", ms);
    }
    auto keys = [](const auto& map) {
      std::vector<std::string> out;
      for (const auto& [key, value] : map) out.push_back(detail::concat(key));
      return out;
    };
    auto list = [](const std::vector<std::string>& names) {
      std::string out;
      for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
      return "{" + out + "}";
    };
    QSPEC_CHECK(keys(p.verify_ms) == keys(first.verify_ms), where, ".verify_ms: gammas ", list(keys(p.verify_ms)),
                " differ from points[0]'s ", list(keys(first.verify_ms)), " (every point measures the same ones)");
    QSPEC_CHECK(keys(p.draft_step_ms) == keys(first.draft_step_ms), where, ".draft_step_ms: drafts ",
                list(keys(p.draft_step_ms)), " differ from points[0]'s ", list(keys(first.draft_step_ms)),
                " (every point measures the same ones)");
  }
}

json QSpecCostTable::to_json() const {
  json out = {{"format", kFormat},
              {"version", kVersion},
              {"device", device},
              {"kv_cache", kv_cache_format_name(kv_cache)},
              {"model", model},
              {"shape",
               {{"layers", shape.layers},
                {"hidden", shape.hidden},
                {"intermediate", shape.intermediate},
                {"heads", shape.heads},
                {"kv_heads", shape.kv_heads},
                {"head_dim", shape.head_dim},
                {"vocab", shape.vocab}}},
              {"commit", commit},
              {"command", command}};
  if (!acceptance.empty()) out["acceptance"] = acceptance;
  json list = json::array();
  for (const StepCostPoint& p : points) {
    json verify = json::object();
    for (const auto& [gamma, ms] : p.verify_ms) verify[std::to_string(gamma)] = ms;
    list.push_back({{"batch", p.batch},
                    {"context", p.context},
                    {"w4a16_step_ms", p.w4a16_step_ms},
                    {"verify_ms", verify},
                    {"draft_step_ms", p.draft_step_ms}});
  }
  out["points"] = list;
  return out;
}

QSpecCostTable QSpecCostTable::from_json(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(source, ": not JSON (", e.what(), ")");
  }
  QSPEC_CHECK(j.is_object() && j.contains("format") && j["format"] == kFormat, source,
              ": not a qspec step-cost table (\"format\": \"", kFormat, "\")");
  QSPEC_CHECK(j.contains("version") && j["version"] == kVersion, source, ": version: ",
              j.contains("version") ? j["version"].dump() : std::string("missing"), " (this qspec reads ", kVersion, ")");
  auto string_at = [&](const char* field, bool required) {
    if (!j.contains(field)) {
      QSPEC_CHECK(!required, source, ": missing \"", field, "\"");
      return std::string();
    }
    QSPEC_CHECK(j[field].is_string(), source, ": ", field, ": expected a string, got ", j[field].dump());
    return j[field].get<std::string>();
  };
  QSpecCostTable table;
  table.device = string_at("device", true);
  if (const std::string cache = string_at("kv_cache", false); !cache.empty()) table.kv_cache = kv_cache_named(cache, source);
  table.model = string_at("model", false);
  table.commit = string_at("commit", false);
  table.command = string_at("command", false);
  QSPEC_CHECK(j.contains("shape") && j["shape"].is_object(), source, ": missing \"shape\" (the model's shapes)");
  const std::string shape_where = source + ": shape";
  const json& s = j["shape"];
  table.shape = {integer_at(s, "layers", shape_where),   integer_at(s, "hidden", shape_where),
                 integer_at(s, "intermediate", shape_where), integer_at(s, "heads", shape_where),
                 integer_at(s, "kv_heads", shape_where), integer_at(s, "head_dim", shape_where),
                 integer_at(s, "vocab", shape_where)};
  if (j.contains("acceptance")) {
    QSPEC_CHECK(j["acceptance"].is_object(), source, ": acceptance: expected an object of draft -> rate");
    for (auto it = j["acceptance"].begin(); it != j["acceptance"].end(); ++it) {
      QSPEC_CHECK(it.value().is_number(), source, ": acceptance.", it.key(), ": expected a number, got ",
                  it.value().dump());
      table.acceptance[it.key()] = it.value().get<double>();
    }
  }
  QSPEC_CHECK(j.contains("points") && j["points"].is_array(), source, ": missing \"points\" (an array)");
  for (size_t i = 0; i < j["points"].size(); ++i) {
    const json& p = j["points"][i];
    const std::string where = source + ": points[" + std::to_string(i) + "]";
    QSPEC_CHECK(p.is_object(), where, ": expected an object");
    StepCostPoint point;
    point.batch = integer_at(p, "batch", where);
    point.context = integer_at(p, "context", where);
    point.w4a16_step_ms = number_at(p, "w4a16_step_ms", where);
    QSPEC_CHECK(p.contains("verify_ms") && p["verify_ms"].is_object(), where,
                ".verify_ms: expected an object of gamma -> milliseconds");
    for (auto it = p["verify_ms"].begin(); it != p["verify_ms"].end(); ++it) {
      const std::string& key = it.key();
      QSPEC_CHECK(!key.empty() && key.size() <= 3 && std::all_of(key.begin(), key.end(), ::isdigit), where,
                  ".verify_ms: key \"", key, "\" is not a gamma (a whole number)");
      QSPEC_CHECK(it.value().is_number(), where, ".verify_ms.", key, ": expected a number, got ", it.value().dump());
      point.verify_ms[std::stoll(key)] = it.value().get<double>();
    }
    QSPEC_CHECK(p.contains("draft_step_ms") && p["draft_step_ms"].is_object(), where,
                ".draft_step_ms: expected an object of draft -> milliseconds");
    for (auto it = p["draft_step_ms"].begin(); it != p["draft_step_ms"].end(); ++it) {
      QSPEC_CHECK(it.value().is_number(), where, ".draft_step_ms.", it.key(), ": expected a number, got ",
                  it.value().dump());
      point.draft_step_ms[it.key()] = it.value().get<double>();
    }
    table.points.push_back(std::move(point));
  }
  table.validate(source);
  return table;
}

QSpecCostTable QSpecCostTable::load(const std::string& path) {
  std::ifstream file(path);
  QSPEC_CHECK(file.good(), path, ": cannot read the step-cost table");
  std::stringstream text;
  text << file.rdbuf();
  return from_json(text.str(), path);
}

void QSpecCostTable::save(const std::string& path) const {
  validate(path);
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  QSPEC_CHECK(out.good(), path, ": cannot write");
  out << to_json().dump(2) << "\n";
  QSPEC_CHECK(out.good(), path, ": write failed");
}

std::map<std::string, double> acceptance_from_trace(const json& trace, const std::string& source) {
  QSPEC_CHECK(trace.is_object() && trace.contains("results") && trace["results"].is_array(), source,
              ": expected a `qspec eval qspec` result (an object with a results array)");
  std::map<std::string, std::pair<double, double>> counts;  // draft -> accepted, rejections
  for (size_t i = 0; i < trace["results"].size(); ++i) {
    const json& r = trace["results"][i];
    const std::string where = source + ": results[" + std::to_string(i) + "]";
    QSPEC_CHECK(r.is_object() && r.contains("draft") && r["draft"].is_string() && r.contains("accepted_histogram") &&
                    r["accepted_histogram"].is_array(),
                where, ": a result without draft or accepted_histogram");
    if (r.contains("kv_overwrite") && r["kv_overwrite"].is_boolean() && !r["kv_overwrite"].get<bool>()) continue;
    const json& histogram = r["accepted_histogram"];
    auto& [accepted, rejections] = counts[r["draft"].get<std::string>()];
    for (size_t k = 0; k < histogram.size(); ++k) {
      QSPEC_CHECK(histogram[k].is_number(), where, ".accepted_histogram[", k, "]: expected a number");
      const double cycles = histogram[k].get<double>();
      accepted += cycles * static_cast<double>(k);
      if (k + 1 < histogram.size()) rejections += cycles;  // fewer than gamma kept: one draft rejected
    }
  }
  std::map<std::string, double> out;
  for (const auto& [draft, c] : counts)
    if (c.first + c.second > 0) out[draft] = c.first / (c.first + c.second);
  return out;
}

QSpecCostTable QSpecCostTable::from_gpu_bench_record(const json& record, const ModelShape& shape,
                                                     const std::string& model, const json* accept_trace) {
  const std::string source = "the bench record";
  QSPEC_CHECK(record.is_object() && record.contains("gpu") && record["gpu"].is_string(), source, ": no \"gpu\"");
  const int64_t context = integer_at(record, "context", source);
  QSPEC_CHECK(record.contains("modes") && record["modes"].contains("w4a16"), source,
              ": no w4a16 mode (run the bench with --modes w4a16)");
  const json& w4a16 = record["modes"]["w4a16"];
  QSPEC_CHECK(w4a16.contains("decode") && w4a16["decode"].is_array() && !w4a16["decode"].empty(), source,
              ": no w4a16 decode steps");
  QSPEC_CHECK(w4a16.contains("qspec") && w4a16["qspec"].is_array() && !w4a16["qspec"].empty(), source,
              ": no QSpec cycles (run the bench with --qspec-gammas and --qspec-drafts)");
  QSpecCostTable table;
  table.device = record["gpu"].get<std::string>();
  if (record.contains("kv_cache") && record["kv_cache"].is_string())
    table.kv_cache = kv_cache_named(record["kv_cache"].get<std::string>(), source);
  table.model = model;
  table.shape = shape;
  table.commit = record.value("commit", std::string());
  table.command = record.value("command", std::string());
  std::map<int64_t, StepCostPoint> by_batch;
  for (const json& row : w4a16["decode"]) {
    StepCostPoint& p = by_batch[integer_at(row, "batch", source + ": decode")];
    p.batch = row["batch"].get<int64_t>();
    p.context = context;
    p.w4a16_step_ms = number_at(row, "step_ms", source + ": decode");
  }
  // Means over the rows that measured the same thing: the verify per (batch, gamma) for every
  // draft, a draft's step per (batch, draft) at every gamma.
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> verify;
  std::map<std::pair<int64_t, std::string>, std::vector<double>> draft;
  for (const json& row : w4a16["qspec"]) {
    const std::string where = source + ": qspec";
    const int64_t batch = integer_at(row, "batch", where);
    QSPEC_CHECK(by_batch.count(batch), where, ": batch ", batch, " has no w4a16 decode step");
    QSPEC_CHECK(row.contains("draft") && row["draft"].is_string(), where, ": a row without draft");
    verify[{batch, integer_at(row, "gamma", where)}].push_back(number_at(row, "verify_ms", where));
    draft[{batch, row["draft"].get<std::string>()}].push_back(number_at(row, "draft_step_ms", where));
  }
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  for (const auto& [key, values] : verify) by_batch[key.first].verify_ms[key.second] = mean(values);
  for (const auto& [key, values] : draft) by_batch[key.first].draft_step_ms[key.second] = mean(values);
  for (auto& [batch, p] : by_batch) {
    if (p.verify_ms.empty()) continue;  // a batch without QSpec rows
    p.draft_step_ms[std::string(decode_rules::kNgramDraft)] = 0.0;  // prompt lookup reads no weights
    table.points.push_back(p);
  }
  if (accept_trace) {
    const std::vector<std::string> drafts = table.drafts();
    for (const auto& [name, a] : acceptance_from_trace(*accept_trace, "--accept-trace"))
      if (std::find(drafts.begin(), drafts.end(), name) != drafts.end()) table.acceptance[name] = a;
  }
  try {
    table.validate(source);
  } catch (const Error& e) {
    fail(e.what(), " (the table needs every draft timed at every gamma and batch)");
  }
  return table;
}

std::string cost_table_file_name(const std::string& device, const std::string& model) {
  return "qspec-costs-" + file_name_slug(device) + "-" + file_name_slug(model) + ".json";
}

std::string find_cost_table(const std::vector<std::string>& dirs, const std::string& device, const ModelShape& shape,
                            KvCacheFormat kv_cache) {
  for (const std::string& dir : dirs) {
    for (const std::string& file : sorted_json_files(dir)) {
      std::ifstream in(file);
      std::stringstream text;
      text << in.rdbuf();
      const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("format") || j["format"] != QSpecCostTable::kFormat) continue;
      const QSpecCostTable table = QSpecCostTable::from_json(text.str(), file);
      if (table.device == device && table.shape == shape && table.kv_cache == kv_cache) return file;
    }
  }
  return "";
}

}  // namespace qspec
