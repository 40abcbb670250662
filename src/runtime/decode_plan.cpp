// The decode plan's rules (include/qspec/decode_plan.h): the one validate every caller uses.
#include "qspec/decode_plan.h"

#include <sstream>

#include "qspec/error.h"
#include "quant/quantized_linear.h"
#include "runtime/draft_mode.h"
#include "runtime/qspec_planner.h"

namespace qspec {

std::vector<std::string> DecodePlan::modes() const {
  if (ngram_draft() || auto_draft()) return {verify};
  if (qspec()) return {verify, draft};
  return {mode};
}

void set_draft_spec(DecodePlan& plan, std::string_view spec) {
  using decode_rules::kDraftKv4Tag;
  using decode_rules::kDraftSkipTag;
  using decode_rules::kDraftVocabTag;
  auto bad = [&]() {
    return DecodePlanError("draft", "draft '" + std::string(spec) +
                                        "': expected MODE, MODE@WINDOW or MODE@WINDOW+SINKS, optionally followed by "
                                        "/vN (a vocabulary subset of N rows), then /sN (N skipped layers), then /k4 "
                                        "(the 4-bit view of an 8-bit KV cache), with whole numbers");
  };
  auto number = [&](const std::string& text) {
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || value < 0) throw bad();
    return static_cast<int64_t>(value);
  };
  // The suffixes, each at most once and in draft_spec's order: "/vN", then "/sN", then "/k4".
  plan.draft_vocab = 0;
  plan.draft_skip = 0;
  plan.draft_kv4 = false;
  std::string_view head = spec;
  if (head.ends_with(kDraftKv4Tag)) {
    plan.draft_kv4 = true;
    head.remove_suffix(kDraftKv4Tag.size());
  }
  if (const size_t tag = head.find(kDraftSkipTag); tag != std::string_view::npos) {
    plan.draft_skip = number(std::string(head.substr(tag + kDraftSkipTag.size())));
    head = head.substr(0, tag);
  }
  if (const size_t tag = head.find(kDraftVocabTag); tag != std::string_view::npos) {
    plan.draft_vocab = number(std::string(head.substr(tag + kDraftVocabTag.size())));
    head = head.substr(0, tag);
  }
  if (head.find('/') != std::string_view::npos) throw bad();
  const size_t at = head.find('@');
  plan.draft = std::string(head.substr(0, at));
  plan.draft_window = 0;
  plan.draft_sinks = decode_rules::kDefaultDraftSinks;
  if (at == std::string_view::npos) return;
  const std::string view(head.substr(at + 1));
  const size_t plus = view.find('+');
  plan.draft_window = number(view.substr(0, plus));
  if (plus != std::string::npos) plan.draft_sinks = number(view.substr(plus + 1));
}

std::string draft_spec(const DecodePlan& plan) {
  std::string spec = plan.draft;
  if (plan.draft_window > 0) spec += "@" + std::to_string(plan.draft_window) + "+" + std::to_string(plan.draft_sinks);
  if (plan.draft_vocab > 0) spec += std::string(decode_rules::kDraftVocabTag) + std::to_string(plan.draft_vocab);
  if (plan.draft_skip > 0) spec += std::string(decode_rules::kDraftSkipTag) + std::to_string(plan.draft_skip);
  if (plan.draft_kv4) spec += decode_rules::kDraftKv4Tag;
  return spec;
}

void validate(const DecodePlan& plan, std::string_view field_prefix) {
  using namespace decode_rules;
  const std::string p(field_prefix);
  auto check = [&](bool ok, const char* field, auto&&... message) {
    if (ok) return;
    std::ostringstream text;
    text << p << field << ": ";
    (text << ... << message);
    throw DecodePlanError(field, text.str());
  };
  auto known = [&](const std::string& name, const char* field) {
    try {
      return parse_run_mode(name);
    } catch (const Error& e) {
      check(false, field, e.what());
      throw;
    }
  };
  if (!plan.qspec()) {
    known(plan.mode, "mode");
    return;
  }
  const RunMode verify = known(plan.verify, "verify");
  check(verify.quantized_weights, "verify", "the target mode ", plan.verify,
        " must run the 4-bit weights (QSpec keeps one weight set)");
  if (plan.auto_draft()) {
    check(plan.kv_overwrite, "kv_overwrite", "draft auto plans for outputs equal to the verify's (the no-overwrite "
          "ablation needs a named drafting mode)");
    check(plan.draft_window == 0, "draft_window", "draft auto picks its drafts' views from the cost table (a window "
          "needs a named drafting mode)");
    check(plan.draft_vocab == 0, "draft_vocab", "draft auto picks its drafts' vocabulary subsets from the cost table "
          "(a subset needs a named drafting mode)");
    check(plan.draft_skip == 0, "draft_skip", "draft auto picks its drafts' skipped layers from the cost table "
          "(skipping needs a named drafting mode)");
    check(!plan.draft_kv4, "draft_kv4", "draft auto picks its drafts' KV view from the cost table (the 4-bit view "
          "needs a named drafting mode)");
    check(plan.max_gamma >= 1 && plan.max_gamma <= kMaxGamma, "max_gamma", "must be in 1..", kMaxGamma,
          " (draft auto: the largest gamma the planner may pick), got ", plan.max_gamma);
  } else if (plan.ngram_draft()) {
    check(plan.ngram_max >= 1 && plan.ngram_max <= kMaxNgram, "ngram_max", "must be in 1..", kMaxNgram, ", got ",
          plan.ngram_max);
    check(plan.ngram_min >= 1 && plan.ngram_min <= plan.ngram_max, "ngram_min", "must be in 1..ngram_max (",
          plan.ngram_max, "), got ", plan.ngram_min);
    check(plan.kv_overwrite, "kv_overwrite", "the n-gram draft writes no K/V rows, so there are none to keep "
          "(the no-overwrite ablation needs a drafting mode)");
    check(plan.draft_window == 0, "draft_window", "the n-gram draft reads no K/V (a window needs a drafting mode)");
    check(plan.draft_vocab == 0, "draft_vocab", "the n-gram draft scores no vocabulary (a subset needs a drafting "
          "mode)");
    check(plan.draft_skip == 0, "draft_skip", "the n-gram draft runs no layers (skipping needs a drafting mode)");
    check(!plan.draft_kv4, "draft_kv4", "the n-gram draft reads no K/V (the 4-bit view needs a drafting mode)");
  } else {
    const RunMode draft = known(plan.draft, "draft");
    const bool low_precision = draft.quantized_weights && draft.activations.kind == ActivationMode::Kind::quantized;
    const bool diet_verify_mode = plan.draft_has_diet() && plan.draft == plan.verify;
    check(low_precision || diet_verify_mode, "draft", plan.draft,
          " is not a low-precision activation mode on the 4-bit weights (w4a8, w4a8-fp8, w4a4-*), auto (the "
          "planner), ngram, or (with a draft_window, draft_vocab, draft_skip or draft_kv4) the verify's mode ",
          plan.verify);
  }
  check(plan.draft_window >= 0, "draft_window", "must be >= 0 (0: the whole cache), got ", plan.draft_window);
  check(plan.draft_sinks >= 0 && plan.draft_sinks <= kMaxDraftSinks, "draft_sinks", "must be in 0..", kMaxDraftSinks,
        ", got ", plan.draft_sinks);
  check(plan.draft_vocab == 0 || plan.draft_vocab >= kMinDraftVocab, "draft_vocab", "must be 0 (the whole "
        "vocabulary) or >= ", kMinDraftVocab, " (the most frequent ids of the model's draft vocabulary table), got ",
        plan.draft_vocab);
  check(plan.draft_skip >= 0, "draft_skip", "must be >= 0 (0: every layer; N: the first N layers of the model's "
        "draft skip table), got ", plan.draft_skip);
  // The no-overwrite ablation keeps the draft's K/V rows; a skipping draft has none in the
  // layers it skips, so the verify's rows would have to stand in: not the ablation any more.
  check(plan.draft_skip == 0 || plan.kv_overwrite, "kv_overwrite", "a draft that skips layers writes no K/V rows "
        "in them, so the no-overwrite ablation has none to keep (draft_skip needs kv_overwrite on)");
  check(plan.gamma >= 1 && plan.gamma <= kMaxGamma, "gamma", "must be in 1..", kMaxGamma, ", got ", plan.gamma);
  check(!plan.adaptive_gamma || plan.auto_draft() || (plan.max_gamma >= plan.gamma && plan.max_gamma <= kMaxGamma), "max_gamma",
        "must be in gamma..", kMaxGamma, " (gamma ", plan.gamma, "), got ", plan.max_gamma);
}

std::string resolve_auto_mode(DecodePlan& plan, bool checkpoint_has_4bit_weights) {
  using namespace decode_rules;
  if (plan.mode != kAutoMode) return "";
  std::ostringstream why;
  if (!checkpoint_has_4bit_weights) {
    plan.mode = std::string(checkpoint_mode(false));
    why << "mode auto: " << plan.mode << ", the 16-bit checkpoint's own (QSpec needs 4-bit weights: `qspec "
        << "quantize`, or --mode w4a16 / qspec to quantize at load)";
    return why.str();
  }
  plan.mode = std::string(kQSpecMode);
  plan.verify = std::string(kVerifyMode);
  why << "mode auto: qspec, the fastest mode that keeps the 4-bit checkpoint's " << plan.verify << " output, ";
  if (plan.auto_draft())
    why << "with the planner: each step plain " << plan.verify << " unless a draft and gamma are predicted >= "
        << planner_rules::kMinGain << "x faster";
  else
    why << "with draft " << draft_spec(plan) << " as named";
  return why.str();
}

RunMode with_draft_diets(RunMode mode, const DecodePlan& plan) {
  mode.kv_window = plan.draft_window;
  mode.kv_sinks = plan.draft_view_sinks();
  mode.vocab_subset = plan.draft_vocab;
  mode.skip_layers = plan.draft_skip;
  mode.kv_high_nibble = plan.draft_kv4;
  return mode;
}

void check_draft_kv_cache(const RunMode& draft, KvCacheFormat format) {
  QSPEC_CHECK(!draft.kv_high_nibble || format == KvCacheFormat::int8, "draft_kv4 (",
              decode_rules::kDraftKv4Tag, ", --draft-kv4): the draft reads the high 4 bits of each code of an 8-bit "
              "KV cache; this cache is ", kv_cache_format_name(format), " (use --kv-cache int8)");
}

}  // namespace qspec
