// CPU ops against straightforward float64 references on fresh random inputs, with
// poisoned outputs so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>

#include "base/dtype.h"
#include "base/thread_pool.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/quantized_linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "qspec/error.h"
#include "ops/sample.h"

namespace {

std::mt19937& rng() {
  static std::mt19937 generator(std::random_device{}());
  return generator;
}

std::vector<float> random_vector(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng());
  return v;
}

double relative_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

}  // namespace

TEST(CpuOps, LinearMatchesReferenceForBf16AndF32) {
  for (auto [tokens, n, k] : {std::tuple{1, 7, 13}, {3, 64, 256}, {17, 33, 704}, {5, 4, 8}, {2, 129, 1}}) {
    for (qspec::DType dtype : {qspec::DType::F32, qspec::DType::BF16}) {
      std::vector<float> x = random_vector(tokens * k), w_f32 = random_vector(n * k), bias = random_vector(n);
      std::vector<uint16_t> w_bf16(n * k);
      for (int i = 0; i < n * k; ++i) {
        w_bf16[i] = qspec::f32_to_bf16(w_f32[i]);
        if (dtype == qspec::DType::BF16) w_f32[i] = qspec::bf16_to_f32(w_bf16[i]);
      }
      qspec::WeightMatrix weight;
      weight.dtype = dtype;
      weight.rows = n;
      weight.cols = k;
      weight.data = dtype == qspec::DType::BF16 ? static_cast<const void*>(w_bf16.data()) : w_f32.data();
      std::vector<float> y(tokens * n, NAN);
      qspec::cpu::linear(x.data(), tokens, weight, bias.data(), y.data());
      std::vector<double> ref(tokens * n);
      for (int t = 0; t < tokens; ++t)
        for (int r = 0; r < n; ++r) {
          double sum = bias[r];
          for (int i = 0; i < k; ++i) sum += static_cast<double>(x[t * k + i]) * w_f32[r * k + i];
          ref[t * n + r] = sum;
        }
      EXPECT_LT(relative_error(y, ref), 1e-5) << tokens << "x" << n << "x" << k;
    }
  }
}

TEST(CpuOps, RmsNormMatchesReference) {
  const int rows = 5, dim = 77;
  std::vector<float> x = random_vector(rows * dim, 3.0f), w = random_vector(dim), y(rows * dim, NAN);
  qspec::cpu::rmsnorm(x.data(), w.data(), rows, dim, 1e-5, y.data());
  std::vector<double> ref(rows * dim);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * w[i];
  }
  EXPECT_LT(relative_error(y, ref), 1e-6);
}

TEST(CpuOps, RopeRotatesHalvesAndPreservesNorm) {
  const int tokens = 3, heads = 2, head_dim = 8;
  std::vector<float> x = random_vector(tokens * heads * head_dim), original = x;
  std::vector<int32_t> positions = {0, 5, 1000};
  std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  qspec::cpu::rope(x.data(), tokens, heads, head_dim, positions.data(), inv_freq.data(), 1.0f);
  std::vector<double> ref(x.size());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < head_dim / 2; ++i) {
        const int base = (t * heads + h) * head_dim;
        const double angle = static_cast<double>(positions[t]) * inv_freq[i];
        const double a = original[base + i], b = original[base + i + head_dim / 2];
        ref[base + i] = a * std::cos(angle) - b * std::sin(angle);
        ref[base + i + head_dim / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
  EXPECT_LT(relative_error(x, ref), 1e-5);
  for (int i = 0; i < head_dim; ++i) EXPECT_EQ(x[i], original[i]);  // position 0 is the identity
}

TEST(CpuOps, SiluMul) {
  std::vector<float> gate = random_vector(100, 4.0f), up = random_vector(100), out(100, NAN);
  qspec::cpu::silu_mul(gate.data(), up.data(), 100, out.data());
  std::vector<double> ref(100);
  for (int i = 0; i < 100; ++i) ref[i] = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
  EXPECT_LT(relative_error(out, ref), 1e-6);
}

// GeGLU: gelu_tanh(g) * up against PyTorch's tanh formula in float64, within a few f32 ulps of each
// value (the exp is a polynomial, not libm's), on gates from -30 to 30 and odd lengths (the SIMD
// tail); the AVX2 loop gives the portable loop's bits.
TEST(CpuOps, GeluTanhMulIsWithinUlpsOfTheTanhFormulaOnEveryPath) {
  std::vector<float> gate = random_vector(4099, 3.0f), up = random_vector(4099);
  for (int i = 0; i <= 600; ++i) gate[static_cast<size_t>(i)] = -30.0f + 0.1f * static_cast<float>(i);
  const qspec::cpu::KernelIsa saved = qspec::cpu::kernel_isa();
  std::vector<std::vector<float>> outputs;
  for (bool portable : {true, false}) {
    qspec::cpu::set_kernel_isa(portable ? qspec::cpu::KernelIsa::portable : saved);
    for (int64_t count : {int64_t{4099}, int64_t{13}, int64_t{5}}) {
      std::vector<float> out(4099, std::nanf(""));
      qspec::cpu::gelu_tanh_mul(gate.data(), up.data(), count, out.data());
      for (int64_t i = 0; i < count; ++i) {
        const double g = gate[static_cast<size_t>(i)];
        const double u = 0.7978845608028654 * (g + 0.044715 * g * g * g);
        // 0.5 g (1 + tanh(u)) written as g / (1 + exp(-2u)): equal, but without float64's own
        // cancellation in 1 + tanh(u) (tanh(-43) rounds to -1 there).
        const double want = g / (1.0 + std::exp(-2.0 * u)) * static_cast<double>(up[static_cast<size_t>(i)]);
        // A few f32 ulps of the value plus u's own f32 rounding carried through exp(-2u), which
        // scales it by 2|u|; and 1e-37 of |g up| (from gates of about -10 down, the value is below
        // that, and the kernel returns 0 once exp(-2u) passes e^88).
        const double g_up = std::abs(g * static_cast<double>(up[static_cast<size_t>(i)]));
        const double allowed = (4 + 4 * std::abs(u)) * std::abs(want) * 0x1p-23 + 1e-37 * g_up;
        ASSERT_LE(std::abs(out[static_cast<size_t>(i)] - want), allowed)
            << "gate " << g << " up " << up[static_cast<size_t>(i)] << " count " << count;
      }
      if (count == 4099) outputs.push_back(out);
    }
  }
  qspec::cpu::set_kernel_isa(saved);
  ASSERT_EQ(outputs.size(), 2u);
  for (size_t i = 0; i < outputs[0].size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(outputs[0][i]), std::bit_cast<uint32_t>(outputs[1][i])) << i;
}

// Causal GQA against a float64 reference, whole history, a sliding window, and windows with
// attention sinks (a QSpec draft's sparse view: positions < sinks stay visible).
TEST(CpuOps, GroupedQueryAttentionWithCausalityWindowAndSinks) {
  struct Case {
    int64_t window, sinks;
  };
  for (const Case c : {Case{0, 0}, Case{3, 0}, Case{3, 2}, Case{2, 5}, Case{4, 1}}) {
    qspec::cpu::AttentionShape shape{4, 2, 8, c.window};
    shape.sink_tokens = c.sinks;
    const int history = 9, tokens = 3;
    const int kv_stride = shape.num_kv_heads * shape.head_dim, q_stride = shape.num_heads * shape.head_dim;
    std::vector<float> keys = random_vector(history * kv_stride), values = random_vector(history * kv_stride);
    std::vector<float> q = random_vector(tokens * q_stride), out(tokens * q_stride, NAN);
    std::vector<int32_t> positions = {6, 7, 8};
    qspec::cpu::attention(q.data(), tokens, positions.data(), keys.data(), values.data(), shape, out.data());
    std::vector<double> ref(out.size());
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < shape.num_heads; ++h) {
        const int kvh = h / 2;
        std::vector<int> seen;  // the visible positions, by the rule written out
        for (int p = 0; p <= positions[t]; ++p)
          if (c.window == 0 || p > positions[t] - c.window || p < c.sinks) seen.push_back(p);
        ASSERT_EQ(static_cast<int64_t>(seen.size()), shape.visible_keys(positions[t]));
        std::vector<double> scores;
        double max_score = -INFINITY;
        for (int p : seen) {
          double dot = 0;
          for (int d = 0; d < 8; ++d) dot += static_cast<double>(q[t * q_stride + h * 8 + d]) * keys[p * kv_stride + kvh * 8 + d];
          scores.push_back(dot / std::sqrt(8.0));
          max_score = std::max(max_score, scores.back());
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - max_score));
        for (int d = 0; d < 8; ++d) {
          double acc = 0;
          for (size_t i = 0; i < seen.size(); ++i) acc += scores[i] / total * values[seen[i] * kv_stride + kvh * 8 + d];
          ref[t * q_stride + h * 8 + d] = acc;
        }
      }
    EXPECT_LT(relative_error(out, ref), 1e-5) << "window " << c.window << " sinks " << c.sinks;
  }
}

// Paged K/V rows (blocks of 2 in a shuffled table) give the contiguous cache's bits, with windows
// and sinks whose ranges start and end inside blocks (the rows are walked block by block).
TEST(CpuOps, PagedAttentionEqualsContiguousAttentionBitForBit) {
  struct Case {
    int64_t window, sinks;
  };
  for (const Case c : {Case{0, 0}, Case{3, 0}, Case{4, 3}, Case{5, 1}}) {
    qspec::cpu::AttentionShape shape{4, 2, 16, c.window};
    shape.sink_tokens = c.sinks;
    const int64_t history = 11, tokens = 3, block = 2, blocks = (history + block - 1) / block;
    const int64_t kv_stride = shape.num_kv_heads * shape.head_dim, q_stride = shape.num_heads * shape.head_dim;
    const std::vector<float> keys = random_vector(history * kv_stride), values = random_vector(history * kv_stride);
    const std::vector<float> q = random_vector(tokens * q_stride);
    const std::vector<int32_t> positions = {8, 9, 10};
    std::vector<float> contiguous(tokens * q_stride, NAN), paged(tokens * q_stride, NAN);
    qspec::cpu::attention(q.data(), tokens, positions.data(), keys.data(), values.data(), shape, contiguous.data());
    // Logical block b lives in pool block table[b]; the pool has one spare block.
    const std::vector<int32_t> table = {4, 0, 5, 2, 1, 3};
    ASSERT_EQ(static_cast<int64_t>(table.size()), blocks);
    std::vector<float> pool_keys((blocks + 1) * block * kv_stride, NAN), pool_values(pool_keys.size(), NAN);
    for (int64_t p = 0; p < history; ++p) {
      const int64_t row = table[p / block] * block + p % block;
      std::copy_n(keys.begin() + p * kv_stride, kv_stride, pool_keys.begin() + row * kv_stride);
      std::copy_n(values.begin() + p * kv_stride, kv_stride, pool_values.begin() + row * kv_stride);
    }
    const qspec::cpu::PagedKv kv{pool_keys.data(), pool_values.data(), table.data(), block};
    qspec::cpu::attention(q.data(), tokens, positions.data(), kv, shape, paged.data());
    for (size_t i = 0; i < paged.size(); ++i)
      ASSERT_EQ(paged[i], contiguous[i]) << "window " << c.window << " sinks " << c.sinks << " output " << i;
  }
}

// The attention's SIMD loops (keys scored four at a time, values summed in registers) give the
// portable loops' bits, at head sizes that leave every tail: not a multiple of 32, of 8.
TEST(CpuOps, AttentionSimdEqualsPortableBitForBit) {
  const qspec::cpu::KernelIsa saved = qspec::cpu::kernel_isa();
  for (int64_t head_dim : {8, 12, 32, 64, 72, 128}) {
    qspec::cpu::AttentionShape shape{6, 2, head_dim, 0};
    const int64_t history = 23, tokens = 4;  // 20..23 keys visible: not a multiple of four
    const int64_t kv_stride = shape.num_kv_heads * head_dim, q_stride = shape.num_heads * head_dim;
    const std::vector<float> keys = random_vector(history * kv_stride), values = random_vector(history * kv_stride);
    const std::vector<float> q = random_vector(tokens * q_stride);
    const std::vector<int32_t> positions = {19, 20, 21, 22};
    std::vector<float> out[2];
    for (int portable = 0; portable < 2; ++portable) {
      qspec::cpu::set_kernel_isa(portable ? qspec::cpu::KernelIsa::portable : saved);
      out[portable].assign(static_cast<size_t>(tokens * q_stride), NAN);
      qspec::cpu::attention(q.data(), tokens, positions.data(), keys.data(), values.data(), shape, out[portable].data());
    }
    qspec::cpu::set_kernel_isa(saved);
    for (size_t i = 0; i < out[0].size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[0][i])) << "head_dim " << head_dim << " output " << i;
      ASSERT_EQ(out[0][i], out[1][i]) << "head_dim " << head_dim << " output " << i;
    }
  }
}

// The f32 cache's grouped loop (a KV head's rows read once for its query heads and a block of
// tokens, chunk by chunk) gives the per-head loop's bits: groups of 1, 3 and 7, head sizes with
// every tail, contexts past one chunk of 64 rows with a partial last one, windows and sinks (blocks
// of one token), a verify-like run of 5 tokens and a 150-token prefill (blocks of 8 whose tokens
// see 1-150 rows), SIMD and portable.
TEST(CpuOps, GroupedAttentionEqualsPerHeadBitForBit) {
  const qspec::cpu::KernelIsa saved = qspec::cpu::kernel_isa();
  struct Case {
    int64_t heads, kv_heads, head_dim, window, sinks;
  };
  const int64_t history = 150;
  std::vector<int32_t> verify = {145, 146, 147, 148, 149}, prefill(history);
  for (int64_t p = 0; p < history; ++p) prefill[static_cast<size_t>(p)] = static_cast<int32_t>(p);
  for (const Case c : {Case{6, 6, 8, 0, 0}, Case{6, 2, 64, 0, 0}, Case{9, 3, 72, 0, 0}, Case{14, 2, 12, 0, 0},
                       Case{14, 2, 64, 70, 4}, Case{6, 2, 32, 100, 0}}) {
    for (const std::vector<int32_t>* positions : {&verify, &prefill}) {
      qspec::cpu::AttentionShape shape{c.heads, c.kv_heads, c.head_dim, c.window};
      shape.sink_tokens = c.sinks;
      const int64_t tokens = static_cast<int64_t>(positions->size());
      const int64_t kv_stride = c.kv_heads * c.head_dim, q_stride = c.heads * c.head_dim;
      const std::vector<float> keys = random_vector(history * kv_stride), values = random_vector(history * kv_stride);
      const std::vector<float> q = random_vector(tokens * q_stride);
      for (int portable = 0; portable < 2; ++portable) {
        qspec::cpu::set_kernel_isa(portable ? qspec::cpu::KernelIsa::portable : saved);
        std::vector<float> out[2];
        for (int grouped = 0; grouped < 2; ++grouped) {
          qspec::cpu::set_attention_loop(grouped ? qspec::cpu::AttentionLoop::grouped
                                                 : qspec::cpu::AttentionLoop::per_head);
          out[grouped].assign(static_cast<size_t>(tokens * q_stride), NAN);
          qspec::cpu::attention(q.data(), tokens, positions->data(), keys.data(), values.data(), shape,
                                out[grouped].data());
        }
        for (size_t i = 0; i < out[0].size(); ++i) {
          ASSERT_TRUE(std::isfinite(out[1][i])) << c.heads << "/" << c.kv_heads << " heads, output " << i;
          ASSERT_EQ(out[0][i], out[1][i]) << c.heads << "/" << c.kv_heads << " heads, head_dim " << c.head_dim
                                          << ", window " << c.window << ", " << tokens << " tokens, portable "
                                          << portable << ", output " << i;
        }
      }
    }
  }
  qspec::cpu::set_kernel_isa(saved);
  qspec::cpu::set_attention_loop(qspec::cpu::AttentionLoop::automatic);
}

// Mode f16's rounding (SIMD where the build has F16C) is the scalar round trip for every finite
// value: ties to even, subnormals, the largest finite f16, overflow to infinity.
TEST(CpuOps, RoundToF16IsTheScalarRoundTrip) {
  std::vector<float> x = random_vector(1000, 100.0f);
  for (float v : {0.0f, -0.0f, 1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f, 5.96e-8f, 2.98e-8f, 8.9e-8f, 6.1e-5f,
                  65504.0f, 65519.0f, 65520.0f, -70000.0f, 1e-30f, INFINITY, -INFINITY})
    x.push_back(v);
  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i) x.push_back(std::ldexp(static_cast<float>(rng() % 4096), -static_cast<int>(rng() % 40)));
  x.push_back(NAN);
  std::vector<float> rounded = x;
  qspec::cpu::round_to_f16(rounded.data(), static_cast<int64_t>(rounded.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float expected = qspec::f16_to_f32(qspec::f32_to_f16(x[i]));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(rounded[i])) << i;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), std::bit_cast<uint32_t>(expected)) << "value " << x[i];
  }
}

TEST(ThreadPool, CoversEveryIndexOnceAndPropagatesErrors) {
  qspec::ThreadPool pool(3);
  std::vector<int> hits(10007, 0);
  pool.parallel_for(hits.size(), 16, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) hits[i]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
  EXPECT_THROW(pool.parallel_for(100, 1, [](size_t begin, size_t) {
    if (begin > 50) throw std::runtime_error("boom");
  }), std::runtime_error);
}

TEST(Sampler, GreedyAndFilters) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  EXPECT_EQ(qspec::Sampler::argmax(logits), 1);  // lowest id wins a tie

  qspec::SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 2;
  auto probs = qspec::Sampler(params).probabilities(logits, {});
  EXPECT_GT(probs[1], 0);
  EXPECT_GT(probs[3], 0);
  EXPECT_EQ(probs[0] + probs[2] + probs[4], 0);
  EXPECT_NEAR(probs[1] + probs[3], 1.0, 1e-6);

  params.top_k = 0;
  params.min_p = 0.5f;  // e^2/e^3 = 0.37 < 0.5: token 2 is dropped
  probs = qspec::Sampler(params).probabilities(logits, {});
  EXPECT_EQ(probs[2], 0);
  EXPECT_GT(probs[3], 0);

  params.min_p = 0;
  params.top_p = 0.3f;  // the top token alone holds > 0.3
  probs = qspec::Sampler(params).probabilities(logits, {});
  EXPECT_NEAR(probs[1], 1.0, 1e-6);

  params = {};
  params.repetition_penalty = 4.0f;  // token 1 (3.0) becomes 0.75: token 3 wins
  EXPECT_EQ(qspec::Sampler(params).sample(logits, std::vector<int32_t>{1}), 3);
}

// OpenAI's presence / frequency penalties count the output's ids only (from output_start);
// logit_bias is added to its ids. token_logprob ignores all of them (the model's distribution).
TEST(Sampler, PresenceFrequencyPenaltiesAndLogitBias) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 2.5f, -1.0f};
  qspec::SamplingParams params;
  params.presence_penalty = 0.6f;  // token 1 (3.0) once in the output: 2.4 < 2.5
  const std::vector<int32_t> history = {1, 3, 1};  // prompt {1, 3}, output {1}
  EXPECT_EQ(qspec::Sampler(params, /*output_start=*/2).sample(logits, history), 3);
  EXPECT_EQ(qspec::Sampler(params, /*output_start=*/3).sample(logits, history), 1);  // no output yet
  params = {};
  params.frequency_penalty = 0.3f;  // token 1 twice in the output: 2.4 < 2.5; once: 2.7
  EXPECT_EQ(qspec::Sampler(params, 1).sample(logits, std::vector<int32_t>{3, 1, 1}), 3);
  EXPECT_EQ(qspec::Sampler(params, 2).sample(logits, std::vector<int32_t>{3, 1, 1}), 1);
  params = {};
  params.logit_bias = {{4, 5.0f}};  // -1 + 5 = 4: the best
  EXPECT_EQ(qspec::Sampler(params).sample(logits, {}), 4);
  params.temperature = 1.0f;
  const std::vector<float> probs = qspec::Sampler(params).probabilities(logits, {});
  EXPECT_GT(probs[4], probs[1]);
  params = {};
  params.presence_penalty = 2.5f;
  EXPECT_THROW(qspec::Sampler{params}, qspec::Error);
  params = {};
  params.logit_bias = {{1, 101.0f}};
  EXPECT_THROW(qspec::Sampler{params}, qspec::Error);

  const qspec::TokenLogprob lp = qspec::token_logprob(logits, 3, 2);
  double total = 0;
  for (float x : logits) total += std::exp(static_cast<double>(x));
  EXPECT_NEAR(lp.logprob, 2.5 - std::log(total), 1e-6);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(total), 1e-6);
  EXPECT_TRUE(qspec::token_logprob(logits, 0, 0).top.empty());
  const std::vector<float> tied = {1.0f, 2.0f, 2.0f};
  EXPECT_EQ(qspec::token_logprob(tied, 0, 1).top[0].first, 1);  // ties: the lower id
}

// sample() is next_draw() then sample_with_draw() (the split the GPU sampler uses): the same
// tokens for the same seed, and greedy tokens consume no draw.
TEST(Sampler, SampleIsNextDrawThenSampleWithDraw) {
  std::mt19937 generator(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(1000);
  qspec::SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 50;
  params.top_p = 0.9f;
  params.seed = 5;
  qspec::Sampler whole(params), split(params);
  for (int step = 0; step < 50; ++step) {
    for (float& v : logits) v = normal(generator);
    const double draw = split.next_draw();
    ASSERT_GE(draw, 0.0);
    ASSERT_LT(draw, 1.0);
    EXPECT_EQ(whole.sample(logits, {}), split.sample_with_draw(logits, {}, draw)) << step;
  }
  qspec::SamplingParams greedy;
  greedy.repetition_penalty = 2.0f;
  qspec::Sampler greedy_sampler(greedy);
  EXPECT_EQ(greedy_sampler.sample(logits, std::vector<int32_t>{3}),
            greedy_sampler.sample_with_draw(logits, std::vector<int32_t>{3}, 0.99));
}

namespace {
// The filters by their definition: a stable sort of the whole vocabulary by score, then top_k,
// the softmax at the temperature, the top_p prefix, the min_p floor (the sampler finds the same
// head without sorting everything).
std::vector<float> reference_probabilities(const std::vector<float>& scores, const qspec::SamplingParams& p) {
  const size_t vocab = scores.size();
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  size_t keep = p.top_k > 0 ? std::min<size_t>(vocab, static_cast<size_t>(p.top_k)) : vocab;
  const double top = scores[order[0]] / p.temperature;
  std::vector<double> w(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += w[i] = std::exp(scores[order[i]] / p.temperature - top);
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i)
      if ((mass += w[i] / total) >= p.top_p) {
        keep = i + 1;
        break;
      }
  }
  if (p.min_p > 0.0f) {
    size_t cut = 1;
    while (cut < keep && w[cut] >= p.min_p * w[0]) ++cut;
    keep = cut;
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[i];
  std::vector<float> probs(vocab, 0.0f);
  for (size_t i = 0; i < keep; ++i) probs[order[i]] = static_cast<float>(w[i] / kept);
  return probs;
}
}  // namespace

// The sampler's filters against their definition on large random vocabularies (ties included):
// the same support, probabilities equal to float rounding (sums run in another order).
TEST(Sampler, FastFiltersMatchTheFullSortDefinition) {
  std::mt19937 generator(5);
  for (int trial = 0; trial < 40; ++trial) {
    const size_t vocab = trial % 2 == 0 ? 32000 : 1000 + static_cast<size_t>(trial) * 37;
    std::normal_distribution<float> normal(0.0f, 1.0f + static_cast<float>(trial % 5));
    std::vector<float> logits(vocab);
    for (float& v : logits) v = std::round(normal(generator) * 8.0f) / 8.0f;  // many exact ties
    qspec::SamplingParams params;
    params.temperature = 0.3f + 0.2f * static_cast<float>(trial % 6);
    params.top_k = trial % 4 == 1 ? 1 + trial * 7 : 0;
    params.top_p = trial % 3 == 0 ? 1.0f : 0.5f + 0.1f * static_cast<float>(trial % 5);
    params.min_p = trial % 5 == 2 ? 0.05f : trial % 7 == 3 ? 0.3f : 0.0f;
    const std::vector<float> fast = qspec::Sampler(params).probabilities(logits, {});
    const std::vector<float> expected = reference_probabilities(logits, params);
    ASSERT_EQ(fast.size(), expected.size());
    for (size_t i = 0; i < vocab; ++i) {
      ASSERT_EQ(fast[i] > 0.0f, expected[i] > 0.0f) << "trial " << trial << " token " << i;
      ASSERT_NEAR(fast[i], expected[i], 1e-6f * std::max(1.0f, expected[i])) << "trial " << trial << " token " << i;
    }
  }
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  qspec::SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 42;
  qspec::Sampler a(params), b(params);
  int ones = 0;
  for (int i = 0; i < 20000; ++i) {
    int32_t token = a.sample(logits, {});
    ASSERT_EQ(token, b.sample(logits, {}));
    ones += token;
  }
  EXPECT_NEAR(ones / 20000.0, 0.75, 0.015);
}

TEST(Sampler, RejectsBadParameters) {
  qspec::SamplingParams params;
  params.top_p = 0.0f;
  EXPECT_THROW(qspec::Sampler{params}, qspec::Error);
  params = {};
  params.temperature = -1.0f;
  EXPECT_THROW(qspec::Sampler{params}, qspec::Error);
}

// Many back-to-back regions of varying chunk counts, more threads than cores: a worker late
// from one region must never take a chunk of the next (an earlier pool could, and hung).
TEST(ThreadPool, BackToBackRegionsOfVaryingSizeNeverLoseOrRepeatWork) {
  qspec::ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(64);
  for (int region = 0; region < 20000; ++region) {
    const size_t count = 1 + static_cast<size_t>(region * 7919) % 64;
    for (size_t i = 0; i < count; ++i) hits[i].store(0);
    pool.parallel_for(count, 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    });
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << "region " << region << " index " << i;
  }
}
