#include "gemm/policy_map.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>

#include "base/files.h"
#include "quant/quantized_linear.h"
#include <sstream>

#include "qspec/error.h"

namespace qspec::gemm {

namespace {
constexpr std::string_view kNames[kStrategies] = {
    "small_m_v1",   "small_m_v2",    "small_m_v3",     "small_m_v4",    "tiled_256x64", "tiled_128x64",
    "tiled_256x32", "tiled_128x128", "dequant_cublas", "split_small_m", "bitwise_b1",
    "s8_wide_128x128", "s8_wgmma_128x128", "small_m_v5", "tiled_128x32", "wgmma_128x128", "wgmma_128x256",
    "builtin"};
constexpr std::string_view kActivations[] = {"f16", "int8", "int4", "fp8", "nvfp4", "mxfp4"};

int activations_index(std::string_view activations) {
  for (int i = 0; i < static_cast<int>(std::size(kActivations)); ++i)
    if (kActivations[i] == activations) return i;
  return -1;
}
bool known_activations(std::string_view activations) { return activations_index(activations) >= 0; }
}  // namespace

std::string_view strategy_name(Strategy strategy) { return kNames[static_cast<int>(strategy)]; }

Strategy parse_strategy(std::string_view name) {
  for (int i = 0; i < kStrategies; ++i)
    if (kNames[i] == name) return static_cast<Strategy>(i);
  std::string known;
  for (std::string_view n : kNames) known += (known.empty() ? "" : ", ") + std::string(n);
  fail("unknown GEMM strategy '", name, "' (known: ", known, ")");
}

bool strategy_supports(Strategy strategy, std::string_view activations) {
  if (strategy == Strategy::builtin) return true;  // the kernels' own choice for every kind
  if (strategy == Strategy::split_small_m) return activations == "int8";
  if (strategy == Strategy::bitwise_b1) return activations == "int8" || activations == "int4";
  if (strategy == Strategy::s8_wide_128x128) return activations == "int8";
  // The wgmma kernel's operands are 8-bit: int8 codes, or e4m3 codes with the weights unpacked to e4m3.
  if (strategy == Strategy::s8_wgmma_128x128) return activations == "int8" || activations == "fp8";
  // The preload kernel: f16, and W4A8's int8 codes with a scale a token (up to 8 tokens a launch).
  if (strategy == Strategy::small_m_v5) return activations == "f16" || activations == "int8";
  if (strategy == Strategy::wgmma_128x128 || strategy == Strategy::wgmma_128x256)
    return activations == "f16";  // f16 values as wgmma's B operand
  if (activations == "f16") return true;
  return strategy != Strategy::small_m_v3 && strategy != Strategy::small_m_v4 && strategy != Strategy::dequant_cublas;
}

std::vector<Strategy> strategies_for(std::string_view activations) {
  QSPEC_CHECK(known_activations(activations), "GEMM policy: unknown activations '", activations,
              "' (f16, int8, int4, fp8, nvfp4, mxfp4)");
  std::vector<Strategy> out;
  for (int i = 0; i < kStrategies; ++i)
    if (strategy_supports(static_cast<Strategy>(i), activations)) out.push_back(static_cast<Strategy>(i));
  return out;
}

Strategy rule_based_strategy(std::string_view activations, int64_t m) {
  // f16: the preload kernel (the dispatcher runs variant 1 where it cannot: not sm_90a).
  if (m <= 8) return activations == "f16" ? Strategy::small_m_v5 : Strategy::small_m_v1;
  if (activations == "f16" && m > 128) return Strategy::dequant_cublas;
  // Measured on the H100 (docs/perf-journal/perf-notes-journal-2026.md, "W4A8 GEMM at large M on wgmma"): from 384-512
  // tokens on every Llama-3-8B / Qwen2.5-7B shape the wgmma kernel, unpack included, beats the
  // tiled one (1.1-1.8x); the dispatcher falls back to the tiled kernel where it cannot run (not
  // sm_90a, groups other than 128, no workspace room).
  // fp8 too, as e4m3 codes (the same kernel on e4m3 wgmma: 1.6-1.9x the f16-mma tiled kernel at
  // 512 tokens, perf-notes "W4A8-fp8 on e4m3").
  if ((activations == "int8" || activations == "fp8") && m >= 512) return Strategy::s8_wgmma_128x128;
  // f16 at 17-32 tokens: 128x32 tiles, two blocks a multiprocessor (perf-notes "A 128x32 tile").
  if (activations == "f16" && m <= 32) return Strategy::tiled_128x32;
  // Beyond 32 tokens 128x64 tiles: in every H100 tuning record (five activation kinds, 33-4096
  // tokens) 2-9 % faster than 256x64 on average (perf-notes "The 64-token tile").
  return m <= 32 ? Strategy::tiled_256x32 : Strategy::tiled_128x64;
}

Strategy paper_rule_strategy(std::string_view activations, int64_t m) {
  if (m <= 8) return activations == "int8" || activations == "int4" ? Strategy::bitwise_b1 : Strategy::small_m_v1;
  return m <= 32 ? Strategy::tiled_256x32 : Strategy::tiled_256x64;
}

PolicyMap PolicyMap::forced(Strategy strategy) {
  PolicyMap map;
  map.kind_ = Kind::forced;
  map.forced_ = strategy;
  return map;
}

PolicyMap PolicyMap::paper_rule() {
  PolicyMap map;
  map.kind_ = Kind::paper_rule;
  return map;
}

std::string PolicyMap::label() const {
  switch (kind_) {
    case Kind::forced: return "forced:" + std::string(strategy_name(forced_));
    case Kind::paper_rule: return "paper-rule";
    case Kind::measured: break;
  }
  return "";
}

Strategy fastest_strategy(const std::vector<std::pair<Strategy, double>>& us, std::string_view activations, int64_t m,
                          const std::vector<Strategy>& excluded, double min_gain) {
  const bool builtin_timed =
      std::any_of(us.begin(), us.end(), [](const auto& timing) { return timing.first == Strategy::builtin; }) &&
      std::find(excluded.begin(), excluded.end(), Strategy::builtin) == excluded.end();
  const Strategy rule = builtin_timed ? Strategy::builtin : rule_based_strategy(activations, m);
  double best_us = 0, rule_us = 0;
  Strategy best = rule;
  for (const auto& [strategy, time] : us) {
    if (strategy == rule) rule_us = time;
    if (std::find(excluded.begin(), excluded.end(), strategy) != excluded.end()) continue;
    if (best_us == 0 || time < best_us) {
      best_us = time;
      best = strategy;
    }
  }
  QSPEC_CHECK(best_us > 0, "no timing of an allowed strategy");
  // Inside a decode step a GEMM also overlaps its neighbours, so a few per cent alone is no win.
  if (best != rule && rule_us > 0 && rule_us <= best_us * (1.0 + min_gain)) best = rule;
  return best;
}

int64_t adaptive_tune_resolution(int64_t m) { return m < 64 ? 1 : m / 8; }

std::vector<int64_t> adaptive_tune_points(const std::vector<int64_t>& coarse,
                                          const std::function<Strategy(int64_t)>& winner_at) {
  std::map<int64_t, Strategy> winners;
  for (int64_t m : coarse) {
    QSPEC_CHECK(m >= 1, "tune: token counts start at 1 (", m, ")");
    if (!winners.count(m)) winners.emplace(m, winner_at(m));
  }
  for (;;) {
    std::vector<int64_t> midpoints;
    for (auto it = winners.begin(); it != winners.end() && std::next(it) != winners.end(); ++it) {
      const auto next = std::next(it);
      const int64_t a = it->first, b = next->first;
      if (it->second != next->second && b - a > adaptive_tune_resolution(a)) midpoints.push_back(a + (b - a) / 2);
    }
    if (midpoints.empty()) break;
    for (int64_t m : midpoints) winners.emplace(m, winner_at(m));
  }
  std::vector<int64_t> points;
  for (const auto& [m, strategy] : winners) points.push_back(m);
  return points;
}

PolicyMap PolicyMap::from_timings(const std::string& timings_json, const std::vector<Strategy>& excluded,
                                  double min_gain, const std::string& source) {
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(timings_json);
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": not JSON (", e.what(), ")");
  }
  QSPEC_CHECK(record.is_object() && record.contains("timings") && record["timings"].is_array(), source,
              ": no \"timings\" array (a qspec tune --record-dir file)");
  struct Shape {
    int64_t group;
    std::vector<PolicyRange> ranges;
  };
  std::map<std::tuple<std::string, int64_t, int64_t>, Shape> shapes;
  size_t index = 0;
  for (const auto& point : record["timings"]) {
    const std::string where = source + ": timings[" + std::to_string(index++) + "]";
    try {
      // Records before the refinement named its activations name only the mode.
      const std::string activations = point.contains("activations")
                                          ? point.at("activations").get<std::string>()
                                          : gemm_activations_name(parse_run_mode(point.at("mode").get<std::string>()));
      const int64_t n = point.at("n").get<int64_t>(), k = point.at("k").get<int64_t>(), m = point.at("m").get<int64_t>();
      const int64_t group = point.value("group", int64_t{128});
      std::vector<std::pair<Strategy, double>> us;
      for (const auto& [name, us_value] : point.at("us").items()) us.emplace_back(parse_strategy(name), us_value.get<double>());
      const Strategy best = fastest_strategy(us, activations, m, excluded, min_gain);
      Shape& shape = shapes[{activations, n, k}];
      shape.group = group;
      QSPEC_CHECK(shape.ranges.empty() || m > shape.ranges.back().max_m, "M values must increase per shape (", m, ")");
      if (!shape.ranges.empty() && shape.ranges.back().strategy == best) shape.ranges.back().max_m = m;
      else shape.ranges.push_back({m, best});
    } catch (const nlohmann::json::exception& e) {
      fail(where, ": ", e.what());
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  PolicyMap map;
  map.gpu = record.value("gpu", "");
  map.commit = record.value("commit", "");
  map.command = record.value("command", "");
  for (auto& [key_value, shape] : shapes)
    map.set(std::get<0>(key_value), std::get<1>(key_value), std::get<2>(key_value), shape.group, std::move(shape.ranges));
  return map;
}

int64_t PolicyMap::key(std::string_view activations, int64_t n, int64_t k) {
  const int index = activations_index(activations);
  if (index < 0 || n <= 0 || k <= 0 || n >= (int64_t{1} << 28) || k >= (int64_t{1} << 28)) return -1;
  return (static_cast<int64_t>(index) << 56) | (n << 28) | k;
}

void PolicyMap::set(std::string_view activations, int64_t n, int64_t k, int64_t group, std::vector<PolicyRange> ranges) {
  QSPEC_CHECK(known_activations(activations), "GEMM policy: unknown activations '", activations, "'");
  QSPEC_CHECK(n > 0 && k > 0 && group > 0 && key(activations, n, k) >= 0, "GEMM policy: bad shape n ", n, " k ", k,
              " group ", group);
  QSPEC_CHECK(!ranges.empty(), "GEMM policy: ", activations, " ", n, "x", k, ": no ranges");
  for (size_t i = 0; i < ranges.size(); ++i) {
    QSPEC_CHECK(ranges[i].max_m >= 1 && (i == 0 || ranges[i].max_m > ranges[i - 1].max_m), "GEMM policy: ",
                activations, " ", n, "x", k, ": range max_m values must increase from 1 (", ranges[i].max_m, ")");
    QSPEC_CHECK(strategy_supports(ranges[i].strategy, activations), "GEMM policy: ", activations, " ", n, "x", k,
                ": strategy ", strategy_name(ranges[i].strategy), " does not run ", activations, " activations");
    QSPEC_CHECK(ranges[i].strategy != Strategy::bitwise_b1 || (group == 128 && k % 128 == 0), "GEMM policy: ",
                activations, " ", n, "x", k, ": strategy bitwise_b1 needs weight groups of 128 (group ", group, ")");
    QSPEC_CHECK(ranges[i].strategy != Strategy::s8_wide_128x128 || k % 128 == 0, "GEMM policy: ", activations, " ", n,
                "x", k, ": strategy s8_wide_128x128 needs k % 128 == 0");
    QSPEC_CHECK(ranges[i].strategy != Strategy::s8_wgmma_128x128 || (group == 128 && k % 128 == 0), "GEMM policy: ",
                activations, " ", n, "x", k, ": strategy s8_wgmma_128x128 needs weight groups of 128 (group ", group,
                ") and k % 128 == 0");
  }
  Entry entry{std::string(activations), n, k, group, std::move(ranges), {}};
  entry.by_m.resize(static_cast<size_t>(kDenseM + 1));
  size_t r = 0;
  for (int64_t m = 1; m <= kDenseM; ++m) {
    while (r + 1 < entry.ranges.size() && m > entry.ranges[r].max_m) ++r;
    entry.by_m[static_cast<size_t>(m)] = entry.ranges[r].strategy;
  }
  entry.by_m[0] = entry.by_m[1];
  entries_[key(activations, n, k)] = std::move(entry);
}

Strategy PolicyMap::lookup(std::string_view activations, int64_t n, int64_t k, int64_t m) const {
  if (kind_ == Kind::forced)
    return strategy_supports(forced_, activations) ? forced_ : rule_based_strategy(activations, m);
  if (kind_ == Kind::paper_rule) return paper_rule_strategy(activations, m);
  const auto it = entries_.find(key(activations, n, k));
  if (it == entries_.end()) return rule_based_strategy(activations, m);
  const Entry& e = it->second;
  return m <= kDenseM ? e.by_m[static_cast<size_t>(std::max<int64_t>(m, 0))] : e.ranges.back().strategy;
}

void PolicyMap::override_at(std::string_view activations, int64_t m, Strategy strategy) {
  override_range(activations, m, m, strategy);
}

void PolicyMap::override_range(std::string_view activations, int64_t first, int64_t last, Strategy strategy) {
  first = std::max<int64_t>(first, 1);
  last = std::min(last, kDenseM);
  if (kind_ != Kind::measured || first > last || !strategy_supports(strategy, activations)) return;
  for (auto& [key_value, entry] : entries_) {
    if (entry.activations != activations) continue;
    if (strategy == Strategy::bitwise_b1 && (entry.group != 128 || entry.k % 128 != 0)) continue;
    if (strategy == Strategy::s8_wide_128x128 && entry.k % 128 != 0) continue;
    if (strategy == Strategy::s8_wgmma_128x128 && (entry.group != 128 || entry.k % 128 != 0)) continue;
    for (int64_t m = first; m <= last; ++m) entry.by_m[static_cast<size_t>(m)] = strategy;
    entry.by_m[0] = entry.by_m[1];
    // The ranges again from the dense table (the last one keeps covering every M beyond it).
    std::vector<PolicyRange> ranges;
    for (int64_t i = 1; i <= kDenseM; ++i) {
      const Strategy s = entry.by_m[static_cast<size_t>(i)];
      if (!ranges.empty() && ranges.back().strategy == s) ranges.back().max_m = i;
      else ranges.push_back({i, s});
    }
    entry.ranges = std::move(ranges);
  }
}

bool PolicyMap::departs_at(std::string_view activations, int64_t m) const {
  if (kind_ != Kind::measured) return true;
  for (const auto& [key_value, entry] : entries_)
    if (entry.activations == activations && lookup(activations, entry.n, entry.k, m) != Strategy::builtin) return true;
  return false;
}

bool PolicyMap::uses(Strategy strategy, int64_t n, int64_t k) const {
  if (kind_ == Kind::forced) return forced_ == strategy;
  if (kind_ == Kind::paper_rule) return strategy == Strategy::bitwise_b1;
  for (const auto& [key_value, entry] : entries_)
    if (entry.n == n && entry.k == k)
      for (const PolicyRange& range : entry.ranges)
        if (range.strategy == strategy) return true;
  return false;
}

bool PolicyMap::contains(std::string_view activations, int64_t n, int64_t k) const {
  return entries_.count(key(activations, n, k)) > 0;
}

std::string PolicyMap::to_json() const {
  nlohmann::json out = {{"format", "qspec-gemm-policy"}, {"version", 1}, {"gpu", gpu}, {"commit", commit},
                        {"command", command}, {"entries", nlohmann::json::array()}};
  // In a stable order (the hash map's is not): activations, n, k.
  std::vector<const Entry*> sorted;
  for (const auto& item : entries_) sorted.push_back(&item.second);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->activations, a->n, a->k) < std::tie(b->activations, b->n, b->k);
  });
  for (const Entry* entry : sorted) {
    const Entry& e = *entry;
    nlohmann::json ranges = nlohmann::json::array();
    for (const PolicyRange& r : e.ranges) ranges.push_back({{"max_m", r.max_m}, {"strategy", strategy_name(r.strategy)}});
    out["entries"].push_back({{"activations", e.activations}, {"n", e.n}, {"k", e.k}, {"group", e.group}, {"ranges", ranges}});
  }
  return out.dump(1);
}

PolicyMap PolicyMap::from_json(std::string_view text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": not JSON (", e.what(), ")");
  }
  QSPEC_CHECK(j.is_object() && j.value("format", "") == "qspec-gemm-policy", source,
              ": not a qspec GEMM policy map (\"format\": \"qspec-gemm-policy\")");
  QSPEC_CHECK(j.value("version", 0) == 1, source, ": policy map version ", j.value("version", 0), " (this qspec reads 1)");
  PolicyMap map;
  map.gpu = j.value("gpu", "");
  map.commit = j.value("commit", "");
  map.command = j.value("command", "");
  QSPEC_CHECK(j.contains("entries") && j["entries"].is_array(), source, ": no entries array");
  size_t index = 0;
  for (const auto& e : j["entries"]) {
    const std::string where = source + ": entries[" + std::to_string(index++) + "]";
    try {
      std::vector<PolicyRange> ranges;
      for (const auto& r : e.at("ranges"))
        ranges.push_back({r.at("max_m").get<int64_t>(), parse_strategy(r.at("strategy").get<std::string>())});
      map.set(e.at("activations").get<std::string>(), e.at("n").get<int64_t>(), e.at("k").get<int64_t>(),
              e.at("group").get<int64_t>(), std::move(ranges));
    } catch (const nlohmann::json::exception& ex) {
      fail(where, ": ", ex.what());
    } catch (const Error& ex) {
      fail(where, ": ", ex.what());
    }
  }
  return map;
}

PolicyMap PolicyMap::load(const std::string& path) {
  std::ifstream file(path);
  QSPEC_CHECK(file.good(), "cannot read GEMM policy map ", path);
  std::stringstream text;
  text << file.rdbuf();
  return from_json(text.str(), path);
}

void PolicyMap::save(const std::string& path) const {
  std::ofstream file(path);
  QSPEC_CHECK(file.good(), "cannot write GEMM policy map ", path);
  file << to_json() << "\n";
  QSPEC_CHECK(file.good(), "writing GEMM policy map ", path, " failed");
}

std::vector<std::string> default_policy_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("QSPEC_GEMM_POLICY_DIR"); env != nullptr && *env != '\0') dirs.emplace_back(env);
  dirs.emplace_back("bench/policies");
#ifdef QSPEC_POLICY_DIR
  dirs.emplace_back(QSPEC_POLICY_DIR);
#endif
  return dirs;
}

std::string find_policy_map(const std::vector<std::string>& dirs, const std::string& gpu,
                            const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  for (const std::string& dir : dirs) {
    for (const std::string& file : sorted_json_files(dir)) {
      try {
        const PolicyMap map = PolicyMap::load(file);
        if (map.gpu != gpu) continue;
        bool covers = true;
        for (const auto& [n, k] : shapes) covers = covers && map.contains("f16", n, k);
        if (covers) return file;
      } catch (const Error&) {
        continue;  // not a policy map
      }
    }
  }
  return "";
}

std::vector<Strategy> step_contenders(const std::string& record_json, std::string_view activations, int64_t m,
                                      double slack) {
  std::vector<Strategy> all = {Strategy::builtin};
  for (Strategy strategy : strategies_for(activations))
    if (strategy != Strategy::builtin) all.push_back(strategy);
  if (record_json.empty()) return all;
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(record_json);
  } catch (const nlohmann::json::exception& e) {
    fail("step_contenders: the tuning record is not JSON: ", e.what());
  }
  if (!record.contains("timings")) return all;
  // Per shape (n, k): the tuned M nearest to m.
  std::map<std::pair<int64_t, int64_t>, int64_t> nearest;
  for (const auto& t : record["timings"]) {
    if (t.at("activations").get<std::string>() != activations) continue;
    const std::pair<int64_t, int64_t> shape{t.at("n").get<int64_t>(), t.at("k").get<int64_t>()};
    const int64_t tm = t.at("m").get<int64_t>();
    const auto it = nearest.find(shape);
    if (it == nearest.end() || std::llabs(tm - m) < std::llabs(it->second - m)) nearest[shape] = tm;
  }
  if (nearest.empty()) return all;
  std::vector<Strategy> picked = {Strategy::builtin};
  for (const auto& t : record["timings"]) {
    if (t.at("activations").get<std::string>() != activations) continue;
    if (nearest[{t.at("n").get<int64_t>(), t.at("k").get<int64_t>()}] != t.at("m").get<int64_t>()) continue;
    double best = 0;
    for (const auto& [name, us] : t.at("us").items())
      if (best == 0 || us.get<double>() < best) best = us.get<double>();
    for (const auto& [name, us] : t.at("us").items()) {
      if (us.get<double>() > best * (1.0 + slack)) continue;
      const Strategy strategy = parse_strategy(name);
      if (strategy_supports(strategy, activations) && std::find(picked.begin(), picked.end(), strategy) == picked.end())
        picked.push_back(strategy);
    }
  }
  return picked;
}

std::vector<double> step_refine_means(const std::vector<std::vector<double>>& rounds_ms) {
  QSPEC_CHECK(!rounds_ms.empty(), "step refinement: no rounds");
  const size_t candidates = rounds_ms.front().size();
  std::vector<double> ms(candidates, 0.0);
  for (const std::vector<double>& round : rounds_ms) {
    QSPEC_CHECK(round.size() == candidates, "step refinement: a round of ", round.size(), " times, not ", candidates);
    for (size_t c = 0; c < candidates; ++c) ms[c] += round[c] / static_cast<double>(rounds_ms.size());
  }
  return ms;
}

size_t step_refine_choice(const std::vector<std::vector<double>>& rounds_ms, size_t builtin, double min_gain,
                          double builtin_margin) {
  QSPEC_CHECK(!rounds_ms.empty(), "step_refine_choice: no rounds");
  const size_t candidates = rounds_ms.front().size();
  QSPEC_CHECK(builtin < candidates && builtin > 0, "step_refine_choice: builtin at ", builtin, " of ", candidates);
  const std::vector<double> ms = step_refine_means(rounds_ms);
  size_t best = 0;
  for (size_t c = 1; c < candidates; ++c)
    if (ms[c] < ms[best]) best = c;
  if (ms[best] * (1.0 + builtin_margin) >= ms[builtin]) return builtin;
  for (const std::vector<double>& round : rounds_ms)
    if (round[best] >= round[builtin]) return builtin;  // lost a round: within the noise
  if (best != 0 && ms[best] * (1.0 + min_gain) < ms[0]) return best;
  return 0;
}

size_t PolicyMap::replay_step_refinement(const std::string& record_json) {
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(record_json);
  } catch (const nlohmann::json::exception& e) {
    fail("step refinement record: not JSON: ", e.what());
  }
  if (!record.contains("step_refinement")) return 0;
  try {
    for (const nlohmann::json& point : record.at("step_refinement")) {
      // Records before the refinement named its activations name only the mode.
      const std::string activations = point.contains("activations")
                                          ? point.at("activations").get<std::string>()
                                          : gemm_activations_name(parse_run_mode(point.at("mode").get<std::string>()));
      const std::string taken = point.at("taken").get<std::string>();
      if (point.contains("band") && point.at("band").is_array()) {
        override_range(activations, point.at("band").at(0).get<int64_t>(), point.at("band").at(1).get<int64_t>(),
                       Strategy::builtin);
      } else if (taken != "map") {
        override_at(activations, point.at("m").get<int64_t>(), parse_strategy(taken));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("step refinement record: ", e.what());
  }
  return record.at("step_refinement").size();
}

std::vector<std::pair<int64_t, int64_t>> step_refine_bands(const std::vector<int64_t>& sorted_m) {
  std::vector<std::pair<int64_t, int64_t>> bands;
  for (size_t i = 0; i < sorted_m.size(); ++i) {
    QSPEC_CHECK(sorted_m[i] >= 1 && (i == 0 || sorted_m[i] > sorted_m[i - 1]),
                "step_refine_bands: the points' M must be positive, increasing and distinct");
    bands.emplace_back(i == 0 ? 1 : sorted_m[i - 1] + 1, i + 1 == sorted_m.size() ? PolicyMap::kDenseM : sorted_m[i]);
  }
  if (!bands.empty()) bands.back().second = std::max(bands.back().second, sorted_m.back());
  return bands;
}

}  // namespace qspec::gemm
