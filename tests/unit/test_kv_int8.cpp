// The 8-bit KV cache (`--kv-cache int8`, issue 50 diet 2): ops/kv_int8.h's number rules against
// base/dtype's f16 conversion, the CPU layout of its rows (ops/kv8_rows.h), the int8 attention
// against f32 attention over the dequantized rows (both views), the pools' byte accounting, the
// `/k4` spelling and the errors of a `/k4` draft or an int8 cache where there is none.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "cli_run.h"
#include "model/kv_storage.h"
#include "model/llama.h"
#include "ops/attention.h"
#include "ops/kv8_rows.h"
#include "ops/quantized_linear.h"
#include "qspec/decode_plan.h"
#include "qspec/engine.h"
#include "runtime/draft_mode.h"
#include "runtime/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/qspec_costs.h"

namespace {

using qspec::KvCacheFormat;
using qspec::KvView;
namespace kv8 = qspec::kv8;
namespace cpu = qspec::cpu;

const std::string kModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

std::vector<float> random_values(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// One layer's int8 rows in vectors, as KvStorage holds them.
struct Planes {
  std::vector<uint8_t> high, low;
  std::vector<uint16_t> scales;
  Planes(int64_t rows, int64_t heads, int64_t head_dim)
      : high(static_cast<size_t>(rows * heads * head_dim / 2), 0xAB),
        low(high.size(), 0xCD),
        scales(static_cast<size_t>(rows * heads), 0x7777) {}
  cpu::Kv8Rows rows() { return cpu::Kv8Rows{high.data(), low.data(), scales.data()}; }
};

}  // namespace

// The scale's f16 rounding is the conversion every f16 store does (base/dtype's f32_to_f16, round
// to nearest even): normal values, ties, subnormals, values that underflow, and zero.
TEST(KvInt8, RoundToF16IsTheF16ConversionOfPositiveValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-30.0f, 15.0f), mantissa(1.0f, 2.0f);
  std::vector<float> values = {0.0f, 1.0f, 65504.0f, 6.1035156e-05f /* 2^-14 */, 5.9604645e-08f /* 2^-24 */,
                               2.9802322e-08f /* 2^-25, a tie to 0 */, 4.4703484e-08f, 1.0f + 1.0f / 2048,
                               1.0f + 3.0f / 2048 /* ties to even, both ways */};
  for (int i = 0; i < 200000; ++i) values.push_back(std::ldexp(mantissa(rng), static_cast<int>(exponent(rng))));
  for (int i = 0; i < 2048; ++i) values.push_back(std::ldexp(1.0f + static_cast<float>(i) / 2048, -20));  // subnormal grid
  for (float x : values) {
    const float want = qspec::f16_to_f32(qspec::f32_to_f16(x));
    ASSERT_EQ(kv8::round_to_f16(x), want) << x;
  }
  EXPECT_EQ(kv8::round_to_f16(-1.0f), 0.0f);  // scales are never negative: the rule says 0
}

// A row's scale is its largest |x| / 127 rounded to f16; codes are rint(x / scale) (to even),
// clamped to +-127 (the f16 rounding can put amax / scale just past 127); a row of zeros has
// scale 0 and codes 0; the full view reads code * scale, the high-nibble view the middle of the
// code's 16-code bucket, (16 (code >> 4) + 8) * scale.
TEST(KvInt8, EncodeDecodeRules) {
  EXPECT_EQ(kv8::row_scale_f32(127.0f), 1.0f);
  EXPECT_EQ(kv8::row_scale_f32(0.0f), 0.0f);
  EXPECT_EQ(kv8::encode(5.0f, 0.0f), 0);
  EXPECT_EQ(kv8::encode(2.5f, 1.0f), 2);    // a tie to even
  EXPECT_EQ(kv8::encode(3.5f, 1.0f), 4);
  EXPECT_EQ(kv8::encode(-2.5f, 1.0f), -2);
  EXPECT_EQ(kv8::encode(1000.0f, 1.0f), 127);  // clamped
  EXPECT_EQ(kv8::encode(-1000.0f, 1.0f), -127);
  // Normal scales keep amax / scale within 127 (1 + 2^-11); subnormal ones (tiny rows) round
  // coarsely, down to amax / scale > 127.5: clamped to 127, never wrapped.
  bool saw_clamp = false;
  for (int exponent = -32; exponent <= 4; ++exponent)
    for (float m = 1.0f; m < 2.0f; m += 1.0f / 256) {
      const float amax = std::ldexp(m, exponent);
      const float scale = kv8::row_scale_f32(amax);
      if (scale == 0.0f) continue;  // below f16's range: the row reads back as zeros
      ASSERT_GE(kv8::encode(amax, scale), 64) << amax;
      ASSERT_LE(kv8::encode(amax, scale), 127) << amax;
      ASSERT_EQ(kv8::encode(-amax, scale), -kv8::encode(amax, scale)) << amax;
      saw_clamp = saw_clamp || amax / scale > 127.5f;
    }
  EXPECT_TRUE(saw_clamp) << "no amax exercised the clamp";
  for (int code = -127; code <= 127; ++code) {
    const auto c = static_cast<int8_t>(code);
    ASSERT_EQ(kv8::decode(c, 0.5f), static_cast<float>(code) * 0.5f);
    const int high = kv8::high_nibble(c), low = kv8::low_nibble(c);
    ASSERT_GE(high, -8);
    ASSERT_LE(high, 7);
    ASSERT_EQ(kv8::join_nibbles(high, low), c);
    ASSERT_EQ(kv8::decode_high(c, 0.5f), static_cast<float>(16 * (code >> 4) + 8) * 0.5f);
    // The high view is never further than half a bucket (8 codes) from the code.
    ASSERT_LE(std::fabs(kv8::decode_high(c, 1.0f) - kv8::decode(c, 1.0f)), 8.0f);
  }
}

// The CPU layout: every element's stored code and every row's scale are kv8's, whatever the head
// size (the SIMD read takes 32-element heads and up, the scalar loop the rest), and reading a head
// in either view gives kv8::decode / decode_high of each code; a row of zeros reads back zeros.
TEST(KvInt8, RowsHoldKv8CodesAndReadBackInBothViews) {
  std::mt19937 rng(11);
  for (int64_t head_dim : {2, 8, 30, 32, 64, 96, 128, 256}) {
    const int64_t heads = 3, rows = 5;
    Planes planes(rows, heads, head_dim);
    const cpu::Kv8Rows kv = planes.rows();
    std::vector<std::vector<float>> x;
    for (int64_t r = 0; r < rows; ++r) {
      x.push_back(random_values(static_cast<size_t>(heads * head_dim), rng, r == 1 ? 50.0f : 1.0f));
      if (r == 3) std::fill(x.back().begin() + head_dim, x.back().begin() + 2 * head_dim, 0.0f);  // one zero head
      if (r == 4) x.back()[0] = 1e6f;  // an outlier: the rest of its head rounds to small codes
      cpu::kv8_write_row(kv, r, x.back().data(), heads, head_dim);
    }
    std::vector<float> full(static_cast<size_t>(head_dim)), high(full.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const float* in = x[static_cast<size_t>(r)].data() + h * head_dim;
        float amax = 0;
        for (int64_t e = 0; e < head_dim; ++e) amax = std::max(amax, std::fabs(in[e]));
        const float scale = kv8::row_scale_f32(amax);
        ASSERT_EQ(cpu::kv8_scale(kv, r, h, heads), scale);
        cpu::kv8_read_head(kv, r, h, heads, head_dim, KvView::full, full.data());
        cpu::kv8_read_head(kv, r, h, heads, head_dim, KvView::high_nibble, high.data());
        for (int64_t e = 0; e < head_dim; ++e) {
          const int8_t code = kv8::encode(in[e], scale);
          ASSERT_EQ(cpu::kv8_code(kv, r, h, e, heads, head_dim), code) << head_dim << " " << r << " " << h << " " << e;
          ASSERT_EQ(full[e], kv8::decode(code, scale)) << head_dim << " " << e;
          ASSERT_EQ(high[e], kv8::decode_high(code, scale)) << head_dim << " " << e;
          if (r == 3 && h == 1) {
            ASSERT_EQ(full[e], 0.0f);
            ASSERT_EQ(high[e], 0.0f);
          }
        }
      }
    // The high view reads the high plane and the scales only: a changed low plane does not move it.
    std::vector<float> before(static_cast<size_t>(rows * heads * head_dim)), after(before.size());
    cpu::kv8_dequantize_rows(kv, 0, rows, heads, head_dim, KvView::high_nibble, before.data());
    for (uint8_t& b : planes.low) b = static_cast<uint8_t>(~b);
    cpu::kv8_dequantize_rows(kv, 0, rows, heads, head_dim, KvView::high_nibble, after.data());
    ASSERT_EQ(before, after) << head_dim;
  }
}

// The int8 attention equals f32 attention over kv8_dequantize_rows of its rows, bit for bit, in
// both views: GQA, paged scattered blocks, whole histories, sliding windows with and without
// sinks, several tokens, and both the SIMD and the portable loops.
TEST(KvInt8, AttentionEqualsF32AttentionOverTheDequantizedRows) {
  const cpu::KernelIsa saved = cpu::kernel_isa();
  std::mt19937 rng(5);
  struct Case {
    int64_t heads, kv_heads, head_dim, window, sinks;
  };
  for (const Case& c : {Case{6, 2, 64, 0, 0}, Case{6, 2, 64, 40, 4}, Case{4, 4, 32, 16, 0}, Case{9, 3, 64, 0, 0},
                        Case{8, 1, 128, 50, 16}, Case{2, 1, 8, 0, 0}, Case{4, 2, 48, 7, 3}})
    for (bool portable : {false, true})
      for (KvView view : {KvView::full, KvView::high_nibble}) {
        cpu::set_kernel_isa(portable ? cpu::KernelIsa::portable : saved);
        cpu::AttentionShape shape{c.heads, c.kv_heads, c.head_dim, c.window};
        shape.sink_tokens = c.sinks;
        const int64_t history = 150, tokens = 4, block = 16, blocks = (history + block - 1) / block;
        const int64_t kv_dim = c.kv_heads * c.head_dim, q_dim = c.heads * c.head_dim;
        // Logical block b in pool block table[b]: reversed and interleaved, with spare blocks.
        std::vector<int32_t> table;
        for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>(2 * (blocks - 1 - b) + 1));
        const int64_t pool_rows = (2 * blocks + 1) * block;
        qspec::KvStorage storage(1, pool_rows, c.kv_heads, c.head_dim, KvCacheFormat::int8);
        const qspec::KvBlocks blocks8 = storage.blocks(table.data(), block);
        for (int64_t p = 0; p < history; ++p) {
          const std::vector<float> k = random_values(static_cast<size_t>(kv_dim), rng, 2.0f);
          const std::vector<float> v = random_values(static_cast<size_t>(kv_dim), rng);
          cpu::kv8_write_row(blocks8.keys8[0], blocks8.row(p), k.data(), c.kv_heads, c.head_dim);
          cpu::kv8_write_row(blocks8.values8[0], blocks8.row(p), v.data(), c.kv_heads, c.head_dim);
        }
        // The twin: every pool row dequantized in the view, attended by the f32 path.
        std::vector<float> keys(static_cast<size_t>(pool_rows * kv_dim)), values(keys.size());
        cpu::kv8_dequantize_rows(blocks8.keys8[0], 0, pool_rows, c.kv_heads, c.head_dim, view, keys.data());
        cpu::kv8_dequantize_rows(blocks8.values8[0], 0, pool_rows, c.kv_heads, c.head_dim, view, values.data());
        const std::vector<float> q = random_values(static_cast<size_t>(tokens * q_dim), rng);
        const std::vector<int32_t> positions = {3, 64, 100, static_cast<int32_t>(history - 1)};
        std::vector<float> want(static_cast<size_t>(tokens * q_dim), NAN), got(want.size(), NAN);
        cpu::PagedKv f32;
        f32.keys = keys.data();
        f32.values = values.data();
        f32.block_table = table.data();
        f32.block_size = block;
        cpu::attention(q.data(), tokens, positions.data(), f32, shape, want.data());
        cpu::PagedKv int8;
        int8.block_table = table.data();
        int8.block_size = block;
        int8.format = KvCacheFormat::int8;
        int8.keys8 = blocks8.keys8[0];
        int8.values8 = blocks8.values8[0];
        int8.view = view;
        cpu::attention(q.data(), tokens, positions.data(), int8, shape, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << "heads " << c.heads << "/" << c.kv_heads << " dim " << c.head_dim << " window " << c.window << "+"
            << c.sinks << (portable ? " portable" : " simd") << (view == KvView::full ? " full" : " high");
        // The views differ (the high one is the coarser cache).
        if (view == KvView::high_nibble) {
          std::vector<float> full(want.size());
          int8.view = KvView::full;
          cpu::attention(q.data(), tokens, positions.data(), int8, shape, full.data());
          EXPECT_NE(std::memcmp(full.data(), got.data(), got.size() * sizeof(float)), 0);
        }
      }
  cpu::set_kernel_isa(saved);
}

// An int8 cache holds a position in 2 (kv_dim + 2 heads) bytes a layer against the f32 rows'
// 8 kv_dim: the pool's bytes say so, and the engine's automatic pool under one memory budget
// holds that many times the blocks.
TEST(KvInt8, PoolBytesAndBlocksReflectTheSmallerRows) {
  const int64_t layers = 30, heads = 3, head_dim = 64, blocks = 10, block = 16;  // SmolLM2-135M's K/V
  qspec::KvBlockPool f16(layers, heads, head_dim, KvCacheFormat::f16, blocks, block);
  qspec::KvBlockPool int8(layers, heads, head_dim, KvCacheFormat::int8, blocks, block);
  EXPECT_EQ(f16.bytes(), static_cast<size_t>(layers * blocks * block) * 2 * heads * head_dim * sizeof(float));
  EXPECT_EQ(int8.bytes(), static_cast<size_t>(layers * blocks * block) * 2 * (heads * head_dim + heads * 2));
  EXPECT_EQ(int8.bytes(), qspec::KvBlockPool::block_bytes(layers, heads, head_dim, block, KvCacheFormat::int8) * blocks);
  const double ratio = static_cast<double>(f16.bytes()) / static_cast<double>(int8.bytes());
  EXPECT_NEAR(ratio, 3.88, 0.01);
  EXPECT_EQ(int8.key_pools(), nullptr);  // no f32 rows
  EXPECT_EQ(int8.format(), KvCacheFormat::int8);
  // The contiguous cache counts alike.
  EXPECT_EQ(qspec::KvStorage(layers, 100, heads, head_dim, KvCacheFormat::int8).bytes(),
            static_cast<size_t>(layers * 100) * qspec::KvStorage::position_bytes(heads, head_dim, KvCacheFormat::int8));
  EXPECT_EQ(qspec::KvStorage(layers, 100, heads, head_dim, KvCacheFormat::int8, false).bytes(), 0u);
  EXPECT_THROW(qspec::KvStorage(1, 4, 2, 7, KvCacheFormat::int8), qspec::Error);  // odd head_dim

  auto model = qspec::LlamaModel::load(kModel);
  qspec::EngineOptions options;
  options.max_batch_size = 64;        // more than the budget holds: the cap binds
  options.kv_memory_bytes = 4 << 20;  // 4 MiB
  const qspec::Engine plain(*model, nullptr, options);
  options.kv_cache = "int8";
  const qspec::Engine quantized(*model, nullptr, options);
  const auto& c = model->config();
  const int64_t f16_blocks = plain.metrics().kv_blocks_total, int8_blocks = quantized.metrics().kv_blocks_total;
  EXPECT_EQ(static_cast<size_t>(f16_blocks),
            options.kv_memory_bytes / qspec::KvBlockPool::block_bytes(c.num_layers, c.num_kv_heads, c.head_dim, 16,
                                                                       KvCacheFormat::f16));
  EXPECT_EQ(static_cast<size_t>(int8_blocks),
            options.kv_memory_bytes / qspec::KvBlockPool::block_bytes(c.num_layers, c.num_kv_heads, c.head_dim, 16,
                                                                       KvCacheFormat::int8));
  EXPECT_GT(static_cast<double>(int8_blocks), 3.5 * static_cast<double>(f16_blocks));
  EXPECT_LE(quantized.metrics().kv_cache_bytes, options.kv_memory_bytes);
  EXPECT_GT(quantized.metrics().kv_cache_bytes, options.kv_memory_bytes * 9 / 10);
}

// The one row of the no-overwrite ablation: saved and restored in the cache's own bytes.
TEST(KvInt8, RowBytesSaveAndRestore) {
  std::mt19937 rng(3);
  for (KvCacheFormat format : {KvCacheFormat::f16, KvCacheFormat::int8}) {
    qspec::KvStorage storage(2, 8, 2, 16, format);
    static const int32_t kTable[1] = {0};
    const qspec::KvBlocks kv = storage.blocks(kTable, 8);
    std::vector<float> dequantized_before(64), dequantized_after(64);
    for (int64_t row : {2, 5}) {
      const std::vector<float> k = random_values(32, rng), v = random_values(32, rng);
      if (format == KvCacheFormat::int8) {
        cpu::kv8_write_row(kv.keys8[1], row, k.data(), 2, 16);
        cpu::kv8_write_row(kv.values8[1], row, v.data(), 2, 16);
      } else {
        std::copy(k.begin(), k.end(), kv.keys[1] + row * 32);
        std::copy(v.begin(), v.end(), kv.values[1] + row * 32);
      }
    }
    std::vector<uint8_t> saved;
    qspec::save_kv_row(kv, 1, 2, 2, 16, saved);
    ASSERT_EQ(saved.size(), qspec::KvStorage::position_bytes(2, 16, format));
    std::vector<uint8_t> other;
    qspec::save_kv_row(kv, 1, 5, 2, 16, other);
    qspec::restore_kv_row(kv, 1, 5, 2, 16, saved.data());  // row 5 := row 2
    std::vector<uint8_t> now;
    qspec::save_kv_row(kv, 1, 5, 2, 16, now);
    EXPECT_EQ(now, saved);
    EXPECT_NE(other, saved);
  }
}

// `/k4` is the last suffix of a draft spec, round-trips through draft_spec, composes with the
// others, and is refused where it means nothing (draft auto, n-gram drafts) or misplaced.
TEST(KvInt8, Kv4DraftSpecAndRules) {
  qspec::DecodePlan plan;
  plan.mode = "qspec";
  qspec::set_draft_spec(plan, "w4a8/k4");
  EXPECT_EQ(plan.draft, "w4a8");
  EXPECT_TRUE(plan.draft_kv4);
  EXPECT_TRUE(plan.draft_has_diet());
  EXPECT_EQ(qspec::draft_spec(plan), "w4a8/k4");
  qspec::set_draft_spec(plan, "w4a16@256+16/v4096/s2/k4");
  EXPECT_EQ(plan.draft, "w4a16");
  EXPECT_EQ(plan.draft_window, 256);
  EXPECT_EQ(plan.draft_vocab, 4096);
  EXPECT_EQ(plan.draft_skip, 2);
  EXPECT_TRUE(plan.draft_kv4);
  EXPECT_EQ(qspec::draft_spec(plan), "w4a16@256+16/v4096/s2/k4");
  qspec::set_draft_spec(plan, "w4a8");
  EXPECT_FALSE(plan.draft_kv4);
  EXPECT_NO_THROW(qspec::validate(plan));
  for (const char* bad : {"w4a8/k4/s2", "w4a8/k5", "w4a8/k4/k4", "w4a8/k"})
    EXPECT_THROW(qspec::set_draft_spec(plan, bad), qspec::DecodePlanError) << bad;
  // The verify's own mode is a draft with the 4-bit view as its only diet.
  qspec::set_draft_spec(plan, "w4a16/k4");
  EXPECT_NO_THROW(qspec::validate(plan));
  EXPECT_TRUE(qspec::with_draft_diets(qspec::parse_run_mode("w4a16"), plan).kv_high_nibble);
  EXPECT_EQ(qspec::with_draft_diets(qspec::parse_run_mode("w4a16"), plan).key(), "w4a16/k4");
  for (const char* draft : {"auto", "ngram"}) {
    qspec::DecodePlan p;
    p.mode = "qspec";
    p.draft = draft;
    p.draft_kv4 = true;
    try {
      qspec::validate(p);
      ADD_FAILURE() << draft << " with draft_kv4 was accepted";
    } catch (const qspec::DecodePlanError& e) {
      EXPECT_EQ(e.field, "draft_kv4") << e.what();
    }
  }
  qspec::RunMode high = qspec::parse_run_mode("w4a8");
  high.kv_high_nibble = true;
  EXPECT_NO_THROW(qspec::check_draft_kv_cache(high, KvCacheFormat::int8));
  EXPECT_NE(qspec_test::error_of([&] { qspec::check_draft_kv_cache(high, KvCacheFormat::f16); }).find("--kv-cache int8"),
            std::string::npos);
}

// A step-cost table may name a `/k4` draft: the planner of an int8 engine takes it as a candidate
// (from a table measured on an int8 cache; one measured on f16 is refused), an f16 engine's skips
// it, saying why (the other drafts still plan).
TEST(KvInt8, PlannerTablesNameKv4DraftsAndOnlyInt8EnginesUseThem) {
  auto model = qspec::LlamaModel::load(kModel);
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::QSpecCostTable table;
  table.device = qspec::cpu_device_name();
  table.model = "gsm-synth-llama";
  table.shape = qspec::ModelShape::of(model->config());
  for (int64_t batch : {1, 8}) {
    qspec::StepCostPoint p;
    p.batch = batch;
    p.context = 128;
    p.w4a16_step_ms = 1.0;
    p.verify_ms = {{1, 1.1}, {2, 1.2}};
    p.draft_step_ms = {{"w4a8", 0.5}, {"w4a8/k4", 0.4}};
    table.points.push_back(p);
  }
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("qspec-kv4-costs-" + std::to_string(::getpid()) + ".json")).string();
  table.save(file);
  qspec::EngineOptions options;
  options.qspec_costs = file;
  const qspec::Engine f16(*model, nullptr, options);
  // An int8 engine plans with a table measured on an int8 cache only (QSpecCostTable::kv_cache).
  options.kv_cache = "int8";
  const std::string mismatch = qspec_test::error_of([&] { qspec::Engine engine(*model, nullptr, options); });
  EXPECT_NE(mismatch.find("measured on an f16 KV cache"), std::string::npos) << mismatch;
  table.kv_cache = KvCacheFormat::int8;
  table.save(file);
  const qspec::Engine int8(*model, nullptr, options);
  std::filesystem::remove(file);
  EXPECT_NE(f16.qspec_planner().find("skipped w4a8/k4"), std::string::npos) << f16.qspec_planner();
  EXPECT_NE(f16.qspec_planner().find("--kv-cache int8"), std::string::npos) << f16.qspec_planner();
  EXPECT_EQ(int8.qspec_planner().find("skipped"), std::string::npos) << int8.qspec_planner();
  EXPECT_NE(int8.qspec_planner().find("w4a8/k4"), std::string::npos) << int8.qspec_planner();
}

// Bad input is an error before any request runs: an unknown --kv-cache, a /k4 draft on an f16
// cache at submit, and a forward pass in the high view over f32 rows. (The GPU backend has the
// int8 cache too: tests/gpu, GpuEngineDrafts' int8 cases.)
TEST(KvInt8, BadInputIsAClearError) {
  auto model = qspec::LlamaModel::load(kModel);
  model->quantize_weights(qspec::quant::Format::int4);
  qspec::EngineOptions options;
  options.kv_cache = "int4";
  EXPECT_NE(qspec_test::error_of([&] { qspec::Engine engine(*model, nullptr, options); }).find("kv_cache"),
            std::string::npos);

  options = {};
  qspec::Engine engine(*model, nullptr, options);
  qspec::Request request;
  request.prompt = {1, 2, 3};
  request.plan.mode = "qspec";
  qspec::set_draft_spec(request.plan, "w4a8/k4");
  const std::string refused = qspec_test::error_of([&] { engine.submit(request, [](const qspec::TokenEvent&) {}); });
  EXPECT_NE(refused.find("draft_kv4"), std::string::npos) << refused;
  EXPECT_NE(refused.find("--kv-cache int8"), std::string::npos) << refused;
  EXPECT_EQ(engine.metrics().requests_submitted, 0);

  qspec::KvCache cache = model->new_cache(8);
  qspec::RunMode high = qspec::parse_run_mode("w4a16");
  high.activations.group_size = model->auto_group_size();
  high.kv_high_nibble = true;
  std::vector<float> logits;
  const std::vector<int32_t> tokens = {1, 2};
  EXPECT_NE(qspec_test::error_of([&] { model->forward(tokens, cache, logits, false, high); }).find("--kv-cache int8"),
            std::string::npos);
  // On an int8 cache the same pass runs.
  qspec::KvCache int8 = model->new_cache(8, KvCacheFormat::int8);
  EXPECT_NO_THROW(model->forward(tokens, int8, logits, false, high));
  EXPECT_THROW(int8.keys(0), qspec::Error);  // no f32 rows to hand out
}

// The command line: --kv-cache takes f16 or int8 only, and a /k4 draft (--draft-kv4, or in eval
// qspec's --drafts) on an f16 cache fails before the model runs, naming what to change.
TEST(KvInt8, CommandLineErrors) {
  int code = 0;
  std::string out = qspec_test::run_qspec("generate '" + kModel + "' -p hi -n 2 --kv-cache int4", code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--kv-cache"), std::string::npos) << out;
  out = qspec_test::run_qspec("generate '" + kModel + "' -p hi -n 2 --mode qspec --draft w4a8 --draft-kv4", code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--kv-cache int8"), std::string::npos) << out;
  out = qspec_test::run_qspec("eval qspec '" + kModel + "' --drafts w4a8/k4 --gammas 2 --limit 1", code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--drafts w4a8/k4"), std::string::npos) << out;
  out = qspec_test::run_qspec("eval ppl '" + kModel + "' --kv-cache fp8 --max-windows 1", code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("f16 or int8"), std::string::npos) << out;
  // And the same flags run on an int8 cache.
  out = qspec_test::run_qspec(
      "generate '" + kModel + "' -p 'Question: 2 + 3?' -n 8 --mode qspec --draft w4a8 --draft-kv4 --kv-cache int8", code);
  EXPECT_EQ(code, 0) << out;
}
