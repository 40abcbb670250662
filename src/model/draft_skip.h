// The layer skip table of a checkpoint (issue 50, diet 3; Draft & Verify, SWIFT): the order in
// which a QSpec draft skips layers, from a greedy search on calibration text, and the draft's
// teacher-forced top-1 agreement with W4A16 at each size. A draft with DecodePlan::draft_skip = N
// skips the first N layers of `order`; the verify runs all of them. Made by `qspec tune-draft`
// and stored beside the checkpoint (kDraftSkipFile), where LlamaModel::load finds it and checks
// that it was made for this model.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/draft_vocab.h"
#include "quant/quantized_linear.h"

namespace qspec {

inline constexpr std::string_view kDraftSkipFile = "qspec_draft_skip.json";
inline constexpr std::string_view kDraftSkipFormat = "qspec-draft-skip-1";

struct DraftSkipTable : DraftTableIdentity {
  std::string draft_mode;  // the draft's activation mode the search ran in (w4a16, w4a8, ...)
  std::string target_mode;  // what it agreed with (w4a16)
  // agreement[0]: the draft with no layer skipped; agreement[k]: with order[0..k) skipped
  // (order.size() + 1 entries, each in [0, 1]).
  std::vector<double> agreement;
  std::vector<int32_t> order;  // layer ids, distinct, in [0, num_layers); fewer than num_layers
  int64_t max_skip() const { return static_cast<int64_t>(order.size()); }
};

// Writes / reads kDraftSkipFile in `dir`. read_draft_skip_table throws naming the file and field
// for a malformed table; check_draft_skip_table throws naming the file and field when it was
// made for another model (draft_table_identity's fields).
void write_draft_skip_table(const DraftSkipTable& table, const std::string& dir);
DraftSkipTable read_draft_skip_table(const std::string& path);
void check_draft_skip_table(const DraftSkipTable& table, const LlamaModel& model, const std::string& source);

// The greedy search that makes a table: from no layer skipped, it skips one more layer at a time,
// the one whose skipping keeps the most teacher-forced top-1 agreement between `draft` (with the
// layers skipped) and `target` (every layer) over every position of `sequences`, up to max_skip
// layers (< num_layers). One batched pass over all sequences per candidate, from the residual
// stream cached at the candidate layer's input (the layers before it run as they did without
// it). `progress` (optional) hears each layer chosen. The identity's calibration fields are the
// caller's to fill.
using DraftSkipProgress = std::function<void(int64_t skipped, int32_t layer, double agreement, double seconds)>;
DraftSkipTable search_draft_skip(const LlamaModel& model, std::span<const std::vector<int32_t>> sequences,
                                 const RunMode& draft, const RunMode& target, int64_t max_skip,
                                 const DraftSkipProgress& progress = {});

// The message that says how to make a missing table.
std::string missing_draft_skip_message(const std::string& model_dir);

}  // namespace qspec
