// qspec 4-bit checkpoints (model/quant_checkpoint.h): quantize in process, save, load again,
// and every mode the checkpoint supports gives bit-identical logits; `qspec info` reports
// the quantization; and inconsistent checkpoints (manifest or tensors) are rejected at load
// with a qspec::Error naming the file, tensor or field at fault.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/llama.h"
#include "model/quant_checkpoint.h"
#include "model/quantize.h"
#include "qspec/error.h"
#include "quant/quantized_linear.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using qspec::quant::Format;

namespace {

const std::string kModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
const std::string kCalibration = QSPEC_SOURCE_DIR "/data/calibration/gsm-synth-self.txt";
const std::vector<int32_t> kPrompt = {314, 26, 473, 307, 221, 19, 21, 409};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A fresh directory under the test temp dir, removed with the object.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static int counter = 0;
    path_ = fs::path(::testing::TempDir()) /
            ("qspec-qckpt-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// 4 sequences of 64 tokens: enough for GPTQ and ARC to run, small enough to be fast.
const qspec::CalibrationSet& calibration() {
  static const qspec::CalibrationSet set = [] {
    auto tokenizer = qspec::Tokenizer::load(kModel);
    return qspec::load_calibration_text(kCalibration, *tokenizer, 4, 64);
  }();
  return set;
}

struct Variant {
  Format format;
  const char* method;
  bool arc;
};

std::string variant_name(const Variant& v) {
  std::string name(qspec::quant::format_name(v.format));
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name + "_" + v.method + (v.arc ? "_arc" : "");
}

void PrintTo(const Variant& v, std::ostream* out) { *out << variant_name(v); }

std::unique_ptr<qspec::LlamaModel> quantized_model(const Variant& v) {
  auto model = qspec::LlamaModel::load(kModel);
  qspec::QuantizeOptions options;
  options.format = v.format;
  options.method = v.method;
  options.arc = v.arc;
  const bool needs_calibration = options.method == "gptq" || options.arc;
  qspec::quantize_model(*model, options, needs_calibration ? &calibration() : nullptr);
  return model;
}

qspec::RunMode mode_named(const std::string& name) {
  qspec::RunMode mode = qspec::parse_run_mode(name);
  mode.activations.group_size = 64;  // int4 activations: 64 divides every K (704 = 11 x 64)
  return mode;
}

std::vector<float> logits_of(const qspec::LlamaModel& model, const qspec::RunMode& mode) {
  qspec::KvCache cache = model.new_cache(static_cast<int64_t>(kPrompt.size()));
  std::vector<float> logits;
  model.forward(kPrompt, cache, logits, false, mode);
  return logits;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const qspec::Error& error) {
    return error.what();
  } catch (const std::exception& error) {
    return std::string("<not a qspec::Error> ") + error.what();
  }
  return "<no error>";
}

std::vector<fs::path> partial_siblings(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".partial-") != std::string::npos) found.push_back(entry.path());
  return found;
}

}  // namespace

// --- Round trip -----------------------------------------------------------------------------

class QuantCheckpointRoundTrip : public ::testing::TestWithParam<Variant> {};

TEST_P(QuantCheckpointRoundTrip, ReloadedModelGivesBitIdenticalLogitsInEveryMode) {
  const Variant v = GetParam();
  auto model = quantized_model(v);
  ASSERT_EQ(model->has_arc(), v.arc);
  ScratchDir scratch("roundtrip");
  const fs::path out = scratch.path() / "ckpt";
  model->save_quantized(out.string(), {{"tool", "unit test"}});

  // The directory: one model.safetensors, the manifest, and the source's other files.
  EXPECT_TRUE(fs::is_regular_file(out / "model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(out / qspec::kQuantManifestFile));
  EXPECT_TRUE(fs::is_regular_file(out / "config.json"));
  EXPECT_TRUE(fs::is_regular_file(out / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out / "model-00001-of-00003.safetensors"));
  EXPECT_TRUE(partial_siblings(scratch.path()).empty());
  const json manifest = json::parse(slurp(out / qspec::kQuantManifestFile));
  EXPECT_EQ(manifest["qspec_quantization"], qspec::kQuantManifestVersion);
  EXPECT_EQ(manifest["format"], qspec::quant::format_name(v.format));
  EXPECT_EQ(manifest["group_size"], qspec::quant::format_has_groups(v.format) ? 64 : 0);
  EXPECT_EQ(manifest["method"], v.method);
  EXPECT_EQ(manifest["tool"], "unit test");
  EXPECT_EQ(manifest["details"].contains("arc"), v.arc);
  if (v.arc) {
    EXPECT_EQ(manifest["details"]["arc"]["sites"].size(), 8u * qspec::kLinearSites);
  }

  auto reloaded = qspec::LlamaModel::load(out.string());
  EXPECT_FALSE(reloaded->has_checkpoint_weights());
  ASSERT_TRUE(reloaded->has_quantized_weights());
  EXPECT_EQ(reloaded->quantized_format(), model->quantized_format());
  EXPECT_EQ(reloaded->has_arc(), v.arc);
  EXPECT_EQ(reloaded->quantized_weight_bytes(), model->quantized_weight_bytes());
  ASSERT_EQ(reloaded->quantized_layers().size(), model->quantized_layers().size());
  for (size_t l = 0; l < model->quantized_layers().size(); ++l) {
    const qspec::QuantizedLayerWeights& a = model->quantized_layers()[l];
    const qspec::QuantizedLayerWeights& b = reloaded->quantized_layers()[l];
    for (int s = 0; s < qspec::kLinearSites; ++s) {
      EXPECT_EQ(a.sites[s].order, b.sites[s].order) << "layer " << l << " site " << s;
      EXPECT_EQ(a.sites[s].tail, b.sites[s].tail) << "layer " << l << " site " << s;
      EXPECT_EQ(a.sites[s].outliers_int4, b.sites[s].outliers_int4);
      EXPECT_EQ(a.sites[s].outliers_nvfp4, b.sites[s].outliers_nvfp4);
      EXPECT_EQ(a.sites[s].outliers_mxfp4, b.sites[s].outliers_mxfp4);
    }
    EXPECT_EQ(a.down_proj.codes, b.down_proj.codes) << "layer " << l;
    EXPECT_EQ(a.down_proj.scales, b.down_proj.scales) << "layer " << l;
  }

  int compared = 0, expected_compared = 0;
  for (const std::string& name : qspec::run_mode_names()) {
    const qspec::RunMode mode = mode_named(name);
    expected_compared += mode.quantized_weights && (v.arc || !mode.activations.arc);
    if (!mode.quantized_weights) {
      // w16a16 needs the 16-bit projections, which a 4-bit checkpoint does not have.
      const std::string message = error_of([&] { logits_of(*reloaded, mode); });
      EXPECT_NE(message.find("16-bit weights"), std::string::npos) << message;
      EXPECT_NE(message.find("w16a16"), std::string::npos) << message;
      continue;
    }
    if (mode.activations.arc && !v.arc) {
      EXPECT_THROW(logits_of(*model, mode), qspec::Error) << name;
      const std::string message = error_of([&] { logits_of(*reloaded, mode); });
      EXPECT_NE(message.find("needs ARC calibration"), std::string::npos) << name << ": " << message;
      continue;
    }
    const std::vector<float> expected = logits_of(*model, mode);
    const std::vector<float> got = logits_of(*reloaded, mode);
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (float value : got) ASSERT_TRUE(std::isfinite(value)) << name;
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << name << ": logits of the reloaded checkpoint differ from the in-memory model";
    ++compared;
  }
  EXPECT_EQ(compared, expected_compared);
  EXPECT_GE(compared, v.arc ? 9 : 6);  // w4a16, w4a8, w4a8-fp8, w4a4-{int4,nvfp4,mxfp4}[, -arc x3]
}

INSTANTIATE_TEST_SUITE_P(QuantCheckpoint, QuantCheckpointRoundTrip,
                         ::testing::Values(Variant{Format::int4, "rtn", false},
                                           Variant{Format::int4, "rtn", true}, Variant{Format::int4, "gptq", true},
                                           Variant{Format::nvfp4, "rtn", false}, Variant{Format::nvfp4, "gptq", true},
                                           Variant{Format::mxfp4, "rtn", true}, Variant{Format::mxfp4, "gptq", false},
                                           Variant{Format::int4_channel, "rtn", false},
                                           Variant{Format::int4_channel, "gptq", false},
                                           Variant{Format::int4_asym, "rtn", false},
                                           Variant{Format::int4_asym, "rtn", true}, Variant{Format::int4_asym, "gptq", true},
                                           Variant{Format::int4_zp, "rtn", false}, Variant{Format::int4_zp, "gptq", true}),
                         [](const ::testing::TestParamInfo<Variant>& info) { return variant_name(info.param); });

TEST(QuantCheckpoint, SaveRefusesAnExistingDirectoryAndAModelWithoutFourBitWeights) {
  ScratchDir scratch("save");
  auto model = qspec::LlamaModel::load(kModel);
  const std::string message = error_of([&] { model->save_quantized((scratch.path() / "out").string()); });
  EXPECT_NE(message.find("no 4-bit weights"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(scratch.path() / "out"));

  qspec::quantize_model(*model, {}, nullptr);
  const fs::path existing = scratch.path() / "existing";
  fs::create_directories(existing);
  std::ofstream(existing / "keep.txt") << "precious";
  const std::string exists = error_of([&] { model->save_quantized(existing.string()); });
  EXPECT_NE(exists.find("already exists"), std::string::npos) << exists;
  EXPECT_EQ(slurp(existing / "keep.txt"), "precious");
  EXPECT_EQ(std::distance(fs::directory_iterator(existing), fs::directory_iterator()), 1);

  const fs::path orphan = scratch.path() / "no" / "such" / "parent";
  const std::string parent = error_of([&] { model->save_quantized(orphan.string()); });
  EXPECT_NE(parent.find("does not exist"), std::string::npos) << parent;
  EXPECT_FALSE(fs::exists(scratch.path() / "no"));
  EXPECT_TRUE(partial_siblings(scratch.path()).empty());
}

TEST(QuantCheckpoint, QuantizingAFourBitCheckpointAgainIsAnError) {
  ScratchDir scratch("twice");
  auto model = quantized_model({Format::nvfp4, "rtn", false});
  model->save_quantized((scratch.path() / "ckpt").string());
  auto reloaded = qspec::LlamaModel::load((scratch.path() / "ckpt").string());
  const std::string message = error_of([&] { qspec::quantize_model(*reloaded, {}, nullptr); });
  EXPECT_NE(message.find("4-bit weights already"), std::string::npos) << message;
  EXPECT_EQ(reloaded->quantized_format(), "nvfp4 rtn");  // unchanged
}

// --- Inconsistent checkpoints ----------------------------------------------------------------

// Good checkpoints (int4 RTN + ARC, nvfp4 RTN, mxfp4 RTN), each made once, when a test of the
// suite first needs it (ctest runs every test in its own process); each test edits a copy.
class QuantCheckpointCorrupt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = new ScratchDir("corrupt-suite"); }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }

  void SetUp() override { scratch_ = std::make_unique<ScratchDir>("corrupt"); }
  void TearDown() override { scratch_.reset(); }

  // A fresh writable copy of the good checkpoint `kind` (replacing an earlier one).
  fs::path copy_of(const std::string& kind) {
    const fs::path good = root_->path() / kind;
    if (!fs::exists(good)) {
      const Variant variant = kind == "int4"    ? Variant{Format::int4, "rtn", true}
                              : kind == "nvfp4" ? Variant{Format::nvfp4, "rtn", false}
                                                : Variant{Format::mxfp4, "rtn", false};
      quantized_model(variant)->save_quantized(good.string());
    }
    const fs::path dir = scratch_->path() / kind;
    fs::remove_all(dir);
    fs::copy(root_->path() / kind, dir);
    return dir;
  }

  static void edit_manifest(const fs::path& dir, const std::function<void(json&)>& edit) {
    json manifest = json::parse(slurp(dir / qspec::kQuantManifestFile));
    edit(manifest);
    std::ofstream(dir / qspec::kQuantManifestFile) << manifest.dump(2);
  }

  struct Tensor {
    qspec::DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  using Tensors = std::map<std::string, Tensor>;

  // Reads every tensor of DIR/model.safetensors, lets `edit` change them, writes them back.
  static void edit_tensors(const fs::path& dir, const std::function<void(Tensors&)>& edit) {
    Tensors tensors;
    std::map<std::string, std::string> metadata;
    {
      const qspec::Checkpoint checkpoint = qspec::Checkpoint::open(dir.string());
      metadata = checkpoint.metadata();
      for (const std::string& name : checkpoint.names()) {
        const qspec::TensorView& view = checkpoint.get(name);
        tensors[name] = {view.dtype, view.shape, std::vector<uint8_t>(view.data, view.data + view.nbytes)};
      }
    }  // unmapped before the file is rewritten
    edit(tensors);
    qspec::SafetensorsWriter writer;
    for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
    for (const auto& [name, tensor] : tensors)
      writer.add(name, tensor.dtype, tensor.shape, tensor.bytes.data(), tensor.bytes.size());
    writer.write((dir / "model.safetensors").string());
  }

  static Tensor& tensor(Tensors& tensors, const std::string& name) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("test setup: no tensor " + name);
    return it->second;
  }

  // Loading DIR throws a qspec::Error whose message holds every needle.
  static void expect_load_error(const fs::path& dir, const std::vector<std::string>& needles) {
    const std::string message = error_of([&] { qspec::LlamaModel::load(dir.string()); });
    EXPECT_EQ(message.find("<no error>"), std::string::npos) << "loaded " << dir;
    EXPECT_EQ(message.find("<not a qspec::Error>"), std::string::npos) << message;
    for (const std::string& needle : needles)
      EXPECT_NE(message.find(needle), std::string::npos) << "expected '" << needle << "' in: " << message;
  }

  static ScratchDir* root_;
  std::unique_ptr<ScratchDir> scratch_;
};

ScratchDir* QuantCheckpointCorrupt::root_ = nullptr;

namespace {
const std::string kDownQcodes = "model.layers.3.mlp.down_proj.weight.qcodes";
const std::string kKQscales = "model.layers.1.self_attn.k_proj.weight.qscales";
const std::string kArcOrder = "model.layers.2.arc.mlp_in.order";
}  // namespace

TEST_F(QuantCheckpointCorrupt, TheGoodCheckpointsLoad) {
  for (const char* kind : {"int4", "nvfp4", "mxfp4"}) {
    const fs::path dir = copy_of(kind);
    edit_tensors(dir, [](Tensors&) {});  // the rewrite alone changes nothing
    EXPECT_NO_THROW(qspec::LlamaModel::load(dir.string())) << kind;
  }
}

TEST_F(QuantCheckpointCorrupt, ManifestNotJson) {
  const fs::path dir = copy_of("int4");
  std::ofstream(dir / qspec::kQuantManifestFile) << "{\"qspec_quantization\": 1, \"format\": ";
  expect_load_error(dir, {qspec::kQuantManifestFile, "not valid JSON"});
  std::ofstream(dir / qspec::kQuantManifestFile) << "[1, 2]";
  expect_load_error(dir, {qspec::kQuantManifestFile, "JSON object"});
}

TEST_F(QuantCheckpointCorrupt, ManifestWrongVersion) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) { m["qspec_quantization"] = 2; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "version 2 is not supported"});
  edit_manifest(dir, [](json& m) { m.erase("qspec_quantization"); });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"qspec_quantization\""});
}

TEST_F(QuantCheckpointCorrupt, ManifestUnknownOrNonWeightFormat) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) { m["format"] = "int3"; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"format\"", "int3"});
  edit_manifest(dir, [](json& m) { m["format"] = "fp8"; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"format\"", "not a weight format"});
  edit_manifest(dir, [](json& m) { m["format"] = 4; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"format\""});
}

TEST_F(QuantCheckpointCorrupt, ManifestUnknownMethod) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) { m["method"] = "awq"; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"method\"", "awq"});
}

TEST_F(QuantCheckpointCorrupt, ManifestGroupSizeMissingOrWrong) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) { m.erase("group_size"); });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"group_size\""});
  edit_manifest(dir, [](json& m) { m["group_size"] = "64"; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"group_size\""});
  edit_manifest(dir, [](json& m) { m["group_size"] = 32; });  // the scales were written for 64
  expect_load_error(dir, {".qscales", "has shape"});
  edit_manifest(dir, [](json& m) { m["group_size"] = 0; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "group_size 0"});
}

TEST_F(QuantCheckpointCorrupt, MissingCodesTensor) {
  const fs::path dir = copy_of("int4");
  edit_tensors(dir, [](Tensors& t) { t.erase(kDownQcodes); });
  expect_load_error(dir, {dir.string(), "'" + kDownQcodes + "' is missing"});
}

TEST_F(QuantCheckpointCorrupt, MissingTensorScale) {
  const fs::path dir = copy_of("nvfp4");
  const std::string name = "model.layers.0.mlp.up_proj.weight.tensor_scale";
  edit_tensors(dir, [&](Tensors& t) { t.erase(name); });
  expect_load_error(dir, {"'" + name + "' is missing"});
}

TEST_F(QuantCheckpointCorrupt, ScalesWithTheWrongShape) {
  const fs::path dir = copy_of("int4");
  edit_tensors(dir, [](Tensors& t) {
    Tensor& scales = tensor(t, kKQscales);
    scales.shape[0] /= 2;  // half the rows
    scales.bytes.resize(scales.bytes.size() / 2);
  });
  expect_load_error(dir, {"'" + kKQscales + "' has shape"});
}

TEST_F(QuantCheckpointCorrupt, TensorsWithTheWrongDtype) {
  const fs::path dir = copy_of("int4");
  edit_tensors(dir, [](Tensors& t) { tensor(t, kDownQcodes).dtype = qspec::DType::I8; });
  expect_load_error(dir, {"'" + kDownQcodes + "' has dtype I8, expected U8"});
}

TEST_F(QuantCheckpointCorrupt, ArcOrderWithTheWrongDtype) {
  const fs::path dir = copy_of("int4");
  edit_tensors(dir, [](Tensors& t) { tensor(t, kArcOrder).dtype = qspec::DType::F32; });
  expect_load_error(dir, {"'" + kArcOrder + "' has dtype F32, expected I32"});
}

TEST_F(QuantCheckpointCorrupt, ArcOrderThatIsNotAPermutation) {
  const fs::path dir = copy_of("int4");
  edit_tensors(dir, [](Tensors& t) {
    int32_t* order = reinterpret_cast<int32_t*>(tensor(t, kArcOrder).bytes.data());
    order[5] = order[4];  // a duplicate (and one channel never read)
  });
  expect_load_error(dir, {kArcOrder, "not a permutation"});
}

TEST_F(QuantCheckpointCorrupt, ArcOrderOutOfRange) {
  const fs::path dir = copy_of("int4");
  edit_tensors(dir, [](Tensors& t) {
    int32_t* order = reinterpret_cast<int32_t*>(tensor(t, kArcOrder).bytes.data());
    order[0] = 1 << 20;  // would read far past the site's input row
  });
  expect_load_error(dir, {kArcOrder, "not a permutation"});
  edit_tensors(dir, [](Tensors& t) { reinterpret_cast<int32_t*>(tensor(t, kArcOrder).bytes.data())[0] = -1; });
  expect_load_error(dir, {kArcOrder, "not a permutation"});
}

TEST_F(QuantCheckpointCorrupt, ArcOrderMissingOrWrongLength) {
  const fs::path dir = copy_of("int4");
  edit_tensors(dir, [](Tensors& t) { t.erase(kArcOrder); });
  expect_load_error(dir, {"'" + kArcOrder + "' is missing"});
  copy_of("int4");
  edit_tensors(dir, [](Tensors& t) {
    Tensor& order = tensor(t, kArcOrder);
    order.shape[0] -= 1;
    order.bytes.resize(order.bytes.size() - 4);
  });
  expect_load_error(dir, {"'" + kArcOrder + "' has shape [255]"});
}

TEST_F(QuantCheckpointCorrupt, ArcSitesCountMismatch) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) { m["details"]["arc"]["sites"].erase(m["details"]["arc"]["sites"].size() - 1); });
  expect_load_error(dir, {qspec::kQuantManifestFile, "details.arc.sites must list 32 sites"});
}

TEST_F(QuantCheckpointCorrupt, ArcSiteListedTwiceOrMalformed) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) {
    json& sites = m["details"]["arc"]["sites"];
    sites[1] = sites[0];
  });
  expect_load_error(dir, {qspec::kQuantManifestFile, "listed twice"});
  copy_of("int4");
  edit_manifest(dir, [](json& m) { m["details"]["arc"]["sites"][0]["site"] = "lm_head"; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "unknown ARC site 'lm_head'"});
  copy_of("int4");
  edit_manifest(dir, [](json& m) { m["details"]["arc"]["sites"][0]["layer"] = 99; });
  expect_load_error(dir, {qspec::kQuantManifestFile, "layer 99 out of range"});
  copy_of("int4");
  edit_manifest(dir, [](json& m) { m["details"]["arc"]["sites"][0].erase("tail"); });
  expect_load_error(dir, {qspec::kQuantManifestFile, "\"tail\""});
}

TEST_F(QuantCheckpointCorrupt, ArcTailDisagreesWithTheCodes) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) {
    for (json& site : m["details"]["arc"]["sites"])
      if (site["layer"] == 0 && site["site"] == "attn_in") site["tail"] = site["tail"].get<int64_t>() + 64;
  });
  expect_load_error(dir, {"model.layers.0.self_attn.q_proj.weight.qcodes", "has shape"});
}

TEST_F(QuantCheckpointCorrupt, ArcResidualChannelsExceedTheTail) {
  const fs::path dir = copy_of("int4");
  edit_manifest(dir, [](json& m) {
    json& site = m["details"]["arc"]["sites"][3];
    site["outliers_nvfp4"] = site["tail"].get<int64_t>() + 16;
  });
  expect_load_error(dir, {qspec::kQuantManifestFile, "exceeds the"});
}

TEST_F(QuantCheckpointCorrupt, SixteenBitProjectionAlongsideTheCodes) {
  const fs::path dir = copy_of("int4");
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  edit_tensors(dir, [&](Tensors& t) { t[name] = {qspec::DType::BF16, {256, 256}, std::vector<uint8_t>(256 * 256 * 2)}; });
  expect_load_error(dir, {"'" + name + "' is a 16-bit projection", "inconsistent"});
}

TEST_F(QuantCheckpointCorrupt, ManifestMissingOnAFourBitCheckpoint) {
  const fs::path dir = copy_of("int4");
  fs::remove(dir / qspec::kQuantManifestFile);
  expect_load_error(dir, {"model.layers.0.self_attn.q_proj.weight"});
}

TEST_F(QuantCheckpointCorrupt, Nvfp4TensorScaleZeroNegativeOrNotFinite) {
  const std::string name = "model.layers.5.self_attn.o_proj.weight.tensor_scale";
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const fs::path dir = copy_of("nvfp4");
    edit_tensors(dir, [&](Tensors& t) { std::memcpy(tensor(t, name).bytes.data(), &bad, 4); });
    expect_load_error(dir, {"'" + name + "' must be positive and finite"});
  }
}

TEST_F(QuantCheckpointCorrupt, Nvfp4NanBlockScale) {
  const std::string name = "model.layers.4.mlp.gate_proj.weight.qscales";
  // E4M3 0x7f and 0xff are NaN; 0xb8 is -1.0.
  for (uint8_t code : {uint8_t{0x7f}, uint8_t{0xff}, uint8_t{0xb8}}) {
    const fs::path dir = copy_of("nvfp4");
    edit_tensors(dir, [&](Tensors& t) { tensor(t, name).bytes[37] = code; });
    expect_load_error(dir, {dir.string(), "'" + name + "'", code == 0xb8 ? "negative" : "not finite"});
  }
}

TEST_F(QuantCheckpointCorrupt, Mxfp4NanBlockScale) {
  const fs::path dir = copy_of("mxfp4");
  const std::string name = "model.layers.6.mlp.down_proj.weight.qscales";
  edit_tensors(dir, [&](Tensors& t) { tensor(t, name).bytes[3] = 0xff; });  // NaN in E8M0
  expect_load_error(dir, {name, "NaN"});
}

TEST_F(QuantCheckpointCorrupt, ManifestFormatDisagreesWithTheTensors) {
  const fs::path dir = copy_of("nvfp4");
  edit_manifest(dir, [](json& m) { m["format"] = "mxfp4"; });
  expect_load_error(dir, {".qscales", "has shape"});
}

// --- qspec info (a GPTQ checkpoint's: QuantizeCli.GptqArcRunLoadsAndEvaluates) --------------------------------------------------------------------------------

TEST_F(QuantCheckpointCorrupt, InfoPrintsTheQuantization) {
  const fs::path dir = copy_of("int4");
  const fs::path out = scratch_->path() / "info.out";
  const std::string command =
      std::string(QSPEC_BINARY) + " info '" + dir.string() + "' >'" + out.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(out);
  const std::string text = slurp(out);
  EXPECT_NE(text.find("quantization:   int4 g64 rtn + arc, "), std::string::npos) << text;
  EXPECT_NE(text.find("MiB of quantized projections"), std::string::npos) << text;
  EXPECT_NE(text.find("calibration:    " + kCalibration + ", 4 sequences"), std::string::npos) << text;
  EXPECT_NE(text.find("arc:            tau 0.125 x max"), std::string::npos) << text;
  EXPECT_EQ(text.find("gptq:"), std::string::npos) << text;  // QuantizeCli.GptqArcRun... has the GPTQ line

  const fs::path nvfp4 = copy_of("nvfp4");
  const std::string plain =
      std::string(QSPEC_BINARY) + " info '" + nvfp4.string() + "' >'" + out.string() + "' 2>&1";
  const int plain_status = std::system(plain.c_str());
  ASSERT_TRUE(WIFEXITED(plain_status) && WEXITSTATUS(plain_status) == 0) << slurp(out);
  const std::string plain_text = slurp(out);
  EXPECT_NE(plain_text.find("quantization:   nvfp4 rtn, "), std::string::npos) << plain_text;
  EXPECT_EQ(plain_text.find("arc:"), std::string::npos) << plain_text;
  EXPECT_EQ(plain_text.find("gptq:"), std::string::npos) << plain_text;
}
