// Prompt-lookup drafts for QSpec (decode_rules::kNgramDraft): the tokens that followed the most
// recent earlier occurrence of the sequence's last n tokens. They cost no weight bytes and no
// forward pass; the verify pass decides, so the output stays the target's.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace qspec {

// Up to max_tokens ids that followed the most recent earlier occurrence of the longest suffix
// of `tokens` whose length is in ngram_min..ngram_max (none when no such suffix recurs), and the
// length of the suffix it matched (0 when none): a longer match is kept more often (SmolLM2's
// GSM8K chat answers: the first draft 32 / 62 / 81 % of the time after a match of 1 / 2 / 3
// tokens), so the planner weighs each lookup by it.
struct NgramLookup {
  std::vector<int32_t> tokens;
  int64_t match = 0;
  bool corpus = false;  // from an NgramCorpus (other requests' text), not the sequence's own tokens
};
NgramLookup ngram_lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max);

// ngram_lookup over one sequence's growing tokens without rescanning them: for each n-gram length,
// the latest start of every n-gram seen so far, kept up to date as tokens are appended (a few
// hash updates a token instead of a backwards scan a call: at 7K tokens a scan is ~20 us, and an
// engine step at batch 64 makes two a sequence). lookup() answers exactly what ngram_lookup()
// answers: a hit is checked against the tokens, and a hash collision falls back to the scan.
// Other n-gram lengths, or tokens that did not just grow (shorter, or another id where the index
// ended: the engine only appends), index the sequence again from the start.
class NgramIndex {
 public:
  NgramLookup lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max);

 private:
  void index_up_to(std::span<const int32_t> tokens, size_t end);
  int64_t ngram_min_ = 0, ngram_max_ = 0;  // the lengths indexed
  // N-grams ending before this position are in latest_, and the token there, to see that the
  // tokens only grew since.
  size_t indexed_ = 0;
  int32_t last_indexed_token_ = 0;
  std::vector<std::unordered_map<uint64_t, int64_t>> latest_;  // [n - ngram_min]: hash -> latest start
};

// Other requests' text for prompt lookup: the prompts and outputs of the engine's finished
// sequences (llama.cpp's dynamic lookup cache), at most `capacity` tokens, the oldest dropped.
// Text a model writes for one request recurs in the next ones (a chat template's phrasing, an
// answer's formula: in SmolLM2's 64 GSM8K chat answers replayed in turn at batch 1, a lookup
// here where the sequence's own tokens have no match gave 2.07x over W4A16 where its own gave
// 1.91x, tools/ngram_corpus_sim.py). For each n-gram of lengths 1..kMaxLength, the latest
// occurrence in a document with at least one token after it. Lookups may only miss what a scan
// would find (two n-grams of one hash: the later one wins), never propose something else.
class NgramCorpus {
 public:
  static constexpr int64_t kMaxLength = 4;  // the n-gram lengths indexed: 1..kMaxLength
  explicit NgramCorpus(int64_t capacity);
  // One request's text (prompt and output); the oldest documents go once the corpus passes its
  // capacity (it keeps at least half of it). A document longer than the capacity is cut to its end.
  void add(std::span<const int32_t> text);
  // Up to max_tokens ids that followed the latest occurrence, in one document, of the longest
  // suffix of `tokens` of a length in ngram_min..min(ngram_max, kMaxLength); match is that length.
  NgramLookup lookup(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max) const;
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }  // tokens held (with separators)

 private:
  void index_from(size_t begin);
  int64_t capacity_;
  std::vector<int32_t> tokens_;  // the documents, each followed by kSeparator
  std::unordered_map<uint64_t, int64_t> latest_;  // hash of an n-gram -> where its continuation starts
};

// A sequence's lookup, as the engine drafts and its probe measures: in its own tokens (through
// `index`; null: ngram_lookup's scan, the same answer), else, where they have no match, in
// `corpus` (null: none).
NgramLookup ngram_lookup_own_then_corpus(std::span<const int32_t> tokens, int64_t max_tokens, int64_t ngram_min,
                                         int64_t ngram_max, NgramIndex* index, const NgramCorpus* corpus);

}  // namespace qspec
