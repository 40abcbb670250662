// QSpec decoding (runtime/qspec.h) on gsm-synth-llama with RTN int4 weights: a forward over
// k tokens equals k single-token forwards bit for bit in every mode; greedy QSpec equals
// greedy W4A16 for every draft mode and gamma 1..6; the committed KV cache equals plain
// W4A16 decoding's (overwrite on) and differs without overwrite; max tokens and eos
// mid-cycle; metrics bookkeeping; rejection sampling keeps the verify distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "gsm_synth_fixture.h"
#include "model/draft_skip.h"
#include "model/draft_vocab.h"
#include "model/llama.h"
#include "qspec/decode_plan.h"
#include "qspec/error.h"
#include "runtime/generate.h"
#include "runtime/qspec.h"
#include "ops/sample.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string& kModel = qspec_test::kGsmSynthModel;
const std::vector<std::string> kDraftModes = {"w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"};

struct Fixture : qspec_test::GsmSynthInt4 {
  Fixture() : GsmSynthInt4(3) {}
};

Fixture& fixture() {
  static Fixture instance;
  return instance;
}

qspec::RunMode mode(const std::string& name) {
  qspec::RunMode m = qspec::parse_run_mode(name);
  m.activations.group_size = fixture().model->auto_group_size();
  return m;
}

qspec::GenerationOptions greedy_options(int64_t max_new_tokens, std::vector<int32_t> eos = {}) {
  qspec::GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.eos_ids = eos.empty() ? fixture().tokenizer->eos_ids : eos;
  options.mode = mode("w4a16");
  return options;
}

qspec::QSpecOptions qspec_options(const std::string& draft, int64_t gamma, bool overwrite = true) {
  qspec::QSpecOptions q;
  q.draft = mode(draft);
  q.verify = mode("w4a16");
  q.gamma = gamma;
  q.overwrite_kv = overwrite;
  return q;
}

std::vector<int32_t> w4a16_greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                  std::vector<int32_t> eos = {}) {
  return qspec::generate(*fixture().model, prompt, greedy_options(max_new_tokens, eos)).ids;
}

bool rows_equal(qspec::KvCache& a, qspec::KvCache& b, int64_t layers, int64_t rows, int64_t kv_dim) {
  for (int64_t l = 0; l < layers; ++l) {
    if (std::memcmp(a.keys(l), b.keys(l), sizeof(float) * rows * kv_dim) != 0) return false;
    if (std::memcmp(a.values(l), b.values(l), sizeof(float) * rows * kv_dim) != 0) return false;
  }
  return true;
}

}  // namespace

// The premise of the verify pass: one forward over k tokens gives the logits and K/V rows of
// k single-token forwards, bit for bit, in every mode.
TEST(QSpec, BatchedForwardEqualsSequentialBitForBit) {
  const qspec::LlamaModel& model = *fixture().model;
  const auto& c = model.config();
  const std::vector<int32_t>& prompt = fixture().prompts[0];
  const std::vector<int32_t> extra = {314, 26, 473, 307, 221, 19, 21};
  for (const char* name : {"w16a16", "w4a16", "w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"}) {
    const qspec::RunMode m = mode(name);
    qspec::KvCache batched = model.new_cache(64), sequential = model.new_cache(64);
    std::vector<float> logits_batched, logits_step, all_sequential;
    model.forward(prompt, batched, logits_batched, false, m);
    model.forward(prompt, sequential, logits_step, false, m);
    model.forward(extra, batched, logits_batched, /*all_logits=*/true, m);
    for (int32_t token : extra) {
      model.forward(std::span<const int32_t>(&token, 1), sequential, logits_step, false, m);
      all_sequential.insert(all_sequential.end(), logits_step.begin(), logits_step.end());
    }
    ASSERT_EQ(logits_batched.size(), all_sequential.size());
    EXPECT_EQ(std::memcmp(logits_batched.data(), all_sequential.data(), sizeof(float) * all_sequential.size()), 0)
        << name;
    EXPECT_TRUE(rows_equal(batched, sequential, c.num_layers, batched.length(), c.kv_dim())) << name;
    // And the prompt itself: one pass equals token by token.
    qspec::KvCache one = model.new_cache(64), steps = model.new_cache(64);
    std::vector<float> a, b;
    model.forward(prompt, one, a, true, m);
    std::vector<float> b_all;
    for (int32_t token : prompt) {
      model.forward(std::span<const int32_t>(&token, 1), steps, b, false, m);
      b_all.insert(b_all.end(), b.begin(), b.end());
    }
    EXPECT_EQ(std::memcmp(a.data(), b_all.data(), sizeof(float) * a.size()), 0) << name;
  }
}

TEST(QSpec, GreedyEqualsW4A16ForEveryDraftModeAndGamma) {
  for (size_t p = 0; p < 2; ++p) {
    const std::vector<int32_t>& prompt = fixture().prompts[p];
    const std::vector<int32_t> reference = w4a16_greedy(prompt, 24);
    for (const std::string& draft : kDraftModes)
      for (int64_t gamma = 1; gamma <= 6; ++gamma) {
        const qspec::QSpecResult result =
            qspec::qspec_generate(*fixture().model, prompt, greedy_options(24), qspec_options(draft, gamma));
        EXPECT_EQ(result.ids, reference) << draft << " gamma " << gamma;
      }
  }
}

TEST(QSpec, CommittedKvEqualsW4A16DecodingWithOverwriteAndDiffersWithout) {
  const qspec::LlamaModel& model = *fixture().model;
  const auto& c = model.config();
  const std::vector<int32_t>& prompt = fixture().prompts[1];
  const int64_t max_tokens = 40;
  for (const char* draft : {"w4a4-int4", "w4a8"}) {
    for (bool overwrite : {true, false}) {
      qspec::KvCache cache = model.new_cache(static_cast<int64_t>(prompt.size()) + max_tokens);
      const qspec::QSpecResult result = qspec::qspec_generate(model, prompt, greedy_options(max_tokens),
                                                              qspec_options(draft, 4, overwrite), {}, &cache);
      ASSERT_GE(result.ids.size(), 2u);
      const int64_t committed = static_cast<int64_t>(prompt.size() + result.ids.size());
      ASSERT_EQ(cache.length(), committed - 1);
      // Plain W4A16 decoding of the same tokens, one at a time after the prompt.
      qspec::KvCache plain = model.new_cache(committed);
      std::vector<float> logits;
      model.forward(prompt, plain, logits, false, mode("w4a16"));
      for (size_t i = 0; i + 1 < result.ids.size(); ++i)
        model.forward(std::span<const int32_t>(&result.ids[i], 1), plain, logits, false, mode("w4a16"));
      ASSERT_EQ(plain.length(), committed - 1);
      const bool equal = rows_equal(cache, plain, c.num_layers, committed - 1, c.kv_dim());
      if (overwrite) EXPECT_TRUE(equal) << draft;
      else EXPECT_FALSE(equal) << draft << ": no-overwrite should keep draft-mode K/V rows";
      // The prompt rows are W4A16 either way (the prefill runs in the verify mode).
      EXPECT_TRUE(rows_equal(cache, plain, c.num_layers, static_cast<int64_t>(prompt.size()), c.kv_dim()));
      EXPECT_GT(result.metrics.accepted, 0);
    }
  }
}

TEST(QSpec, StopsAtMaxTokensMidCycle) {
  const std::vector<int32_t>& prompt = fixture().prompts[0];
  const std::vector<int32_t> reference = w4a16_greedy(prompt, 24, {-1});
  ASSERT_EQ(reference.size(), 24u);
  for (int64_t max_tokens = 0; max_tokens <= 13; ++max_tokens)
    for (int64_t gamma : {1, 3, 4, 6}) {
      const qspec::QSpecResult result = qspec::qspec_generate(
          *fixture().model, prompt, greedy_options(max_tokens, {-1}), qspec_options("w4a4-nvfp4", gamma));
      EXPECT_EQ(result.ids, std::vector<int32_t>(reference.begin(), reference.begin() + max_tokens))
          << "max " << max_tokens << " gamma " << gamma;
      EXPECT_EQ(result.finish_reason, "length");
    }
}

TEST(QSpec, StopsAtEosMidCycle) {
  const std::vector<int32_t>& prompt = fixture().prompts[2];
  const std::vector<int32_t> reference = w4a16_greedy(prompt, 30, {-1});
  // Every token of the reference as the eos id in turn: generation must stop at its first
  // occurrence, wherever that falls in a cycle.
  for (size_t stop = 0; stop < reference.size(); stop += 2) {
    const int32_t eos = reference[stop];
    const std::vector<int32_t> expected = w4a16_greedy(prompt, 30, {eos});
    for (int64_t gamma : {2, 4, 5}) {
      const qspec::QSpecResult result =
          qspec::qspec_generate(*fixture().model, prompt, greedy_options(30, {eos}), qspec_options("w4a8", gamma));
      EXPECT_EQ(result.ids, expected) << "eos " << eos << " gamma " << gamma;
      EXPECT_EQ(result.finish_reason, "eos");
      EXPECT_EQ(result.ids.back(), eos);
    }
  }
}

TEST(QSpec, MetricsAreConsistent) {
  for (const std::string& draft : kDraftModes) {
    const int64_t gamma = 5;
    const qspec::QSpecResult result = qspec::qspec_generate(*fixture().model, fixture().prompts[0],
                                                            greedy_options(50, {-1}), qspec_options(draft, gamma));
    const qspec::QSpecMetrics& m = result.metrics;
    EXPECT_EQ(result.ids.size(), 50u);
    EXPECT_EQ(m.accepted + m.rejected, m.drafted) << draft;
    ASSERT_EQ(m.accepted_histogram.size(), static_cast<size_t>(gamma + 1));
    int64_t cycles = 0, accepted = 0;
    for (size_t a = 0; a < m.accepted_histogram.size(); ++a) {
      cycles += m.accepted_histogram[a];
      accepted += static_cast<int64_t>(a) * m.accepted_histogram[a];
    }
    EXPECT_EQ(cycles, m.cycles);
    EXPECT_EQ(accepted, m.accepted);
    // Each cycle emits its accepted drafts plus one token; the first token comes from the prefill.
    EXPECT_EQ(1 + m.accepted + m.cycles, 50) << draft;
    EXPECT_LE(m.drafted, gamma * m.cycles);
    EXPECT_EQ(m.draft_steps, m.drafted);  // no eos here: one draft forward per draft token
    EXPECT_GE(m.acceptance_rate(), 0.0);
    EXPECT_LE(m.acceptance_rate(), 1.0);
    EXPECT_GT(m.acceptance_rate(), 0.3) << draft;  // a 4-bit draft of the same weights agrees often
  }
}

// Rejection sampling: with temperature > 0 the second token (drafted in w4a4-int4, then
// accepted, or replaced from norm(max(0, p - q))) must follow the W4A16 distribution
// sum_t0 p(t0) p(t1 | t0). Chi-square over 6000 fixed seeds on a tiny 96-token model.
// The rejection-sampling test with drafts in `draft_mode`, scoring only the first `vocab_subset`
// ids of a draft vocabulary table when > 0 (the even ids first, then the odd: much of each
// distribution's mass lies outside a subset of two thirds of the vocabulary, so the residual
// draws those tokens).
// With skip_layers > 0 the draft also skips the model's last layer (a table of one). With kv4 every
// pass runs on an 8-bit KV cache and the draft reads only its high nibbles (/k4).
static void expect_rejection_sampling_keeps_the_verify_distribution(const std::string& draft_mode,
                                                                     int64_t vocab_subset, int64_t skip_layers = 0,
                                                                     bool kv4 = false) {
  const qspec::KvCacheFormat kv_cache = kv4 ? qspec::KvCacheFormat::int8 : qspec::KvCacheFormat::f16;
  auto model = qspec::LlamaModel::load(std::string(QSPEC_TEST_DATA) + "/tiny/llama3-rope");
  model->quantize_weights(qspec::quant::Format::int4);
  std::vector<bool> in_subset(static_cast<size_t>(model->config().vocab_size), vocab_subset == 0);
  if (vocab_subset > 0) {
    std::vector<int32_t> ranked;
    for (int32_t parity : {0, 1})
      for (int32_t id = parity; id < model->config().vocab_size; id += 2) ranked.push_back(id);
    model->set_draft_vocab(qspec::make_draft_vocab_table(*model, ranked, static_cast<int64_t>(ranked.size()), {}, 0));
    for (int64_t j = 0; j < vocab_subset; ++j) in_subset[static_cast<size_t>(ranked[static_cast<size_t>(j)])] = true;
  }
  if (skip_layers > 0) {
    qspec::DraftSkipTable table;
    static_cast<qspec::DraftTableIdentity&>(table) = qspec::draft_table_identity(*model, {}, 0);
    table.order = {static_cast<int32_t>(model->config().num_layers - 1)};
    table.agreement = {1.0, 0.5};
    model->set_draft_skip(table);
  }
  auto make_mode = [&](const std::string& name) {
    qspec::RunMode m = qspec::parse_run_mode(name);
    m.activations.group_size = model->auto_group_size();
    return m;
  };
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 17, 42, 5, 63};
  qspec::SamplingParams sampling;
  sampling.temperature = 1.5f;
  sampling.top_k = 12;
  qspec::GenerationOptions options;
  options.max_new_tokens = 3;  // the first token, then one cycle drafting one token
  options.sampling = sampling;
  options.kv_cache = kv_cache;
  qspec::QSpecOptions q;
  q.draft = make_mode(draft_mode);
  q.draft.vocab_subset = vocab_subset;
  q.draft.skip_layers = skip_layers;
  q.draft.kv_high_nibble = kv4;
  q.verify = make_mode("w4a16");
  q.gamma = 3;

  // The exact W4A16 distribution of the second token.
  const qspec::Sampler sampler(sampling);
  std::vector<double> expected(static_cast<size_t>(vocab), 0.0);
  std::vector<float> logits;
  {
    qspec::KvCache cache = model->new_cache(16, kv_cache);
    model->forward(prompt, cache, logits, false, q.verify);
  }
  const std::vector<float> first = sampler.probabilities(logits, prompt);
  double total_variation = 0;  // how far the draft's second-token distribution is from p
  for (int32_t t0 = 0; t0 < vocab; ++t0) {
    if (first[t0] <= 0) continue;
    std::vector<int32_t> context = prompt;
    context.push_back(t0);
    qspec::KvCache cache = model->new_cache(16, kv_cache), draft_cache = model->new_cache(16, kv_cache);
    model->forward(context, cache, logits, false, q.verify);
    const std::vector<float> second = sampler.probabilities(logits, context);
    model->forward(context, draft_cache, logits, false, q.draft);
    const std::vector<float> draft_second = sampler.probabilities(logits, context);
    for (int32_t t1 = 0; t1 < vocab; ++t1) {
      // A subset draft's distribution is zero off the subset.
      if (!in_subset[static_cast<size_t>(t1)]) EXPECT_EQ(draft_second[t1], 0.0f) << t1;
      expected[t1] += static_cast<double>(first[t0]) * second[t1];
      total_variation += 0.5 * first[t0] * std::fabs(second[t1] - draft_second[t1]);
    }
  }
  EXPECT_GT(total_variation, 0.01) << "the draft should differ from the verify distribution";

  // Enough samples that the same chi-square test rejects a distribution 2 % away (checked
  // below on these very samples), so passing means something.
  const int runs = 10000;
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  int64_t rejected = 0;
  for (int run = 0; run < runs; ++run) {
    options.sampling.seed = 1000 + static_cast<uint64_t>(run);
    const qspec::QSpecResult result = qspec::qspec_generate(*model, prompt, options, q);
    ASSERT_EQ(result.ids.size(), 3u);
    ++counts[static_cast<size_t>(result.ids[1])];
    rejected += result.metrics.rejected;
  }
  EXPECT_GT(rejected, 0) << "the test never exercised the residual distribution";
  // Categories with expected count >= 5; the rest pooled.
  auto chi_square = [&](const std::vector<double>& probabilities, int& categories) {
    double chi2 = 0, pooled_expected = 0, pooled_count = 0;
    categories = 0;
    for (int64_t t = 0; t < vocab; ++t) {
      const double e = probabilities[t] * runs;
      if (e >= 5) {
        chi2 += (counts[t] - e) * (counts[t] - e) / e;
        ++categories;
      } else {
        pooled_expected += e;
        pooled_count += static_cast<double>(counts[t]);
      }
    }
    if (pooled_expected > 0) {
      chi2 += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) / pooled_expected;
      ++categories;
    }
    return chi2;
  };
  for (int64_t t = 0; t < vocab; ++t)
    if (expected[t] == 0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " has probability 0";
    }
  int categories = 0;
  const double chi2 = chi_square(expected, categories);
  const double df = categories - 1;
  // Wilson-Hilferty: the chi-square quantile at 1 - 1e-3 (z = 3.09).
  auto quantile = [](double dof) {
    const double h = 2.0 / (9.0 * dof);
    return dof * std::pow(1.0 - h + 3.09 * std::sqrt(h), 3.0);
  };
  const double critical = quantile(df);
  EXPECT_LT(chi2, critical) << "df " << df << ", rejected drafts " << rejected << " of " << runs;
  // Power: move 2 % of the probability mass from the likeliest token to the second likeliest;
  // the test must reject that distribution on the same samples.
  std::vector<double> shifted = expected;
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < vocab; ++t) order[t] = t;
  std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                    [&](int64_t a, int64_t b) { return expected[a] > expected[b]; });
  shifted[order[0]] -= 0.02;
  shifted[order[1]] += 0.02;
  int shifted_categories = 0;
  const double shifted_chi2 = chi_square(shifted, shifted_categories);
  const double shifted_critical = quantile(shifted_categories - 1);
  EXPECT_GT(shifted_chi2, shifted_critical) << "the test cannot tell a 2 % shift apart";
  std::printf("2%% shifted: chi2 %.2f (critical %.2f)\n", shifted_chi2, shifted_critical);
  std::printf("chi2 %.2f (df %.0f, critical %.2f), rejected %lld/%d, draft TV %.3f\n", chi2, df, critical,
              static_cast<long long>(rejected), runs, total_variation);
}

TEST(QSpec, RejectionSamplingKeepsTheVerifyDistribution) {
  expect_rejection_sampling_keeps_the_verify_distribution("w4a4-int4", 0);
}

// A draft that scores only a vocabulary subset (draft_vocab): its distribution is the softmax
// over the subset, zero elsewhere; tokens outside it come from the residual. Still exact, in the
// verify's own mode (the subset is the only difference) and in a low-precision one.
TEST(QSpec, RejectionSamplingKeepsTheVerifyDistributionWithAVocabularySubsetDraft) {
  auto model = qspec::LlamaModel::load(std::string(QSPEC_TEST_DATA) + "/tiny/llama3-rope");
  ASSERT_GT(model->config().vocab_size, qspec::decode_rules::kMinDraftVocab);  // a proper subset
  expect_rejection_sampling_keeps_the_verify_distribution("w4a16", qspec::decode_rules::kMinDraftVocab);
  expect_rejection_sampling_keeps_the_verify_distribution("w4a4-int4", qspec::decode_rules::kMinDraftVocab);
}

// A draft that skips a layer (draft_skip; the tiny model's last of two): its distribution is
// another model's, and its K/V rows of that layer are never written; the verify rewrites them.
// Still exact, in the verify's own mode and composed with a low-precision mode and a subset.
TEST(QSpec, RejectionSamplingKeepsTheVerifyDistributionWithALayerSkipDraft) {
  expect_rejection_sampling_keeps_the_verify_distribution("w4a16", 0, 1);
  expect_rejection_sampling_keeps_the_verify_distribution("w4a4-int4", qspec::decode_rules::kMinDraftVocab, 1);
}

// A draft that reads only the high nibbles of an 8-bit KV cache (/k4; the verify and the
// reference on the same cache at 8 bits): its distribution is another model's, its K/V rows are
// rewritten by the verify. Still exact, in the verify's own mode and composed with a
// low-precision mode, a subset and a skipped layer.
TEST(QSpec, RejectionSamplingKeepsTheVerifyDistributionWithAKv4DraftOnAnInt8Cache) {
  expect_rejection_sampling_keeps_the_verify_distribution("w4a16", 0, 0, /*kv4=*/true);
  expect_rejection_sampling_keeps_the_verify_distribution("w4a4-int4", qspec::decode_rules::kMinDraftVocab, 1,
                                                          /*kv4=*/true);
}

// Greedy acceptance from argmax ids (the GPU engine's) is accept() on the logit rows those ids
// are the argmax of: random drafts against random rows, every accepted count, and the bonus token
// when every draft is kept.
TEST(QSpec, GreedyAcceptanceFromIdsEqualsAcceptOnTheirRows) {
  std::mt19937 rng(123);
  const int64_t vocab = 11;
  qspec::SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (int trial = 0; trial < 200; ++trial) {
    const size_t drafted = 1 + rng() % 6;
    std::vector<float> rows((drafted + 1) * vocab);
    std::vector<int32_t> argmax(drafted + 1);
    for (size_t i = 0; i <= drafted; ++i) {
      for (int64_t v = 0; v < vocab; ++v) rows[i * vocab + v] = static_cast<float>(rng() % 1000) / 100.0f;
      argmax[i] = static_cast<int32_t>(std::max_element(rows.begin() + i * vocab, rows.begin() + (i + 1) * vocab) -
                                       (rows.begin() + i * vocab));
      const float top = rows[i * vocab + argmax[i]];
      rows[i * vocab + argmax[i]] = top + 1.0f;  // a unique maximum
    }
    std::vector<int32_t> drafts(drafted);
    const size_t agree = rng() % (drafted + 1);  // the first `agree` drafts are the argmax
    for (size_t i = 0; i < drafted; ++i)
      drafts[i] = i < agree ? argmax[i] : static_cast<int32_t>((argmax[i] + 1 + rng() % (vocab - 1)) % vocab);
    qspec::QSpecAcceptor acceptor(greedy);
    std::vector<int32_t> history = {1, 2, 3};
    const auto from_rows = acceptor.accept(drafts, {}, rows.data(), vocab, history);
    const auto from_ids = qspec::QSpecAcceptor::accept_greedy(drafts, argmax);
    ASSERT_EQ(from_ids.accepted, static_cast<int64_t>(agree)) << "trial " << trial;
    ASSERT_EQ(from_ids.accepted, from_rows.accepted) << "trial " << trial;
    ASSERT_EQ(from_ids.next, from_rows.next) << "trial " << trial;
  }
  const std::vector<int32_t> two = {1, 2};
  EXPECT_THROW(qspec::QSpecAcceptor::accept_greedy(two, two), qspec::Error);  // one verify id short
}

// A point-mass draft distribution may be passed as an empty row: the same draws and outcomes as
// its one-hot row, with the same seed (so deterministic drafts need no vocab-sized rows).
TEST(QSpec, EmptyDraftRowIsThePointMassOnTheDraft) {
  std::mt19937 rng(7);
  const int64_t vocab = 13;
  qspec::SamplingParams sampled;
  sampled.temperature = 0.9f;
  sampled.seed = 42;
  qspec::QSpecAcceptor with_one_hot(sampled), with_empty(sampled);
  int64_t rejections = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t drafted = 1 + rng() % 5;
    std::vector<float> rows((drafted + 1) * vocab);
    for (float& x : rows) x = static_cast<float>(rng() % 1000) / 250.0f;
    std::vector<int32_t> drafts(drafted);
    for (int32_t& d : drafts) d = static_cast<int32_t>(rng() % vocab);
    std::vector<std::vector<float>> one_hot(drafted, std::vector<float>(vocab, 0.0f)), empty(drafted);
    for (size_t i = 0; i < drafted; ++i) one_hot[i][static_cast<size_t>(drafts[i])] = 1.0f;
    std::vector<int32_t> history_a = {1, 2}, history_b = {1, 2};
    const auto a = with_one_hot.accept(drafts, one_hot, rows.data(), vocab, history_a);
    const auto b = with_empty.accept(drafts, empty, rows.data(), vocab, history_b);
    ASSERT_EQ(a.accepted, b.accepted) << "trial " << trial;
    ASSERT_EQ(a.next, b.next) << "trial " << trial;
    rejections += a.accepted < static_cast<int64_t>(drafted);
  }
  EXPECT_GT(rejections, 0);  // the residual path ran
}
