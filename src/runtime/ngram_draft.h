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

}  // namespace qspec
