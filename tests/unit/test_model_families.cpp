// Qwen3 and Gemma 3 (tests/data/tiny/qwen3-qknorm, gemma3-swa, gemma3-hd256) beyond the fp32 logits of
// test_tiny_models.cpp: every CPU mode runs from RTN and ARC-calibrated 4-bit weights, a
// batched forward equals token-by-token bit for bit (the premise of QSpec's verify pass, here
// across Gemma's sliding-window layers), greedy QSpec equals greedy W4A16 for every draft, a
// saved 4-bit checkpoint (q/k norms, Gemma's four norms per layer) reloads to the same logits,
// two sequences batched over a paged cache equal each alone, Hadamard rotation keeps Qwen3's
// function and refuses Gemma 3, and the per-layer windows / RoPE really differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "model/llama.h"
#include "model/quantize.h"
#include "qspec/error.h"
#include "runtime/generate.h"
#include "runtime/qspec.h"

namespace {

const std::string kTiny = QSPEC_TEST_DATA "/tiny/";
const std::vector<std::string> kDraftModes = {"w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"};

class Family : public testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return kTiny + GetParam(); }
};

// A prompt longer than gemma3-swa's window of 8, so the sliding layers drop keys.
std::vector<int32_t> prompt_of(int64_t length, uint32_t seed = 7) {
  std::mt19937 random(seed);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < length; ++i) ids.push_back(3 + static_cast<int32_t>(random() % 90));
  return ids;
}

qspec::RunMode mode_of(const qspec::LlamaModel& model, const std::string& name) {
  qspec::RunMode mode = qspec::parse_run_mode(name);
  mode.activations.group_size = model.auto_group_size();
  return mode;
}

std::vector<float> all_logits(const qspec::LlamaModel& model, const std::vector<int32_t>& prompt,
                              const qspec::RunMode& mode) {
  qspec::KvCache cache = model.new_cache(64);
  std::vector<float> logits;
  model.forward(prompt, cache, logits, /*all_logits=*/true, mode);
  return logits;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// ||a - b|| / ||b||.
double relative_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

double max_abs(const std::vector<float>& a) {
  double worst = 0;
  for (float v : a) worst = std::max(worst, std::fabs(static_cast<double>(v)));
  return worst;
}

}  // namespace

TEST_P(Family, EveryModeRunsAndBatchedEqualsSequential) {
  auto model = qspec::LlamaModel::load(dir());
  model->quantize_weights(qspec::quant::Format::int4);
  const std::vector<int32_t> prompt = prompt_of(20);
  const std::vector<float> reference = all_logits(*model, prompt, mode_of(*model, "w16a16"));
  for (const char* name : {"w16a16", "w4a16", "w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"}) {
    const qspec::RunMode mode = mode_of(*model, name);
    const std::vector<float> batched = all_logits(*model, prompt, mode);
    for (float v : batched) ASSERT_TRUE(std::isfinite(v)) << name;
    std::printf("%s %s: relative rms error to w16a16 %.3f\n", GetParam().c_str(), name, relative_rms(batched, reference));
    EXPECT_LT(relative_rms(batched, reference), 0.8) << name;  // uncorrelated logits: ~1.4
    qspec::KvCache cache = model->new_cache(64);
    std::vector<float> step, sequential;
    for (int32_t token : prompt) {
      model->forward(std::span<const int32_t>(&token, 1), cache, step, false, mode);
      sequential.insert(sequential.end(), step.begin(), step.end());
    }
    ASSERT_EQ(batched.size(), sequential.size());
    EXPECT_EQ(std::memcmp(batched.data(), sequential.data(), batched.size() * sizeof(float)), 0) << name;
  }
}

TEST_P(Family, GreedyQSpecEqualsW4A16ForEveryDraft) {
  auto model = qspec::LlamaModel::load(dir());
  model->quantize_weights(qspec::quant::Format::int4);
  const std::vector<int32_t> prompt = prompt_of(12);
  qspec::GenerationOptions options;
  options.max_new_tokens = 16;  // 28 positions: past the sliding window
  options.mode = mode_of(*model, "w4a16");
  const std::vector<int32_t> reference = qspec::generate(*model, prompt, options).ids;
  ASSERT_EQ(reference.size(), 16u);
  for (const std::string& draft : kDraftModes)
    for (int64_t gamma : {1, 3, 6}) {
      qspec::QSpecOptions q;
      q.draft = mode_of(*model, draft);
      q.verify = options.mode;
      q.gamma = gamma;
      EXPECT_EQ(qspec::qspec_generate(*model, prompt, options, q).ids, reference) << draft << " gamma " << gamma;
    }
}

TEST_P(Family, ArcCalibratedModesAndSavedCheckpointReload) {
  auto model = qspec::LlamaModel::load(dir());
  const std::vector<int32_t> prompt = prompt_of(20);
  const std::vector<float> reference = all_logits(*model, prompt, mode_of(*model, "w16a16"));
  qspec::CalibrationSet calibration;
  for (uint32_t seed : {1u, 2u, 3u}) calibration.sequences.push_back(prompt_of(32, seed));
  calibration.source = "random ids";
  qspec::QuantizeOptions options;
  options.format = qspec::quant::Format::nvfp4;
  options.arc = true;
  qspec::quantize_model(*model, options, &calibration);
  ASSERT_TRUE(model->has_arc());
  for (const std::string& name : qspec::run_mode_names()) {
    const std::vector<float> logits = all_logits(*model, prompt, mode_of(*model, name));
    for (float v : logits) ASSERT_TRUE(std::isfinite(v)) << name;
    std::printf("%s %s (arc calibrated): relative rms error to w16a16 %.3f\n", GetParam().c_str(), name.c_str(),
                relative_rms(logits, reference));
    EXPECT_LT(relative_rms(logits, reference), 0.8) << name;
  }
  // The 4-bit checkpoint carries every norm (q/k norms; Gemma's post-attention, pre- and
  // post-feedforward norms) and reloads to the same W4A16 logits, bit for bit.
  const auto out = std::filesystem::temp_directory_path() / ("qspec-family-" + GetParam() + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  model->save_quantized(out.string());
  auto reloaded = qspec::LlamaModel::load(out.string());
  for (const char* name : {"w4a16", "w4a4-nvfp4-arc"}) {
    const std::vector<float> a = all_logits(*model, prompt, mode_of(*model, name));
    const std::vector<float> b = all_logits(*reloaded, prompt, mode_of(*reloaded, name));
    EXPECT_EQ(a, b) << name;
  }
  std::filesystem::remove_all(out);
}

// Continuous batching over a paged cache (blocks of 4, interleaved between the sequences):
// each sequence's logits equal its own forward's, bit for bit, whatever the other's length.
TEST_P(Family, PagedBatchOfTwoSequencesEqualsEachAlone) {
  auto model = qspec::LlamaModel::load(dir());
  const auto& c = model->config();
  const std::vector<int32_t> a = prompt_of(19, 11), b = prompt_of(6, 12);
  constexpr int64_t kBlock = 4, kBlocks = 16;
  std::vector<std::vector<float>> keys(c.num_layers, std::vector<float>(kBlock * kBlocks * c.kv_dim()));
  std::vector<std::vector<float>> values = keys;
  std::vector<float*> key_ptrs, value_ptrs;
  for (int64_t l = 0; l < c.num_layers; ++l) key_ptrs.push_back(keys[l].data()), value_ptrs.push_back(values[l].data());
  const std::vector<int32_t> table_a = {0, 2, 4, 6, 8}, table_b = {1, 3};
  const qspec::KvBlocks kv_a{key_ptrs.data(), value_ptrs.data(), table_a.data(), kBlock};
  const qspec::KvBlocks kv_b{key_ptrs.data(), value_ptrs.data(), table_b.data(), kBlock};
  const std::vector<qspec::SequenceChunk> chunks = {{a, 0, kv_a, qspec::SequenceChunk::Logits::all},
                                                    {b, 0, kv_b, qspec::SequenceChunk::Logits::all}};
  std::vector<float> batched;
  model->forward_batch(chunks, batched);
  std::vector<float> alone = all_logits(*model, a, {});
  const std::vector<float> alone_b = all_logits(*model, b, {});
  alone.insert(alone.end(), alone_b.begin(), alone_b.end());
  EXPECT_EQ(batched, alone);
}

TEST_P(Family, HadamardRotationKeepsQwen3AndRefusesGemma3) {
  auto model = qspec::LlamaModel::load(dir());
  const std::vector<int32_t> prompt = prompt_of(12);
  const std::vector<float> before = all_logits(*model, prompt, mode_of(*model, "w16a16"));
  if (model->config().recipe().output_norms) {
    try {
      model->apply_hadamard_rotation(5);
      FAIL() << "Gemma 3 was rotated";
    } catch (const qspec::Error& error) {
      EXPECT_NE(std::string(error.what()).find("Hadamard rotation of Gemma3ForCausalLM is not supported"),
                std::string::npos) << error.what();
    }
    return;
  }
  model->apply_hadamard_rotation(5);
  const std::vector<float> after = all_logits(*model, prompt, mode_of(*model, "w16a16"));
  EXPECT_GT(max_diff(before, after), 0.0);
  EXPECT_LT(max_diff(before, after), 1e-4 * max_abs(before));
  model->quantize_weights(qspec::quant::Format::int4_channel);
  const auto out = std::filesystem::temp_directory_path() / ("qspec-rotated-" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  model->save_quantized(out.string());  // writes the q/k norms from memory
  auto reloaded = qspec::LlamaModel::load(out.string());
  EXPECT_EQ(all_logits(*reloaded, prompt, mode_of(*reloaded, "w4a16")), all_logits(*model, prompt, mode_of(*model, "w4a16")));
  std::filesystem::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Tiny, Family, testing::Values("qwen3-qknorm", "gemma3-swa", "gemma3-hd256"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// gemma3-swa's layers really differ: the sliding ones see 8 keys and their own RoPE base, the
// global one everything with linear-scaled RoPE. Making every layer global (or giving the
// sliding layers the global RoPE) changes the logits past the window, not before it.
TEST(Gemma3, SlidingLayersAndLocalRopeMatter) {
  const qspec::ModelConfig config = qspec::load_model_config(kTiny + "gemma3-swa");
  ASSERT_EQ(config.layer_window(0), 8);
  ASSERT_EQ(config.layer_window(2), 0);
  EXPECT_EQ(config.layer_rope(2).type, "linear");
  EXPECT_EQ(config.layer_rope(0).type, "default");
  auto model = qspec::LlamaModel::load(kTiny + "gemma3-swa");
  const std::vector<int32_t> prompt = prompt_of(20);
  const std::vector<float> logits = all_logits(*model, prompt, {});
  const int64_t vocab = config.vocab_size;
  // Soft-capping at 30: every logit inside (-30, 30).
  for (float v : logits) EXPECT_LT(std::fabs(v), 30.0f);
  // The first 8 positions never reach past the window: a copy of the directory with every
  // layer global agrees there and differs after.
  const auto dir = std::filesystem::temp_directory_path() / ("qspec-gemma3-global-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(kTiny + "gemma3-swa", dir);
  {
    nlohmann::json json = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    json["layer_types"] = std::vector<std::string>(5, "full_attention");
    json["rope_parameters"]["sliding_attention"] = json["rope_parameters"]["full_attention"];
    std::ofstream(dir / "config.json") << json.dump();
  }
  auto global = qspec::LlamaModel::load(dir.string());
  const std::vector<float> global_logits = all_logits(*global, prompt, {});
  std::filesystem::remove_all(dir);
  auto row_diff = [&](int64_t t) {
    double worst = 0;
    for (int64_t i = 0; i < vocab; ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(logits[t * vocab + i]) - global_logits[t * vocab + i]));
    return worst;
  };
  EXPECT_EQ(row_diff(0), 0.0);  // position 0: every RoPE is the identity, one key
  EXPECT_GT(row_diff(19), 1e-3);
}
