// Prompt-lookup drafts (runtime/ngram_draft.h): a backwards scan per n-gram length, longest
// first. O(length x n) a call: ~30k comparisons at 8 K tokens, far below a decode step.
#include "runtime/ngram_draft.h"

#include <algorithm>

namespace qspec {

std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min,
                                 int64_t ngram_max) {
  return ngram_lookup(tokens, max_tokens, ngram_min, ngram_max).tokens;
}

NgramLookup ngram_lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max) {
  const int64_t length = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || ngram_min < 1) return {};
  for (int64_t n = std::min(ngram_max, length - 1); n >= ngram_min; --n) {
    const auto suffix = tokens.subspan(static_cast<size_t>(length - n));
    // The most recent occurrence that ends before the suffix's last token: its continuation
    // begins inside the known tokens.
    for (int64_t start = length - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n, count = std::min(max_tokens, length - from);
      return {std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count), n};
    }
  }
  return {};
}

}  // namespace qspec
