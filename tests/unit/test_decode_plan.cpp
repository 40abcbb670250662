// The decode plan's rules (include/qspec/decode_plan.h): one validate, each broken rule an
// error naming its field; the constants every caller uses.
#include <gtest/gtest.h>

#include <string>

#include "qspec/decode_plan.h"

namespace {

using qspec::DecodePlan;
namespace rules = qspec::decode_rules;

std::string broken_field(const DecodePlan& plan) {
  try {
    qspec::validate(plan, "x.");
  } catch (const qspec::DecodePlanError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("x." + e.field + ": ", 0), 0u) << e.what();
    return e.field;
  }
  return "";
}

DecodePlan qspec_plan() {
  DecodePlan p;
  p.mode = rules::kQSpecMode;
  return p;
}

TEST(DecodePlan, DefaultsAreTheRulebooksConstantsAndValid) {
  const DecodePlan p;
  EXPECT_EQ(p.mode, rules::kDefaultMode);
  EXPECT_EQ(p.draft, rules::kDefaultDraft);
  EXPECT_EQ(p.verify, rules::kVerifyMode);
  EXPECT_EQ(p.gamma, rules::kDefaultGamma);
  EXPECT_EQ(p.max_gamma, rules::kDefaultMaxGamma);
  EXPECT_FALSE(p.qspec());
  EXPECT_EQ(p.gamma_bound(), 0);
  EXPECT_EQ(broken_field(p), "");
  EXPECT_EQ(broken_field(qspec_plan()), "");
  EXPECT_EQ(p.modes(), std::vector<std::string>{std::string(rules::kDefaultMode)});
  // The default draft is the planner: only the verify's mode to prepare (its drafts run on the
  // same 4-bit weights, checked by the engine against its cost table).
  EXPECT_EQ(rules::kDefaultDraft, rules::kAutoDraft);
  EXPECT_TRUE(qspec_plan().auto_draft());
  EXPECT_EQ(qspec_plan().modes(), std::vector<std::string>{std::string(rules::kVerifyMode)});
  DecodePlan named = qspec_plan();
  named.draft = std::string(rules::kCheapestDraft);
  EXPECT_EQ(named.modes(),
            (std::vector<std::string>{std::string(rules::kVerifyMode), std::string(rules::kCheapestDraft)}));
}

TEST(DecodePlan, EachBrokenRuleNamesItsField) {
  DecodePlan p;
  p.mode = "w5a5";
  EXPECT_EQ(broken_field(p), "mode");

  p = qspec_plan();
  p.draft = "w4a16";  // 16-bit activations: no cheaper than the verify
  EXPECT_EQ(broken_field(p), "draft");
  p.draft = "w16a16";
  EXPECT_EQ(broken_field(p), "draft");
  p.draft = "nope";
  EXPECT_EQ(broken_field(p), "draft");

  p = qspec_plan();
  p.verify = "w16a16";  // QSpec keeps one (4-bit) weight set
  EXPECT_EQ(broken_field(p), "verify");

  p = qspec_plan();
  p.gamma = 0;
  EXPECT_EQ(broken_field(p), "gamma");
  p.gamma = rules::kMaxGamma + 1;
  EXPECT_EQ(broken_field(p), "gamma");
  p.gamma = rules::kMaxGamma;
  EXPECT_EQ(broken_field(p), "");

  p = qspec_plan();
  p.draft = "w4a8";
  p.adaptive_gamma = true;
  p.gamma = 6;
  p.max_gamma = 5;
  EXPECT_EQ(broken_field(p), "max_gamma");
  p.max_gamma = rules::kMaxGamma + 1;
  EXPECT_EQ(broken_field(p), "max_gamma");
  p.max_gamma = rules::kMaxGamma;
  EXPECT_EQ(broken_field(p), "");
  EXPECT_EQ(p.gamma_bound(), rules::kMaxGamma);
  p.adaptive_gamma = false;
  EXPECT_EQ(p.gamma_bound(), 6);
}

TEST(DecodePlan, NgramDraftsNeedNoModeAndCheckTheirLengths) {
  DecodePlan p = qspec_plan();
  p.draft = std::string(rules::kNgramDraft);
  EXPECT_TRUE(p.ngram_draft());
  EXPECT_EQ(broken_field(p), "");
  EXPECT_EQ(p.modes(), std::vector<std::string>{std::string(rules::kVerifyMode)});  // nothing to prepare for it
  p.ngram_min = 0;
  EXPECT_EQ(broken_field(p), "ngram_min");
  p.ngram_min = p.ngram_max + 1;
  EXPECT_EQ(broken_field(p), "ngram_min");
  p.ngram_min = 1;
  p.ngram_max = rules::kMaxNgram + 1;
  EXPECT_EQ(broken_field(p), "ngram_max");
  p.ngram_max = rules::kMaxNgram;
  EXPECT_EQ(broken_field(p), "");
  p.kv_overwrite = false;  // no draft rows to keep
  EXPECT_EQ(broken_field(p), "kv_overwrite");
  DecodePlan plain;  // plain decoding ignores the draft's fields
  plain.ngram_min = 0;
  EXPECT_EQ(broken_field(plain), "");
  EXPECT_FALSE(plain.ngram_draft());
}

// Draft auto: the planner picks the draft and gamma (up to max_gamma) each step, so a window or
// the no-overwrite ablation (which need a named drafting mode) are refused, and max_gamma alone
// bounds gamma (whatever gamma says).
TEST(DecodePlan, AutoDraftIsThePlannerWithItsOwnRules) {
  DecodePlan p = qspec_plan();
  qspec::set_draft_spec(p, "auto");
  EXPECT_TRUE(p.auto_draft());
  EXPECT_FALSE(p.ngram_draft());
  EXPECT_EQ(qspec::draft_spec(p), "auto");
  EXPECT_EQ(broken_field(p), "");
  EXPECT_EQ(p.gamma_bound(), rules::kDefaultMaxGamma);
  p.gamma = 6;
  p.max_gamma = 2;  // below gamma: fine for the planner (gamma is a named draft's)
  EXPECT_EQ(broken_field(p), "");
  EXPECT_EQ(p.gamma_bound(), 2);
  p.max_gamma = 0;
  EXPECT_EQ(broken_field(p), "max_gamma");
  p.max_gamma = rules::kMaxGamma + 1;
  EXPECT_EQ(broken_field(p), "max_gamma");
  p.max_gamma = rules::kMaxGamma;
  EXPECT_EQ(broken_field(p), "");
  p.kv_overwrite = false;
  EXPECT_EQ(broken_field(p), "kv_overwrite");
  p.kv_overwrite = true;
  p.draft_window = 256;
  EXPECT_EQ(broken_field(p), "draft_window");
  EXPECT_THROW(qspec::set_draft_spec(p, "auto@x"), qspec::DecodePlanError);
  qspec::set_draft_spec(p, "auto@256");  // good syntax, broken rule
  EXPECT_EQ(broken_field(p), "draft_window");
  DecodePlan plain;  // not QSpec: the draft field is not read
  plain.draft = std::string(rules::kAutoDraft);
  EXPECT_FALSE(plain.auto_draft());
  EXPECT_EQ(plain.gamma_bound(), 0);
}

// A draft's sparse view of the cache: a window (with sinks) on a drafting mode, which may then be
// the verify's own; never on n-gram drafts; window and sinks in range.
TEST(DecodePlan, SparseKvDraftsCheckTheirWindowAndSinks) {
  DecodePlan p = qspec_plan();
  EXPECT_EQ(p.draft_window, 0);
  EXPECT_EQ(p.draft_sinks, rules::kDefaultDraftSinks);
  p.draft = "w4a16";  // the verify's mode drafts only with a window (else it is the verify again)
  EXPECT_EQ(broken_field(p), "draft");
  p.draft_window = 512;
  EXPECT_EQ(broken_field(p), "");
  p.draft = "w4a8";
  EXPECT_EQ(broken_field(p), "");
  p.draft_window = -1;
  EXPECT_EQ(broken_field(p), "draft_window");
  p.draft_window = 256;
  p.draft_sinks = rules::kMaxDraftSinks + 1;
  EXPECT_EQ(broken_field(p), "draft_sinks");
  p.draft_sinks = -1;
  EXPECT_EQ(broken_field(p), "draft_sinks");
  p.draft_sinks = 0;
  EXPECT_EQ(broken_field(p), "");
  p.draft = std::string(rules::kNgramDraft);  // reads no K/V
  EXPECT_EQ(broken_field(p), "draft_window");
}

// The one-word draft of eval / bench lists: MODE, ngram, MODE@WINDOW[+SINKS]; and back.
TEST(DecodePlan, DraftSpecsRoundTripAndRefuseBadSyntax) {
  DecodePlan p = qspec_plan();
  qspec::set_draft_spec(p, "w4a16@512");
  EXPECT_EQ(p.draft, "w4a16");
  EXPECT_EQ(p.draft_window, 512);
  EXPECT_EQ(p.draft_sinks, rules::kDefaultDraftSinks);
  EXPECT_EQ(qspec::draft_spec(p), "w4a16@512+16");
  qspec::set_draft_spec(p, "w4a8@64+0");
  EXPECT_EQ(p.draft, "w4a8");
  EXPECT_EQ(p.draft_window, 64);
  EXPECT_EQ(p.draft_sinks, 0);
  qspec::set_draft_spec(p, "ngram");
  EXPECT_EQ(p.draft_window, 0);
  EXPECT_EQ(qspec::draft_spec(p), "ngram");
  for (const char* bad : {"w4a16@", "w4a16@x", "w4a16@-4", "w4a16@12+", "w4a16@12+3x"})
    EXPECT_THROW(qspec::set_draft_spec(p, bad), qspec::DecodePlanError) << bad;
}

TEST(DecodePlan, EveryLowPrecisionDraftIsAccepted) {
  for (const char* draft : {"w4a8", "w4a8-fp8", "w4a4", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4", "w4a4-int4-arc",
                            "w4a4-nvfp4-arc", "w4a4-mxfp4-arc"}) {
    DecodePlan p = qspec_plan();
    p.draft = draft;
    EXPECT_EQ(broken_field(p), "") << draft;
  }
}

}  // namespace

// The commands' default mode, auto, resolves by the checkpoint: QSpec with the planner (verify
// w4a16) on 4-bit weights, W16A16 on 16-bit ones, saying why; a named mode is left alone, and a
// named draft stays the draft auto's QSpec runs.
TEST(DecodePlan, AutoModeIsQSpecWithThePlannerOnFourBitWeightsElseW16A16) {
  EXPECT_EQ(rules::kCommandMode, rules::kAutoMode);
  DecodePlan four_bit = qspec::command_plan();
  EXPECT_EQ(four_bit.mode, rules::kAutoMode);
  EXPECT_EQ(broken_field(four_bit), "mode");  // auto is resolved before a plan runs
  const std::string why = qspec::resolve_auto_mode(four_bit, /*checkpoint_has_4bit_weights=*/true);
  EXPECT_TRUE(four_bit.qspec());
  EXPECT_TRUE(four_bit.auto_draft());
  EXPECT_EQ(four_bit.verify, rules::kVerifyMode);
  EXPECT_EQ(broken_field(four_bit), "");
  EXPECT_NE(why.find("mode auto: qspec"), std::string::npos) << why;
  EXPECT_NE(why.find("the planner"), std::string::npos) << why;

  DecodePlan sixteen_bit = qspec::command_plan();
  const std::string why16 = qspec::resolve_auto_mode(sixteen_bit, /*checkpoint_has_4bit_weights=*/false);
  EXPECT_EQ(sixteen_bit.mode, "w16a16");
  EXPECT_EQ(sixteen_bit.mode, rules::checkpoint_mode(false));
  EXPECT_EQ(broken_field(sixteen_bit), "");
  EXPECT_NE(why16.find("mode auto: w16a16"), std::string::npos) << why16;

  for (const char* named : {"w4a16", "w16a16", "qspec"}) {
    DecodePlan plan = qspec::command_plan();
    plan.mode = named;
    EXPECT_EQ(qspec::resolve_auto_mode(plan, true), "") << named;
    EXPECT_EQ(plan.mode, named);
  }
  DecodePlan bad = qspec::command_plan();
  bad.mode = "w5a16";
  EXPECT_EQ(qspec::resolve_auto_mode(bad, true), "");
  EXPECT_EQ(broken_field(bad), "mode");

  DecodePlan ngram = qspec::command_plan();
  ngram.draft = std::string(rules::kNgramDraft);
  EXPECT_NE(qspec::resolve_auto_mode(ngram, true).find("draft ngram"), std::string::npos);
  EXPECT_TRUE(ngram.ngram_draft());
}

// A draft's vocabulary subset (draft_vocab): 0 or kMinDraftVocab.., on a drafting mode (which
// may then be the verify's own), composable with a window; never on n-gram or auto drafts.
TEST(DecodePlan, VocabularySubsetDraftsCheckTheirSize) {
  DecodePlan p = qspec_plan();
  EXPECT_EQ(p.draft_vocab, 0);
  p.draft = "w4a16";
  EXPECT_EQ(broken_field(p), "draft");
  p.draft_vocab = 4096;
  EXPECT_EQ(broken_field(p), "");  // the subset alone is a diet: the verify's mode may draft
  p.draft_window = 256;
  EXPECT_EQ(broken_field(p), "");
  p.draft = "w4a4-nvfp4";
  EXPECT_EQ(broken_field(p), "");
  p.draft_vocab = rules::kMinDraftVocab - 1;
  EXPECT_EQ(broken_field(p), "draft_vocab");
  p.draft_vocab = -1;
  EXPECT_EQ(broken_field(p), "draft_vocab");
  p.draft_vocab = rules::kMinDraftVocab;
  EXPECT_EQ(broken_field(p), "");
  p.draft_window = 0;
  p.draft = std::string(rules::kNgramDraft);
  EXPECT_EQ(broken_field(p), "draft_vocab");
  p.draft = std::string(rules::kAutoDraft);
  EXPECT_EQ(broken_field(p), "draft_vocab");
}

// "/vN" after a mode or a window names the subset; it spells back the same way.
TEST(DecodePlan, VocabularySubsetDraftSpecsRoundTripAndRefuseBadSyntax) {
  DecodePlan p = qspec_plan();
  qspec::set_draft_spec(p, "w4a8/v8192");
  EXPECT_EQ(p.draft, "w4a8");
  EXPECT_EQ(p.draft_vocab, 8192);
  EXPECT_EQ(p.draft_window, 0);
  EXPECT_EQ(qspec::draft_spec(p), "w4a8/v8192");
  qspec::set_draft_spec(p, "w4a16@256/v4096");
  EXPECT_EQ(p.draft, "w4a16");
  EXPECT_EQ(p.draft_window, 256);
  EXPECT_EQ(p.draft_sinks, rules::kDefaultDraftSinks);
  EXPECT_EQ(p.draft_vocab, 4096);
  EXPECT_EQ(qspec::draft_spec(p), "w4a16@256+16/v4096");
  EXPECT_EQ(broken_field(p), "");
  qspec::set_draft_spec(p, "w4a8");  // a spec without the suffix clears an earlier subset
  EXPECT_EQ(p.draft_vocab, 0);
  for (const char* bad : {"w4a8/v", "w4a8/vx", "w4a8/v-5", "w4a8/v12k", "w4a16@64/v"})
    EXPECT_THROW(qspec::set_draft_spec(p, bad), qspec::DecodePlanError) << bad;
}
