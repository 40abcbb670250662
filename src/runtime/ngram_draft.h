// Prompt-lookup drafts for QSpec (decode_rules::kNgramDraft): the tokens that followed the most
// recent earlier occurrence of the sequence's last n tokens. They cost no weight bytes and no
// forward pass; the verify pass decides, so the output stays the target's.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace qspec {

// Up to max_tokens ids that followed the most recent earlier occurrence of the longest suffix
// of `tokens` whose length is in ngram_min..ngram_max; empty when no such suffix recurs.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min,
                                 int64_t ngram_max);

// The same lookup with the length of the suffix it matched (0 when none): a longer match is
// kept more often (SmolLM2's GSM8K chat answers: the first draft 32 / 62 / 81 % of the time
// after a match of 1 / 2 / 3 tokens), so the planner weighs each lookup by it.
struct NgramLookup {
  std::vector<int32_t> tokens;
  int64_t match = 0;
};
NgramLookup ngram_lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max);

}  // namespace qspec
