// ADAngel's policy map (gemm/policy_map.h): lookups, the rule-based default, JSON round trip,
// and clear errors for bad maps. The GPU side (tuner, dispatcher) is in tests/gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>
#include <sstream>

#include "gemm/policy_map.h"
#include "qspec/error.h"

using qspec::gemm::PolicyMap;
using qspec::gemm::PolicyRange;
using qspec::gemm::Strategy;

TEST(PolicyMap, LooksUpRangesAndFallsBackToTheRule) {
  PolicyMap map;
  map.set("f16", 6144, 4096, 128,
          {{4, Strategy::small_m_v2}, {48, Strategy::tiled_256x32}, {300, Strategy::tiled_256x64},
           {301, Strategy::dequant_cublas}});
  EXPECT_EQ(map.lookup("f16", 6144, 4096, 1), Strategy::small_m_v2);
  EXPECT_EQ(map.lookup("f16", 6144, 4096, 4), Strategy::small_m_v2);
  EXPECT_EQ(map.lookup("f16", 6144, 4096, 5), Strategy::tiled_256x32);
  EXPECT_EQ(map.lookup("f16", 6144, 4096, 300), Strategy::tiled_256x64);
  EXPECT_EQ(map.lookup("f16", 6144, 4096, 301), Strategy::dequant_cublas);
  EXPECT_EQ(map.lookup("f16", 6144, 4096, 4096), Strategy::dequant_cublas);
  EXPECT_EQ(map.lookup("f16", 6144, 4096, 100000), Strategy::dequant_cublas);  // past the dense table
  // Shapes and activations the map lacks take the documented rule.
  EXPECT_FALSE(map.contains("int8", 6144, 4096));
  for (int64_t m : {1, 8, 9, 32, 33, 128, 129, 5000}) {
    EXPECT_EQ(map.lookup("int8", 6144, 4096, m), qspec::gemm::rule_based_strategy("int8", m)) << m;
    EXPECT_EQ(map.lookup("f16", 4096, 4096, m), qspec::gemm::rule_based_strategy("f16", m)) << m;
  }
  EXPECT_EQ(qspec::gemm::rule_based_strategy("f16", 8), Strategy::small_m_v5);   // the preload kernel
  EXPECT_EQ(qspec::gemm::rule_based_strategy("nvfp4", 8), Strategy::small_m_v1);  // v5 is f16 only
  EXPECT_EQ(qspec::gemm::parse_strategy("small_m_v5"), Strategy::small_m_v5);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("f16", 17), Strategy::tiled_128x32);  // two blocks a multiprocessor
  EXPECT_EQ(qspec::gemm::rule_based_strategy("f16", 33), Strategy::tiled_128x64);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("int8", 17), Strategy::tiled_256x32);  // measured for f16 only
  EXPECT_EQ(qspec::gemm::parse_strategy("tiled_128x32"), Strategy::tiled_128x32);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("f16", 129), Strategy::dequant_cublas);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("int8", 511), Strategy::tiled_128x64);  // no cuBLAS path for int8
  EXPECT_EQ(qspec::gemm::rule_based_strategy("int8", 512), Strategy::s8_wgmma_128x128);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("int8", 4096), Strategy::s8_wgmma_128x128);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("fp8", 1024), Strategy::s8_wgmma_128x128);
  EXPECT_NE(qspec::gemm::rule_based_strategy("fp8", 256), Strategy::s8_wgmma_128x128);
  EXPECT_NE(qspec::gemm::rule_based_strategy("nvfp4", 1024), Strategy::s8_wgmma_128x128);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("int4", 4096), Strategy::tiled_128x64);
}

TEST(PolicyMap, RoundTripsThroughJson) {
  PolicyMap map;
  map.gpu = "NVIDIA H100 80GB HBM3";
  map.commit = "abc";
  map.set("f16", 128256, 4096, 128, {{16, Strategy::small_m_v1}, {64, Strategy::tiled_128x128}});
  map.set("int4", 4096, 14336, 128, {{1, Strategy::small_m_v2}, {2, Strategy::tiled_128x64}});
  const PolicyMap back = PolicyMap::from_json(map.to_json(), "test");
  EXPECT_EQ(back.gpu, map.gpu);
  EXPECT_EQ(back.shapes(), 2u);
  for (int64_t m = 1; m <= 200; ++m) {
    EXPECT_EQ(back.lookup("f16", 128256, 4096, m), map.lookup("f16", 128256, 4096, m)) << m;
    EXPECT_EQ(back.lookup("int4", 4096, 14336, m), map.lookup("int4", 4096, 14336, m)) << m;
  }
  for (int i = 0; i < qspec::gemm::kStrategies; ++i) {
    const auto s = static_cast<Strategy>(i);
    EXPECT_EQ(qspec::gemm::parse_strategy(qspec::gemm::strategy_name(s)), s);
  }
}

TEST(PolicyMap, RejectsBadMapsWithTheFieldAtFault) {
  auto message = [](const std::string& text) {
    try {
      PolicyMap::from_json(text, "map.json");
    } catch (const qspec::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
  EXPECT_NE(message("{\"format\": \"other\"}").find("not a qspec GEMM policy"), std::string::npos);
  const std::string head = "{\"format\": \"qspec-gemm-policy\", \"version\": 1, \"entries\": [";
  EXPECT_NE(message(head + "{\"activations\": \"f16\", \"n\": 8, \"k\": 8, \"group\": 8, \"ranges\": "
                           "[{\"max_m\": 4, \"strategy\": \"warp_magic\"}]}]}")
                .find("entries[0]: unknown GEMM strategy 'warp_magic'"),
            std::string::npos);
  EXPECT_NE(message(head + "{\"activations\": \"int8\", \"n\": 8, \"k\": 8, \"group\": 8, \"ranges\": "
                           "[{\"max_m\": 4, \"strategy\": \"dequant_cublas\"}]}]}")
                .find("does not run int8"),
            std::string::npos);
  EXPECT_NE(message(head + "{\"activations\": \"f16\", \"n\": 8, \"k\": 8, \"group\": 8, \"ranges\": "
                           "[{\"max_m\": 4, \"strategy\": \"small_m_v1\"}, {\"max_m\": 4, \"strategy\": \"small_m_v2\"}]}]}")
                .find("must increase"),
            std::string::npos);
  EXPECT_NE(message(head + "{\"activations\": \"f16\", \"n\": 8}]}").find("entries[0]"), std::string::npos);
  EXPECT_THROW(PolicyMap::load("/nonexistent/policy.json"), qspec::Error);
  EXPECT_THROW(qspec::gemm::strategies_for("bf16"), qspec::Error);
}

TEST(PolicyMap, ForcedAndPaperRuleMaps) {
  using qspec::gemm::PolicyMap;
  const PolicyMap bitwise = PolicyMap::forced(Strategy::bitwise_b1);
  EXPECT_EQ(bitwise.lookup("int8", 4096, 4096, 1), Strategy::bitwise_b1);
  EXPECT_EQ(bitwise.lookup("int4", 4096, 4096, 300), Strategy::bitwise_b1);
  // Activations it cannot run take the built-in default.
  EXPECT_EQ(bitwise.lookup("f16", 4096, 4096, 300), qspec::gemm::rule_based_strategy("f16", 300));
  EXPECT_TRUE(bitwise.uses(Strategy::bitwise_b1, 1, 1));
  EXPECT_EQ(bitwise.label(), "forced:bitwise_b1");
  const PolicyMap split = PolicyMap::forced(Strategy::split_small_m);
  EXPECT_EQ(split.lookup("int8", 8, 8, 5), Strategy::split_small_m);
  EXPECT_EQ(split.lookup("int4", 8, 8, 5), qspec::gemm::rule_based_strategy("int4", 5));
  const PolicyMap rule = PolicyMap::paper_rule();
  EXPECT_EQ(rule.lookup("int8", 8, 8, 8), Strategy::bitwise_b1);
  EXPECT_EQ(rule.lookup("f16", 8, 8, 8), Strategy::small_m_v1);
  EXPECT_EQ(rule.lookup("int8", 8, 8, 9), Strategy::tiled_256x32);
  EXPECT_EQ(rule.lookup("f16", 8, 8, 1000), Strategy::tiled_256x64);
  EXPECT_EQ(rule.label(), "paper-rule");
  EXPECT_FALSE(PolicyMap().uses(Strategy::bitwise_b1, 8, 8));
}

TEST(PolicyMap, SplitAndBitwiseAreIntegerOnlyAndBitwiseNeedsGroupsOf128) {
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::split_small_m, "f16"));
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::small_m_v5, "f16"));
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::small_m_v5, "int8"));  // W4A8's int8 codes too
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::small_m_v5, "fp8"));
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::wgmma_128x128, "f16"));  // the f16 wgmma kernel
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::wgmma_128x128, "int8"));
  EXPECT_EQ(qspec::gemm::parse_strategy("wgmma_128x128"), Strategy::wgmma_128x128);
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::wgmma_128x256, "f16"));  // its prefill tile
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::wgmma_128x256, "fp8"));
  EXPECT_EQ(qspec::gemm::parse_strategy("wgmma_128x256"), Strategy::wgmma_128x256);
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::split_small_m, "int4"));
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::bitwise_b1, "int4"));
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::bitwise_b1, "nvfp4"));
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::s8_wide_128x128, "int8"));
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::s8_wide_128x128, "int4"));
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::s8_wide_128x128, "f16"));
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::s8_wgmma_128x128, "int8"));
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::s8_wgmma_128x128, "int4"));
  EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::s8_wgmma_128x128, "fp8"));  // e4m3 wgmma
  EXPECT_FALSE(qspec::gemm::strategy_supports(Strategy::s8_wide_128x128, "fp8"));
  EXPECT_EQ(qspec::gemm::parse_strategy("s8_wgmma_128x128"), Strategy::s8_wgmma_128x128);
  PolicyMap map;
  EXPECT_THROW(map.set("int8", 4096, 4096, 64, {{1, Strategy::small_m_v1}, {1024, Strategy::s8_wgmma_128x128}}),
               qspec::Error);  // weight groups of 64
  EXPECT_THROW(map.set("int8", 4096, 4160, 128, {{1, Strategy::small_m_v1}, {1024, Strategy::s8_wgmma_128x128}}),
               qspec::Error);  // k % 128 != 0
  map.set("int8", 4096, 4096, 128, {{64, Strategy::tiled_128x64}, {4096, Strategy::s8_wgmma_128x128}});
  EXPECT_EQ(map.lookup("int8", 4096, 4096, 2048), Strategy::s8_wgmma_128x128);
  EXPECT_THROW(map.set("int8", 4096, 4160, 64, {{1, Strategy::small_m_v1}, {1024, Strategy::s8_wide_128x128}}),
               qspec::Error);  // k % 128 != 0
  EXPECT_THROW(map.set("int8", 4096, 4096, 64, {{8, Strategy::bitwise_b1}}), qspec::Error);
  EXPECT_THROW(map.set("f16", 4096, 4096, 128, {{8, Strategy::split_small_m}}), qspec::Error);
  map.set("int8", 4096, 4096, 128, {{8, Strategy::bitwise_b1}, {64, Strategy::tiled_256x32}});
  EXPECT_TRUE(map.uses(Strategy::bitwise_b1, 4096, 4096));
  EXPECT_FALSE(map.uses(Strategy::bitwise_b1, 4096, 14336));
}

TEST(PolicyMap, BuildsFromTimingsWithHysteresisAndExclusions) {
  const std::string record = R"({"gpu": "G", "timings": [
    {"activations": "int8", "n": 4096, "k": 4096, "group": 128, "m": 1, "us": {"small_m_v1": 10.0, "bitwise_b1": 9.0}},
    {"activations": "int8", "n": 4096, "k": 4096, "group": 128, "m": 2, "us": {"small_m_v1": 10.0, "bitwise_b1": 9.9}},
    {"activations": "int8", "n": 4096, "k": 4096, "group": 128, "m": 40, "us": {"tiled_256x64": 15.0, "tiled_128x64": 20.0}}]})";
  const PolicyMap all = PolicyMap::from_timings(record, {}, 0.03, "record");
  EXPECT_EQ(all.gpu, "G");
  EXPECT_EQ(all.lookup("int8", 4096, 4096, 1), Strategy::bitwise_b1);    // 11 % faster than the rule
  EXPECT_EQ(all.lookup("int8", 4096, 4096, 2), Strategy::small_m_v1);    // within 3 %: the rule stays
  EXPECT_EQ(all.lookup("int8", 4096, 4096, 30), Strategy::tiled_256x64);  // the next sample's winner covers M 3..40
  const PolicyMap without = PolicyMap::from_timings(record, {Strategy::bitwise_b1}, 0.03, "record");
  EXPECT_EQ(without.lookup("int8", 4096, 4096, 1), Strategy::small_m_v1);
  EXPECT_FALSE(without.uses(Strategy::bitwise_b1, 4096, 4096));
  EXPECT_THROW(PolicyMap::from_timings("{", {}, 0.03, "record"), qspec::Error);
  EXPECT_THROW(PolicyMap::from_timings(R"({"timings": [{"activations": "int8"}]})", {}, 0.03, "record"), qspec::Error);
}

TEST(PolicyMap, OverridesOneTokenCount) {
  PolicyMap map;
  map.set("int8", 4096, 4096, 128, {{8, Strategy::small_m_v1}, {64, Strategy::tiled_256x32}});
  map.set("int8", 4096, 14336, 64, {{8, Strategy::small_m_v1}, {64, Strategy::tiled_256x32}});
  map.set("f16", 4096, 4096, 128, {{8, Strategy::small_m_v1}});
  map.override_at("int8", 1, Strategy::bitwise_b1);
  EXPECT_EQ(map.lookup("int8", 4096, 4096, 1), Strategy::bitwise_b1);
  EXPECT_EQ(map.lookup("int8", 4096, 14336, 1), Strategy::small_m_v1);  // group 64: Bitwise cannot run there
  EXPECT_EQ(map.lookup("int8", 4096, 4096, 2), Strategy::small_m_v1);
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 1), Strategy::small_m_v1);
  map.override_at("int8", 8, Strategy::tiled_256x32);
  EXPECT_EQ(map.lookup("int8", 4096, 14336, 8), Strategy::tiled_256x32);
  EXPECT_EQ(map.lookup("int8", 4096, 14336, 7), Strategy::small_m_v1);
  EXPECT_EQ(map.lookup("int8", 4096, 14336, 100000), Strategy::tiled_256x32);
  const PolicyMap back = PolicyMap::from_json(map.to_json(), "test");
  for (int64_t m = 1; m <= 100; ++m) EXPECT_EQ(back.lookup("int8", 4096, 4096, m), map.lookup("int8", 4096, 4096, m)) << m;
}

// The committed H100 maps (bench/policies) load, cover every activation kind of the 4-bit GEMMs on
// the four layer shapes, and never send a shape to a strategy it cannot run.
TEST(PolicyMap, CommittedH100MapsLoad) {
  for (const char* model : {"llama3-8b", "qwen2.5-7b"}) {
    const PolicyMap map = PolicyMap::load(std::string(QSPEC_SOURCE_DIR) + "/bench/policies/nvidia-h100-80gb-hbm3-" +
                                          model + ".json");
    EXPECT_EQ(map.gpu, "NVIDIA H100 80GB HBM3") << model;
    EXPECT_EQ(map.shapes(), 24u) << model;  // 4 shapes x (f16, int8, int4, fp8, nvfp4, mxfp4)
  }
  // Llama-3-8B's map runs f16 and int8 at 17-32 tokens on 128x32 tiles (edit_tiled_128x32).
  const PolicyMap llama = PolicyMap::load(std::string(QSPEC_SOURCE_DIR) + "/bench/policies/nvidia-h100-80gb-hbm3-llama3-8b.json");
  for (const char* activations : {"f16", "int8"})
    for (int64_t m : {17, 32}) EXPECT_EQ(llama.lookup(activations, 28672, 4096, m), Strategy::tiled_128x32) << m;
  // And f16 at 41-64 tokens on the built-in rule's tiles of e05d51e (edit_f16_41_64): 128x32 on
  // o, qkv and down, 256x64 on gate_up.
  for (int64_t m : {41, 48, 64}) {
    EXPECT_EQ(llama.lookup("f16", 4096, 4096, m), Strategy::tiled_128x32) << m;
    EXPECT_EQ(llama.lookup("f16", 6144, 4096, m), Strategy::tiled_128x32) << m;
    EXPECT_EQ(llama.lookup("f16", 4096, 14336, m), Strategy::tiled_128x32) << m;
    EXPECT_EQ(llama.lookup("f16", 28672, 4096, m), Strategy::tiled_256x64) << m;
  }
  // Qwen2.5-7B's map runs f16 and int8 at 17-32 tokens on 128x32 tiles too (retune_17_128).
  const PolicyMap qwen = PolicyMap::load(std::string(QSPEC_SOURCE_DIR) + "/bench/policies/nvidia-h100-80gb-hbm3-qwen2.5-7b.json");
  for (const char* activations : {"f16", "int8"})
    for (int64_t m : {24, 32}) EXPECT_EQ(qwen.lookup(activations, 37888, 3584, m), Strategy::tiled_128x32) << m;
}

// The committed H200 map (tuned with `builtin` in the set and the band rule, eee8717) loads, covers f16 and int8 on
// Llama-3-8B's four layer shapes, keeps the kernels' own choice for W4A16 decode (1-256 tokens),
// and is the one `--gemm-policy auto` finds for those shapes on an H200.
TEST(PolicyMap, CommittedH200MapLoads) {
  const std::string path = std::string(QSPEC_SOURCE_DIR) + "/bench/policies/nvidia-h200-llama3-8b.json";
  const PolicyMap map = PolicyMap::load(path);
  EXPECT_EQ(map.gpu, "NVIDIA H200");
  EXPECT_EQ(map.shapes(), 8u);  // 4 shapes x (f16, int8)
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  for (auto [n, k] : shapes)
    for (int64_t m : {1, 8, 16, 32, 64, 128}) EXPECT_EQ(map.lookup("f16", n, k, m), Strategy::builtin) << n << " " << m;
  EXPECT_EQ(qspec::gemm::find_policy_map({std::string(QSPEC_SOURCE_DIR) + "/bench/policies"}, "NVIDIA H200", shapes), path);
}

// Every synthetic model has its committed H200 map (issue 53), and `--gemm-policy auto` finds each
// for its own shapes (qkv, o, gate_up, down), never another model's.
TEST(PolicyMap, EverySyntheticModelHasItsH200Map) {
  const std::string dir = std::string(QSPEC_SOURCE_DIR) + "/bench/policies";
  const std::vector<std::pair<std::string, std::vector<std::pair<int64_t, int64_t>>>> models = {
      {"llama3-8b", {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}}},
      {"llama2-7b", {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}}},
      {"qwen2.5-7b", {{4608, 3584}, {3584, 3584}, {37888, 3584}, {3584, 18944}}},
  };
  for (const auto& [name, shapes] : models) {
    const std::string path = dir + "/nvidia-h200-" + name + ".json";
    const PolicyMap map = PolicyMap::load(path);
    EXPECT_EQ(map.gpu, "NVIDIA H200") << name;
    EXPECT_EQ(map.shapes(), 8u) << name;  // 4 shapes x (f16, int8)
    for (auto [n, k] : shapes) {
      EXPECT_EQ(map.lookup("f16", n, k, 1), Strategy::builtin) << name << " " << n << " x " << k;
      for (const char* activations : {"f16", "int8"})
        for (int64_t m : {1, 8, 16, 64, 256, 1024, 4096})
          EXPECT_TRUE(qspec::gemm::strategy_supports(map.lookup(activations, n, k, m), activations))
              << name << " " << activations << " " << n << " x " << k << " m " << m;
    }
    EXPECT_EQ(qspec::gemm::find_policy_map({dir}, "NVIDIA H200", shapes), path) << name;
  }
}

// `--gemm-policy auto`: the first map tuned on this GPU whose f16 entries cover every shape of the
// model; maps of other GPUs, maps missing a shape and JSON that is no map are passed over.
TEST(PolicyMap, FindsTheMapForThisGpuAndModel) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("qspec-policies-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& gpu, std::vector<std::pair<int64_t, int64_t>> shapes) {
    PolicyMap map;
    map.gpu = gpu;
    for (auto [n, k] : shapes) map.set("f16", n, k, 128, {{8, Strategy::small_m_v1}});
    map.save((dir / name).string());
  };
  write("a-other-gpu.json", "NVIDIA B200", {{6144, 4096}, {4096, 4096}});
  write("b-missing-shape.json", "NVIDIA H100 80GB HBM3", {{6144, 4096}});
  write("c-match.json", "NVIDIA H100 80GB HBM3", {{6144, 4096}, {4096, 4096}, {1, 1}});
  write("d-also-match.json", "NVIDIA H100 80GB HBM3", {{6144, 4096}, {4096, 4096}});
  std::ofstream(dir / "0-not-a-map.json") << "{\"hello\": 1}";
  const std::vector<std::pair<int64_t, int64_t>> model = {{6144, 4096}, {4096, 4096}};
  EXPECT_EQ(qspec::gemm::find_policy_map({"/no/such/dir", dir.string()}, "NVIDIA H100 80GB HBM3", model),
            (dir / "c-match.json").string());
  EXPECT_EQ(qspec::gemm::find_policy_map({dir.string()}, "NVIDIA A100", model), "");
  EXPECT_EQ(qspec::gemm::find_policy_map({dir.string()}, "NVIDIA H100 80GB HBM3", {{5, 5}}), "");
  fs::remove_all(dir);
  // The committed maps are found for their models from the source tree.
  EXPECT_EQ(qspec::gemm::find_policy_map({std::string(QSPEC_SOURCE_DIR) + "/bench/policies"}, "NVIDIA H100 80GB HBM3",
                                         {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}}),
            std::string(QSPEC_SOURCE_DIR) + "/bench/policies/nvidia-h100-80gb-hbm3-llama3-8b.json");
}

// The tuner's adaptive sampling: coarse points, then midpoints wherever neighbours' winners
// differ, down to adjacent points below 64 tokens and an eighth of the smaller M beyond; each
// point timed once.
TEST(PolicyMap, AdaptiveTunePointsBracketEveryCrossover) {
  using qspec::gemm::Strategy;
  // Winners with crossovers at 19 / 20 and 300 / 301 (a real map's: small-M, tiled, cuBLAS).
  auto winner = [](int64_t m) {
    return m < 20 ? Strategy::small_m_v5 : m <= 300 ? Strategy::tiled_128x64 : Strategy::dequant_cublas;
  };
  std::vector<int64_t> timed;
  const std::vector<int64_t> coarse = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};
  const std::vector<int64_t> points = qspec::gemm::adaptive_tune_points(coarse, [&](int64_t m) {
    timed.push_back(m);
    return winner(m);
  });
  ASSERT_TRUE(std::is_sorted(points.begin(), points.end()));
  EXPECT_EQ(points.size(), timed.size()) << "each point timed once";
  for (int64_t m : coarse) EXPECT_TRUE(std::count(points.begin(), points.end(), m)) << m;
  // The small crossover exactly: 19 and 20 both sampled.
  EXPECT_TRUE(std::count(points.begin(), points.end(), 19) && std::count(points.begin(), points.end(), 20));
  // The large one within an eighth: neighbours around 300 / 301 with different winners are close.
  for (size_t i = 0; i + 1 < points.size(); ++i)
    if (winner(points[i]) != winner(points[i + 1]))
      EXPECT_LE(points[i + 1] - points[i], qspec::gemm::adaptive_tune_resolution(points[i]))
          << points[i] << " .. " << points[i + 1];
  EXPECT_EQ(qspec::gemm::adaptive_tune_resolution(63), 1);
  EXPECT_EQ(qspec::gemm::adaptive_tune_resolution(256), 32);
  EXPECT_LT(points.size(), coarse.size() + 16) << "a few points a crossover, not every M";
  // One winner everywhere: the coarse points alone.
  EXPECT_EQ(qspec::gemm::adaptive_tune_points(coarse, [](int64_t) { return Strategy::tiled_128x64; }), coarse);
  EXPECT_THROW(qspec::gemm::adaptive_tune_points({0, 4}, winner), qspec::Error);
}

// The winner of one point keeps the rule-based default unless another strategy beats it by
// more than min_gain, and skips excluded strategies.
TEST(PolicyMap, FastestStrategyKeepsTheRuleWithinMinGain) {
  using qspec::gemm::Strategy;
  const Strategy rule = qspec::gemm::rule_based_strategy("f16", 4);
  const Strategy other = rule == Strategy::small_m_v2 ? Strategy::small_m_v5 : Strategy::small_m_v2;
  EXPECT_EQ(qspec::gemm::fastest_strategy({{rule, 10.0}, {other, 9.8}}, "f16", 4, {}, 0.03), rule);
  EXPECT_EQ(qspec::gemm::fastest_strategy({{rule, 10.0}, {other, 9.0}}, "f16", 4, {}, 0.03), other);
  EXPECT_EQ(qspec::gemm::fastest_strategy({{rule, 10.0}, {other, 9.0}}, "f16", 4, {other}, 0.03), rule);
  EXPECT_THROW(qspec::gemm::fastest_strategy({{other, 9.0}}, "f16", 4, {other}, 0.03), qspec::Error);
}

// builtin (the kernels' own choice, as without a map) is the default a tune keeps when it timed
// it: another strategy takes a point only by beating it by min_gain; records without it keep
// the rule-based default. A map may name it for any activations, and it survives JSON.
TEST(PolicyMap, BuiltinIsTheDefaultATuneKeeps) {
  using qspec::gemm::PolicyMap;
  using qspec::gemm::Strategy;
  const Strategy rule = qspec::gemm::rule_based_strategy("f16", 24);
  const Strategy other = rule == Strategy::tiled_128x64 ? Strategy::tiled_128x32 : Strategy::tiled_128x64;
  EXPECT_EQ(qspec::gemm::fastest_strategy({{Strategy::builtin, 10.0}, {rule, 9.9}, {other, 9.8}}, "f16", 24, {}, 0.03),
            Strategy::builtin);
  EXPECT_EQ(qspec::gemm::fastest_strategy({{Strategy::builtin, 10.0}, {rule, 9.9}, {other, 9.0}}, "f16", 24, {}, 0.03),
            other);
  // Excluded, builtin is no default: the rule keeps the point again.
  EXPECT_EQ(qspec::gemm::fastest_strategy({{Strategy::builtin, 9.0}, {rule, 10.0}, {other, 9.8}}, "f16", 24,
                                          {Strategy::builtin}, 0.03),
            rule);
  for (const char* activations : {"f16", "int8", "int4", "fp8", "nvfp4", "mxfp4"})
    EXPECT_TRUE(qspec::gemm::strategy_supports(Strategy::builtin, activations)) << activations;

  const std::string record = R"({"gpu": "NVIDIA H200", "timings": [
    {"shape": "o", "n": 4096, "k": 4096, "group": 128, "activations": "int8", "m": 1, "us": {"builtin": 10.0, "small_m_v1": 9.9}},
    {"shape": "o", "n": 4096, "k": 4096, "group": 128, "activations": "int8", "m": 64, "us": {"builtin": 30.0, "tiled_128x32": 20.0}}]})";
  const PolicyMap map = PolicyMap::from_timings(record, {}, 0.03, "record");
  EXPECT_EQ(map.lookup("int8", 4096, 4096, 1), Strategy::builtin);
  EXPECT_EQ(map.lookup("int8", 4096, 4096, 64), Strategy::tiled_128x32);
  const PolicyMap back = PolicyMap::from_json(map.to_json(), "test");
  EXPECT_EQ(back.lookup("int8", 4096, 4096, 1), Strategy::builtin);
  EXPECT_EQ(PolicyMap::forced(Strategy::builtin).lookup("nvfp4", 8, 8, 3), Strategy::builtin);
}

// Tuning inside the step (qspec tune's refinement): the contenders at M come from the isolated
// timings at the tuned M nearest to M, builtin always first; without timings, every strategy.
TEST(PolicyMap, StepContendersComeFromTheNearestIsolatedTimings) {
  const std::string record = R"({"timings": [
    {"activations": "f16", "n": 64, "k": 128, "m": 16, "best": "builtin",
     "us": {"builtin": 10.0, "tiled_128x32": 11.0, "dequant_cublas": 30.0, "small_m_v1": 12.6}},
    {"activations": "f16", "n": 64, "k": 128, "m": 64, "best": "wgmma_128x128",
     "us": {"builtin": 20.0, "wgmma_128x128": 18.0, "tiled_128x32": 40.0}},
    {"activations": "int8", "n": 64, "k": 128, "m": 16, "best": "s8_wgmma_128x128",
     "us": {"builtin": 10.0, "s8_wgmma_128x128": 9.0}}]})";
  using V = std::vector<Strategy>;
  // M = 20: nearest tuned M is 16; within 25 % of 10 us: builtin, tiled_128x32 (small_m_v1 at 12.6 is out).
  EXPECT_EQ(qspec::gemm::step_contenders(record, "f16", 20, 0.25), (V{Strategy::builtin, Strategy::tiled_128x32}));
  EXPECT_EQ(qspec::gemm::step_contenders(record, "f16", 20, 0.3),  // (in the record's key order)
            (V{Strategy::builtin, Strategy::small_m_v1, Strategy::tiled_128x32}));
  // M = 50: nearest is 64.
  EXPECT_EQ(qspec::gemm::step_contenders(record, "f16", 50, 0.25), (V{Strategy::builtin, Strategy::wgmma_128x128}));
  EXPECT_EQ(qspec::gemm::step_contenders(record, "int8", 1, 0.05), (V{Strategy::builtin, Strategy::s8_wgmma_128x128}));
  // No timings: builtin first, then every strategy of the kind.
  const V all = qspec::gemm::step_contenders("", "f16", 16, 0.25);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front(), Strategy::builtin);
  const V kind = qspec::gemm::strategies_for("f16");  // one vector: begin and end of the same one
  EXPECT_EQ(all.size(), kind.size() + (std::count(kind.begin(), kind.end(), Strategy::builtin) == 0 ? 1 : 0));
  EXPECT_THROW(qspec::gemm::step_contenders("{not json", "f16", 16, 0.25), qspec::Error);
}

// The pick of a step refinement: the map departs from builtin only where a candidate beat builtin
// by the margin on the mean and in every round; otherwise the fastest where it beats the map's by
// min_gain.
TEST(PolicyMap, StepRefineChoiceKeepsBuiltinUnlessBeaten) {
  using qspec::gemm::step_refine_choice;
  using R = std::vector<std::vector<double>>;
  // [map, builtin, a, b], one round
  EXPECT_EQ(step_refine_choice(R{{3.30, 3.31, 3.22, 3.40}}, 1, 0.005, 0.01), 2u);  // a beats builtin by 2.8 %
  EXPECT_EQ(step_refine_choice(R{{3.34, 3.27, 3.60, 3.40}}, 1, 0.005, 0.01), 1u);  // the map lost to builtin
  EXPECT_EQ(step_refine_choice(R{{2.46, 2.465, 2.50, 2.48}}, 1, 0.005, 0.01), 1u); // the map within noise of builtin
  EXPECT_EQ(step_refine_choice(R{{7.29, 7.48, 7.50, 7.60}}, 1, 0.005, 0.01), 0u);  // the map beats builtin by 2.6 %
  EXPECT_EQ(step_refine_choice(R{{7.29, 7.48, 7.27, 7.60}}, 1, 0.005, 0.01), 0u);  // a within min_gain of the map
  EXPECT_EQ(step_refine_choice(R{{7.40, 7.48, 7.20, 7.60}}, 1, 0.005, 0.01), 2u);  // a beats the map and builtin
  // Three rounds: the means say the map by 3 %, but it lost the second round: builtin.
  EXPECT_EQ(step_refine_choice(R{{24.0, 25.6, 26.0}, {25.2, 25.0, 26.1}, {24.1, 25.7, 26.2}}, 1, 0.005, 0.01), 1u);
  EXPECT_EQ(step_refine_choice(R{{24.0, 25.6, 26.0}, {24.6, 25.0, 26.1}, {24.1, 25.7, 26.2}}, 1, 0.005, 0.01), 0u);
  EXPECT_THROW(step_refine_choice(R{{1.0}}, 1, 0.005, 0.01), qspec::Error);
  EXPECT_THROW(step_refine_choice(R{}, 1, 0.005, 0.01), qspec::Error);
  EXPECT_THROW(step_refine_choice(R{{1.0, 2.0}, {1.0}}, 1, 0.005, 0.01), qspec::Error);
}

// Each refinement point answers for the M from past the point below up to its own; the last for
// every M beyond too.
TEST(PolicyMap, StepRefineBandsCoverEveryTokenCount) {
  using qspec::gemm::step_refine_bands;
  using B = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(step_refine_bands({1, 8, 64, 1024}), (B{{1, 1}, {2, 8}, {9, 64}, {65, PolicyMap::kDenseM}}));
  EXPECT_EQ(step_refine_bands({16}), (B{{1, PolicyMap::kDenseM}}));
  EXPECT_EQ(step_refine_bands({8, 9000}), (B{{1, 8}, {9, 9000}}));
  EXPECT_TRUE(step_refine_bands({}).empty());
  EXPECT_THROW(step_refine_bands({8, 8}), qspec::Error);
  EXPECT_THROW(step_refine_bands({0, 8}), qspec::Error);
  // The default points, decode and prefill together.
  std::vector<int64_t> points = qspec::gemm::step_refine_batches();
  for (int64_t p : qspec::gemm::step_refine_prompt_lengths()) points.push_back(p);
  std::sort(points.begin(), points.end());
  const B bands = step_refine_bands(points);
  ASSERT_EQ(bands.size(), points.size());
  for (size_t i = 1; i < bands.size(); ++i) EXPECT_EQ(bands[i].first, bands[i - 1].second + 1);
  EXPECT_EQ(bands.back().second, PolicyMap::kDenseM);
}

// A band goes back to builtin in one call; departs_at says whether a map names anything else at M.
TEST(PolicyMap, OverridesARangeOfTokenCounts) {
  PolicyMap map;
  map.set("f16", 4096, 4096, 128, {{256, Strategy::builtin}, {1024, Strategy::dequant_cublas}, {4096, Strategy::wgmma_128x256}});
  map.set("f16", 28672, 4096, 128, {{512, Strategy::builtin}, {4096, Strategy::dequant_cublas}});
  map.set("int8", 4096, 4096, 128, {{4096, Strategy::tiled_128x32}});
  EXPECT_FALSE(map.departs_at("f16", 256));
  EXPECT_TRUE(map.departs_at("f16", 300));  // the first shape
  EXPECT_TRUE(map.departs_at("f16", 600));
  map.override_range("f16", 513, 2048, Strategy::builtin);
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 512), Strategy::dequant_cublas);
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 513), Strategy::builtin);
  EXPECT_EQ(map.lookup("f16", 28672, 4096, 2048), Strategy::builtin);
  EXPECT_EQ(map.lookup("f16", 28672, 4096, 2049), Strategy::dequant_cublas);
  EXPECT_EQ(map.lookup("int8", 4096, 4096, 1000), Strategy::tiled_128x32);  // other activations untouched
  EXPECT_FALSE(map.departs_at("f16", 1000));
  map.override_range("f16", 2049, 1 << 20, Strategy::builtin);  // past the dense table: every M beyond
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 100000), Strategy::builtin);
  EXPECT_TRUE(PolicyMap::forced(Strategy::tiled_128x32).departs_at("f16", 64));
  const PolicyMap back = PolicyMap::from_json(map.to_json(), "test");
  for (int64_t m : {1, 300, 513, 2048, 3000, 5000}) EXPECT_EQ(back.lookup("f16", 4096, 4096, m), map.lookup("f16", 4096, 4096, m)) << m;
}

// `qspec tune --from-record` rebuilds the map tune wrote: the isolated timings' picks, then the
// step refinement replayed in order (a band back to builtin, a contender at its M, "map" kept).
TEST(PolicyMap, ReplaysAStepRefinement) {
  const std::string record = R"({"gpu": "G", "timings": [
    {"activations": "f16", "n": 4096, "k": 4096, "group": 128, "m": 1, "us": {"builtin": 10.0, "small_m_v5": 10.1}},
    {"activations": "f16", "n": 4096, "k": 4096, "group": 128, "m": 512, "us": {"builtin": 100.0, "dequant_cublas": 80.0}},
    {"activations": "f16", "n": 4096, "k": 4096, "group": 128, "m": 2048, "us": {"builtin": 400.0, "dequant_cublas": 300.0}}],
    "step_refinement": [
    {"activations": "f16", "mode": "w4a16", "m": 16, "taken": "tiled_128x32", "band": null},
    {"activations": "f16", "mode": "w4a16", "m": 512, "taken": "map", "band": null},
    {"activations": "f16", "mode": "w4a16", "m": 2048, "taken": "builtin", "band": [513, 4096]}]})";
  PolicyMap map = PolicyMap::from_timings(record, {}, 0.03, "record");
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 300), Strategy::dequant_cublas);
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 3000), Strategy::dequant_cublas);
  EXPECT_EQ(map.replay_step_refinement(record), 3u);
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 1), Strategy::builtin);
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 16), Strategy::tiled_128x32);
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 17), Strategy::dequant_cublas);  // the isolated pick up to 512
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 512), Strategy::dequant_cublas);  // the map won its point
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 513), Strategy::builtin);         // builtin's band
  EXPECT_EQ(map.lookup("f16", 4096, 4096, 100000), Strategy::builtin);
  PolicyMap unchanged = PolicyMap::from_timings(record, {}, 0.03, "record");
  EXPECT_EQ(unchanged.replay_step_refinement(R"({"timings": []})"), 0u);  // no refinement: nothing to replay
  EXPECT_EQ(unchanged.lookup("f16", 4096, 4096, 3000), Strategy::dequant_cublas);
  EXPECT_THROW(map.replay_step_refinement("{"), qspec::Error);
  EXPECT_THROW(map.replay_step_refinement(R"({"step_refinement": [{"m": 16, "taken": "map"}]})"), qspec::Error);
}

// Each shipped H200 map is what its committed tuning record implies (bench/results: the isolated
// timings, then the step refinement replayed, as `qspec tune --from-record` rebuilds it), at
// every M of the dense table and beyond.
TEST(PolicyMap, ShippedH200MapsAreWhatTheirRecordsImply) {
  const std::string root = std::string(QSPEC_SOURCE_DIR);
  for (const auto& [model, record_name] : std::vector<std::pair<std::string, std::string>>{
           {"llama3-8b", "gemm-tune-refined-llama3-8b-h200-eee8717.json"},
           {"qwen2.5-7b", "gemm-tune-refined-qwen2.5-7b-h200-eee8717.json"},
           {"llama2-7b", "gemm-tune-refined-llama2-7b-h200-c42da17.json"}}) {
    std::ifstream file(root + "/bench/results/" + record_name);
    ASSERT_TRUE(file.good()) << record_name;
    std::stringstream text;
    text << file.rdbuf();
    PolicyMap implied = PolicyMap::from_timings(text.str(), {}, 0.03, record_name);
    implied.replay_step_refinement(text.str());  // the c42da17 record names each point's mode only
    const PolicyMap shipped = PolicyMap::load(root + "/bench/policies/nvidia-h200-" + model + ".json");
    const nlohmann::json entries = nlohmann::json::parse(shipped.to_json())["entries"];
    ASSERT_EQ(entries.size(), 8u) << model;
    for (const nlohmann::json& entry : entries) {
      const std::string activations = entry["activations"].get<std::string>();
      const int64_t n = entry["n"].get<int64_t>(), k = entry["k"].get<int64_t>();
      for (int64_t m = 1; m <= PolicyMap::kDenseM + 1; ++m)
        ASSERT_EQ(implied.lookup(activations, n, k, m), shipped.lookup(activations, n, k, m))
            << model << " " << activations << " " << n << " x " << k << " m " << m;
    }
  }
}
