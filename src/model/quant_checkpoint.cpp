// qspec 4-bit checkpoints: the manifest reader, binding the 4-bit tensors, and save_quantized.
#include "model/quant_checkpoint.h"

#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "base/files.h"
#include "model/draft_skip.h"
#include "model/draft_vocab.h"
#include "model/llama.h"
#include "qspec/error.h"

namespace qspec {

namespace fs = std::filesystem;

nlohmann::json read_quant_manifest(const std::string& path) {
  const std::string text = read_text_file(path, kMaxConfigJsonBytes);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": not valid JSON: ", error.what());
  }
  QSPEC_CHECK(manifest.is_object(), path, ": expected a JSON object");
  QSPEC_CHECK(manifest.contains("qspec_quantization") && manifest["qspec_quantization"].is_number_integer(), path,
              ": missing integer field \"qspec_quantization\" (the manifest version)");
  QSPEC_CHECK(manifest["qspec_quantization"].get<int>() == kQuantManifestVersion, path, ": manifest version ",
              manifest["qspec_quantization"].get<int>(), " is not supported (this qspec reads version ",
              kQuantManifestVersion, ")");
  for (const char* field : {"format", "method"})
    QSPEC_CHECK(manifest.contains(field) && manifest[field].is_string(), path, ": missing string field \"", field, "\"");
  QSPEC_CHECK(manifest.contains("group_size") && manifest["group_size"].is_number_integer(), path,
              ": missing integer field \"group_size\"");
  const quant::Format format = [&] {
    try {
      return quant::parse_format(manifest["format"].get<std::string>());
    } catch (const Error& error) {
      fail(path, ": field \"format\": ", error.what());
    }
  }();
  QSPEC_CHECK(quant::format_supports(format, quant::Role::weight), path, ": field \"format\": ",
              quant::format_name(format), " is not a weight format");
  const std::string method = manifest["method"];
  QSPEC_CHECK(std::find(std::begin(kQuantMethods), std::end(kQuantMethods), method) != std::end(kQuantMethods), path,
              ": field \"method\": '", method, "' (known: rtn, gptq, gguf)");
  if (!manifest.contains("details")) manifest["details"] = nlohmann::json::object();
  QSPEC_CHECK(manifest["details"].is_object(), path, ": field \"details\" must be an object");
  if (manifest.contains(kQuantTensorFormatsField)) {
    const nlohmann::json& overrides = manifest[kQuantTensorFormatsField];
    QSPEC_CHECK(overrides.is_object(), path, ": field \"", kQuantTensorFormatsField,
                "\" must be an object of projection name -> {\"format\", \"group_size\"}");
    for (const auto& [name, entry] : overrides.items()) {
      const std::string where = path + ": " + kQuantTensorFormatsField + "[\"" + name + "\"]";
      QSPEC_CHECK(entry.is_object() && entry.contains("format") && entry["format"].is_string() &&
                      entry.contains("group_size") && entry["group_size"].is_number_integer(),
                  where, ": expected {\"format\": string, \"group_size\": integer}");
      quant::Format tensor_format = quant::kSideWeightFormat;
      try {
        tensor_format = quant::parse_format(entry["format"].get<std::string>());
      } catch (const Error& error) {
        fail(where, ": ", error.what());
      }
      // Only the 8-bit tensors an import keeps beside the 4-bit set: every other format of a
      // checkpoint is its one "format".
      QSPEC_CHECK(tensor_format == quant::kSideWeightFormat, where, ": format '", quant::format_name(tensor_format),
                  "' (a projection's own format can only be ", quant::format_name(quant::kSideWeightFormat), ")");
      const int64_t group = entry["group_size"].get<int64_t>();
      QSPEC_CHECK(group > 0 && group % 2 == 0, where, ": group_size ", group, " must be positive and even");
    }
  }
  return manifest;
}

TensorFormat manifest_tensor_format(const nlohmann::json& manifest, const std::string& tensor) {
  if (manifest.contains(kQuantTensorFormatsField) && manifest[kQuantTensorFormatsField].contains(tensor)) {
    const nlohmann::json& entry = manifest[kQuantTensorFormatsField][tensor];
    return {quant::parse_format(entry["format"].get<std::string>()), entry["group_size"].get<int64_t>()};
  }
  return {quant::parse_format(manifest["format"].get<std::string>()), manifest["group_size"].get<int64_t>()};
}

namespace {

const char* const kProjections[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

QuantizedMatrix QuantizedLayerWeights::*projection_member(int index) {
  using Q = QuantizedLayerWeights;
  static QuantizedMatrix Q::*const members[] = {&Q::q_proj,    &Q::k_proj,  &Q::v_proj,   &Q::o_proj,
                                                &Q::gate_proj, &Q::up_proj, &Q::down_proj};
  return members[index];
}

LinearSite projection_site(int index) {
  static const LinearSite sites[] = {LinearSite::attention_in, LinearSite::attention_in, LinearSite::attention_in,
                                     LinearSite::attention_out, LinearSite::mlp_in,     LinearSite::mlp_in,
                                     LinearSite::mlp_out};
  return sites[index];
}

std::string arc_order_name(int64_t layer, LinearSite site) {
  return "model.layers." + std::to_string(layer) + ".arc." + std::string(linear_site_name(site)) + ".order";
}

const TensorView& expect_u8(const Checkpoint& checkpoint, const std::string& name, DType dtype,
                            std::vector<int64_t> shape) {
  const TensorView* tensor = checkpoint.find(name);
  QSPEC_CHECK(tensor, checkpoint.dir(), ": tensor '", name, "' is missing (", kQuantManifestFile,
              " describes a 4-bit checkpoint)");
  QSPEC_CHECK(tensor->dtype == dtype, checkpoint.dir(), ": tensor '", name, "' has dtype ", dtype_name(tensor->dtype),
              ", expected ", dtype_name(dtype));
  std::string got, want;
  for (int64_t d : tensor->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
  for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
  QSPEC_CHECK(tensor->shape == shape, checkpoint.dir(), ": tensor '", name, "' has shape [", got, "], the manifest implies [",
              want, "]");
  return *tensor;
}

}  // namespace

void LlamaModel::bind_quantized_weights(const nlohmann::json& manifest) {
  const ModelConfig& c = config_;
  const std::string manifest_path = (fs::path(dir_) / kQuantManifestFile).string();
  QuantizationInfo info;
  info.format = quant::parse_format(manifest["format"].get<std::string>());
  info.group_size = manifest["group_size"].get<int64_t>();
  info.method = manifest["method"].get<std::string>();
  info.details = manifest["details"];
  if (quant::format_has_groups(info.format))
    QSPEC_CHECK(info.group_size > 0 && info.group_size % 2 == 0, manifest_path, ": group_size ", info.group_size,
                " must be positive and even for ", quant::format_name(info.format));

  // ARC sites from the manifest (S per format), orders from the safetensors.
  std::vector<QuantizedLayerWeights> layers(static_cast<size_t>(c.num_layers));
  const nlohmann::json arc = info.details.value("arc", nlohmann::json::object());
  const bool arc_enabled = arc.is_object() && arc.value("enabled", false);
  const int64_t site_k[kLinearSites] = {c.hidden_size, c.q_dim(), c.hidden_size, c.intermediate_size};
  if (arc_enabled) {
    QSPEC_CHECK(arc.contains("sites") && arc["sites"].is_array() &&
                    arc["sites"].size() == static_cast<size_t>(c.num_layers * kLinearSites),
                manifest_path, ": details.arc.sites must list ", c.num_layers * kLinearSites, " sites (",
                kLinearSites, " per layer)");
    for (const nlohmann::json& entry : arc["sites"]) {
      auto field = [&](const char* name) -> int64_t {
        QSPEC_CHECK(entry.contains(name) && entry[name].is_number_integer(), manifest_path, ": details.arc.sites entry ",
                    entry.dump(), " lacks integer \"", name, "\"");
        return entry[name].get<int64_t>();
      };
      const int64_t layer = field("layer");
      QSPEC_CHECK(layer >= 0 && layer < c.num_layers, manifest_path, ": ARC site layer ", layer, " out of range");
      const std::string site_name = entry.value("site", "");
      int site_index = -1;
      for (int s = 0; s < kLinearSites; ++s)
        if (linear_site_name(LinearSite(s)) == site_name) site_index = s;
      QSPEC_CHECK(site_index >= 0, manifest_path, ": unknown ARC site '", site_name, "'");
      ArcSite& site = layers[static_cast<size_t>(layer)].sites[site_index];
      QSPEC_CHECK(!site.calibrated(), manifest_path, ": ARC site layer ", layer, " ", site_name, " listed twice");
      site.tail = field("tail");
      site.outliers_int4 = field("outliers_int4");
      site.outliers_nvfp4 = field("outliers_nvfp4");
      site.outliers_mxfp4 = field("outliers_mxfp4");
      site.above_tau = field("above_tau");
      site.max_abs = entry.value("max_abs", 0.0f);
      site.capped = entry.value("capped", false);
      const std::string name = arc_order_name(layer, LinearSite(site_index));
      const TensorView& order = expect_u8(checkpoint_, name, DType::I32, {site_k[site_index]});
      site.order.resize(static_cast<size_t>(site_k[site_index]));
      std::memcpy(site.order.data(), order.data, order.nbytes);
      std::vector<bool> seen(site.order.size(), false);
      for (int32_t channel : site.order) {
        QSPEC_CHECK(channel >= 0 && channel < site_k[site_index] && !seen[static_cast<size_t>(channel)], dir_,
                    ": tensor '", name, "' is not a permutation of 0..", site_k[site_index] - 1, " (entry ", channel,
                    " out of range or repeated)");
        seen[static_cast<size_t>(channel)] = true;
      }
    }
  }

  for (int64_t l = 0; l < c.num_layers; ++l) {
    QuantizedLayerWeights& layer = layers[static_cast<size_t>(l)];
    for (int p = 0; p < 7; ++p) {
      const std::string name = "model.layers." + std::to_string(l) + "." + kProjections[p] + ".weight";
      QSPEC_CHECK(!checkpoint_.find(name), dir_, ": tensor '", name, "' is a 16-bit projection, but ",
                  kQuantManifestFile, " says this checkpoint is 4-bit: the files are inconsistent");
      const LinearSite site = projection_site(p);
      const int64_t k = site_k[static_cast<int>(site)];
      const int64_t rows = p == 0 ? c.q_dim() : p <= 2 ? c.kv_dim() : p == 3 ? c.hidden_size : p <= 5 ? c.intermediate_size : c.hidden_size;
      QuantizedMatrix& m = layer.*projection_member(p);
      m.name = name;
      m.rows = rows;
      const int64_t cols = k + layer.sites[static_cast<int>(site)].tail;
      const TensorFormat tensor_format = manifest_tensor_format(manifest, name);
      try {
        m.format = quant::make_row_format(tensor_format.format, quant::Role::weight, cols,
                                          tensor_format.group_size > 0 ? tensor_format.group_size
                                                                       : quant::kDefaultGroupSize);
      } catch (const Error& error) {
        fail(manifest_path, ": ", name, ": ", error.what());
      }
      const TensorView& codes = expect_u8(checkpoint_, name + ".qcodes", DType::U8, {rows, m.format.code_bytes()});
      const TensorView& scales = expect_u8(checkpoint_, name + ".qscales", DType::U8, {rows, m.format.scale_bytes()});
      m.codes.assign(codes.data, codes.data + codes.nbytes);
      m.scales.assign(scales.data, scales.data + scales.nbytes);
      if (m.format.format == quant::Format::nvfp4) {
        const TensorView& tensor_scale = expect_u8(checkpoint_, name + ".tensor_scale", DType::F32, {1});
        std::memcpy(&m.format.tensor_scale, tensor_scale.data, 4);
        QSPEC_CHECK(std::isfinite(m.format.tensor_scale) && m.format.tensor_scale > 0.0f, dir_, ": tensor '", name,
                    ".tensor_scale' must be positive and finite, got ", m.format.tensor_scale);
      }
      try {
        m.prepare();
      } catch (const Error& error) {
        fail(dir_, ": tensor '", name, ".qscales': ", error.what());
      }
      // int4-asym scales may be negative (imported GGUF Q4_0 blocks); the minimums were checked by prepare().
      const bool signed_scales = quant::format_has_min(m.format.format) || m.format.format == quant::Format::int8_group;
      for (float scale : m.block_scale_values)
        QSPEC_CHECK(std::isfinite(scale) && (signed_scales || scale >= 0.0f), dir_, ": tensor '", name,
                    ".qscales' holds a scale that is negative, infinite or NaN (", scale, ")");
      weight_bytes_ += m.bytes();
    }
  }
  const nlohmann::json rotation = info.details.value("rotation", nlohmann::json::object());
  if (rotation.is_object() && rotation.value("enabled", false)) {
    QSPEC_CHECK(rotation.contains("seed") && rotation["seed"].is_number_unsigned(), manifest_path,
                ": details.rotation needs an unsigned integer \"seed\"");
    set_rotation_from_manifest(rotation["seed"].get<uint64_t>());
  }
  try {
    set_quantized_weights(std::move(layers), std::move(info));
  } catch (const Error& error) {
    fail(manifest_path, ": ", error.what());
  }
}

void LlamaModel::save_quantized(const std::string& out_dir, const nlohmann::json& manifest_extra) const {
  QSPEC_CHECK(has_quantized_weights(), "save_quantized: the model has no 4-bit weights");
  fs::path out(out_dir);
  if (!out.has_filename() && out.has_parent_path()) out = out.parent_path();  // "OUT/" is OUT
  QSPEC_CHECK(!fs::exists(out), out_dir, ": already exists; choose a new output directory (nothing was written)");
  const ModelConfig& c = config_;
  SafetensorsWriter writer;
  if (rotated_) {
    // The rotation changed the embedding, lm_head, norms (now ones) and output biases: write
    // them from memory, in f32.
    auto add_vector = [&](const std::string& name, const std::vector<float>& values) {
      if (!values.empty())
        writer.add(name, DType::F32, {static_cast<int64_t>(values.size())}, values.data(), values.size() * 4);
    };
    auto add_matrix = [&](const std::string& name, const WeightMatrix& m) {
      std::vector<float> data(static_cast<size_t>(m.rows * m.cols));
      for (int64_t r = 0; r < m.rows; ++r) m.row_to_f32(r, data.data() + r * m.cols);
      writer.add(name, DType::F32, {m.rows, m.cols}, data.data(), data.size() * 4);
    };
    add_matrix("model.embed_tokens.weight", embedding_);
    add_matrix("lm_head.weight", lm_head_);
    add_vector("model.norm.weight", final_norm_);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& layer = layers_[static_cast<size_t>(l)];
      const std::string prefix = "model.layers." + std::to_string(l) + ".";
      add_vector(prefix + "input_layernorm.weight", layer.attention_norm);
      add_vector(prefix + "post_attention_layernorm.weight", layer.mlp_norm);
      add_vector(prefix + "self_attn.q_norm.weight", layer.q_norm);  // Qwen3 (Gemma 3 is never rotated)
      add_vector(prefix + "self_attn.k_norm.weight", layer.k_norm);
      add_vector(prefix + "self_attn.q_proj.bias", layer.q_bias);
      add_vector(prefix + "self_attn.k_proj.bias", layer.k_bias);
      add_vector(prefix + "self_attn.v_proj.bias", layer.v_bias);
      add_vector(prefix + "self_attn.o_proj.bias", layer.o_bias);
      add_vector(prefix + "mlp.gate_proj.bias", layer.gate_bias);
      add_vector(prefix + "mlp.up_proj.bias", layer.up_bias);
      add_vector(prefix + "mlp.down_proj.bias", layer.down_bias);
    }
  }
  // Everything else that is not a projection, byte for byte as loaded.
  for (const std::string& name : checkpoint_.names()) {
    if (rotated_) break;
    if (name.find(".qcodes") != std::string::npos || name.find(".qscales") != std::string::npos ||
        name.find(".tensor_scale") != std::string::npos || name.find(".arc.") != std::string::npos)
      continue;
    bool projection = false;
    for (const char* p : kProjections)
      projection |= name.size() > 7 && name.ends_with(std::string(p) + ".weight");
    if (projection) continue;
    const TensorView& tensor = checkpoint_.get(name);
    writer.add(name, tensor.dtype, tensor.shape, tensor.data, tensor.nbytes);
  }
  nlohmann::json sites = nlohmann::json::array();
  nlohmann::json tensor_formats = nlohmann::json::object();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const QuantizedLayerWeights& layer = quantized_layers_[static_cast<size_t>(l)];
    for (int p = 0; p < 7; ++p) {
      const QuantizedMatrix& m = layer.*projection_member(p);
      const std::string name = "model.layers." + std::to_string(l) + "." + kProjections[p] + ".weight";
      writer.add(name + ".qcodes", DType::U8, {m.rows, m.format.code_bytes()}, m.codes.data(), m.codes.size());
      writer.add(name + ".qscales", DType::U8, {m.rows, m.format.scale_bytes()}, m.scales.data(), m.scales.size());
      if (m.format.format == quant::Format::nvfp4)
        writer.add(name + ".tensor_scale", DType::F32, {1}, &m.format.tensor_scale, 4);
      if (m.format.format != quantization_.format)
        tensor_formats[name] = {{"format", quant::format_name(m.format.format)}, {"group_size", m.format.block}};
    }
    for (int s = 0; s < kLinearSites; ++s) {
      const ArcSite& site = layer.sites[s];
      if (!site.calibrated()) continue;
      writer.add(arc_order_name(l, LinearSite(s)), DType::I32, {static_cast<int64_t>(site.order.size())},
                 site.order.data(), site.order.size() * 4);
      sites.push_back({{"layer", l},
                       {"site", linear_site_name(LinearSite(s))},
                       {"k", site.order.size()},
                       {"tail", site.tail},
                       {"outliers_int4", site.outliers_int4},
                       {"outliers_nvfp4", site.outliers_nvfp4},
                       {"outliers_mxfp4", site.outliers_mxfp4},
                       {"above_tau", site.above_tau},
                       {"max_abs", site.max_abs},
                       {"capped", site.capped}});
    }
  }
  nlohmann::json details = quantization_.details.is_object() ? quantization_.details : nlohmann::json::object();
  if (!sites.empty()) details["arc"]["sites"] = sites;
  nlohmann::json manifest = {{"qspec_quantization", kQuantManifestVersion},
                             {"format", quant::format_name(quantization_.format)},
                             {"group_size", quantization_.group_size},
                             {"method", quantization_.method},
                             {"details", details},
                             {"source", dir_}};
  if (!tensor_formats.empty()) manifest[kQuantTensorFormatsField] = tensor_formats;
  for (auto& [key, value] : manifest_extra.items()) manifest[key] = value;

  // Write beside the destination, then rename: OUT_DIR appears complete or not at all.
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  QSPEC_CHECK(fs::is_directory(parent), out_dir, ": parent directory ", parent.string(), " does not exist");
  const fs::path staging = parent / (out.filename().string() + ".partial-" + std::to_string(std::random_device{}()));
  try {
    fs::create_directory(staging);
    writer.set_metadata("format", "qspec-4bit");
    writer.write((staging / "model.safetensors").string());
    {
      std::ofstream file(staging / kQuantManifestFile);
      QSPEC_CHECK(file.good(), (staging / kQuantManifestFile).string(), ": cannot write");
      file << manifest.dump(2) << "\n";
      QSPEC_CHECK(file.good(), (staging / kQuantManifestFile).string(), ": write failed");
    }
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
      const std::string file = entry.path().filename().string();
      if (!entry.is_regular_file() || file.ends_with(".safetensors") || file == "model.safetensors.index.json" ||
          file == kQuantManifestFile)
        continue;
      // A draft table names the lm_head it was made for: a rotated one is another.
      if ((file == kDraftVocabFile || file == kDraftSkipFile) && rotated_) continue;
      if (file == "config.json" && rotated_) {
        // The rotated lm_head differs from the rotated embedding: never tied.
        nlohmann::json config = nlohmann::json::parse(read_text_file(entry.path().string(), kMaxConfigJsonBytes));
        config["tie_word_embeddings"] = false;
        std::ofstream config_out(staging / file);
        config_out << config.dump(2) << "\n";
        QSPEC_CHECK(config_out.good(), (staging / file).string(), ": write failed");
        continue;
      }
      fs::copy_file(entry.path(), staging / file);
    }
    fs::rename(staging, out);
  } catch (const fs::filesystem_error& error) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    fail(out_dir, ": cannot write the quantized checkpoint: ", error.what());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
}

}  // namespace qspec
