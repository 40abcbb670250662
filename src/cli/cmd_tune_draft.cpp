// qspec tune-draft: makes a checkpoint's draft vocabulary table (model/draft_vocab.h; issue 50,
// diet 4, FR-Spec): counts the token ids of calibration text with the model's tokenizer, ranks
// them by frequency and writes the first --vocab ids beside the checkpoint, where QSpec drafts
// with a vocabulary subset (--draft-vocab N, "MODE/vN") find them. A command of its own rather
// than a `quantize` option: the table is an add-on to any checkpoint (16-bit or 4-bit), made
// without re-quantizing, the way `tune` adds GEMM policy maps.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
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

struct TuneDraftArgs {
  std::string model_dir;
  std::vector<std::string> calibration;
  int64_t vocab = kDefaultDraftVocabRows;
};

void run_tune_draft(const TuneDraftArgs& args) {
  // The table being remade may be one that no longer matches: do not read it.
  auto model = LlamaModel::load(args.model_dir, /*read_draft_vocab=*/false);
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
}
}  // namespace

void register_tune_draft(CLI::App& app) {
  auto args = std::make_shared<TuneDraftArgs>();
  CLI::App* command = app.add_subcommand(
      "tune-draft", "Make a checkpoint's draft vocabulary table: token ids ranked by frequency in calibration text, "
                    "for QSpec drafts that score only the most frequent (--draft-vocab N)");
  command->add_option("model", args->model_dir, "Model directory (the table is written there)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--calibration", args->calibration,
                      "UTF-8 calibration text (repeatable; e.g. data/calibration/mt-bench-questions.txt)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--vocab", args->vocab, "Ids the table keeps (a draft's --draft-vocab may use up to this many)")
      ->capture_default_str();
  command->callback([args] { run_tune_draft(*args); });
}

}  // namespace qspec::cli
