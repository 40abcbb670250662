// QuaRot-style Hadamard rotations: the sign generator against golden values, Q against a
// dense matrix built here from its definition, orthogonality, the weight transformations, the
// full recipe on a one-layer Llama block computed densely in f64, and outlier spreading.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "qspec/error.h"
#include "quant/hadamard.h"

namespace {

using qspec::quant::HadamardRotation;
using qspec::quant::make_hadamard_rotation;

std::vector<float> random_values(std::mt19937& rng, size_t count, float stddev = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

// Q[i][j] as a dense n x n matrix from the definition: diag(s) blockdiag(H_b / sqrt(b)) with
// H_b[i][j] = (-1)^popcount(i & j), the Sylvester Hadamard matrix.
std::vector<double> dense_q(const HadamardRotation& rotation) {
  const int64_t n = rotation.n, b = rotation.block;
  std::vector<double> q(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = (i / b) * b; j < (i / b + 1) * b; ++j) {
      const int parity = std::popcount(static_cast<uint64_t>((i % b) & (j % b))) & 1;
      q[i * n + j] = rotation.signs[i] * (parity ? -1.0 : 1.0) / std::sqrt(static_cast<double>(b));
    }
  }
  return q;
}

double norm(const double* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return std::sqrt(sum);
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    ref += want[i] * want[i];
  }
  return std::sqrt(diff / ref);
}

template <typename Fn>
void expect_error_mentioning(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no qspec::Error";
  } catch (const qspec::Error& error) {
    const std::string message = error.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << message << "' lacks '" << part << "'";
  }
}

}  // namespace

TEST(HadamardRotation, BlockSizesAndSeededSigns) {
  EXPECT_EQ(qspec::quant::hadamard_block_size(576), 64);
  EXPECT_EQ(qspec::quant::hadamard_block_size(704), 64);
  EXPECT_EQ(qspec::quant::hadamard_block_size(256), 256);
  EXPECT_EQ(qspec::quant::hadamard_block_size(4096), 4096);
  EXPECT_EQ(qspec::quant::hadamard_block_size(8), 8);
  EXPECT_EQ(qspec::quant::hadamard_block_size(11008), 256);
  EXPECT_EQ(qspec::quant::hadamard_block_size(1536), 512);

  // Golden signs of the documented splitmix64 rule (computed independently in Python): a
  // change to the generator would silently break every saved rotated checkpoint.
  const std::pair<uint64_t, std::string> goldens[] = {{0, "-++-+++-+-+-----+-+----+--++---+"},
                                                     {12345, "++++-++++-++---+---+++++++++++--"},
                                                     {0xDEADBEEF, "+-+++-+-++--+--++--+--++-+-++++-"}};
  for (const auto& [seed, want] : goldens) {
    const HadamardRotation rotation = make_hadamard_rotation(32, seed);
    EXPECT_EQ(rotation.n, 32);
    EXPECT_EQ(rotation.block, 32);
    EXPECT_EQ(rotation.seed, seed);
    std::string got;
    for (float s : rotation.signs) got += s > 0 ? '+' : '-';
    EXPECT_EQ(got, want) << "seed " << seed;
  }
  // Deterministic, seed dependent, balanced, and counter based (a prefix of a longer one).
  const HadamardRotation a = make_hadamard_rotation(4096, 7), b = make_hadamard_rotation(4096, 7),
                         c = make_hadamard_rotation(4096, 8), short_a = make_hadamard_rotation(64, 7);
  EXPECT_EQ(a.signs, b.signs);
  EXPECT_NE(a.signs, c.signs);
  int positive = 0;
  for (int64_t i = 0; i < 4096; ++i) {
    ASSERT_TRUE(a.signs[i] == 1.0f || a.signs[i] == -1.0f);
    EXPECT_EQ(a.signs[i], qspec::quant::hadamard_sign(7, i));
    if (i < 64) {
      EXPECT_EQ(a.signs[i], short_a.signs[i]);
    }
    positive += a.signs[i] > 0;
  }
  EXPECT_GT(positive, 1900);
  EXPECT_LT(positive, 2196);
}

TEST(HadamardRotation, MatchesDenseProduct) {
  std::mt19937 rng(1234);
  for (int64_t n : {64, 256, 576, 704}) {
    const HadamardRotation rotation = make_hadamard_rotation(n, 42 + n);
    const std::vector<double> q = dense_q(rotation);
    // The dense Q is orthogonal (checks the definition the test builds, too).
    for (int64_t i = 0; i < n; i += 7) {
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (int64_t k = 0; k < n; ++k) dot += q[i * n + k] * q[j * n + k];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-12) << "n " << n << " (" << i << ", " << j << ")";
      }
    }
    const int64_t rows = 100;  // enough to go parallel for every n here
    const std::vector<float> x = random_values(rng, static_cast<size_t>(rows * n));
    std::vector<float> rotated = x, unrotated = x;
    qspec::quant::rotate_rows(rotation, rotated.data(), rows);
    qspec::quant::unrotate_rows(rotation, unrotated.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> want_q(n, 0.0), want_qt(n, 0.0), got_q(n), got_qt(n);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t k = 0; k < n; ++k) {
          want_q[j] += x[r * n + k] * q[k * n + j];   // (x Q)_j
          want_qt[j] += x[r * n + k] * q[j * n + k];  // (x Q^T)_j
        }
        got_q[j] = rotated[r * n + j];
        got_qt[j] = unrotated[r * n + j];
      }
      ASSERT_LT(relative_error(got_q, want_q), 1e-6) << "n " << n << " row " << r;
      ASSERT_LT(relative_error(got_qt, want_qt), 1e-6) << "n " << n << " row " << r;
    }
  }
}

TEST(HadamardRotation, OrthogonalRoundTripPreservesNorms) {
  std::mt19937 rng(99);
  for (int64_t n : {8, 64, 256, 576, 704, 2048, 4096}) {
    const HadamardRotation rotation = make_hadamard_rotation(n, 2024);
    const int64_t rows = 37;
    const std::vector<float> x = random_values(rng, static_cast<size_t>(rows * n), 3.0f, 0.5f);
    std::vector<float> y = x, z = x;
    qspec::quant::rotate_rows(rotation, y.data(), rows);
    std::vector<float> rotated = y;
    qspec::quant::unrotate_rows(rotation, y.data(), rows);
    qspec::quant::unrotate_rows(rotation, z.data(), rows);
    qspec::quant::rotate_rows(rotation, z.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<double> original(x.begin() + r * n, x.begin() + (r + 1) * n);
      const std::vector<double> back(y.begin() + r * n, y.begin() + (r + 1) * n);
      const std::vector<double> back2(z.begin() + r * n, z.begin() + (r + 1) * n);
      const std::vector<double> turned(rotated.begin() + r * n, rotated.begin() + (r + 1) * n);
      EXPECT_LT(relative_error(back, original), 1e-5) << "n " << n << " row " << r;
      EXPECT_LT(relative_error(back2, original), 1e-5) << "n " << n << " row " << r;
      EXPECT_NEAR(norm(turned.data(), n) / norm(original.data(), n), 1.0, 1e-5);
      EXPECT_GT(relative_error(turned, original), 0.5);  // it did rotate
    }
  }
  // No rows, no data: nothing to do.
  qspec::quant::rotate_rows(make_hadamard_rotation(64, 1), nullptr, 0);
}

TEST(HadamardRotation, RejectsBadWidthsAndSizes) {
  using namespace qspec::quant;
  expect_error_mentioning([] { make_hadamard_rotation(0, 1); }, {"0"});
  expect_error_mentioning([] { make_hadamard_rotation(-64, 1); }, {"-64"});
  expect_error_mentioning([] { make_hadamard_rotation(100, 1); }, {"100", "multiple of 8", "4"});
  expect_error_mentioning([] { make_hadamard_rotation(6, 1); }, {"6", "multiple of 8"});
  expect_error_mentioning([] { make_hadamard_rotation(1001, 1); }, {"1001"});

  const HadamardRotation rotation = make_hadamard_rotation(64, 1);
  std::vector<float> data(64 * 96, 1.0f), bias(96, 0.0f);
  expect_error_mentioning([&] { rotate_rows(rotation, nullptr, 3); }, {"rotate_rows", "null", "3", "64"});
  expect_error_mentioning([&] { rotate_rows(rotation, data.data(), -1); }, {"rotate_rows", "-1"});
  expect_error_mentioning([&] { unrotate_rows(rotation, nullptr, 2); }, {"unrotate_rows", "null"});
  HadamardRotation broken = rotation;
  broken.signs.resize(32);
  expect_error_mentioning([&] { rotate_rows(broken, data.data(), 1); }, {"64", "32 signs"});
  broken = rotation;
  broken.block = 48;
  expect_error_mentioning([&] { rotate_rows(broken, data.data(), 1); }, {"block 48"});
  expect_error_mentioning([&] { rotate_linear_input(rotation, data.data(), 64, 96); },
                          {"rotate_linear_input", "64 x 96", "width 64"});
  expect_error_mentioning([&] { rotate_linear_output(rotation, data.data(), 96, 64, bias.data()); },
                          {"rotate_linear_output", "96 x 64", "width 64"});
  expect_error_mentioning([&] { rotate_linear_output(rotation, nullptr, 64, 96, nullptr); },
                          {"rotate_linear_output", "null", "64 x 96"});
  expect_error_mentioning([&] { rotate_embedding(rotation, data.data(), 64, 96); },
                          {"rotate_embedding", "64 x 96", "width 64"});
  expect_error_mentioning([&] { rotate_embedding(rotation, nullptr, 10, 64); }, {"null", "10 rows"});
  expect_error_mentioning([&] { fold_norm_into_linear(nullptr, data.data(), 64, 96); },
                          {"fold_norm_into_linear", "null norm weight", "64 x 96"});
  expect_error_mentioning([&] { fold_norm_into_linear(bias.data(), nullptr, 64, 96); },
                          {"fold_norm_into_linear", "null matrix"});
  expect_error_mentioning([&] { fold_norm_into_linear(bias.data(), data.data(), -2, 96); }, {"-2 x 96"});
}

TEST(HadamardWeights, TransformationsMatchDenseAlgebra) {
  std::mt19937 rng(7);
  const int64_t n = 192, rows = 100, cols = 100;  // block 64 (3 blocks); 100 = one full strip + a tail
  const HadamardRotation rotation = make_hadamard_rotation(n, 5);
  const std::vector<double> q = dense_q(rotation);

  // fold_norm_into_linear: W diag(g).
  {
    const std::vector<float> w = random_values(rng, rows * cols), g = random_values(rng, cols, 0.5f, 1.0f);
    std::vector<float> folded = w;
    qspec::quant::fold_norm_into_linear(g.data(), folded.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(folded[r * cols + c], w[r * cols + c] * g[c]);
  }
  // rotate_linear_input: W Q, and (x Q)(W Q)^T = x W^T.
  {
    const std::vector<float> w = random_values(rng, rows * n), x = random_values(rng, 4 * n);
    std::vector<float> wq = w, xq = x;
    qspec::quant::rotate_linear_input(rotation, wq.data(), rows, n);
    qspec::quant::rotate_rows(rotation, xq.data(), 4);
    std::vector<double> got, want;
    for (int64_t t = 0; t < 4; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double y = 0.0, y_rotated = 0.0;
        for (int64_t k = 0; k < n; ++k) {
          y += static_cast<double>(x[t * n + k]) * w[r * n + k];
          y_rotated += static_cast<double>(xq[t * n + k]) * wq[r * n + k];
        }
        want.push_back(y);
        got.push_back(y_rotated);
      }
    }
    EXPECT_LT(relative_error(got, want), 1e-5);
  }
  // rotate_linear_output: Q^T W and b Q, so y' = y Q.
  {
    const std::vector<float> w = random_values(rng, n * cols), bias = random_values(rng, n);
    std::vector<float> w_out = w, bias_out = bias;
    qspec::quant::rotate_linear_output(rotation, w_out.data(), n, cols, bias_out.data());
    std::vector<double> got, want;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        double sum = 0.0;
        for (int64_t k = 0; k < n; ++k) sum += q[k * n + i] * w[k * cols + c];  // (Q^T W)[i][c]
        want.push_back(sum);
        got.push_back(w_out[i * cols + c]);
      }
    }
    EXPECT_LT(relative_error(got, want), 1e-6);
    got.clear();
    want.clear();
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < n; ++k) sum += bias[k] * q[k * n + j];
      want.push_back(sum);
      got.push_back(bias_out[j]);
    }
    EXPECT_LT(relative_error(got, want), 1e-6);
    // Without a bias, the same matrix.
    std::vector<float> w_out2 = w;
    qspec::quant::rotate_linear_output(rotation, w_out2.data(), n, cols, nullptr);
    EXPECT_EQ(w_out2, w_out);
  }
  // rotate_embedding: E Q, the same as rotate_rows.
  {
    const std::vector<float> e = random_values(rng, 50 * n);
    std::vector<float> rotated = e, expected = e;
    qspec::quant::rotate_embedding(rotation, rotated.data(), 50, n);
    qspec::quant::rotate_rows(rotation, expected.data(), 50);
    EXPECT_EQ(rotated, expected);
    EXPECT_NE(rotated, e);
  }
}

namespace {

// One Llama decoder layer plus embedding and head, all f32 weights (what the transformations
// operate on), evaluated in f64 for single tokens. Attention over one token returns each query
// head's value head, so the attention output is v expanded over the query heads (GQA).
struct TinyLlama {
  static constexpr int64_t n = 576, m = 704, heads = 9, kv_heads = 3, head_dim = 64, vocab = 97;
  static constexpr int64_t kv_dim = kv_heads * head_dim;
  static constexpr double eps = 1e-5;
  std::vector<float> embedding, attention_norm, wq, bq, wk, bk, wv, bv, wo, bo, mlp_norm, wg, bg, wu, bu, wd,
      bd, final_norm, lm_head;

  explicit TinyLlama(uint32_t seed) {
    std::mt19937 rng(seed);
    const float s_n = 1.0f / std::sqrt(static_cast<float>(n)), s_m = 1.0f / std::sqrt(static_cast<float>(m));
    embedding = random_values(rng, vocab * n);
    attention_norm = random_values(rng, n, 0.4f, 1.0f);
    wq = random_values(rng, n * n, s_n); bq = random_values(rng, n, 0.1f);
    wk = random_values(rng, kv_dim * n, s_n); bk = random_values(rng, kv_dim, 0.1f);
    wv = random_values(rng, kv_dim * n, s_n); bv = random_values(rng, kv_dim, 0.1f);
    wo = random_values(rng, n * n, s_n); bo = random_values(rng, n, 0.1f);
    mlp_norm = random_values(rng, n, 0.4f, 1.0f);
    wg = random_values(rng, m * n, s_n); bg = random_values(rng, m, 0.1f);
    wu = random_values(rng, m * n, s_n); bu = random_values(rng, m, 0.1f);
    wd = random_values(rng, n * m, s_m); bd = random_values(rng, n, 0.1f);
    final_norm = random_values(rng, n, 0.4f, 1.0f);
    lm_head = random_values(rng, vocab * n, s_n);
    // A few outlier channels in the residual stream, like real checkpoints.
    for (int64_t v = 0; v < vocab; ++v)
      for (int64_t c : {5, 77, 300}) embedding[v * n + c] *= 30.0f;
  }

  struct Outputs {
    std::vector<double> q, k, v, logits;
  };

  static std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& g) {
    double sum = 0.0;
    for (double value : x) sum += value * value;
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(x.size()) + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g[i];
    return y;
  }
  static std::vector<double> linear(const std::vector<float>& w, const std::vector<float>& b,
                                    const std::vector<double>& x) {
    const size_t k = x.size(), rows = w.size() / k;
    std::vector<double> y(rows);
    for (size_t r = 0; r < rows; ++r) {
      double sum = b.empty() ? 0.0 : b[r];
      for (size_t c = 0; c < k; ++c) sum += static_cast<double>(w[r * k + c]) * x[c];
      y[r] = sum;
    }
    return y;
  }

  // online: the rotation applied to down_proj's input at run time (null: none), in f32 by
  // rotate_rows as the engine would.
  Outputs forward(int32_t token, const HadamardRotation* online) const {
    Outputs out;
    std::vector<double> x(embedding.begin() + token * n, embedding.begin() + (token + 1) * n);
    std::vector<double> h = rmsnorm(x, attention_norm);
    out.q = linear(wq, bq, h);
    out.k = linear(wk, bk, h);
    out.v = linear(wv, bv, h);
    std::vector<double> attn(heads * head_dim);
    for (int64_t head = 0; head < heads; ++head)
      for (int64_t d = 0; d < head_dim; ++d)
        attn[head * head_dim + d] = out.v[(head / (heads / kv_heads)) * head_dim + d];
    const std::vector<double> o = linear(wo, bo, attn);
    for (int64_t i = 0; i < n; ++i) x[i] += o[i];
    h = rmsnorm(x, mlp_norm);
    const std::vector<double> gate = linear(wg, bg, h), up = linear(wu, bu, h);
    std::vector<double> act(m);
    for (int64_t i = 0; i < m; ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    if (online != nullptr) {
      std::vector<float> act32(act.begin(), act.end());
      qspec::quant::rotate_rows(*online, act32.data(), 1);
      act.assign(act32.begin(), act32.end());
    }
    const std::vector<double> down = linear(wd, bd, act);
    for (int64_t i = 0; i < n; ++i) x[i] += down[i];
    out.logits = linear(lm_head, {}, rmsnorm(x, final_norm));
    return out;
  }

  // The recipe of hadamard.h. fold = false skips step 1 (a deliberately wrong variant).
  void transform(const HadamardRotation& rotation, const HadamardRotation& online, bool fold) {
    using namespace qspec::quant;
    if (fold) {
      for (std::vector<float>* w : {&wq, &wk, &wv})
        fold_norm_into_linear(attention_norm.data(), w->data(), static_cast<int64_t>(w->size()) / n, n);
      for (std::vector<float>* w : {&wg, &wu}) fold_norm_into_linear(mlp_norm.data(), w->data(), m, n);
      fold_norm_into_linear(final_norm.data(), lm_head.data(), vocab, n);
      for (std::vector<float>* g : {&attention_norm, &mlp_norm, &final_norm}) g->assign(n, 1.0f);
    }
    rotate_embedding(rotation, embedding.data(), vocab, n);
    for (std::vector<float>* w : {&wq, &wk, &wv, &wg, &wu, &lm_head})
      rotate_linear_input(rotation, w->data(), static_cast<int64_t>(w->size()) / n, n);
    rotate_linear_output(rotation, wo.data(), n, n, bo.data());
    rotate_linear_output(rotation, wd.data(), n, m, bd.data());
    rotate_linear_input(online, wd.data(), n, m);
  }
};

}  // namespace

TEST(HadamardRecipe, OneLayerLlamaKeepsLogits) {
  const TinyLlama original(2024);
  TinyLlama rotated = original;
  const HadamardRotation q = make_hadamard_rotation(TinyLlama::n, 11), q2 = make_hadamard_rotation(TinyLlama::m, 12);
  rotated.transform(q, q2, /*fold=*/true);
  EXPECT_NE(rotated.embedding, original.embedding);
  EXPECT_NE(rotated.wd, original.wd);
  for (int32_t token : {0, 3, 50, 96}) {
    const TinyLlama::Outputs want = original.forward(token, nullptr), got = rotated.forward(token, &q2);
    EXPECT_LT(relative_error(got.q, want.q), 1e-5) << "token " << token;
    EXPECT_LT(relative_error(got.k, want.k), 1e-5) << "token " << token;
    EXPECT_LT(relative_error(got.v, want.v), 1e-5) << "token " << token;
    EXPECT_LT(relative_error(got.logits, want.logits), 1e-4) << "token " << token;
    // The check is sharp: the online rotation left out breaks it.
    EXPECT_GT(relative_error(rotated.forward(token, nullptr).logits, want.logits), 0.1) << "token " << token;
  }
}

TEST(HadamardRecipe, NormsMustBeFoldedFirst) {
  // RMSNorm(x Q) = RMSNorm(x) Q only for a norm weight of ones: rotating without folding the
  // (non-constant) norm weights changes the function.
  const TinyLlama original(2024);
  TinyLlama rotated = original;
  const HadamardRotation q = make_hadamard_rotation(TinyLlama::n, 11), q2 = make_hadamard_rotation(TinyLlama::m, 12);
  rotated.transform(q, q2, /*fold=*/false);
  for (int32_t token : {0, 50}) {
    const TinyLlama::Outputs want = original.forward(token, nullptr), got = rotated.forward(token, &q2);
    EXPECT_GT(relative_error(got.q, want.q), 0.05) << "token " << token;
    EXPECT_GT(relative_error(got.logits, want.logits), 0.05) << "token " << token;
  }
}

TEST(HadamardOutliers, RotationSpreadsOutlierChannels) {
  std::mt19937 rng(31337);
  for (int64_t n : {576, 2048}) {
    const int64_t tokens = 64;
    std::vector<float> x = random_values(rng, static_cast<size_t>(tokens * n));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c : {3, 100, 257, 500}) x[t * n + c] *= 50.0f;
    auto mean_max_over_rms = [&](const std::vector<float>& values) {
      double total = 0.0;
      for (int64_t t = 0; t < tokens; ++t) {
        double sum = 0.0, max_abs = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double v = values[t * n + i];
          sum += v * v;
          max_abs = std::max(max_abs, std::abs(v));
        }
        total += max_abs / std::sqrt(sum / static_cast<double>(n));
      }
      return total / static_cast<double>(tokens);
    };
    const double before = mean_max_over_rms(x);
    qspec::quant::rotate_rows(make_hadamard_rotation(n, 3), x.data(), tokens);
    const double after = mean_max_over_rms(x);
    EXPECT_GT(before, 8.0) << "n " << n;
    EXPECT_LT(after, 0.4 * before) << "n " << n << ": max/rms " << before << " -> " << after;
    EXPECT_LT(after, 5.0) << "n " << n;
  }
}
