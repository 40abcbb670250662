// Prompt-lookup drafts (runtime/ngram_draft.h): a backwards scan per n-gram length, longest
// first, O(length x n) a call (~20 us at 7K tokens); NgramIndex, the same answers from hash
// maps kept up to date as a sequence grows; and NgramCorpus, lookups in other requests' text.
#include "runtime/ngram_draft.h"

#include <algorithm>

namespace qspec {

namespace {

// The latest start of the suffix of length n before it (ending before the last token), or -1.
int64_t scan_for_suffix(std::span<const int32_t> tokens, int64_t n) {
  const int64_t length = static_cast<int64_t>(tokens.size());
  const auto suffix = tokens.subspan(static_cast<size_t>(length - n));
  for (int64_t start = length - n - 1; start >= 0; --start)
    if (std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) return start;
  return -1;
}

// What followed the occurrence at `start` of the length-n suffix: up to max_tokens known ids.
NgramLookup continuation(std::span<const int32_t> tokens, int64_t start, int64_t n, int64_t max_tokens) {
  const int64_t from = start + n, count = std::min(max_tokens, static_cast<int64_t>(tokens.size()) - from);
  return {std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count), n};
}

}  // namespace

NgramLookup ngram_lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max) {
  const int64_t length = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || ngram_min < 1) return {};
  // The most recent occurrence that ends before the suffix's last token: its continuation begins
  // inside the known tokens.
  for (int64_t n = std::min(ngram_max, length - 1); n >= ngram_min; --n)
    if (const int64_t start = scan_for_suffix(tokens, n); start >= 0) return continuation(tokens, start, n, max_tokens);
  return {};
}

namespace {

// An n-gram's key in NgramIndex (FNV-1a-like over the ids, mixed; equal n-grams, equal keys).
uint64_t ngram_hash(const int32_t* ids, int64_t n) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(ids[i]);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace

void NgramIndex::index_up_to(std::span<const int32_t> tokens, size_t end) {
  // N-grams ending at positions indexed_ .. end - 1.
  for (size_t p = indexed_; p < end; ++p)
    for (int64_t n = ngram_min_; n <= ngram_max_; ++n) {
      if (static_cast<int64_t>(p) + 1 < n) break;  // longer ones do not fit either
      const int64_t start = static_cast<int64_t>(p) + 1 - n;
      latest_[static_cast<size_t>(n - ngram_min_)][ngram_hash(tokens.data() + start, n)] = start;
    }
  indexed_ = end;
  if (end > 0) last_indexed_token_ = tokens[end - 1];
}

NgramLookup NgramIndex::lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min,
                               int64_t ngram_max) {
  const int64_t length = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || ngram_min < 1 || ngram_max < ngram_min) return {};
  const bool grew = tokens.size() >= indexed_ && (indexed_ == 0 || tokens[indexed_ - 1] == last_indexed_token_);
  if (ngram_min != ngram_min_ || ngram_max != ngram_max_ || !grew) {
    ngram_min_ = ngram_min, ngram_max_ = ngram_max;
    latest_.assign(static_cast<size_t>(ngram_max - ngram_min + 1), {});
    indexed_ = 0;
  }
  // An occurrence must end before the suffix's last token: n-grams ending at 0 .. length - 2.
  if (length >= 1) index_up_to(tokens, static_cast<size_t>(length - 1));
  for (int64_t n = std::min(ngram_max, length - 1); n >= ngram_min; --n) {
    const auto& latest = latest_[static_cast<size_t>(n - ngram_min)];
    const auto found = latest.find(ngram_hash(tokens.data() + (length - n), n));
    if (found == latest.end()) continue;  // this suffix never occurred before
    const auto suffix = tokens.subspan(static_cast<size_t>(length - n));
    if (std::equal(suffix.begin(), suffix.end(), tokens.begin() + found->second))
      return continuation(tokens, found->second, n, max_tokens);
    // Another n-gram with the same hash came last: the scan decides this length.
    if (const int64_t start = scan_for_suffix(tokens, n); start >= 0) return continuation(tokens, start, n, max_tokens);
  }
  return {};
}

namespace {
constexpr int32_t kSeparator = -1;  // ends each corpus document (never a token id)
}  // namespace

NgramCorpus::NgramCorpus(int64_t capacity) : capacity_(std::max<int64_t>(capacity, 0)) {}

void NgramCorpus::index_from(size_t begin) {
  // Every n-gram inside a document that has a token after it, later ones overwriting earlier.
  for (size_t end = begin + 1; end < tokens_.size(); ++end) {  // n-grams ending at end - 1
    if (tokens_[end] == kSeparator) continue;                  // nothing follows it
    for (int64_t n = 1; n <= kMaxLength && static_cast<int64_t>(end) - n >= static_cast<int64_t>(begin); ++n) {
      const int32_t* ids = tokens_.data() + end - static_cast<size_t>(n);
      if (ids[0] == kSeparator) break;  // longer ones cross into the document before
      latest_[ngram_hash(ids, n)] = static_cast<int64_t>(end);
    }
  }
}

void NgramCorpus::add(std::span<const int32_t> text) {
  if (capacity_ < 2 || text.size() < 2) return;
  if (static_cast<int64_t>(text.size()) >= capacity_) text = text.subspan(text.size() - static_cast<size_t>(capacity_ - 1));
  if (static_cast<int64_t>(tokens_.size() + text.size()) + 1 > capacity_) {
    // Drop whole documents from the front until at most half the capacity is left, then index
    // the rest again (positions moved): a rebuild every ~capacity / 2 tokens added.
    size_t drop = 0;
    const size_t keep = static_cast<size_t>(capacity_ / 2);
    while (tokens_.size() - drop > keep) {
      const auto next = std::find(tokens_.begin() + static_cast<std::ptrdiff_t>(drop), tokens_.end(), kSeparator);
      drop = static_cast<size_t>(next - tokens_.begin()) + 1;
    }
    tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(drop));
    latest_.clear();
    index_from(0);
  }
  const size_t begin = tokens_.size();
  tokens_.insert(tokens_.end(), text.begin(), text.end());
  tokens_.push_back(kSeparator);
  index_from(begin);
}

NgramLookup NgramCorpus::lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min,
                                int64_t ngram_max) const {
  const int64_t length = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || ngram_min < 1 || latest_.empty()) return {};
  for (int64_t n = std::min({ngram_max, kMaxLength, length}); n >= ngram_min; --n) {
    const int32_t* suffix = tokens.data() + (length - n);
    const auto found = latest_.find(ngram_hash(suffix, n));
    if (found == latest_.end()) continue;
    const int64_t from = found->second;
    if (!std::equal(suffix, suffix + n, tokens_.begin() + (from - n))) continue;  // another n-gram's hash
    NgramLookup out{{}, n, true};
    for (int64_t p = from; p < static_cast<int64_t>(tokens_.size()) && tokens_[static_cast<size_t>(p)] != kSeparator &&
                           static_cast<int64_t>(out.tokens.size()) < max_tokens;
         ++p)
      out.tokens.push_back(tokens_[static_cast<size_t>(p)]);
    return out;
  }
  return {};
}

NgramLookup ngram_lookup_own_then_corpus(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min,
                                         int64_t ngram_max, NgramIndex* index, const NgramCorpus* corpus) {
  NgramLookup own = index ? index->lookup(tokens, max_tokens, ngram_min, ngram_max)
                          : ngram_lookup(tokens, max_tokens, ngram_min, ngram_max);
  if (!own.tokens.empty() || corpus == nullptr) return own;
  return corpus->lookup(tokens, max_tokens, ngram_min, ngram_max);
}

}  // namespace qspec
