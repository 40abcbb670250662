// Every CUDA op against its CPU twin (like llama.cpp's test-backend-ops): fresh random inputs
// over many shapes (odd sizes, M = 1..4096 for the GEMMs, k not a multiple of the 64-wide
// chunk, odd n), outputs poisoned with NaN (all-ones bytes) before each launch, and a test fails
// on any NaN or unwritten element. Paged attention runs over random, non-contiguous block
// tables whose unused blocks and rows hold NaN, so reading a wrong slot shows; its reference is
// cpu::attention over a contiguous gather of the same K/V.
//
// Error bounds (relative L2 error ||gpu - cpu|| / ||cpu|| against the CPU op in f32 on the same
// f16-representable inputs), per output dtype:
//   exact           embedding, add, fused residual, kv write, argmax, dequantized weights
//   f16 out  2e-3   rmsnorm, rope, silu_mul (f32 math, one f16 rounding: ~3e-4 expected)
//   f16 out  2e-3   W4A16 small-M and tiled (exact f16 weights, f32 accumulation)
//   f16 out  3e-3   W4A16 dequant + cuBLAS (weights rounded to f16 once), W16A16 f16
//   bf16 out 8e-3   W16A16 bf16 (bf16 output rounding 2^-9)
//   f16 out  4e-3   paged attention (f16 P in the prefill's P V product, f16 output)
//
// No GPU: every test FAILS (ctest label gpu; CI excludes the label).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "ops/quantized_linear.h"
#include "base/dtype.h"
#include "gemm/dpr.h"
#include "ops/w4_bitplanes.h"
#include "ops/w4a16_pack.h"
#include "ops/w8a16_pack.h"
#include "gemm/cuda/gemm_dispatch.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/kv_int8.h"
#include "ops/cuda/device_info.h"
#include "ops/cuda/ops.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "qspec/error.h"
#include "quant/quantized_linear.h"
#include "ops/sample.h"

namespace {

namespace cuda = qspec::cuda;
using f16 = uint16_t;

std::mt19937& rng() {
  static std::mt19937 generator(std::random_device{}());
  return generator;
}

// f16-representable normal values: what the GPU sees is exactly what the CPU twin sees.
std::vector<float> random_f16_values(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = qspec::f16_to_f32(qspec::f32_to_f16(normal(rng())));
  return v;
}
std::vector<f16> to_f16(const std::vector<float>& v) {
  std::vector<f16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = qspec::f32_to_f16(v[i]);
  return out;
}
std::vector<float> from_f16(const std::vector<f16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = qspec::f16_to_f32(v[i]);
  return out;
}

template <typename T>
cuda::DeviceMemory upload(const std::vector<T>& host) {
  cuda::DeviceMemory memory(std::max<size_t>(host.size() * sizeof(T), 16));
  cuda::copy_to_device(memory.get(), host.data(), host.size() * sizeof(T));
  return memory;
}
template <typename T>
std::vector<T> download(const cuda::DeviceMemory& memory, size_t count) {
  cuda::synchronize();
  std::vector<T> host(count);
  cuda::copy_to_host(host.data(), memory.get(), count * sizeof(T));
  return host;
}
// NaN in every f16 / f32 slot (all-ones bytes), -1 in int32 slots.
cuda::DeviceMemory poisoned(size_t bytes) {
  cuda::DeviceMemory memory(std::max<size_t>(bytes, 16));
  cuda::fill_bytes(memory.get(), 0xff, memory.bytes());
  return memory;
}

struct ErrorStats {
  double relative = 0, max_abs = 0;
  size_t non_finite = 0;
};
ErrorStats compare(const std::vector<float>& got, const std::vector<float>& expected) {
  ErrorStats stats;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++stats.non_finite;
      continue;
    }
    const double d = static_cast<double>(got[i]) - expected[i];
    diff += d * d;
    norm += static_cast<double>(expected[i]) * expected[i];
    stats.max_abs = std::max(stats.max_abs, std::abs(d));
  }
  stats.relative = std::sqrt(diff / std::max(norm, 1e-300));
  return stats;
}
#define EXPECT_CLOSE(got, expected, bound, what)                                                         \
  do {                                                                                                   \
    const ErrorStats stats_ = compare(got, expected);                                                    \
    EXPECT_EQ(stats_.non_finite, 0u) << what << ": NaN / inf / unwritten outputs";                       \
    EXPECT_LT(stats_.relative, bound) << what << " (max abs err " << stats_.max_abs << ")";              \
    record_error(what, stats_);                                                                          \
  } while (0)

// The worst relative error seen per test, printed at the end of each test (for the notes).
struct WorstError {
  std::string what;
  ErrorStats stats;
};
WorstError& worst() {
  static WorstError w;
  return w;
}
void record_error(const std::string& what, const ErrorStats& stats) {
  if (stats.relative >= worst().stats.relative) worst() = {what, stats};
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    worst() = {};
    // Loud failure, never a skip: a GPU test binary run without a GPU is a broken setup.
    ASSERT_GT(cuda::device_count(), 0) << "no CUDA GPU visible: the gpu-labelled tests need one";
    ASSERT_GE(cuda::compute_capability(), 80) << "needs sm_80 or newer";
  }
  void TearDown() override {
    if (!worst().what.empty())
      std::printf("  worst rel err %.3g (max abs %.3g) at %s\n", worst().stats.relative, worst().stats.max_abs,
                  worst().what.c_str());
  }
};

std::string shape_name(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

}  // namespace

// ---- elementwise ---------------------------------------------------------------------------

TEST_F(Gpu, EmbeddingGathersRowsExactly) {
  for (auto [vocab, dim, tokens] : {std::tuple{477, 256, 7}, {1000, 100, 33}, {50, 4096, 3}, {13, 7, 5}}) {
    const std::vector<f16> table = to_f16(random_f16_values(static_cast<size_t>(vocab * dim)));
    std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (int32_t& id : ids) id = pick(rng());
    ids.back() = vocab;  // out of range: a zero row
    auto d_table = upload(table);
    auto d_ids = upload(ids);
    auto d_out = poisoned(static_cast<size_t>(tokens * dim) * 2);
    cuda::embedding(d_ids.as<int32_t>(), tokens, d_table.as<f16>(), vocab, dim, d_out.as<f16>(), nullptr);
    const std::vector<f16> out = download<f16>(d_out, static_cast<size_t>(tokens * dim));
    for (int t = 0; t < tokens; ++t)
      for (int i = 0; i < dim; ++i) {
        const f16 expected = t == tokens - 1 ? 0 : table[static_cast<size_t>(ids[t] * dim + i)];
        ASSERT_EQ(out[static_cast<size_t>(t * dim + i)], expected) << shape_name({vocab, dim, tokens}) << " t " << t;
      }
  }
}

TEST_F(Gpu, RmsNormAndFusedResidualMatchCpu) {
  for (auto [rows, dim] : {std::pair{1, 64}, {3, 77}, {17, 256}, {5, 4096}, {2, 5120}, {4, 14336}}) {
    const size_t n = static_cast<size_t>(rows * dim);
    const std::vector<float> x = random_f16_values(n, 3.0f), delta = random_f16_values(n);
    std::vector<float> weight(static_cast<size_t>(dim));
    std::uniform_real_distribution<float> w(0.5f, 1.5f);
    for (float& v : weight) v = w(rng());
    auto d_x = upload(to_f16(x));
    auto d_delta = upload(to_f16(delta));
    auto d_weight = upload(weight);
    auto d_y = poisoned(n * 2);
    cuda::rmsnorm(d_x.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f, d_y.as<f16>(), nullptr);
    std::vector<float> expected(n);
    qspec::cpu::rmsnorm(x.data(), weight.data(), rows, dim, 1e-5, expected.data());
    EXPECT_CLOSE(from_f16(download<f16>(d_y, n)), expected, 2e-3, "rmsnorm " + shape_name({rows, dim}));

    // Fused: residual = f16(x + delta) exactly, y = rmsnorm(residual).
    auto d_y2 = poisoned(n * 2);
    cuda::add_rmsnorm(d_x.as<f16>(), d_delta.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f, d_y2.as<f16>(),
                      nullptr);
    std::vector<float> residual(n);
    for (size_t i = 0; i < n; ++i) residual[i] = qspec::f16_to_f32(qspec::f32_to_f16(x[i] + delta[i]));
    const std::vector<float> got_residual = from_f16(download<f16>(d_x, n));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_residual[i], residual[i]) << "residual " << i;
    qspec::cpu::rmsnorm(residual.data(), weight.data(), rows, dim, 1e-5, expected.data());
    EXPECT_CLOSE(from_f16(download<f16>(d_y2, n)), expected, 2e-3, "add_rmsnorm " + shape_name({rows, dim}));
  }
}

// The kernels that make a W4A16 GEMM's x write it in the packed k order where the GEMM reads it
// so (rmsnorm's and add_rmsnorm's y_packed, silu_mul's out_packed): the same bits as their natural
// output, permuted as gemm::w4a16_pack_x_order permutes it; shapes they cannot pack are refused.
TEST_F(Gpu, NormsAndSiluMulWriteThePackedXOrder) {
  for (auto [rows, dim] : {std::pair{1, 64}, {17, 4096}, {3, 14336}}) {
    const size_t n = static_cast<size_t>(rows * dim);
    const std::vector<f16> x = to_f16(random_f16_values(n, 3.0f)), delta = to_f16(random_f16_values(n));
    std::vector<float> weight(static_cast<size_t>(dim), 0.75f);
    auto d_weight = upload(weight);
    for (bool fused : {false, true}) {
      auto d_x = upload(x), d_x2 = upload(x), d_delta = upload(delta);
      auto d_natural = poisoned(n * 2), d_packed = poisoned(n * 2);
      if (fused) {
        cuda::add_rmsnorm(d_x.as<f16>(), d_delta.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f,
                          d_natural.as<f16>(), nullptr);
        cuda::add_rmsnorm(d_x2.as<f16>(), d_delta.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f,
                          d_packed.as<f16>(), nullptr, /*y_packed=*/true);
      } else {
        cuda::rmsnorm(d_x.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f, d_natural.as<f16>(), nullptr);
        cuda::rmsnorm(d_x.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f, d_packed.as<f16>(), nullptr, true);
      }
      const std::vector<f16> natural = download<f16>(d_natural, n);
      EXPECT_EQ(download<f16>(d_packed, n), qspec::gemm::w4a16_pack_x_order(natural.data(), rows, dim, dim))
          << (fused ? "add_rmsnorm " : "rmsnorm ") << shape_name({rows, dim});
      if (fused) EXPECT_EQ(download<f16>(d_x, n), download<f16>(d_x2, n)) << "the residual as before";
    }
    // silu_mul of a fused gate_up row, out rows wider than cols (the engine's act_stride).
    const int64_t cols = dim, out_stride = dim + 64;
    auto d_gu = upload(to_f16(random_f16_values(static_cast<size_t>(rows * 2 * cols), 2.0f)));
    auto d_natural = poisoned(static_cast<size_t>(rows * out_stride) * 2);
    auto d_packed = poisoned(static_cast<size_t>(rows * out_stride) * 2);
    cuda::silu_mul(d_gu.as<f16>(), d_gu.as<f16>() + cols, rows, cols, 2 * cols, d_natural.as<f16>(), nullptr,
                   cuda::NextKernel::w4a16_gemm, out_stride);
    cuda::silu_mul(d_gu.as<f16>(), d_gu.as<f16>() + cols, rows, cols, 2 * cols, d_packed.as<f16>(), nullptr,
                   cuda::NextKernel::w4a16_gemm, out_stride, /*out_packed=*/true);
    const std::vector<f16> natural = download<f16>(d_natural, static_cast<size_t>(rows * out_stride));
    const std::vector<f16> packed = download<f16>(d_packed, static_cast<size_t>(rows * out_stride));
    const std::vector<f16> expected = qspec::gemm::w4a16_pack_x_order(natural.data(), rows, cols, out_stride);
    for (int64_t r = 0; r < rows; ++r)  // columns past cols are not written (poison in both)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(packed[r * out_stride + c], expected[r * out_stride + c]) << "silu_mul " << r << " " << c;
  }
  auto d_x = upload(to_f16(random_f16_values(2 * 80)));
  auto d_weight = upload(std::vector<float>(80, 1.0f));
  auto d_y = poisoned(2 * 80 * 2);
  EXPECT_THROW(cuda::rmsnorm(d_x.as<f16>(), d_weight.as<float>(), 2, 80, 1e-5f, d_y.as<f16>(), nullptr, true),
               qspec::Error);  // 80 % 32 != 0
  EXPECT_THROW(cuda::rmsnorm(d_x.as<f16>(), d_weight.as<float>(), 2, 64, 1e-5f, d_x.as<f16>(), nullptr, true),
               qspec::Error);  // y aliases x
  EXPECT_THROW(cuda::silu_mul(d_x.as<f16>(), d_x.as<f16>() + 40, 2, 40, 80, d_y.as<f16>(), nullptr,
                              cuda::NextKernel::other, 0, true),
               qspec::Error);  // 40 % 32 != 0
}

TEST_F(Gpu, RopeMatchesCpuInsideStridedRows) {
  for (auto [tokens, heads, head_dim, extra, scaling] :
       {std::tuple{1, 1, 32, 0, 1.0f}, {5, 8, 64, 24, 1.0f}, {64, 4, 128, 256, 1.2f}, {3, 2, 6, 2, 1.0f}}) {
    const int64_t stride = heads * head_dim + extra;
    std::vector<float> x = random_f16_values(static_cast<size_t>(tokens * stride));
    std::vector<int32_t> positions(static_cast<size_t>(tokens));
    std::uniform_int_distribution<int32_t> pos(0, 8191);
    for (int32_t& p : positions) p = pos(rng());
    std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
    for (int i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(500000.0f, -2.0f * i / head_dim);
    auto d_x = upload(to_f16(x));
    auto d_positions = upload(positions);
    auto d_inv = upload(inv_freq);
    cuda::rope(d_x.as<f16>(), tokens, heads, head_dim, stride, d_positions.as<int32_t>(), d_inv.as<float>(), scaling,
               nullptr);
    const std::vector<float> got = from_f16(download<f16>(d_x, x.size()));
    std::vector<float> expected_heads, got_heads;
    for (int t = 0; t < tokens; ++t) {
      std::vector<float> row(x.begin() + t * stride, x.begin() + t * stride + heads * head_dim);
      qspec::cpu::rope(row.data(), 1, heads, head_dim, &positions[t], inv_freq.data(), scaling);
      expected_heads.insert(expected_heads.end(), row.begin(), row.end());
      got_heads.insert(got_heads.end(), got.begin() + t * stride, got.begin() + t * stride + heads * head_dim);
      for (int64_t i = heads * head_dim; i < stride; ++i)
        ASSERT_EQ(got[t * stride + i], x[t * stride + i]) << "rope wrote past its heads";
    }
    EXPECT_CLOSE(got_heads, expected_heads, 2e-3, "rope " + shape_name({tokens, heads, head_dim}));
  }
}

// The fused RoPE + KV write (the model's path) gives bitwise what rope then paged_kv_write give,
// on several sequences of several tokens in scattered pool blocks (both ops are checked
// against the CPU above and below); the v heads and the rest of the pool stay untouched.
TEST_F(Gpu, RopeKvWriteEqualsRopeThenKvWriteBitwise) {
  for (auto [heads, kv_heads, head_dim, vectorized] :
       {std::tuple{8, 2, 64, true}, {32, 8, 128, true}, {4, 4, 32, true}, {3, 1, 6, false}, {4, 1, 256, true}}) {
    const std::vector<int64_t> run_lengths = {1, 5, 17};
    const std::vector<int64_t> run_starts = {40, 0, 3};  // cached positions before each run
    const int64_t seqs = static_cast<int64_t>(run_lengths.size()), max_blocks = 8, kv_width = kv_heads * head_dim;
    const int64_t stride = heads * head_dim + 2 * kv_width + (vectorized ? 8 : 3);
    std::vector<int32_t> query_start{0}, positions;
    for (int64_t s = 0; s < seqs; ++s) {
      for (int64_t i = 0; i < run_lengths[s]; ++i) positions.push_back(static_cast<int32_t>(run_starts[s] + i));
      query_start.push_back(static_cast<int32_t>(positions.size()));
    }
    const int64_t tokens = static_cast<int64_t>(positions.size());
    std::vector<int32_t> tables(static_cast<size_t>(seqs * max_blocks));
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng());
    const size_t pool_halves = static_cast<size_t>(seqs * max_blocks * 16 * kv_width);
    std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
    for (int i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / head_dim);
    const std::vector<f16> qkv = to_f16(random_f16_values(static_cast<size_t>(tokens * stride)));
    auto d_tables = upload(tables);
    auto d_start = upload(query_start);
    auto d_positions = upload(positions);
    auto d_inv = upload(inv_freq);
    std::vector<f16> results[2][3];  // [separate, fused][qkv, k pool, v pool]
    for (int fused = 0; fused < 2; ++fused) {
      auto d_qkv = upload(qkv);
      auto d_k = poisoned(pool_halves * 2);
      auto d_v = poisoned(pool_halves * 2);
      cuda::PagedKv kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), max_blocks};
      cuda::QueryBatch batch{seqs, tokens, d_start.as<int32_t>(), d_positions.as<int32_t>(), 17, 57};
      f16* x = d_qkv.as<f16>();
      if (fused) {
        cuda::rope_kv_write(x, stride, heads, kv_heads, head_dim, batch, d_inv.as<float>(), 1.1f, kv, nullptr);
      } else {
        cuda::rope(x, tokens, heads + kv_heads, head_dim, stride, d_positions.as<int32_t>(), d_inv.as<float>(), 1.1f,
                   nullptr);
        cuda::paged_kv_write(x + heads * head_dim, x + heads * head_dim + kv_width, stride, batch, kv, kv_heads,
                             head_dim, nullptr);
      }
      results[fused][0] = download<f16>(d_qkv, qkv.size());
      results[fused][1] = download<f16>(d_k, pool_halves);
      results[fused][2] = download<f16>(d_v, pool_halves);
    }
    const std::string name = shape_name({heads, kv_heads, head_dim});
    for (int part = 0; part < 3; ++part) {
      ASSERT_EQ(results[0][part].size(), results[1][part].size());
      for (size_t i = 0; i < results[0][part].size(); ++i)
        ASSERT_EQ(results[1][part][i], results[0][part][i]) << name << " part " << part << " at " << i;
    }
    // v heads unchanged by the rotation; the written pool rows hold the rotated k.
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = heads * head_dim + kv_width; i < heads * head_dim + 2 * kv_width; ++i)
        ASSERT_EQ(results[1][0][t * stride + i], qkv[t * stride + i]) << name << " v changed";
    EXPECT_NE(results[1][0], qkv) << name << ": nothing was rotated";
  }
}

TEST_F(Gpu, SiluMulMatchesCpuFusedAndSeparate) {
  for (auto [rows, cols] : {std::pair{1, 8}, {3, 13}, {19, 704}, {4, 14336}, {2, 1}}) {
    for (bool fused : {true, false}) {
      const int64_t stride = fused ? 2 * cols : cols;
      const std::vector<float> gu = random_f16_values(static_cast<size_t>(rows * 2 * cols), 2.0f);
      auto d_gu = upload(to_f16(gu));
      const f16* gate = d_gu.as<f16>();
      const f16* up = fused ? gate + cols : gate + rows * cols;
      auto d_out = poisoned(static_cast<size_t>(rows * cols) * 2);
      cuda::silu_mul(gate, up, rows, cols, stride, d_out.as<f16>(), nullptr);
      std::vector<float> g(static_cast<size_t>(rows * cols)), u(g.size()), expected(g.size());
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          g[r * cols + c] = gu[fused ? r * stride + c : r * cols + c];
          u[r * cols + c] = gu[fused ? r * stride + cols + c : rows * cols + r * cols + c];
        }
      qspec::cpu::silu_mul(g.data(), u.data(), rows * cols, expected.data());
      const std::vector<f16> out = download<f16>(d_out, g.size());
      EXPECT_CLOSE(from_f16(out), expected, 2e-3, "silu_mul " + shape_name({rows, cols}) + (fused ? " fused" : ""));
      // Releasing the next kernel before the wait (the launch the engine uses before a W4A16
      // GEMM) changes the schedule only: the same bits.
      auto d_early = poisoned(static_cast<size_t>(rows * cols) * 2);
      cuda::silu_mul(gate, up, rows, cols, stride, d_early.as<f16>(), nullptr, cuda::NextKernel::w4a16_gemm);
      const std::vector<f16> early = download<f16>(d_early, g.size());
      ASSERT_EQ(std::memcmp(early.data(), out.data(), out.size() * sizeof(f16)), 0) << shape_name({rows, cols});
      // Output rows further apart (an ARC down input with its zero tail): the same values, the
      // padding untouched.
      const int64_t out_stride = cols + (cols % 8 == 0 ? 128 : 3);
      auto d_strided = poisoned(static_cast<size_t>(rows * out_stride) * 2);
      cuda::silu_mul(gate, up, rows, cols, stride, d_strided.as<f16>(), nullptr, cuda::NextKernel::other, out_stride);
      const std::vector<uint16_t> strided = download<uint16_t>(d_strided, static_cast<size_t>(rows * out_stride));
      const auto* packed = reinterpret_cast<const uint16_t*>(out.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < out_stride; ++c)
          ASSERT_EQ(strided[static_cast<size_t>(r * out_stride + c)],
                    c < cols ? packed[static_cast<size_t>(r * cols + c)] : uint16_t{0xffff})
              << "strided silu_mul " << shape_name({rows, cols}) << " row " << r << " col " << c;
    }
  }
}

// GeGLU (Gemma's MLP): gelu_tanh(gate) * up against cpu::gelu_tanh_mul, fused rows and separate
// tensors, vectorized and scalar shapes, strided output with its padding untouched.
TEST_F(Gpu, GeluTanhMulMatchesCpu) {
  for (auto [rows, cols] : {std::pair{1, 8}, {3, 13}, {19, 704}, {4, 14336}}) {
    for (bool fused : {true, false}) {
      const int64_t stride = fused ? 2 * cols : cols;
      const std::vector<float> gu = random_f16_values(static_cast<size_t>(rows * 2 * cols), 2.0f);
      auto d_gu = upload(to_f16(gu));
      const f16* gate = d_gu.as<f16>();
      const f16* up = fused ? gate + cols : gate + rows * cols;
      const int64_t out_stride = cols + (cols % 8 == 0 ? 8 : 1);
      auto d_out = poisoned(static_cast<size_t>(rows * out_stride) * 2);
      cuda::gelu_tanh_mul(gate, up, rows, cols, stride, d_out.as<f16>(), nullptr, cuda::NextKernel::other, out_stride);
      std::vector<float> g(static_cast<size_t>(rows * cols)), u(g.size()), expected(g.size()), silu(g.size());
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          g[r * cols + c] = gu[fused ? r * stride + c : r * cols + c];
          u[r * cols + c] = gu[fused ? r * stride + cols + c : rows * cols + r * cols + c];
        }
      qspec::cpu::gelu_tanh_mul(g.data(), u.data(), rows * cols, expected.data());
      const std::vector<f16> out = download<f16>(d_out, static_cast<size_t>(rows * out_stride));
      std::vector<float> got;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < out_stride; ++c) {
          if (c < cols) got.push_back(qspec::f16_to_f32(out[r * out_stride + c]));
          else ASSERT_EQ(out[r * out_stride + c], uint16_t{0xffff}) << "gelu_tanh_mul wrote its output's padding";
        }
      EXPECT_CLOSE(got, expected, 2e-3, "gelu_tanh_mul " + shape_name({rows, cols}) + (fused ? " fused" : ""));
      // Not SiLU: the activations differ by far more than the bound.
      qspec::cpu::silu_mul(g.data(), u.data(), rows * cols, silu.data());
      EXPECT_GT(compare(got, silu).relative, 2e-2) << "gelu_tanh_mul computed SwiGLU";
    }
  }
}

// Gemma's final_logit_softcapping on f16 logits against cpu::soft_cap: in place, f32 math, one
// rounding; large logits squeezed under the cap.
TEST_F(Gpu, SoftCapMatchesCpu) {
  for (int64_t count : {1, 7, 1000, 262144 + 3}) {
    for (float cap : {30.0f, 5.0f}) {
      std::vector<float> x = random_f16_values(static_cast<size_t>(count), 20.0f);
      auto d_x = upload(to_f16(x));
      cuda::soft_cap(d_x.as<f16>(), count, cap, nullptr);
      const std::vector<float> got = from_f16(download<f16>(d_x, x.size()));
      qspec::cpu::soft_cap(x.data(), count, cap);
      EXPECT_CLOSE(got, x, 2e-3, "soft_cap " + std::to_string(count) + " cap " + std::to_string(cap));
      for (float v : got) ASSERT_LE(std::fabs(v), cap) << "soft_cap left a logit above the cap";
    }
  }
  EXPECT_THROW(cuda::soft_cap(nullptr, 4, 0.0f, nullptr), qspec::Error);
}

TEST_F(Gpu, AddIsExactF16OfTheF32Sum) {
  for (int64_t count : {1, 7, 8, 1000, 4099, 1 << 20}) {
    const std::vector<float> a = random_f16_values(static_cast<size_t>(count)), b = random_f16_values(a.size());
    auto d_a = upload(to_f16(a));
    auto d_b = upload(to_f16(b));
    auto d_out = poisoned(a.size() * 2);
    cuda::add(d_a.as<f16>(), d_b.as<f16>(), count, d_out.as<f16>(), nullptr);
    const std::vector<f16> out = download<f16>(d_out, a.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], qspec::f32_to_f16(a[i] + b[i])) << count << " at " << i;
    cuda::add(d_a.as<f16>(), d_b.as<f16>(), count, d_a.as<f16>(), nullptr);  // in place
    const std::vector<f16> in_place = download<f16>(d_a, a.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(in_place[i], out[i]);
  }
}

// The draft chain's input update against its CPU statement on random inputs: ids and the chain
// row take out_ids, positions and context lengths advance by one; without `advance` only the
// chain row is written; nothing past `runs` is touched.
TEST_F(Gpu, AdvanceDecodeInputsFeedsEachRunItsOwnId) {
  std::mt19937 rng(31);
  std::uniform_int_distribution<int32_t> value(0, 1 << 20);
  for (int64_t runs : {1, 7, 300}) {
    for (bool advance : {true, false}) {
      const int64_t n = runs + 5;  // 5 sentinels past the runs
      std::vector<int32_t> out(n), ids(n), positions(n), lens(n), chain(n, -1);
      for (auto* v : {&out, &ids, &positions, &lens})
        for (int32_t& x : *v) x = value(rng);
      auto d_out = upload(out), d_ids = upload(ids), d_pos = upload(positions), d_lens = upload(lens), d_chain = upload(chain);
      cuda::advance_decode_inputs(d_out.as<int32_t>(), runs, d_ids.as<int32_t>(), d_pos.as<int32_t>(),
                                  d_lens.as<int32_t>(), d_chain.as<int32_t>(), advance, nullptr);
      const size_t count = static_cast<size_t>(n);
      const auto got_ids = download<int32_t>(d_ids, count), got_pos = download<int32_t>(d_pos, count),
                 got_lens = download<int32_t>(d_lens, count), got_chain = download<int32_t>(d_chain, count);
      for (int64_t r = 0; r < n; ++r) {
        const bool in = r < runs;
        ASSERT_EQ(got_chain[r], in ? out[r] : -1) << r;
        ASSERT_EQ(got_ids[r], in && advance ? out[r] : ids[r]) << r;
        ASSERT_EQ(got_pos[r], in && advance ? positions[r] + 1 : positions[r]) << r;
        ASSERT_EQ(got_lens[r], in && advance ? lens[r] + 1 : lens[r]) << r;
      }
    }
  }
}

TEST_F(Gpu, ArgmaxPicksTheLowestIdOnTies) {
  for (auto [rows, vocab] : {std::pair{1, 1}, {4, 477}, {3, 128256}, {2, 32000}}) {
    std::vector<float> logits = random_f16_values(static_cast<size_t>(rows * vocab), 4.0f);
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    for (int r = 0; r < rows; ++r) {
      // Plant a tie at the maximum between two random ids.
      float* row = logits.data() + static_cast<size_t>(r) * vocab;
      const float top = *std::max_element(row, row + vocab) + 1.0f;
      const int a = pick(rng()), b = pick(rng());
      row[a] = top;
      row[b] = top;
    }
    auto d_f32 = upload(logits);
    auto d_f16 = upload(to_f16(logits));
    auto d_ids = poisoned(static_cast<size_t>(rows) * 4);
    auto d_ids16 = poisoned(static_cast<size_t>(rows) * 4);
    cuda::argmax_f32(d_f32.as<float>(), rows, vocab, d_ids.as<int32_t>(), nullptr);
    cuda::argmax_f16(d_f16.as<f16>(), rows, vocab, d_ids16.as<int32_t>(), nullptr);
    const std::vector<int32_t> ids = download<int32_t>(d_ids, static_cast<size_t>(rows));
    const std::vector<int32_t> ids16 = download<int32_t>(d_ids16, static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, static_cast<size_t>(vocab));
      EXPECT_EQ(ids[r], qspec::Sampler::argmax(row)) << shape_name({rows, vocab}) << " row " << r;
      EXPECT_EQ(ids16[r], qspec::Sampler::argmax(row)) << "f16 " << shape_name({rows, vocab}) << " row " << r;
    }
  }
}

// A draft's vocabulary-subset logits scattered to whole rows (QSpec draft_vocab) against the CPU
// twin on the same f16 values: exact (a copy and a fill), every entry of every row, with ids in
// a random order (a frequency ranking is no order of ids); and the argmax of the scattered rows
// is the subset's argmax mapped back to its id.
TEST_F(Gpu, ScatterSubsetLogitsEqualsItsCpuTwin) {
  for (auto [rows, n, vocab] : {std::tuple{1, 64, 477}, {5, 477, 477}, {17, 4096, 49152}, {3, 16384, 128256}}) {
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    ids.resize(static_cast<size_t>(n));
    const std::vector<float> subset = random_f16_values(static_cast<size_t>(rows * n), 4.0f);
    std::vector<float> want(static_cast<size_t>(rows * vocab));
    qspec::cpu::scatter_subset_logits(subset.data(), rows, n, ids.data(), vocab, want.data());
    auto d_subset = upload(to_f16(subset));
    auto d_ids = upload(ids);
    auto d_out = poisoned(static_cast<size_t>(rows * vocab) * 2);
    auto d_argmax = poisoned(static_cast<size_t>(rows) * 4);
    cuda::scatter_subset_logits(d_subset.as<f16>(), rows, n, d_ids.as<int32_t>(), vocab, d_out.as<f16>(), nullptr);
    cuda::argmax_f16(d_out.as<f16>(), rows, vocab, d_argmax.as<int32_t>(), nullptr);
    const std::vector<float> got = from_f16(download<f16>(d_out, static_cast<size_t>(rows * vocab)));
    const std::vector<int32_t> argmax = download<int32_t>(d_argmax, static_cast<size_t>(rows));
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += got[i] != want[i];
    EXPECT_EQ(differing, 0u) << shape_name({rows, n, vocab});
    for (int r = 0; r < rows; ++r) {
      const float* row = subset.data() + static_cast<size_t>(r) * n;
      const int64_t best = std::max_element(row, row + n) - row;  // first maximum: a tie goes to the lower id below
      int32_t mapped = ids[static_cast<size_t>(best)];
      for (int64_t j = 0; j < n; ++j)
        if (row[j] == row[best]) mapped = std::min(mapped, ids[static_cast<size_t>(j)]);
      EXPECT_EQ(argmax[r], mapped) << shape_name({rows, n, vocab}) << " row " << r;
    }
  }
}

// The GPU sampler against its CPU twin, Sampler::sample_with_draw, on the same f16 rows, draws and
// histories: every filter (temperature, top_k, top_p, min_p, repetition penalty, alone and
// together), odd and full vocabularies (16-byte loads and scalar ones), rows with many exact ties
// (the filters' tie order is lowest id first), peaked and flat rows. The two sum masses
// differently (fixed point on the GPU, double on the CPU, the CPU's probabilities rounded to
// float), so a token may differ only where the draw lies within 1e-6 of the boundary between
// the two tokens' cumulative intervals; such rows are counted and must stay rare. A NaN row gives
// -1 (the CPU sampler throws), and a second launch draws the same ids.
TEST_F(Gpu, SampleLogitsMatchesTheCpuSampler) {
  auto params_of = [](float temperature, int top_k, float top_p, float min_p, float penalty) {
    qspec::SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = penalty;
    return p;
  };
  for (int vocab : {477, 32000, 50257, 128256}) {
    const std::vector<qspec::SamplingParams> cases = {
        params_of(0.0f, 0, 1.0f, 0.0f, 1.0f),       params_of(0.0f, 0, 1.0f, 0.0f, 1.3f),
        params_of(1.0f, 0, 1.0f, 0.0f, 1.0f),       params_of(0.7f, 0, 1.0f, 0.05f, 1.0f),
        params_of(1.0f, 1, 1.0f, 0.0f, 1.0f),       params_of(0.8f, 40, 1.0f, 0.0f, 1.0f),
        params_of(1.5f, 1000, 1.0f, 0.0f, 1.0f),    params_of(1.0f, vocab + 5, 1.0f, 0.0f, 1.0f),
        params_of(1.0f, 0, 0.9f, 0.0f, 1.0f),       params_of(0.6f, 0, 0.5f, 0.0f, 1.0f),
        params_of(0.7f, 50, 0.95f, 0.0f, 1.0f),     params_of(1.0f, 40, 0.9f, 0.02f, 1.2f),
        params_of(2.0f, 0, 0.99f, 0.0f, 0.8f),      params_of(0.3f, 7, 0.8f, 0.1f, 1.1f),
    };
    enum class Shape { normal, ties, peaked };
    struct RowCase {
      size_t params;
      Shape shape;
    };
    std::vector<RowCase> row_cases;
    for (size_t c = 0; c < cases.size(); ++c)
      for (Shape shape : {Shape::normal, Shape::ties, Shape::peaked})
        for (int repeat = 0; repeat < 2; ++repeat) row_cases.push_back({c, shape});
    const int rows = static_cast<int>(row_cases.size()) + 2;  // + a NaN row sampled and one taken greedily
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::vector<std::vector<int32_t>> histories(static_cast<size_t>(rows));
    std::vector<cuda::SampleRowParams> device_params(static_cast<size_t>(rows));
    std::vector<int32_t> penalty_ids;
    std::uniform_int_distribution<int> any_id(0, vocab - 1), tie_level(-6, 6);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int r = 0; r < rows; ++r) {
      float* row = logits.data() + static_cast<size_t>(r) * vocab;
      const Shape shape = r < static_cast<int>(row_cases.size()) ? row_cases[static_cast<size_t>(r)].shape : Shape::normal;
      if (shape == Shape::ties) {
        for (int i = 0; i < vocab; ++i) row[i] = 0.5f * static_cast<float>(tie_level(rng()));
      } else {
        const std::vector<float> values = random_f16_values(static_cast<size_t>(vocab), 3.0f);
        std::copy(values.begin(), values.end(), row);
        if (shape == Shape::peaked) row[any_id(rng())] = 14.0f;
      }
      // The history: random ids, repeats, and the row's top ids (so the penalty changes the order).
      std::vector<int32_t>& history = histories[static_cast<size_t>(r)];
      for (int i = 0; i < 24; ++i) history.push_back(any_id(rng()));
      history.push_back(history[3]);
      history.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      cuda::SampleRowParams& p = device_params[static_cast<size_t>(r)];
      const qspec::SamplingParams sp = r < static_cast<int>(row_cases.size())
                                           ? cases[row_cases[static_cast<size_t>(r)].params]
                                           : params_of(r == rows - 2 ? 1.0f : 0.0f, 0, 0.9f, 0.0f, 1.0f);
      if (r >= static_cast<int>(row_cases.size()))  // not id 0: the CPU's argmax is 0 when row[0] is NaN
        row[1 + any_id(rng()) % (vocab - 1)] = std::numeric_limits<float>::quiet_NaN();
      p.row = r;
      p.temperature = sp.temperature;
      p.top_k = sp.top_k;
      p.top_p = sp.top_p;
      p.min_p = sp.min_p;
      p.repetition_penalty = sp.repetition_penalty;
      p.draw = uniform(rng());
      std::vector<int32_t> distinct = history;
      std::sort(distinct.begin(), distinct.end());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      p.penalty_offset = static_cast<int32_t>(penalty_ids.size());
      p.penalty_count = sp.repetition_penalty != 1.0f ? static_cast<int32_t>(distinct.size()) : 0;
      if (p.penalty_count > 0) penalty_ids.insert(penalty_ids.end(), distinct.begin(), distinct.end());
    }
    auto d_logits = upload(to_f16(logits));
    auto d_params = upload(device_params);
    auto d_penalty = upload(penalty_ids);
    std::vector<std::vector<int32_t>> runs;
    for (int launch = 0; launch < 2; ++launch) {
      auto d_ids = poisoned(static_cast<size_t>(rows) * 4);
      cuda::fill_bytes(d_ids.get(), 0x7f, static_cast<size_t>(rows) * 4);  // an id no vocabulary has
      cuda::sample_logits_f16(d_logits.as<f16>(), vocab, d_params.as<cuda::SampleRowParams>(), rows,
                              d_penalty.as<int32_t>(), d_ids.as<int32_t>(), nullptr);
      cuda::synchronize();
      runs.push_back(download<int32_t>(d_ids, static_cast<size_t>(rows)));
    }
    EXPECT_EQ(runs[0], runs[1]) << "vocab " << vocab << ": a second launch drew other ids";
    const std::vector<int32_t>& ids = runs[0];
    int near_boundary = 0;
    for (int r = 0; r < static_cast<int>(row_cases.size()); ++r) {
      const cuda::SampleRowParams& p = device_params[static_cast<size_t>(r)];
      const qspec::SamplingParams& sp = cases[row_cases[static_cast<size_t>(r)].params];
      const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, static_cast<size_t>(vocab));
      const qspec::Sampler sampler(sp);
      const int32_t expected = sampler.sample_with_draw(row, histories[static_cast<size_t>(r)], p.draw);
      const std::string where = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " (case " +
                                std::to_string(row_cases[static_cast<size_t>(r)].params) + ", shape " +
                                std::to_string(static_cast<int>(row_cases[static_cast<size_t>(r)].shape)) + ")";
      ASSERT_GE(ids[static_cast<size_t>(r)], 0) << where;
      ASSERT_LT(ids[static_cast<size_t>(r)], vocab) << where;
      if (ids[static_cast<size_t>(r)] == expected) continue;
      ASSERT_FALSE(sp.greedy()) << where << ": greedy picks differ, " << ids[static_cast<size_t>(r)] << " vs " << expected;
      // Only a draw on the boundary between the two picks' cumulative intervals may differ.
      const std::vector<float> probs = sampler.probabilities(row, histories[static_cast<size_t>(r)]);
      const int32_t got = ids[static_cast<size_t>(r)];
      ASSERT_GT(probs[static_cast<size_t>(got)], 0.0f) << where << ": the GPU picked " << got << ", which the CPU filters out";
      double before = 0;
      for (int32_t i = 0; i < got; ++i) before += probs[static_cast<size_t>(i)];
      const double after = before + probs[static_cast<size_t>(got)];
      EXPECT_TRUE(std::abs(p.draw - before) < 1e-6 || std::abs(p.draw - after) < 1e-6)
          << where << ": draw " << p.draw << " picks " << expected << " on the CPU, " << got << " on the GPU, whose interval is ["
          << before << ", " << after << ")";
      ++near_boundary;
    }
    EXPECT_LE(near_boundary, 2) << "vocab " << vocab;
    EXPECT_EQ(ids[static_cast<size_t>(rows - 2)], -1) << "vocab " << vocab << ": a sampled NaN row";
    const std::span<const float> greedy_row(logits.data() + static_cast<size_t>(rows - 1) * vocab,
                                            static_cast<size_t>(vocab));
    EXPECT_EQ(ids[static_cast<size_t>(rows - 1)], qspec::Sampler::argmax(greedy_row)) << "vocab " << vocab << ": greedy with a NaN";
  }
}

// ---- paged attention -----------------------------------------------------------------------

namespace {

constexpr f16 kNaN16 = 0x7e00;

// A layer's paged K/V pool on the host: sequences' rows in randomly chosen blocks, every other
// row NaN. The device copy is uploaded once; `keys` / `values` hold each sequence's contiguous
// K/V (f32 of the f16 values) for the CPU reference.
struct PagedFixture {
  int64_t kv_width = 0, num_blocks = 0, max_blocks = 0;
  std::vector<int32_t> block_tables;
  std::vector<f16> k_pool, v_pool;
  std::vector<std::vector<float>> keys, values;

  PagedFixture(const std::vector<int64_t>& contexts, int64_t kv_heads, int64_t head_dim) {
    kv_width = kv_heads * head_dim;
    int64_t used = 0;
    for (int64_t c : contexts) {
      used += (c + 15) / 16;
      max_blocks = std::max(max_blocks, (c + 15) / 16);
    }
    max_blocks += 1;  // one more column, pointing at a NaN block
    num_blocks = used + 3;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    const int32_t nan_block = ids.back();
    block_tables.assign(static_cast<size_t>(contexts.size() * max_blocks), nan_block);
    k_pool.assign(static_cast<size_t>(num_blocks * 16 * kv_width), kNaN16);
    v_pool = k_pool;
    size_t next = 0;
    for (size_t s = 0; s < contexts.size(); ++s) {
      for (int64_t b = 0; b < (contexts[s] + 15) / 16; ++b) block_tables[s * max_blocks + b] = ids[next++];
      keys.push_back(random_f16_values(static_cast<size_t>(contexts[s] * kv_width)));
      values.push_back(random_f16_values(static_cast<size_t>(contexts[s] * kv_width)));
      for (int64_t p = 0; p < contexts[s]; ++p) {
        const int64_t slot = static_cast<int64_t>(block_tables[s * max_blocks + p / 16]) * 16 + p % 16;
        for (int64_t i = 0; i < kv_width; ++i) {
          k_pool[slot * kv_width + i] = qspec::f32_to_f16(keys[s][p * kv_width + i]);
          v_pool[slot * kv_width + i] = qspec::f32_to_f16(values[s][p * kv_width + i]);
        }
      }
    }
  }
};

struct AttentionCase {
  int64_t heads, kv_heads, head_dim, window;
  int64_t sinks = 0;  // with a window: a QSpec draft's sparse view (attention sinks + window)
  float scale = 0.0f;  // what q.k is multiplied by (0: 1 / sqrt(head_dim); Gemma's query_pre_attn_scalar)
  qspec::cpu::AttentionShape shape() const {
    qspec::cpu::AttentionShape s{heads, kv_heads, head_dim, window};
    s.sink_tokens = sinks;
    s.scale = scale;
    return s;
  }
};
std::string case_name(const AttentionCase& c) {
  return "H" + std::to_string(c.heads) + " KV" + std::to_string(c.kv_heads) + " D" + std::to_string(c.head_dim) +
         (c.window ? " W" + std::to_string(c.window) : "") + (c.sinks ? " S" + std::to_string(c.sinks) : "") +
         (c.scale > 0 ? " scale " + std::to_string(c.scale) : "");
}

}  // namespace

TEST_F(Gpu, PagedDecodeMatchesCpuAttention) {
  const std::vector<AttentionCase> cases = {{8, 4, 32, 0},   {32, 8, 128, 0},       {12, 12, 64, 0},
                                            {28, 4, 128, 0},  {14, 2, 64, 0},        {9, 3, 64, 0},
                                            {16, 1, 128, 0},  {32, 8, 128, 100},     {8, 8, 32, 4096},
                                            {32, 8, 128, 256, 16}, {32, 8, 128, 100, 20}, {12, 12, 64, 64, 4},
                                            {8, 4, 32, 200, 7},
                                            // Gemma 3: query_pre_attn_scalar^-1/2, a sliding layer's window
                                            {8, 4, 64, 0, 0, 0.1443376f}, {4, 2, 128, 8, 0, 0.0625f},
                                            // head_dim 256 (Gemma 3 270M: 4 heads on 1 KV head, windows of
                                            // 512) at every heads-a-block (8, 4, 2, 1: tiles of 4-16 keys)
                                            {4, 1, 256, 512}, {8, 1, 256, 0, 0, 0.0625f}, {6, 3, 256, 100, 16},
                                            {3, 3, 256, 0}};
  const std::vector<std::vector<int64_t>> batches = {{1}, {17}, {5, 16, 300, 1}, {5000}, {9000, 33}, {2048, 2048, 7, 513},
                                                     {64}, {65, 128, 129}};
  // Every decode kernel: the tiles kernel in tiles of 4-128 keys by head_dim and the heads a block,
  // on tensor cores (mma; head_dim 32 runs the f32 tiles there) and in f32 FMAs; the chunked one.
  for (const cuda::DecodeAttention kernel :
       {cuda::DecodeAttention::mma, cuda::DecodeAttention::tiles, cuda::DecodeAttention::chunked}) {
    cuda::set_decode_attention(kernel);
    const std::string kernel_name = kernel == cuda::DecodeAttention::mma     ? "mma "
                                    : kernel == cuda::DecodeAttention::tiles ? "tiles "
                                                                             : "chunked ";
    for (const AttentionCase& c : cases) {
      for (const std::vector<int64_t>& contexts : batches) {
        const int64_t seqs = static_cast<int64_t>(contexts.size());
        const int64_t max_context = *std::max_element(contexts.begin(), contexts.end());
        const PagedFixture pool(contexts, c.kv_heads, c.head_dim);
        const int64_t q_width = c.heads * c.head_dim, q_stride = q_width + 8 * 3;  // strided rows
        const std::vector<float> q = random_f16_values(static_cast<size_t>(seqs * q_stride));
        std::vector<int32_t> lens(contexts.begin(), contexts.end());
        auto d_q = upload(to_f16(q));
        auto d_lens = upload(lens);
        auto d_tables = upload(pool.block_tables);
        auto d_k = upload(pool.k_pool);
        auto d_v = upload(pool.v_pool);
        const size_t workspace_bytes = cuda::attention_workspace_bytes(seqs, c.heads, c.head_dim, max_context);
        auto d_workspace = poisoned(workspace_bytes);  // partials poisoned, counters zeroed:
        cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
        auto d_out = poisoned(static_cast<size_t>(seqs * q_width) * 2);
        cuda::PagedKv kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), pool.max_blocks};
        const qspec::cpu::AttentionShape shape = c.shape();
        cuda::paged_attention_decode(d_q.as<f16>(), q_stride, seqs, d_lens.as<int32_t>(), max_context, kv, shape,
                                     d_out.as<f16>(), q_width, d_workspace.get(), workspace_bytes, nullptr);
        const std::vector<f16> first = download<f16>(d_out, static_cast<size_t>(seqs * q_width));
        // Again on the same workspace (as graph replays do): the split merge relies on the first
        // launch leaving its arrival counters at zero, and must give the same bits.
        auto d_out_again = poisoned(static_cast<size_t>(seqs * q_width) * 2);
        cuda::paged_attention_decode(d_q.as<f16>(), q_stride, seqs, d_lens.as<int32_t>(), max_context, kv, shape,
                                     d_out_again.as<f16>(), q_width, d_workspace.get(), workspace_bytes, nullptr);
        ASSERT_EQ(download<f16>(d_out_again, first.size()), first) << kernel_name << "decode relaunch " << case_name(c);
        const std::vector<float> got = from_f16(first);
        std::vector<float> expected(got.size());
        for (int64_t s = 0; s < seqs; ++s) {
          const int32_t position = static_cast<int32_t>(contexts[s] - 1);
          qspec::cpu::attention(q.data() + s * q_stride, 1, &position, pool.keys[s].data(), pool.values[s].data(), shape,
                                expected.data() + s * q_width);
        }
        std::string batch_name;
        for (int64_t ctx : contexts) batch_name += " " + std::to_string(ctx);
        EXPECT_CLOSE(got, expected, 4e-3, kernel_name + "decode " + case_name(c) + " contexts" + batch_name);
      }
    }
  }
  cuda::set_decode_attention(cuda::DecodeAttention::automatic);
}

// The inputs of a folded decode step (RoPE + the new token's K/V write + attention) over a paged
// fixture: one new token a sequence at its context's last position, random unrotated qkv rows
// (q, k, v and 8 padding halves), Llama-3's RoPE frequencies, all uploaded.
struct FoldedDecodeInputs {
  int64_t seqs, max_context, q_width, stride;
  std::vector<int32_t> positions;
  std::vector<f16> qkv;
  cuda::DeviceMemory d_tables, d_lens, d_start, d_positions, d_inv;
  cuda::QueryBatch batch;
  qspec::cpu::AttentionShape shape;
  size_t workspace_bytes;

  FoldedDecodeInputs(const PagedFixture& pool, const std::vector<int64_t>& contexts, const AttentionCase& c)
      : seqs(static_cast<int64_t>(contexts.size())),
        max_context(*std::max_element(contexts.begin(), contexts.end())),
        q_width(c.heads * c.head_dim),
        stride(q_width + 2 * pool.kv_width + 8),
        shape(c.shape()),
        workspace_bytes(cuda::attention_workspace_bytes(seqs, c.heads, c.head_dim, max_context)) {
    std::vector<int32_t> query_start(static_cast<size_t>(seqs + 1));
    std::iota(query_start.begin(), query_start.end(), 0);
    for (const int64_t context : contexts) positions.push_back(static_cast<int32_t>(context - 1));
    qkv = to_f16(random_f16_values(static_cast<size_t>(seqs * stride)));
    std::vector<float> inv_freq(static_cast<size_t>(c.head_dim / 2));
    for (int64_t i = 0; i < c.head_dim / 2; ++i)
      inv_freq[i] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.head_dim));
    d_tables = upload(pool.block_tables);
    d_lens = upload(std::vector<int32_t>(contexts.begin(), contexts.end()));
    d_start = upload(query_start);
    d_positions = upload(positions);
    d_inv = upload(inv_freq);
    batch = cuda::QueryBatch{seqs, seqs, d_start.as<int32_t>(), d_positions.as<int32_t>(), 1, max_context};
  }
};

// Decode with RoPE and the new token's K/V write folded into the attention (the model's decode
// path) gives bitwise what rope_kv_write then paged_attention_decode give: the attention output,
// and the whole K and V pools, whose new-token slots start as NaN (so the folded kernel must write
// them and must not read them back). The unrotated qkv rows stay as they were. Then a relaunch
// on the same workspace and pools (as a graph replay): the same bits. With the chunked kernel the
// call takes the two launches (and rotates qkv as they do).
TEST_F(Gpu, PagedDecodeRopeEqualsRopeKvWriteThenDecodeBitwise) {
  const std::vector<AttentionCase> cases = {{8, 4, 32, 0},   {32, 8, 128, 0}, {12, 12, 64, 0}, {28, 4, 128, 0},
                                            {16, 1, 128, 0}, {9, 3, 64, 0},   {32, 8, 128, 100},
                                            {32, 8, 128, 256, 16}, {12, 12, 64, 100, 20},
                                            // head_dim 256 (Gemma 3)
                                            {4, 1, 256, 0}, {16, 2, 256, 100, 16}, {2, 2, 256, 0}};
  const std::vector<std::vector<int64_t>> batches = {{1}, {17}, {5, 16, 300, 1}, {5000}, {64}, {65, 128, 129, 32, 33}};
  // With the chunked kernel the call runs the two launches itself (rotating qkv in place).
  for (const cuda::DecodeAttention kernel :
       {cuda::DecodeAttention::mma, cuda::DecodeAttention::tiles, cuda::DecodeAttention::chunked}) {
    cuda::set_decode_attention(kernel);
    const bool one_launch = cuda::decode_rope_folded();
    ASSERT_EQ(one_launch, kernel != cuda::DecodeAttention::chunked) << "run without QSPEC_DECODE_ROPE=separate";
    for (const AttentionCase& c : cases) {
      for (const std::vector<int64_t>& contexts : batches) {
        PagedFixture pool(contexts, c.kv_heads, c.head_dim);
        for (size_t s = 0; s < contexts.size(); ++s) {  // the new tokens' slots
          const int64_t p = contexts[s] - 1;
          const int64_t slot = static_cast<int64_t>(pool.block_tables[s * pool.max_blocks + p / 16]) * 16 + p % 16;
          for (int64_t i = 0; i < pool.kv_width; ++i) pool.k_pool[slot * pool.kv_width + i] = kNaN16;
          for (int64_t i = 0; i < pool.kv_width; ++i) pool.v_pool[slot * pool.kv_width + i] = kNaN16;
        }
        const FoldedDecodeInputs in(pool, contexts, c);
        const int64_t seqs = in.seqs, max_context = in.max_context, q_width = in.q_width, stride = in.stride;
        const std::vector<f16>& qkv = in.qkv;
        const cuda::QueryBatch& batch = in.batch;
        const qspec::cpu::AttentionShape& shape = in.shape;
        const size_t workspace_bytes = in.workspace_bytes;
        const cuda::DeviceMemory &d_tables = in.d_tables, &d_lens = in.d_lens, &d_inv = in.d_inv;
        const std::string name = std::string(one_launch ? "one launch " : "two launches ") + case_name(c) +
                                 " contexts " + std::to_string(contexts.front()) + ".. (" + std::to_string(seqs) + ")";
        std::vector<f16> results[2][4];  // [by hand, paged_attention_decode_rope][out, k pool, v pool, qkv]
        for (int api = 0; api < 2; ++api) {
          auto d_qkv = upload(qkv);
          auto d_k = upload(pool.k_pool);
          auto d_v = upload(pool.v_pool);
          auto d_workspace = poisoned(workspace_bytes);
          cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
          auto d_out = poisoned(static_cast<size_t>(seqs * q_width) * 2);
          cuda::PagedKv kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), pool.max_blocks};
          auto run = [&](cuda::DeviceMemory& out) {
            if (api) {
              cuda::paged_attention_decode_rope(d_qkv.as<f16>(), stride, batch, d_lens.as<int32_t>(), d_inv.as<float>(),
                                                1.1f, kv, shape, out.as<f16>(), q_width, d_workspace.get(),
                                                workspace_bytes, nullptr);
            } else {
              cuda::rope_kv_write(d_qkv.as<f16>(), stride, c.heads, c.kv_heads, c.head_dim, batch, d_inv.as<float>(),
                                  1.1f, kv, nullptr);
              cuda::paged_attention_decode(d_qkv.as<f16>(), stride, seqs, d_lens.as<int32_t>(), max_context, kv, shape,
                                           out.as<f16>(), q_width, d_workspace.get(), workspace_bytes, nullptr);
            }
          };
          run(d_out);
          results[api][0] = download<f16>(d_out, static_cast<size_t>(seqs * q_width));
          results[api][1] = download<f16>(d_k, pool.k_pool.size());
          results[api][2] = download<f16>(d_v, pool.v_pool.size());
          results[api][3] = download<f16>(d_qkv, qkv.size());
          if (api && one_launch) {  // (two launches would rotate qkv twice)
            auto d_out_again = poisoned(static_cast<size_t>(seqs * q_width) * 2);
            run(d_out_again);
            ASSERT_EQ(download<f16>(d_out_again, results[1][0].size()), results[1][0]) << "relaunch " << name;
          }
        }
        for (const f16 value : results[1][0]) ASSERT_FALSE(std::isnan(qspec::f16_to_f32(value))) << name;
        for (int part = 0; part < 3; ++part)
          ASSERT_TRUE(results[1][part] == results[0][part]) << name << ": part " << part << " differs";
        if (one_launch) ASSERT_EQ(results[1][3], qkv) << name << ": the folded kernel wrote the qkv rows";
        else ASSERT_EQ(results[1][3], results[0][3]) << name << ": qkv not rotated as rope_kv_write does";
        ASSERT_NE(results[0][1], pool.k_pool) << name << ": no key was written";
      }
    }
  }
  cuda::set_decode_attention(cuda::DecodeAttention::automatic);
}

// rope_kv_write with a family's prologue (cuda::QkvPrologue: Qwen2's q/k/v biases, Qwen3's
// per-head q/k RMSNorm, both) against its CPU twin, the CPU forward's chain: bias added (as
// cpu::linear does), cpu::rmsnorm over each q and k head, cpu::rope. The rows hold the biased v
// and the normalized, rotated q and k; the pool rows at each token's position hold bitwise the
// row's k and v; bytes past the heads stay untouched.
TEST_F(Gpu, RopeKvWriteWithBiasesAndQkNormsMatchesCpu) {
  struct Case {
    int64_t heads, kv_heads, head_dim;
    bool bias, norm;
  };
  for (const Case c : {Case{4, 2, 64, true, false}, Case{28, 4, 128, true, false}, Case{8, 2, 128, false, true},
                       Case{4, 4, 32, true, true}, Case{16, 8, 64, false, true}, Case{2, 1, 256, true, true},
                       Case{4, 1, 256, false, true}, Case{8, 2, 256, true, false}}) {
    const std::vector<int64_t> run_lengths = {1, 6, 19};
    const std::vector<int64_t> run_starts = {33, 0, 5};
    const int64_t seqs = 3, max_blocks = 8, D = c.head_dim, q_dim = c.heads * D, kv_width = c.kv_heads * D;
    const int64_t width = q_dim + 2 * kv_width, stride = width + 8;
    std::vector<int32_t> query_start{0}, positions;
    for (int64_t s = 0; s < seqs; ++s) {
      for (int64_t i = 0; i < run_lengths[s]; ++i) positions.push_back(static_cast<int32_t>(run_starts[s] + i));
      query_start.push_back(static_cast<int32_t>(positions.size()));
    }
    const int64_t tokens = static_cast<int64_t>(positions.size());
    std::vector<int32_t> tables(static_cast<size_t>(seqs * max_blocks));
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng());
    const size_t pool_halves = static_cast<size_t>(seqs * max_blocks * 16 * kv_width);
    std::vector<float> inv_freq(static_cast<size_t>(D / 2));
    for (int64_t i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(1000000.0f, -2.0f * static_cast<float>(i) / D);
    const std::vector<float> x = random_f16_values(static_cast<size_t>(tokens * stride));
    // Biases of Qwen2's size (k biases reach tens); norm weights around 1.
    const std::vector<float> bias = random_f16_values(static_cast<size_t>(width), 4.0f);
    std::vector<float> q_norm = random_f16_values(static_cast<size_t>(D), 0.3f), k_norm = q_norm;
    for (float& w : q_norm) w += 1.0f;
    for (float& w : k_norm) w = 1.0f - w;
    auto d_qkv = upload(to_f16(x));
    auto d_tables = upload(tables);
    auto d_start = upload(query_start);
    auto d_positions = upload(positions);
    auto d_inv = upload(inv_freq);
    auto d_bias = upload(bias);
    auto d_q_norm = upload(q_norm);
    auto d_k_norm = upload(k_norm);
    auto d_k = poisoned(pool_halves * 2);
    auto d_v = poisoned(pool_halves * 2);
    cuda::PagedKv kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), max_blocks};
    cuda::QueryBatch batch{seqs, tokens, d_start.as<int32_t>(), d_positions.as<int32_t>(), 19, 53};
    cuda::QkvPrologue prologue;
    prologue.bias = c.bias ? d_bias.as<float>() : nullptr;
    prologue.q_norm = c.norm ? d_q_norm.as<float>() : nullptr;
    prologue.k_norm = c.norm ? d_k_norm.as<float>() : nullptr;
    prologue.eps = 1e-6f;
    cuda::rope_kv_write(d_qkv.as<f16>(), stride, c.heads, c.kv_heads, D, batch, d_inv.as<float>(), 1.0f, kv, nullptr,
                        prologue);
    const std::vector<f16> got_bits = download<f16>(d_qkv, x.size());
    const std::vector<float> got = from_f16(got_bits);
    const std::vector<f16> k_pool = download<f16>(d_k, pool_halves), v_pool = download<f16>(d_v, pool_halves);
    // The CPU twin, token by token.
    std::vector<float> expected_qk, got_qk, expected_v, got_v;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> row(x.begin() + t * stride, x.begin() + t * stride + width);
      if (c.bias)
        for (int64_t i = 0; i < width; ++i) row[i] += bias[i];
      if (c.norm) {
        qspec::cpu::rmsnorm(row.data(), q_norm.data(), c.heads, D, 1e-6, row.data());
        qspec::cpu::rmsnorm(row.data() + q_dim, k_norm.data(), c.kv_heads, D, 1e-6, row.data() + q_dim);
      }
      qspec::cpu::rope(row.data(), 1, c.heads + c.kv_heads, D, &positions[t], inv_freq.data(), 1.0f);
      expected_qk.insert(expected_qk.end(), row.begin(), row.begin() + q_dim + kv_width);
      got_qk.insert(got_qk.end(), got.begin() + t * stride, got.begin() + t * stride + q_dim + kv_width);
      expected_v.insert(expected_v.end(), row.begin() + q_dim + kv_width, row.end());
      got_v.insert(got_v.end(), got.begin() + t * stride + q_dim + kv_width, got.begin() + t * stride + width);
      for (int64_t i = width; i < stride; ++i) ASSERT_EQ(got[t * stride + i], x[t * stride + i]) << "wrote past the heads";
      // The cache rows: bitwise the row's k and v.
      int64_t seq = 0;
      while (query_start[seq + 1] <= t) ++seq;
      const int64_t slot = static_cast<int64_t>(tables[seq * max_blocks + positions[t] / 16]) * 16 + positions[t] % 16;
      for (int64_t i = 0; i < kv_width; ++i) {
        ASSERT_EQ(k_pool[slot * kv_width + i], got_bits[t * stride + q_dim + i]) << "k cache, token " << t;
        ASSERT_EQ(v_pool[slot * kv_width + i], got_bits[t * stride + q_dim + kv_width + i]) << "v cache, token " << t;
      }
    }
    const std::string name = shape_name({c.heads, c.kv_heads, D}) + (c.bias ? " bias" : "") + (c.norm ? " qk-norm" : "");
    EXPECT_CLOSE(got_qk, expected_qk, 2e-3, "rope_kv_write q, k " + name);
    EXPECT_CLOSE(got_v, expected_v, 2e-3, "rope_kv_write v " + name);
  }
}

// The decode attention with q/k/v biases folded in (the Qwen2 decode step) gives bitwise what
// rope_kv_write with the same biases, then paged_attention_decode give: the attention output and
// both pools (the new slots start as NaN). With q/k norms the call takes those two launches
// itself, so it gives their bits too.
TEST_F(Gpu, PagedDecodeRopeWithAPrologueEqualsRopeKvWriteThenDecodeBitwise) {
  const std::vector<AttentionCase> cases = {{28, 4, 128, 0}, {8, 2, 64, 0},         {4, 4, 32, 0},
                                            {16, 2, 128, 100, 16}, {4, 1, 256, 0}, {6, 2, 256, 100, 16}};
  const std::vector<std::vector<int64_t>> batches = {{1}, {17, 300, 5}, {64}};
  for (const cuda::DecodeAttention kernel : {cuda::DecodeAttention::mma, cuda::DecodeAttention::tiles}) {
    cuda::set_decode_attention(kernel);
    ASSERT_TRUE(cuda::decode_rope_folded()) << "run without QSPEC_DECODE_ROPE=separate";
    for (const bool norm : {false, true}) {
      for (const AttentionCase& c : cases) {
        for (const std::vector<int64_t>& contexts : batches) {
          const int64_t seqs = static_cast<int64_t>(contexts.size());
          const int64_t max_context = *std::max_element(contexts.begin(), contexts.end());
          PagedFixture pool(contexts, c.kv_heads, c.head_dim);
          std::vector<int32_t> query_start(static_cast<size_t>(seqs + 1)), positions;
          std::vector<int32_t> lens(contexts.begin(), contexts.end());
          std::iota(query_start.begin(), query_start.end(), 0);
          for (size_t s = 0; s < contexts.size(); ++s) {
            const int64_t p = contexts[s] - 1;
            positions.push_back(static_cast<int32_t>(p));
            const int64_t slot = static_cast<int64_t>(pool.block_tables[s * pool.max_blocks + p / 16]) * 16 + p % 16;
            for (int64_t i = 0; i < pool.kv_width; ++i) pool.k_pool[slot * pool.kv_width + i] = kNaN16;
            for (int64_t i = 0; i < pool.kv_width; ++i) pool.v_pool[slot * pool.kv_width + i] = kNaN16;
          }
          const int64_t q_width = c.heads * c.head_dim, width = q_width + 2 * pool.kv_width, stride = width + 8;
          const std::vector<f16> qkv = to_f16(random_f16_values(static_cast<size_t>(seqs * stride)));
          std::vector<float> inv_freq(static_cast<size_t>(c.head_dim / 2));
          for (int64_t i = 0; i < c.head_dim / 2; ++i)
            inv_freq[i] = std::pow(1000000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.head_dim));
          auto d_tables = upload(pool.block_tables);
          auto d_lens = upload(lens);
          auto d_start = upload(query_start);
          auto d_positions = upload(positions);
          auto d_inv = upload(inv_freq);
          auto d_bias = upload(random_f16_values(static_cast<size_t>(width), 4.0f));
          std::vector<float> weights = random_f16_values(static_cast<size_t>(c.head_dim), 0.3f);
          for (float& w : weights) w += 1.0f;
          auto d_norm = upload(weights);
          cuda::QkvPrologue prologue;
          prologue.bias = d_bias.as<float>();
          prologue.q_norm = norm ? d_norm.as<float>() : nullptr;
          prologue.k_norm = norm ? d_norm.as<float>() : nullptr;
          const cuda::QueryBatch batch{seqs, seqs, d_start.as<int32_t>(), d_positions.as<int32_t>(), 1, max_context};
          const qspec::cpu::AttentionShape shape = c.shape();
          const size_t workspace_bytes = cuda::attention_workspace_bytes(seqs, c.heads, c.head_dim, max_context);
          const std::string name = case_name(c) + (norm ? " bias + qk-norm" : " bias") + " contexts " +
                                   std::to_string(contexts.front()) + ".. (" + std::to_string(seqs) + ")";
          std::vector<f16> results[2][3];  // [by hand, paged_attention_decode_rope][out, k pool, v pool]
          for (int api = 0; api < 2; ++api) {
            auto d_qkv = upload(qkv);
            auto d_k = upload(pool.k_pool);
            auto d_v = upload(pool.v_pool);
            auto d_workspace = poisoned(workspace_bytes);
            cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
            auto d_out = poisoned(static_cast<size_t>(seqs * q_width) * 2);
            cuda::PagedKv kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), pool.max_blocks};
            if (api) {
              cuda::paged_attention_decode_rope(d_qkv.as<f16>(), stride, batch, d_lens.as<int32_t>(), d_inv.as<float>(),
                                                1.0f, kv, shape, d_out.as<f16>(), q_width, d_workspace.get(),
                                                workspace_bytes, nullptr, prologue);
            } else {
              cuda::rope_kv_write(d_qkv.as<f16>(), stride, c.heads, c.kv_heads, c.head_dim, batch, d_inv.as<float>(),
                                  1.0f, kv, nullptr, prologue);
              cuda::paged_attention_decode(d_qkv.as<f16>(), stride, seqs, d_lens.as<int32_t>(), max_context, kv, shape,
                                           d_out.as<f16>(), q_width, d_workspace.get(), workspace_bytes, nullptr);
            }
            results[api][0] = download<f16>(d_out, static_cast<size_t>(seqs * q_width));
            results[api][1] = download<f16>(d_k, pool.k_pool.size());
            results[api][2] = download<f16>(d_v, pool.v_pool.size());
          }
          for (const f16 value : results[1][0]) ASSERT_FALSE(std::isnan(qspec::f16_to_f32(value))) << name;
          for (int part = 0; part < 3; ++part)
            ASSERT_TRUE(results[1][part] == results[0][part]) << name << ": part " << part << " differs";
        }
      }
    }
  }
  cuda::set_decode_attention(cuda::DecodeAttention::automatic);
}

TEST_F(Gpu, PagedKvWriteThenPrefillMatchesCpuAttention) {
  struct Run {
    int64_t cached, new_tokens;  // the run sits at positions cached .. cached + new_tokens - 1
  };
  const std::vector<AttentionCase> cases = {{8, 4, 32, 0},  {32, 8, 128, 0}, {12, 12, 64, 0}, {28, 4, 128, 0},
                                            {9, 3, 64, 0},  {32, 8, 128, 77}, {16, 2, 64, 1000},
                                            {32, 8, 128, 77, 16}, {16, 2, 64, 130, 5},
                                            // Gemma 3: query_pre_attn_scalar^-1/2, a sliding layer's window
                                            {8, 4, 64, 0, 0, 0.1443376f}, {4, 2, 128, 8, 0, 0.0625f},
                                            // head_dim 256 (Gemma 3 270M: 4 heads on 1 KV head; a window
                                            // of 8, sinks, an explicit scale, MHA)
                                            {4, 1, 256, 0}, {4, 1, 256, 8, 0, 0.0625f}, {8, 2, 256, 77, 16},
                                            {3, 3, 256, 0}};
  const std::vector<std::vector<Run>> batches = {
      {{0, 1}},                              // one token, empty cache
      {{0, 17}, {40, 5}, {100, 1}},          // prefill + verify runs (gamma + 1 = 5)
      {{5000, 5}},                           // verify over a long cache: split-K
      {{0, 300}, {3, 64}},                   // prefill
      {{2000, 5}, {2000, 5}, {63, 2}, {1, 65}},
      {{3000, 4}, {700, 4}, {64, 4}}};       // verify runs of gamma 3: (gamma + 1) x group rows split the keys
  for (const AttentionCase& c : cases) {
    for (const std::vector<Run>& runs : batches) {
      std::vector<int64_t> contexts;
      for (const Run& r : runs) contexts.push_back(r.cached + r.new_tokens);
      const int64_t seqs = static_cast<int64_t>(runs.size());
      const int64_t max_context = *std::max_element(contexts.begin(), contexts.end());
      PagedFixture pool(contexts, c.kv_heads, c.head_dim);
      // The run's own K/V arrive through paged_kv_write: blank them in the uploaded pool, and
      // write them from a fused qkv-like buffer [tokens, q | k | v].
      std::vector<int32_t> query_start{0}, positions;
      int64_t max_run = 0;
      for (size_t s = 0; s < runs.size(); ++s) {
        for (int64_t p = runs[s].cached; p < contexts[s]; ++p) {
          positions.push_back(static_cast<int32_t>(p));
          const int64_t slot = static_cast<int64_t>(pool.block_tables[s * pool.max_blocks + p / 16]) * 16 + p % 16;
          for (int64_t i = 0; i < pool.kv_width; ++i) pool.k_pool[slot * pool.kv_width + i] = kNaN16;
          for (int64_t i = 0; i < pool.kv_width; ++i) pool.v_pool[slot * pool.kv_width + i] = kNaN16;
        }
        query_start.push_back(static_cast<int32_t>(positions.size()));
        max_run = std::max(max_run, runs[s].new_tokens);
      }
      const int64_t tokens = static_cast<int64_t>(positions.size());
      const int64_t q_width = c.heads * c.head_dim, stride = q_width + 2 * pool.kv_width;
      std::vector<float> qkv = random_f16_values(static_cast<size_t>(tokens * stride));
      {
        int64_t t = 0;
        for (size_t s = 0; s < runs.size(); ++s)
          for (int64_t p = runs[s].cached; p < contexts[s]; ++p, ++t)
            for (int64_t i = 0; i < pool.kv_width; ++i) {
              qkv[t * stride + q_width + i] = pool.keys[s][p * pool.kv_width + i];
              qkv[t * stride + q_width + pool.kv_width + i] = pool.values[s][p * pool.kv_width + i];
            }
      }
      auto d_qkv = upload(to_f16(qkv));
      auto d_tables = upload(pool.block_tables);
      auto d_k = upload(pool.k_pool);
      auto d_v = upload(pool.v_pool);
      auto d_start = upload(query_start);
      auto d_positions = upload(positions);
      cuda::PagedKv kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), pool.max_blocks};
      cuda::QueryBatch batch{seqs, tokens, d_start.as<int32_t>(), d_positions.as<int32_t>(), max_run, max_context};
      const f16* q = d_qkv.as<f16>();
      cuda::paged_kv_write(q + q_width, q + q_width + pool.kv_width, stride, batch, kv, c.kv_heads, c.head_dim, nullptr);
      // The pool now equals the full fixture: check every written row exactly.
      {
        const std::vector<f16> k_after = download<f16>(d_k, pool.k_pool.size());
        for (size_t s = 0; s < runs.size(); ++s)
          for (int64_t p = runs[s].cached; p < contexts[s]; ++p) {
            const int64_t slot = static_cast<int64_t>(pool.block_tables[s * pool.max_blocks + p / 16]) * 16 + p % 16;
            for (int64_t i = 0; i < pool.kv_width; ++i)
              ASSERT_EQ(k_after[slot * pool.kv_width + i], qspec::f32_to_f16(pool.keys[s][p * pool.kv_width + i]))
                  << "kv write seq " << s << " position " << p;
          }
      }
      const size_t workspace_bytes = cuda::attention_workspace_bytes(tokens, c.heads, c.head_dim, max_context);
      auto d_workspace = poisoned(workspace_bytes);
      cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
      auto d_out = poisoned(static_cast<size_t>(tokens * q_width) * 2);
      const qspec::cpu::AttentionShape shape = c.shape();
      cuda::paged_attention_prefill(q, stride, batch, kv, shape, d_out.as<f16>(), q_width, d_workspace.get(),
                                    workspace_bytes, nullptr);
      const std::vector<float> got = from_f16(download<f16>(d_out, static_cast<size_t>(tokens * q_width)));
      std::vector<float> expected(got.size()), q_rows(static_cast<size_t>(tokens * q_width));
      for (int64_t t = 0; t < tokens; ++t)
        std::copy(qkv.begin() + t * stride, qkv.begin() + t * stride + q_width, q_rows.begin() + t * q_width);
      for (size_t s = 0; s < runs.size(); ++s) {
        const int64_t first = query_start[s];
        qspec::cpu::attention(q_rows.data() + first * q_width, runs[s].new_tokens, positions.data() + first,
                              pool.keys[s].data(), pool.values[s].data(), shape, expected.data() + first * q_width);
      }
      std::string batch_name;
      for (const Run& r : runs) batch_name += " " + std::to_string(r.cached) + "+" + std::to_string(r.new_tokens);
      EXPECT_CLOSE(got, expected, 4e-3, "prefill " + case_name(c) + " runs" + batch_name);
    }
  }
}

TEST_F(Gpu, PagedPrefillHandles4096QueryTokens) {
  const AttentionCase c{8, 2, 128, 0};
  const int64_t n = 4096;
  PagedFixture pool({n}, c.kv_heads, c.head_dim);
  std::vector<int32_t> positions(static_cast<size_t>(n)), query_start{0, static_cast<int32_t>(n)};
  std::iota(positions.begin(), positions.end(), 0);
  const int64_t q_width = c.heads * c.head_dim;
  const std::vector<float> q = random_f16_values(static_cast<size_t>(n * q_width));
  auto d_q = upload(to_f16(q));
  auto d_tables = upload(pool.block_tables);
  auto d_k = upload(pool.k_pool);
  auto d_v = upload(pool.v_pool);
  auto d_start = upload(query_start);
  auto d_positions = upload(positions);
  cuda::PagedKv kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), pool.max_blocks};
  cuda::QueryBatch batch{1, n, d_start.as<int32_t>(), d_positions.as<int32_t>(), n, n};
  const size_t workspace_bytes = cuda::attention_workspace_bytes(n, c.heads, c.head_dim, n);
  auto d_workspace = poisoned(workspace_bytes);
  cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
  auto d_out = poisoned(static_cast<size_t>(n * q_width) * 2);
  qspec::cpu::AttentionShape shape{c.heads, c.kv_heads, c.head_dim, 0};
  cuda::paged_attention_prefill(d_q.as<f16>(), q_width, batch, kv, shape, d_out.as<f16>(), q_width, d_workspace.get(),
                                workspace_bytes, nullptr);
  const std::vector<float> got = from_f16(download<f16>(d_out, static_cast<size_t>(n * q_width)));
  std::vector<float> expected(got.size());
  qspec::cpu::attention(q.data(), n, positions.data(), pool.keys[0].data(), pool.values[0].data(), shape,
                        expected.data());
  EXPECT_CLOSE(got, expected, 4e-3, "prefill 4096 tokens " + case_name(c));
}

TEST_F(Gpu, AttentionRejectsUnsupportedHeadDim) {
  cuda::PagedKv kv{};
  qspec::cpu::AttentionShape shape{4, 2, 96, 0};
  EXPECT_THROW(cuda::paged_attention_decode(nullptr, 384, 1, nullptr, 16, kv, shape, nullptr, 384, nullptr, 0, nullptr),
               qspec::Error);
  // The folded decode: head_dim, a batch of more than one token a sequence, rows too narrow.
  const cuda::QueryBatch one{1, 1, nullptr, nullptr, 1, 16}, two{1, 2, nullptr, nullptr, 2, 16};
  EXPECT_THROW(cuda::paged_attention_decode_rope(nullptr, 768, one, nullptr, nullptr, 1.0f, kv, shape, nullptr, 384,
                                                 nullptr, 0, nullptr),
               qspec::Error);
  const qspec::cpu::AttentionShape ok{4, 2, 64, 0};
  EXPECT_THROW(cuda::paged_attention_decode_rope(nullptr, 512, two, nullptr, nullptr, 1.0f, kv, ok, nullptr, 256,
                                                 nullptr, 0, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::paged_attention_decode_rope(nullptr, 384, one, nullptr, nullptr, 1.0f, kv, ok, nullptr, 256,
                                                 nullptr, 0, nullptr),
               qspec::Error);
  // Past the widest (256), by the prefill too, naming the one list of head_dims.
  const qspec::cpu::AttentionShape wide{4, 2, 512, 0};
  try {
    cuda::paged_attention_decode(nullptr, 2048, 1, nullptr, 16, kv, wide, nullptr, 2048, nullptr, 0, nullptr);
    ADD_FAILURE() << "head_dim 512 was taken";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 512 (supported: 32, 64, 128, 256)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::paged_attention_prefill(nullptr, 2048, one, kv, wide, nullptr, 2048, nullptr, 0, nullptr),
               qspec::Error);
  // The GPU model's load check: every listed head_dim runs on an sm_90 GPU (256's prefill block takes
  // 160 KB of shared memory), others are refused.
  for (const int64_t d : cuda::kAttentionHeadDims) EXPECT_NO_THROW(cuda::check_attention_runs_here(d)) << d;
  EXPECT_THROW(cuda::check_attention_runs_here(96), qspec::Error);
  EXPECT_THROW(cuda::check_attention_runs_here(512), qspec::Error);
}

// ---- the int8 KV cache (issue 50, diet 2) ----------------------------------------------------
// Writes against kv8::row_scale_f32 / kv8::encode of the same f16 rows (bitwise), and attention
// over an int8 cache (both views) against cpu::attention over rows dequantized on the host with
// kv8::decode / decode_high from the very planes and scales the GPU cache holds, read back: the
// CPU twin of a /k4 draft and of the verify. Bounds as the f16 tests'.

namespace {

// An int8 pool pair (K, V) of num_blocks blocks, poisoned (codes -1, scales NaN: an unwritten row
// read shows as NaN).
struct Int8Cache {
  int64_t num_blocks, kv_heads, head_dim;
  size_t bytes;
  cuda::DeviceMemory k, v;
  cuda::Kv8Planes k8, v8;
  Int8Cache(int64_t blocks, int64_t heads, int64_t dim)
      : num_blocks(blocks), kv_heads(heads), head_dim(dim), bytes(cuda::kv8_pool_bytes(blocks, heads, dim)),
        k(poisoned(bytes)), v(poisoned(bytes)) {
    k8 = cuda::kv8_planes_in(k.get(), blocks, heads, dim);
    v8 = cuda::kv8_planes_in(v.get(), blocks, heads, dim);
  }
  cuda::PagedKv paged(const int32_t* tables, int64_t max_blocks, qspec::KvView view) const {
    cuda::PagedKv kv{nullptr, nullptr, tables, max_blocks};
    kv.format = qspec::KvCacheFormat::int8;
    kv.k8 = k8;
    kv.v8 = v8;
    kv.view = view;
    return kv;
  }
};

// A pool read back: each row's codes (joined from the two planes by the layout's nibble order) and
// scale bits.
struct Int8Rows {
  int64_t kv_heads, head_dim;
  std::vector<uint8_t> bytes;  // the whole allocation
  const uint8_t* high;
  const uint8_t* low;
  const uint16_t* scales;
  Int8Rows(const cuda::DeviceMemory& pool, const cuda::Kv8Planes& planes, int64_t heads, int64_t dim)
      : kv_heads(heads), head_dim(dim), bytes(download<uint8_t>(pool, pool.bytes())) {
    const uint8_t* base = static_cast<const uint8_t*>(pool.get());
    high = bytes.data() + (planes.high - base);
    low = bytes.data() + (planes.low - base);
    scales = reinterpret_cast<const uint16_t*>(bytes.data() + (reinterpret_cast<const uint8_t*>(planes.scales) - base));
  }
  int8_t code(int64_t row, int64_t e) const {
    const int64_t n = cuda::kv8_nibble_index(e);
    const int shift = static_cast<int>(4 * (n % 2));
    const int hn = (high[row * head_dim / 2 + n / 2] >> shift) & 15, ln = (low[row * head_dim / 2 + n / 2] >> shift) & 15;
    return static_cast<int8_t>(static_cast<uint8_t>(hn << 4 | ln));
  }
  uint16_t scale_bits(int64_t row) const { return scales[row]; }
  // Position p of a sequence (its block table row) as the view reads it: [kv_heads * head_dim].
  void dequantized(const int32_t* table, int64_t p, qspec::KvView view, float* out) const {
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t row = cuda::kv8_row(table[p / 16], h, p % 16, kv_heads);
      const float scale = qspec::f16_to_f32(scale_bits(row));
      for (int64_t e = 0; e < head_dim; ++e)
        out[h * head_dim + e] = view == qspec::KvView::full ? qspec::kv8::decode(code(row, e), scale)
                                                            : qspec::kv8::decode_high(code(row, e), scale);
    }
  }
};

// The expected row: kv8's scale bits and codes of f16 values x[0 .. head_dim).
void expect_kv8_row(const Int8Rows& rows, int64_t row, const float* x, const std::string& what) {
  float amax = 0.0f;
  for (int64_t e = 0; e < rows.head_dim; ++e) amax = std::max(amax, std::abs(x[e]));
  const float scale = qspec::kv8::row_scale_f32(amax);
  ASSERT_EQ(rows.scale_bits(row), qspec::f32_to_f16(scale)) << what << ": scale of amax " << amax;
  for (int64_t e = 0; e < rows.head_dim; ++e)
    ASSERT_EQ(rows.code(row, e), qspec::kv8::encode(x[e], scale)) << what << ": element " << e << " = " << x[e];
}

// Rows of f16 values over a wide range of magnitudes (row r scaled by 4^(r % 7 - 3)), one row in 13
// all zeros, some rows with exact halves of a code step: the scale, rounding and clamping cases.
std::vector<float> kv8_test_values(int64_t rows, int64_t width, int64_t head_dim) {
  std::vector<float> x = random_f16_values(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) {
      const int64_t head_row = r * (width / head_dim) + i / head_dim;
      float& value = x[r * width + i];
      if (head_row % 13 == 5) value = 0.0f;
      else value = qspec::f16_to_f32(qspec::f32_to_f16(value * std::ldexp(1.0f, static_cast<int>(2 * (head_row % 7) - 6))));
    }
  return x;
}

// Writes every position 0 .. contexts[s] - 1 of the fixture's sequences into an int8 cache with
// paged_kv_write (one run a sequence), as a prefill would.
void write_fixture_int8(const PagedFixture& pool, const std::vector<int64_t>& contexts, const cuda::PagedKv& kv,
                        int64_t kv_heads, int64_t head_dim) {
  std::vector<int32_t> query_start{0}, positions;
  std::vector<float> rows;
  int64_t max_run = 0;
  for (size_t s = 0; s < contexts.size(); ++s) {
    for (int64_t p = 0; p < contexts[s]; ++p) {
      positions.push_back(static_cast<int32_t>(p));
      rows.insert(rows.end(), pool.keys[s].begin() + p * pool.kv_width, pool.keys[s].begin() + (p + 1) * pool.kv_width);
      rows.insert(rows.end(), pool.values[s].begin() + p * pool.kv_width,
                  pool.values[s].begin() + (p + 1) * pool.kv_width);
    }
    query_start.push_back(static_cast<int32_t>(positions.size()));
    max_run = std::max(max_run, contexts[s]);
  }
  auto d_rows = upload(to_f16(rows));
  auto d_start = upload(query_start);
  auto d_positions = upload(positions);
  const cuda::QueryBatch batch{static_cast<int64_t>(contexts.size()), static_cast<int64_t>(positions.size()),
                               d_start.as<int32_t>(), d_positions.as<int32_t>(), max_run, max_run};
  const f16* k = d_rows.as<f16>();
  cuda::paged_kv_write(k, k + pool.kv_width, 2 * pool.kv_width, batch, kv, kv_heads, head_dim, nullptr);
  cuda::synchronize();
}

// Each sequence's K and V as the view reads them from the cache, for cpu::attention.
void int8_reference_rows(const Int8Cache& cache, const PagedFixture& pool, const std::vector<int64_t>& contexts,
                         qspec::KvView view, std::vector<std::vector<float>>& keys,
                         std::vector<std::vector<float>>& values) {
  const Int8Rows k_rows(cache.k, cache.k8, cache.kv_heads, cache.head_dim);
  const Int8Rows v_rows(cache.v, cache.v8, cache.kv_heads, cache.head_dim);
  keys.assign(contexts.size(), {});
  values.assign(contexts.size(), {});
  for (size_t s = 0; s < contexts.size(); ++s) {
    keys[s].resize(static_cast<size_t>(contexts[s] * pool.kv_width));
    values[s].resize(keys[s].size());
    const int32_t* table = pool.block_tables.data() + s * pool.max_blocks;
    for (int64_t p = 0; p < contexts[s]; ++p) {
      k_rows.dequantized(table, p, view, keys[s].data() + p * pool.kv_width);
      v_rows.dequantized(table, p, view, values[s].data() + p * pool.kv_width);
    }
  }
}

const char* view_name(qspec::KvView view) { return view == qspec::KvView::full ? "int8 " : "int8/k4 "; }

}  // namespace

// paged_kv_write into an int8 cache: every written row's scale bits and codes are kv8's of the same
// f16 row (no exceptions: the GPU divides, rounds and clamps in f32 as kv8::encode does, IEEE
// division and rintf on both sides, so ties fall the same way); unwritten rows keep their poison.
// Then an overwrite (a verify rewriting its drafts' positions with other rows): the rewritten rows
// hold the new rows' codes and scales in both planes, the others are unchanged.
TEST_F(Gpu, KvWriteInt8EqualsKv8EncodeBitwiseAndOverwrites) {
  for (const int64_t head_dim : cuda::kAttentionHeadDims) {
    for (const int64_t kv_heads : {int64_t{1}, int64_t{3}, int64_t{8}}) {
      const int64_t width = kv_heads * head_dim, max_blocks = 6, seqs = 3;
      const std::vector<int64_t> lengths = {37, 1, 70};
      std::vector<int32_t> tables(static_cast<size_t>(seqs * max_blocks));
      std::iota(tables.begin(), tables.end(), 0);
      std::shuffle(tables.begin(), tables.end(), rng());
      Int8Cache cache(seqs * max_blocks, kv_heads, head_dim);
      auto d_tables = upload(tables);
      const cuda::PagedKv kv = cache.paged(d_tables.as<int32_t>(), max_blocks, qspec::KvView::full);
      const std::string name = shape_name({kv_heads, head_dim});
      // (the first write, then the overwrite of each sequence's last 4 positions)
      std::vector<int32_t> positions, query_start{0}, over_positions, over_start{0};
      for (int64_t s = 0; s < seqs; ++s) {
        for (int64_t p = 0; p < lengths[s]; ++p) positions.push_back(static_cast<int32_t>(p));
        query_start.push_back(static_cast<int32_t>(positions.size()));
        for (int64_t p = std::max<int64_t>(0, lengths[s] - 4); p < lengths[s]; ++p)
          over_positions.push_back(static_cast<int32_t>(p));
        over_start.push_back(static_cast<int32_t>(over_positions.size()));
      }
      std::vector<std::vector<float>> expected(static_cast<size_t>(seqs * max_blocks * 16));  // [slot] k | v
      for (int pass = 0; pass < 2; ++pass) {
        const std::vector<int32_t>& pos = pass ? over_positions : positions;
        const std::vector<int32_t>& start = pass ? over_start : query_start;
        const int64_t tokens = static_cast<int64_t>(pos.size()), stride = 2 * width + 8;
        const std::vector<float> x = kv8_test_values(tokens, stride, head_dim);
        auto d_x = upload(to_f16(x));
        auto d_start = upload(start);
        auto d_pos = upload(pos);
        const cuda::QueryBatch batch{seqs, tokens, d_start.as<int32_t>(), d_pos.as<int32_t>(), 70, 70};
        cuda::paged_kv_write(d_x.as<f16>(), d_x.as<f16>() + width, stride, batch, kv, kv_heads, head_dim, nullptr);
        for (int64_t s = 0; s < seqs; ++s)
          for (int64_t t = start[s]; t < start[s + 1]; ++t) {
            const int64_t slot = tables[s * max_blocks + pos[t] / 16] * 16 + pos[t] % 16;
            expected[slot].assign(x.begin() + t * stride, x.begin() + t * stride + 2 * width);
          }
        const Int8Rows k_rows(cache.k, cache.k8, kv_heads, head_dim), v_rows(cache.v, cache.v8, kv_heads, head_dim);
        for (size_t slot = 0; slot < expected.size(); ++slot)
          for (int64_t h = 0; h < kv_heads; ++h) {
            const int64_t row = cuda::kv8_row(static_cast<int64_t>(slot) / 16, h, static_cast<int64_t>(slot) % 16, kv_heads);
            const std::string what = name + (pass ? " overwrite" : " write") + " slot " + std::to_string(slot) +
                                     " head " + std::to_string(h);
            if (expected[slot].empty()) {  // never written: the poison is still there
              ASSERT_EQ(k_rows.scale_bits(row), 0xffff) << what;
              ASSERT_EQ(k_rows.code(row, 0), -1) << what;
              continue;
            }
            expect_kv8_row(k_rows, row, expected[slot].data() + h * head_dim, what + " K");
            expect_kv8_row(v_rows, row, expected[slot].data() + width + h * head_dim, what + " V");
          }
      }
    }
  }
}

// rope_kv_write into an int8 cache (with and without a family's biases and q/k norms): the qkv rows
// end as the f16 cache's call leaves them, bitwise, and the cache holds kv8's codes of the rotated k
// and the v rows the f16 cache gets.
TEST_F(Gpu, RopeKvWriteInt8QuantizesTheF16CachesRows) {
  for (auto [heads, kv_heads, head_dim] : {std::tuple{8, 2, 64}, {32, 8, 128}, {4, 4, 32}, {4, 1, 256}}) {
    for (const bool with_prologue : {false, true}) {
      const std::vector<int64_t> run_lengths = {1, 5, 17}, run_starts = {40, 0, 3};
      const int64_t seqs = 3, max_blocks = 8, kv_width = kv_heads * head_dim;
      const int64_t width = heads * head_dim + 2 * kv_width, stride = width + 8;
      std::vector<int32_t> query_start{0}, positions;
      for (int64_t s = 0; s < seqs; ++s) {
        for (int64_t i = 0; i < run_lengths[s]; ++i) positions.push_back(static_cast<int32_t>(run_starts[s] + i));
        query_start.push_back(static_cast<int32_t>(positions.size()));
      }
      const int64_t tokens = static_cast<int64_t>(positions.size());
      std::vector<int32_t> tables(static_cast<size_t>(seqs * max_blocks));
      std::iota(tables.begin(), tables.end(), 0);
      std::shuffle(tables.begin(), tables.end(), rng());
      std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
      for (int i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / head_dim);
      const std::vector<f16> qkv = to_f16(random_f16_values(static_cast<size_t>(tokens * stride)));
      auto d_tables = upload(tables);
      auto d_start = upload(query_start);
      auto d_positions = upload(positions);
      auto d_inv = upload(inv_freq);
      auto d_bias = upload(random_f16_values(static_cast<size_t>(width), 2.0f));
      std::vector<float> weights = random_f16_values(static_cast<size_t>(head_dim), 0.3f);
      for (float& w : weights) w += 1.0f;
      auto d_norm = upload(weights);
      cuda::QkvPrologue prologue;
      if (with_prologue) {
        prologue.bias = d_bias.as<float>();
        prologue.q_norm = prologue.k_norm = d_norm.as<float>();
      }
      const cuda::QueryBatch batch{seqs, tokens, d_start.as<int32_t>(), d_positions.as<int32_t>(), 17, 57};
      // The f16 cache's call: its rows and its pool.
      const size_t pool_halves = static_cast<size_t>(seqs * max_blocks * 16 * kv_width);
      auto d_f16_qkv = upload(qkv);
      auto d_k = poisoned(pool_halves * 2), d_v = poisoned(pool_halves * 2);
      const cuda::PagedKv f16_kv{d_k.as<f16>(), d_v.as<f16>(), d_tables.as<int32_t>(), max_blocks};
      cuda::rope_kv_write(d_f16_qkv.as<f16>(), stride, heads, kv_heads, head_dim, batch, d_inv.as<float>(), 1.1f, f16_kv,
                          nullptr, prologue);
      const std::vector<float> k_pool = from_f16(download<f16>(d_k, pool_halves));
      const std::vector<float> v_pool = from_f16(download<f16>(d_v, pool_halves));
      // The int8 cache's.
      auto d_qkv = upload(qkv);
      Int8Cache cache(seqs * max_blocks, kv_heads, head_dim);
      cuda::rope_kv_write(d_qkv.as<f16>(), stride, heads, kv_heads, head_dim, batch, d_inv.as<float>(), 1.1f,
                          cache.paged(d_tables.as<int32_t>(), max_blocks, qspec::KvView::full), nullptr, prologue);
      const std::string name = shape_name({heads, kv_heads, head_dim}) + (with_prologue ? " bias + qk-norm" : "");
      ASSERT_EQ(download<f16>(d_qkv, qkv.size()), download<f16>(d_f16_qkv, qkv.size())) << name << ": qkv rows";
      const Int8Rows k_rows(cache.k, cache.k8, kv_heads, head_dim), v_rows(cache.v, cache.v8, kv_heads, head_dim);
      for (int64_t s = 0; s < seqs; ++s)
        for (int64_t t = query_start[s]; t < query_start[s + 1]; ++t) {
          const int64_t block = tables[s * max_blocks + positions[t] / 16], slot = block * 16 + positions[t] % 16;
          for (int64_t h = 0; h < kv_heads; ++h) {
            const int64_t row = cuda::kv8_row(block, h, positions[t] % 16, kv_heads);
            const std::string what = name + " token " + std::to_string(t) + " head " + std::to_string(h);
            expect_kv8_row(k_rows, row, k_pool.data() + slot * kv_width + h * head_dim, what + " K");
            expect_kv8_row(v_rows, row, v_pool.data() + slot * kv_width + h * head_dim, what + " V");
          }
        }
    }
  }
}

// Decode over an int8 cache (the automatic kernel: tensor cores, the f32 tiles at head_dim 32), both
// views, with and without split-K (contexts of 1 .. 9000), GQA 1-16, windows with sinks.
TEST_F(Gpu, PagedDecodeInt8MatchesCpuAttentionOverItsCodes) {
  const std::vector<AttentionCase> cases = {{8, 4, 32, 0},     {32, 8, 128, 0},        {12, 12, 64, 0},
                                            {28, 4, 128, 0},   {16, 1, 128, 0},        {9, 3, 64, 0},
                                            {32, 8, 128, 256, 16}, {8, 4, 32, 200, 7}, {12, 12, 64, 64, 4},
                                            {4, 2, 128, 8, 0, 0.0625f}, {4, 1, 256, 512}, {8, 1, 256, 0, 0, 0.0625f},
                                            {6, 3, 256, 100, 16}, {3, 3, 256, 0}};
  const std::vector<std::vector<int64_t>> batches = {{1}, {17}, {5, 16, 300, 1}, {5000}, {9000, 33}, {64}, {65, 128, 129}};
  cuda::set_decode_attention(cuda::DecodeAttention::automatic);
  for (const AttentionCase& c : cases) {
    for (const std::vector<int64_t>& contexts : batches) {
      const int64_t seqs = static_cast<int64_t>(contexts.size());
      const int64_t max_context = *std::max_element(contexts.begin(), contexts.end());
      const PagedFixture pool(contexts, c.kv_heads, c.head_dim);
      Int8Cache cache(pool.num_blocks, c.kv_heads, c.head_dim);
      auto d_tables = upload(pool.block_tables);
      write_fixture_int8(pool, contexts, cache.paged(d_tables.as<int32_t>(), pool.max_blocks, qspec::KvView::full),
                         c.kv_heads, c.head_dim);
      const int64_t q_width = c.heads * c.head_dim, q_stride = q_width + 8 * 3;
      const std::vector<float> q = random_f16_values(static_cast<size_t>(seqs * q_stride));
      std::vector<int32_t> lens(contexts.begin(), contexts.end());
      auto d_q = upload(to_f16(q));
      auto d_lens = upload(lens);
      const size_t workspace_bytes = cuda::attention_workspace_bytes(seqs, c.heads, c.head_dim, max_context);
      auto d_workspace = poisoned(workspace_bytes);
      cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
      const qspec::cpu::AttentionShape shape = c.shape();
      for (const qspec::KvView view : {qspec::KvView::full, qspec::KvView::high_nibble}) {
        auto d_out = poisoned(static_cast<size_t>(seqs * q_width) * 2);
        cuda::paged_attention_decode(d_q.as<f16>(), q_stride, seqs, d_lens.as<int32_t>(), max_context,
                                     cache.paged(d_tables.as<int32_t>(), pool.max_blocks, view), shape, d_out.as<f16>(),
                                     q_width, d_workspace.get(), workspace_bytes, nullptr);
        const std::vector<float> got = from_f16(download<f16>(d_out, static_cast<size_t>(seqs * q_width)));
        std::vector<std::vector<float>> keys, values;
        int8_reference_rows(cache, pool, contexts, view, keys, values);
        std::vector<float> expected(got.size());
        for (int64_t s = 0; s < seqs; ++s) {
          const int32_t position = static_cast<int32_t>(contexts[s] - 1);
          qspec::cpu::attention(q.data() + s * q_stride, 1, &position, keys[s].data(), values[s].data(), shape,
                                expected.data() + s * q_width);
        }
        std::string batch_name;
        for (int64_t ctx : contexts) batch_name += " " + std::to_string(ctx);
        EXPECT_CLOSE(got, expected, 4e-3, view_name(view) + std::string("decode ") + case_name(c) + " contexts" + batch_name);
      }
    }
  }
}

// The folded decode (RoPE + the new token's quantized row + attention, one launch) over an int8
// cache gives bitwise what rope_kv_write then paged_attention_decode give: the output and both
// pools whole (the new rows start poisoned), in both views; and it matches the CPU over the codes.
TEST_F(Gpu, PagedDecodeRopeInt8EqualsRopeKvWriteThenDecodeBitwise) {
  const std::vector<AttentionCase> cases = {{8, 4, 32, 0},  {32, 8, 128, 0}, {12, 12, 64, 0}, {16, 1, 128, 0},
                                            {32, 8, 128, 256, 16}, {12, 12, 64, 100, 20}, {4, 1, 256, 0},
                                            {16, 2, 256, 100, 16}};
  const std::vector<std::vector<int64_t>> batches = {{1}, {17}, {5, 16, 300, 1}, {5000}, {65, 128, 129, 32, 33}};
  cuda::set_decode_attention(cuda::DecodeAttention::automatic);
  ASSERT_TRUE(cuda::decode_rope_folded()) << "run without QSPEC_DECODE_ROPE=separate";
  for (const AttentionCase& c : cases) {
    for (const std::vector<int64_t>& contexts : batches) {
      for (const qspec::KvView view : {qspec::KvView::full, qspec::KvView::high_nibble}) {
        const PagedFixture pool(contexts, c.kv_heads, c.head_dim);
        const FoldedDecodeInputs in(pool, contexts, c);
        const int64_t seqs = in.seqs, max_context = in.max_context, q_width = in.q_width, stride = in.stride;
        const std::vector<int32_t>& positions = in.positions;
        const std::vector<f16>& qkv = in.qkv;
        const cuda::QueryBatch& batch = in.batch;
        const qspec::cpu::AttentionShape& shape = in.shape;
        const size_t workspace_bytes = in.workspace_bytes;
        const cuda::DeviceMemory &d_tables = in.d_tables, &d_lens = in.d_lens, &d_inv = in.d_inv;
        std::vector<int64_t> cached;  // every position but the new token's
        for (const int64_t context : contexts) cached.push_back(context - 1);
        const std::string name = view_name(view) + case_name(c) + " contexts " + std::to_string(contexts.front()) +
                                 ".. (" + std::to_string(seqs) + ")";
        std::vector<uint8_t> pools[2][2];
        std::vector<f16> outs[2], rows[2];
        std::vector<std::vector<float>> keys, values;
        for (int folded = 0; folded < 2; ++folded) {
          Int8Cache cache(pool.num_blocks, c.kv_heads, c.head_dim);
          const cuda::PagedKv kv = cache.paged(d_tables.as<int32_t>(), pool.max_blocks, view);
          write_fixture_int8(pool, cached, kv, c.kv_heads, c.head_dim);
          auto d_qkv = upload(qkv);
          auto d_workspace = poisoned(workspace_bytes);
          cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
          auto d_out = poisoned(static_cast<size_t>(seqs * q_width) * 2);
          if (folded) {
            cuda::paged_attention_decode_rope(d_qkv.as<f16>(), stride, batch, d_lens.as<int32_t>(), d_inv.as<float>(),
                                              1.0f, kv, shape, d_out.as<f16>(), q_width, d_workspace.get(),
                                              workspace_bytes, nullptr);
          } else {
            cuda::rope_kv_write(d_qkv.as<f16>(), stride, c.heads, c.kv_heads, c.head_dim, batch, d_inv.as<float>(),
                                1.0f, kv, nullptr);
            cuda::paged_attention_decode(d_qkv.as<f16>(), stride, seqs, d_lens.as<int32_t>(), max_context, kv, shape,
                                         d_out.as<f16>(), q_width, d_workspace.get(), workspace_bytes, nullptr);
            rows[0] = download<f16>(d_qkv, qkv.size());  // rotated in place: the CPU reference's q
            int8_reference_rows(cache, pool, contexts, view, keys, values);
          }
          outs[folded] = download<f16>(d_out, static_cast<size_t>(seqs * q_width));
          pools[folded][0] = download<uint8_t>(cache.k, cache.bytes);
          pools[folded][1] = download<uint8_t>(cache.v, cache.bytes);
        }
        ASSERT_TRUE(pools[1][0] == pools[0][0]) << name << ": K cache differs";
        ASSERT_TRUE(pools[1][1] == pools[0][1]) << name << ": V cache differs";
        ASSERT_TRUE(outs[1] == outs[0]) << name << ": output differs";
        const std::vector<float> q_rotated = from_f16(rows[0]);
        std::vector<float> expected(static_cast<size_t>(seqs * q_width));
        for (int64_t s = 0; s < seqs; ++s)
          qspec::cpu::attention(q_rotated.data() + s * stride, 1, &positions[s], keys[s].data(), values[s].data(), shape,
                                expected.data() + s * q_width);
        EXPECT_CLOSE(from_f16(outs[1]), expected, 4e-3, "folded decode " + name);
      }
    }
  }
}

// Prefill and QSpec verify runs over an int8 cache (the runs' own rows written by paged_kv_write
// first): multi-token runs, key warps 1 / 2 / 4, split-K over long caches, windows and sinks, both views.
TEST_F(Gpu, PagedKvWriteInt8ThenPrefillMatchesCpuAttentionOverItsCodes) {
  struct Run {
    int64_t cached, new_tokens;
  };
  const std::vector<AttentionCase> cases = {{8, 4, 32, 0},  {32, 8, 128, 0}, {12, 12, 64, 0}, {28, 4, 128, 0},
                                            {9, 3, 64, 0},  {32, 8, 128, 77}, {32, 8, 128, 77, 16},
                                            {4, 2, 128, 8, 0, 0.0625f}, {4, 1, 256, 0}, {8, 2, 256, 77, 16}};
  const std::vector<std::vector<Run>> batches = {{{0, 1}},   {{0, 17}, {40, 5}, {100, 1}}, {{5000, 5}}, {{0, 300}, {3, 64}},
                                                 {{2000, 5}, {2000, 5}, {63, 2}, {1, 65}},
                                                 {{3000, 4}, {700, 4}, {64, 4}}};
  for (const AttentionCase& c : cases) {
    for (const std::vector<Run>& runs : batches) {
      std::vector<int64_t> contexts, cached;
      for (const Run& r : runs) {
        contexts.push_back(r.cached + r.new_tokens);
        cached.push_back(r.cached);
      }
      const int64_t seqs = static_cast<int64_t>(runs.size());
      const int64_t max_context = *std::max_element(contexts.begin(), contexts.end());
      const PagedFixture pool(contexts, c.kv_heads, c.head_dim);
      Int8Cache cache(pool.num_blocks, c.kv_heads, c.head_dim);
      auto d_tables = upload(pool.block_tables);
      const cuda::PagedKv kv_full = cache.paged(d_tables.as<int32_t>(), pool.max_blocks, qspec::KvView::full);
      write_fixture_int8(pool, cached, kv_full, c.kv_heads, c.head_dim);  // the cached part (none for 0)
      std::vector<int32_t> query_start{0}, positions;
      int64_t max_run = 0;
      for (size_t s = 0; s < runs.size(); ++s) {
        for (int64_t p = runs[s].cached; p < contexts[s]; ++p) positions.push_back(static_cast<int32_t>(p));
        query_start.push_back(static_cast<int32_t>(positions.size()));
        max_run = std::max(max_run, runs[s].new_tokens);
      }
      const int64_t tokens = static_cast<int64_t>(positions.size());
      const int64_t q_width = c.heads * c.head_dim, stride = q_width + 2 * pool.kv_width;
      std::vector<float> qkv = random_f16_values(static_cast<size_t>(tokens * stride));
      for (int64_t s = 0, t = 0; s < seqs; ++s)
        for (int64_t p = runs[s].cached; p < contexts[s]; ++p, ++t)
          for (int64_t i = 0; i < pool.kv_width; ++i) {
            qkv[t * stride + q_width + i] = pool.keys[s][p * pool.kv_width + i];
            qkv[t * stride + q_width + pool.kv_width + i] = pool.values[s][p * pool.kv_width + i];
          }
      auto d_qkv = upload(to_f16(qkv));
      auto d_start = upload(query_start);
      auto d_positions = upload(positions);
      const cuda::QueryBatch batch{seqs, tokens, d_start.as<int32_t>(), d_positions.as<int32_t>(), max_run, max_context};
      const f16* q = d_qkv.as<f16>();
      cuda::paged_kv_write(q + q_width, q + q_width + pool.kv_width, stride, batch, kv_full, c.kv_heads, c.head_dim,
                           nullptr);
      std::vector<float> q_rows(static_cast<size_t>(tokens * q_width));
      for (int64_t t = 0; t < tokens; ++t)
        std::copy(qkv.begin() + t * stride, qkv.begin() + t * stride + q_width, q_rows.begin() + t * q_width);
      const size_t workspace_bytes = cuda::attention_workspace_bytes(tokens, c.heads, c.head_dim, max_context);
      auto d_workspace = poisoned(workspace_bytes);
      cuda::attention_workspace_init(d_workspace.get(), workspace_bytes, nullptr);
      const qspec::cpu::AttentionShape shape = c.shape();
      for (const qspec::KvView view : {qspec::KvView::full, qspec::KvView::high_nibble}) {
        auto d_out = poisoned(static_cast<size_t>(tokens * q_width) * 2);
        cuda::paged_attention_prefill(q, stride, batch, cache.paged(d_tables.as<int32_t>(), pool.max_blocks, view), shape,
                                      d_out.as<f16>(), q_width, d_workspace.get(), workspace_bytes, nullptr);
        const std::vector<float> got = from_f16(download<f16>(d_out, static_cast<size_t>(tokens * q_width)));
        std::vector<std::vector<float>> keys, values;
        int8_reference_rows(cache, pool, contexts, view, keys, values);
        std::vector<float> expected(got.size());
        for (size_t s = 0; s < runs.size(); ++s) {
          const int64_t first = query_start[s];
          qspec::cpu::attention(q_rows.data() + first * q_width, runs[s].new_tokens, positions.data() + first,
                                keys[s].data(), values[s].data(), shape, expected.data() + first * q_width);
        }
        std::string batch_name;
        for (const Run& r : runs) batch_name += " " + std::to_string(r.cached) + "+" + std::to_string(r.new_tokens);
        EXPECT_CLOSE(got, expected, 4e-3, view_name(view) + std::string("prefill ") + case_name(c) + " runs" + batch_name);
      }
    }
  }
}

// What an int8 cache refuses: the decode kernels automatic does not pick (chunked; the f32 tiles at
// head_dim 64 and up), and the 4-bit view of an f16 cache.
TEST_F(Gpu, AttentionInt8RefusesOtherDecodeKernelsAndF16HighNibble) {
  Int8Cache cache(2, 2, 64);
  const std::vector<int32_t> tables = {0, 1};
  auto d_tables = upload(tables);
  const std::vector<int32_t> lens = {20};
  auto d_lens = upload(lens);
  auto d_q = upload(to_f16(random_f16_values(256)));
  auto d_out = poisoned(512);
  const qspec::cpu::AttentionShape shape{4, 2, 64, 0};
  const cuda::PagedKv kv = cache.paged(d_tables.as<int32_t>(), 2, qspec::KvView::full);
  for (const cuda::DecodeAttention kernel : {cuda::DecodeAttention::chunked, cuda::DecodeAttention::tiles}) {
    cuda::set_decode_attention(kernel);
    EXPECT_THROW(cuda::paged_attention_decode(d_q.as<f16>(), 256, 1, d_lens.as<int32_t>(), 20, kv, shape,
                                              d_out.as<f16>(), 256, nullptr, 0, nullptr),
                 qspec::Error);
  }
  cuda::set_decode_attention(cuda::DecodeAttention::automatic);
  cuda::PagedKv f16_high{reinterpret_cast<f16*>(cache.k.get()), reinterpret_cast<f16*>(cache.v.get()),
                         d_tables.as<int32_t>(), 2};
  f16_high.view = qspec::KvView::high_nibble;
  try {
    cuda::paged_attention_decode(d_q.as<f16>(), 256, 1, d_lens.as<int32_t>(), 20, f16_high, shape, d_out.as<f16>(), 256,
                                 nullptr, 0, nullptr);
    ADD_FAILURE() << "the 4-bit view of an f16 cache was taken";
  } catch (const qspec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("high_nibble"), std::string::npos) << e.what();
  }
}

// ---- GEMMs ---------------------------------------------------------------------------------

namespace {

qspec::QuantizedMatrix random_quantized(int64_t n, int64_t k, qspec::quant::Format format, int64_t group) {
  qspec::WeightMatrix matrix;
  matrix.name = "gpu.weight";
  matrix.dtype = qspec::DType::F32;
  matrix.rows = n;
  matrix.cols = k;
  matrix.owned = random_f16_values(static_cast<size_t>(n * k), 0.05f);
  matrix.data = matrix.owned.data();
  return qspec::quantize_rtn(matrix, format, group);
}

// The CPU reference of a 4-bit GEMM on activations in `mode`: x's m rows (ldx apart, k used)
// quantized per token by cpu::apply_activation_mode, times the dequantized weights.
std::vector<float> cpu_quantized_linear(const std::vector<float>& x, int64_t m, int64_t ldx, int64_t k,
                                        const qspec::ActivationMode& mode, const qspec::QuantizedMatrix& weight) {
  std::vector<float> x_dense(static_cast<size_t>(m * k));
  for (int64_t t = 0; t < m; ++t) std::copy(x.begin() + t * ldx, x.begin() + t * ldx + k, x_dense.begin() + t * k);
  qspec::cpu::apply_activation_mode(mode, x_dense.data(), m, k);
  std::vector<float> y(static_cast<size_t>(m * weight.rows));
  qspec::cpu::quantized_linear(x_dense.data(), m, weight, nullptr, y.data());
  return y;
}

// int4-asym: the minimums follow the scales in their buffer (cuda::W4A16Weights::mins).
std::vector<uint32_t> scales_then_mins(const qspec::gemm::W4A16Packed& packed) {
  std::vector<uint32_t> words = packed.scales;
  words.insert(words.end(), packed.mins.begin(), packed.mins.end());
  return words;
}

struct DeviceW4 {
  cuda::DeviceMemory codes, scales;
  cuda::W4A16Weights view;
  explicit DeviceW4(const qspec::gemm::W4A16Packed& packed)
      : codes(upload(packed.codes)), scales(upload(scales_then_mins(packed))) {
    view = {codes.get(), scales.get(), packed.n, packed.k, packed.group};
    if (packed.has_min()) view.mins = scales.as<uint32_t>() + packed.scales.size();
    view.zero_codes = packed.zero_codes;
  }
};

// Random int4-asym weights with their group scales and minimums rounded to the f16 values the
// GPU keeps (gemm::round_zero_point_blocks_to_f16), so the CPU reference computes with the
// GPU's weights; or int4-zp weights (the GPU's already: f16 scales, integer zero points).
qspec::QuantizedMatrix random_zero_point_weights(int64_t n, int64_t k, int64_t group,
                                                 qspec::quant::Format format = qspec::quant::Format::int4_asym) {
  qspec::QuantizedMatrix weight = random_quantized(n, k, format, group);
  qspec::gemm::round_zero_point_blocks_to_f16(weight);
  return weight;
}
// The two formats with a word a group beside the scales (cuda::W4A16Weights::mins).
constexpr qspec::quant::Format kZeroPointFormats[] = {qspec::quant::Format::int4_asym, qspec::quant::Format::int4_zp};

}  // namespace

TEST_F(Gpu, W4A16DequantizeIsExact) {
  for (auto [n, k, group] : {std::tuple{33, 96, 32}, {130, 704, 64}, {7, 4096, 128}}) {
    const qspec::QuantizedMatrix weight = random_quantized(n, k, qspec::quant::Format::int4, group);
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    DeviceW4 w(packed);
    auto d_out = poisoned(static_cast<size_t>(n * k) * 2);
    cuda::w4a16_dequantize(w.view, d_out.as<f16>(), nullptr);
    const std::vector<f16> out = download<f16>(d_out, static_cast<size_t>(n * k));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(out[r * k + c], qspec::f32_to_f16(packed.value(r, c))) << shape_name({n, k}) << " " << r << "," << c;
  }
}

// The 128 x 256 wgmma tile's producer warpgroup leaves once its copies are out (its registers go to
// the mma warpgroups), so the tile has no split-K fix-up: a split request is an error, not partials
// left unsummed.
TEST_F(Gpu, W4A16WgmmaPrefillTileRefusesSplitK) {
  if (!cuda::w4a16_wgmma_tile_runs_here()) GTEST_SKIP() << "the wgmma tiles need an sm_90a GPU";
  const qspec::QuantizedMatrix weight = random_quantized(256, 512, qspec::quant::Format::int4, 128);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  const int64_t m = 300;
  cuda::DeviceMemory x(static_cast<size_t>(m * 512) * 2), y(static_cast<size_t>(m * 256) * 2);
  const size_t bytes = cuda::w4a16_workspace_bytes(1, 256, 512, cuda::W4A16Path::tiled) + static_cast<size_t>(2 * m * 256) * 4;
  cuda::DeviceMemory workspace(bytes);
  cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
  EXPECT_THROW(cuda::w4a16_gemm_tiled(x.as<f16>(), m, 512, w.view, y.as<f16>(), 256, workspace.get(), bytes, nullptr,
                                      cuda::W4A16TiledConfig{cuda::kW4A16WgmmaTile128x256, 2}),
               qspec::Error);
}

TEST_F(Gpu, W4A16GemmMatchesCpuOverShapesAndPaths) {
  using qspec::quant::Format;
  struct Shape {
    int64_t n, k;
    Format format;
    int64_t group;
  };
  const std::vector<Shape> shapes = {{256, 256, Format::int4, 64},   {1408, 256, Format::int4, 64},
                                     {256, 704, Format::int4, 64},   {33, 96, Format::int4, 32},
                                     {4097, 4096, Format::int4, 128}, {1000, 160, Format::int4, 32},
                                     {7, 384, Format::int4_channel, 128}, {129, 1024, Format::int4, 256}};
  const std::vector<int64_t> ms = {1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 64, 65, 100, 128, 257, 1024, 4096};
  qspec::cuda::Blas blas;
  for (const Shape& s : shapes) {
    const qspec::QuantizedMatrix weight = random_quantized(s.n, s.k, s.format, s.group);
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    DeviceW4 w(packed);
    for (int64_t m : ms) {
      if (s.n * s.k * m > 6e9) continue;  // CPU reference time
      const int64_t ldx = s.k + 8, ldy = s.n + 3;  // strided rows
      const std::vector<float> x = random_f16_values(static_cast<size_t>(m * ldx));
      std::vector<float> x_dense(static_cast<size_t>(m * s.k));
      for (int64_t t = 0; t < m; ++t)
        std::copy(x.begin() + t * ldx, x.begin() + t * ldx + s.k, x_dense.begin() + t * s.k);
      std::vector<float> expected(static_cast<size_t>(m * s.n));
      qspec::cpu::quantized_linear(x_dense.data(), m, weight, nullptr, expected.data());
      const std::vector<f16> x_f16 = to_f16(x);
      auto d_x = upload(x_f16);
      // x in the packed k order (W4A16TiledConfig::x_packed): what a producer of x would write.
      auto d_x_packed = upload(qspec::gemm::w4a16_pack_x_order(x_f16.data(), m, s.k, ldx));
      struct Path {
        const char* name;
        cuda::W4A16Path path;
        cuda::W4A16SmallMConfig config;
        double bound;
        cuda::W4A16TiledConfig tiled = {};
      };
      const auto tiled = [](const char* name, int tile, int splits) {
        return Path{name, cuda::W4A16Path::tiled, {}, 2e-3, {tile, splits}};
      };
      const auto packed_x = [](const char* name, int tile, int splits) {
        return Path{name, cuda::W4A16Path::tiled, {}, 2e-3, {tile, splits, /*x_packed=*/true}};
      };
      std::vector<Path> paths = {{"small_m v1", cuda::W4A16Path::small_m, {1, 0}, 2e-3},
                                 {"small_m v2", cuda::W4A16Path::small_m, {2, 0}, 2e-3},
                                 {"small_m split3", cuda::W4A16Path::small_m, {1, 3}, 2e-3},
                                 {"small_m v1 x shared", cuda::W4A16Path::small_m, {1, 0, 1}, 2e-3},
                                 {"small_m v1 x global", cuda::W4A16Path::small_m, {1, 0, 2}, 2e-3},
                                 {"small_m v2 x global split3", cuda::W4A16Path::small_m, {2, 3, 2}, 2e-3},
                                 {"small_m v3", cuda::W4A16Path::small_m, {3, 0}, 2e-3},
                                 {"small_m v3 split5", cuda::W4A16Path::small_m, {3, 5}, 2e-3},
                                 {"small_m v4", cuda::W4A16Path::small_m, {4, 0}, 2e-3},
                                 {"small_m v4 split2", cuda::W4A16Path::small_m, {4, 2}, 2e-3},
                                 {"small_m v5", cuda::W4A16Path::small_m, {5, 0}, 2e-3},
                                 {"small_m v5 split3", cuda::W4A16Path::small_m, {5, 3}, 2e-3},
                                 tiled("tiled auto", 0, 0),
                                 tiled("tiled 256x64", 1, 1),
                                 tiled("tiled 256x64 split3", 1, 3),
                                 tiled("tiled 128x64", 2, 1),
                                 tiled("tiled 128x64 split2", 2, 2),
                                 tiled("tiled 256x32", 3, 1),
                                 tiled("tiled 256x32 split5", 3, 5),
                                 tiled("tiled 128x128", 4, 1),
                                 tiled("tiled 128x128 split4", 4, 4),
                                 tiled("tiled wgmma 128x64", cuda::kW4A16WgmmaTile, 1),
                                 tiled("tiled wgmma 128x64 split3", cuda::kW4A16WgmmaTile, 3),
                                 tiled("tiled wgmma 128x32", cuda::kW4A16WgmmaTile32, 1),
                                 tiled("tiled wgmma 128x32 split5", cuda::kW4A16WgmmaTile32, 5),
                                 tiled("tiled wgmma 128x128", cuda::kW4A16WgmmaTile128, 1),
                                 tiled("tiled wgmma 128x128 split2", cuda::kW4A16WgmmaTile128, 2),
                                 tiled("tiled wgmma 256x32", cuda::kW4A16WgmmaTile256x32, 1),
                                 tiled("tiled wgmma 256x32 split3", cuda::kW4A16WgmmaTile256x32, 3),
                                 tiled("tiled wgmma 256x64", cuda::kW4A16WgmmaTile256x64, 1),
                                 tiled("tiled wgmma 256x64 split2", cuda::kW4A16WgmmaTile256x64, 2),
                                 tiled("tiled wgmma 128x256", cuda::kW4A16WgmmaTile128x256, 1),
                                 packed_x("tiled wgmma 128x64 x packed", cuda::kW4A16WgmmaTile, 1),
                                 packed_x("tiled wgmma 128x32 x packed split3", cuda::kW4A16WgmmaTile32, 3),
                                 packed_x("tiled wgmma 128x128 x packed split2", cuda::kW4A16WgmmaTile128, 2),
                                 packed_x("tiled wgmma 256x64 x packed", cuda::kW4A16WgmmaTile256x64, 1),
                                 packed_x("tiled wgmma 128x256 x packed", cuda::kW4A16WgmmaTile128x256, 1),
                                 tiled("tiled 128x32", cuda::kW4A16Tile128x32, 1),
                                 tiled("tiled 128x32 split3", cuda::kW4A16Tile128x32, 3),
                                 {"dequant+cublas", cuda::W4A16Path::dequant_cublas, {}, 3e-3},
                                 {"automatic", cuda::W4A16Path::automatic, {}, 3e-3}};
      for (const Path& path : paths) {
        // small_m: the same kernel as v1 past 64 (sliced); tiled runs at every m.
        if (path.path == cuda::W4A16Path::small_m && path.config.variant >= 2 && m > 64) continue;
        // The wgmma tiles run on sm_90a only (an H100 / H200 runs them here).
        if (cuda::w4a16_is_wgmma_tile(path.tiled.tile) && !cuda::w4a16_wgmma_tile_runs_here()) continue;
        const size_t bytes = std::max(cuda::w4a16_workspace_bytes(m, s.n, s.k, path.path),
                                      cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::small_m) * 4);
        // The tiled split-K runs ask for more splits than its heuristic's bound: room for 5.
        const size_t launch_bytes =
            path.path != cuda::W4A16Path::tiled
                ? bytes
                : std::max(bytes, cuda::w4a16_workspace_bytes(1, s.n, s.k, cuda::W4A16Path::tiled) +
                                      static_cast<size_t>(5 * m * s.n) * sizeof(float));
        cuda::DeviceMemory workspace(launch_bytes);
        cuda::w4a16_workspace_init(workspace.get(), launch_bytes, nullptr);
        auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
        const f16* tiled_x = path.tiled.x_packed ? d_x_packed.as<f16>() : d_x.as<f16>();
        if (path.path == cuda::W4A16Path::small_m)
          cuda::w4a16_gemm_small_m(d_x.as<f16>(), m, ldx, w.view, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr,
                                   path.config);
        else if (path.path == cuda::W4A16Path::tiled)
          cuda::w4a16_gemm_tiled(tiled_x, m, ldx, w.view, d_y.as<f16>(), ldy, workspace.get(), launch_bytes, nullptr,
                                 path.tiled);
        else
          cuda::w4a16_gemm(blas, d_x.as<f16>(), m, ldx, w.view, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr,
                           path.path);
        const std::vector<float> y = from_f16(download<f16>(d_y, static_cast<size_t>(m * ldy)));
        std::vector<float> got(expected.size());
        for (int64_t t = 0; t < m; ++t)
          std::copy(y.begin() + t * ldy, y.begin() + t * ldy + s.n, got.begin() + t * s.n);
        EXPECT_CLOSE(got, expected, path.bound,
                     std::string(path.name) + " m" + std::to_string(m) + " n" + std::to_string(s.n) + " k" +
                         std::to_string(s.k) + " g" + std::to_string(s.group));
        // A second launch on the same workspace: split-K counters were left at zero.
        const bool rerun = (path.path == cuda::W4A16Path::small_m && m <= 16) ||
                           (path.path == cuda::W4A16Path::tiled && m <= 128);
        if (rerun) {
          auto d_y2 = poisoned(static_cast<size_t>(m * ldy) * 2);
          if (path.path == cuda::W4A16Path::small_m)
            cuda::w4a16_gemm_small_m(d_x.as<f16>(), m, ldx, w.view, d_y2.as<f16>(), ldy, workspace.get(), bytes,
                                     nullptr, path.config);
          else
            cuda::w4a16_gemm_tiled(tiled_x, m, ldx, w.view, d_y2.as<f16>(), ldy, workspace.get(), launch_bytes,
                                   nullptr, path.tiled);
          const std::vector<f16> again = download<f16>(d_y2, static_cast<size_t>(m * ldy));
          const std::vector<f16> first = to_f16(y);
          for (int64_t t = 0; t < m; ++t)
            for (int64_t i = 0; i < s.n; ++i)
              ASSERT_EQ(again[t * ldy + i], first[t * ldy + i]) << path.name << " is not deterministic";
        }
      }
    }
  }
}

TEST_F(Gpu, W4A16DequantizeZeroPointsIsExact) {
  // int4-asym: f16(fma(code, scale, min)) of the unsigned codes, one rounding; int4-zp: f16((u - z)
  // * s); groups 32 / 64 / 128, k tails of one 32-value pair, odd n (rows past n in the last row
  // block zero).
  for (const qspec::quant::Format format : kZeroPointFormats)
  for (auto [n, k, group] : {std::tuple{33, 96, 32}, {130, 704, 64}, {7, 4096, 128}, {17, 512, 256}}) {
    const qspec::QuantizedMatrix weight = random_zero_point_weights(n, k, group, format);
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    ASSERT_TRUE(packed.has_min());
    ASSERT_EQ(packed.zero_codes, format == qspec::quant::Format::int4_zp);
    DeviceW4 w(packed);
    auto d_out = poisoned(static_cast<size_t>(n * k) * 2);
    cuda::w4a16_dequantize(w.view, d_out.as<f16>(), nullptr);
    const std::vector<f16> out = download<f16>(d_out, static_cast<size_t>(n * k));
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      weight.dequantize_row(r, row.data());
      for (int64_t c = 0; c < k; ++c) {
        ASSERT_EQ(packed.value(r, c), row[c]) << "the packed layout decodes to the CPU's weights";
        ASSERT_EQ(out[r * k + c], qspec::f32_to_f16(row[c])) << shape_name({n, k}) << " " << r << "," << c;
      }
    }
  }
}

// int4-asym weights (zero points) against the CPU's quantized_linear on the same (f16-rounded)
// blocks, at the M values of every W4A16 path: through the automatic path and the GEMM
// dispatcher (every strategy of a policy map must land on a kernel that runs zero points), and
// on each path directly: the paths of cuda::w4a16_runs_zero_points compare, the others refuse
// the weights rather than read unsigned codes as int4.
TEST_F(Gpu, W4A16ZeroPointsMatchCpuOverShapesAndPaths) {
  struct Shape {
    int64_t n, k, group;
  };
  const std::vector<Shape> shapes = {{256, 256, 64}, {33, 96, 32},  {1000, 160, 32},
                                     {129, 704, 64}, {4097, 4096, 128}, {7, 512, 256}};
  const std::vector<int64_t> ms = {1, 2, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 257, 1024};
  qspec::cuda::Blas blas;
  for (const qspec::quant::Format format : kZeroPointFormats)
  for (const Shape& s : shapes) {
    const qspec::QuantizedMatrix weight = random_zero_point_weights(s.n, s.k, s.group, format);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    for (int64_t m : ms) {
      if (s.n * s.k * m > 6e9) continue;  // CPU reference time
      const int64_t ldx = s.k + 8, ldy = s.n + 3;
      const std::vector<float> x = random_f16_values(static_cast<size_t>(m * ldx));
      std::vector<float> x_dense(static_cast<size_t>(m * s.k));
      for (int64_t t = 0; t < m; ++t)
        std::copy(x.begin() + t * ldx, x.begin() + t * ldx + s.k, x_dense.begin() + t * s.k);
      std::vector<float> expected(static_cast<size_t>(m * s.n));
      qspec::cpu::quantized_linear(x_dense.data(), m, weight, nullptr, expected.data());
      const std::vector<f16> x_f16 = to_f16(x);
      auto d_x = upload(x_f16);
      // x in the packed k order (W4A16TiledConfig::x_packed), for the wgmma tiles' PX instances.
      auto d_x_packed = upload(qspec::gemm::w4a16_pack_x_order(x_f16.data(), m, s.k, ldx));
      size_t bytes = cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::dequant_cublas);
      for (auto path : {cuda::W4A16Path::small_m, cuda::W4A16Path::tiled})
        bytes = std::max(bytes, cuda::w4a16_workspace_bytes(m, s.n, s.k, path));
      // Room for the explicit tiled splits below (up to 3).
      bytes = std::max(bytes, cuda::w4a16_workspace_bytes(1, s.n, s.k, cuda::W4A16Path::tiled) +
                                  static_cast<size_t>(3 * m * s.n) * sizeof(float));
      cuda::DeviceMemory workspace(bytes);
      cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
      const std::string name = " " + std::string(qspec::quant::format_name(format)) + " m" + std::to_string(m) + " n" +
                               std::to_string(s.n) + " k" + std::to_string(s.k) + " g" + std::to_string(s.group);
      auto check = [&](const std::string& what, auto&& launch) {
        auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
        launch(d_y.as<f16>());
        const std::vector<float> y = from_f16(download<f16>(d_y, static_cast<size_t>(m * ldy)));
        std::vector<float> got(expected.size());
        for (int64_t t = 0; t < m; ++t) std::copy(y.begin() + t * ldy, y.begin() + t * ldy + s.n, got.begin() + t * s.n);
        EXPECT_CLOSE(got, expected, 3e-3, what + name);
      };
      check("automatic", [&](f16* y) {
        cuda::w4a16_gemm(blas, d_x.as<f16>(), m, ldx, w.view, y, ldy, workspace.get(), bytes, nullptr);
      });
      // Where the automatic path reads x in the packed order (wgmma tiles, 17-256 tokens), it
      // must compute the same product from it.
      if (cuda::w4a16_gemm_reads_packed_x(m, w.view))
        check("automatic x packed", [&](f16* y) {
          cuda::w4a16_gemm(blas, d_x_packed.as<f16>(), m, ldx, w.view, y, ldy, workspace.get(), bytes, nullptr,
                           cuda::W4A16Path::automatic, /*x_packed=*/true);
        });
      check("dequant+cublas", [&](f16* y) {
        cuda::w4a16_gemm(blas, d_x.as<f16>(), m, ldx, w.view, y, ldy, workspace.get(), bytes, nullptr,
                         cuda::W4A16Path::dequant_cublas);
      });
      EXPECT_TRUE(cuda::w4a16_runs_zero_points(cuda::w4a16_choose_path(m, w.view), m)) << name;
      // Every f16 strategy a policy map may name, through run_w4_gemm (what dispatch_w4_gemm runs).
      const qspec::W4GemmInput input{d_x.as<f16>(), ldx, nullptr};
      for (qspec::gemm::Strategy strategy : qspec::gemm::strategies_for("f16")) {
        if ((strategy == qspec::gemm::Strategy::wgmma_128x128 || strategy == qspec::gemm::Strategy::wgmma_128x256) &&
            !cuda::w4a16_wgmma_tile_runs_here())
          continue;
        check(std::string("strategy ") + std::string(qspec::gemm::strategy_name(strategy)), [&](f16* y) {
          qspec::run_w4_gemm(strategy, blas, input, m, w.view, y, ldy, workspace.get(), bytes, nullptr);
        });
      }
      // The small-M and tiled entry points: compared where they run zero points, refused elsewhere.
      if (m <= 64) {
        auto small_m = [&](f16* y) {
          cuda::w4a16_gemm_small_m(d_x.as<f16>(), m, ldx, w.view, y, ldy, workspace.get(), bytes, nullptr);
        };
        if (cuda::w4a16_runs_zero_points(cuda::W4A16Path::small_m, m)) {
          check("small_m", small_m);
        } else {
          auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
          EXPECT_THROW(small_m(d_y.as<f16>()), qspec::Error) << name;
        }
      }
      // The tiled path: its own tile by m, then each tile with a zero-point instance (the wgmma
      // tiles, 128x64 and 128x32) in one split and in several; the other mma.sync tiles are refused.
      for (auto [tile, splits] : {std::pair{0, 0}, {cuda::kW4A16WgmmaTile32, 1}, {cuda::kW4A16WgmmaTile32, 3},
                                  {cuda::kW4A16WgmmaTile, 1}, {cuda::kW4A16WgmmaTile, 2},
                                  {cuda::kW4A16WgmmaTile128, 1}, {cuda::kW4A16WgmmaTile128, 2},
                                  {cuda::kW4A16WgmmaTile256x32, 2}, {cuda::kW4A16WgmmaTile256x64, 1},
                                  {cuda::kW4A16WgmmaTile128x256, 1}, {2, 1}, {2, 3},
                                  {cuda::kW4A16Tile128x32, 1}, {cuda::kW4A16Tile128x32, 2}, {1, 1}, {3, 1}}) {
        auto tiled = [&](f16* y) {
          cuda::w4a16_gemm_tiled(d_x.as<f16>(), m, ldx, w.view, y, ldy, workspace.get(), bytes, nullptr,
                                 cuda::W4A16TiledConfig{tile, splits});
        };
        const std::string what = "tiled " + std::to_string(tile) + " split" + std::to_string(splits);
        const bool has_instance =
            tile == 0 || tile == 2 || tile == cuda::kW4A16Tile128x32 || cuda::w4a16_is_wgmma_tile(tile);
        if (cuda::w4a16_runs_zero_points(cuda::W4A16Path::tiled, m) && has_instance) {
          check(what, tiled);
          // The wgmma tiles' zero-point instances with x in the packed k order (ZP / ZC with PX).
          if (tile != 0 && cuda::w4a16_is_wgmma_tile(tile))
            check(what + " x packed", [&](f16* y) {
              cuda::w4a16_gemm_tiled(d_x_packed.as<f16>(), m, ldx, w.view, y, ldy, workspace.get(), bytes, nullptr,
                                     cuda::W4A16TiledConfig{tile, splits, /*x_packed=*/true});
            });
        } else {
          auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
          EXPECT_THROW(tiled(d_y.as<f16>()), qspec::Error) << what << name;
        }
      }
    }
  }
  // Quantized activations (W4A8 and below): a strategy's kernel alone computes the symmetric codes'
  // product, so it refuses zero points; dispatch_w4_gemm adds their term (tested against the CPU in
  // ZeroPointWeightsUnderQuantizedActivationsMatchCpu).
  const qspec::QuantizedMatrix weight = random_zero_point_weights(64, 256, 64);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  const int64_t m = 4;
  cuda::DeviceMemory x(static_cast<size_t>(m * 256) * 2), codes(static_cast<size_t>(m * 256) * 2),
      scales(static_cast<size_t>(m) * 4), y(static_cast<size_t>(m * 64) * 2);
  cuda::fill_bytes(x.get(), 0, x.bytes(), nullptr);
  const cuda::QuantizedActivations q = cuda::quantize_activations(qspec::quant::Format::int8, 64, x.as<f16>(), m, 256,
                                                                  256, codes.get(), 256, scales.as<float>(), 1, nullptr);
  const size_t bytes = cuda::w4a16_workspace_bytes(m, 64, 256, cuda::W4A16Path::dequant_cublas);
  cuda::DeviceMemory workspace(bytes);
  cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
  EXPECT_THROW(qspec::run_w4_gemm(qspec::gemm::Strategy::small_m_v1, blas, qspec::W4GemmInput{nullptr, 0, &q}, m,
                                  w.view, y.as<f16>(), 64, workspace.get(), bytes, nullptr),
               qspec::Error);
}

// One workspace serves every path, as in the model: a large-M launch (dequantize + cuBLAS) must
// leave the split-K counters of the small-M kernel zero, so a split-K decode launch after a
// long prefill gives the same bits as on a fresh workspace (it once did not).
// int8-group weights (the 8-bit tensors a GGUF keeps beside its 4-bit ones) on the GPU: the
// dequantization gives f16(code * scale) exactly, and the W8A16 GEMM, on the kernel (64 tokens a
// launch) and through dequantize + cuBLAS, equals the CPU's quantized_linear on the same matrix
// within the f16 bound: groups of 16 (GGUF Q6_K) / 32 (Q8_0, Q5_0) / 64, odd n (the last row
// block's rows past n), k tails of one 32-k chunk, padded x and y rows, 1-300 tokens.
TEST_F(Gpu, W8A16MatchesCpuOverShapesAndPaths) {
  struct Shape {
    int64_t n, k, group;
  };
  const std::vector<Shape> shapes = {{33, 96, 32}, {256, 256, 16}, {130, 704, 64}, {1000, 160, 32},
                                     {640, 2048, 16}, {4096, 4096, 32}};
  const std::vector<int64_t> ms = {1, 2, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 300};
  qspec::cuda::Blas blas;
  for (const Shape& s : shapes) {
    const qspec::QuantizedMatrix weight = random_quantized(s.n, s.k, qspec::quant::Format::int8_group, s.group);
    const qspec::gemm::W8A16Packed packed = qspec::gemm::pack_w8a16(weight);
    auto d_codes = upload(packed.codes);
    auto d_scales = upload(packed.scales);
    const cuda::W8A16Weights w{d_codes.get(), d_scales.as<float>(), packed.n, packed.k, packed.group};
    const std::string shape = " n" + std::to_string(s.n) + " k" + std::to_string(s.k) + " g" + std::to_string(s.group);
    {
      auto d_out = poisoned(static_cast<size_t>(s.n * s.k) * 2);
      cuda::w8a16_dequantize(w, d_out.as<f16>(), nullptr);
      const std::vector<f16> out = download<f16>(d_out, static_cast<size_t>(s.n * s.k));
      std::vector<float> row(static_cast<size_t>(s.k));
      for (int64_t r = 0; r < s.n; ++r) {
        weight.dequantize_row(r, row.data());
        for (int64_t c = 0; c < s.k; ++c)
          ASSERT_EQ(out[r * s.k + c], qspec::f32_to_f16(row[c])) << "dequantize" << shape << " " << r << "," << c;
      }
    }
    for (int64_t m : ms) {
      if (s.n * s.k * m > 3e9) continue;  // CPU reference time
      const int64_t ldx = s.k + 8, ldy = s.n + 3;
      const std::vector<float> x = random_f16_values(static_cast<size_t>(m * ldx));
      std::vector<float> x_dense(static_cast<size_t>(m * s.k));
      for (int64_t t = 0; t < m; ++t)
        std::copy(x.begin() + t * ldx, x.begin() + t * ldx + s.k, x_dense.begin() + t * s.k);
      std::vector<float> expected(static_cast<size_t>(m * s.n));
      qspec::cpu::quantized_linear(x_dense.data(), m, weight, nullptr, expected.data());
      auto d_x = upload(to_f16(x));
      const size_t bytes = cuda::w8a16_workspace_bytes(m, s.n, s.k, cuda::W8A16Path::dequant_cublas);
      cuda::DeviceMemory workspace(bytes);
      for (auto path : {cuda::W8A16Path::automatic, cuda::W8A16Path::kernel, cuda::W8A16Path::dequant_cublas}) {
        auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
        cuda::w8a16_gemm(blas, d_x.as<f16>(), m, ldx, w, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr, path);
        const std::vector<float> y = from_f16(download<f16>(d_y, static_cast<size_t>(m * ldy)));
        std::vector<float> got(expected.size());
        for (int64_t t = 0; t < m; ++t) {
          std::copy(y.begin() + t * ldy, y.begin() + t * ldy + s.n, got.begin() + t * s.n);
          for (int64_t c = s.n; c < ldy; ++c)  // the padding between rows is never written
            ASSERT_TRUE(std::isnan(y[static_cast<size_t>(t * ldy + c)])) << "row pitch" << shape << " m" << m;
        }
        const char* name = path == cuda::W8A16Path::kernel ? "kernel" : path == cuda::W8A16Path::dequant_cublas
                                                                            ? "dequant+cublas" : "automatic";
        EXPECT_CLOSE(got, expected, 3e-3, std::string("w8a16 ") + name + shape + " m" + std::to_string(m));
      }
    }
  }
  // Shapes the kernel does not take are refused, naming why.
  const qspec::QuantizedMatrix odd_group = random_quantized(16, 96, qspec::quant::Format::int8_group, 24);
  EXPECT_THROW((void)qspec::gemm::pack_w8a16(odd_group), qspec::Error);
}

TEST_F(Gpu, W4A16WorkspaceIsSharedAcrossPaths) {
  const int64_t n = 256, k = 704;
  const qspec::QuantizedMatrix weight = random_quantized(n, k, qspec::quant::Format::int4, 64);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  qspec::cuda::Blas blas;
  // big_m: past the tiled path's reach (3072 with the wgmma tiles, w4a16_choose_path)
  const int64_t big_m = 3100, tiled_m = 40;
  const size_t bytes = std::max({cuda::w4a16_workspace_bytes(big_m, n, k), cuda::w4a16_workspace_bytes(1, n, k),
                                 cuda::w4a16_workspace_bytes(tiled_m, n, k, cuda::W4A16Path::tiled),
                                 cuda::w4a16_workspace_bytes(1, n, k, cuda::W4A16Path::tiled) +
                                     static_cast<size_t>(3 * tiled_m * n) * sizeof(float)});
  auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(big_m * k))));
  auto run_split = [&](const cuda::DeviceMemory& workspace) {
    auto d_y = poisoned(static_cast<size_t>(n) * 2);
    cuda::w4a16_gemm_small_m(d_x.as<f16>(), 1, k, w.view, d_y.as<f16>(), n, workspace.get(), bytes, nullptr, {1, 2});
    return download<f16>(d_y, static_cast<size_t>(n));
  };
  // The tiled kernel's split-K uses the same counters (row tile x M tile) and partials region.
  auto run_tiled_split = [&](const cuda::DeviceMemory& workspace) {
    auto d_y = poisoned(static_cast<size_t>(tiled_m * n) * 2);
    cuda::w4a16_gemm_tiled(d_x.as<f16>(), tiled_m, k, w.view, d_y.as<f16>(), n, workspace.get(), bytes, nullptr,
                           {1, 3});
    return download<f16>(d_y, static_cast<size_t>(tiled_m * n));
  };
  cuda::DeviceMemory fresh(bytes), shared(bytes);
  cuda::w4a16_workspace_init(fresh.get(), bytes, nullptr);
  cuda::w4a16_workspace_init(shared.get(), bytes, nullptr);
  const std::vector<f16> expected = run_split(fresh);
  const std::vector<f16> expected_tiled = run_tiled_split(fresh);
  auto d_big = poisoned(static_cast<size_t>(big_m * n) * 2);
  ASSERT_EQ(cuda::w4a16_choose_path(big_m, n, k), cuda::W4A16Path::dequant_cublas);
  cuda::w4a16_gemm(blas, d_x.as<f16>(), big_m, k, w.view, d_big.as<f16>(), n, shared.get(), bytes, nullptr);
  for (int repeat = 0; repeat < 3; ++repeat) {
    ASSERT_EQ(run_split(shared), expected) << "launch " << repeat;
    ASSERT_EQ(run_tiled_split(shared), expected_tiled) << "tiled launch " << repeat;
  }
}

// The tiled kernel computes the small-M kernel's function in the same order (per pair: k tile
// 0 then 1; each group in f32, scaled in f32 at its end), so without split-K the bits agree.
TEST_F(Gpu, W4A16TiledMatchesSmallMBitwise) {
  for (auto [n, k, group] : {std::tuple{4097, 4096, 128}, {1000, 160, 32}, {256, 704, 64}}) {
    const qspec::QuantizedMatrix weight = random_quantized(n, k, qspec::quant::Format::int4, group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    for (int64_t m : {1, 17, 64, 100}) {
      auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(m * k))));
      auto run = [&](bool tiled, int tile) {
        auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
        if (tiled)
          cuda::w4a16_gemm_tiled(d_x.as<f16>(), m, k, w.view, d_y.as<f16>(), n, nullptr, 0, nullptr, {tile, 1});
        else
          cuda::w4a16_gemm_small_m(d_x.as<f16>(), m, k, w.view, d_y.as<f16>(), n, nullptr, 0, nullptr, {1, 1});
        return download<f16>(d_y, static_cast<size_t>(m * n));
      };
      const std::vector<f16> expected = run(false, 0);
      // The wgmma tiles fold the group scales into f16 weights: their own bound above, not these bits.
      for (int tile = 1; tile <= cuda::kW4A16TiledTiles; ++tile) {
        if (!cuda::w4a16_is_wgmma_tile(tile)) {
          ASSERT_EQ(run(true, tile), expected) << "tile " << cuda::w4a16_tiled_tile_name(tile) << " m" << m << " n" << n
                                               << " k" << k << " g" << group;
        }
      }
      // Tiles 2 and 6 ran their 8-warp forms where a split is short (k 160 / 704 at m <= 32), so
      // the comparisons above covered those kernels too; the 4-warp forms everywhere else.
      for (int tile : {2, cuda::kW4A16Tile128x32}) {
        const int warps = cuda::w4a16_tiled_warps(w.view, m, {tile, 1}, nullptr, 0);
        ASSERT_EQ(warps, m <= 32 && k <= 2048 ? 8 : 4) << "tile " << tile << " m" << m << " k" << k;
      }
    }
  }
}

// The shapes of the preload kernel's bitwise tests (W4A16 and W4A8): n not a multiple of the
// block's rows, k of one slot a part to many, groups of 32 / 64 / 128, k % 64 == 32 (the tail pair).
constexpr std::tuple<int64_t, int64_t, int64_t> kPreloadBitwiseShapes[] = {
    {4097, 4096, 128}, {300, 14336, 128}, {1000, 160, 32}, {256, 704, 64}, {33, 96, 32}, {6144, 4096, 128}};

// The preload kernel (variant 5: bulk copies into per-warp shared-memory rings) gives the
// register-ring kernel's bits for the same split count: rings that hold the whole split and
// rings that wrap many times (k 14336 in one split), odd n, k with a half chunk at the end,
// groups of 32 / 64 / 128, slices of 1-16 tokens and a 17-token call (two slices).
TEST_F(Gpu, W4A16PreloadEqualsRegisterRingBitwise) {
  if (qspec::cuda::compute_capability() != 90) {
    std::printf("  skipped: variant 5 runs on sm_90a only (this GPU is sm_%d)\n", qspec::cuda::compute_capability());
    return;
  }
  for (auto [n, k, group] : kPreloadBitwiseShapes) {
    const qspec::QuantizedMatrix weight = random_quantized(n, k, qspec::quant::Format::int4, group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    ASSERT_TRUE(cuda::w4a16_preload_supported(w.view)) << "sm_90 device, aligned weights: variant 5 must run";
    for (int64_t m : {1, 3, 8, 9, 16, 17}) {
      auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(m * k))));
      const size_t bytes = cuda::w4a16_workspace_bytes(m, n, k, cuda::W4A16Path::small_m) * 4;
      cuda::DeviceMemory workspace(bytes);
      cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
      auto run = [&](int variant, int splits, int k_slices = 1) {
        auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
        cuda::W4A16SmallMConfig config{variant, splits, 2};
        config.k_slices = variant == 5 ? k_slices : 0;
        cuda::w4a16_gemm_small_m(d_x.as<f16>(), m, k, w.view, d_y.as<f16>(), n, workspace.get(), bytes, nullptr,
                                 config);
        return download<f16>(d_y, static_cast<size_t>(m * n));
      };
      for (int splits : {1, 3, 8}) {
        const std::vector<f16> expected = run(1, splits);
        ASSERT_EQ(run(5, splits), expected) << "splits " << splits << " m" << m << " n" << n << " k" << k << " g" << group;
        ASSERT_EQ(run(5, splits), expected) << "again (counters reset): splits " << splits << " m" << m << " n" << n;
      }
      if (m > 16) continue;  // variant 5 runs slices of up to 16 tokens (beyond: variant 1)
      // K slices summed inside the block: the same k partition as that many splits, the same sums.
      for (int k_slices : {2, 4, 8}) {
        const std::vector<f16> expected = run(1, k_slices);
        ASSERT_EQ(run(5, 1, k_slices), expected) << "k slices " << k_slices << " m" << m << " n" << n << " k" << k
                                                 << " g" << group;
      }
      // Slices and splits together (sums nested: slices in the block, then splits): near the
      // register-ring kernel's k_slices x splits, never NaN, a relaunch bitwise the same.
      for (auto [k_slices, splits] : {std::pair{2, 3}, {4, 2}, {8, 2}}) {
        const std::vector<f16> reference = run(1, k_slices * splits);
        const std::vector<f16> got = run(5, splits, k_slices);
        ASSERT_EQ(run(5, splits, k_slices), got) << "relaunch: k slices " << k_slices << " splits " << splits;
        for (size_t i = 0; i < got.size(); ++i) {
          const float a = qspec::f16_to_f32(got[i]), b = qspec::f16_to_f32(reference[i]);
          ASSERT_FALSE(std::isnan(a)) << i;
          ASSERT_LE(std::fabs(a - b), 2e-3f * std::fabs(b) + 1e-3f)
              << "k slices " << k_slices << " splits " << splits << " m" << m << " n" << n << " k" << k << " at " << i;
        }
      }
    }
  }
}

namespace {

// act = silu(y[:, :n / 2]) * y[:, n / 2:] from a GEMM's y (m x n, rows n apart) by silu_mul, into
// rows ld_act apart (the padding poisoned): the bits a SwiGLU epilogue must give.
std::vector<uint16_t> silu_mul_of(const cuda::DeviceMemory& d_y, int64_t m, int64_t n, int64_t ld_act) {
  const int64_t inter = n / 2;
  auto d_expected = poisoned(static_cast<size_t>(m * ld_act) * 2);
  cuda::silu_mul(d_y.as<f16>(), d_y.as<f16>() + inter, m, inter, n, d_expected.as<f16>(), nullptr,
                 cuda::NextKernel::other, ld_act);
  return download<uint16_t>(d_expected, static_cast<size_t>(m * ld_act));
}

// Two launches of a SwiGLU GEMM (launch(act) writes m rows ld_act apart) give `expected` bit for
// bit, padding included, and no NaN among the n / 2 outputs of a row.
template <class Launch>
void expect_swiglu_bits(Launch&& launch, const std::vector<uint16_t>& expected, int64_t m, int64_t inter,
                        int64_t ld_act, const std::string& where) {
  for (int run = 0; run < 2; ++run) {
    auto d_act = poisoned(static_cast<size_t>(m * ld_act) * 2);
    launch(d_act.as<f16>());
    const std::vector<uint16_t> got = download<uint16_t>(d_act, static_cast<size_t>(m * ld_act));
    for (int64_t t = 0; t < m; ++t)
      for (int64_t i = 0; i < ld_act; ++i) {
        const size_t at = static_cast<size_t>(t * ld_act + i);
        if (i < inter) {
          ASSERT_FALSE(std::isnan(qspec::f16_to_f32(got[at]))) << where << " token " << t << " col " << i;
        }
        ASSERT_EQ(got[at], expected[at]) << where << " launch " << run << " token " << t << " col " << i;
      }
  }
}

}  // namespace

// SwiGLU in the preload kernel's epilogue (cuda::w4a16_gemm_swiglu) gives the bits of the same
// GEMM (variant 5, one split, the same k slices) then silu_mul: gate_up shapes of Llama-3-8B and
// small ones whose last block has fewer than 4 gate row blocks, groups of 32 / 64 / 128, k with a
// half chunk at the end, 1-16 tokens, 1, 2 and 4 k slices; act rows wider than n / 2 keep their
// padding; a relaunch gives the same bits; shapes it cannot run are refused. At 9-16 tokens the
// kernel holds x half a slot ahead (swiglu_x_half_slot; QSPEC_W4A16_PRELOAD_X_HALF=0 runs this
// test with a whole slot). The 272-block shape is more than a wave of one-slice blocks on 132
// multiprocessors, so it runs 2 slices (plan_k_slices). int4-asym weights (zero points) take
// the same comparison: the kernel's zero-point instance folds scale and minimum into the sums the
// epilogue reads.
TEST_F(Gpu, W4A16SwigluEqualsGemmThenSiluMulBitwise) {
  if (qspec::cuda::compute_capability() != 90) {
    std::printf("  skipped: the preload kernel runs on sm_90a only (this GPU is sm_%d)\n",
                qspec::cuda::compute_capability());
    return;
  }
  for (const qspec::quant::Format format :
       {qspec::quant::Format::int4, qspec::quant::Format::int4_asym, qspec::quant::Format::int4_zp})
  for (auto [n, k, group] : {std::tuple{28672, 4096, 128}, {2 * 1040, 160, 32}, {2 * 48, 704, 64}, {2 * 336, 96, 32},
                             {2 * 512, 14336, 128}, {2 * 17408, 1024, 128}}) {
    const bool zero_points = format != qspec::quant::Format::int4;
    const qspec::QuantizedMatrix weight = zero_points ? random_zero_point_weights(n, k, group, format)
                                                      : random_quantized(n, k, qspec::quant::Format::int4, group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    const int64_t inter = n / 2, ld_act = inter + 24;
    for (int64_t m : {1, 2, 7, 8, 9, 16}) {
      const std::string where = std::string(qspec::quant::format_name(format)) + " m" + std::to_string(m) + " n" +
                                std::to_string(n) + " k" + std::to_string(k) + " g" + std::to_string(group);
      auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(m * k))));
      const size_t bytes = cuda::w4a16_workspace_bytes(m, n, k, cuda::W4A16Path::small_m);
      cuda::DeviceMemory workspace(bytes);
      cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
      // Llama-3-8B's gate_up at one token: the dispatcher (no map) runs this very partition.
      if (n == 28672 && m == 1) {
        EXPECT_TRUE(qspec::w4_gemm_takes_swiglu_epilogue(nullptr, w.view, m, workspace.get(), bytes)) << where;
      }
      const int k_slices = cuda::w4a16_swiglu_k_slices(w.view, m, workspace.get(), bytes);
      ASSERT_TRUE(k_slices == 1 || k_slices == 2 || k_slices == 4) << where << " k slices " << k_slices;
      // H100 SXM / H200 (264 block slots): one slice for Llama-3-8B's gate_up, 2 for the 272-block
      // shape, 4 for 2 x 512 rows (8 planned, 4 at most).
      if (qspec::cuda::multiprocessor_count() == 132) {
        const int expected_slices = n == 28672 ? 1 : n == 2 * 17408 ? 2 : n == 2 * 512 ? 4 : k_slices;
        EXPECT_EQ(k_slices, expected_slices) << where;
      }
      auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
      cuda::W4A16SmallMConfig one_part{5, 1, 0};
      one_part.k_slices = k_slices;
      cuda::w4a16_gemm_small_m(d_x.as<f16>(), m, k, w.view, d_y.as<f16>(), n, workspace.get(), bytes, nullptr,
                               one_part);
      ASSERT_NO_FATAL_FAILURE(expect_swiglu_bits(
          [&](f16* act) {
            cuda::w4a16_gemm_swiglu(d_x.as<f16>(), m, k, w.view, act, ld_act, workspace.get(), bytes, nullptr);
          },
          silu_mul_of(d_y, m, n, ld_act), m, inter, ld_act, where));
    }
  }
  // Refused: 17 tokens, n not a multiple of 32, ld_act narrower than n / 2.
  const qspec::QuantizedMatrix weight = random_quantized(48, 128, qspec::quant::Format::int4, 128);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  const qspec::QuantizedMatrix wide = random_quantized(64, 128, qspec::quant::Format::int4, 128);
  DeviceW4 w64(qspec::gemm::pack_w4a16(wide));
  auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(17 * 128))));
  auto d_act = poisoned(static_cast<size_t>(17 * 64) * 2);
  EXPECT_FALSE(qspec::w4_gemm_takes_swiglu_epilogue(nullptr, w.view, 1, nullptr, 0));
  // The map decides: small_m_v5 takes the preload kernel's epilogue at one token (one part: 4 row
  // blocks); a map that sends the GEMM to a tiled kernel takes that kernel's (one split: no
  // workspace for partials); the bitwise strategy has none.
  const qspec::gemm::PolicyMap preload_map = qspec::gemm::PolicyMap::forced(qspec::gemm::Strategy::small_m_v5);
  const qspec::gemm::PolicyMap tiled_map = qspec::gemm::PolicyMap::forced(qspec::gemm::Strategy::tiled_256x64);
  const qspec::gemm::PolicyMap cublas_map = qspec::gemm::PolicyMap::forced(qspec::gemm::Strategy::dequant_cublas);
  EXPECT_TRUE(qspec::w4_gemm_swiglu_epilogue(&preload_map, w64.view, 1, nullptr, 0).kernel ==
              qspec::SwigluGemm::Kernel::preload);
  const qspec::SwigluGemm tiled_plan = qspec::w4_gemm_swiglu_epilogue(&tiled_map, w64.view, 1, nullptr, 0);
  EXPECT_TRUE(tiled_plan.kernel == qspec::SwigluGemm::Kernel::tiled);
  EXPECT_EQ(tiled_plan.tiled.tile, 1);
  EXPECT_FALSE(qspec::w4_gemm_takes_swiglu_epilogue(&cublas_map, w64.view, 17, nullptr, 0));
  // int4-asym: the preload kernel's epilogue, and the tiled one on the tiles with a zero-point
  // instance (128x64, 128x32), not on 256x64.
  DeviceW4 asym64(qspec::gemm::pack_w4a16(random_zero_point_weights(64, 128, 128)));
  EXPECT_TRUE(qspec::w4_gemm_swiglu_epilogue(&preload_map, asym64.view, 1, nullptr, 0).kernel ==
              qspec::SwigluGemm::Kernel::preload);
  EXPECT_TRUE(qspec::w4_gemm_swiglu_epilogue(&tiled_map, asym64.view, 1, nullptr, 0).kernel ==
              qspec::SwigluGemm::Kernel::none);
  const qspec::gemm::PolicyMap tiled_128x64_map = qspec::gemm::PolicyMap::forced(qspec::gemm::Strategy::tiled_128x64);
  EXPECT_TRUE(qspec::w4_gemm_swiglu_epilogue(&tiled_128x64_map, asym64.view, 24, nullptr, 0).kernel ==
              qspec::SwigluGemm::Kernel::tiled);
  EXPECT_THROW(cuda::w4a16_gemm_swiglu(d_x.as<f16>(), 1, 128, w.view, d_act.as<f16>(), 24, nullptr, 0, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::w4a16_gemm_swiglu(d_x.as<f16>(), 17, 128, w64.view, d_act.as<f16>(), 32, nullptr, 0, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::w4a16_gemm_swiglu(d_x.as<f16>(), 1, 128, w64.view, d_act.as<f16>(), 31, nullptr, 0, nullptr),
               qspec::Error);
}

// SwiGLU in the tiled kernel's epilogue (cuda::w4a16_gemm_tiled_swiglu) gives the bits of the
// one-split tiled GEMM on the same tile then silu_mul: every tile with one (1, 2, 3, 6), Llama-3-8B's gate_up
// and small shapes whose last row tile has fewer gate row blocks than its warps take, groups of
// 32 / 64 / 128, k with a half chunk at the end, 17-100 tokens (several M tiles, the last one
// partly filled); act rows wider than n / 2 keep their padding; a relaunch gives the same bits.
// The dispatcher (no map) takes this epilogue for Llama-3-8B's gate_up at 17-100 tokens on 132
// multiprocessors (one split: at most a wave of blocks), not where it splits k, nor on sm_90a
// where a wgmma tile runs (int4 from 17 tokens, others past 64: tile 0 has no SwiGLU there). Refused: n % 32,
// splits > 1, the 128x128 and wgmma tiles, ld_act < n / 2.
TEST_F(Gpu, W4A16TiledSwigluEqualsGemmThenSiluMulBitwise) {
  // int4-asym (zero points, sm_90a): the tiles with its instances, 128x64 (2) and 128x32 (6).
  // int4-zp: the same tiles, and the mma.sync ones at groups of 128 too (its loop is int4's).
  for (const qspec::quant::Format format :
       {qspec::quant::Format::int4, qspec::quant::Format::int4_asym, qspec::quant::Format::int4_zp})
  for (auto [n, k, group] : {std::tuple{28672, 4096, 128}, {2 * 1040, 160, 32}, {2 * 48, 704, 64}, {2 * 336, 96, 32},
                             {2 * 528, 2048, 128}}) {
    const bool zero_points = format != qspec::quant::Format::int4;
    if (zero_points && !cuda::w4a16_runs_zero_points(cuda::W4A16Path::tiled, 17)) continue;
    const qspec::QuantizedMatrix weight = zero_points ? random_zero_point_weights(n, k, group, format)
                                                      : random_quantized(n, k, qspec::quant::Format::int4, group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    const int64_t inter = n / 2, ld_act = inter + 24;
    const std::vector<int> tiles = n == 28672 ? std::vector<int>{0}
                                   : zero_points ? std::vector<int>{0, 2, 6}
                                                 : std::vector<int>{0, 1, 2, 3, 6};
    for (int64_t m : {17, 24, 32, 33, 64, 65, 100}) {
      auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(m * k))));
      const size_t bytes = cuda::w4a16_workspace_bytes(m, n, k, cuda::W4A16Path::tiled);
      cuda::DeviceMemory workspace(bytes);
      cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
      // Where the tiled path's own tile (tile 0) is a wgmma one, which has no SwiGLU epilogue: past 64
      // tokens, and from 17 where the automatic path reads x in the packed order (int4 by
      // default_tile; int4-asym / int4-zp by the same rule unless QSPEC_W4A16_ZP_WGMMA_17_64=0).
      const bool wgmma_takes_it = cuda::w4a16_wgmma_tile_runs_here() &&
                                  (m > 64 || cuda::w4a16_gemm_reads_packed_x(m, w.view));
      if (n == 28672 && qspec::cuda::multiprocessor_count() == 132) {
        EXPECT_EQ(qspec::w4_gemm_swiglu_epilogue(nullptr, w.view, m, workspace.get(), bytes).kernel ==
                      qspec::SwigluGemm::Kernel::tiled,
                  !wgmma_takes_it)
            << "m" << m;
      }
      for (int tile : tiles) {
        if (tile == 0 && wgmma_takes_it) continue;  // the default tile is the wgmma one: no SwiGLU epilogue
        const std::string where = std::string(qspec::quant::format_name(format)) + " m" + std::to_string(m) + " n" +
                                  std::to_string(n) + " k" + std::to_string(k) + " g" + std::to_string(group) +
                                  " tile " + std::to_string(tile);
        auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
        cuda::w4a16_gemm_tiled(d_x.as<f16>(), m, k, w.view, d_y.as<f16>(), n, nullptr, 0, nullptr,
                               cuda::W4A16TiledConfig{tile, 1});
        ASSERT_NO_FATAL_FAILURE(expect_swiglu_bits(
            [&](f16* act) {
              cuda::w4a16_gemm_tiled_swiglu(d_x.as<f16>(), m, k, w.view, act, ld_act, nullptr,
                                            cuda::W4A16TiledConfig{tile, 0});
            },
            silu_mul_of(d_y, m, n, ld_act), m, inter, ld_act, where));
      }
    }
    // Where the tiled GEMM splits k (a few row tiles, a workspace for the partials), the
    // dispatcher keeps SwiGLU out of it: its bits are not the one-split kernel's.
    // (not where 17 tokens take a wgmma tile, which has no SwiGLU epilogue: every format on sm_90a)
    if (n == 2 * 528 && !(cuda::w4a16_wgmma_tile_runs_here() && cuda::w4a16_gemm_reads_packed_x(17, w.view))) {
      const size_t bytes = cuda::w4a16_workspace_bytes(17, n, k, cuda::W4A16Path::tiled);
      cuda::DeviceMemory workspace(bytes);
      EXPECT_FALSE(qspec::w4_gemm_takes_swiglu_epilogue(nullptr, w.view, 17, workspace.get(), bytes));
      EXPECT_TRUE(qspec::w4_gemm_takes_swiglu_epilogue(nullptr, w.view, 17, nullptr, 0));
    }
  }
  const qspec::QuantizedMatrix odd = random_quantized(48, 128, qspec::quant::Format::int4, 128);
  DeviceW4 w48(qspec::gemm::pack_w4a16(odd));
  const qspec::QuantizedMatrix weight = random_quantized(64, 128, qspec::quant::Format::int4, 128);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(24 * 128))));
  auto d_act = poisoned(static_cast<size_t>(24 * 64) * 2);
  EXPECT_THROW(cuda::w4a16_gemm_tiled_swiglu(d_x.as<f16>(), 24, 128, w48.view, d_act.as<f16>(), 24, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::w4a16_gemm_tiled_swiglu(d_x.as<f16>(), 24, 128, w.view, d_act.as<f16>(), 32, nullptr,
                                             cuda::W4A16TiledConfig{0, 2}),
               qspec::Error);
  EXPECT_THROW(cuda::w4a16_gemm_tiled_swiglu(d_x.as<f16>(), 24, 128, w.view, d_act.as<f16>(), 32, nullptr,
                                             cuda::W4A16TiledConfig{cuda::kW4A16WgmmaTile, 0}),
               qspec::Error);
  EXPECT_THROW(cuda::w4a16_gemm_tiled_swiglu(d_x.as<f16>(), 24, 128, w.view, d_act.as<f16>(), 32, nullptr,
                                             cuda::W4A16TiledConfig{4, 0}),
               qspec::Error);
  EXPECT_FALSE(cuda::w4a16_tiled_swiglu_partition(w.view, 24, cuda::W4A16TiledConfig{4, 0}, nullptr, 0));
  EXPECT_THROW(cuda::w4a16_gemm_tiled_swiglu(d_x.as<f16>(), 24, 128, w.view, d_act.as<f16>(), 31, nullptr),
               qspec::Error);
}

// x in the packed k order runs on the wgmma tiles' int4 instances only (the GEMM test above
// compares them); every other launch that is asked for it refuses.
TEST_F(Gpu, W4A16PackedXRunsOnTheWgmmaTilesOnly) {
  const int64_t n = 256, k = 256, m = 17;
  DeviceW4 w(qspec::gemm::pack_w4a16(random_quantized(n, k, qspec::quant::Format::int4, 64)));
  auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(m * k))));
  auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
  const size_t bytes = cuda::w4a16_workspace_bytes(m, n, k, cuda::W4A16Path::tiled);
  cuda::DeviceMemory workspace(bytes);
  cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
  for (int tile : {1, 2, 3, 4, cuda::kW4A16Tile128x32})
    EXPECT_THROW(cuda::w4a16_gemm_tiled(d_x.as<f16>(), m, k, w.view, d_y.as<f16>(), n, workspace.get(), bytes,
                                        nullptr, cuda::W4A16TiledConfig{tile, 1, true}),
                 qspec::Error)
        << "tile " << tile;
  EXPECT_THROW(cuda::w4a16_gemm_tiled_swiglu(d_x.as<f16>(), m, k, w.view, d_y.as<f16>(), n / 2, nullptr,
                                             cuda::W4A16TiledConfig{0, 1, true}),
               qspec::Error);
  // The automatic path: packed where its tile reads x so (a wgmma tile from 17 tokens on sm_90a),
  // refused elsewhere (1-16 tokens run the preload kernel where it runs, else the small-M kernels).
  EXPECT_FALSE(cuda::w4a16_gemm_reads_packed_x(16, w.view));
  for (int64_t tokens : {17, 32, 33, 64, 100})
    EXPECT_EQ(cuda::w4a16_gemm_reads_packed_x(tokens, w.view), cuda::w4a16_wgmma_tile_runs_here()) << tokens;
  qspec::cuda::Blas blas;
  EXPECT_THROW(cuda::w4a16_gemm(blas, d_x.as<f16>(), 16, k, w.view, d_y.as<f16>(), n, workspace.get(), bytes, nullptr,
                                cuda::W4A16Path::automatic, /*x_packed=*/true),
               qspec::Error);
  if (!cuda::w4a16_runs_zero_points(cuda::W4A16Path::tiled, m)) return;
  // Zero-point weights: the wgmma tiles' instances read packed x (compared in
  // W4A16ZeroPointsMatchCpuOverShapesAndPaths); the mma.sync tiles with zero points refuse it,
  // and so does the automatic path at 1-16 tokens (the preload kernel).
  for (const qspec::quant::Format format : kZeroPointFormats) {
    DeviceW4 zp(qspec::gemm::pack_w4a16(random_zero_point_weights(n, k, 64, format)));
    for (int tile : {2, cuda::kW4A16Tile128x32})
      EXPECT_THROW(cuda::w4a16_gemm_tiled(d_x.as<f16>(), m, k, zp.view, d_y.as<f16>(), n, workspace.get(), bytes,
                                          nullptr, cuda::W4A16TiledConfig{tile, 1, true}),
                   qspec::Error)
          << qspec::quant::format_name(format) << " tile " << tile;
    EXPECT_FALSE(cuda::w4a16_gemm_reads_packed_x(16, zp.view));
  }
}

TEST_F(Gpu, W4A16RejectsUnsupportedGroups) {
  cuda::W4A16Weights w{reinterpret_cast<void*>(256), reinterpret_cast<void*>(256), 16, 96, 48};
  EXPECT_THROW(cuda::w4a16_dequantize(w, nullptr, nullptr), qspec::Error);
}

namespace {

// Random operands of an f16 / bf16 GEMM (values exact in the dtype), on the device, with the
// CPU's f32 product of the same values and a reader for the GPU's output.
struct W16Operands {
  cuda::Dtype16 dtype;
  cuda::DeviceMemory d_x, d_w;
  std::vector<float> expected;  // [m, n]
  W16Operands(int64_t m, int64_t n, int64_t k, cuda::Dtype16 type) : dtype(type) {
    std::vector<float> x = random_f16_values(static_cast<size_t>(m * k)), w = random_f16_values(static_cast<size_t>(n * k), 0.1f);
    for (float& v : x) v = round(v);
    for (float& v : w) v = round(v);
    d_x = upload(encode(x));
    d_w = upload(encode(w));
    qspec::WeightMatrix weight;
    weight.dtype = qspec::DType::F32;
    weight.rows = n;
    weight.cols = k;
    weight.data = w.data();
    expected.resize(static_cast<size_t>(m * n));
    qspec::cpu::linear(x.data(), m, weight, nullptr, expected.data());
  }
  bool bf16() const { return dtype == cuda::Dtype16::bf16; }
  float round(float v) const { return bf16() ? qspec::bf16_to_f32(qspec::f32_to_bf16(v)) : v; }
  std::vector<uint16_t> encode(const std::vector<float>& v) const {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = bf16() ? qspec::f32_to_bf16(v[i]) : qspec::f32_to_f16(v[i]);
    return out;
  }
  std::vector<float> read(const cuda::DeviceMemory& d_y) const {
    const std::vector<uint16_t> y = download<uint16_t>(d_y, expected.size());
    std::vector<float> got(y.size());
    for (size_t i = 0; i < y.size(); ++i) got[i] = bf16() ? qspec::bf16_to_f32(y[i]) : qspec::f16_to_f32(y[i]);
    return got;
  }
};

}  // namespace

TEST_F(Gpu, LinearW16MatchesCpuInF16AndBf16) {
  qspec::cuda::Blas blas;
  for (auto [m, n, k] : {std::tuple{1, 7, 13}, {3, 256, 256}, {17, 1408, 256}, {64, 333, 704}, {512, 1000, 4096}}) {
    for (cuda::Dtype16 dtype : {cuda::Dtype16::f16, cuda::Dtype16::bf16}) {
      const W16Operands operands(m, n, k, dtype);
      auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
      cuda::linear_w16(blas, operands.d_x.as<uint16_t>(), m, k, operands.d_w.as<uint16_t>(), n, d_y.as<uint16_t>(),
                       dtype, nullptr);
      EXPECT_CLOSE(operands.read(d_y), operands.expected, operands.bf16() ? 8e-3 : 3e-3,
                   std::string(operands.bf16() ? "bf16 " : "f16 ") + shape_name({m, n, k}));
    }
  }
}

// The small-M kernel against the CPU over odd n (rows past the last 16-row block), k not a multiple
// of its 32-wide chunks, 1-8 tokens, every k-slice count (slices with no chunks at k = 8), and
// automatic dispatch; shapes it does not take are an error when forced.
TEST_F(Gpu, LinearW16SmallMMatchesCpu) {
  for (auto [m, n, k] : {std::tuple{1, 1, 8}, {1, 7, 40}, {2, 17, 264}, {8, 100, 4096}, {7, 333, 1000},
                         {4, 4099, 256}, {5, 4096, 14336}, {3, 8016, 520}}) {
    for (cuda::Dtype16 dtype : {cuda::Dtype16::f16, cuda::Dtype16::bf16}) {
      const W16Operands operands(m, n, k, dtype);
      const bool bf16 = operands.bf16();
      const auto& d_x = operands.d_x;
      const auto& d_w = operands.d_w;
      for (int k_slices : {0, 1, 2, 4, 8, -1}) {  // -1: linear_w16's automatic choice
        auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
        if (k_slices >= 0) {
          cuda::linear_w16_small_m(d_x.as<uint16_t>(), m, k, d_w.as<uint16_t>(), n, d_y.as<uint16_t>(), dtype,
                                   nullptr, k_slices);
        } else {
          qspec::cuda::Blas blas;
          cuda::linear_w16(blas, d_x.as<uint16_t>(), m, k, d_w.as<uint16_t>(), n, d_y.as<uint16_t>(), dtype, nullptr);
        }
        EXPECT_CLOSE(operands.read(d_y), operands.expected, bf16 ? 8e-3 : 2e-3,
                     std::string(bf16 ? "bf16 " : "f16 ") + shape_name({m, n, k}) + " k_slices " + std::to_string(k_slices));
      }
    }
  }
  auto d_x = poisoned(17 * 64 * 2), d_w = poisoned(64 * 64 * 2), d_y = poisoned(17 * 64 * 2);
  EXPECT_TRUE(cuda::linear_w16_small_m_takes(d_x.as<uint16_t>(), 8, 64, d_w.as<uint16_t>(), d_y.as<uint16_t>()));
  EXPECT_THROW(cuda::linear_w16_small_m(d_x.as<uint16_t>(), 9, 64, d_w.as<uint16_t>(), 64, d_y.as<uint16_t>(),
                                        cuda::Dtype16::f16, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::linear_w16_small_m(d_x.as<uint16_t>(), 1, 60, d_w.as<uint16_t>(), 64, d_y.as<uint16_t>(),
                                        cuda::Dtype16::f16, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::linear_w16_small_m(d_x.as<uint16_t>() + 1, 1, 64, d_w.as<uint16_t>(), 64, d_y.as<uint16_t>(),
                                        cuda::Dtype16::f16, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::linear_w16_small_m(d_x.as<uint16_t>(), 1, 64, d_w.as<uint16_t>(), 64, d_y.as<uint16_t>(),
                                        cuda::Dtype16::f16, nullptr, 3),
               qspec::Error);
  qspec::cuda::Blas blas;
  EXPECT_THROW(cuda::linear_w16(blas, d_x.as<uint16_t>(), 9, 64, d_w.as<uint16_t>(), 64, d_y.as<uint16_t>(),
                                cuda::Dtype16::f16, nullptr, cuda::W16Kernel::small_m),
               qspec::Error);
}

// ---- W4A8: int8 activations on the packed 4-bit weights --------------------------------------

// The quantizer is the CPU's int8 activation row quantizer bit for bit (codes and f32 scale),
// over odd row counts, strided rows, a zero row and rows with outliers; a row with a NaN or an
// infinity gets a NaN scale and leaves the other rows alone.
TEST_F(Gpu, QuantizeInt8RowsEqualsTheCpuQuantizerBitwise) {
  using qspec::quant::Format;
  using qspec::quant::Role;
  for (auto [rows, k] : {std::tuple{1, 8}, {3, 96}, {17, 4096}, {64, 14336}, {5, 704}}) {
    const int64_t ldx = k + 8, ldc = k + 16;
    std::vector<float> x = random_f16_values(static_cast<size_t>(rows * ldx), 2.0f);
    for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(i)] = 0.0f;  // row 0: all zero (k = 8: the only row)
    if (rows > 2) x[static_cast<size_t>(2 * ldx + k / 3)] = 3000.0f;  // an outlier channel
    if (rows > 3) x[static_cast<size_t>(3 * ldx + 1)] = -0.0f;
    auto d_x = upload(to_f16(x));
    auto d_codes = poisoned(static_cast<size_t>(rows * ldc));
    auto d_scales = poisoned(static_cast<size_t>(rows) * 4);
    cuda::quantize_int8_rows(d_x.as<f16>(), rows, k, ldx, d_codes.as<int8_t>(), ldc, d_scales.as<float>(), nullptr);
    const std::vector<uint8_t> codes = download<uint8_t>(d_codes, static_cast<size_t>(rows * ldc));
    const std::vector<float> scales = download<float>(d_scales, static_cast<size_t>(rows));
    const auto format = qspec::quant::make_row_format(Format::int8, Role::activation, k);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint8_t> expected_codes(static_cast<size_t>(format.code_bytes()));
      float expected_scale = 0;
      qspec::quant::quantize_row(format, x.data() + r * ldx, expected_codes.data(),
                                 reinterpret_cast<uint8_t*>(&expected_scale));
      ASSERT_EQ(std::memcmp(&scales[static_cast<size_t>(r)], &expected_scale, 4), 0)
          << shape_name({rows, k}) << " row " << r << ": scale " << scales[static_cast<size_t>(r)] << " vs "
          << expected_scale;
      for (int64_t i = 0; i < k; ++i)
        ASSERT_EQ(codes[static_cast<size_t>(r * ldc + i)], expected_codes[static_cast<size_t>(i)])
            << shape_name({rows, k}) << " row " << r << " col " << i;
    }
    if (rows >= 3) {
      std::vector<float> bad = x;
      bad[static_cast<size_t>(1 * ldx + k - 1)] = std::numeric_limits<float>::quiet_NaN();
      bad[static_cast<size_t>(2 * ldx)] = std::numeric_limits<float>::infinity();
      auto d_bad = upload(to_f16(bad));
      cuda::quantize_int8_rows(d_bad.as<f16>(), rows, k, ldx, d_codes.as<int8_t>(), ldc, d_scales.as<float>(),
                               nullptr);
      const std::vector<float> bad_scales = download<float>(d_scales, static_cast<size_t>(rows));
      EXPECT_TRUE(std::isnan(bad_scales[1]) && std::isnan(bad_scales[2])) << shape_name({rows, k});
      EXPECT_EQ(bad_scales[0], scales[0]);
      for (int64_t r = 3; r < rows; ++r) EXPECT_EQ(bad_scales[static_cast<size_t>(r)], scales[static_cast<size_t>(r)]);
    }
  }
  EXPECT_THROW(cuda::quantize_int8_rows(nullptr, 1, 12, 16, nullptr, 16, nullptr, nullptr), qspec::Error);
}

// The fused norm + quantization (the W4A8 model's qkv and gate_up inputs) is the two ops in
// sequence, bit for bit: codes, scales and the residual written back.
TEST_F(Gpu, RmsNormInt8EqualsRmsNormThenQuantizeBitwise) {
  for (auto [rows, dim] : {std::tuple{1, 64}, {5, 4096}, {33, 5120}, {3, 14336}}) {
    const int64_t ldc = dim + 16;
    const std::vector<float> x = random_f16_values(static_cast<size_t>(rows * dim), 3.0f);
    const std::vector<float> delta = random_f16_values(static_cast<size_t>(rows * dim));
    std::vector<float> weight = random_f16_values(static_cast<size_t>(dim));
    for (float& w : weight) w = 1.0f + 0.25f * w;
    auto d_weight = upload(weight);
    auto d_delta = upload(to_f16(delta));
    for (bool fused_add : {false, true}) {
      auto d_x_ref = upload(to_f16(x)), d_x = upload(to_f16(x));
      auto d_normed = poisoned(static_cast<size_t>(rows * dim) * 2);
      auto d_codes_ref = poisoned(static_cast<size_t>(rows * ldc)), d_codes = poisoned(static_cast<size_t>(rows * ldc));
      auto d_scales_ref = poisoned(static_cast<size_t>(rows) * 4), d_scales = poisoned(static_cast<size_t>(rows) * 4);
      if (fused_add) {
        cuda::add_rmsnorm(d_x_ref.as<f16>(), d_delta.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f,
                          d_normed.as<f16>(), nullptr);
        cuda::add_rmsnorm_int8(d_x.as<f16>(), d_delta.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f,
                               d_codes.as<int8_t>(), ldc, d_scales.as<float>(), nullptr);
      } else {
        cuda::rmsnorm(d_x_ref.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f, d_normed.as<f16>(), nullptr);
        cuda::rmsnorm_int8(d_x.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f, d_codes.as<int8_t>(), ldc,
                           d_scales.as<float>(), nullptr);
      }
      cuda::quantize_int8_rows(d_normed.as<f16>(), rows, dim, dim, d_codes_ref.as<int8_t>(), ldc,
                               d_scales_ref.as<float>(), nullptr);
      const std::string what = shape_name({rows, dim}) + (fused_add ? " add_rmsnorm" : " rmsnorm");
      const auto codes_ref = download<uint8_t>(d_codes_ref, static_cast<size_t>(rows * ldc));
      const auto codes = download<uint8_t>(d_codes, static_cast<size_t>(rows * ldc));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < dim; ++i)
          ASSERT_EQ(codes[static_cast<size_t>(r * ldc + i)], codes_ref[static_cast<size_t>(r * ldc + i)])
              << what << " row " << r << " col " << i;
      const auto scales_ref = download<uint32_t>(d_scales_ref, static_cast<size_t>(rows));
      ASSERT_EQ(download<uint32_t>(d_scales, static_cast<size_t>(rows)), scales_ref) << what;
      for (uint32_t bits : scales_ref) ASSERT_NE(bits, 0xffffffffu) << what << ": unwritten scale";
      ASSERT_EQ(download<f16>(d_x, static_cast<size_t>(rows * dim)), download<f16>(d_x_ref, static_cast<size_t>(rows * dim)))
          << what << ": residual";
    }
  }
}

// W4A8 against the CPU: the same 4-bit weights (cpu::quantized_linear) times the int8
// activations dequantized (cpu::apply_activation_mode, int8): equal up to f32 summation order
// and the f16 output rounding (bound 2e-3, as W4A16). The GPU's own quantizer feeds the GEMM
// (its codes equal the CPU's, previous test). Variants, split-K, x staging and slices past 64.
TEST_F(Gpu, W4A8GemmMatchesCpuOverShapesAndVariants) {
  using qspec::quant::Format;
  struct Shape {
    int64_t n, k;
    Format format;
    int64_t group;
  };
  const std::vector<Shape> shapes = {{256, 256, Format::int4, 64},  {33, 96, Format::int4, 32},
                                     {4097, 4096, Format::int4, 128}, {1000, 160, Format::int4, 32},
                                     {7, 384, Format::int4_channel, 128}, {129, 1024, Format::int4, 256},
                                     {1408, 14336, Format::int4, 128}};
  qspec::ActivationMode int8_mode;
  int8_mode.kind = qspec::ActivationMode::Kind::quantized;
  int8_mode.format = Format::int8;
  for (const Shape& s : shapes) {
    const qspec::QuantizedMatrix weight = random_quantized(s.n, s.k, s.format, s.group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    for (int64_t m : {1, 2, 5, 8, 9, 16, 17, 33, 64, 65, 130}) {
      const int64_t ldx = s.k + 8, ldq = s.k + 16, ldy = s.n + 3;
      const std::vector<float> x = random_f16_values(static_cast<size_t>(m * ldx));
      const std::vector<float> expected = cpu_quantized_linear(x, m, ldx, s.k, int8_mode, weight);
      auto d_x = upload(to_f16(x));
      auto d_q = poisoned(static_cast<size_t>(m * ldq));
      auto d_scales = poisoned(static_cast<size_t>(m) * 4);
      cuda::quantize_int8_rows(d_x.as<f16>(), m, s.k, ldx, d_q.as<int8_t>(), ldq, d_scales.as<float>(), nullptr);
      struct Variant {
        const char* name;
        cuda::W4A16SmallMConfig config;
        cuda::W4A16TiledConfig tiled{-1, 0};  // tile >= 0: the tiled kernel
      };
      std::vector<Variant> variants = {Variant{"v1", {1, 0}}, Variant{"v2", {2, 0}}, Variant{"v1 split3", {1, 3}},
                                       Variant{"v1 x shared", {1, 0, 1}}, Variant{"v2 x global split3", {2, 3, 2}},
                                       Variant{"automatic", {}}, Variant{"tiled auto", {}, {0, 0}},
                                       Variant{"tiled 256x64 split3", {}, {1, 3}}, Variant{"tiled 128x64", {}, {2, 1}},
                                       Variant{"tiled 256x32 split5", {}, {3, 5}}, Variant{"tiled 128x128", {}, {4, 1}},
                                       Variant{"tiled 128x32 split3", {}, {cuda::kW4A16Tile128x32, 3}}};
      if (cuda::w4a16_preload_supported(w.view)) {  // the preload kernel (sm_90a; up to 8 tokens a slice)
        cuda::W4A16SmallMConfig k_slices{5, 1};
        k_slices.k_slices = 4;
        variants.push_back(Variant{"v5 preload", {5, 0}});
        variants.push_back(Variant{"v5 split3", {5, 3}});
        variants.push_back(Variant{"v5 k slices 4", k_slices});
      }
      for (const Variant& v : variants) {
        const bool tiled = v.tiled.tile >= 0;
        const bool automatic = !tiled && v.config.variant == 0;
        // Room for the tiled runs' forced splits (beyond their heuristic's bound).
        const size_t bytes = std::max(cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::small_m) * 4,
                                      cuda::w4a16_workspace_bytes(1, s.n, s.k, cuda::W4A16Path::tiled) +
                                          static_cast<size_t>(5 * m * s.n) * sizeof(float));
        cuda::DeviceMemory workspace(bytes);
        cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
        const std::string what = std::string("w4a8 ") + v.name + " m" + std::to_string(m) + " n" +
                                 std::to_string(s.n) + " k" + std::to_string(s.k) + " g" + std::to_string(s.group);
        std::vector<f16> first;
        for (int launch = 0; launch < 2; ++launch) {  // the second on the same workspace: counters back at zero
          auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
          if (tiled)
            cuda::w4a8_gemm_tiled(d_q.as<int8_t>(), d_scales.as<float>(), m, ldq, w.view, d_y.as<f16>(), ldy,
                                  workspace.get(), bytes, nullptr, v.tiled);
          else if (automatic)
            cuda::w4a8_gemm(d_q.as<int8_t>(), d_scales.as<float>(), m, ldq, w.view, d_y.as<f16>(), ldy,
                            workspace.get(), bytes, nullptr);
          else
            cuda::w4a8_gemm_small_m(d_q.as<int8_t>(), d_scales.as<float>(), m, ldq, w.view, d_y.as<f16>(), ldy,
                                    workspace.get(), bytes, nullptr, v.config);
          const std::vector<f16> y = download<f16>(d_y, static_cast<size_t>(m * ldy));
          if (launch == 1) {
            ASSERT_EQ(y, first) << what << " is not deterministic";
            break;
          }
          first = y;
          std::vector<float> got(expected.size());
          for (int64_t t = 0; t < m; ++t)
            for (int64_t i = 0; i < s.n; ++i) got[t * s.n + i] = qspec::f16_to_f32(y[t * ldy + i]);
          EXPECT_CLOSE(got, expected, 2e-3, what);
          for (int64_t t = 0; t < m; ++t)  // the padding between rows is never written
            for (int64_t i = s.n; i < ldy; ++i) ASSERT_EQ(y[t * ldy + i], 0xffff) << what;
        }
      }
    }
  }
  cuda::W4A16Weights none{reinterpret_cast<void*>(256), reinterpret_cast<void*>(256), 16, 128, 128};
  EXPECT_THROW(cuda::w4a8_gemm(reinterpret_cast<int8_t*>(256), nullptr, 1, 136, none, nullptr, 16, nullptr, 0, nullptr),
               qspec::Error);  // ldx not a multiple of 16, and no scales
  EXPECT_THROW(cuda::w4a8_gemm_small_m(reinterpret_cast<int8_t*>(256), reinterpret_cast<float*>(256), 1, 128, none,
                                       nullptr, 16, nullptr, 0, nullptr, {3, 0}),
               qspec::Error);  // the stream variants are f16 only
  EXPECT_THROW(cuda::w4a8_gemm(reinterpret_cast<int8_t*>(256), reinterpret_cast<float*>(256), 1, 128, none, nullptr, 16,
                               nullptr, 0, nullptr, cuda::W4A16Path::dequant_cublas),
               qspec::Error);  // no cuBLAS path for int8
  EXPECT_THROW(cuda::w4a8_gemm_tiled(reinterpret_cast<int8_t*>(256), nullptr, 4, 128, none, nullptr, 16, nullptr, 0,
                                     nullptr),
               qspec::Error);  // no scales
}

// W4A8 on the preload kernel (sm_90a, 1-8 tokens a slice) sums each group exactly and the groups
// in the register-ring kernel's order for the same partition of k (splits, or k slices in the
// block), so the two give the same bits.
TEST_F(Gpu, W4A8PreloadEqualsRegisterRingBitwise) {
  if (qspec::cuda::compute_capability() != 90) {
    std::printf("  skipped: variant 5 runs on sm_90a only (this GPU is sm_%d)\n", qspec::cuda::compute_capability());
    return;
  }
  for (auto [n, k, group] : kPreloadBitwiseShapes) {
    const qspec::QuantizedMatrix weight = random_quantized(n, k, qspec::quant::Format::int4, group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    ASSERT_TRUE(cuda::w4a16_preload_supported(w.view)) << "sm_90 device, aligned weights: variant 5 must run";
    for (int64_t m : {1, 3, 8, 9}) {
      const int64_t ldq = k + 16;
      auto d_x = upload(to_f16(random_f16_values(static_cast<size_t>(m * k))));
      auto d_q = poisoned(static_cast<size_t>(m * ldq));
      auto d_scales = poisoned(static_cast<size_t>(m) * 4);
      cuda::quantize_int8_rows(d_x.as<f16>(), m, k, k, d_q.as<int8_t>(), ldq, d_scales.as<float>(), nullptr);
      const size_t bytes = cuda::w4a16_workspace_bytes(m, n, k, cuda::W4A16Path::small_m) * 4;
      cuda::DeviceMemory workspace(bytes);
      cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
      auto run = [&](int variant, int splits, int k_slices = 1) {
        auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
        cuda::W4A16SmallMConfig config{variant, splits};
        config.k_slices = variant == 5 ? k_slices : 0;
        cuda::w4a8_gemm_small_m(d_q.as<int8_t>(), d_scales.as<float>(), m, ldq, w.view, d_y.as<f16>(), n,
                                workspace.get(), bytes, nullptr, config);
        return download<f16>(d_y, static_cast<size_t>(m * n));
      };
      for (int splits : {1, 3, 8}) {
        const std::vector<f16> expected = run(1, splits);
        ASSERT_EQ(run(5, splits), expected) << "splits " << splits << " m" << m << " n" << n << " k" << k << " g" << group;
        ASSERT_EQ(run(5, splits), expected) << "again (counters reset): splits " << splits << " m" << m << " n" << n;
      }
      if (m > 8) continue;  // beyond 8 tokens a slice variant 5 runs the register ring
      for (int k_slices : {2, 4, 8}) {
        const std::vector<f16> expected = run(1, k_slices);
        ASSERT_EQ(run(5, 1, k_slices), expected) << "k slices " << k_slices << " m" << m << " n" << n << " k" << k
                                                 << " g" << group;
      }
    }
  }
  // Variant 5 takes int8 activations only (not the Split strategy's).
  const qspec::QuantizedMatrix weight = random_quantized(256, 256, qspec::quant::Format::int4, 128);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  cuda::W4A16SmallMConfig split{5, 0};
  split.split_activations = true;
  const size_t bytes = cuda::w4a16_workspace_bytes(1, 256, 256, cuda::W4A16Path::small_m);
  cuda::DeviceMemory workspace(bytes), d_q(512), d_s(16), d_y(1024);
  EXPECT_THROW(cuda::w4a8_gemm_small_m(d_q.as<int8_t>(), d_s.as<float>(), 1, 256, w.view, d_y.as<f16>(), 256,
                                       workspace.get(), bytes, nullptr, split),
               qspec::Error);
}

// The s8 kernels keep each group sum in s32 started at the bits of 1.5 * 2^23 and read it as an
// f32 (w4_activation.cuh: exact while |sum| < 2^22). Here every product of a group has the
// largest magnitude the codes allow (weights +-7 or -8, activations +-127), with both signs, so
// the sums sit at their extremes: the result must still equal the CPU's exact sums.
TEST_F(Gpu, W4A8GroupSumsAtTheirExtremesAreExact) {
  const int64_t n = 48, k = 4096;
  qspec::WeightMatrix matrix;
  matrix.name = "gpu.extreme";
  matrix.dtype = qspec::DType::F32;
  matrix.rows = n;
  matrix.cols = k;
  matrix.owned.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) matrix.owned[r * k + c] = (r % 3 == 0 ? -0.05f : 0.05f) * (r % 2 ? 1.0f : 0.5f);
  matrix.data = matrix.owned.data();
  const qspec::QuantizedMatrix weight = qspec::quantize_rtn(matrix, qspec::quant::Format::int4, 128);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  qspec::ActivationMode int8_mode;
  int8_mode.kind = qspec::ActivationMode::Kind::quantized;
  int8_mode.format = qspec::quant::Format::int8;
  for (int64_t m : {1, 8, 64, 200}) {
    std::vector<float> x(static_cast<size_t>(m * k));
    for (int64_t t = 0; t < m; ++t)
      for (int64_t c = 0; c < k; ++c) x[t * k + c] = t % 2 ? -1.0f : 1.0f;  // codes +-127
    const std::vector<float> expected = cpu_quantized_linear(x, m, k, k, int8_mode, weight);
    auto d_x = upload(to_f16(x));
    auto d_q = poisoned(static_cast<size_t>(m * k));
    auto d_scales = poisoned(static_cast<size_t>(m) * 4);
    cuda::quantize_int8_rows(d_x.as<f16>(), m, k, k, d_q.as<int8_t>(), k, d_scales.as<float>(), nullptr);
    const size_t bytes = cuda::w4a16_workspace_bytes(m, n, k, cuda::W4A16Path::tiled) +
                         cuda::w4a16_workspace_bytes(m, n, k, cuda::W4A16Path::small_m) +
                         cuda::w4_s8_wgmma_workspace_bytes(n, k);
    cuda::DeviceMemory workspace(bytes);
    cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
    // 0: small-M, 1..4: tiled, 5: the wide kernel (sums 16 x), 6: wgmma (sm_90a)
    for (int tile = 0; tile <= 6; ++tile) {
      if (tile == 6 && !cuda::w4_s8_wgmma_supports(w.view, qspec::quant::Format::int8)) continue;
      auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
      if (tile == 6)
        cuda::w4_quantized_gemm_s8_wgmma(cuda::int8_activations(d_q.as<int8_t>(), d_scales.as<float>(), k), m, w.view,
                                         d_y.as<f16>(), n, workspace.get(), bytes, nullptr);
      else if (tile == 5)
        cuda::w4_quantized_gemm_s8_wide(cuda::int8_activations(d_q.as<int8_t>(), d_scales.as<float>(), k), m, w.view,
                                        d_y.as<f16>(), n, nullptr);
      else if (tile == 0)
        cuda::w4a8_gemm_small_m(d_q.as<int8_t>(), d_scales.as<float>(), m, k, w.view, d_y.as<f16>(), n,
                                workspace.get(), bytes, nullptr);
      else
        cuda::w4a8_gemm_tiled(d_q.as<int8_t>(), d_scales.as<float>(), m, k, w.view, d_y.as<f16>(), n,
                              workspace.get(), bytes, nullptr, {tile, 0});
      const std::vector<f16> y = download<f16>(d_y, static_cast<size_t>(m * n));
      std::vector<float> got(y.size());
      for (size_t i = 0; i < y.size(); ++i) got[i] = qspec::f16_to_f32(y[i]);
      // Every sum is exact on both sides, so only the f16 output rounding and f32 summation
      // order across 32 groups of equal terms remain.
      EXPECT_CLOSE(got, expected, 1e-3, "extreme group sums, m " + std::to_string(m) + " tile " + std::to_string(tile));
    }
  }
}

namespace {

// A GEMM's f16 output rows (ldy apart) against the CPU's (n apart), within `bound` (2e-3 unless
// said); the padding between rows must keep its poison.
void expect_gemm_rows(const std::vector<f16>& y, const std::vector<float>& expected, int64_t m, int64_t n, int64_t ldy,
                      const std::string& what, double bound = 2e-3) {
  std::vector<float> got(expected.size());
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < n; ++i) got[t * n + i] = qspec::f16_to_f32(y[t * ldy + i]);
  EXPECT_CLOSE(got, expected, bound, what);
  for (int64_t t = 0; t < m; ++t)  // the padding between rows is never written
    for (int64_t i = n; i < ldy; ++i) ASSERT_EQ(y[t * ldy + i], 0xffff) << what;
}

}  // namespace

// The large-M W4A8 kernel (weights unpacked once per block, sums 16 x) against the CPU and,
// bit for bit, against the tiled kernel without split-K (same sums, same group order): odd n and
// m (partial row and token tiles, warps with no tokens), every weight group, k of one stage.
TEST_F(Gpu, W4A8WideKernelEqualsTiledBitwiseAndMatchesCpu) {
  using qspec::quant::Format;
  struct Shape {
    int64_t n, k, group;
  };
  qspec::ActivationMode int8_mode;
  int8_mode.kind = qspec::ActivationMode::Kind::quantized;
  int8_mode.format = Format::int8;
  for (const Shape& s : {Shape{4097, 4096, 128}, Shape{136, 128, 32}, Shape{300, 384, 64}, Shape{1408, 14336, 128}}) {
    const qspec::QuantizedMatrix weight = random_quantized(s.n, s.k, Format::int4, s.group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    ASSERT_TRUE(cuda::w4_s8_wide_supports(w.view, Format::int8));
    for (int64_t m : {1, 7, 64, 65, 129, 300}) {
      if (s.k > 4096 && m > 65) continue;  // the CPU reference's time
      const int64_t ldx = s.k + 8, ldq = s.k + 16, ldy = s.n + 3;
      const std::vector<float> x = random_f16_values(static_cast<size_t>(m * ldx));
      const std::vector<float> expected = cpu_quantized_linear(x, m, ldx, s.k, int8_mode, weight);
      auto d_x = upload(to_f16(x));
      auto d_q = poisoned(static_cast<size_t>(m * ldq));
      auto d_scales = poisoned(static_cast<size_t>(m) * 4);
      cuda::quantize_int8_rows(d_x.as<f16>(), m, s.k, ldx, d_q.as<int8_t>(), ldq, d_scales.as<float>(), nullptr);
      const cuda::QuantizedActivations xa = cuda::int8_activations(d_q.as<int8_t>(), d_scales.as<float>(), ldq);
      const std::string base_what = "s8 wide m" + std::to_string(m) + " n" + std::to_string(s.n) + " k" +
                               std::to_string(s.k) + " g" + std::to_string(s.group);
      for (int tile : {1, 2}) {
      const std::string what = base_what + " tile " + std::to_string(tile);
      auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
      cuda::w4_quantized_gemm_s8_wide(xa, m, w.view, d_y.as<f16>(), ldy, nullptr, tile);
      const std::vector<f16> y = download<f16>(d_y, static_cast<size_t>(m * ldy));
      const size_t bytes = cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::tiled);
      cuda::DeviceMemory workspace(bytes);
      cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
      auto d_ref = poisoned(static_cast<size_t>(m * ldy) * 2);
      cuda::w4_quantized_gemm_tiled(xa, m, w.view, d_ref.as<f16>(), ldy, workspace.get(), bytes, nullptr, {2, 1});
      ASSERT_EQ(y, download<f16>(d_ref, static_cast<size_t>(m * ldy))) << what << ": not the tiled kernel's bits";
      ASSERT_NO_FATAL_FAILURE(expect_gemm_rows(y, expected, m, s.n, ldy, what));
      }
    }
  }
  // Refused: k not a multiple of 128, non-int8 activations.
  const qspec::QuantizedMatrix odd = random_quantized(16, 96, Format::int4, 32);
  DeviceW4 w_odd(qspec::gemm::pack_w4a16(odd));
  EXPECT_FALSE(cuda::w4_s8_wide_supports(w_odd.view, Format::int8));
  auto d_q = poisoned(256);
  auto d_scales = poisoned(16);
  auto d_y = poisoned(64);
  EXPECT_THROW(cuda::w4_quantized_gemm_s8_wide(cuda::int8_activations(d_q.as<int8_t>(), d_scales.as<float>(), 96), 1,
                                               w_odd.view, d_y.as<f16>(), 16, nullptr),
               qspec::Error);
  EXPECT_FALSE(cuda::w4_s8_wide_supports(w_odd.view, Format::int4));
}

namespace {

// One case of the wgmma kernel tests: the packed weights, the GEMM's shape, the GPU-quantized activations
// and the CPU's output, and what the wgmma kernel (as dispatched: unpack, then GEMM) and the tiled
// kernel (128x64, no split-K) computed from them.
struct WgmmaCase {
  const DeviceW4& w;
  int64_t m, n, k, ldy;
  const cuda::QuantizedActivations& x;
  const std::vector<float>& expected;
  const std::vector<f16>& y;
  const std::vector<f16>& tiled;
  const std::string& what;
};

// Runs check(WgmmaCase) over the wgmma tests' cases: odd n and m (partial row and token tiles), k
// of one stage (the odd-stage tail), of three and of 112 (Llama-3-8B's down projection), an ldy
// that is not a multiple of 8 (the scalar store path); activations in `format` (int8, or fp8 as
// e4m3 codes, the wgmma kernel's operands) and the CPU's quantized linear in that mode.
template <class Check>
void for_each_wgmma_case(qspec::quant::Format format, Check&& check) {
  struct Shape {
    int64_t n, k, ldy_pad;
  };
  qspec::ActivationMode mode;
  mode.kind = qspec::ActivationMode::Kind::quantized;
  mode.format = format;
  for (const Shape& s : {Shape{4097, 4096, 3}, Shape{136, 128, 8}, Shape{300, 384, 0}, Shape{1408, 14336, 8}}) {
    const qspec::QuantizedMatrix weight = random_quantized(s.n, s.k, qspec::quant::Format::int4, 128);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    ASSERT_TRUE(cuda::w4_s8_wgmma_supports(w.view, format));
    for (int64_t m : {1, 7, 128, 129, 300}) {
      if (s.k > 4096 && m > 129) continue;  // the CPU reference's time
      const int64_t ldx = s.k + 8, ldq = s.k + 16, ldy = s.n + s.ldy_pad;
      const std::vector<float> x = random_f16_values(static_cast<size_t>(m * ldx));
      const std::vector<float> expected = cpu_quantized_linear(x, m, ldx, s.k, mode, weight);
      auto d_x = upload(to_f16(x));
      auto d_q = poisoned(static_cast<size_t>(m * ldq));
      auto d_scales = poisoned(static_cast<size_t>(m) * 4);
      const cuda::QuantizedActivations xa =
          cuda::quantize_activations(format, 0, d_x.as<f16>(), m, s.k, ldx, d_q.get(), ldq, d_scales.as<float>(), 0,
                                     nullptr, {}, format == qspec::quant::Format::fp8);
      const std::string what = std::string(qspec::quant::format_name(format)) + " wgmma m" + std::to_string(m) +
                               " n" + std::to_string(s.n) + " k" + std::to_string(s.k) + " ldy " + std::to_string(ldy);
      const size_t bytes = std::max(cuda::w4_s8_wgmma_workspace_bytes(s.n, s.k),
                                    cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::tiled));
      cuda::DeviceMemory workspace(bytes);
      cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
      auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
      cuda::w4_quantized_gemm_s8_wgmma(xa, m, w.view, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr);
      const std::vector<f16> y = download<f16>(d_y, static_cast<size_t>(m * ldy));
      auto d_tiled = poisoned(static_cast<size_t>(m * ldy) * 2);
      cuda::w4_quantized_gemm_tiled(xa, m, w.view, d_tiled.as<f16>(), ldy, workspace.get(), bytes, nullptr, {2, 1});
      const std::vector<f16> tiled = download<f16>(d_tiled, static_cast<size_t>(m * ldy));
      ASSERT_NO_FATAL_FAILURE(check(WgmmaCase{w, m, s.n, s.k, ldy, xa, expected, y, tiled, what}));
    }
  }
}

// The cooperative kernel (the blocks unpack into the workspace as they go) on one case, launched
// three times on one workspace: each launch gives `expected` bit for bit (its stage flags read as
// free to the next: epochs), the split-K half of the counter region stays zero, the epoch counts
// the launches and the grid's arrival counter is back at zero.
void expect_cooperative_launches(const WgmmaCase& c, const std::vector<f16>& expected) {
  const size_t bytes = cuda::w4_s8_wgmma_workspace_bytes(c.n, c.k);
  cuda::DeviceMemory workspace(bytes);
  cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
  constexpr int kLaunches = 3;
  for (int launch = 0; launch < kLaunches; ++launch) {
    auto d_v = poisoned(static_cast<size_t>(c.m * c.ldy) * 2);
    cuda::w4_s8_gemm_cooperative(c.x, c.m, c.w.view, d_v.as<f16>(), c.ldy, workspace.get(), bytes, nullptr);
    EXPECT_EQ(download<f16>(d_v, static_cast<size_t>(c.m * c.ldy)), expected) << c.what << " cooperative, launch " << launch;
  }
  const std::vector<int32_t> counters = download<int32_t>(workspace, 65536);  // the 256 KB region
  EXPECT_EQ(std::count(counters.begin(), counters.begin() + 32768, 0), 32768) << c.what << ": split-K counters touched";
  EXPECT_EQ(counters[32768], kLaunches) << c.what << ": launch epoch";
  EXPECT_EQ(counters[32769], 0) << c.what << ": grid arrivals";
}

}  // namespace

// The wgmma W4A8 kernel (weights unpacked to int8 in the workspace, 128 x 128 tiles, double-
// buffered group sums) against the CPU and, bit for bit, against the tiled kernel without
// split-K, over for_each_wgmma_case's shapes; every benchmark variant too.
TEST_F(Gpu, W4A8WgmmaKernelEqualsTiledBitwiseAndMatchesCpu) {
  using qspec::quant::Format;
  if (cuda::compute_capability() != 90) GTEST_SKIP() << "wgmma: compute capability 9.0 only";
  for_each_wgmma_case(Format::int8, [](const WgmmaCase& c) {
    size_t mismatches = 0;
    for (size_t i = 0; i < c.y.size(); ++i) mismatches += c.y[i] != c.tiled[i];
    ASSERT_EQ(mismatches, 0u) << c.what << ": not the tiled kernel's bits";
    // Every benchmark variant (ring depth, unroll, I2F share) on the weights unpacked here.
    cuda::DeviceMemory w8(static_cast<size_t>((c.n + 15) / 16 * 16 * c.k));
    cuda::w4_unpack_s8(c.w.view, w8.as<int8_t>(), nullptr);
    for (int variant = 1; variant <= cuda::kW4S8WgmmaVariants; ++variant) {
      auto d_v = poisoned(static_cast<size_t>(c.m * c.ldy) * 2);
      cuda::w4_s8_gemm_unpacked(c.x, c.m, c.w.view, w8.as<int8_t>(), d_v.as<f16>(), c.ldy, nullptr, variant);
      EXPECT_EQ(download<f16>(d_v, static_cast<size_t>(c.m * c.ldy)), c.tiled) << c.what << " variant " << variant;
    }
    // The fused kernel (the unpack in a producer warpgroup), every variant: the same bits.
    for (int variant = 0; variant <= cuda::kW4S8FusedVariants; ++variant) {
      auto d_v = poisoned(static_cast<size_t>(c.m * c.ldy) * 2);
      cuda::w4_s8_gemm_fused(c.x, c.m, c.w.view, d_v.as<f16>(), c.ldy, nullptr, variant);
      EXPECT_EQ(download<f16>(d_v, static_cast<size_t>(c.m * c.ldy)), c.tiled) << c.what << " fused variant " << variant;
    }
    // The register-A kernel (A fragments unpacked in the mma threads), every variant.
    for (int variant = 0; variant <= cuda::kW4S8RegisterVariants; ++variant) {
      auto d_v = poisoned(static_cast<size_t>(c.m * c.ldy) * 2);
      cuda::w4_s8_gemm_registers(c.x, c.m, c.w.view, d_v.as<f16>(), c.ldy, nullptr, variant);
      EXPECT_EQ(download<f16>(d_v, static_cast<size_t>(c.m * c.ldy)), c.tiled)
          << c.what << " register-A variant " << variant;
    }
    ASSERT_NO_FATAL_FAILURE(expect_cooperative_launches(c, c.tiled));
    ASSERT_NO_FATAL_FAILURE(expect_gemm_rows(c.y, c.expected, c.m, c.n, c.ldy, c.what));
  });
  // The unpacked weights: u - 8 of every nibble, row-major, against the CPU's codes.
  {
    const qspec::QuantizedMatrix weight = random_quantized(40, 256, Format::int4, 128);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    auto d_w8 = poisoned(48 * 256);
    cuda::w4_unpack_s8(w.view, d_w8.as<int8_t>(), nullptr);
    const std::vector<int8_t> w8 = download<int8_t>(d_w8, 48 * 256);
    for (int64_t r = 0; r < 40; ++r)
      for (int64_t c = 0; c < 256; ++c)
        ASSERT_EQ(static_cast<float>(w8[r * 256 + c]),
                  qspec::quant::element_value(weight.format, weight.codes.data() + r * weight.format.code_bytes(), c))
            << "unpacked weight row " << r << " col " << c;
  }
  // Refused: weight groups other than 128, k % 128 != 0, non-int8 activations, no workspace.
  const qspec::QuantizedMatrix g64 = random_quantized(16, 256, Format::int4, 64);
  DeviceW4 w_g64(qspec::gemm::pack_w4a16(g64));
  EXPECT_FALSE(cuda::w4_s8_wgmma_supports(w_g64.view, Format::int8));
  const qspec::QuantizedMatrix odd = random_quantized(16, 192, Format::int4, 64);
  DeviceW4 w_odd(qspec::gemm::pack_w4a16(odd));
  EXPECT_FALSE(cuda::w4_s8_wgmma_supports(w_odd.view, Format::int8));
  const qspec::QuantizedMatrix g128 = random_quantized(16, 256, Format::int4, 128);
  DeviceW4 w_g128(qspec::gemm::pack_w4a16(g128));
  EXPECT_FALSE(cuda::w4_s8_wgmma_supports(w_g128.view, Format::int4));
  auto d_q = poisoned(512);
  auto d_scales = poisoned(16);
  auto d_y = poisoned(64);
  const cuda::QuantizedActivations xa = cuda::int8_activations(d_q.as<int8_t>(), d_scales.as<float>(), 256);
  EXPECT_THROW(cuda::w4_quantized_gemm_s8_wgmma(xa, 1, w_g64.view, d_y.as<f16>(), 16, nullptr, 0, nullptr), qspec::Error);
  EXPECT_THROW(cuda::w4_quantized_gemm_s8_wgmma(xa, 1, w_g128.view, d_y.as<f16>(), 16, nullptr, 0, nullptr), qspec::Error);
}

// W4A8-fp8 on the wgmma kernel (e4m3 x e4m3 -> f32 group sums, the weights unpacked to e4m3
// codes) against the CPU (within 2e-3, as every GEMM) and beside the tiled kernel's e4m3 mma.sync
// (the same f32 products; only the tensor cores' summation order may differ): the unpacked codes
// are the CPU's e4m3 of every weight, odd n and m, ldy padding kept.
TEST_F(Gpu, W4A8Fp8WgmmaMatchesTheCpu) {
  using qspec::quant::Format;
  if (cuda::compute_capability() != 90) GTEST_SKIP() << "wgmma: compute capability 9.0 only";
  size_t outputs = 0, same_bits = 0;
  for_each_wgmma_case(Format::fp8, [&](const WgmmaCase& c) {
    ASSERT_NO_FATAL_FAILURE(expect_gemm_rows(c.y, c.expected, c.m, c.n, c.ldy, c.what));
    ASSERT_NO_FATAL_FAILURE(expect_gemm_rows(c.tiled, c.expected, c.m, c.n, c.ldy, c.what + " (tiled)"));
    // The unpack kernel + GEMM and the fused kernel (both its fp8 variants) give the same bits:
    // the same e4m3 operands in the same wgmma order.
    cuda::DeviceMemory w8(static_cast<size_t>((c.n + 15) / 16 * 16 * c.k));
    cuda::w4_unpack_e4m3(c.w.view, w8.as<uint8_t>(), nullptr);
    auto d_unpacked = poisoned(static_cast<size_t>(c.m * c.ldy) * 2);
    cuda::w4_s8_gemm_unpacked(c.x, c.m, c.w.view, w8.as<int8_t>(), d_unpacked.as<f16>(), c.ldy, nullptr);
    const std::vector<f16> unpacked = download<f16>(d_unpacked, static_cast<size_t>(c.m * c.ldy));
    ASSERT_NO_FATAL_FAILURE(expect_gemm_rows(unpacked, c.expected, c.m, c.n, c.ldy, c.what + " (unpack + GEMM)"));
    for (int variant = 0; variant <= 1; ++variant) {
      auto d_v = poisoned(static_cast<size_t>(c.m * c.ldy) * 2);
      cuda::w4_s8_gemm_fused(c.x, c.m, c.w.view, d_v.as<f16>(), c.ldy, nullptr, variant);
      EXPECT_EQ(download<f16>(d_v, static_cast<size_t>(c.m * c.ldy)), unpacked) << c.what << " fused variant " << variant;
    }
    ASSERT_NO_FATAL_FAILURE(expect_cooperative_launches(c, unpacked));
    for (int64_t t = 0; t < c.m; ++t)
      for (int64_t i = 0; i < c.n; ++i) {
        ++outputs;
        same_bits += c.y[t * c.ldy + i] == c.tiled[t * c.ldy + i];
      }
  });
  std::printf("  fp8 wgmma: %zu of %zu outputs bitwise the tiled kernel's\n", same_bits, outputs);
  // The unpacked weights: the e4m3 code of every weight, row-major.
  {
    const qspec::QuantizedMatrix weight = random_quantized(40, 256, Format::int4, 128);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    auto d_w8 = poisoned(48 * 256);
    cuda::w4_unpack_e4m3(w.view, d_w8.as<uint8_t>(), nullptr);
    const std::vector<uint8_t> w8 = download<uint8_t>(d_w8, 48 * 256);
    for (int64_t r = 0; r < 40; ++r)
      for (int64_t c = 0; c < 256; ++c)
        ASSERT_EQ(w8[r * 256 + c], qspec::quant::f32_to_e4m3(qspec::quant::element_value(
                                       weight.format, weight.codes.data() + r * weight.format.code_bytes(), c)))
            << "unpacked e4m3 weight row " << r << " col " << c;
  }
  // Benchmark variants are int8 only.
  const qspec::QuantizedMatrix g128 = random_quantized(16, 256, Format::int4, 128);
  DeviceW4 w_g128(qspec::gemm::pack_w4a16(g128));
  auto d_q = poisoned(512), d_scales = poisoned(16), d_w8 = poisoned(16 * 256), d_y = poisoned(64);
  const cuda::QuantizedActivations xf{Format::fp8, d_q.get(), 256, d_scales.as<float>(), 0, 0, true};
  EXPECT_THROW(cuda::w4_s8_gemm_unpacked(xf, 1, w_g128.view, d_w8.as<int8_t>(), d_y.as<f16>(), 16, nullptr, 1),
               qspec::Error);
  // fp8 as f16 values is not what the wgmma kernel reads.
  const cuda::QuantizedActivations xf16{Format::fp8, d_q.get(), 256, d_scales.as<float>(), 0, 0, false};
  EXPECT_THROW(cuda::w4_s8_gemm_unpacked(xf16, 1, w_g128.view, d_w8.as<int8_t>(), d_y.as<f16>(), 16, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::w4_s8_gemm_fused(xf16, 1, w_g128.view, d_y.as<f16>(), 16, nullptr), qspec::Error);
  EXPECT_THROW(cuda::w4_s8_gemm_registers(xf, 1, w_g128.view, d_y.as<f16>(), 16, nullptr), qspec::Error);
  EXPECT_THROW(cuda::w4_s8_gemm_registers(xf16, 1, w_g128.view, d_y.as<f16>(), 16, nullptr), qspec::Error);
  EXPECT_THROW(
      cuda::w4_s8_gemm_registers(xf, 1, w_g128.view, d_y.as<f16>(), 16, nullptr, cuda::kW4S8RegisterVariants + 1),
      qspec::Error);
  EXPECT_THROW(cuda::w4_s8_gemm_fused(xf, 1, w_g128.view, d_y.as<f16>(), 16, nullptr, 2), qspec::Error);
  EXPECT_THROW(cuda::w4_s8_gemm_fused(xf, 1, w_g128.view, d_y.as<f16>(), 16, nullptr, cuda::kW4S8FusedVariants + 1),
               qspec::Error);
}

// How the engine feeds fp8 GEMMs (GpuLlama::fp8_codes_for): a map that sends an fp8 GEMM to the
// wgmma kernel gets e4m3 codes (w4_fp8_gemm_takes_e4m3), and the dispatcher runs them there;
// everywhere else (small M, other strategies, no map, no workspace) f16 values, and f16 values the
// map sends to wgmma take the tiled kernel instead. Every route matches the CPU.
TEST_F(Gpu, Fp8GemmsTakeE4m3CodesExactlyWhereTheyRunOnWgmma) {
  using qspec::quant::Format;
  if (cuda::compute_capability() != 90) GTEST_SKIP() << "wgmma: compute capability 9.0 only";
  const int64_t n = 520, k = 1024, ldq = k + 16;
  const qspec::QuantizedMatrix weight = random_quantized(n, k, Format::int4, 128);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  qspec::ActivationMode fp8_mode;
  fp8_mode.kind = qspec::ActivationMode::Kind::quantized;
  fp8_mode.format = Format::fp8;
  const qspec::gemm::PolicyMap forced = qspec::gemm::PolicyMap::forced(qspec::gemm::Strategy::s8_wgmma_128x128);
  const qspec::gemm::PolicyMap rules;  // rule-based: wgmma from 512 tokens
  const size_t bytes = std::max(cuda::w4_s8_wgmma_workspace_bytes(n, k),
                                cuda::w4a16_workspace_bytes(600, n, k, cuda::W4A16Path::tiled));
  cuda::DeviceMemory workspace(bytes);
  cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
  cuda::Blas blas;
  EXPECT_TRUE(qspec::w4_fp8_gemm_takes_e4m3(&forced, w.view, 200, bytes));
  EXPECT_TRUE(qspec::w4_fp8_gemm_takes_e4m3(&rules, w.view, 600, bytes));
  EXPECT_FALSE(qspec::w4_fp8_gemm_takes_e4m3(&rules, w.view, 200, bytes));
  // No map: the rule-based default's choice (dispatch_w4_gemm runs the wgmma kernel there too).
  EXPECT_TRUE(qspec::w4_fp8_gemm_takes_e4m3(nullptr, w.view, 600, bytes));
  EXPECT_FALSE(qspec::w4_fp8_gemm_takes_e4m3(nullptr, w.view, 200, bytes));
  EXPECT_FALSE(qspec::w4_fp8_gemm_takes_e4m3(&forced, w.view, 600, 1024));  // no room for the unpacked weights
  const qspec::QuantizedMatrix g64 = random_quantized(n, k, Format::int4, 64);
  DeviceW4 w64(qspec::gemm::pack_w4a16(g64));
  EXPECT_FALSE(qspec::w4_fp8_gemm_takes_e4m3(&forced, w64.view, 600, bytes));  // the kernel needs groups of 128
  for (int64_t m : {200, 600}) {
    const std::vector<float> x = random_f16_values(static_cast<size_t>(m * k));
    const std::vector<float> expected = cpu_quantized_linear(x, m, k, k, fp8_mode, weight);
    auto d_x = upload(to_f16(x));
    for (const qspec::gemm::PolicyMap* policy : {&forced, &rules, static_cast<const qspec::gemm::PolicyMap*>(nullptr)}) {
      for (bool codes : {false, true}) {
        auto d_q = poisoned(static_cast<size_t>(m * ldq) * 2);
        auto d_scales = poisoned(static_cast<size_t>(m) * 4);
        const cuda::QuantizedActivations xq = cuda::quantize_activations(
            Format::fp8, 0, d_x.as<f16>(), m, k, k, d_q.get(), ldq, d_scales.as<float>(), 0, nullptr, {}, codes);
        auto d_y = poisoned(static_cast<size_t>(m * n) * 2);
        qspec::dispatch_w4_gemm(policy, blas, qspec::W4GemmInput{nullptr, 0, &xq}, m, w.view, d_y.as<f16>(), n,
                                workspace.get(), bytes, nullptr);
        const std::string what = std::string(policy == &forced ? "forced wgmma" : policy ? "rules" : "no map") + " m" +
                                 std::to_string(m) + (codes ? " e4m3 codes" : " f16 values");
        ASSERT_NO_FATAL_FAILURE(expect_gemm_rows(download<f16>(d_y, static_cast<size_t>(m * n)), expected, m, n, n, what));
      }
    }
  }
}

// ---- W4A4 / W4A8-fp8 activations: quantizer and GEMMs ----------------------------------------

namespace {

struct ActivationCase {
  qspec::quant::Format format;
  int64_t group;      // int4 only
  bool e4m3 = false;  // fp8 only: e4m3 codes instead of f16 values
  std::string name() const {
    return std::string(qspec::quant::format_name(format)) +
           (format == qspec::quant::Format::int4 ? " g" + std::to_string(group) : "") + (e4m3 ? " e4m3" : "");
  }
  bool f16_values() const { return cuda::quantized_activations_use_f16(format) && !e4m3; }
  // The CPU's activation mode for these activations (cpu::apply_activation_mode).
  qspec::ActivationMode mode() const {
    qspec::ActivationMode m;
    m.kind = qspec::ActivationMode::Kind::quantized;
    m.format = format;
    m.group_size = format == qspec::quant::Format::int4 ? group : 128;
    return m;
  }
};

// m random rows of k values (ldx = k + 8 apart) and the GPU's quantization of them for case c
// (values ldv = k + 16 apart; int4 scales scale_ld a row), what the quantized GEMM tests feed.
struct QuantizedRows {
  int64_t ldx, ldv, scale_ld;
  std::vector<float> x;
  cuda::DeviceMemory d_x, values, scales;
  cuda::QuantizedActivations q;
};
QuantizedRows quantized_rows(const ActivationCase& c, int64_t m, int64_t k) {
  QuantizedRows r{k + 8, k + 16, c.format == qspec::quant::Format::int4 ? k / c.group : 0, {}, {}, {}, {}, {}};
  r.x = random_f16_values(static_cast<size_t>(m * r.ldx));
  r.d_x = upload(to_f16(r.x));
  r.values = poisoned(static_cast<size_t>(m * r.ldv) * 2);
  r.scales = poisoned(static_cast<size_t>(m * std::max<int64_t>(1, r.scale_ld)) * 4);
  r.q = cuda::quantize_activations(c.format, c.group, r.d_x.as<f16>(), m, k, r.ldx, r.values.get(), r.ldv,
                                   r.scales.as<float>(), r.scale_ld, nullptr, {}, c.e4m3);
  return r;
}

// What the GEMMs see of quantized activations, as f32: int4 code x group scale, e4m3 code x token
// scale, or f16 value x token scale (cuda::QuantizedActivations).
std::vector<float> gpu_dequantized(const cuda::QuantizedActivations& q, int64_t rows, int64_t k) {
  std::vector<float> out(static_cast<size_t>(rows * k));
  cuda::synchronize();
  if (q.format == qspec::quant::Format::int4) {
    std::vector<int8_t> codes(static_cast<size_t>(rows * q.ldx));
    std::vector<float> scales(static_cast<size_t>(rows * q.scale_ld));
    cuda::copy_to_host(codes.data(), q.values, codes.size());
    cuda::copy_to_host(scales.data(), q.scales, scales.size() * 4);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i)
        out[static_cast<size_t>(r * k + i)] =
            static_cast<float>(codes[static_cast<size_t>(r * q.ldx + i)]) * scales[static_cast<size_t>(r * q.scale_ld + i / q.group)];
  } else if (q.format == qspec::quant::Format::fp8 && q.e4m3) {  // e4m3 codes
    std::vector<uint8_t> codes(static_cast<size_t>(rows * q.ldx));
    std::vector<float> scales(static_cast<size_t>(rows));
    cuda::copy_to_host(codes.data(), q.values, codes.size());
    cuda::copy_to_host(scales.data(), q.scales, scales.size() * 4);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i)
        out[static_cast<size_t>(r * k + i)] =
            qspec::quant::e4m3_to_f32(codes[static_cast<size_t>(r * q.ldx + i)]) * scales[static_cast<size_t>(r)];
  } else {
    std::vector<f16> values(static_cast<size_t>(rows * q.ldx));
    std::vector<float> scales(static_cast<size_t>(rows));
    cuda::copy_to_host(values.data(), q.values, values.size() * 2);
    cuda::copy_to_host(scales.data(), q.scales, scales.size() * 4);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i)
        out[static_cast<size_t>(r * k + i)] =
            qspec::f16_to_f32(values[static_cast<size_t>(r * q.ldx + i)]) * scales[static_cast<size_t>(r)];
  }
  return out;
}

}  // namespace

// The GPU quantizers of every 4-bit / fp8 activation format give the CPU's dequantized values
// bit for bit (codes and scales as the GEMMs consume them; the sign of zero included): random
// rows, an all-zero row, an outlier channel, a block 2^-34 below the row's largest value (mxfp4's
// per-token power of two), and a NaN / infinity row (NaN scales, nothing thrown inside a graph).
TEST_F(Gpu, QuantizeActivationsEqualsTheCpuQuantizerBitwise) {
  using qspec::quant::Format;
  using qspec::quant::Role;
  const std::vector<ActivationCase> cases = {{Format::int4, 32}, {Format::int4, 64},    {Format::int4, 128},
                                             {Format::fp8, 0},   {Format::fp8, 0, true}, {Format::nvfp4, 0},
                                             {Format::mxfp4, 0}};
  for (const ActivationCase& c : cases)
    for (auto [rows, k] : {std::tuple{1, 64}, {6, 256}, {17, 4096}, {5, 704}, {64, 14336}}) {
      if (c.format == Format::int4 && k % c.group != 0) continue;
      const std::string what = c.name() + " " + shape_name({rows, k});
      const int64_t ldx = k + 8, ldv = k + 16, scale_ld = c.format == Format::int4 ? k / c.group + 1 : 0;
      std::vector<float> x = random_f16_values(static_cast<size_t>(rows * ldx), 2.0f);
      if (rows > 1) std::fill(x.begin() + ldx, x.begin() + ldx + k, 0.0f);  // row 1: all zero
      if (rows > 2) x[static_cast<size_t>(2 * ldx + k / 3)] = 3000.0f;       // an outlier channel
      if (rows > 3) {
        x[static_cast<size_t>(3 * ldx + 1)] = -0.0f;
        for (int64_t i = 32; i < 64; ++i) x[static_cast<size_t>(3 * ldx + i)] *= 0x1p-20f;  // a tiny block
        x[static_cast<size_t>(3 * ldx + 100)] = 20000.0f;  // 2^34 above it (mxfp4: the token's power of two)
      }
      x = from_f16(to_f16(x));  // what the GPU reads (the tiny block keeps few bits)
      auto d_x = upload(to_f16(x));
      auto d_values = poisoned(static_cast<size_t>(rows * ldv) * (c.f16_values() ? 2 : 1));
      auto d_scales = poisoned(static_cast<size_t>(rows * std::max<int64_t>(1, scale_ld)) * 4);
      const cuda::QuantizedActivations q =
          cuda::quantize_activations(c.format, c.group, d_x.as<f16>(), rows, k, ldx, d_values.get(), ldv,
                                     d_scales.as<float>(), scale_ld, nullptr, {}, c.e4m3);
      ASSERT_EQ(q.values, d_values.get());
      ASSERT_EQ(q.e4m3, c.e4m3);
      const std::vector<float> got = gpu_dequantized(q, rows, k);
      const auto format = qspec::quant::make_row_format(c.format, Role::activation, k, c.group > 0 ? c.group : 128);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> expected(x.begin() + r * ldx, x.begin() + r * ldx + k);
        qspec::quant::fake_quantize_row(format, expected.data());
        for (int64_t i = 0; i < k; ++i) {
          const float g = got[static_cast<size_t>(r * k + i)], e = expected[static_cast<size_t>(i)];
          ASSERT_EQ(std::memcmp(&g, &e, 4), 0) << what << " row " << r << " col " << i << ": " << g << " vs " << e
                                               << " (input " << x[static_cast<size_t>(r * ldx + i)] << ")";
        }
      }
      if (rows >= 3) {
        std::vector<float> bad = x;
        bad[static_cast<size_t>(ldx + k - 1)] = std::numeric_limits<float>::quiet_NaN();
        bad[static_cast<size_t>(2 * ldx)] = -std::numeric_limits<float>::infinity();
        auto d_bad = upload(to_f16(bad));
        const cuda::QuantizedActivations qb =
            cuda::quantize_activations(c.format, c.group, d_bad.as<f16>(), rows, k, ldx, d_values.get(), ldv,
                                       d_scales.as<float>(), scale_ld, nullptr, {}, c.e4m3);
        const std::vector<float> bad_got = gpu_dequantized(qb, rows, k);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < k; ++i) {
            const float v = bad_got[static_cast<size_t>(r * k + i)];
            if (r == 1 || r == 2)
              ASSERT_TRUE(std::isnan(v)) << what << ": row " << r << " with a NaN / inf input must give NaN";
            else
              ASSERT_EQ(std::memcmp(&v, &got[static_cast<size_t>(r * k + i)], 4), 0) << what << " row " << r;
          }
      }
    }
  // Bad shapes are refused with the reason.
  EXPECT_THROW(cuda::quantize_activations(Format::int4, 48, nullptr, 1, 96, 96, nullptr, 96, nullptr, 2, nullptr),
               qspec::Error);  // group not a power of two
  EXPECT_THROW(cuda::quantize_activations(Format::nvfp4, 0, nullptr, 1, 40, 40, nullptr, 40, nullptr, 0, nullptr),
               qspec::Error);  // k not a multiple of 16
  EXPECT_THROW(cuda::quantize_activations(Format::int4_channel, 0, nullptr, 1, 64, 64, nullptr, 64, nullptr, 0, nullptr),
               qspec::Error);  // a weight format
  EXPECT_THROW(cuda::quantize_activations(Format::nvfp4, 0, reinterpret_cast<f16*>(256), 1, 64, 64,
                                          reinterpret_cast<void*>(256), 64, reinterpret_cast<float*>(256), 0, nullptr,
                                          {}, true),
               qspec::Error);  // e4m3 codes are fp8's
}

// The 4-bit-weight GEMMs on W4A4 (int4 groups on s8 mma; nvfp4 / mxfp4 emulated on f16 mma) and
// W4A8-fp8 activations against the CPU: the same 4-bit weights (cpu::quantized_linear) times the
// activations fake-quantized by the CPU (cpu::apply_activation_mode): equal up to f32 summation
// order and the f16 output rounding (bound 2e-3, as W4A16). Small-M and tiled kernels, split-K,
// slices past 64 tokens, int4 activation groups wider than the weight group.
TEST_F(Gpu, QuantizedActivationGemmsMatchCpu) {
  using qspec::quant::Format;
  struct Shape {
    int64_t n, k, weight_group, int4_group;
  };
  const std::vector<Shape> shapes = {{256, 256, 64, 64}, {33, 96, 32, 32}, {4097, 4096, 128, 128},
                                     {1000, 256, 64, 128}, {1408, 14336, 128, 128}};
  for (const Shape& s : shapes) {
    const qspec::QuantizedMatrix weight = random_quantized(s.n, s.k, Format::int4, s.weight_group);
    DeviceW4 w(qspec::gemm::pack_w4a16(weight));
    for (const ActivationCase& c : {ActivationCase{Format::int4, s.int4_group}, ActivationCase{Format::fp8, 0},
                                    ActivationCase{Format::fp8, 0, true}, ActivationCase{Format::nvfp4, 0},
                                    ActivationCase{Format::mxfp4, 0}}) {
      if ((c.format == Format::nvfp4 && s.k % 16 != 0) || (c.format == Format::mxfp4 && s.k % 32 != 0)) continue;
      const qspec::ActivationMode mode = c.mode();
      for (int64_t m : {1, 5, 8, 9, 33, 130}) {
        const int64_t ldy = s.n + 3;
        const QuantizedRows in = quantized_rows(c, m, s.k);
        const cuda::QuantizedActivations& q = in.q;
        const std::vector<float> expected = cpu_quantized_linear(in.x, m, in.ldx, s.k, mode, weight);
        struct Variant {
          const char* name;
          cuda::W4A16SmallMConfig config;
          cuda::W4A16TiledConfig tiled{-1, 0};
        };
        for (const Variant& v : {Variant{"automatic", {}}, Variant{"v1 split3", {1, 3}},
                                 Variant{"v2 x shared", {2, 0, 1}}, Variant{"tiled auto", {}, {0, 0}},
                                 Variant{"tiled 256x64 split3", {}, {1, 3}}, Variant{"tiled 128x128", {}, {4, 1}},
                                 Variant{"tiled 128x32", {}, {cuda::kW4A16Tile128x32, 1}}}) {
          const size_t bytes = std::max(cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::small_m) * 4,
                                        cuda::w4a16_workspace_bytes(1, s.n, s.k, cuda::W4A16Path::tiled) +
                                            static_cast<size_t>(5 * m * s.n) * sizeof(float));
          cuda::DeviceMemory workspace(bytes);
          cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
          auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
          if (v.tiled.tile >= 0)
            cuda::w4_quantized_gemm_tiled(q, m, w.view, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr, v.tiled);
          else if (v.config.variant == 0)
            cuda::w4_quantized_gemm(q, m, w.view, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr);
          else
            cuda::w4_quantized_gemm_small_m(q, m, w.view, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr,
                                            v.config);
          const std::vector<f16> y = download<f16>(d_y, static_cast<size_t>(m * ldy));
          std::vector<float> got(expected.size());
          for (int64_t t = 0; t < m; ++t)
            for (int64_t i = 0; i < s.n; ++i) got[t * s.n + i] = qspec::f16_to_f32(y[t * ldy + i]);
          EXPECT_CLOSE(got, expected, 2e-3,
                       c.name() + " " + v.name + " " + shape_name({m, s.n, s.k}) + " wg" + std::to_string(s.weight_group));
        }
      }
    }
  }
  // int4 activation groups narrower than the weight group are refused.
  const qspec::QuantizedMatrix weight = random_quantized(16, 256, Format::int4, 128);
  DeviceW4 w(qspec::gemm::pack_w4a16(weight));
  cuda::DeviceMemory values(16 * 256), scales(16 * 8 * 4), y(16 * 16 * 2);
  const cuda::QuantizedActivations narrow{Format::int4, values.get(), 256, scales.as<float>(), 8, 32};
  EXPECT_THROW(cuda::w4_quantized_gemm(narrow, 1, w.view, y.as<f16>(), 16, nullptr, 0, nullptr), qspec::Error);
}

// ADAngel's DPR strategies on the GPU (issue 6): the bit-plane weight copy made on the GPU equals
// the host's pack_w4_bitplanes byte for byte; Bitwise (b1 and.popc) and Split (int8 as two
// 4-bit halves on s8) match the generic CPU DPR reference of their partition (gemm/dpr.h) and
// the engine's quantized_linear; Split's output is bitwise the Padding kernel's (same integer sums).
TEST_F(Gpu, DprStrategiesMatchTheCpuReference) {
  using qspec::quant::Format;
  struct Shape {
    int64_t n, k;
  };
  for (const Shape& s : {Shape{33, 384}, Shape{1000, 256}, Shape{4097, 4096}, Shape{1408, 14336}}) {
    const qspec::QuantizedMatrix weight = random_quantized(s.n, s.k, Format::int4, 128);
    const qspec::gemm::W4A16Packed packed = qspec::gemm::pack_w4a16(weight);
    DeviceW4 w(packed);
    const std::vector<uint8_t> host_planes = qspec::gemm::pack_w4_bitplanes(packed);
    auto d_planes = poisoned(host_planes.size());
    cuda::w4_bitplanes_from_packed(w.view, d_planes.get(), nullptr);
    ASSERT_EQ(download<uint8_t>(d_planes, host_planes.size()), host_planes) << "bit planes " << shape_name({s.n, s.k});
    cuda::W4A16Weights view = w.view;
    view.bitplanes = d_planes.get();
    for (Format format : {Format::int8, Format::int4}) {
      const int64_t group = format == Format::int4 ? 128 : 0, scale_ld = format == Format::int4 ? s.k / 128 : 0;
      const int bits = format == Format::int8 ? 8 : 4;
      qspec::ActivationMode mode;
      mode.kind = qspec::ActivationMode::Kind::quantized;
      mode.format = format;
      mode.group_size = 128;
      for (int64_t m : {1, 2, 3, 5, 8, 9, 17}) {
        const int64_t ldx = s.k + 8, ldv = s.k + 16, ldy = s.n + 3;
        const std::vector<float> x = random_f16_values(static_cast<size_t>(m * ldx));
        const std::vector<float> expected = cpu_quantized_linear(x, m, ldx, s.k, mode, weight);
        auto d_x = upload(to_f16(x));
        auto d_values = poisoned(static_cast<size_t>(m * ldv));
        auto d_scales = poisoned(static_cast<size_t>(m * std::max<int64_t>(1, scale_ld)) * 4);
        const cuda::QuantizedActivations q = cuda::quantize_activations(
            format, group, d_x.as<f16>(), m, s.k, ldx, d_values.get(), ldv, d_scales.as<float>(), scale_ld, nullptr);
        // The DPR reference on the very codes and scales the GPU quantizer wrote (bitwise the CPU's).
        const std::vector<int8_t> codes = download<int8_t>(d_values, static_cast<size_t>(m * ldv));
        const std::vector<float> scales = download<float>(d_scales, static_cast<size_t>(m * std::max<int64_t>(1, scale_ld)));
        std::vector<int32_t> x_codes(static_cast<size_t>(m * s.k));
        for (int64_t t = 0; t < m; ++t)
          for (int64_t i = 0; i < s.k; ++i) x_codes[static_cast<size_t>(t * s.k + i)] = codes[static_cast<size_t>(t * ldv + i)];
        const int64_t x_group = format == Format::int8 ? s.k : 128;
        const size_t bytes = cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::small_m);
        cuda::DeviceMemory workspace(bytes);
        cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
        auto run = [&](const char* strategy) {
          auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
          if (std::string(strategy) == "bitwise")
            cuda::w4_quantized_gemm_bitwise(q, m, view, view.bitplanes, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr);
          else
            cuda::w4_quantized_gemm_small_m(q, m, view, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr,
                                            cuda::W4A16SmallMConfig{1, 0, 0, std::string(strategy) == "split"});
          const std::vector<f16> y = download<f16>(d_y, static_cast<size_t>(m * ldy));
          std::vector<float> got(expected.size());
          for (int64_t t = 0; t < m; ++t)
            for (int64_t i = 0; i < s.n; ++i) got[t * s.n + i] = qspec::f16_to_f32(y[t * ldy + i]);
          return got;
        };
        const std::string what = std::string(qspec::quant::format_name(format)) + " " + shape_name({m, s.n, s.k});
        for (const char* strategy : {"bitwise", "split"}) {
          if (std::string(strategy) == "split" && format != Format::int8) continue;
          const std::vector<float> got = run(strategy);
          const std::vector<float> dpr = qspec::gemm::dpr::quantized_gemm(
              qspec::gemm::dpr::w4_strategy(strategy, bits), x_codes.data(), scales.data(), x_group, m, weight);
          EXPECT_CLOSE(got, dpr, 2e-3, std::string(strategy) + " vs DPR " + what);
          EXPECT_CLOSE(got, expected, 2e-3, std::string(strategy) + " vs quantized_linear " + what);
        }
        if (format == Format::int8) {
          EXPECT_EQ(run("split"), run("padding")) << "split == padding bitwise " << what;
        }
      }
    }
  }
  // Shapes Bitwise cannot run are refused with the reason.
  const qspec::QuantizedMatrix narrow = random_quantized(16, 256, Format::int4, 64);
  DeviceW4 w64(qspec::gemm::pack_w4a16(narrow));
  EXPECT_FALSE(cuda::w4_bitwise_supports(w64.view, Format::int8));
  cuda::DeviceMemory planes(4096), values(16 * 256), scales(64), y(16 * 16 * 2);
  EXPECT_THROW(cuda::w4_bitplanes_from_packed(w64.view, planes.get(), nullptr), qspec::Error);
  EXPECT_THROW(cuda::w4_quantized_gemm_bitwise(cuda::int8_activations(values.as<int8_t>(), scales.as<float>(), 256), 1,
                                               w64.view, planes.get(), y.as<f16>(), 16, nullptr, 0, nullptr),
               qspec::Error);
}

// ARCQuant on the GPU: the channel reorder is an exact gather with zero augmented columns, and
// the quantizer's residual channels equal quant::arc_fake_quantize_row (concatenated layout: Q(X)
// for the k reordered channels, zeros, then Q(R) for the last S) bit for bit.
TEST_F(Gpu, ArcReorderAndResidualQuantizationEqualTheCpu) {
  using qspec::quant::Format;
  struct Case {
    Format format;
    int64_t group, k, outliers, tail;
  };
  for (const Case& c : {Case{Format::int4, 64, 256, 64, 64}, Case{Format::int4, 32, 704, 96, 128},
                        Case{Format::nvfp4, 0, 256, 32, 64}, Case{Format::nvfp4, 0, 4096, 160, 256},
                        Case{Format::mxfp4, 0, 704, 64, 64}, Case{Format::mxfp4, 0, 4096, 256, 256}}) {
    const int64_t rows = 7, width = c.k + c.tail, ldx = c.k + 8, ldr = width + 8, ldv = width + 16;
    const std::string what = std::string(qspec::quant::format_name(c.format)) + " k" + std::to_string(c.k) + " S" +
                             std::to_string(c.outliers);
    std::vector<float> x = random_f16_values(static_cast<size_t>(rows * ldx), 1.0f);
    for (int64_t r = 0; r < rows; ++r)  // outlier channels, which the reorder moves to the end
      for (int64_t i = 0; i < c.k; i += 37) x[static_cast<size_t>(r * ldx + i)] *= 40.0f;
    x = from_f16(to_f16(x));
    std::vector<int32_t> order(static_cast<size_t>(c.k));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng());
    auto d_x = upload(to_f16(x));
    auto d_order = upload(order);
    auto d_reordered = poisoned(static_cast<size_t>(rows * ldr) * 2);
    cuda::gather_columns(d_x.as<f16>(), rows, c.k, ldx, d_order.as<int32_t>(), width, d_reordered.as<f16>(), ldr,
                         nullptr);
    const std::vector<float> reordered = from_f16(download<f16>(d_reordered, static_cast<size_t>(rows * ldr)));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < width; ++j)
        ASSERT_EQ(reordered[static_cast<size_t>(r * ldr + j)],
                  j < c.k ? x[static_cast<size_t>(r * ldx + order[static_cast<size_t>(j)])] : 0.0f)
            << what << " gather row " << r << " col " << j;
    const int64_t scale_ld = c.format == Format::int4 ? width / c.group : 0;
    auto d_values = poisoned(static_cast<size_t>(rows * ldv) * 2);
    auto d_scales = poisoned(static_cast<size_t>(rows * std::max<int64_t>(1, scale_ld)) * 4);
    const cuda::QuantizedActivations q =
        cuda::quantize_activations(c.format, c.group, d_reordered.as<f16>(), rows, width, ldr, d_values.get(), ldv,
                                   d_scales.as<float>(), scale_ld, nullptr, {c.k, c.outliers});
    const std::vector<float> got = gpu_dequantized(q, rows, width);
    const qspec::quant::ArcRow arc = qspec::quant::make_arc_row(c.format, c.k, c.outliers,
                                                                qspec::quant::ArcLayout::concatenated,
                                                                c.group > 0 ? c.group : 128);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> augmented(static_cast<size_t>(c.k + c.outliers));
      qspec::quant::arc_fake_quantize_row(arc, reordered.data() + r * ldr, augmented.data());
      for (int64_t j = 0; j < width; ++j) {
        const float expected = j < c.k ? augmented[static_cast<size_t>(j)]
                               : j >= width - c.outliers ? augmented[static_cast<size_t>(c.k + j - (width - c.outliers))]
                                                         : 0.0f;
        const float g = got[static_cast<size_t>(r * width + j)];
        ASSERT_EQ(std::memcmp(&g, &expected, 4), 0) << what << " row " << r << " col " << j << ": " << g << " vs "
                                                     << expected;
      }
    }
  }
  EXPECT_THROW(cuda::quantize_activations(Format::nvfp4, 0, reinterpret_cast<f16*>(256), 1, 96, 96,
                                          reinterpret_cast<void*>(256), 96, reinterpret_cast<float*>(256), 0, nullptr,
                                          {64, 24}),
               qspec::Error);  // S not a multiple of the block
  EXPECT_THROW(cuda::quantize_activations(Format::fp8, 0, reinterpret_cast<f16*>(256), 1, 96, 96,
                                          reinterpret_cast<void*>(256), 96, reinterpret_cast<float*>(256), 0, nullptr,
                                          {64, 32}),
               qspec::Error);  // ARC needs a 4-bit block format
}

// The fused quantizer in front of the 4-bit GEMMs (cuda::rmsnorm_quantize: residual add, RMSNorm,
// ARC reorder, primary + residual quantization in one launch) is the unfused chain bit for bit:
// [add_]rmsnorm -> gather_columns -> quantize_activations, for every activation format, with and
// without the residual add, the reorder and the ARC residuals: values (bytes), scales and the
// residual written back; a NaN row gives NaN scales in both.
// Two quantizers' outputs bit for bit: each row's k values (elem bytes each, rows ldv apart), the
// padding after them still poisoned, every scale (scales_a_row a row, scale_stride apart) written
// and equal. `scales` gets the fused side's scales for further checks.
void expect_same_quantized_rows(const cuda::DeviceMemory& d_values, const cuda::DeviceMemory& d_values_ref,
                                const cuda::DeviceMemory& d_scales, const cuda::DeviceMemory& d_scales_ref,
                                int64_t rows, int64_t k, int64_t ldv, size_t elem, int64_t scales_a_row,
                                int64_t scale_stride, const std::string& what, std::vector<uint32_t>& scales) {
  const auto values_ref = download<uint8_t>(d_values_ref, d_values_ref.bytes());
  const auto values = download<uint8_t>(d_values, d_values.bytes());
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < static_cast<size_t>(k) * elem; ++b) {
      const size_t at = static_cast<size_t>(r * ldv) * elem + b;
      ASSERT_EQ(values[at], values_ref[at]) << what << " row " << r << " byte " << b;
    }
    ASSERT_EQ(values[static_cast<size_t>(r * ldv + k) * elem], 0xff) << what << ": wrote past k in row " << r;
  }
  const auto scales_ref = download<uint32_t>(d_scales_ref, d_scales_ref.bytes() / 4);
  scales = download<uint32_t>(d_scales, d_scales.bytes() / 4);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < scales_a_row; ++i) {
      const size_t at = static_cast<size_t>(r * scale_stride + i);
      ASSERT_EQ(scales[at], scales_ref[at]) << what << " scale row " << r << " " << i;
      ASSERT_NE(scales[at], 0xffffffffu) << what << ": unwritten scale";
    }
}

// The reorder + quantizer of an ARC model's o and down inputs in one launch against its two ops,
// bit for bit: every activation format, ARC residuals, padded input rows, a NaN row.
TEST_F(Gpu, GatherQuantizeEqualsGatherThenQuantizeBitwise) {
  using qspec::quant::Format;
  struct Case {
    Format format;
    int64_t group;           // int4
    int64_t tail, outliers;  // augmented columns, ARC residuals among them
    bool e4m3 = false;
  };
  const std::vector<Case> cases = {{Format::int8, 0, 64, 0},     {Format::fp8, 0, 32, 0},
                                   {Format::fp8, 0, 32, 0, true}, {Format::int4, 128, 128, 128},
                                   {Format::int4, 32, 0, 0},      {Format::nvfp4, 0, 64, 32},
                                   {Format::mxfp4, 0, 256, 256}};
  for (const Case& c : cases)
    for (auto [rows, dim] : {std::tuple{1, 256}, {5, 4096}, {17, 1024}, {2, 14336}}) {
      const int64_t k = dim + c.tail, ldx = dim + 24, ldv = k + 16, ldr = k + 8;
      const int64_t scale_ld = c.format == Format::int4 ? k / c.group + 1 : 0;
      const bool f16_values = cuda::quantized_activations_use_f16(c.format) && !c.e4m3;
      const cuda::ArcResidual arc{c.outliers > 0 ? dim : 0, c.outliers};
      std::vector<float> x = random_f16_values(static_cast<size_t>(rows * ldx), 3.0f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < dim; i += 37) x[static_cast<size_t>(r * ldx + i)] *= 30.0f;  // outlier channels
      if (rows > 1) x[static_cast<size_t>(ldx + dim / 3)] = std::numeric_limits<float>::quiet_NaN();
      std::vector<int32_t> order(static_cast<size_t>(dim));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng());
      auto d_x = upload(to_f16(x));
      auto d_order = upload(order);
      const std::string what = std::string(qspec::quant::format_name(c.format)) + (c.e4m3 ? " e4m3" : "") +
                               (c.outliers ? " S" + std::to_string(c.outliers) : "") + " " + shape_name({rows, dim});
      const size_t value_bytes = static_cast<size_t>(rows * ldv) * (f16_values ? 2 : 1);
      const size_t scale_bytes = static_cast<size_t>(rows * std::max<int64_t>(1, scale_ld)) * 4;
      auto d_reordered = poisoned(static_cast<size_t>(rows * ldr) * 2);
      auto d_values_ref = poisoned(value_bytes), d_values = poisoned(value_bytes);
      auto d_scales_ref = poisoned(scale_bytes), d_scales = poisoned(scale_bytes);
      cuda::gather_columns(d_x.as<f16>(), rows, dim, ldx, d_order.as<int32_t>(), k, d_reordered.as<f16>(), ldr, nullptr);
      cuda::quantize_activations(c.format, c.group, d_reordered.as<f16>(), rows, k, ldr, d_values_ref.get(), ldv,
                                 d_scales_ref.as<float>(), scale_ld, nullptr, arc, c.e4m3);
      const cuda::QuantizedActivations q =
          cuda::gather_quantize(c.format, c.group, d_x.as<f16>(), rows, dim, ldx, d_order.as<int32_t>(), k,
                                d_values.get(), ldv, d_scales.as<float>(), scale_ld, nullptr, arc, c.e4m3);
      ASSERT_EQ(q.values, d_values.get());
      ASSERT_EQ(q.e4m3, c.e4m3);
      std::vector<uint32_t> scales;
      ASSERT_NO_FATAL_FAILURE(expect_same_quantized_rows(
          d_values, d_values_ref, d_scales, d_scales_ref, rows, k, ldv, f16_values ? 2 : 1,
          c.format == Format::int4 ? k / c.group : 1, c.format == Format::int4 ? scale_ld : 1, what, scales));
    }
  // Refused: no order, k < dim, residuals of another width, values aliasing x.
  auto d_x = upload(to_f16(random_f16_values(256)));
  std::vector<int32_t> identity(256);
  std::iota(identity.begin(), identity.end(), 0);
  auto d_order = upload(identity);
  auto d_values = poisoned(512), d_scales = poisoned(16);
  EXPECT_THROW(cuda::gather_quantize(Format::int8, 0, d_x.as<f16>(), 1, 256, 256, nullptr, 256, d_values.get(), 256,
                                     d_scales.as<float>(), 0, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::gather_quantize(Format::int8, 0, d_x.as<f16>(), 1, 256, 256, d_order.as<int32_t>(), 128,
                                     d_values.get(), 256, d_scales.as<float>(), 0, nullptr),
               qspec::Error);
  EXPECT_THROW(cuda::gather_quantize(Format::nvfp4, 0, d_x.as<f16>(), 1, 256, 256, d_order.as<int32_t>(), 256,
                                     d_values.get(), 256, d_scales.as<float>(), 0, nullptr, cuda::ArcResidual{128, 32}),
               qspec::Error);
  EXPECT_THROW(cuda::gather_quantize(Format::fp8, 0, d_x.as<f16>(), 1, 256, 256, d_order.as<int32_t>(), 256,
                                     d_x.get(), 256, d_scales.as<float>(), 0, nullptr),
               qspec::Error);
}

TEST_F(Gpu, RmsnormQuantizeEqualsTheUnfusedChainBitwise) {
  using qspec::quant::Format;
  struct Case {
    Format format;
    int64_t group;  // int4
    bool reorder;
    int64_t tail, outliers;  // augmented columns, ARC residuals among them (reorder only)
    bool e4m3 = false;       // fp8 as e4m3 codes
  };
  const std::vector<Case> cases = {
      {Format::int8, 0, false, 0, 0},    {Format::int8, 0, true, 64, 0},      {Format::fp8, 0, false, 0, 0},
      {Format::fp8, 0, true, 32, 0},     {Format::fp8, 0, false, 0, 0, true}, {Format::fp8, 0, true, 32, 0, true},
      {Format::int4, 32, false, 0, 0},   {Format::int4, 128, true, 128, 128}, {Format::nvfp4, 0, false, 0, 0},
      {Format::nvfp4, 0, true, 64, 32},  {Format::mxfp4, 0, false, 0, 0},    {Format::mxfp4, 0, true, 256, 256}};
  for (const Case& c : cases)
    for (auto [rows, dim] : {std::tuple{1, 256}, {5, 4096}, {17, 1024}, {3, 8192}}) {
      const int64_t k = dim + c.tail, ldv = k + 16, ldr = k + 8;
      const int64_t scale_ld = c.format == Format::int4 ? k / c.group + 1 : 0;
      const bool f16_values = cuda::quantized_activations_use_f16(c.format) && !c.e4m3;
      const cuda::ArcResidual arc{c.outliers > 0 ? dim : 0, c.outliers};
      std::vector<float> x = random_f16_values(static_cast<size_t>(rows * dim), 3.0f);
      for (int64_t r = 0; r < rows; ++r)  // outlier channels
        for (int64_t i = 0; i < dim; i += 41) x[static_cast<size_t>(r * dim + i)] *= 30.0f;
      const std::vector<float> delta = random_f16_values(static_cast<size_t>(rows * dim));
      std::vector<float> weight = random_f16_values(static_cast<size_t>(dim));
      for (float& w : weight) w = 1.0f + 0.25f * w;
      std::vector<int32_t> order(static_cast<size_t>(dim));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng());
      auto d_weight = upload(weight);
      auto d_delta = upload(to_f16(delta));
      auto d_order = upload(order);
      for (bool add : {false, true})
        for (bool nan_row : {false, true}) {
          std::vector<float> x_in = x;
          if (nan_row && rows > 1) x_in[static_cast<size_t>(dim + dim / 2)] = std::numeric_limits<float>::quiet_NaN();
          if (nan_row && rows == 1) continue;
          const std::string what = std::string(qspec::quant::format_name(c.format)) +
                                   (c.format == Format::int4 ? " g" + std::to_string(c.group) : "") +
                                   (c.e4m3 ? " e4m3" : "") + (c.reorder ? " reorder" : "") +
                                   (c.outliers ? " S" + std::to_string(c.outliers) : "") +
                                   (add ? " add" : "") + (nan_row ? " nan" : "") + " " + shape_name({rows, dim});
          auto d_x_ref = upload(to_f16(x_in)), d_x = upload(to_f16(x_in));
          auto d_normed = poisoned(static_cast<size_t>(rows * dim) * 2);
          auto d_reordered = poisoned(static_cast<size_t>(rows * ldr) * 2);
          const size_t value_bytes = static_cast<size_t>(rows * ldv) * (f16_values ? 2 : 1);
          const size_t scale_bytes = static_cast<size_t>(rows * std::max<int64_t>(1, scale_ld)) * 4;
          auto d_values_ref = poisoned(value_bytes), d_values = poisoned(value_bytes);
          auto d_scales_ref = poisoned(scale_bytes), d_scales = poisoned(scale_bytes);
          // The chain.
          if (add)
            cuda::add_rmsnorm(d_x_ref.as<f16>(), d_delta.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f,
                              d_normed.as<f16>(), nullptr);
          else
            cuda::rmsnorm(d_x_ref.as<f16>(), d_weight.as<float>(), rows, dim, 1e-5f, d_normed.as<f16>(), nullptr);
          const f16* chain_in = d_normed.as<f16>();
          int64_t chain_ld = dim;
          if (c.reorder) {
            cuda::gather_columns(d_normed.as<f16>(), rows, dim, dim, d_order.as<int32_t>(), k, d_reordered.as<f16>(),
                                 ldr, nullptr);
            chain_in = d_reordered.as<f16>();
            chain_ld = ldr;
          }
          cuda::quantize_activations(c.format, c.group, chain_in, rows, k, chain_ld, d_values_ref.get(), ldv,
                                     d_scales_ref.as<float>(), scale_ld, nullptr, arc, c.e4m3);
          // The fused kernel.
          const cuda::QuantizedActivations q = cuda::rmsnorm_quantize(
              c.format, c.group, d_x.as<f16>(), add ? d_delta.as<f16>() : nullptr, d_weight.as<float>(), rows, dim,
              1e-5f, c.reorder ? d_order.as<int32_t>() : nullptr, k, d_values.get(), ldv, d_scales.as<float>(),
              scale_ld, nullptr, arc, c.e4m3);
          ASSERT_EQ(q.values, d_values.get());
          ASSERT_EQ(q.format, c.format);
          ASSERT_EQ(q.e4m3, c.e4m3);
          const int64_t scale_stride = c.format == Format::int4 ? scale_ld : 1;
          std::vector<uint32_t> scales;
          ASSERT_NO_FATAL_FAILURE(expect_same_quantized_rows(d_values, d_values_ref, d_scales, d_scales_ref, rows, k, ldv,
                                                             f16_values ? 2 : 1,
                                                             c.format == Format::int4 ? k / c.group : 1, scale_stride,
                                                             what, scales));
          if (nan_row) {
            float s1;
            std::memcpy(&s1, &scales[static_cast<size_t>(scale_stride)], 4);
            EXPECT_TRUE(std::isnan(s1)) << what << ": the NaN row's scale";
          }
          ASSERT_EQ(download<f16>(d_x, static_cast<size_t>(rows * dim)),
                    download<f16>(d_x_ref, static_cast<size_t>(rows * dim)))
              << what << ": residual";
        }
    }
  // Bad calls are refused with the reason.
  auto* p = reinterpret_cast<f16*>(256);
  auto* w = reinterpret_cast<float*>(256);
  auto* values = reinterpret_cast<void*>(512);
  EXPECT_THROW(cuda::rmsnorm_quantize(Format::fp8, 0, p, nullptr, w, 1, 100, 1e-5f, nullptr, 100, values, 112, w, 0,
                                      nullptr),
               qspec::Error);  // dim not a multiple of 8
  EXPECT_THROW(cuda::rmsnorm_quantize(Format::fp8, 0, p, nullptr, w, 1, 96, 1e-5f, nullptr, 128, values, 128, w, 0,
                                      nullptr),
               qspec::Error);  // k != dim without a channel order
  EXPECT_THROW(cuda::rmsnorm_quantize(Format::nvfp4, 0, p, nullptr, w, 1, 96, 1e-5f, nullptr, 96, values, 112, w, 0,
                                      nullptr, {96, 32}),
               qspec::Error);  // ARC residuals without the order
  EXPECT_THROW(cuda::rmsnorm_quantize(Format::int8, 0, p, nullptr, w, 1, 32768, 1e-5f, nullptr, 32768, values, 32768,
                                      w, 0, nullptr),
               qspec::Error);  // a row too wide for shared memory
  EXPECT_THROW(cuda::rmsnorm_quantize(Format::int8, 0, p, nullptr, w, 1, 96, 1e-5f, nullptr, 96, p, 96, w, 0, nullptr),
               qspec::Error);  // values alias the residual
}

// Zero-point weights (int4-asym, int4-zp; issue 55) under quantized activations against the CPU:
// dispatch_w4_gemm runs the symmetric kernels on their codes, then cuda::w4_zero_point_correction
// adds the groups' constants times the activations' group sums. The CPU reference is the same
// weights (f16 scales and minimums, as the GPU keeps them) times the activations fake-quantized by
// the CPU: equal up to f32 summation order and two f16 roundings (bound 3e-3). Without a map and
// with forced strategies (each must take the correction), every activation format, odd n, k
// below a tile, m across the small-M / tiled / wgmma sizes.
TEST_F(Gpu, ZeroPointWeightsUnderQuantizedActivationsMatchCpu) {
  using qspec::quant::Format;
  struct Shape {
    int64_t n, k, weight_group, int4_group;
  };
  const std::vector<Shape> shapes = {{256, 256, 64, 64}, {33, 96, 32, 32}, {1000, 256, 64, 128}, {4097, 4096, 128, 128}};
  qspec::cuda::Blas blas;
  const qspec::gemm::PolicyMap forced_tiled = qspec::gemm::PolicyMap::forced(qspec::gemm::Strategy::tiled_128x64);
  for (const Format weight_format : {Format::int4_asym, Format::int4_zp})
    for (const Shape& s : shapes) {
      const qspec::QuantizedMatrix weight = random_zero_point_weights(s.n, s.k, s.weight_group, weight_format);
      DeviceW4 w(qspec::gemm::pack_w4a16(weight));
      ASSERT_TRUE(w.view.has_min());
      for (const ActivationCase& c :
           {ActivationCase{Format::int8, 0}, ActivationCase{Format::int4, s.int4_group}, ActivationCase{Format::fp8, 0},
            ActivationCase{Format::fp8, 0, true}, ActivationCase{Format::nvfp4, 0}, ActivationCase{Format::mxfp4, 0}}) {
        if ((c.format == Format::nvfp4 && s.k % 16 != 0) || (c.format == Format::mxfp4 && s.k % 32 != 0)) continue;
        const qspec::ActivationMode mode = c.mode();
        for (int64_t m : {1, 5, 17, 33, 130}) {
          if (s.n * s.k * m > 1e9) continue;  // CPU reference time
          const int64_t ldy = s.n + 3;
          const QuantizedRows in = quantized_rows(c, m, s.k);
          const cuda::QuantizedActivations& q = in.q;
          const std::vector<float> expected = cpu_quantized_linear(in.x, m, in.ldx, s.k, mode, weight);
          const size_t bytes = std::max({cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::small_m) * 4,
                                         cuda::w4a16_workspace_bytes(m, s.n, s.k, cuda::W4A16Path::tiled) * 4,
                                         cuda::w4_s8_wgmma_workspace_bytes(s.n, s.k),
                                         cuda::w4_zero_point_correction_workspace_bytes(m, w.view)});
          cuda::DeviceMemory workspace(bytes);
          cuda::w4a16_workspace_init(workspace.get(), bytes, nullptr);
          for (const qspec::gemm::PolicyMap* policy : {static_cast<const qspec::gemm::PolicyMap*>(nullptr), &forced_tiled}) {
            // e4m3 codes are the wgmma kernel's input only (w4_fp8_gemm_takes_e4m3); the model asks for
            // them nowhere on zero-point weights, so only the correction's decode of them is tested.
            if (c.e4m3 && policy != nullptr) continue;
            const std::string what = std::string(qspec::quant::format_name(weight_format)) + " " + c.name() +
                                     (policy ? " forced tiled" : " automatic") + " m" + std::to_string(m) + " n" +
                                     std::to_string(s.n) + " k" + std::to_string(s.k) + " g" +
                                     std::to_string(s.weight_group);
            auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
            if (c.e4m3) {
              // The symmetric part on the same codes as f16 values, then the correction on e4m3 codes.
              auto d_f16 = poisoned(static_cast<size_t>(m * in.ldv) * 2);
              const cuda::QuantizedActivations as_values = cuda::quantize_activations(
                  c.format, c.group, in.d_x.as<f16>(), m, s.k, in.ldx, d_f16.get(), in.ldv, in.scales.as<float>(),
                  in.scale_ld, nullptr, {}, false);
              cuda::W4A16Weights symmetric = w.view;
              symmetric.mins = nullptr;
              symmetric.zero_codes = false;
              cuda::w4_quantized_gemm(as_values, m, symmetric, d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr);
              cuda::w4_zero_point_correction(q, m, w.view, d_y.as<f16>(), ldy, nullptr);
            } else {
              qspec::dispatch_w4_gemm(policy, blas, qspec::W4GemmInput{nullptr, 0, &q}, m, w.view, d_y.as<f16>(), ldy,
                                      workspace.get(), bytes, nullptr);
            }
            ASSERT_NO_FATAL_FAILURE(
                expect_gemm_rows(download<f16>(d_y, static_cast<size_t>(m * ldy)), expected, m, s.n, ldy, what, 3e-3));
          }
          // The group sums made in each block or once by a kernel of their own (cuda::ZeroPointSums):
          // the symmetric GEMM on the codes (as f16 values for e4m3), then each correction; within
          // the bound of the CPU, and at 1-8 tokens (the same kernel, the same sums) bit for bit alike.
          const std::string what = std::string(qspec::quant::format_name(weight_format)) + " " + c.name() + " m" +
                                   std::to_string(m) + " n" + std::to_string(s.n) + " k" + std::to_string(s.k);
          std::vector<f16> corrected[2];
          for (const cuda::ZeroPointSums sums : {cuda::ZeroPointSums::in_block, cuda::ZeroPointSums::global}) {
            const bool global = sums == cuda::ZeroPointSums::global;
            auto d_y = poisoned(static_cast<size_t>(m * ldy) * 2);
            auto d_f16 = poisoned(static_cast<size_t>(m * in.ldv) * 2);
            const cuda::QuantizedActivations as_values =
                c.e4m3 ? cuda::quantize_activations(c.format, c.group, in.d_x.as<f16>(), m, s.k, in.ldx, d_f16.get(),
                                                    in.ldv, in.scales.as<float>(), in.scale_ld, nullptr, {}, false)
                       : q;
            cuda::W4A16Weights symmetric = w.view;
            symmetric.mins = nullptr;
            symmetric.zero_codes = false;
            qspec::dispatch_w4_gemm(nullptr, blas, qspec::W4GemmInput{nullptr, 0, &as_values}, m, symmetric,
                                    d_y.as<f16>(), ldy, workspace.get(), bytes, nullptr);
            cuda::w4_zero_point_correction(q, m, w.view, d_y.as<f16>(), ldy, nullptr, workspace.get(), bytes, sums);
            corrected[global] = download<f16>(d_y, static_cast<size_t>(m * ldy));
            ASSERT_NO_FATAL_FAILURE(expect_gemm_rows(corrected[global], expected, m, s.n, ldy,
                                                     what + (global ? " sums once" : " sums in blocks"), 3e-3));
          }
          if (m <= 8) {
            for (int64_t t = 0; t < m; ++t) {
              for (int64_t i = 0; i < s.n; ++i) {
                ASSERT_EQ(corrected[0][t * ldy + i], corrected[1][t * ldy + i]) << what << " t" << t << " i" << i;
              }
            }
          }
        }
      }
    }
  // Bad input: weights without zero points, int4 activation groups narrower than the weights'.
  const qspec::QuantizedMatrix int4_weight = random_quantized(64, 128, Format::int4, 64);
  DeviceW4 int4_w(qspec::gemm::pack_w4a16(int4_weight));
  DeviceW4 zp_w(qspec::gemm::pack_w4a16(random_zero_point_weights(64, 128, 64)));
  auto d_codes = poisoned(static_cast<size_t>(128));
  auto d_scales = poisoned(static_cast<size_t>(4 * 4));
  auto d_y = poisoned(static_cast<size_t>(64 * 2));
  cuda::QuantizedActivations int8_x;
  int8_x.format = Format::int8;
  int8_x.values = d_codes.get();
  int8_x.ldx = 128;
  int8_x.scales = d_scales.as<float>();
  EXPECT_THROW(cuda::w4_zero_point_correction(int8_x, 1, int4_w.view, d_y.as<f16>(), 64, nullptr), qspec::Error);
  cuda::QuantizedActivations int4_x = int8_x;
  int4_x.format = Format::int4;
  int4_x.group = 32;
  int4_x.scale_ld = 4;
  EXPECT_THROW(cuda::w4_zero_point_correction(int4_x, 1, zp_w.view, d_y.as<f16>(), 64, nullptr), qspec::Error);
}
