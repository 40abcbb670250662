// ModelConfig from config.json (every size bounded, every token id in the vocabulary) and RoPE tables.
#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/files.h"
#include "base/limits.h"
#include "qspec/error.h"

namespace qspec {

using nlohmann::json;

namespace {

// Gemma 3's defaults where its config.json leaves a field out (transformers' Gemma3TextConfig).
constexpr double kGemma3LocalRopeTheta = 10000.0;   // rope_local_base_freq
constexpr int64_t kGemma3SlidingWindow = 4096;      // sliding_window
constexpr int64_t kGemma3SlidingWindowPattern = 6;  // every 6th layer is global
constexpr double kGemma3QueryPreAttnScalar = 256;   // query_pre_attn_scalar

// Typed field readers that name the file and key in every error.
struct FieldReader {
  const json& object;
  const std::string& source;

  bool has(const char* key) const { return object.contains(key) && !object.at(key).is_null(); }

  int64_t integer(const char* key) const {
    QSPEC_CHECK(has(key), source, ": missing required field '", key, "'");
    const json& value = object.at(key);
    QSPEC_CHECK(value.is_number_integer(), source, ": field '", key, "' must be an integer, got ",
                value.dump());
    return value.get<int64_t>();
  }
  int64_t positive(const char* key) const {
    int64_t value = integer(key);
    QSPEC_CHECK(value > 0, source, ": field '", key, "' must be positive, got ", value);
    return value;
  }
  int64_t positive_or(const char* key, int64_t fallback) const {
    return has(key) ? positive(key) : fallback;
  }
  // A positive size no larger than `limit` (base/limits.h): nothing is ever sized from an
  // absurd value.
  int64_t bounded(const char* key, int64_t limit) const {
    int64_t value = positive(key);
    QSPEC_CHECK(value <= limit, source, ": field '", key, "' = ", value, " exceeds the supported maximum ", limit);
    return value;
  }
  int64_t bounded_or(const char* key, int64_t fallback, int64_t limit) const {
    return has(key) ? bounded(key, limit) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    return typed_or(key, fallback, &json::is_number, "a number");
  }
  bool boolean_or(const char* key, bool fallback) const {
    return typed_or(key, fallback, &json::is_boolean, "true/false");
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    return typed_or(key, fallback, &json::is_string, "a string");
  }
  // An optional field of the JSON type `is_type` tests (`what` names it in the error).
  template <typename T>
  T typed_or(const char* key, const T& fallback, bool (json::*is_type)() const noexcept, const char* what) const {
    if (!has(key)) return fallback;
    const json& value = object.at(key);
    QSPEC_CHECK((value.*is_type)(), source, ": field '", key, "' must be ", what, ", got ", value.dump());
    return value.get<T>();
  }
};

// One token id of field `key`, which must lie in the vocabulary [0, vocab_size).
int32_t token_id(const json& value, const std::string& source, const char* key, int64_t vocab_size) {
  QSPEC_CHECK(value.is_number_integer(), source, ": field '", key, "' must hold integer token ids, got ",
              value.dump());
  const bool in_vocab = value.is_number_unsigned() ? value.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                                                   : value.get<int64_t>() >= 0 && value.get<int64_t>() < vocab_size;
  QSPEC_CHECK(in_vocab, source, ": field '", key, "' = ", value.dump(), " is outside the vocabulary [0, ",
              vocab_size, ")");
  return static_cast<int32_t>(value.get<int64_t>());
}

// An integer or a list of integers (eos_token_id), each in the vocabulary.
std::vector<int32_t> token_id_list(const json& value, const std::string& source, const char* key,
                                   int64_t vocab_size) {
  std::vector<int32_t> ids;
  if (value.is_null()) return ids;
  if (value.is_number_integer()) {
    ids.push_back(token_id(value, source, key, vocab_size));
  } else if (value.is_array()) {
    for (const auto& item : value) ids.push_back(token_id(item, source, key, vocab_size));
  } else {
    fail(source, ": '", key, "' must be an integer or a list of integers");
  }
  return ids;
}

// One RoPE description (`params`: an object of rope_type, factor, ...; `where` names it in
// errors). `rope` arrives with the theta and type defaults.
RopeConfig parse_rope_params(const json& params, RopeConfig rope, const std::string& source, const std::string& where,
                             int64_t max_positions) {
  QSPEC_CHECK(params.is_object(), source, ": '", where, "' must be an object");
  FieldReader reader{params, source};
  rope.theta = reader.number_or("rope_theta", rope.theta);
  // v4 spelled it "type", later "rope_type".
  rope.type = reader.string_or("rope_type", reader.string_or("type", "default"));
  rope.factor = reader.number_or("factor", 1.0);
  rope.original_max_position_embeddings =
      reader.has("original_max_position_embeddings")
          ? reader.bounded("original_max_position_embeddings", kMaxPositionEmbeddings)
          : max_positions;
  if (rope.type == "default") {
    // nothing more
  } else if (rope.type == "linear" || rope.type == "dynamic") {
    QSPEC_CHECK(reader.has("factor"), source, ": ", where, " type '", rope.type,
                "' needs 'factor'");
  } else if (rope.type == "llama3") {
    QSPEC_CHECK(reader.has("factor") && reader.has("low_freq_factor") &&
                    reader.has("high_freq_factor") && reader.has("original_max_position_embeddings"),
                source, ": ", where,
                " type 'llama3' needs factor, low_freq_factor, high_freq_factor and "
                "original_max_position_embeddings");
    rope.low_freq_factor = reader.number_or("low_freq_factor", 1.0);
    rope.high_freq_factor = reader.number_or("high_freq_factor", 4.0);
    QSPEC_CHECK(rope.high_freq_factor != rope.low_freq_factor, source, ": ", where,
                ": high_freq_factor must differ from low_freq_factor");
  } else if (rope.type == "yarn") {
    QSPEC_CHECK(reader.has("factor"), source, ": ", where, " type 'yarn' needs 'factor'");
    rope.beta_fast = reader.number_or("beta_fast", 32.0);
    rope.beta_slow = reader.number_or("beta_slow", 1.0);
    if (reader.has("attention_factor")) rope.attention_factor = reader.number_or("attention_factor", 1.0);
    if (reader.has("mscale")) rope.mscale = reader.number_or("mscale", 1.0);
    if (reader.has("mscale_all_dim")) rope.mscale_all_dim = reader.number_or("mscale_all_dim", 0.0);
  } else {
    fail(source, ": unsupported rope type '", rope.type, "' in '", where,
         "' (supported: default, linear, dynamic, llama3, yarn)");
  }
  QSPEC_CHECK(rope.factor > 0, source, ": rope factor must be positive");
  QSPEC_CHECK(rope.theta > 0, source, ": rope_theta must be positive");
  if (reader.has("partial_rotary_factor")) {
    QSPEC_CHECK(reader.number_or("partial_rotary_factor", 1.0) == 1.0, source,
                ": partial_rotary_factor != 1 is not supported");
  }
  return rope;
}

void parse_rope_layers(const json& root, const char* where, const std::string& source, const RopeConfig& defaults,
                       ModelConfig& config);

// The RoPE of every layer: transformers v5 puts everything in rope_parameters (for Gemma 3
// one object per layer type: {"full_attention": {...}, "sliding_attention": {...}}); v4 uses
// rope_theta + rope_scaling (+ rope_local_base_freq for Gemma 3's sliding layers).
void parse_rope(const json& root, const std::string& source, ModelConfig& config) {
  FieldReader top{root, source};
  RopeConfig defaults;
  defaults.theta = top.number_or("rope_theta", 10000.0);
  config.rope = defaults;
  const bool local_rope = config.architecture == Architecture::Gemma3;
  if (local_rope) {
    RopeConfig local;
    local.theta = top.number_or("rope_local_base_freq", kGemma3LocalRopeTheta);
    local.original_max_position_embeddings = config.max_position_embeddings;
    QSPEC_CHECK(local.theta > 0, source, ": rope_local_base_freq must be positive");
    config.rope_local = local;
  }
  const char* where = top.has("rope_parameters") ? "rope_parameters" : top.has("rope_scaling") ? "rope_scaling" : nullptr;
  if (where == nullptr) return;
  parse_rope_layers(root, where, source, defaults, config);
  // Both spellings present: rope_parameters wins, so a rope_scaling that says otherwise would be
  // silently ignored. Parse it too (an unknown type fails, naming it) and require agreement.
  if (top.has("rope_parameters") && top.has("rope_scaling")) {
    const RopeConfig legacy =
        parse_rope_params(root.at("rope_scaling"), defaults, source, "rope_scaling", config.max_position_embeddings);
    QSPEC_CHECK(legacy.type == config.rope.type && legacy.factor == config.rope.factor, source,
                ": 'rope_scaling' (type ", legacy.type, ", factor ", legacy.factor, ") disagrees with 'rope_parameters' (type ",
                config.rope.type, ", factor ", config.rope.factor, "); keep one of them");
  }
}

// The RoPE object `where` (rope_parameters or rope_scaling): one for every layer, or one per
// layer type.
void parse_rope_layers(const json& root, const char* where, const std::string& source, const RopeConfig& defaults,
                       ModelConfig& config) {
  const json& params = root.at(where);
  QSPEC_CHECK(params.is_object(), source, ": '", where, "' must be an object");
  // Per layer type when every value is an object (a flat one holds numbers and strings).
  bool per_layer_type = !params.empty();
  for (const auto& item : params.items()) per_layer_type &= item.value().is_object();
  if (!per_layer_type) {
    config.rope = parse_rope_params(params, defaults, source, where, config.max_position_embeddings);
    return;
  }
  for (const auto& [key, value] : params.items()) {
    const std::string place = std::string(where) + "." + key;
    if (key == layer_type_name(LayerType::full_attention)) {
      config.rope = parse_rope_params(value, defaults, source, place, config.max_position_embeddings);
    } else if (key == layer_type_name(LayerType::sliding_attention)) {
      config.rope_local = parse_rope_params(value, config.rope_local.value_or(defaults), source, place,
                                            config.max_position_embeddings);
    } else {
      fail(source, ": unknown layer type '", key, "' in '", where,
           "' (supported: full_attention, sliding_attention)");
    }
  }
}

// layer_types: one of full_attention / sliding_attention per layer; older Gemma 3 configs give
// sliding_window_pattern instead (every pattern-th layer is global, the others slide).
void parse_layer_types(const json& root, const std::string& source, ModelConfig& config) {
  FieldReader reader{root, source};
  if (reader.has("layer_types")) {
    const json& list = root.at("layer_types");
    QSPEC_CHECK(list.is_array() && static_cast<int64_t>(list.size()) == config.num_layers, source,
                ": field 'layer_types' must be a list of ", config.num_layers, " layer types (num_hidden_layers)");
    for (size_t l = 0; l < list.size(); ++l) {
      const json& item = list[l];
      const std::string name = item.is_string() ? item.get<std::string>() : item.dump();
      if (name == layer_type_name(LayerType::full_attention)) config.layer_types.push_back(LayerType::full_attention);
      else if (name == layer_type_name(LayerType::sliding_attention)) config.layer_types.push_back(LayerType::sliding_attention);
      else
        fail(source, ": field 'layer_types'[", l, "] = '", name,
             "' is not a supported layer type (supported: full_attention, sliding_attention)");
    }
  } else if (config.architecture == Architecture::Gemma3) {
    const char* key = reader.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
    const int64_t pattern = reader.bounded_or(key, kGemma3SlidingWindowPattern, kMaxLayers);
    for (int64_t l = 0; l < config.num_layers; ++l)
      config.layer_types.push_back((l + 1) % pattern == 0 ? LayerType::full_attention : LayerType::sliding_attention);
  }
  for (size_t l = 0; l < config.layer_types.size(); ++l)
    QSPEC_CHECK(config.layer_types[l] == LayerType::full_attention || config.sliding_window, source,
                ": field 'layer_types'[", l, "] is sliding_attention but the config has no 'sliding_window' "
                "(read for MistralForCausalLM and Gemma3ForCausalLM only)");
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& error) {
    fail(source, ": not valid JSON: ", error.what());
  }
  QSPEC_CHECK(root.is_object(), source, ": top level must be a JSON object");
  FieldReader reader{root, source};
  ModelConfig config;

  std::string architecture;
  if (reader.has("architectures")) {
    const json& list = root.at("architectures");
    QSPEC_CHECK(list.is_array() && list.size() == 1 && list[0].is_string(), source,
                ": 'architectures' must be a list with one name");
    architecture = list[0].get<std::string>();
  } else {
    std::string model_type = reader.string_or("model_type", "");
    if (model_type == "llama") architecture = "LlamaForCausalLM";
    else if (model_type == "qwen2") architecture = "Qwen2ForCausalLM";
    else if (model_type == "mistral") architecture = "MistralForCausalLM";
    else if (model_type == "qwen3") architecture = "Qwen3ForCausalLM";
    else if (model_type == "gemma3" || model_type == "gemma3_text") architecture = "Gemma3ForCausalLM";
    else
      fail(source, ": no 'architectures' and unknown 'model_type' '", model_type,
           "' (supported: llama, qwen2, mistral, qwen3, gemma3, gemma3_text)");
  }
  config.architecture_name = architecture;
  if (architecture == "LlamaForCausalLM") config.architecture = Architecture::Llama;
  else if (architecture == "Qwen2ForCausalLM") config.architecture = Architecture::Qwen2;
  else if (architecture == "MistralForCausalLM") config.architecture = Architecture::Mistral;
  else if (architecture == "Qwen3ForCausalLM") config.architecture = Architecture::Qwen3;
  else if (architecture == "Gemma3ForCausalLM") config.architecture = Architecture::Gemma3;
  else
    fail(source, ": unsupported architecture '", architecture, "' in field 'architectures' (supported: ",
         "LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM)");

  config.vocab_size = reader.bounded("vocab_size", kMaxVocabSize);
  config.hidden_size = reader.bounded("hidden_size", kMaxHiddenSize);
  config.intermediate_size = reader.bounded("intermediate_size", kMaxIntermediateSize);
  config.num_layers = reader.bounded("num_hidden_layers", kMaxLayers);
  config.num_heads = reader.bounded("num_attention_heads", kMaxHeads);
  config.num_kv_heads = reader.bounded_or("num_key_value_heads", config.num_heads, kMaxHeads);
  QSPEC_CHECK(config.num_heads % config.num_kv_heads == 0, source, ": num_attention_heads (",
              config.num_heads, ") must be a multiple of num_key_value_heads (",
              config.num_kv_heads, ")");
  if (reader.has("head_dim")) {
    config.head_dim = reader.bounded("head_dim", kMaxHeadDim);
  } else {
    QSPEC_CHECK(config.hidden_size % config.num_heads == 0, source,
                ": hidden_size must be divisible by num_attention_heads when head_dim is absent");
    config.head_dim = config.hidden_size / config.num_heads;
    QSPEC_CHECK(config.head_dim <= kMaxHeadDim, source, ": head_dim (hidden_size / num_attention_heads) = ",
                config.head_dim, " exceeds the supported maximum ", kMaxHeadDim);
  }
  QSPEC_CHECK(config.head_dim % 2 == 0, source, ": head_dim must be even for RoPE");
  config.max_position_embeddings = reader.bounded_or("max_position_embeddings", 2048, kMaxPositionEmbeddings);
  config.rms_norm_eps = reader.number_or("rms_norm_eps", 1e-6);
  QSPEC_CHECK(config.rms_norm_eps > 0, source, ": rms_norm_eps must be positive");
  const bool gemma = config.architecture == Architecture::Gemma3;
  // Gemma3TextConfig ties the embeddings by default; the others do not.
  config.tie_word_embeddings = reader.boolean_or("tie_word_embeddings", gemma);

  // The activation must be the one the family's recipe computes. Gemma spells the field
  // hidden_activation.
  const char* activation_key = gemma && reader.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  const char* expected_activation = config.recipe().activation == MlpActivation::gelu_tanh ? "gelu_pytorch_tanh" : "silu";
  std::string activation = reader.string_or(activation_key, expected_activation);
  QSPEC_CHECK(activation == expected_activation, source, ": unsupported ", activation_key, " '", activation, "' for ",
              architecture, " (supported: ", expected_activation, ")");

  switch (config.architecture) {
    case Architecture::Qwen2:
      config.attention_bias = true;  // Qwen2 always has q/k/v bias, no o_proj bias
      if (reader.boolean_or("use_sliding_window", false))
        fail(source, ": Qwen2 use_sliding_window=true is not supported");
      break;
    case Architecture::Qwen3:
      if (reader.boolean_or("use_sliding_window", false))
        fail(source, ": Qwen3 use_sliding_window=true is not supported");
      [[fallthrough]];
    case Architecture::Llama:
      config.attention_bias = reader.boolean_or("attention_bias", false);
      config.attention_output_bias = config.attention_bias;
      config.mlp_bias = reader.boolean_or("mlp_bias", false);
      break;
    case Architecture::Mistral:
      if (reader.has("sliding_window")) config.sliding_window = reader.bounded("sliding_window", kMaxPositionEmbeddings);
      break;
    case Architecture::Gemma3:
      config.attention_bias = reader.boolean_or("attention_bias", false);
      config.attention_output_bias = config.attention_bias;
      config.sliding_window = reader.bounded_or("sliding_window", kGemma3SlidingWindow, kMaxPositionEmbeddings);
      config.query_pre_attn_scalar = reader.number_or("query_pre_attn_scalar", kGemma3QueryPreAttnScalar);
      QSPEC_CHECK(*config.query_pre_attn_scalar > 0, source, ": field 'query_pre_attn_scalar' must be positive");
      if (reader.has("final_logit_softcapping")) {
        config.final_logit_softcapping = reader.number_or("final_logit_softcapping", 0.0);
        QSPEC_CHECK(*config.final_logit_softcapping > 0, source, ": field 'final_logit_softcapping' must be positive");
      }
      QSPEC_CHECK(!reader.has("attn_logit_softcapping"), source,
                  ": field 'attn_logit_softcapping' (attention score soft-capping) is not supported");
      QSPEC_CHECK(!reader.boolean_or("use_bidirectional_attention", false), source,
                  ": field 'use_bidirectional_attention' = true (an encoder) is not supported");
      break;
  }
  if (reader.has("pretraining_tp"))
    QSPEC_CHECK(reader.integer("pretraining_tp") == 1, source, ": pretraining_tp != 1 is not supported");

  parse_rope(root, source, config);
  parse_layer_types(root, source, config);
  if (reader.has("bos_token_id"))
    config.bos_token_id = token_id(root.at("bos_token_id"), source, "bos_token_id", config.vocab_size);
  if (root.contains("eos_token_id"))
    config.eos_token_ids = token_id_list(root.at("eos_token_id"), source, "eos_token_id", config.vocab_size);
  config.torch_dtype = reader.string_or("torch_dtype", reader.string_or("dtype", ""));
  return config;
}

namespace {

// What to do with a path that holds no config.json: a GGUF or llama2.c file (or a directory of
// one) is converted first; anything else is not a model.
std::string missing_config_hint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ignored;
  auto kind_of = [](const fs::path& file) -> std::string {
    std::ifstream in(file, std::ios::binary);
    char magic[4] = {};
    in.read(magic, 4);
    if (in.gcount() == 4 && std::string(magic, 4) == "GGUF") return "gguf";
    return file.extension() == ".bin" ? "llama2c" : "";
  };
  auto advice = [](const fs::path& file, const std::string& kind) {
    if (kind == "gguf") return "'" + file.string() + "' is a GGUF file: convert it first, qspec convert gguf '" +
                               file.string() + "' OUT_DIR, then use OUT_DIR";
    return "'" + file.string() + "' looks like a llama2.c checkpoint: convert it first, qspec convert llama2c '" +
           file.string() + "' TOKENIZER.bin OUT_DIR, then use OUT_DIR";
  };
  if (fs::is_regular_file(dir, ignored)) {
    const std::string kind = kind_of(dir);
    return kind.empty() ? "'" + dir + "' is a file, not a model directory (config.json, *.safetensors, tokenizer.json)"
                        : advice(dir, kind);
  }
  if (fs::is_directory(dir, ignored)) {
    // A GGUF file, else the largest .bin (a llama2.c tokenizer .bin is a few KB beside it).
    fs::path gguf, bin;
    uintmax_t bin_size = 0;
    for (const auto& entry : fs::directory_iterator(dir, ignored)) {
      if (!entry.is_regular_file(ignored)) continue;
      const std::string kind = kind_of(entry.path());
      if (kind == "gguf" && gguf.empty()) gguf = entry.path();
      if (kind == "llama2c" && entry.file_size(ignored) > bin_size) bin = entry.path(), bin_size = entry.file_size(ignored);
    }
    if (!gguf.empty()) return advice(gguf, "gguf");
    if (!bin.empty()) return advice(bin, "llama2c");
  }
  return "is '" + dir + "' a model directory?";
}

}  // namespace

ModelConfig load_model_config(const std::string& dir) {
  std::string path = dir + "/config.json";
  std::error_code ignored;
  if (!std::filesystem::exists(path, ignored)) fail(path, ": cannot open (", missing_config_hint(dir), ")");
  return parse_model_config(read_text_file(path, kMaxConfigJsonBytes), path);
}

RopeTables rope_tables(const ModelConfig& config, int64_t seq_len) { return rope_tables(config, config.rope, seq_len); }

RopeTables rope_tables(const ModelConfig& config, const RopeConfig& rope, int64_t seq_len) {
  const int64_t dim = config.head_dim;
  const int64_t half = dim / 2;
  double base = rope.theta;
  if (rope.type == "dynamic" && seq_len > config.max_position_embeddings) {
    // NTK-aware dynamic scaling, recomputed for the current length (transformers' formula).
    double ratio = rope.factor * static_cast<double>(seq_len) /
                       static_cast<double>(config.max_position_embeddings) -
                   (rope.factor - 1.0);
    base = rope.theta * std::pow(ratio, static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  RopeTables tables;
  tables.inv_freq.resize(half);
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in float32
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    tables.inv_freq[i] = 1.0f / std::pow(static_cast<float>(base), exponent);
  }
  if (rope.type == "linear") {
    for (float& freq : tables.inv_freq) freq = freq / static_cast<float>(rope.factor);
  } else if (rope.type == "llama3") {
    const double old_context = static_cast<double>(rope.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / rope.low_freq_factor;
    const double high_freq_wavelen = old_context / rope.high_freq_factor;
    for (float& freq : tables.inv_freq) {
      const float wavelen = 2.0f * static_cast<float>(M_PI) / freq;
      float scaled = wavelen > low_freq_wavelen ? freq / static_cast<float>(rope.factor) : freq;
      bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        float smooth = static_cast<float>((old_context / wavelen - rope.low_freq_factor) /
                                          (rope.high_freq_factor - rope.low_freq_factor));
        scaled = (1.0f - smooth) * scaled / static_cast<float>(rope.factor) + smooth * scaled;
      }
      freq = scaled;
    }
  } else if (rope.type == "yarn") {
    auto get_mscale = [](double scale, double mscale) {
      return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
    };
    double factor = rope.factor;
    double original = static_cast<double>(rope.original_max_position_embeddings);
    if (rope.attention_factor) {
      tables.attention_scaling = static_cast<float>(*rope.attention_factor);
    } else if (rope.mscale && rope.mscale_all_dim) {
      tables.attention_scaling = static_cast<float>(get_mscale(factor, *rope.mscale) /
                                                    get_mscale(factor, *rope.mscale_all_dim));
    } else {
      tables.attention_scaling = static_cast<float>(get_mscale(factor, 1.0));
    }
    auto correction_dim = [&](double rotations) {
      return (static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI))) /
             (2 * std::log(base));
    };
    double low = std::floor(correction_dim(rope.beta_fast));
    double high = std::ceil(correction_dim(rope.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // avoid a zero-width ramp
    for (int64_t i = 0; i < half; ++i) {
      float extrapolation = tables.inv_freq[i];
      float interpolation = extrapolation / static_cast<float>(factor);
      double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      float extrapolation_factor = static_cast<float>(1.0 - ramp);
      tables.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) +
                           extrapolation * extrapolation_factor;
    }
  }
  return tables;
}

}  // namespace qspec
