// ADAngel's policy map (gemm/policy_map.h): lookups, the rule-based default, JSON round trip,
// and clear errors for bad maps. The GPU side (tuner, dispatcher) is in tests/gpu.
#include <gtest/gtest.h>

#include <string>

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
  EXPECT_EQ(qspec::gemm::rule_based_strategy("f16", 8), Strategy::small_m_v1);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("f16", 129), Strategy::dequant_cublas);
  EXPECT_EQ(qspec::gemm::rule_based_strategy("int8", 4096), Strategy::tiled_256x64);  // no cuBLAS path for int8
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
