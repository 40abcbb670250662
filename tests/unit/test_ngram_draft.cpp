// Prompt-lookup drafts (runtime/ngram_draft.h) and QSpec with them in the engine: the matcher
// takes the longest recurring suffix's most recent earlier continuation; with sampling, the
// engine's rejection sampling against the drafts' point masses keeps the verify distribution
// (a chi-square test with the power to see a 2 % shift).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "model/llama.h"
#include "qspec/engine.h"
#include "ops/sample.h"
#include "runtime/generate.h"
#include "runtime/ngram_draft.h"

namespace {

using Ids = std::vector<int32_t>;

// The drafts of a lookup.
Ids ngram_draft(const Ids& tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max) {
  return qspec::ngram_lookup(tokens, max_tokens, ngram_min, ngram_max).tokens;
}

TEST(NgramDraft, TakesTheMostRecentContinuationOfTheLongestRecurringSuffix) {
  // Suffix [7, 8] recurs at 1 and 5 (the most recent: 5, followed by 2 9 7 8); [6, 7, 8] not.
  const Ids tokens = {4, 7, 8, 1, 3, 7, 8, 2, 9, 7, 8};
  EXPECT_EQ(ngram_draft(tokens, 3, 1, 3), (Ids{2, 9, 7}));
  EXPECT_EQ(ngram_draft(tokens, 10, 1, 3), (Ids{2, 9, 7, 8}));  // the continuation ends with the tokens
  EXPECT_EQ(ngram_draft(tokens, 0, 1, 3), Ids{});
  // A longer match wins over a more recent shorter one: [1, 2] at 0 beats [2] at 4.
  const Ids longer = {1, 2, 5, 6, 2, 9, 1, 2};
  EXPECT_EQ(ngram_draft(longer, 2, 1, 2), (Ids{5, 6}));
  EXPECT_EQ(ngram_draft(longer, 2, 1, 1), (Ids{9, 1}));  // only 1-grams: the last 2 at 4
}

// ngram_lookup also says how long a suffix it matched (the planner weighs lookups by it).
TEST(NgramDraft, LookupReportsTheMatchedSuffixLength) {
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 1, 5, 6, 7};
  const qspec::NgramLookup three = qspec::ngram_lookup(tokens, 2, 1, 3);
  EXPECT_EQ(three.match, 3);
  EXPECT_EQ(three.tokens, (std::vector<int32_t>{8, 1}));
  EXPECT_EQ(qspec::ngram_lookup(tokens, 2, 1, 2).match, 2);
  EXPECT_EQ(qspec::ngram_lookup(std::vector<int32_t>{1, 2, 3}, 2, 1, 3).match, 0);  // nothing recurs
  const qspec::NgramLookup indexed = qspec::NgramIndex().lookup(tokens, 2, 1, 3);
  EXPECT_EQ(indexed.tokens, three.tokens);
  EXPECT_EQ(indexed.match, 3);
}

TEST(NgramDraft, NothingWithoutARecurrenceOrBelowTheShortestLength) {
  EXPECT_EQ(ngram_draft(Ids{1, 2, 3, 4}, 4, 1, 3), Ids{});
  EXPECT_EQ(ngram_draft(Ids{5}, 4, 1, 3), Ids{});
  EXPECT_EQ(ngram_draft(Ids{}, 4, 1, 3), Ids{});
  const Ids tokens = {1, 2, 3, 9, 3};  // only the 1-gram [3] recurs
  EXPECT_EQ(ngram_draft(tokens, 2, 1, 3), (Ids{9, 3}));
  EXPECT_EQ(ngram_draft(tokens, 2, 2, 3), Ids{});
  // A run of one id: each position's continuation is the run again.
  EXPECT_EQ(ngram_draft(Ids{4, 4, 4, 4}, 3, 1, 3), (Ids{4}));
}

// The second token of QSpec with n-gram drafts, sampled by the engine, against the exact
// W4A16 distribution p(t1) = sum over t0 of p(t0) p(t1 | t0).
// The incremental index answers what the scan answers, lookup after lookup as a sequence grows
// (one token or a cycle's several at a time), over small and large vocabularies, every n-gram
// range and draft length; and starts again when the tokens did not just grow.
TEST(NgramDraft, IndexAnswersExactlyWhatTheScanAnswers) {
  std::mt19937 random(7);
  int64_t lookups = 0, matches = 0;
  for (int vocab : {3, 12, 1000}) {
    for (auto [ngram_min, ngram_max] : {std::pair<int64_t, int64_t>{1, 3}, {2, 4}, {1, 1}, {3, 8}}) {
      qspec::NgramIndex index;
      std::vector<int32_t> tokens;
      std::uniform_int_distribution<int32_t> id(0, vocab - 1);
      std::uniform_int_distribution<int> grow(1, 4), gamma(1, 8);
      while (tokens.size() < 600) {
        // Half the time repeat a stretch from earlier, so long matches occur.
        if (tokens.size() > 20 && random() % 2 == 0) {
          const size_t from = random() % (tokens.size() - 10);
          for (int i = grow(random); i > 0; --i) tokens.push_back(tokens[from + static_cast<size_t>(i)]);
        } else {
          for (int i = grow(random); i > 0; --i) tokens.push_back(id(random));
        }
        const int64_t max_tokens = gamma(random);
        const qspec::NgramLookup want = qspec::ngram_lookup(tokens, max_tokens, ngram_min, ngram_max);
        const qspec::NgramLookup got = index.lookup(tokens, max_tokens, ngram_min, ngram_max);
        ASSERT_EQ(got.tokens, want.tokens) << "vocab " << vocab << ", length " << tokens.size();
        ASSERT_EQ(got.match, want.match) << "vocab " << vocab << ", length " << tokens.size();
        ++lookups, matches += want.match > 0;
      }
      // Not grown: shorter, or another token where the index ended.
      tokens.resize(300);
      EXPECT_EQ(index.lookup(tokens, 4, ngram_min, ngram_max).tokens, qspec::ngram_lookup(tokens, 4, ngram_min, ngram_max).tokens);
      tokens.back() = tokens.back() + 1;
      tokens.push_back(tokens[10]);
      EXPECT_EQ(index.lookup(tokens, 4, ngram_min, ngram_max).tokens, qspec::ngram_lookup(tokens, 4, ngram_min, ngram_max).tokens);
      // Other lengths asked of the same index.
      EXPECT_EQ(index.lookup(tokens, 4, 1, 2).tokens, qspec::ngram_lookup(tokens, 4, 1, 2).tokens);
    }
  }
  EXPECT_GT(matches, lookups / 2);  // the comparison saw mostly hits, long and short
  EXPECT_TRUE(qspec::NgramIndex().lookup(std::vector<int32_t>{}, 4, 1, 3).tokens.empty());
  EXPECT_TRUE(qspec::NgramIndex().lookup(std::vector<int32_t>{5}, 4, 1, 3).tokens.empty());
}

// Other requests' text (NgramCorpus): the latest document's continuation of the longest suffix,
// never across a document's end, not past it either.
TEST(NgramCorpus, TakesTheLatestContinuationOfTheLongestSuffixWithinADocument) {
  qspec::NgramCorpus corpus(1000);
  EXPECT_TRUE(corpus.lookup(Ids{2, 3}, 4, 1, 3).tokens.empty());  // empty
  corpus.add(Ids{1, 2, 3, 4, 5});
  corpus.add(Ids{9, 2, 3, 7, 8});
  qspec::NgramLookup got = corpus.lookup(Ids{6, 6, 2, 3}, 4, 1, 3);
  EXPECT_EQ(got.tokens, (Ids{7, 8}));  // the latest [2, 3], up to its document's end
  EXPECT_EQ(got.match, 2);
  EXPECT_TRUE(got.corpus);
  got = corpus.lookup(Ids{1, 2, 3}, 4, 1, 3);
  EXPECT_EQ(got.tokens, (Ids{4, 5}));  // [1, 2, 3], longer, in the first
  EXPECT_EQ(got.match, 3);
  EXPECT_EQ(corpus.lookup(Ids{1, 2, 3}, 1, 1, 3).tokens, (Ids{4}));    // max_tokens
  EXPECT_EQ(corpus.lookup(Ids{1, 2, 3}, 4, 1, 2).tokens, (Ids{7, 8}));  // ngram_max: [2, 3], the latest
  EXPECT_TRUE(corpus.lookup(Ids{1, 2, 3}, 4, 4, 4).tokens.empty());     // ngram_min
  EXPECT_TRUE(corpus.lookup(Ids{4, 5}, 4, 1, 3).tokens.empty());        // a document's last tokens: nothing follows
  got = corpus.lookup(Ids{5, 9}, 4, 1, 3);  // [5, 9] spans two documents: only [9] matches
  EXPECT_EQ(got.tokens, (Ids{2, 3, 7, 8}));
  EXPECT_EQ(got.match, 1);
  corpus.add(Ids{4});  // too short to follow anything: ignored
  EXPECT_EQ(corpus.size(), 12);
}

// Random documents against a scan of them (latest document first, latest occurrence first).
TEST(NgramCorpus, AnswersWhatAScanOfItsDocumentsAnswers) {
  std::mt19937 random(11);
  std::vector<Ids> documents;
  qspec::NgramCorpus corpus(1 << 20);
  auto scan = [&](const Ids& tokens, int64_t max_tokens, int64_t ngram_min, int64_t ngram_max) {
    const int64_t length = static_cast<int64_t>(tokens.size());
    for (int64_t n = std::min({ngram_max, qspec::NgramCorpus::kMaxLength, length}); n >= ngram_min; --n)
      for (auto doc = documents.rbegin(); doc != documents.rend(); ++doc)
        for (int64_t start = static_cast<int64_t>(doc->size()) - n - 1; start >= 0; --start)
          if (std::equal(tokens.end() - n, tokens.end(), doc->begin() + start)) {
            const int64_t from = start + n, count = std::min<int64_t>(max_tokens, static_cast<int64_t>(doc->size()) - from);
            return qspec::NgramLookup{Ids(doc->begin() + from, doc->begin() + from + count), n, true};
          }
    return qspec::NgramLookup{};
  };
  int64_t lookups = 0, matches = 0;
  std::uniform_int_distribution<int32_t> id(0, 15);
  std::uniform_int_distribution<int> length(2, 40), gamma(1, 8);
  for (int d = 0; d < 60; ++d) {
    Ids doc(static_cast<size_t>(length(random)));
    for (int32_t& t : doc) t = id(random);
    documents.push_back(doc);
    corpus.add(doc);
    for (int q = 0; q < 20; ++q) {
      Ids tokens(static_cast<size_t>(length(random)));
      for (int32_t& t : tokens) t = id(random);
      for (auto [ngram_min, ngram_max] : {std::pair<int64_t, int64_t>{1, 3}, {2, 4}, {3, 8}}) {
        const int64_t max_tokens = gamma(random);
        const qspec::NgramLookup want = scan(tokens, max_tokens, ngram_min, ngram_max);
        const qspec::NgramLookup got = corpus.lookup(tokens, max_tokens, ngram_min, ngram_max);
        ASSERT_EQ(got.tokens, want.tokens) << "document " << d << " query " << q;
        ASSERT_EQ(got.match, want.match) << "document " << d << " query " << q;
        ++lookups, matches += want.match > 0;
      }
    }
  }
  EXPECT_GT(matches, lookups / 2);
}

// Past its capacity the corpus drops its oldest documents (whole ones) and keeps the newest.
TEST(NgramCorpus, DropsTheOldestDocumentsPastItsCapacity) {
  qspec::NgramCorpus corpus(64);
  for (int32_t d = 0; d < 40; ++d) {
    corpus.add(Ids{1000 + d, 7, 100 + d, 8});  // 5 tokens with the separator
    EXPECT_LE(corpus.size(), 64);
  }
  EXPECT_TRUE(corpus.lookup(Ids{1000}, 4, 1, 3).tokens.empty());             // long gone
  EXPECT_EQ(corpus.lookup(Ids{1039}, 4, 1, 3).tokens, (Ids{7, 139, 8}));     // the newest
  EXPECT_EQ(corpus.lookup(Ids{7}, 1, 1, 3).tokens, (Ids{139}));              // its [7], the latest
  qspec::NgramCorpus small(8);
  small.add(Ids{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});  // longer than the capacity: its end
  EXPECT_LE(small.size(), 8);
  EXPECT_EQ(small.lookup(Ids{9}, 4, 1, 3).tokens, (Ids{10, 11, 12}));
  EXPECT_TRUE(small.lookup(Ids{1}, 4, 1, 3).tokens.empty());
  qspec::NgramCorpus off(0);
  off.add(Ids{1, 2, 3});
  EXPECT_TRUE(off.lookup(Ids{1}, 4, 1, 3).tokens.empty());
}

// In the engine: a request after another with the same prompt drafts the first one's text from
// the corpus where its own tokens have no match, so more of its drafts are kept; with
// DecodePlan::ngram_corpus off it drafts as the first did. The output is W4A16's either way.
TEST(NgramDraft, EngineLooksUpEarlierRequestsText) {
  auto model = qspec::LlamaModel::load(std::string(QSPEC_TEST_DATA) + "/tiny/llama3-rope");
  model->quantize_weights(qspec::quant::Format::int4);
  const Ids prompt = {1, 17, 42, 5, 63, 9, 30};
  for (bool corpus : {true, false}) {
    qspec::Engine engine(*model, nullptr, qspec::EngineOptions{});
    std::vector<Ids> outputs;
    std::vector<int64_t> accepted;
    for (int run = 0; run < 2; ++run) {
      qspec::Request request;
      request.prompt = prompt;
      request.max_new_tokens = 40;
      request.ignore_eos = true;
      request.plan.mode = "qspec";
      request.plan.draft = "ngram";
      request.plan.gamma = 4;
      request.plan.ngram_corpus = corpus;
      Ids got;
      engine.submit(request, [&](const qspec::TokenEvent& event) {
        got.insert(got.end(), event.tokens.begin(), event.tokens.end());
        if (event.finished) accepted.push_back(event.metrics->qspec.accepted);
      });
      engine.run_until_idle();  // one after the other: the second sees the first's text
      outputs.push_back(got);
    }
    qspec::GenerationOptions greedy;
    greedy.max_new_tokens = 40;
    greedy.mode = qspec::parse_run_mode("w4a16");
    greedy.mode.activations.group_size = model->auto_group_size();
    const Ids want = qspec::generate(*model, prompt, greedy).ids;
    for (const Ids& got : outputs) EXPECT_EQ(got, want) << "corpus " << corpus;
    ASSERT_EQ(accepted.size(), 2u);
    std::printf("corpus %d: accepted %lld then %lld of 40\n", corpus ? 1 : 0, static_cast<long long>(accepted[0]),
                static_cast<long long>(accepted[1]));
    if (corpus) {
      EXPECT_GT(accepted[1], accepted[0] + 5) << "the second request should draft the first one's text";
    } else {
      EXPECT_EQ(accepted[1], accepted[0]) << "without the corpus both draft from their own tokens alone";
    }
  }
}

TEST(NgramDraft, EngineRejectionSamplingKeepsTheVerifyDistribution) {
  auto model = qspec::LlamaModel::load(std::string(QSPEC_TEST_DATA) + "/tiny/llama3-rope");
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::RunMode verify = qspec::parse_run_mode("w4a16");
  verify.activations.group_size = model->auto_group_size();
  const int64_t vocab = model->config().vocab_size;
  // The prompt is the model's own greedy text, so the continuations the drafts take from it are
  // likely under the verify distribution: drafts get accepted as well as rejected.
  qspec::GenerationOptions greedy;
  greedy.max_new_tokens = 48;
  greedy.mode = verify;
  const Ids seed = {1, 17, 42, 5, 63};
  Ids prompt = seed;
  const Ids text = qspec::generate(*model, seed, greedy).ids;
  prompt.insert(prompt.end(), text.begin(), text.end());
  qspec::SamplingParams sampling;
  sampling.temperature = 1.5f;
  sampling.top_k = 12;

  const qspec::Sampler sampler(sampling);
  std::vector<double> expected(static_cast<size_t>(vocab), 0.0);
  std::vector<float> logits;
  {
    qspec::KvCache cache = model->new_cache(static_cast<int64_t>(prompt.size()) + 4);
    model->forward(prompt, cache, logits, false, verify);
  }
  const std::vector<float> first = sampler.probabilities(logits, prompt);
  for (int32_t t0 = 0; t0 < vocab; ++t0) {
    if (first[static_cast<size_t>(t0)] <= 0) continue;
    Ids context = prompt;
    context.push_back(t0);
    qspec::KvCache cache = model->new_cache(static_cast<int64_t>(context.size()) + 4);
    model->forward(context, cache, logits, false, verify);
    const std::vector<float> second = sampler.probabilities(logits, context);
    for (int64_t t1 = 0; t1 < vocab; ++t1)
      expected[static_cast<size_t>(t1)] += static_cast<double>(first[static_cast<size_t>(t0)]) * second[static_cast<size_t>(t1)];
  }

  qspec::EngineOptions options;
  options.max_batch_size = 64;
  qspec::Engine engine(*model, nullptr, options);
  const int runs = 10000;
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  int64_t drafted = 0, rejected = 0;
  std::map<qspec::RequestId, Ids> outputs;
  for (int run = 0; run < runs; ++run) {
    qspec::Request request;
    request.prompt = prompt;
    request.max_new_tokens = 3;  // the first token, then one cycle drafting one token (as budget allows)
    request.ignore_eos = true;
    request.sampling = sampling;
    request.sampling.seed = 5000 + static_cast<uint64_t>(run);
    request.plan.mode = "qspec";
    request.plan.draft = "ngram";
    request.plan.gamma = 3;
    engine.submit(request, [&](const qspec::TokenEvent& event) {
      Ids& got = outputs[event.id];
      got.insert(got.end(), event.tokens.begin(), event.tokens.end());
      if (!event.finished) return;
      EXPECT_EQ(event.finish_reason, "length") << event.error;
      EXPECT_EQ(got.size(), 3u);
      if (got.size() >= 2) ++counts[static_cast<size_t>(got[1])];
      drafted += event.metrics->qspec.drafted;
      rejected += event.metrics->qspec.rejected;
      outputs.erase(event.id);
    });
  }
  engine.run_until_idle();
  EXPECT_GT(drafted, runs / 2) << "the draft should follow most first tokens";
  EXPECT_GT(rejected, 0) << "the test never exercised the residual distribution";
  EXPECT_LT(rejected, drafted) << "no draft was ever accepted";

  auto chi_square = [&](const std::vector<double>& probabilities, int& categories) {
    double chi2 = 0, pooled_expected = 0, pooled_count = 0;
    categories = 0;
    for (int64_t t = 0; t < vocab; ++t) {
      const double e = probabilities[static_cast<size_t>(t)] * runs;
      if (e >= 5) {
        chi2 += (counts[static_cast<size_t>(t)] - e) * (counts[static_cast<size_t>(t)] - e) / e;
        ++categories;
      } else {
        pooled_expected += e;
        pooled_count += static_cast<double>(counts[static_cast<size_t>(t)]);
      }
    }
    if (pooled_expected > 0) {
      chi2 += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) / pooled_expected;
      ++categories;
    }
    return chi2;
  };
  auto quantile = [](double dof) {  // Wilson-Hilferty, 1 - 1e-3 (z = 3.09)
    const double h = 2.0 / (9.0 * dof);
    return dof * std::pow(1.0 - h + 3.09 * std::sqrt(h), 3.0);
  };
  for (int64_t t = 0; t < vocab; ++t)
    if (expected[static_cast<size_t>(t)] == 0) {
      EXPECT_EQ(counts[static_cast<size_t>(t)], 0) << "token " << t;
    }
  int categories = 0;
  const double chi2 = chi_square(expected, categories);
  EXPECT_LT(chi2, quantile(categories - 1)) << "drafted " << drafted << ", rejected " << rejected;
  // Power: 2 % of the mass moved from the likeliest token to the second must be rejected.
  std::vector<size_t> order(static_cast<size_t>(vocab));
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                    [&](size_t a, size_t b) { return expected[a] > expected[b]; });
  std::vector<double> shifted = expected;
  shifted[order[0]] -= 0.02;
  shifted[order[1]] += 0.02;
  int shifted_categories = 0;
  const double shifted_chi2 = chi_square(shifted, shifted_categories);
  EXPECT_GT(shifted_chi2, quantile(shifted_categories - 1)) << "the test cannot tell a 2 % shift apart";
  std::printf("chi2 %.2f (df %d, critical %.2f), drafted %lld, rejected %lld of %d runs\n", chi2, categories - 1,
              quantile(categories - 1), static_cast<long long>(drafted), static_cast<long long>(rejected), runs);
}

}  // namespace
