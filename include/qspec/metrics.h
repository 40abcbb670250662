// Counters the engine reports: QSpec's acceptance statistics and draft/verify time split,
// kept per request and summed over all requests; with draft auto, which plans ran and why.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qspec {

struct QSpecMetrics {
  int64_t gamma = 0;
  int64_t cycles = 0;         // verify passes (one per cycle; a cycle near the end may draft nothing)
  int64_t draft_steps = 0;    // single-token draft forwards
  int64_t drafted = 0;        // draft tokens offered to the verify pass
  int64_t accepted = 0;       // draft tokens equal to (greedy) / accepted by (sampling) the verify
  int64_t rejected = 0;       // drafted - accepted
  std::vector<int64_t> accepted_histogram;  // [gamma + 1]: cycles by accepted draft tokens; sums to cycles
  double draft_seconds = 0;
  double verify_seconds = 0;
  // Draft auto (the planner, runtime/qspec_planner.h): decode steps by the plan they ran
  // ("w4a16": plain, or "DRAFT gGAMMA": a cycle), the gains the planner predicted for the
  // speculating ones (summed; mean_predicted_gain()), and the reason it gave for the last plan.
  std::map<std::string, int64_t> plan_steps;
  double predicted_gain_sum = 0;
  int64_t predicted_steps = 0;
  std::string plan_reason;

  double acceptance_rate() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0; }
  double mean_accepted_length() const { return cycles > 0 ? static_cast<double>(accepted) / cycles : 0.0; }
  double mean_predicted_gain() const {
    return predicted_steps > 0 ? predicted_gain_sum / static_cast<double>(predicted_steps) : 0.0;
  }

  // Sums another sequence's counters into these (the histogram grows to the longer one).
  void add(const QSpecMetrics& other) {
    gamma = gamma > other.gamma ? gamma : other.gamma;
    cycles += other.cycles, draft_steps += other.draft_steps, drafted += other.drafted;
    accepted += other.accepted, rejected += other.rejected;
    if (accepted_histogram.size() < other.accepted_histogram.size())
      accepted_histogram.resize(other.accepted_histogram.size(), 0);
    for (size_t i = 0; i < other.accepted_histogram.size(); ++i) accepted_histogram[i] += other.accepted_histogram[i];
    draft_seconds += other.draft_seconds, verify_seconds += other.verify_seconds;
    for (const auto& [plan, steps] : other.plan_steps) plan_steps[plan] += steps;
    predicted_gain_sum += other.predicted_gain_sum, predicted_steps += other.predicted_steps;
    if (!other.plan_reason.empty()) plan_reason = other.plan_reason;
  }
};

}  // namespace qspec
