// The draft vocabulary table of a checkpoint (issue 50, diet 4; FR-Spec): token ids ranked by
// their frequency in calibration text, most frequent first. A QSpec draft with
// DecodePlan::draft_vocab = N scores only the first N ids' lm_head rows; the verify keeps the
// whole lm_head. Made by `qspec tune-draft` and stored beside the checkpoint (kDraftVocabFile),
// where LlamaModel::load finds it and checks that it was made for this model. Also what every
// draft table shares (DraftTableIdentity: the model it was made for, its file's reading and
// writing); the layer skip table (model/draft_skip.h) is the other.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qspec {

class LlamaModel;

// The table's file name in a model directory, and its format tag.
inline constexpr std::string_view kDraftVocabFile = "qspec_draft_vocab.json";
inline constexpr std::string_view kDraftVocabFormat = "qspec-draft-vocab-1";
// The ids a table keeps when none is asked (`tune-draft --vocab`): FR-Spec's 16 K-32 K range
// at its low end, so a draft subset stays a small extra table (Llama-3-8B: 16384 f16 rows of
// 4096 are 134 MB, 2.9 % of its 4-bit weight bytes).
inline constexpr int64_t kDefaultDraftVocabRows = 16384;
// The bound the issue puts on a draft's extra tables: a share of the model's weight bytes.
// tune-draft reports each table's share against it.
inline constexpr double kMaxDraftTableShare = 0.05;

// What a draft table of a checkpoint (this vocabulary table, the layer skip table of
// model/draft_skip.h) says about the model it was made for, and the text it was made from. One
// struct, so that every table is written, read and checked against the checkpoint alike.
struct DraftTableIdentity {
  std::string model;         // the directory it was made from (for the reader; a copy may live elsewhere)
  std::string architecture;  // these four and the fingerprint must match the checkpoint at load
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  std::string lm_head_fingerprint;  // draft_vocab_fingerprint of the model it was made for
  std::vector<std::string> calibration;  // the calibration files read
  int64_t calibration_tokens = 0;
};

struct DraftVocabTable : DraftTableIdentity {
  std::vector<int32_t> ids;  // ranked, most frequent first; distinct, in [0, vocab_size)
};

// `model`'s identity as a table made now from `calibration` records it.
DraftTableIdentity draft_table_identity(const LlamaModel& model, std::vector<std::string> calibration,
                                        int64_t calibration_tokens);
// The identity's fields into / out of a table's JSON object (`path` names the file in errors,
// with the field at fault), and `format` checked as the object's "format".
void write_draft_table_identity(const DraftTableIdentity& identity, std::string_view format, nlohmann::json& j);
DraftTableIdentity read_draft_table_identity(const nlohmann::json& j, std::string_view format, const std::string& path);
// Throws naming `source` and the field when the table was made for another model (vocab_size,
// hidden_size, num_layers, architecture, lm_head_fingerprint).
void check_draft_table_identity(const DraftTableIdentity& identity, const LlamaModel& model, const std::string& source);
// A table's JSON object read from `path` (at most max_bytes), and written as DIR/FILE whole or
// not at all; `what` names the table in errors ("draft vocabulary table").
nlohmann::json read_draft_table_json(const std::string& path, uint64_t max_bytes, std::string_view what);
void write_draft_table_json(const nlohmann::json& j, const std::string& dir, std::string_view file,
                            std::string_view what);

// Every id of [0, vocab_size) ranked: `first` (in its order), then the others by their count in
// `sequences`, most frequent first (ties and unseen ids by lower id, so the ranking is
// deterministic). `first` is for the ids calibration text never holds but every answer needs:
// the tokenizer's end-of-sequence and other special tokens (a draft that cannot propose the
// end of a chat turn loses the last cycle of every answer). Throws naming the id for one
// outside the vocabulary.
std::vector<int32_t> rank_token_frequencies(std::span<const std::vector<int32_t>> sequences, int64_t vocab_size,
                                            std::span<const int32_t> first = {});

// What identifies the model a table belongs to beyond its shapes: a hash of a sample of its
// lm_head rows as loaded (the same for a checkpoint and its 4-bit copy, which keeps the lm_head).
std::string draft_vocab_fingerprint(const LlamaModel& model);

// A table of `model` keeping the first `rows` ids of `ranked`.
DraftVocabTable make_draft_vocab_table(const LlamaModel& model, std::span<const int32_t> ranked, int64_t rows,
                                       std::vector<std::string> calibration, int64_t calibration_tokens);

// Writes / reads kDraftVocabFile in `dir`. read_draft_vocab_table throws naming the file and
// field for a malformed table; check_draft_vocab_table throws naming the file and field when
// the table was made for another model (vocab_size, hidden_size, num_layers, architecture,
// lm_head_fingerprint).
void write_draft_vocab_table(const DraftVocabTable& table, const std::string& dir);
DraftVocabTable read_draft_vocab_table(const std::string& path);
void check_draft_vocab_table(const DraftVocabTable& table, const LlamaModel& model, const std::string& source);

// The message that says how to make a missing table.
std::string missing_draft_vocab_message(const std::string& model_dir);

}  // namespace qspec
