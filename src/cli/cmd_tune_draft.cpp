// qspec tune-draft: makes a checkpoint's draft tables. The vocabulary table (model/draft_vocab.h;
// issue 50, diet 4, FR-Spec): counts the token ids of calibration text with the model's
// tokenizer, ranks them by frequency and writes the first --vocab ids beside the checkpoint, where
// QSpec drafts with a vocabulary subset (--draft-vocab N, "MODE/vN") find them. The layer skip
// table (model/draft_skip.h; diet 3): a greedy search on the first --skip-tokens tokens of the
// same text for the layers a draft skips (--draft-skip N, "MODE/sN"). A command of its own rather
// than a `quantize` option: the tables are add-ons to any checkpoint (16-bit or 4-bit), made
// without re-quantizing, the way `tune` adds GEMM policy maps.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "model/draft_skip.h"
#include "model/draft_vocab.h"
#include "model/llama.h"
#include "qspec/decode_plan.h"
#include "tokenizer/calibration_text.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {
// Calibration text is cut into sequences of this many tokens; every sequence is counted.
constexpr int64_t kCountSequenceLength = 4096;
constexpr int64_t kCountAllSequences = int64_t{1} << 40;
// The skip search's sequences: short, so that a few hundred tokens span several passages, long
// enough that most positions see a real context.
constexpr int64_t kSkipSequenceLength = 128;

struct TuneDraftArgs {
  std::string model_dir;
  std::vector<std::string> calibration;
  int64_t vocab = kDefaultDraftVocabRows;
  int64_t skip_max = -1;  // -1: half the layers; 0: no skip table
  int64_t skip_tokens = 256;
  std::string skip_mode = "w4a16";
};

// The layer skip table: the greedy search over the first skip_tokens calibration tokens.
void tune_skip(const TuneDraftArgs& args, LlamaModel& model, const Tokenizer& tokenizer) {
  const int64_t layers = model.config().num_layers;
  const int64_t max_skip = args.skip_max < 0 ? layers / 2 : args.skip_max;
  QSPEC_CHECK(max_skip >= 1 && max_skip < layers, "tune-draft: --skip-max ", max_skip, " outside 1..", layers - 1,
              " (a draft keeps at least one of the ", layers, " layers)");
  QSPEC_CHECK(args.skip_tokens >= 2, "tune-draft: --skip-tokens must be >= 2, got ", args.skip_tokens);
  std::vector<RunMode> modes = {parse_run_mode(decode_rules::kVerifyMode), parse_run_mode(args.skip_mode)};
  QSPEC_CHECK(modes[1].quantized_weights, "tune-draft: --skip-mode ", args.skip_mode,
              ": a draft mode runs the 4-bit weights (w4a16, w4a8, ...)");
  prepare_model_for_modes(model, modes, "", 0);
  std::vector<std::vector<int32_t>> sequences;
  int64_t tokens = 0;
  std::vector<std::string> used;
  for (const std::string& file : args.calibration) {
    if (tokens >= args.skip_tokens) break;
    const int64_t wanted = (args.skip_tokens - tokens + kSkipSequenceLength - 1) / kSkipSequenceLength;
    CalibrationSet set = load_calibration_text(file, tokenizer, wanted, kSkipSequenceLength);
    used.push_back(file);
    for (auto& sequence : set.sequences) {
      if (tokens >= args.skip_tokens) break;
      if (static_cast<int64_t>(sequence.size()) > args.skip_tokens - tokens) sequence.resize(args.skip_tokens - tokens);
      if (sequence.size() < 2) break;
      tokens += static_cast<int64_t>(sequence.size());
      sequences.push_back(std::move(sequence));
    }
  }
  std::printf("layer skip search: %lld of %lld layers, draft %s against %s, %lld calibration tokens in %zu "
              "sequences\n",
              static_cast<long long>(max_skip), static_cast<long long>(layers), modes[1].name.c_str(),
              modes[0].name.c_str(), static_cast<long long>(tokens), sequences.size());
  std::printf("%8s %7s %10s %9s\n", "skipped", "layer", "agreement", "seconds");
  std::fflush(stdout);
  DraftSkipTable table = search_draft_skip(model, sequences, modes[1], modes[0], max_skip,
                                           [](int64_t skipped, int32_t layer, double agreement, double seconds) {
                                             std::printf("%8lld %7d %9.1f%% %9.1f\n", static_cast<long long>(skipped),
                                                         layer, 100 * agreement, seconds);
                                             std::fflush(stdout);
                                           });
  static_cast<DraftTableIdentity&>(table) = draft_table_identity(model, used, tokens);
  write_draft_skip_table(table, args.model_dir);
  std::printf("wrote %s/%s: %zu layers in skip order (agreement with none skipped: %.1f%%)\n", args.model_dir.c_str(),
              std::string(kDraftSkipFile).c_str(), table.order.size(), 100 * table.agreement.front());
}

void run_tune_draft(const TuneDraftArgs& args) {
  // The table being remade may be one that no longer matches: do not read it.
  auto model = LlamaModel::load(args.model_dir, /*read_draft_tables=*/false);
  const ModelConfig& c = model->config();
  auto tokenizer = Tokenizer::load(args.model_dir);
  tokenizer->check_model_vocab(c.vocab_size, args.model_dir);
  const int64_t rows = std::min(args.vocab, c.vocab_size);
  QSPEC_CHECK(rows >= decode_rules::kMinDraftVocab, "tune-draft: --vocab ", args.vocab, " is below ",
              decode_rules::kMinDraftVocab, " (the smallest draft subset)");
  std::vector<std::vector<int32_t>> sequences;
  int64_t tokens = 0;
  for (const std::string& file : args.calibration) {
    CalibrationSet set = load_calibration_text(file, *tokenizer, kCountAllSequences, kCountSequenceLength);
    tokens += set.tokens;
    for (auto& sequence : set.sequences) sequences.push_back(std::move(sequence));
  }
  // The end of a turn and the other special tokens first: calibration text holds none.
  std::vector<int32_t> first = tokenizer->eos_ids;
  for (int32_t id = 0; id < c.vocab_size; ++id)
    if (tokenizer->is_special(id)) first.push_back(id);
  const std::vector<int32_t> ranked = rank_token_frequencies(sequences, c.vocab_size, first);
  std::vector<bool> seen(static_cast<size_t>(c.vocab_size), false);
  int64_t distinct = 0;
  for (const auto& sequence : sequences)
    for (int32_t id : sequence)
      if (!seen[static_cast<size_t>(id)]) seen[static_cast<size_t>(id)] = true, ++distinct;
  const DraftVocabTable table = make_draft_vocab_table(*model, ranked, rows, args.calibration, tokens);
  write_draft_vocab_table(table, args.model_dir);
  std::printf("wrote %s/%s: %zu special ids, then the most frequent, %lld of %lld ids (%lld calibration tokens, "
              "%lld distinct ids)\n",
              args.model_dir.c_str(), std::string(kDraftVocabFile).c_str(), first.size(), static_cast<long long>(rows),
              static_cast<long long>(c.vocab_size), static_cast<long long>(tokens), static_cast<long long>(distinct));
  if (distinct < rows)
    std::printf("note: the calibration text holds %lld distinct ids; the table's last %lld are unseen ids in id "
                "order (more text ranks them)\n",
                static_cast<long long>(distinct), static_cast<long long>(rows - distinct));
  // The extra bytes a draft keeps at a few subset sizes, against the bound.
  model->set_draft_vocab(table, args.model_dir + "/" + std::string(kDraftVocabFile));
  std::printf("%10s %14s %14s %10s\n", "draft N", "head bytes", "weight bytes", "share");
  std::vector<int64_t> sizes;
  for (int64_t n : {int64_t{4096}, int64_t{8192}, int64_t{16384}})
    if (n < rows) sizes.push_back(n);
  sizes.push_back(rows);
  for (int64_t n : sizes) {
    const size_t bytes = model->draft_head(n)->bytes();
    const double share = static_cast<double>(bytes) / static_cast<double>(model->weight_bytes());
    std::printf("%10lld %14zu %14zu %9.1f%%%s\n", static_cast<long long>(n), bytes, model->weight_bytes(),
                100.0 * share, share > kMaxDraftTableShare ? "  (over the 5 % bound for extra draft tables)" : "");
  }
  if (args.skip_max != 0) tune_skip(args, *model, *tokenizer);
}
}  // namespace

void register_tune_draft(CLI::App& app) {
  auto args = std::make_shared<TuneDraftArgs>();
  CLI::App* command = app.add_subcommand(
      "tune-draft", "Make a checkpoint's draft tables: token ids ranked by frequency in calibration text, for QSpec "
                    "drafts that score only the most frequent (--draft-vocab N), and the order in which drafts skip "
                    "layers, searched on that text (--draft-skip N)");
  command->add_option("model", args->model_dir, "Model directory (the table is written there)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--calibration", args->calibration,
                      "UTF-8 calibration text (repeatable; e.g. data/calibration/mt-bench-questions.txt)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--vocab", args->vocab, "Ids the table keeps (a draft's --draft-vocab may use up to this many)")
      ->capture_default_str();
  command->add_option("--skip-max", args->skip_max,
                      "Layers the skip search orders (a draft's --draft-skip may use up to this many); -1: half the "
                      "layers; 0: no skip table")
      ->capture_default_str();
  command->add_option("--skip-tokens", args->skip_tokens,
                      "Calibration tokens the skip search scores (the first of the text, in sequences of 128)")
      ->capture_default_str();
  command->add_option("--skip-mode", args->skip_mode,
                      "The draft's activation mode in the skip search (w4a16, w4a8, ...); its agreement is with w4a16")
      ->capture_default_str();
  command->callback([args] { run_tune_draft(*args); });
}

}  // namespace qspec::cli
