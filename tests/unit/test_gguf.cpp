// GGUF reader and importer. Fixtures in tests/data/gguf come from
// tools/make_gguf_fixtures.py (llama.cpp's `gguf` package): dequantized values are compared
// bit for bit with the package's own dequantize. Malformed files are built here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/dtype.h"
#include "io/convert.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/quant_checkpoint.h"
#include "qspec/error.h"
#include "quant/formats.h"
#include "quant/quantized_linear.h"
#include "tokenizer/tokenizer.h"
#include "cli_run.h"  // error_of

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kData = QSPEC_TEST_DATA "/gguf";

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("qspec-gguf-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

using qspec_test::error_of;

std::string parse_error(const std::vector<uint8_t>& bytes) {
  return error_of([&] { qspec::GgufFile::parse(bytes.data(), bytes.size(), "test.gguf"); });
}

bool same_bits(const float* a, const float* b, size_t n, size_t* first_diff) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) {
      *first_diff = i;
      return false;
    }
  }
  return true;
}

// Builds GGUF files byte by byte, including malformed ones.
// Deterministic random blocks of a 4-bit ggml type (Q4_0, Q4_1, Q4_K) for `count` values, with
// moderate finite f16 scales of either sign (ggml's own Q4_0 stores negative ones).
std::vector<uint8_t> random_4bit_blocks(uint32_t type, uint64_t count, uint32_t seed) {
  const qspec::GgmlTypeInfo* info = qspec::ggml_type_info(type);
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(count / info->block_size * info->type_size);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  auto put_f16 = [&](size_t at, float value) {
    const uint16_t half = qspec::f32_to_f16(value);
    std::memcpy(bytes.data() + at, &half, 2);
  };
  for (size_t block = 0; block < bytes.size(); block += info->type_size) {
    if (type == static_cast<uint32_t>(qspec::GgmlType::Q6_K)) {  // ql, qh, scales, then d
      put_f16(block + 208, scale(rng));
      continue;
    }
    put_f16(block, scale(rng));                                       // d
    if (info->type_size != 18) put_f16(block + 2, scale(rng) * 4.0f);  // Q4_1 m, Q4_K dmin (Q5_0 qh, Q8_0 codes)
  }
  return bytes;
}

// Bit equality, except that with `zero_sign_free` a +0 may stand for a -0: int4-asym decodes
// fma(code, d, -8d), whose exact zero (Q4_0's code 8) is +0 where ggml's d * 0 is -0 under a
// negative d. Equal as numbers; only the sign of a zero result can follow it.
bool same_bits_up_to_zero_sign(const float* a, const float* b, size_t n, bool zero_sign_free, size_t* first_diff) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) == 0 || (zero_sign_free && a[i] == 0.0f && b[i] == 0.0f)) continue;
    *first_diff = i;
    return false;
  }
  return true;
}

class GgufBuilder {
 public:
  uint32_t version = 3;
  uint32_t alignment = 32;
  std::optional<uint64_t> kv_count_override, tensor_count_override;

  void raw_kv(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
    ++kv_count_;
    put_string(kv_, key);
    put(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
  }
  void kv_string(const std::string& key, const std::string& value) {
    std::vector<uint8_t> bytes;
    put_string(bytes, value);
    raw_kv(key, 8, bytes);
  }
  void kv_u32(const std::string& key, uint32_t value) { raw_kv(key, 4, pod(value)); }
  void kv_f32(const std::string& key, float value) { raw_kv(key, 6, pod(value)); }
  void kv_bool(const std::string& key, bool value) { raw_kv(key, 7, {static_cast<uint8_t>(value)}); }
  void kv_strings(const std::string& key, const std::vector<std::string>& values) {
    std::vector<uint8_t> bytes;
    put(bytes, uint32_t{8});
    put(bytes, static_cast<uint64_t>(values.size()));
    for (const auto& value : values) put_string(bytes, value);
    raw_kv(key, 9, bytes);
  }
  void kv_i32s(const std::string& key, const std::vector<int32_t>& values) {
    std::vector<uint8_t> bytes;
    put(bytes, uint32_t{5});
    put(bytes, static_cast<uint64_t>(values.size()));
    for (int32_t value : values) put(bytes, value);
    raw_kv(key, 9, bytes);
  }
  void kv_f32s(const std::string& key, const std::vector<float>& values) {
    std::vector<uint8_t> bytes;
    put(bytes, uint32_t{6});
    put(bytes, static_cast<uint64_t>(values.size()));
    for (float value : values) put(bytes, value);
    raw_kv(key, 9, bytes);
  }
  // dims in ggml order (dims[0] = row length).
  void tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, std::vector<uint8_t> data,
              std::optional<uint64_t> offset_override = std::nullopt) {
    tensors_.push_back({name, std::move(dims), type, std::move(data), offset_override});
  }
  void tensor_f32(const std::string& name, std::vector<uint64_t> dims, const std::vector<float>& values) {
    std::vector<uint8_t> data(values.size() * 4);
    std::memcpy(data.data(), values.data(), data.size());
    tensor(name, std::move(dims), 0, std::move(data));
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    put(out, version);
    put(out, tensor_count_override.value_or(tensors_.size()));
    put(out, kv_count_override.value_or(kv_count_));
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      put_string(out, t.name);
      put(out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put(out, d);
      put(out, t.type);
      uint64_t at = t.offset_override.value_or(offset);
      put(out, at);
      offsets.push_back(at);
      offset = (at + t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment != 0) out.push_back(0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].offset_override) continue;  // a lying offset: no data behind it
      const size_t at = data_start + offsets[i];
      if (out.size() < at + tensors_[i].data.size()) out.resize(at + tensors_[i].data.size(), 0);
      if (!tensors_[i].data.empty()) std::memcpy(out.data() + at, tensors_[i].data.data(), tensors_[i].data.size());
    }
    while (out.size() % alignment != 0) out.push_back(0);
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset_override;
  };
  template <typename T>
  static std::vector<uint8_t> pod(T value) {
    std::vector<uint8_t> bytes(sizeof(T));
    std::memcpy(bytes.data(), &value, sizeof(T));
    return bytes;
  }
  template <typename T>
  static void put(std::vector<uint8_t>& out, T value) {
    auto bytes = pod(value);
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  static void put_string(std::vector<uint8_t>& out, const std::string& text) {
    put(out, static_cast<uint64_t>(text.size()));
    out.insert(out.end(), text.begin(), text.end());
  }
  uint64_t kv_count_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<Tensor> tensors_;
};

// A 1-layer llama with F32 tensors and a sentencepiece ("llama") tokenizer, no output tensor.
// dim 8, 2 heads of 4, 1 kv head, ffn 8 (or `shape`). Values: tensor index * 1000 + element index;
// with shape.projection_type, the seven projections are random blocks of that 4-bit type.
struct SpmShape {
  uint64_t dim = 8, ffn = 8, heads = 2, kv_heads = 1, head_dim = 4;
  uint32_t projection_type = 0;  // 0: F32
  std::string f32_projection;     // with projection_type: this projection stays F32 (a mixed file)
};
struct SpmLlama {
  static constexpr int kDim = 8, kFfn = 8, kHeads = 2, kKvHeads = 1, kHeadDim = 4;
  using Shape = SpmShape;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  std::map<std::string, std::vector<float>> values;  // by GGUF name
  GgufBuilder builder;

  // block_count: the declared layers (only layer 0's tensors are written).
  explicit SpmLlama(const std::string& arch = "llama", uint32_t q_type = 0, uint32_t block_count = 1,
                    const Shape& shape = Shape()) {
    const uint64_t kDim = shape.dim, kFfn = shape.ffn, kHeads = shape.heads, kKvHeads = shape.kv_heads,
                   kHeadDim = shape.head_dim;
    const std::string sp = "\xe2\x96\x81";
    tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "<0x41>", sp, "t", "h", "e", sp + "t", "he", sp + "the", "th",
              "<|user|>", "x"};
    scores = {0, 0, 0, 0, 0, -10, -11, -12, -13, -1, -2, -3, -4, 0, -14};
    types = {2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1};
    builder.kv_string("general.architecture", arch);
    builder.kv_u32("general.alignment", 32);
    builder.kv_u32(arch + ".block_count", block_count);
    builder.kv_u32(arch + ".context_length", 64);
    builder.kv_u32(arch + ".embedding_length", kDim);
    builder.kv_u32(arch + ".feed_forward_length", kFfn);
    builder.kv_u32(arch + ".attention.head_count", kHeads);
    builder.kv_u32(arch + ".attention.head_count_kv", kKvHeads);
    builder.kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
    builder.kv_f32(arch + ".rope.freq_base", 10000.0f);
    builder.kv_string("tokenizer.ggml.model", "llama");
    builder.kv_strings("tokenizer.ggml.tokens", tokens);
    builder.kv_f32s("tokenizer.ggml.scores", scores);
    builder.kv_i32s("tokenizer.ggml.token_type", types);
    builder.kv_u32("tokenizer.ggml.bos_token_id", 1);
    builder.kv_u32("tokenizer.ggml.eos_token_id", 2);
    builder.kv_u32("tokenizer.ggml.unknown_token_id", 0);
    builder.kv_bool("tokenizer.ggml.add_bos_token", true);
    const uint64_t V = tokens.size();
    struct T {
      std::string name;
      std::vector<uint64_t> dims;
    };
    std::vector<T> list = {{"token_embd.weight", {kDim, V}},
                           {"blk.0.attn_norm.weight", {kDim}},
                           {"blk.0.attn_q.weight", {kDim, kHeads * kHeadDim}},
                           {"blk.0.attn_k.weight", {kDim, kKvHeads * kHeadDim}},
                           {"blk.0.attn_v.weight", {kDim, kKvHeads * kHeadDim}},
                           {"blk.0.attn_output.weight", {kHeads * kHeadDim, kDim}},
                           {"blk.0.ffn_norm.weight", {kDim}},
                           {"blk.0.ffn_gate.weight", {kDim, kFfn}},
                           {"blk.0.ffn_up.weight", {kDim, kFfn}},
                           {"blk.0.ffn_down.weight", {kFfn, kDim}},
                           {"output_norm.weight", {kDim}}};
    for (size_t t = 0; t < list.size(); ++t) {
      uint64_t n = 1;
      for (uint64_t d : list[t].dims) n *= d;
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(t * 1000 + i);
      values[list[t].name] = v;
      const bool projection = list[t].name.starts_with("blk.0.") && list[t].name.find("norm") == std::string::npos;
      if (list[t].name == "blk.0.attn_q.weight" && q_type != 0) {
        builder.tensor(list[t].name, list[t].dims, q_type, std::vector<uint8_t>(n * 4, 0));
      } else if (projection && shape.projection_type != 0 && list[t].name != shape.f32_projection) {
        builder.tensor(list[t].name, list[t].dims, shape.projection_type,
                       random_4bit_blocks(shape.projection_type, n, static_cast<uint32_t>(t)));
      } else {
        builder.tensor_f32(list[t].name, list[t].dims, v);
      }
    }
  }
};

}  // namespace

TEST(Gguf, DequantizesEveryTypeBitExactly) {
  auto file = qspec::GgufFile::open(kData + "/quant-types.gguf");
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->alignment(), 32u);
  EXPECT_EQ(file->get_string("general.architecture"), "test");
  auto expected = qspec::SafetensorsFile::open(kData + "/quant-types.expected.safetensors");
  std::vector<std::string> seen;
  for (const auto& tensor : file->tensors()) {
    SCOPED_TRACE(tensor.name);
    seen.push_back(qspec::ggml_type_name(tensor.type));
    const qspec::TensorView* want = expected->find(tensor.name);
    ASSERT_NE(want, nullptr);
    EXPECT_EQ(tensor.shape(), want->shape);
    std::vector<float> got = file->dequantize(tensor);
    ASSERT_EQ(got.size() * 4, want->nbytes);
    size_t diff = 0;
    EXPECT_TRUE(same_bits(got.data(), reinterpret_cast<const float*>(want->data), got.size(), &diff))
        << "first difference at element " << diff << ": " << got[diff] << " vs "
        << reinterpret_cast<const float*>(want->data)[diff];
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}));
}

// Q5_0 (Gemma 3 270M's Q4_K_M file has 81 such tensors): two blocks that gguf.quants
// quantized from random values, and their values as gguf.quants.dequantize gives them,
// bit for bit (the -0.0 of a zero code under a negative scale included).
TEST(Gguf, DequantizesQ5_0LikeTheGgufPackage) {
  const std::vector<uint8_t> blocks = {
      218, 44, 56, 103, 32, 131, 249, 84, 174, 180, 154, 81, 251, 185, 71, 143, 19, 229, 119, 239, 66, 0,
      207, 174, 191, 244, 235, 192, 32, 34, 167, 131, 183, 121, 47, 103, 104, 203, 13, 206, 167, 160, 64, 13};
  const std::vector<float> expected = {
      -0.5306396484375f, -0.90966796875f, -0.151611328125f, 0.30322265625f, 0.758056640625f, 0.0758056640625f,
      -0.3790283203125f, -0.5306396484375f, 0.5306396484375f, 1.1370849609375f, 0.2274169921875f, -0.8338623046875f,
      -0.6822509765625f, 1.1370849609375f, 0.151611328125f, -1.212890625f, -0.0758056640625f, -0.8338623046875f,
      -0.454833984375f, -0.3790283203125f, -0.5306396484375f, 0.3790283203125f, -0.0758056640625f,
      -0.3790283203125f, 0.30322265625f, 0.6064453125f, -1.1370849609375f, -0.151611328125f, -0.6822509765625f,
      -0.151611328125f, -0.90966796875f, 0.0f, -0.0f, -0.2127685546875f, -0.74468994140625f, -0.31915283203125f,
      -0.74468994140625f, -0.95745849609375f, 0.10638427734375f, -0.74468994140625f, 0.85107421875f,
      0.53192138671875f, -1.38299560546875f, 0.2127685546875f, -0.74468994140625f, -0.0f, -0.0f,
      -1.38299560546875f, -0.2127685546875f, -0.2127685546875f, 0.6383056640625f, -0.85107421875f,
      0.53192138671875f, -0.74468994140625f, -0.2127685546875f, -0.6383056640625f, 1.0638427734375f,
      0.425537109375f, 1.7021484375f, 0.425537109375f, 0.6383056640625f, 0.6383056640625f, -0.425537109375f, -0.0f};
  std::vector<float> got(64, NAN);
  qspec::gguf_dequantize(/*Q5_0*/ 6, blocks.data(), 64, got.data());
  size_t diff = 0;
  EXPECT_TRUE(same_bits(got.data(), expected.data(), got.size(), &diff))
      << "first difference at element " << diff << ": " << got[diff] << " vs " << expected[diff];
}

TEST(Gguf, FourBitBlocksBecomeInt4AsymWeightsBitExactly) {
  // The gguf package's dequantization of Q4_0 / Q4_1 / Q4_K (the fixture's references) equals the
  // int4-asym rows the blocks become, through the format reference and the engine's decoder.
  auto file = qspec::GgufFile::open(kData + "/quant-types.gguf");
  auto expected = qspec::SafetensorsFile::open(kData + "/quant-types.expected.safetensors");
  int imported = 0;
  for (const auto& tensor : file->tensors()) {
    SCOPED_TRACE(tensor.name);
    const std::vector<int64_t> shape = tensor.shape();
    if (!qspec::gguf_int4_asym_type(tensor.type)) {
      if (tensor.type != 0) {  // F32 has no blocks at all; the others are the wrong kind of block
        std::vector<uint8_t> codes(shape[0] * shape[1] / 2), scales(shape[0] * shape[1] / 4);
        const std::string error = error_of([&] {
          qspec::gguf_to_int4_asym(tensor.type, tensor.data, shape[0], shape[1], codes.data(), scales.data());
        });
        EXPECT_NE(error.find(qspec::ggml_type_name(tensor.type)), std::string::npos) << error;
      }
      continue;
    }
    ++imported;
    qspec::QuantizedMatrix m;
    m.rows = shape[0];
    m.format = qspec::quant::make_row_format(qspec::quant::Format::int4_asym, qspec::quant::Role::weight, shape[1],
                                             qspec::kGgufInt4AsymGroup);
    m.codes.resize(m.rows * m.format.code_bytes());
    m.scales.resize(m.rows * m.format.scale_bytes());
    qspec::gguf_to_int4_asym(tensor.type, tensor.data, m.rows, shape[1], m.codes.data(), m.scales.data());
    m.prepare();
    const float* want = reinterpret_cast<const float*>(expected->find(tensor.name)->data);
    std::vector<float> reference(shape[1]), fast(shape[1]);
    for (int64_t r = 0; r < m.rows; ++r) {
      qspec::quant::dequantize_row(m.format, m.codes.data() + r * m.format.code_bytes(),
                                   m.scales.data() + r * m.format.scale_bytes(), reference.data());
      m.dequantize_row(r, fast.data());
      size_t diff = 0;
      const bool q4_0 = tensor.type == static_cast<uint32_t>(qspec::GgmlType::Q4_0);
      EXPECT_TRUE(same_bits_up_to_zero_sign(reference.data(), want + r * shape[1], shape[1], q4_0, &diff))
          << "row " << r << " element " << diff << ": " << reference[diff] << " vs " << want[r * shape[1] + diff];
      EXPECT_TRUE(same_bits_up_to_zero_sign(fast.data(), want + r * shape[1], shape[1], q4_0, &diff))
          << "row " << r << " element " << diff;
    }
  }
  EXPECT_EQ(imported, 3);
}

TEST(Gguf, KeepFourBitWritesAnInt4AsymCheckpointEqualToTheF32Conversion) {
  using qspec::GgmlType;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K}) {
    SCOPED_TRACE(qspec::ggml_type_name(static_cast<uint32_t>(type)));
    // dim 256 (a Q4_K super-block), 4 heads of 64, 2 kv heads: q/k rows move.
    SpmLlama model("llama", 0, 1, {256, 256, 4, 2, 64, static_cast<uint32_t>(type)});
    fs::path dir = temp_dir("keep4");
    write_bytes(dir / "m.gguf", model.builder.build());
    qspec::convert_gguf((dir / "m.gguf").string(), (dir / "f32").string());
    qspec::GgufConvertOptions options;
    options.keep_4bit = true;
    qspec::convert_gguf((dir / "m.gguf").string(), (dir / "q4").string(), {}, options);

    const json manifest = read_json(dir / "q4" / qspec::kQuantManifestFile);
    EXPECT_EQ(manifest["format"], "int4-asym");
    EXPECT_EQ(manifest["group_size"], 32);
    EXPECT_EQ(manifest["method"], "gguf");
    auto f32 = qspec::SafetensorsFile::open((dir / "f32" / "model.safetensors").string());
    auto q4 = qspec::LlamaModel::load((dir / "q4").string());
    ASSERT_TRUE(q4->has_quantized_weights());
    EXPECT_FALSE(q4->has_checkpoint_weights());
    EXPECT_EQ(q4->quantized_format(), "int4-asym g32 gguf");
    // Every projection (q / k rows permuted like the F32 path) decodes to the F32 conversion's
    // values, which DequantizesEveryTypeBitExactly ties to the gguf package.
    const qspec::QuantizedLayerWeights& layer = q4->quantized_layers()[0];
    int compared = 0;
    for (const qspec::QuantizedMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                            &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      SCOPED_TRACE(m->name);
      const qspec::TensorView* want = f32->find(m->name);
      ASSERT_NE(want, nullptr);
      ASSERT_EQ(want->nbytes, static_cast<size_t>(m->rows * m->cols() * 4));
      std::vector<float> row(m->cols());
      for (int64_t r = 0; r < m->rows; ++r) {
        m->dequantize_row(r, row.data());
        size_t diff = 0;
        ASSERT_TRUE(same_bits_up_to_zero_sign(row.data(), reinterpret_cast<const float*>(want->data) + r * m->cols(),
                                              m->cols(), type == GgmlType::Q4_0, &diff))
            << "row " << r << " element " << diff;
      }
      ++compared;
    }
    EXPECT_EQ(compared, 7);
    // The non-projection tensors are the F32 conversion's, byte for byte.
    auto q4_file = qspec::SafetensorsFile::open((dir / "q4" / "model.safetensors").string());
    for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight"}) {
      const qspec::TensorView* a = q4_file->find(name);
      const qspec::TensorView* b = f32->find(name);
      ASSERT_TRUE(a && b) << name;
      EXPECT_EQ(a->nbytes, b->nbytes);
      EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << name;
    }
    fs::remove_all(dir);
  }
}

TEST(Gguf, FiveSixAndEightBitBlocksBecomeInt8GroupWeightsBitExactly) {
  // Q8_0 and Q6_K against the gguf package's dequantization (the fixture's references), Q5_0
  // against gguf_dequantize (tied to the package by DequantizesQ5_0LikeTheGgufPackage): the int8
  // codes and group scales decode to the same bits through the format reference and the engine's
  // decoder.
  auto expect_rows = [](uint32_t type, const uint8_t* data, int64_t rows, int64_t cols, const float* want) {
    const int64_t group = qspec::gguf_int8_group_size(type);
    ASSERT_GT(group, 0);
    qspec::QuantizedMatrix m;
    m.rows = rows;
    m.format = qspec::quant::make_row_format(qspec::quant::Format::int8_group, qspec::quant::Role::weight, cols, group);
    m.codes.resize(rows * m.format.code_bytes());
    m.scales.resize(rows * m.format.scale_bytes());
    qspec::gguf_to_int8_group(type, data, rows, cols, m.codes.data(), m.scales.data());
    m.prepare();
    std::vector<float> reference(cols), fast(cols);
    for (int64_t r = 0; r < rows; ++r) {
      qspec::quant::dequantize_row(m.format, m.codes.data() + r * m.format.code_bytes(),
                                   m.scales.data() + r * m.format.scale_bytes(), reference.data());
      m.dequantize_row(r, fast.data());
      size_t diff = 0;
      EXPECT_TRUE(same_bits_up_to_zero_sign(reference.data(), want + r * cols, cols, false, &diff))
          << "row " << r << " element " << diff << ": " << reference[diff] << " vs " << want[r * cols + diff];
      EXPECT_TRUE(same_bits_up_to_zero_sign(fast.data(), want + r * cols, cols, false, &diff))
          << "row " << r << " element " << diff;
    }
  };
  auto file = qspec::GgufFile::open(kData + "/quant-types.gguf");
  auto expected = qspec::SafetensorsFile::open(kData + "/quant-types.expected.safetensors");
  std::vector<std::string> imported;
  for (const auto& tensor : file->tensors()) {
    SCOPED_TRACE(tensor.name);
    const std::vector<int64_t> shape = tensor.shape();
    if (qspec::gguf_int8_group_size(tensor.type) == 0) {
      if (tensor.type != 0) {
        std::vector<uint8_t> codes(shape[0] * shape[1]), scales(shape[0] * shape[1]);
        const std::string error = error_of([&] {
          qspec::gguf_to_int8_group(tensor.type, tensor.data, shape[0], shape[1], codes.data(), scales.data());
        });
        EXPECT_NE(error.find(qspec::ggml_type_name(tensor.type)), std::string::npos) << error;
      }
      continue;
    }
    imported.push_back(qspec::ggml_type_name(tensor.type));
    expect_rows(tensor.type, tensor.data, shape[0], shape[1],
                reinterpret_cast<const float*>(expected->find(tensor.name)->data));
  }
  EXPECT_EQ(imported, (std::vector<std::string>{"Q8_0", "Q6_K"}));
  // Q5_0: random blocks of 4 rows x 64, the -0 of a zero code under a negative d included.
  const uint32_t q5_0 = static_cast<uint32_t>(qspec::GgmlType::Q5_0);
  std::vector<uint8_t> blocks = random_4bit_blocks(q5_0, 256, 7);
  for (size_t b = 0; b < blocks.size(); b += 22) blocks[b + 1] |= (b / 22 % 2) ? 0x80 : 0x00;  // negative d
  std::vector<float> want(256);
  qspec::gguf_dequantize(q5_0, blocks.data(), 256, want.data());
  expect_rows(q5_0, blocks.data(), 4, 64, want.data());
}

TEST(Gguf, KeepFourBitKeepsQ5_0Q6_KAndQ8_0ProjectionsAsInt8Group) {
  // Six projections of an 8-bit-able type and k_proj F32 (re-quantized into int4-asym g32, the
  // checkpoint's format): the six become int8-group weights equal to the F32 conversion bit for
  // bit, named in the manifest's tensor_formats; saving the model keeps them; --all-4bit
  // re-quantizes them instead.
  using qspec::GgmlType;
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6_K}) {
    const std::string type_name = qspec::ggml_type_name(static_cast<uint32_t>(type));
    SCOPED_TRACE(type_name);
    const int64_t group = type == GgmlType::Q6_K ? 16 : 32;
    SpmLlama model("llama", 0, 1, {256, 256, 4, 2, 64, static_cast<uint32_t>(type), "blk.0.attn_k.weight"});
    fs::path dir = temp_dir("keep8");
    write_bytes(dir / "m.gguf", model.builder.build());
    qspec::convert_gguf((dir / "m.gguf").string(), (dir / "f32").string());
    qspec::GgufConvertOptions options;
    options.keep_4bit = true;
    qspec::convert_gguf((dir / "m.gguf").string(), (dir / "q").string(), {}, options);
    const json manifest = read_json(dir / "q" / qspec::kQuantManifestFile);
    EXPECT_EQ(manifest["format"], "int4-asym");
    EXPECT_EQ(manifest["details"]["int8_group_types"], json({{type_name, 6}}));
    EXPECT_EQ(manifest["details"]["requantized_types"], json({{"F32", 1}}));
    ASSERT_TRUE(manifest.contains(qspec::kQuantTensorFormatsField));
    EXPECT_EQ(manifest[qspec::kQuantTensorFormatsField].size(), 6u);
    EXPECT_EQ(manifest[qspec::kQuantTensorFormatsField]["model.layers.0.self_attn.q_proj.weight"],
              json({{"format", "int8-group"}, {"group_size", group}}));

    auto f32 = qspec::SafetensorsFile::open((dir / "f32" / "model.safetensors").string());
    auto q = qspec::LlamaModel::load((dir / "q").string());
    EXPECT_EQ(q->quantized_format(), "int4-asym g32 gguf + 6 of 7 projections int8-group");
    const qspec::QuantizedLayerWeights& layer = q->quantized_layers()[0];
    int eight_bit = 0;
    for (const qspec::QuantizedMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                            &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      SCOPED_TRACE(m->name);
      if (m == &layer.k_proj) {
        EXPECT_EQ(m->format.format, qspec::quant::Format::int4_asym);
        continue;
      }
      ASSERT_EQ(m->format.format, qspec::quant::Format::int8_group);
      EXPECT_EQ(m->format.block, group);
      const float* want = reinterpret_cast<const float*>(f32->find(m->name)->data);
      std::vector<float> row(m->cols());
      for (int64_t r = 0; r < m->rows; ++r) {
        m->dequantize_row(r, row.data());
        size_t diff = 0;
        ASSERT_TRUE(same_bits_up_to_zero_sign(row.data(), want + r * m->cols(), m->cols(), false, &diff))
            << "row " << r << " element " << diff;
      }
      ++eight_bit;
    }
    EXPECT_EQ(eight_bit, 6);
    // (This file's values are no model: the modes run on such weights in
    // ModelQuantization.Int8GroupTensorsBesideInt4AsymRunEveryModeAndQSpecEqualsW4A16.)
    // Saved and loaded again: the same formats and bytes.
    q->save_quantized((dir / "saved").string());
    EXPECT_EQ(read_json(dir / "saved" / qspec::kQuantManifestFile)[qspec::kQuantTensorFormatsField],
              manifest[qspec::kQuantTensorFormatsField]);
    auto saved = qspec::LlamaModel::load((dir / "saved").string());
    const qspec::QuantizedLayerWeights& again = saved->quantized_layers()[0];
    EXPECT_EQ(again.q_proj.format.format, qspec::quant::Format::int8_group);
    EXPECT_EQ(again.q_proj.codes, layer.q_proj.codes);
    EXPECT_EQ(again.down_proj.scales, layer.down_proj.scales);
    EXPECT_EQ(again.k_proj.format.format, qspec::quant::Format::int4_asym);

    // --all-4bit: every projection int4-asym g32, the six re-quantized.
    options.all_4bit = true;
    qspec::convert_gguf((dir / "m.gguf").string(), (dir / "q4").string(), {}, options);
    const json all4 = read_json(dir / "q4" / qspec::kQuantManifestFile);
    EXPECT_FALSE(all4.contains(qspec::kQuantTensorFormatsField));
    EXPECT_EQ(all4["details"]["requantized_types"], json({{"F32", 1}, {type_name, 6}}));
    auto q4 = qspec::LlamaModel::load((dir / "q4").string());
    EXPECT_EQ(q4->quantized_layers()[0].q_proj.format.format, qspec::quant::Format::int4_asym);

    // A manifest whose tensor_formats names another format, or is no object, is refused naming it.
    json bad = manifest;
    bad[qspec::kQuantTensorFormatsField]["model.layers.0.self_attn.q_proj.weight"]["format"] = "int4";
    std::ofstream(dir / "q" / qspec::kQuantManifestFile) << bad.dump();
    std::string error = error_of([&] { qspec::LlamaModel::load((dir / "q").string()); });
    EXPECT_NE(error.find("tensor_formats[\"model.layers.0.self_attn.q_proj.weight\"]"), std::string::npos) << error;
    bad[qspec::kQuantTensorFormatsField] = json::array();
    std::ofstream(dir / "q" / qspec::kQuantManifestFile) << bad.dump();
    error = error_of([&] { qspec::LlamaModel::load((dir / "q").string()); });
    EXPECT_NE(error.find("tensor_formats"), std::string::npos) << error;
    fs::remove_all(dir);
  }
}

TEST(Gguf, KeepFourBitRequantizesOtherProjectionTypesOnLeastSquaresGrids) {
  // Six projections Q4_1, k_proj F32 (as a Q4_K_M file mixes Q5_0 / Q6_K / Q8_0 in): the Q4_1
  // ones are kept bit for bit, k_proj is the F32 conversion's rows quantized into int4-asym g32
  // with BlockFit::mse (rows are quantized alone, so quantizing before the k row permutation
  // gives the permuted rows' codes).
  SpmLlama model("llama", 0, 1,
                 {256, 256, 4, 2, 64, static_cast<uint32_t>(qspec::GgmlType::Q4_1), "blk.0.attn_k.weight"});
  fs::path dir = temp_dir("keep4-mixed");
  write_bytes(dir / "m.gguf", model.builder.build());
  qspec::convert_gguf((dir / "m.gguf").string(), (dir / "f32").string());
  qspec::GgufConvertOptions options;
  options.keep_4bit = true;
  qspec::convert_gguf((dir / "m.gguf").string(), (dir / "q4").string(), {}, options);
  const json manifest = read_json(dir / "q4" / qspec::kQuantManifestFile);
  EXPECT_EQ(manifest["details"]["gguf_types"], json({{"Q4_1", 6}}));
  EXPECT_EQ(manifest["details"]["requantized_types"], json({{"F32", 1}}));
  auto f32 = qspec::SafetensorsFile::open((dir / "f32" / "model.safetensors").string());
  auto q4 = qspec::LlamaModel::load((dir / "q4").string());
  const qspec::QuantizedLayerWeights& layer = q4->quantized_layers()[0];
  int requantized = 0;
  for (const qspec::QuantizedMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                          &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
    SCOPED_TRACE(m->name);
    const qspec::TensorView* want = f32->find(m->name);
    ASSERT_NE(want, nullptr);
    const float* source = reinterpret_cast<const float*>(want->data);
    std::vector<float> row(m->cols()), range_row(m->cols());
    for (int64_t r = 0; r < m->rows; ++r) {
      const float* values = source + r * m->cols();
      m->dequantize_row(r, row.data());
      if (m != &layer.k_proj) {
        size_t diff = 0;
        ASSERT_TRUE(same_bits_up_to_zero_sign(row.data(), values, m->cols(), false, &diff)) << "row " << r;
        continue;
      }
      std::vector<uint8_t> codes(m->format.code_bytes()), scales(m->format.scale_bytes());
      qspec::quant::quantize_row(m->format, values, codes.data(), scales.data(), qspec::quant::BlockFit::mse);
      ASSERT_EQ(std::memcmp(codes.data(), m->codes.data() + r * m->format.code_bytes(), codes.size()), 0) << "row " << r;
      ASSERT_EQ(std::memcmp(scales.data(), m->scales.data() + r * m->format.scale_bytes(), scales.size()), 0)
          << "row " << r;
      // Never worse than the range grids in squared error.
      std::copy(values, values + m->cols(), range_row.begin());
      qspec::quant::fake_quantize_row(m->format, range_row.data());
      double mse_error = 0, range_error = 0;
      for (int64_t i = 0; i < m->cols(); ++i) {
        mse_error += std::pow(static_cast<double>(values[i]) - row[i], 2);
        range_error += std::pow(static_cast<double>(values[i]) - range_row[i], 2);
      }
      ASSERT_LE(mse_error, range_error) << "row " << r;
    }
    requantized += m == &layer.k_proj;
  }
  EXPECT_EQ(requantized, 1);
  fs::remove_all(dir);
}

TEST(Gguf, ConvertsMixedTypeLlamaBitExactly) {
  fs::path dir = temp_dir("tiny");
  size_t last_done = 0, last_total = 0;
  qspec::convert_gguf(kData + "/tiny-llama.gguf", dir.string(), [&](size_t done, size_t total) {
    last_done = done;
    last_total = total;
  });
  EXPECT_EQ(last_done, last_total);
  auto got = qspec::SafetensorsFile::open((dir / "model.safetensors").string());
  auto want = qspec::SafetensorsFile::open(kData + "/tiny-llama.expected.safetensors");
  std::vector<std::string> got_names, want_names;
  for (const auto& t : got->tensors()) got_names.push_back(t.name);
  for (const auto& t : want->tensors()) want_names.push_back(t.name);
  std::sort(got_names.begin(), got_names.end());
  std::sort(want_names.begin(), want_names.end());
  EXPECT_EQ(got_names, want_names);
  for (const auto& w : want->tensors()) {
    SCOPED_TRACE(w.name);
    const qspec::TensorView* g = got->find(w.name);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->dtype, qspec::DType::F32);
    EXPECT_EQ(g->shape, w.shape);
    ASSERT_EQ(g->nbytes, w.nbytes);
    size_t diff = 0;
    EXPECT_TRUE(same_bits(reinterpret_cast<const float*>(g->data), reinterpret_cast<const float*>(w.data),
                          w.nbytes / 4, &diff))
        << "first difference at element " << diff;
  }

  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["intermediate_size"], 64);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["head_dim"], 8);
  EXPECT_EQ(config["vocab_size"], 265);
  EXPECT_EQ(config["max_position_embeddings"], 256);
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);  // float32 1e-5 written back as 1e-05
  EXPECT_EQ(config["rope_theta"], 100000.0);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["bos_token_id"], 1);
  EXPECT_EQ(config["eos_token_id"], 2);
  EXPECT_EQ(config["torch_dtype"], "float32");
  // The engine's own config reader accepts it.
  qspec::ModelConfig parsed = qspec::load_model_config(dir.string());
  EXPECT_EQ(parsed.head_dim, 8);
  EXPECT_EQ(parsed.num_kv_heads, 2);

  json tok = read_json(dir / "tokenizer.json");
  EXPECT_EQ(tok["model"]["type"], "BPE");
  EXPECT_EQ(tok["model"]["byte_fallback"], false);
  EXPECT_EQ(tok["model"]["merges"], json::array({"Ġ t", "h e", "Ġt he", "i n", "Ġ a"}));
  EXPECT_EQ(tok["model"]["vocab"]["Ġthe"], 261);
  EXPECT_EQ(tok["model"]["vocab"]["<|im_end|>"], 2);
  EXPECT_EQ(tok["model"]["vocab"].size(), 265u);
  const json& pre = tok["pre_tokenizer"]["pretokenizers"];
  ASSERT_EQ(pre.size(), 3u);  // smollm: digits one by one, GPT-2 regex, byte level
  EXPECT_EQ(pre[0]["pattern"]["Regex"], R"(\p{N})");
  EXPECT_EQ(pre[1]["pattern"]["Regex"],
            R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  EXPECT_EQ(pre[2]["type"], "ByteLevel");
  EXPECT_EQ(pre[2]["use_regex"], false);
  EXPECT_EQ(tok["decoder"]["type"], "ByteLevel");
  ASSERT_EQ(tok["added_tokens"].size(), 4u);
  EXPECT_EQ(tok["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(tok["added_tokens"][0]["special"], true);
  EXPECT_EQ(tok["added_tokens"][3]["content"], "<tool>");
  EXPECT_EQ(tok["added_tokens"][3]["id"], 264);
  EXPECT_EQ(tok["added_tokens"][3]["special"], false);

  json tok_config = read_json(dir / "tokenizer_config.json");
  EXPECT_EQ(tok_config["bos_token"], "<|im_start|>");
  EXPECT_EQ(tok_config["eos_token"], "<|im_end|>");
  EXPECT_EQ(tok_config["pad_token"], "<|endoftext|>");
  EXPECT_EQ(tok_config["add_bos_token"], false);
  EXPECT_NE(tok_config["chat_template"].get<std::string>().find("<|im_start|>{{ m['role'] }}"), std::string::npos);
  json gen = read_json(dir / "generation_config.json");
  EXPECT_EQ(gen["bos_token_id"], 1);
  EXPECT_EQ(gen["eos_token_id"], 2);
  EXPECT_EQ(gen["pad_token_id"], 0);

  // The engine's tokenizer loads it: digits split one by one, merges applied.
  auto tokenizer = qspec::Tokenizer::load(dir.string());
  const std::vector<int32_t> ids = tokenizer->encode(" the 12<|im_end|>");
  const int32_t space = tok["model"]["vocab"]["Ġ"].get<int32_t>();
  const int32_t one = tok["model"]["vocab"]["1"].get<int32_t>();
  const int32_t two = tok["model"]["vocab"]["2"].get<int32_t>();
  EXPECT_EQ(ids, (std::vector<int32_t>{261, space, one, two, 2}));
  EXPECT_EQ(tokenizer->decode(ids), " the 12<|im_end|>");
  fs::remove_all(dir);
}

TEST(Gguf, SentencepieceTokenizerTiedEmbeddingsAndQkUnpermute) {
  SpmLlama model;
  fs::path dir = temp_dir("spm");
  write_bytes(dir / "spm.gguf", model.builder.build());
  qspec::convert_gguf((dir / "spm.gguf").string(), (dir / "out").string());

  json config = read_json(dir / "out" / "config.json");
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["head_dim"], 4);
  EXPECT_EQ(config["rms_norm_eps"], 1e-6);
  EXPECT_EQ(config["max_position_embeddings"], 64);

  auto st = qspec::SafetensorsFile::open((dir / "out" / "model.safetensors").string());
  EXPECT_EQ(st->find("lm_head.weight"), nullptr);
  EXPECT_EQ(st->tensors().size(), 11u);
  auto values_of = [&](const std::string& name) {
    const qspec::TensorView* view = st->find(name);
    EXPECT_NE(view, nullptr) << name;
    std::vector<float> out(view->nbytes / 4);
    std::memcpy(out.data(), view->data, view->nbytes);
    return out;
  };
  EXPECT_EQ(values_of("model.embed_tokens.weight"), model.values["token_embd.weight"]);
  EXPECT_EQ(values_of("model.layers.0.mlp.down_proj.weight"), model.values["blk.0.ffn_down.weight"]);
  // HF row h*hd + j*hd/2 + i <- GGUF row h*hd + 2i + j.
  const int hd = SpmLlama::kHeadDim, D = SpmLlama::kDim;
  for (auto [hf_name, gguf_name, heads] :
       {std::tuple{"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", SpmLlama::kHeads},
        std::tuple{"model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", SpmLlama::kKvHeads}}) {
    const std::vector<float> hf = values_of(hf_name);
    const std::vector<float>& src = model.values[gguf_name];
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i)
        for (int j = 0; j < 2; ++j)
          for (int c = 0; c < D; ++c)
            EXPECT_EQ(hf[(h * hd + j * hd / 2 + i) * D + c], src[(h * hd + 2 * i + j) * D + c]) << hf_name;
  }

  json tok = read_json(dir / "out" / "tokenizer.json");
  EXPECT_EQ(tok["model"]["byte_fallback"], true);
  EXPECT_EQ(tok["model"]["unk_token"], "<unk>");
  EXPECT_EQ(tok["normalizer"]["normalizers"][0]["type"], "Prepend");
  // Merges ranked by the merged piece's score: ▁t (-1), he (-2), ▁the (-3), th (-4).
  // (▁the has one split of two vocabulary pieces; byte and control pieces never merge.)
  EXPECT_EQ(tok["model"]["merges"], json::array({"▁ t", "h e", "▁t he", "t h"}));
  ASSERT_EQ(tok["added_tokens"].size(), 4u);  // <unk>, <s>, </s> special; <|user|> not
  EXPECT_EQ(tok["added_tokens"][3]["content"], "<|user|>");
  EXPECT_EQ(tok["added_tokens"][3]["special"], false);
  EXPECT_EQ(tok["post_processor"]["type"], "TemplateProcessing");
  json tok_config = read_json(dir / "out" / "tokenizer_config.json");
  EXPECT_EQ(tok_config["add_bos_token"], true);
  EXPECT_EQ(tok_config["bos_token"], "<s>");

  auto tokenizer = qspec::Tokenizer::load((dir / "out").string());
  EXPECT_EQ(tokenizer->encode("the", true), (std::vector<int32_t>{1, 11}));
  EXPECT_EQ(tokenizer->encode("A\n"), (std::vector<int32_t>{5, 4, 3}));  // ▁, byte fallback A, \n
  fs::remove_all(dir);
}

// A gemma3 GGUF: llama.cpp stores every norm as 1 + w and q/k in the rotate_half layout, and
// leaves the sliding-window pattern, local RoPE base and chat template implicit.
TEST(Gguf, Gemma3ArchitectureShiftsNormsAndWritesTheLayerPattern) {
  auto gemma3 = [](bool with_window) {
    SpmLlama model("gemma3", 0, /*block_count=*/1);
    if (with_window) model.builder.kv_u32("gemma3.attention.sliding_window", 16);
    const int D = SpmLlama::kDim, hd = SpmLlama::kHeadDim;
    for (auto [name, size] : {std::pair{"blk.0.attn_q_norm.weight", hd}, std::pair{"blk.0.attn_k_norm.weight", hd},
                              std::pair{"blk.0.post_attention_norm.weight", D}, std::pair{"blk.0.post_ffw_norm.weight", D}}) {
      std::vector<float> v(static_cast<size_t>(size));
      for (int i = 0; i < size; ++i) v[i] = 1.0f + 0.25f * static_cast<float>(i);
      model.values[name] = v;
      model.builder.tensor_f32(name, {static_cast<uint64_t>(size)}, v);
    }
    return model;
  };
  fs::path dir = temp_dir("gemma3");
  SpmLlama model = gemma3(true);
  write_bytes(dir / "g.gguf", model.builder.build());
  qspec::convert_gguf((dir / "g.gguf").string(), (dir / "out").string());
  json config = read_json(dir / "out" / "config.json");
  EXPECT_EQ(config["architectures"], json::array({"Gemma3ForCausalLM"}));
  EXPECT_EQ(config["layer_types"], json::array({"sliding_attention"}));
  EXPECT_EQ(config["sliding_window"], 16);
  EXPECT_EQ(config["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(config["query_pre_attn_scalar"], SpmLlama::kHeadDim);
  EXPECT_TRUE(config["tie_word_embeddings"]);
  json tokenizer_config = read_json(dir / "out" / "tokenizer_config.json");
  EXPECT_NE(tokenizer_config["chat_template"].get<std::string>().find("<start_of_turn>"), std::string::npos);
  auto st = qspec::SafetensorsFile::open((dir / "out" / "model.safetensors").string());
  auto values_of = [&](const std::string& name) {
    const qspec::TensorView* view = st->find(name);
    EXPECT_NE(view, nullptr) << name;
    std::vector<float> out(view ? view->nbytes / 4 : 0);
    if (view) std::memcpy(out.data(), view->data, view->nbytes);
    return out;
  };
  auto minus_one = [](std::vector<float> v) {
    for (float& x : v) x -= 1.0f;
    return v;
  };
  const std::string h = "model.layers.0.";
  EXPECT_EQ(values_of(h + "self_attn.q_norm.weight"), minus_one(model.values["blk.0.attn_q_norm.weight"]));
  EXPECT_EQ(values_of(h + "post_attention_layernorm.weight"), minus_one(model.values["blk.0.post_attention_norm.weight"]));
  EXPECT_EQ(values_of(h + "pre_feedforward_layernorm.weight"), minus_one(model.values["blk.0.ffn_norm.weight"]));
  EXPECT_EQ(values_of(h + "post_feedforward_layernorm.weight"), minus_one(model.values["blk.0.post_ffw_norm.weight"]));
  EXPECT_EQ(values_of("model.norm.weight"), minus_one(model.values["output_norm.weight"]));
  EXPECT_EQ(values_of(h + "self_attn.q_proj.weight"), model.values["blk.0.attn_q.weight"]);  // not unpermuted
  const qspec::ModelConfig loaded = qspec::load_model_config((dir / "out").string());
  EXPECT_EQ(loaded.architecture, qspec::Architecture::Gemma3);
  EXPECT_EQ(loaded.layer_window(0), 16);

  SpmLlama no_window = gemma3(false);
  write_bytes(dir / "nw.gguf", no_window.builder.build());
  std::string error = error_of([&] { qspec::convert_gguf((dir / "nw.gguf").string(), (dir / "o2").string()); });
  EXPECT_NE(error.find("missing metadata 'gemma3.attention.sliding_window'"), std::string::npos) << error;
  SpmLlama untied = gemma3(true);
  untied.builder.tensor_f32("output.weight", {SpmLlama::kDim, untied.tokens.size()},
                            std::vector<float>(SpmLlama::kDim * untied.tokens.size()));
  write_bytes(dir / "untied.gguf", untied.builder.build());
  error = error_of([&] { qspec::convert_gguf((dir / "untied.gguf").string(), (dir / "o3").string()); });
  EXPECT_NE(error.find("'output.weight': Gemma 3 ties its embeddings"), std::string::npos) << error;
  fs::remove_all(dir);
}

TEST(Gguf, RejectsWrongMagicVersionAndTruncation) {
  const std::vector<uint8_t> good = read_bytes(kData + "/tiny-llama.gguf");
  ASSERT_GT(good.size(), 1000u);
  EXPECT_EQ(parse_error(good), "");

  std::vector<uint8_t> bad = good;
  bad[0] = 'X';
  EXPECT_NE(parse_error(bad).find("not a GGUF file"), std::string::npos);
  bad = good;
  bad[4] = 1;
  EXPECT_NE(parse_error(bad).find("version 1"), std::string::npos);
  bad = good;
  bad[4] = 7;
  EXPECT_NE(parse_error(bad).find("unsupported GGUF version 7"), std::string::npos);

  // Cut everywhere: in the header, the metadata, the tensor infos, the data.
  for (size_t cut : {size_t{3}, size_t{10}, size_t{30}, size_t{200}, size_t{3000}, good.size() / 2, good.size() - 1}) {
    std::vector<uint8_t> prefix(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
    std::string error = parse_error(prefix);
    EXPECT_FALSE(error.empty()) << "cut at " << cut;
    EXPECT_TRUE(error.find("truncated") != std::string::npos || error.find("not a GGUF") != std::string::npos ||
                error.find("claims") != std::string::npos)
        << "cut at " << cut << ": " << error;
  }
  // A truncated file on disk fails the conversion with the file name.
  fs::path dir = temp_dir("trunc");
  write_bytes(dir / "cut.gguf", std::vector<uint8_t>(good.begin(), good.end() - 100));
  std::string error = error_of([&] { qspec::convert_gguf((dir / "cut.gguf").string(), (dir / "out").string()); });
  EXPECT_NE(error.find("cut.gguf"), std::string::npos) << error;
  EXPECT_NE(error.find("extends past the end"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir / "out" / "model.safetensors"));
  fs::remove_all(dir);
}

TEST(Gguf, RejectsCountsLargerThanTheFile) {
  {
    GgufBuilder builder;
    builder.kv_string("general.architecture", "llama");
    builder.kv_count_override = uint64_t{1} << 60;
    EXPECT_NE(parse_error(builder.build()).find("metadata count"), std::string::npos);
  }
  {
    GgufBuilder builder;
    builder.tensor_count_override = uint64_t{1} << 40;
    EXPECT_NE(parse_error(builder.build()).find("tensor count"), std::string::npos);
  }
  {
    GgufBuilder builder;  // an array claiming 2^40 strings
    std::vector<uint8_t> value = {8, 0, 0, 0};
    uint64_t count = uint64_t{1} << 40;
    value.insert(value.end(), reinterpret_cast<uint8_t*>(&count), reinterpret_cast<uint8_t*>(&count) + 8);
    builder.raw_kv("tokenizer.ggml.tokens", 9, value);
    std::string error = parse_error(builder.build());
    EXPECT_NE(error.find("array length"), std::string::npos) << error;
    EXPECT_NE(error.find("tokenizer.ggml.tokens"), std::string::npos) << error;
  }
  {
    GgufBuilder builder;  // a string claiming 2^62 bytes
    uint64_t length = uint64_t{1} << 62;
    std::vector<uint8_t> value(reinterpret_cast<uint8_t*>(&length), reinterpret_cast<uint8_t*>(&length) + 8);
    builder.raw_kv("general.name", 8, value);
    std::string error = parse_error(builder.build());
    EXPECT_NE(error.find("truncated"), std::string::npos) << error;
    EXPECT_NE(error.find("general.name"), std::string::npos) << error;
  }
  {
    GgufBuilder builder;  // tensor data offset beyond the end
    builder.tensor("w", {32, 2}, 0, std::vector<uint8_t>(256), uint64_t{1} << 20);
    std::string error = parse_error(builder.build());
    EXPECT_NE(error.find("extends past the end"), std::string::npos) << error;
  }
  {
    GgufBuilder builder;  // dims whose product overflows
    builder.tensor("w", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, {});
    std::string error = parse_error(builder.build());
    EXPECT_NE(error.find("overflow"), std::string::npos) << error;
  }
}

TEST(Gguf, AcceptsVersion2) {
  GgufBuilder builder;
  builder.version = 2;
  builder.kv_string("general.architecture", "llama");
  builder.kv_strings("list", {"a", "bc"});
  builder.tensor_f32("w", {8, 2}, std::vector<float>(16, 1.5f));
  auto bytes = builder.build();
  auto file = qspec::GgufFile::parse(bytes.data(), bytes.size(), "v2.gguf");
  EXPECT_EQ(file->version(), 2u);
  EXPECT_EQ(file->get_string("general.architecture"), "llama");
  ASSERT_NE(file->get_string_array("list"), nullptr);
  EXPECT_EQ(*file->get_string_array("list"), (std::vector<std::string>{"a", "bc"}));
  ASSERT_EQ(file->tensors().size(), 1u);
  EXPECT_EQ(file->tensors()[0].shape(), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(file->dequantize(file->tensors()[0]), std::vector<float>(16, 1.5f));
  // Wrong-typed metadata is named.
  std::string error = error_of([&] { file->get_int("general.architecture"); });
  EXPECT_NE(error.find("'general.architecture' must be an integer"), std::string::npos) << error;
}

TEST(Gguf, RejectsMalformedStructures) {
  {
    GgufBuilder builder;  // arrays of arrays
    std::vector<uint8_t> value = {9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    builder.raw_kv("nested", 9, value);
    EXPECT_NE(parse_error(builder.build()).find("arrays of arrays"), std::string::npos);
  }
  {
    GgufBuilder builder;
    builder.raw_kv("weird", 13, {0});
    EXPECT_NE(parse_error(builder.build()).find("unknown value type 13"), std::string::npos);
  }
  {
    GgufBuilder builder;
    builder.kv_u32("general.alignment", 24);
    EXPECT_NE(parse_error(builder.build()).find("power of two"), std::string::npos);
  }
  {
    GgufBuilder builder;
    builder.tensor("w", {32}, 99, std::vector<uint8_t>(128));
    std::string error = parse_error(builder.build());
    EXPECT_NE(error.find("unknown ggml tensor type 99"), std::string::npos) << error;
    EXPECT_NE(error.find("'w'"), std::string::npos) << error;
  }
  {
    GgufBuilder builder;  // Q8_0 rows must be whole blocks
    builder.tensor("w", {48}, 8, std::vector<uint8_t>(64));
    EXPECT_NE(parse_error(builder.build()).find("block size"), std::string::npos);
  }
  {
    GgufBuilder builder;  // misaligned offset
    builder.tensor("w", {8}, 0, std::vector<uint8_t>(32), 4);
    EXPECT_NE(parse_error(builder.build()).find("alignment"), std::string::npos);
  }
  {
    GgufBuilder builder;
    builder.tensor("w", {8}, 0, std::vector<uint8_t>(32));
    builder.tensor("w", {8}, 0, std::vector<uint8_t>(32));
    EXPECT_NE(parse_error(builder.build()).find("duplicate tensor"), std::string::npos);
  }
  {
    GgufBuilder builder;
    builder.tensor("w", {8, 1, 1, 1, 1}, 0, std::vector<uint8_t>(32));
    EXPECT_NE(parse_error(builder.build()).find("dimensions"), std::string::npos);
  }
}

TEST(Gguf, RejectsHyperParametersBeyondTheLimitsBeforeAllocating) {
  // 2^30 layers passed the old bound (2^40) and sized a list of 9 x 2^30 expected tensors.
  fs::path dir = temp_dir("limits");
  SpmLlama model("llama", 0, uint32_t{1} << 30);
  write_bytes(dir / "layers.gguf", model.builder.build());
  std::string error;
  try {
    qspec::convert_gguf((dir / "layers.gguf").string(), (dir / "out").string());
  } catch (const qspec::Error& e) {
    error = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a qspec::Error: " << e.what();
  }
  EXPECT_NE(error.find("metadata 'llama.block_count' = 1073741824 is out of range (1..1024)"), std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(dir / "out"));
  fs::remove_all(dir);
}

TEST(Gguf, RejectsUnknownArchitectureAndUnsupportedTypes) {
  fs::path dir = temp_dir("unsupported");
  {
    SpmLlama model("mamba");
    write_bytes(dir / "mamba.gguf", model.builder.build());
    std::string error = error_of([&] { qspec::convert_gguf((dir / "mamba.gguf").string(), (dir / "o1").string()); });
    EXPECT_NE(error.find("unsupported GGUF architecture 'mamba'"), std::string::npos) << error;
  }
  {
    SpmLlama model("llama", /*Q5_K*/ 13);  // 8-element rows can't be Q5_K: rejected while parsing
    write_bytes(dir / "q5k.gguf", model.builder.build());
    std::string error = error_of([&] { qspec::convert_gguf((dir / "q5k.gguf").string(), (dir / "o2").string()); });
    EXPECT_NE(error.find("Q5_K"), std::string::npos) << error;
  }
  {
    // A parseable tensor of an unsupported type, named in the error.
    GgufBuilder builder;
    builder.tensor("blk.0.attn_q.weight", {256, 1}, 13, std::vector<uint8_t>(176));
    auto bytes = builder.build();
    auto file = qspec::GgufFile::parse(bytes.data(), bytes.size(), "x.gguf");
    std::string error = error_of([&] { file->dequantize(file->tensors()[0]); });
    EXPECT_NE(error.find("Q5_K"), std::string::npos) << error;
    EXPECT_NE(error.find("blk.0.attn_q.weight"), std::string::npos) << error;
  }
  {
    SpmLlama model;
    model.builder.tensor_f32("blk.0.attn_q.bias", {8}, std::vector<float>(8));
    write_bytes(dir / "bias.gguf", model.builder.build());
    std::string error = error_of([&] { qspec::convert_gguf((dir / "bias.gguf").string(), (dir / "o3").string()); });
    EXPECT_NE(error.find("unexpected tensor 'blk.0.attn_q.bias'"), std::string::npos) << error;
  }
  {
    SpmLlama model;
    model.builder.kv_string("tokenizer.ggml.model", "bert");  // duplicate key
    write_bytes(dir / "dup.gguf", model.builder.build());
    std::string error = error_of([&] { qspec::convert_gguf((dir / "dup.gguf").string(), (dir / "o4").string()); });
    EXPECT_NE(error.find("duplicate key"), std::string::npos) << error;
  }
  fs::remove_all(dir);
}
