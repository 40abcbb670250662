// The decode plan of a request: how its tokens are made, plainly in one mode or by QSpec (a
// low-precision draft proposes gamma tokens, the target mode verifies them in one pass). Every
// rule about plans lives here, as named constants and one validate(): `generate`, `serve`,
// `eval`, the server's JSON and the engine all go through it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qspec/error.h"

namespace qspec {

namespace decode_rules {
// The mode name that asks for QSpec.
inline constexpr std::string_view kQSpecMode = "qspec";
// QSpec's target: its greedy output is W4A16's, token for token.
inline constexpr std::string_view kVerifyMode = "w4a16";
// The draft that is a planner (runtime/qspec_planner.h): every step it picks plain W4A16 or a
// draft and gamma from the measured step costs of this device and model (a table from `qspec
// bench --qspec-costs-out`) and each sequence's running acceptance, so that QSpec never runs
// where it is predicted to be slower than W4A16.
inline constexpr std::string_view kAutoDraft = "auto";
// The draft when none is named: the planner. (`eval qspec --drafts` and `bench --qspec-drafts`
// name concrete drafts; kCheapestDraft is the bench's default.)
inline constexpr std::string_view kDefaultDraft = kAutoDraft;
// The cheapest activation format on the weights: what `bench --qspec-drafts` times by default.
inline constexpr std::string_view kCheapestDraft = "w4a4-nvfp4";
// The draft that reads no weights: the continuation of the longest recent n-gram of the prompt
// and output that matches their end (prompt lookup; vLLM's `ngram`, llama.cpp's lookup
// decoding). It pays where text repeats (code edits, summaries, retrieval prompts).
inline constexpr std::string_view kNgramDraft = "ngram";
// The n-gram lengths it tries, longest first (vLLM's prompt_lookup_max / _min).
inline constexpr int64_t kDefaultNgramMax = 3;
inline constexpr int64_t kDefaultNgramMin = 1;
inline constexpr int64_t kMaxNgram = 16;
// Where a sequence's own tokens have no match, n-gram drafts look up the text of the engine's
// earlier requests (DecodePlan::ngram_corpus; runtime/ngram_draft.h's NgramCorpus): this many
// tokens of it at most, the oldest dropped (~10-25 MB of index on the host).
inline constexpr int64_t kNgramCorpusTokens = int64_t{1} << 17;
// A DecodePlan's mode when none is set (an engine Request built in code): the 4-bit weights'
// own mode. The commands default to kCommandMode instead.
inline constexpr std::string_view kDefaultMode = "w4a16";
// The mode a checkpoint's weights are: W4A16 on 4-bit weights, else W16A16 (the GPU engine's
// mode when none is named; `eval --modes auto`'s quality rows, as llama.cpp and vLLM take the
// format from the file).
inline std::string_view checkpoint_mode(bool checkpoint_has_4bit_weights) {
  return checkpoint_has_4bit_weights ? "w4a16" : "w16a16";
}
// The mode name that means "the fastest mode that keeps the checkpoint's output"
// (resolve_auto_mode below). On 4-bit weights that is QSpec verifying in W4A16: its greedy output
// is W4A16's token for token and sampling keeps W4A16's distribution, and its default draft, the
// planner, runs each step plain W4A16 unless the measured step costs predict a draft and gamma to
// be faster by planner_rules::kMinGain, so a step speculates only where it pays. On 16-bit
// weights, W16A16: QSpec needs 4-bit ones, and quantizing would change the output.
inline constexpr std::string_view kAutoMode = "auto";
// The --mode of `generate`, `chat` and `serve` when none is given. The server's too: its
// requests share one engine, and the planner prices each step for the whole running batch, so
// it speculates only at the batch sizes where that pays, while on 4-bit weights a request's
// output is W4A16's either way; a request's "qspec": {"mode": ...} still names any mode.
inline constexpr std::string_view kCommandMode = kAutoMode;
// A draft's sparse view of the shared KV cache (DecodePlan::draft_window): the window's default
// sinks (attention sinks: the first positions, which take much of every head's attention;
// StreamingLLM keeps 4, one 16-position KV block costs nothing more), and the bound on sinks.
inline constexpr int64_t kDefaultDraftSinks = 16;
inline constexpr int64_t kMaxDraftSinks = 1024;
// A draft's cheaper lm_head (DecodePlan::draft_vocab): the draft scores only the N most frequent
// vocabulary rows of the model's draft vocabulary table (model/draft_vocab.h; FR-Spec). The
// smallest subset worth a table row: below it the draft's argmax is mostly wrong.
inline constexpr int64_t kMinDraftVocab = 64;
// The spec suffix that names the subset: "MODE/v4096", "w4a16@256+16/v8192".
inline constexpr std::string_view kDraftVocabTag = "/v";
// A draft's layer skipping (DecodePlan::draft_skip): the draft skips the first N layers of the
// model's draft skip table (model/draft_skip.h; Draft & Verify, SWIFT). The spec suffix that
// names it, after any vocabulary subset: "MODE/s8", "w4a8@256+16/v8192/s6".
inline constexpr std::string_view kDraftSkipTag = "/s";
// A draft that reads only the high 4 bits of each 8-bit KV code (DecodePlan::draft_kv4; QuantSpec's
// hierarchical KV, on `--kv-cache int8`). The spec suffix that names it, last: "w4a8/k4",
// "w4a16@256+16/k4", "w4a16/v4096/s2/k4".
inline constexpr std::string_view kDraftKv4Tag = "/k4";
inline constexpr int64_t kDefaultGamma = 4;
// Draft tokens a cycle at most: the GPU's on-device draft chain holds this many.
inline constexpr int64_t kMaxGamma = 16;
// Adaptive gamma's upper bound when none is named.
inline constexpr int64_t kDefaultMaxGamma = 8;
}  // namespace decode_rules

struct DecodePlan {
  std::string mode{decode_rules::kDefaultMode};    // a run mode (w16a16, w4a16, w4a8, ...) or "qspec"
  std::string draft{decode_rules::kDefaultDraft};  // qspec: "auto" (the planner), a low-precision drafting mode (w4a8*, w4a4*), or "ngram"
  std::string verify{decode_rules::kVerifyMode};   // qspec: the target mode
  int64_t gamma = decode_rules::kDefaultGamma;     // qspec: draft tokens per cycle (1..kMaxGamma); auto: unused
  bool adaptive_gamma = false;                     // qspec: move gamma with the recent acceptance
  // qspec: adaptive gamma's bound (gamma..kMaxGamma); draft auto: the largest gamma the planner
  // may pick (1..kMaxGamma)
  int64_t max_gamma = decode_rules::kDefaultMaxGamma;
  bool kv_overwrite = true;                        // qspec: false = the paper's no-overwrite ablation
  int64_t ngram_max = decode_rules::kDefaultNgramMax;  // draft ngram: the longest n-gram matched (ngram_min..kMaxNgram)
  int64_t ngram_min = decode_rules::kDefaultNgramMin;  // draft ngram: the shortest (1..ngram_max)
  // draft ngram / auto: where the sequence's own tokens have no match, look up the prompts and
  // outputs of the engine's earlier requests (decode_rules::kNgramCorpusTokens), and give this
  // request's text to them when it ends. false: its own tokens only, and its text stays out.
  bool ngram_corpus = true;
  // qspec: the draft passes' view of the KV cache. 0: the whole cache. > 0: each draft step
  // attends to the last draft_window positions and the first draft_sinks only (a bounded read at
  // any context; the verify still reads all of it, so the output is unchanged). With a window
  // the draft may run the verify's own mode (w4a16): the window is then its whole diet.
  int64_t draft_window = 0;
  int64_t draft_sinks = decode_rules::kDefaultDraftSinks;
  // qspec: the draft's lm_head. 0: the whole vocabulary. N > 0: the draft scores only the N most
  // frequent token ids of the model's draft vocabulary table (its distribution is the softmax
  // over them, zero elsewhere); the verify keeps the full lm_head, so the output is unchanged.
  // With a vocabulary subset the draft may run the verify's mode (w4a16). N is bounded by the
  // table's length: the engine checks that (it knows the model).
  int64_t draft_vocab = 0;
  // qspec: the draft's layers. 0: all of them. N > 0: the draft skips the first N layers of the
  // model's draft skip table (each the identity on the residual stream, no K/V written); the
  // verify runs every layer and rewrites every layer's K/V of the cycle, so the output is
  // unchanged. With skipped layers the draft may run the verify's mode (w4a16). N is bounded by
  // the table's length: the engine checks that (it knows the model). Needs kv_overwrite (the
  // draft has no K/V rows of the skipped layers to keep).
  int64_t draft_skip = 0;
  // qspec: the draft's view of an 8-bit KV cache (`--kv-cache int8`). false: all 8 bits of each
  // code. true: only the high nibble (the middle of its 16 codes, ops/kv_int8.h), half the code
  // bytes; the verify reads all 8 bits, so the output is unchanged. With it the draft may run the
  // verify's mode (w4a16). Needs an int8 cache: the engine checks that (it knows the cache).
  bool draft_kv4 = false;

  bool qspec() const { return mode == decode_rules::kQSpecMode; }
  // QSpec with n-gram drafts: no draft passes, so no draft mode to prepare.
  bool ngram_draft() const { return qspec() && draft == decode_rules::kNgramDraft; }
  // QSpec whose draft and gamma the planner picks every step.
  bool auto_draft() const { return qspec() && draft == decode_rules::kAutoDraft; }
  // The sinks the draft's view keeps: draft_sinks with a window, none without one.
  int64_t draft_view_sinks() const { return draft_window > 0 ? draft_sinks : 0; }
  // Whether the draft runs a diet that reads less than the verify whatever its activation mode
  // (a sparse KV view, a vocabulary subset, skipped layers or the 4-bit view of an 8-bit cache):
  // then it may run the verify's own mode.
  bool draft_has_diet() const { return draft_window > 0 || draft_vocab > 0 || draft_skip > 0 || draft_kv4; }
  // The most draft tokens one cycle can take (0 for plain decoding).
  int64_t gamma_bound() const { return qspec() ? (adaptive_gamma || auto_draft() ? max_gamma : gamma) : 0; }
  // The run modes the model must be prepared for: the plain mode, or QSpec's verify and draft
  // (the verify alone for n-gram drafts, and for the planner: its drafts run on the same 4-bit
  // weights, and the engine checks each against its cost table).
  std::vector<std::string> modes() const;
};

// A broken rule: `field` names the plan's field at fault ("mode", "draft", "verify", "gamma",
// "max_gamma"), for callers that report fields (the server's `param`).
class DecodePlanError : public Error {
 public:
  DecodePlanError(std::string field, const std::string& message) : Error(message), field(std::move(field)) {}
  std::string field;
};

// A draft in one word, as `eval qspec --drafts` and `bench --qspec-drafts` list them and their
// records name them: "MODE" (w4a8, ...), "ngram", "auto", or "MODE@WINDOW" / "MODE@WINDOW+SINKS" for a
// sparse view of the cache (draft_window, draft_sinks; SINKS defaults to kDefaultDraftSinks),
// each optionally followed by "/vN" for a vocabulary subset of N rows (draft_vocab), then
// "/sN" for N skipped layers (draft_skip), then "/k4" for the 4-bit view of an 8-bit KV cache
// (draft_kv4): "w4a8/v8192", "w4a16@256+16/v4096", "w4a8/s6", "w4a16/v4096/s8", "w4a8/k4".
// Sets plan.draft, draft_window, draft_sinks, draft_vocab, draft_skip and draft_kv4; throws
// DecodePlanError("draft") on bad syntax (the rules are validate()'s).
void set_draft_spec(DecodePlan& plan, std::string_view spec);
std::string draft_spec(const DecodePlan& plan);

// Throws DecodePlanError naming the field at fault (`field_prefix` + "mode", "draft", "gamma",
// "max_gamma", "ngram_max", "draft_window", ...) when a rule above is broken: an unknown mode, a
// draft that is neither "auto", "ngram" nor a 4-bit-weight low-precision-activation mode (or,
// with a draft_window or draft_vocab, the verify's mode), gamma, max_gamma, the n-gram lengths,
// the draft's window and sinks or draft_vocab out of range (draft_vocab: 0 or kMinDraftVocab ..
// the table's length, which the engine checks), draft_skip < 0 (its bound is the skip table's,
// which the engine checks), skipped layers without kv_overwrite, a window, a vocabulary
// subset, skipped layers, the 4-bit KV view or the no-overwrite ablation with draft auto (the
// planner's drafts come from its cost table), the 4-bit KV view with n-gram drafts. (The
// window's bound by the context, and the 4-bit view's need of an int8 cache, are the engine's:
// it knows the context and the cache.)
void validate(const DecodePlan& plan, std::string_view field_prefix = "");

// The plan of a command before its flags: mode kCommandMode, the other fields DecodePlan's.
inline DecodePlan command_plan() {
  DecodePlan plan;
  plan.mode = std::string(decode_rules::kCommandMode);
  return plan;
}

// Turns mode "auto" into what it means for a checkpoint (kAutoMode): QSpec on 4-bit weights
// (verify w4a16; the plan's draft, by default the planner), else W16A16. Returns why, in words
// for a log line ("" when the mode was not auto: the plan is left as it was).
std::string resolve_auto_mode(DecodePlan& plan, bool checkpoint_has_4bit_weights);

}  // namespace qspec
