// GGUF reader, ggml dequantization, and the GGUF (llama) -> Hugging Face importer.
//
// File layout (v2/v3, little endian): "GGUF", u32 version, u64 tensor_count,
// u64 kv_count; kv_count × (string key, u32 value type, value); tensor_count × (string
// name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset); padding to the alignment
// (general.alignment, default 32); the data section, where each tensor sits at its offset.
// A string is u64 length + bytes; an array is u32 element type, u64 count, elements.
#include "io/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "base/dtype.h"
#include "base/limits.h"
#include "io/convert.h"
#include "io/gemma3_chat_template.h"
#include "io/hf_writer.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "io/quant_manifest.h"
#include "qspec/error.h"
#include "quant/formats.h"

namespace qspec {

// ---- types ----

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: return "uint8";
    case GgufValueType::I8: return "int8";
    case GgufValueType::U16: return "uint16";
    case GgufValueType::I16: return "int16";
    case GgufValueType::U32: return "uint32";
    case GgufValueType::I32: return "int32";
    case GgufValueType::F32: return "float32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::U64: return "uint64";
    case GgufValueType::I64: return "int64";
    case GgufValueType::F64: return "float64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::U16:
    case GgufValueType::I16: case GgufValueType::U32: case GgufValueType::I32:
    case GgufValueType::U64: case GgufValueType::I64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_number() const {
  return is_integer() || type == GgufValueType::F32 || type == GgufValueType::F64;
}

size_t GgufValue::array_size() const {
  return array_u.size() + array_i.size() + array_f.size() + array_str.size();
}

namespace {

constexpr GgmlTypeInfo kTypes[] = {
    /* 0 */ {"F32", 1, 4, true},      /* 1 */ {"F16", 1, 2, true},
    /* 2 */ {"Q4_0", 32, 18, true},   /* 3 */ {"Q4_1", 32, 20, true},
    /* 4 */ {nullptr, 0, 0, false},   /* 5 */ {nullptr, 0, 0, false},
    /* 6 */ {"Q5_0", 32, 22, true},  /* 7 */ {"Q5_1", 32, 24, false},
    /* 8 */ {"Q8_0", 32, 34, true},   /* 9 */ {"Q8_1", 32, 36, false},
    /* 10 */ {"Q2_K", 256, 84, false}, /* 11 */ {"Q3_K", 256, 110, false},
    /* 12 */ {"Q4_K", 256, 144, true}, /* 13 */ {"Q5_K", 256, 176, false},
    /* 14 */ {"Q6_K", 256, 210, true}, /* 15 */ {"Q8_K", 256, 292, false},
    /* 16 */ {"IQ2_XXS", 256, 66, false}, /* 17 */ {"IQ2_XS", 256, 74, false},
    /* 18 */ {"IQ3_XXS", 256, 98, false}, /* 19 */ {"IQ1_S", 256, 50, false},
    /* 20 */ {"IQ4_NL", 32, 18, false},   /* 21 */ {"IQ3_S", 256, 110, false},
    /* 22 */ {"IQ2_S", 256, 82, false},   /* 23 */ {"IQ4_XS", 256, 136, false},
    /* 24 */ {"I8", 1, 1, false},         /* 25 */ {"I16", 1, 2, false},
    /* 26 */ {"I32", 1, 4, false},        /* 27 */ {"I64", 1, 8, false},
    /* 28 */ {"F64", 1, 8, false},        /* 29 */ {"IQ1_M", 256, 56, false},
    /* 30 */ {"BF16", 1, 2, true},        /* 31 */ {nullptr, 0, 0, false},
    /* 32 */ {nullptr, 0, 0, false},      /* 33 */ {nullptr, 0, 0, false},
    /* 34 */ {"TQ1_0", 256, 54, false},   /* 35 */ {"TQ2_0", 256, 66, false},
    /* 36 */ {nullptr, 0, 0, false},      /* 37 */ {nullptr, 0, 0, false},
    /* 38 */ {nullptr, 0, 0, false},      /* 39 */ {"MXFP4", 32, 17, false},
};

const char* kSupportedTypes = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K";

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  if (type >= std::size(kTypes) || kTypes[type].name == nullptr) return nullptr;
  return &kTypes[type];
}

std::string ggml_type_name(uint32_t type) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  return info ? std::string(info->name) : "type " + std::to_string(type);
}

std::vector<int64_t> GgufTensor::shape() const {
  std::vector<int64_t> out(dims.rbegin(), dims.rend());
  return out;
}

// ---- parsing ----

namespace {

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t at() const { return at_; }
  size_t remaining() const { return size_ - at_; }
  void set_context(std::string context) { context_ = std::move(context); }

  void need(uint64_t bytes, const char* what) const {
    if (bytes > remaining()) {
      fail(path_, ": truncated: ", what, context_.empty() ? "" : " of ", context_, " needs ", bytes,
           " bytes at offset ", at_, " but the file has ", size_, " bytes");
    }
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string read_string(const char* what) {
    uint64_t length = read<uint64_t>(what);
    need(length, what);
    std::string out(reinterpret_cast<const char*>(data_ + at_), static_cast<size_t>(length));
    at_ += static_cast<size_t>(length);
    return out;
  }
  // Checks that `count` items of at least `min_bytes` each could fit in what is left.
  void bound_count(uint64_t count, uint64_t min_bytes, const char* what) const {
    if (count > remaining() / min_bytes) {
      fail(path_, ": ", what, context_.empty() ? "" : " of ", context_, " claims ", count,
           " entries but only ", remaining(), " bytes remain (corrupt or truncated file)");
    }
  }
  [[noreturn]] void error(const std::string& message) const {
    fail(path_, ": ", context_.empty() ? "" : context_ + ": ", message);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
  const std::string& path_;
  std::string context_;
};

uint64_t scalar_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::BOOL: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    case GgufValueType::STRING: return 8;  // at least the length
    case GgufValueType::ARRAY: return 12;  // at least type + count
  }
  return 0;
}

bool known_value_type(uint32_t type) { return type <= static_cast<uint32_t>(GgufValueType::F64); }

// Reads one scalar of `type` into the matching field(s) of out (u / i / f / str).
void read_scalar(Cursor& cursor, GgufValueType type, uint64_t* u, int64_t* i, double* f, std::string* str) {
  switch (type) {
    case GgufValueType::U8: *u = cursor.read<uint8_t>("uint8 value"); break;
    case GgufValueType::I8: *i = cursor.read<int8_t>("int8 value"); break;
    case GgufValueType::U16: *u = cursor.read<uint16_t>("uint16 value"); break;
    case GgufValueType::I16: *i = cursor.read<int16_t>("int16 value"); break;
    case GgufValueType::U32: *u = cursor.read<uint32_t>("uint32 value"); break;
    case GgufValueType::I32: *i = cursor.read<int32_t>("int32 value"); break;
    case GgufValueType::U64: *u = cursor.read<uint64_t>("uint64 value"); break;
    case GgufValueType::I64: *i = cursor.read<int64_t>("int64 value"); break;
    case GgufValueType::F32: *f = cursor.read<float>("float32 value"); break;
    case GgufValueType::F64: *f = cursor.read<double>("float64 value"); break;
    case GgufValueType::BOOL: {
      uint8_t value = cursor.read<uint8_t>("bool value");
      if (value > 1) cursor.error("bool value " + std::to_string(value) + " is neither 0 nor 1");
      *u = value;
      break;
    }
    case GgufValueType::STRING: *str = cursor.read_string("string value"); break;
    case GgufValueType::ARRAY: cursor.error("unexpected array");
  }
}

GgufValue read_value(Cursor& cursor, uint32_t raw_type) {
  if (!known_value_type(raw_type)) cursor.error("unknown value type " + std::to_string(raw_type));
  GgufValue value;
  value.type = static_cast<GgufValueType>(raw_type);
  if (value.type != GgufValueType::ARRAY) {
    read_scalar(cursor, value.type, &value.u, &value.i, &value.f, &value.str);
    return value;
  }
  uint32_t raw_element = cursor.read<uint32_t>("array element type");
  if (!known_value_type(raw_element))
    cursor.error("unknown array element type " + std::to_string(raw_element));
  value.element_type = static_cast<GgufValueType>(raw_element);
  if (value.element_type == GgufValueType::ARRAY)
    cursor.error("arrays of arrays are not supported");
  uint64_t count = cursor.read<uint64_t>("array length");
  cursor.bound_count(count, scalar_size(value.element_type), "array length");
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  // Reads the `count` scalars into one of the value's arrays; `scalar` is the one of u / i / f
  // that read_scalar fills for this element type.
  auto read_into = [&](auto& array, const auto& scalar) {
    array.reserve(count);
    for (uint64_t k = 0; k < count; ++k) {
      read_scalar(cursor, value.element_type, &u, &i, &f, &str);
      array.push_back(scalar);
    }
  };
  switch (value.element_type) {
    case GgufValueType::U8: case GgufValueType::U16: case GgufValueType::U32:
    case GgufValueType::U64: case GgufValueType::BOOL:
      read_into(value.array_u, u);
      break;
    case GgufValueType::I8: case GgufValueType::I16: case GgufValueType::I32: case GgufValueType::I64:
      read_into(value.array_i, i);
      break;
    case GgufValueType::F32: case GgufValueType::F64:
      read_into(value.array_f, f);
      break;
    case GgufValueType::STRING:
      value.array_str.reserve(count);
      for (uint64_t k = 0; k < count; ++k) value.array_str.push_back(cursor.read_string("array string"));
      break;
    case GgufValueType::ARRAY:
      break;  // rejected above
  }
  return value;
}

}  // namespace

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto mapping = std::make_unique<hf::MappedFile>(path);
  std::unique_ptr<GgufFile> file = parse(mapping->data(), mapping->size(), path);
  file->mapping_ = std::move(mapping);
  return file;
}

GgufFile::~GgufFile() = default;

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* bytes, size_t size, const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  Cursor cursor(bytes, size, file->path_);

  QSPEC_CHECK(size >= 4 && std::memcmp(bytes, "GGUF", 4) == 0, path,
              ": not a GGUF file (the first 4 bytes are not 'GGUF')");
  cursor.read<uint32_t>("magic");
  file->version_ = cursor.read<uint32_t>("version");
  QSPEC_CHECK(file->version_ != 1, path, ": GGUF version 1 is not supported (re-convert to v3)");
  QSPEC_CHECK(file->version_ != 0x02000000u && file->version_ != 0x03000000u, path,
              ": big-endian GGUF files are not supported");
  QSPEC_CHECK(file->version_ == 2 || file->version_ == 3, path, ": unsupported GGUF version ",
              file->version_, " (supported: 2, 3)");
  const uint64_t tensor_count = cursor.read<uint64_t>("tensor count");
  const uint64_t kv_count = cursor.read<uint64_t>("metadata count");
  // A metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info
  // at least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
  cursor.bound_count(kv_count, 13, "metadata count");
  cursor.bound_count(tensor_count, 32, "tensor count");

  for (uint64_t k = 0; k < kv_count; ++k) {
    cursor.set_context("metadata entry " + std::to_string(k));
    std::string key = cursor.read_string("key");
    cursor.set_context("metadata '" + key + "'");
    uint32_t type = cursor.read<uint32_t>("value type");
    GgufValue value = read_value(cursor, type);
    if (!file->metadata_.emplace(key, std::move(value)).second) cursor.error("duplicate key");
  }
  cursor.set_context("");

  if (const GgufValue* alignment = file->find("general.alignment")) {
    QSPEC_CHECK(alignment->is_integer(), path, ": general.alignment must be an integer, got ",
                gguf_value_type_name(alignment->type));
    const uint64_t value = alignment->type == GgufValueType::I8 || alignment->type == GgufValueType::I16 ||
                                   alignment->type == GgufValueType::I32 || alignment->type == GgufValueType::I64
                               ? static_cast<uint64_t>(alignment->i)
                               : alignment->u;
    QSPEC_CHECK(value > 0 && value <= (1u << 30) && (value & (value - 1)) == 0, path,
                ": general.alignment ", value, " is not a power of two");
    file->alignment_ = value;
  }

  file->tensors_.reserve(tensor_count);
  for (uint64_t t = 0; t < tensor_count; ++t) {
    cursor.set_context("tensor info " + std::to_string(t));
    GgufTensor tensor;
    tensor.name = cursor.read_string("name");
    cursor.set_context("tensor '" + tensor.name + "'");
    uint32_t n_dims = cursor.read<uint32_t>("dimension count");
    if (n_dims < 1 || n_dims > 4) cursor.error("has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t extent = cursor.read<uint64_t>("dimension");
      if (extent == 0 || extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, extent, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        cursor.error("dimension " + std::to_string(d) + " = " + std::to_string(extent) +
                     " is zero or makes the element count overflow");
      tensor.dims.push_back(extent);
    }
    tensor.numel = numel;
    tensor.type = cursor.read<uint32_t>("type");
    const GgmlTypeInfo* info = ggml_type_info(tensor.type);
    if (info == nullptr) cursor.error("unknown ggml tensor type " + std::to_string(tensor.type));
    if (tensor.dims[0] % info->block_size != 0)
      cursor.error("row length " + std::to_string(tensor.dims[0]) + " is not a multiple of the " +
                   info->name + " block size " + std::to_string(info->block_size));
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel / info->block_size, static_cast<uint64_t>(info->type_size), &nbytes))
      cursor.error("byte size overflows");
    tensor.nbytes = static_cast<size_t>(nbytes);
    tensor.offset = cursor.read<uint64_t>("data offset");
    if (file->by_name_.count(tensor.name)) cursor.error("duplicate tensor name");
    file->by_name_.emplace(tensor.name, file->tensors_.size());
    file->tensors_.push_back(std::move(tensor));
  }
  cursor.set_context("");

  const uint64_t align = file->alignment_;
  const uint64_t data_start = (cursor.at() + align - 1) / align * align;
  const uint64_t data_size = data_start <= size ? size - data_start : 0;
  for (GgufTensor& tensor : file->tensors_) {
    QSPEC_CHECK(tensor.offset % align == 0, path, ": tensor '", tensor.name, "': data offset ",
                tensor.offset, " is not a multiple of the alignment ", align);
    QSPEC_CHECK(tensor.offset <= data_size && tensor.nbytes <= data_size - tensor.offset, path,
                ": tensor '", tensor.name, "' (", ggml_type_name(tensor.type), ", ", tensor.nbytes,
                " bytes at data offset ", tensor.offset, ") extends past the end of the file (data section has ",
                data_size, " bytes; truncated file?)");
    tensor.data = bytes + data_start + tensor.offset;
  }
  return file;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  QSPEC_CHECK(value->type == GgufValueType::STRING, path_, ": metadata '", key,
              "' must be a string, got ", gguf_value_type_name(value->type));
  return value->str;
}

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  QSPEC_CHECK(value->is_integer(), path_, ": metadata '", key, "' must be an integer, got ",
              gguf_value_type_name(value->type));
  switch (value->type) {
    case GgufValueType::I8: case GgufValueType::I16: case GgufValueType::I32: case GgufValueType::I64:
      return value->i;
    default:
      QSPEC_CHECK(value->u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), path_,
                  ": metadata '", key, "' = ", value->u, " is out of range");
      return static_cast<int64_t>(value->u);
  }
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  QSPEC_CHECK(value->is_number(), path_, ": metadata '", key, "' must be a number, got ",
              gguf_value_type_name(value->type));
  if (value->type == GgufValueType::F32) return hf::shortest_float(static_cast<float>(value->f));
  if (value->type == GgufValueType::F64) return value->f;
  return static_cast<double>(*get_int(key));
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  QSPEC_CHECK(value->type == GgufValueType::BOOL, path_, ": metadata '", key, "' must be a bool, got ",
              gguf_value_type_name(value->type));
  return value->u != 0;
}

const std::vector<std::string>* GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return nullptr;
  QSPEC_CHECK(value->type == GgufValueType::ARRAY && value->element_type == GgufValueType::STRING, path_,
              ": metadata '", key, "' must be an array of strings");
  return &value->array_str;
}

std::vector<float> GgufFile::dequantize(const GgufTensor& tensor) const {
  const GgmlTypeInfo* info = ggml_type_info(tensor.type);
  QSPEC_CHECK(info != nullptr && info->dequantizable, path_, ": tensor '", tensor.name, "' has ggml type ",
              ggml_type_name(tensor.type), ", which is not supported (supported: ", kSupportedTypes, ")");
  std::vector<float> out(static_cast<size_t>(tensor.numel));
  gguf_dequantize(tensor.type, tensor.data, out.size(), out.data());
  return out;
}

// ---- dequantization (the reference C definitions of ggml-quants.c) ----

namespace {

inline float load_f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

void dequantize_q4_0(const uint8_t* block, float* y) {  // d, qs[16]
  const float d = load_f16(block);
  const uint8_t* qs = block + 2;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 0x0F) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

// The 5-, 6- and 8-bit blocks as int8 codes and the scales of their groups (value = code * scale,
// the product ggml's reference computes): what gguf_dequantize decodes and gguf_to_int8_group
// stores. Q8_0 and Q5_0: one group of 32; Q6_K: sixteen groups of 16.
void q8_0_codes(const uint8_t* block, int8_t* codes, float* scales) {  // d, qs[32]
  for (int j = 0; j < 32; ++j) codes[j] = static_cast<int8_t>(block[2 + j]);
  scales[0] = load_f16(block);
}

void q5_0_codes(const uint8_t* block, int8_t* codes, float* scales) {  // d, qh (32 fifth bits), qs[16]
  uint32_t qh;
  std::memcpy(&qh, block + 2, sizeof qh);
  const uint8_t* qs = block + 6;
  for (int j = 0; j < 16; ++j) {
    const int high0 = static_cast<int>((qh >> j) << 4 & 0x10);
    const int high1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    codes[j] = static_cast<int8_t>(((qs[j] & 0x0F) | high0) - 16);
    codes[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | high1) - 16);
  }
  scales[0] = load_f16(block);
}

// ql[128], qh[64], scales[16], d: 16-value sub-block j has scale d * sc_j (exact in f32).
void q6_k_codes(const uint8_t* block, int8_t* codes, float* scales) {
  const float d = load_f16(block + 208);
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
  for (int half = 0; half < 2; ++half) {
    int8_t* q = codes + 128 * half;
    for (int l = 0; l < 32; ++l) {
      q[l + 0] = static_cast<int8_t>(((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      q[l + 64] = static_cast<int8_t>(((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
    ql += 64;
    qh += 32;
  }
  for (int j = 0; j < 16; ++j) scales[j] = d * static_cast<float>(sc[j]);
}

// y = code * scale over a block of N values in groups of G.
template <int N, int G, void (*Codes)(const uint8_t*, int8_t*, float*)>
void dequantize_int8_codes(const uint8_t* block, float* y) {
  int8_t codes[N];
  float scales[N / G];
  Codes(block, codes, scales);
  for (int j = 0; j < N; ++j) y[j] = static_cast<float>(codes[j]) * scales[j / G];
}

void dequantize_q4_1(const uint8_t* block, float* y) {  // d, m, qs[16]
  const float d = load_f16(block);
  const float m = load_f16(block + 2);
  const uint8_t* qs = block + 4;
  for (int j = 0; j < 16; ++j) {
    const int x0 = qs[j] & 0x0F;
    const int x1 = qs[j] >> 4;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}

inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void dequantize_q4_k(const uint8_t* block, float* y) {  // d, dmin, scales[12], qs[128]
  const float d = load_f16(block);
  const float min = load_f16(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* q = block + 16;
  int is = 0;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, m;
    scale_min_k4(is + 0, scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = min * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

}  // namespace

void gguf_dequantize(uint32_t type, const uint8_t* src, size_t count, float* dst) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  QSPEC_CHECK(info != nullptr && info->dequantizable, "ggml type ", ggml_type_name(type),
              " is not supported (supported: ", kSupportedTypes, ")");
  QSPEC_CHECK(count % info->block_size == 0, "dequantize: ", count, " elements is not a multiple of the ",
              info->name, " block size ", info->block_size);
  const size_t blocks = count / info->block_size;
  void (*decode_block)(const uint8_t* block, float* out) = nullptr;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case GgmlType::F16:
      for (size_t k = 0; k < count; ++k) dst[k] = load_f16(src + 2 * k);
      return;
    case GgmlType::BF16:
      for (size_t k = 0; k < count; ++k) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * k, 2);
        dst[k] = bf16_to_f32(bits);
      }
      return;
    case GgmlType::Q4_0: decode_block = dequantize_q4_0; break;
    case GgmlType::Q4_1: decode_block = dequantize_q4_1; break;
    case GgmlType::Q5_0: decode_block = dequantize_int8_codes<32, 32, q5_0_codes>; break;
    case GgmlType::Q8_0: decode_block = dequantize_int8_codes<32, 32, q8_0_codes>; break;
    case GgmlType::Q4_K: decode_block = dequantize_q4_k; break;
    case GgmlType::Q6_K: decode_block = dequantize_int8_codes<256, 16, q6_k_codes>; break;
    default:
      fail("ggml type ", ggml_type_name(type), " is not supported (supported: ", kSupportedTypes, ")");
  }
  // A block type: type_size bytes of src become block_size floats, block by block.
  for (size_t b = 0; b < blocks; ++b) decode_block(src + b * info->type_size, dst + b * info->block_size);
}

// ---- 4-bit blocks as int4-asym rows (gguf.h) ----

bool gguf_int4_asym_type(uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q4_K;
}

namespace {

// Where one group of 32 codes sits in a ggml block: split16, value l < 16 in the low nibble of
// qs[l] and value l + 16 in the high nibble of qs[l - 16] (Q4_0 / Q4_1); low32 / high32, all 32
// in the low / high nibbles of qs[0..31] (the two sub-blocks of a Q4_K 64-value chunk).
struct GroupSource {
  const uint8_t* qs;
  enum class Layout { split16, low32, high32 } layout;
  uint8_t code(int l) const {
    switch (layout) {
      case Layout::split16: return l < 16 ? qs[l] & 0xF : qs[l - 16] >> 4;
      case Layout::low32: return qs[l] & 0xF;
      case Layout::high32: return qs[l] >> 4;
    }
    return 0;
  }
};

void put_group(const quant::RowFormat& format, const GroupSource& source, int64_t group, float scale, float min,
               uint8_t* row_codes, uint8_t* row_scales) {
  uint8_t* out = row_codes + group * kGgufInt4AsymGroup / 2;
  for (int l = 0; l < kGgufInt4AsymGroup; l += 2)
    out[l / 2] = static_cast<uint8_t>(source.code(l) | (source.code(l + 1) << 4));
  quant::store_asym_block(format, row_scales, group, scale, min);
}

}  // namespace

void gguf_to_int4_asym(uint32_t type, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* codes,
                       uint8_t* scales) {
  QSPEC_CHECK(gguf_int4_asym_type(type), "ggml type ", ggml_type_name(type),
              " has no int4-asym form (Q4_0, Q4_1 and Q4_K do)");
  const GgmlTypeInfo* info = ggml_type_info(type);
  QSPEC_CHECK(rows >= 0 && cols > 0 && cols % info->block_size == 0, "int4-asym import: ", cols, " values a row is not a multiple of the ",
              info->name, " block size ", info->block_size);
  const quant::RowFormat format =
      quant::make_row_format(quant::Format::int4_asym, quant::Role::weight, cols, kGgufInt4AsymGroup);
  const int64_t blocks_per_row = cols / info->block_size;
  using Layout = GroupSource::Layout;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row_codes = codes + r * format.code_bytes();
    uint8_t* row_scales = scales + r * format.scale_bytes();
    try {
      for (int64_t b = 0; b < blocks_per_row; ++b) {
        const uint8_t* block = src + (r * blocks_per_row + b) * info->type_size;
        switch (static_cast<GgmlType>(type)) {
          case GgmlType::Q4_0: {  // d, qs[16]
            const float d = load_f16(block);
            put_group(format, {block + 2, Layout::split16}, b, d, -8.0f * d, row_codes, row_scales);
            break;
          }
          case GgmlType::Q4_1:  // d, m, qs[16]
            put_group(format, {block + 4, Layout::split16}, b, load_f16(block), load_f16(block + 2), row_codes,
                      row_scales);
            break;
          default: {  // Q4_K: d, dmin, scales[12], qs[128]; 64-value chunks of two sub-blocks
            const float d = load_f16(block), dmin = load_f16(block + 2);
            for (int chunk = 0; chunk < 4; ++chunk) {
              const uint8_t* q = block + 16 + 32 * chunk;
              for (int half = 0; half < 2; ++half) {
                uint8_t sc, m;
                scale_min_k4(2 * chunk + half, block + 4, &sc, &m);
                put_group(format, {q, half == 0 ? Layout::low32 : Layout::high32}, b * 8 + 2 * chunk + half,
                          d * static_cast<float>(sc), -(dmin * static_cast<float>(m)), row_codes, row_scales);
              }
            }
          }
        }
      }
    } catch (const Error& error) {
      fail(ggml_type_name(type), " row ", r, ": ", error.what());
    }
  }
}

// ---- 5-, 6- and 8-bit blocks as int8-group rows (gguf.h) ----

namespace {

// A type's int8-group form: its group and block decoder (above); group 0 where it has none.
struct Int8CodesForm {
  int64_t group;
  void (*decode)(const uint8_t* block, int8_t* codes, float* scales);
};
Int8CodesForm int8_codes_form(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::Q8_0: return {32, q8_0_codes};
    case GgmlType::Q5_0: return {32, q5_0_codes};
    case GgmlType::Q6_K: return {16, q6_k_codes};
    default: return {0, nullptr};
  }
}

}  // namespace

int64_t gguf_int8_group_size(uint32_t type) { return int8_codes_form(type).group; }

void gguf_to_int8_group(uint32_t type, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* codes,
                        uint8_t* scales) {
  const Int8CodesForm form = int8_codes_form(type);
  const int64_t group = form.group;
  QSPEC_CHECK(group > 0, "ggml type ", ggml_type_name(type), " has no int8-group form (Q8_0, Q5_0 and Q6_K do)");
  const GgmlTypeInfo* info = ggml_type_info(type);
  QSPEC_CHECK(rows >= 0 && cols > 0 && cols % info->block_size == 0, "int8-group import: ", cols,
              " values a row is not a multiple of the ", info->name, " block size ", info->block_size);
  const quant::RowFormat format = quant::make_row_format(quant::Format::int8_group, quant::Role::weight, cols, group);
  const int64_t blocks_per_row = cols / info->block_size;
  for (int64_t r = 0; r < rows; ++r) {
    int8_t* row_codes = reinterpret_cast<int8_t*>(codes + r * format.code_bytes());
    uint8_t* row_scales = scales + r * format.scale_bytes();
    try {
      for (int64_t b = 0; b < blocks_per_row; ++b) {
        const uint8_t* block = src + (r * blocks_per_row + b) * info->type_size;
        float block_scales[16];
        form.decode(block, row_codes + b * info->block_size, block_scales);
        for (int64_t g = 0; g < info->block_size / group; ++g)
          quant::store_block_scale(format, row_scales, b * (info->block_size / group) + g, block_scales[g]);
      }
    } catch (const Error& error) {
      fail(ggml_type_name(type), " row ", r, ": ", error.what());
    }
  }
}

// ---- GGUF (llama) -> Hugging Face ----

namespace {

std::vector<int64_t> int_array(const GgufFile& file, const std::string& key) {
  const GgufValue* value = file.find(key);
  std::vector<int64_t> out;
  if (value == nullptr) return out;
  QSPEC_CHECK(value->type == GgufValueType::ARRAY &&
                  (value->element_type != GgufValueType::STRING && value->element_type != GgufValueType::F32 &&
                   value->element_type != GgufValueType::F64),
              file.path(), ": metadata '", key, "' must be an array of integers");
  out.assign(value->array_i.begin(), value->array_i.end());
  for (uint64_t u : value->array_u) {
    QSPEC_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), file.path(), ": metadata '",
                key, "' holds an out-of-range value");
    out.push_back(static_cast<int64_t>(u));
  }
  return out;
}

std::vector<float> float_array(const GgufFile& file, const std::string& key) {
  const GgufValue* value = file.find(key);
  std::vector<float> out;
  if (value == nullptr) return out;
  QSPEC_CHECK(value->type == GgufValueType::ARRAY &&
                  (value->element_type == GgufValueType::F32 || value->element_type == GgufValueType::F64),
              file.path(), ": metadata '", key, "' must be an array of floats");
  for (double f : value->array_f) out.push_back(static_cast<float>(f));
  return out;
}

// A positive size no larger than `limit` (base/limits.h), so nothing is sized from an absurd one.
int64_t required_positive(const GgufFile& file, const std::string& key, int64_t limit) {
  std::optional<int64_t> value = file.get_int(key);
  QSPEC_CHECK(value.has_value(), file.path(), ": missing metadata '", key, "'");
  QSPEC_CHECK(*value > 0 && *value <= limit, file.path(), ": metadata '", key, "' = ", *value,
              " is out of range (1..", limit, ")");
  return *value;
}

std::optional<int32_t> token_id(const GgufFile& file, const std::string& key, size_t n_tokens) {
  std::optional<int64_t> id = file.get_int(key);
  if (!id) return std::nullopt;
  if (*id < 0 || static_cast<uint64_t>(*id) >= n_tokens) {
    hf::warn(file.path() + ": " + key + " = " + std::to_string(*id) + " is not a token id (vocabulary of " +
             std::to_string(n_tokens) + "); ignored");
    return std::nullopt;
  }
  return static_cast<int32_t>(*id);
}

struct Expected {
  std::string gguf_name;
  std::string hf_name;
  std::vector<int64_t> shape;
  int64_t unpermute_heads = 0;  // > 0: q/k rows go from interleaved to rotate_half
  bool shifted_norm = false;    // llama.cpp stored 1 + w: subtract the 1 back
};

// What llama.cpp's Gemma 3 support assumes without writing it into the GGUF: every
// kGemma3GgufSwaPattern-th layer is global, the others slide with a RoPE base of
// kGemma3GgufLocalRopeTheta; the attention scale is head_dim^-1/2 except for the 62-layer 27B
// model, whose query_pre_attn_scalar is hidden / heads.
constexpr int64_t kGemma3GgufSwaPattern = 6;
constexpr double kGemma3GgufLocalRopeTheta = 10000.0;
constexpr int64_t kGemma3Gguf27bLayers = 62;

}  // namespace

void convert_gguf(const std::string& gguf_path, const std::string& out_dir, const ProgressFn& progress,
                  const GgufConvertOptions& convert_options) {
  std::unique_ptr<GgufFile> file = GgufFile::open(gguf_path);
  const std::string& path = file->path();

  std::optional<std::string> arch = file->get_string("general.architecture");
  QSPEC_CHECK(arch.has_value(), path, ": missing metadata 'general.architecture'");
  QSPEC_CHECK(*arch == "llama" || *arch == "gemma3", path, ": unsupported GGUF architecture '", *arch,
              "' in metadata 'general.architecture' (supported: llama, gemma3)");
  const bool gemma = *arch == "gemma3";
  auto key = [&](const std::string& name) { return *arch + "." + name; };

  // ---- hyper-parameters ----
  ModelConfig config;
  config.architecture = gemma ? Architecture::Gemma3 : Architecture::Llama;
  config.architecture_name = architecture_name(config.architecture);
  config.hidden_size = required_positive(*file, key("embedding_length"), kMaxHiddenSize);
  config.intermediate_size = required_positive(*file, key("feed_forward_length"), kMaxIntermediateSize);
  config.num_layers = required_positive(*file, key("block_count"), kMaxLayers);
  config.num_heads = required_positive(*file, key("attention.head_count"), kMaxHeads);
  config.num_kv_heads = file->find(key("attention.head_count_kv"))
                            ? required_positive(*file, key("attention.head_count_kv"), kMaxHeads)
                            : config.num_heads;
  QSPEC_CHECK(config.num_heads % config.num_kv_heads == 0, path, ": head_count ", config.num_heads,
              " is not a multiple of head_count_kv ", config.num_kv_heads);
  if (file->find(key("attention.key_length"))) {
    config.head_dim = required_positive(*file, key("attention.key_length"), kMaxHeadDim);
    if (file->find(key("attention.value_length"))) {
      QSPEC_CHECK(required_positive(*file, key("attention.value_length"), kMaxHeadDim) == config.head_dim, path,
                  ": attention.value_length differs from attention.key_length (not supported)");
    }
  } else {
    QSPEC_CHECK(config.hidden_size % config.num_heads == 0, path, ": embedding_length ", config.hidden_size,
                " is not a multiple of head_count ", config.num_heads);
    config.head_dim = config.hidden_size / config.num_heads;
    QSPEC_CHECK(config.head_dim <= kMaxHeadDim, path, ": head dimension ", config.head_dim,
                " (embedding_length / head_count) exceeds the supported maximum ", kMaxHeadDim);
  }
  QSPEC_CHECK(config.head_dim % 2 == 0, path, ": head dimension ", config.head_dim, " is odd");
  if (std::optional<int64_t> rope_dims = file->get_int(key("rope.dimension_count"))) {
    QSPEC_CHECK(*rope_dims == config.head_dim, path, ": rope.dimension_count ", *rope_dims,
                " differs from the head dimension ", config.head_dim, " (partial RoPE is not supported)");
  }
  config.max_position_embeddings = file->find(key("context_length")) ? required_positive(*file, key("context_length"), kMaxPositionEmbeddings) : 2048;
  config.rms_norm_eps = file->get_float(key("attention.layer_norm_rms_epsilon")).value_or(1e-5);
  QSPEC_CHECK(config.rms_norm_eps > 0 && std::isfinite(config.rms_norm_eps), path,
              ": attention.layer_norm_rms_epsilon must be positive");
  config.rope.theta = file->get_float(key("rope.freq_base")).value_or(10000.0);
  QSPEC_CHECK(config.rope.theta > 0 && std::isfinite(config.rope.theta), path, ": rope.freq_base must be positive");
  auto linear_rope = [&](double factor) {
    config.rope.type = "linear";
    config.rope.factor = factor;
  };
  const std::string scaling = file->get_string(key("rope.scaling.type")).value_or("none");
  if (scaling == "linear") {
    std::optional<double> factor = file->get_float(key("rope.scaling.factor"));
    QSPEC_CHECK(factor && *factor > 0, path, ": rope.scaling.type linear needs a positive rope.scaling.factor");
    if (*factor != 1.0) linear_rope(*factor);
  } else if (scaling != "none") {
    fail(path, ": rope scaling '", scaling, "' is not supported by the GGUF importer (supported: none, linear)");
  }
  if (std::optional<double> scale = file->get_float(key("rope.scale_linear")); scale && *scale != 1.0) {
    QSPEC_CHECK(*scale > 0, path, ": rope.scale_linear must be positive");
    linear_rope(*scale);
  }
  if (gemma) {
    config.sliding_window = required_positive(*file, key("attention.sliding_window"), kMaxPositionEmbeddings);
    RopeConfig local;
    local.theta = kGemma3GgufLocalRopeTheta;
    local.original_max_position_embeddings = config.max_position_embeddings;
    config.rope_local = local;
    config.query_pre_attn_scalar = static_cast<double>(
        config.num_layers == kGemma3Gguf27bLayers ? config.hidden_size / config.num_heads : config.head_dim);
    for (int64_t l = 0; l < config.num_layers; ++l)
      config.layer_types.push_back((l + 1) % kGemma3GgufSwaPattern == 0 ? LayerType::full_attention
                                                                          : LayerType::sliding_attention);
    if (std::optional<double> cap = file->get_float(key("final_logit_softcapping"))) {
      QSPEC_CHECK(*cap > 0 && std::isfinite(*cap), path, ": ", key("final_logit_softcapping"), " must be positive");
      config.final_logit_softcapping = *cap;
    }
    QSPEC_CHECK(!file->find(key("attn_logit_softcapping")), path, ": metadata '", key("attn_logit_softcapping"),
                "' (attention score soft-capping) is not supported");
  }
  QSPEC_CHECK(file->find_tensor("rope_freqs.weight") == nullptr, path,
              ": tensor 'rope_freqs.weight' (Llama-3.1 style RoPE frequency factors) is not supported by the "
              "GGUF importer");

  // ---- tensors ----
  const GgufTensor* embedding = file->find_tensor("token_embd.weight");
  QSPEC_CHECK(embedding != nullptr, path, ": missing tensor 'token_embd.weight'");
  QSPEC_CHECK(embedding->dims.size() == 2 && embedding->dims[0] == static_cast<uint64_t>(config.hidden_size), path,
              ": tensor 'token_embd.weight' has dims ", embedding->dims.size() == 2 ? "" : "(not 2-D) ",
              "incompatible with embedding_length ", config.hidden_size);
  QSPEC_CHECK(embedding->dims[1] > 0 && embedding->dims[1] <= static_cast<uint64_t>(kMaxVocabSize), path,
              ": tensor 'token_embd.weight' has ", embedding->dims[1], " rows (vocabulary), outside 1..",
              kMaxVocabSize);
  const int64_t vocab_size = static_cast<int64_t>(embedding->dims[1]);
  config.vocab_size = vocab_size;
  const bool has_output = file->find_tensor("output.weight") != nullptr;
  QSPEC_CHECK(!(gemma && has_output), path, ": tensor 'output.weight': Gemma 3 ties its embeddings");
  config.tie_word_embeddings = !has_output;

  const int64_t D = config.hidden_size, F = config.intermediate_size, hd = config.head_dim;
  const int64_t q_dim = config.num_heads * hd, kv_dim = config.num_kv_heads * hd;
  std::vector<Expected> expected;
  expected.push_back({"token_embd.weight", "model.embed_tokens.weight", {vocab_size, D}, 0});
  // The seven projections of a layer, which --keep-4bit imports as int4-asym.
  auto projection = [](const std::string& gguf_name) {
    for (const char* p : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
      if (gguf_name.starts_with("blk.") && gguf_name.ends_with(std::string(".") + p + ".weight")) return true;
    return false;
  };
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".";
    const std::string h = "model.layers." + std::to_string(l) + ".";
    // llama.cpp permutes Llama's q/k rows for its interleaved RoPE; Gemma 3 uses the
    // rotate_half (NEOX) layout as stored.
    const int64_t q_heads = gemma ? 0 : config.num_heads, k_heads = gemma ? 0 : config.num_kv_heads;
    expected.push_back({g + "attn_norm.weight", h + "input_layernorm.weight", {D}, 0, gemma});
    expected.push_back({g + "attn_q.weight", h + "self_attn.q_proj.weight", {q_dim, D}, q_heads});
    expected.push_back({g + "attn_k.weight", h + "self_attn.k_proj.weight", {kv_dim, D}, k_heads});
    expected.push_back({g + "attn_v.weight", h + "self_attn.v_proj.weight", {kv_dim, D}, 0});
    expected.push_back({g + "attn_output.weight", h + "self_attn.o_proj.weight", {D, q_dim}, 0});
    expected.push_back({g + "ffn_gate.weight", h + "mlp.gate_proj.weight", {F, D}, 0});
    expected.push_back({g + "ffn_up.weight", h + "mlp.up_proj.weight", {F, D}, 0});
    expected.push_back({g + "ffn_down.weight", h + "mlp.down_proj.weight", {D, F}, 0});
    if (gemma) {
      expected.push_back({g + "attn_q_norm.weight", h + "self_attn.q_norm.weight", {hd}, 0, true});
      expected.push_back({g + "attn_k_norm.weight", h + "self_attn.k_norm.weight", {hd}, 0, true});
      expected.push_back({g + "post_attention_norm.weight", h + "post_attention_layernorm.weight", {D}, 0, true});
      expected.push_back({g + "ffn_norm.weight", h + "pre_feedforward_layernorm.weight", {D}, 0, true});
      expected.push_back({g + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight", {D}, 0, true});
    } else {
      expected.push_back({g + "ffn_norm.weight", h + "post_attention_layernorm.weight", {D}, 0});
    }
  }
  expected.push_back({"output_norm.weight", "model.norm.weight", {D}, 0, gemma});
  if (has_output) expected.push_back({"output.weight", "lm_head.weight", {vocab_size, D}, 0});

  // Validate everything before the (slow) dequantization.
  std::map<std::string, bool> used;
  for (const Expected& entry : expected) {
    const GgufTensor* tensor = file->find_tensor(entry.gguf_name);
    QSPEC_CHECK(tensor != nullptr, path, ": missing tensor '", entry.gguf_name, "'");
    std::vector<int64_t> shape = tensor->shape();
    if (shape != entry.shape) {
      std::string got, want;
      for (int64_t e : shape) got += (got.empty() ? "" : ", ") + std::to_string(e);
      for (int64_t e : entry.shape) want += (want.empty() ? "" : ", ") + std::to_string(e);
      fail(path, ": tensor '", entry.gguf_name, "' has shape [", got, "] but the metadata implies [", want, "]");
    }
    const GgmlTypeInfo* info = ggml_type_info(tensor->type);
    QSPEC_CHECK(info != nullptr && info->dequantizable, path, ": tensor '", entry.gguf_name, "' has ggml type ",
                ggml_type_name(tensor->type), ", which is not supported (supported: ", kSupportedTypes, ")");
    used[entry.gguf_name] = true;
  }
  for (const GgufTensor& tensor : file->tensors()) {
    QSPEC_CHECK(used.count(tensor.name), path, ": unexpected tensor '", tensor.name,
                "' for a ", *arch, " model (biases and extra tensors are not supported by the GGUF importer)");
  }

  // ---- tokenizer (validated before writing anything) ----
  const std::string tokenizer_model = file->get_string("tokenizer.ggml.model").value_or("");
  QSPEC_CHECK(!tokenizer_model.empty(), path, ": missing metadata 'tokenizer.ggml.model'");
  const std::vector<std::string>* tokens = file->get_string_array("tokenizer.ggml.tokens");
  QSPEC_CHECK(tokens != nullptr && !tokens->empty(), path, ": missing metadata 'tokenizer.ggml.tokens'");
  QSPEC_CHECK(static_cast<int64_t>(tokens->size()) <= vocab_size, path, ": ", tokens->size(),
              " tokens but token_embd.weight has only ", vocab_size, " rows");
  if (std::optional<int64_t> declared = file->get_int(key("vocab_size"))) {
    if (*declared != vocab_size) {
      hf::warn(path + ": " + key("vocab_size") + " = " + std::to_string(*declared) +
               " differs from the embedding rows " + std::to_string(vocab_size) + "; using the latter");
    }
  }
  std::vector<int64_t> raw_types = int_array(*file, "tokenizer.ggml.token_type");
  QSPEC_CHECK(raw_types.empty() || raw_types.size() == tokens->size(), path, ": tokenizer.ggml.token_type has ",
              raw_types.size(), " entries for ", tokens->size(), " tokens");
  std::vector<hf::TokenKind> kinds(tokens->size(), hf::TokenKind::Normal);
  for (size_t id = 0; id < raw_types.size(); ++id) {
    QSPEC_CHECK(raw_types[id] >= 0 && raw_types[id] <= 6, path, ": token ", id, " has unknown token type ",
                raw_types[id]);
    if (raw_types[id] != 0) kinds[id] = static_cast<hf::TokenKind>(raw_types[id]);  // 0: undefined -> normal
  }

  hf::TokenizerOptions options;
  options.bos_id = token_id(*file, "tokenizer.ggml.bos_token_id", tokens->size());
  options.eos_id = token_id(*file, "tokenizer.ggml.eos_token_id", tokens->size());
  options.unk_id = token_id(*file, "tokenizer.ggml.unknown_token_id", tokens->size());
  options.pad_id = token_id(*file, "tokenizer.ggml.padding_token_id", tokens->size());
  for (const char* extra : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (std::optional<int32_t> id = token_id(*file, extra, tokens->size())) options.extra_eos_ids.push_back(*id);
  }
  if (gemma) {
    // Gemma's chat turns end with <end_of_turn> (its generation_config stops on it too); a
    // GGUF without a chat template gets Gemma 3's.
    const auto end_of_turn = std::find(tokens->begin(), tokens->end(), std::string(kGemmaEndOfTurn));
    if (end_of_turn != tokens->end()) {
      const int32_t id = static_cast<int32_t>(end_of_turn - tokens->begin());
      if (std::find(options.extra_eos_ids.begin(), options.extra_eos_ids.end(), id) == options.extra_eos_ids.end())
        options.extra_eos_ids.push_back(id);
    }
  }
  options.add_eos = file->get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  options.chat_template = file->get_string("tokenizer.chat_template");
  if (gemma && !options.chat_template) options.chat_template = std::string(kGemma3ChatTemplate);
  options.model_max_length = config.max_position_embeddings;

  nlohmann::json tokenizer_json;
  if (tokenizer_model == "gpt2") {
    hf::ByteLevelVocab vocab;
    vocab.tokens = *tokens;
    vocab.kinds = kinds;
    vocab.pre = file->get_string("tokenizer.ggml.pre").value_or("default");
    const std::vector<std::string>* merges = file->get_string_array("tokenizer.ggml.merges");
    QSPEC_CHECK(merges != nullptr, path, ": byte-level BPE (gpt2) tokenizer without 'tokenizer.ggml.merges'");
    vocab.merges = *merges;
    options.add_bos = file->get_bool("tokenizer.ggml.add_bos_token").value_or(false);
    options.tokenizer_class = "PreTrainedTokenizerFast";
    tokenizer_json = hf::byte_level_tokenizer_json(vocab);
  } else if (tokenizer_model == "llama") {
    hf::SentencepieceVocab vocab;
    vocab.pieces = *tokens;
    vocab.kinds = kinds;
    vocab.scores = float_array(*file, "tokenizer.ggml.scores");
    if (vocab.scores.empty()) {
      hf::warn(path + ": no tokenizer.ggml.scores; ranking merges by token id");
      for (size_t id = 0; id < tokens->size(); ++id) vocab.scores.push_back(-static_cast<float>(id));
    }
    QSPEC_CHECK(vocab.scores.size() == tokens->size(), path, ": tokenizer.ggml.scores has ", vocab.scores.size(),
                " entries for ", tokens->size(), " tokens");
    for (size_t id = 0; id < vocab.scores.size(); ++id)
      QSPEC_CHECK(std::isfinite(vocab.scores[id]), path, ": token ", id, " has a non-finite score");
    vocab.unk_id = options.unk_id;
    vocab.bos_id = options.bos_id;
    vocab.add_space_prefix = file->get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    options.add_bos = file->get_bool("tokenizer.ggml.add_bos_token").value_or(true);
    vocab.add_bos = options.add_bos;
    options.tokenizer_class = "LlamaTokenizerFast";
    tokenizer_json = hf::sentencepiece_tokenizer_json(vocab);
  } else {
    fail(path, ": tokenizer model '", tokenizer_model, "' is not supported (supported: gpt2, llama)");
  }
  config.bos_token_id = options.bos_id;
  if (options.eos_id) config.eos_token_ids = {*options.eos_id};
  config.pad_token_id = options.pad_id;
  config.torch_dtype = "float32";

  // ---- tensors -> safetensors (F32: every supported type dequantizes exactly into it) ----
  SafetensorsWriter writer;
  writer.set_metadata("format", convert_options.keep_4bit ? "qspec-4bit" : "pt");
  const size_t total = expected.size() + 1;
  size_t done = 0;
  std::map<std::string, int64_t> kept_types;         // --keep-4bit: projections kept, per ggml type
  std::map<std::string, int64_t> requantized_types;  // --keep-4bit: projections re-quantized, per ggml type
  std::map<std::string, int64_t> kept_8bit_types;    // --keep-4bit: projections kept as int8-group, per ggml type
  nlohmann::json tensor_formats = nlohmann::json::object();  // the manifest's, for the int8-group ones
  for (const Expected& entry : expected) {
    const GgufTensor& tensor = *file->find_tensor(entry.gguf_name);
    if (convert_options.keep_4bit && projection(entry.gguf_name)) {
      // Codes and (scale, minimum) pairs row by row (quant_checkpoint.h); q/k rows permuted as the
      // F32 path permutes them (each row is its own set of groups, so moving rows is exact).
      const int64_t rows = entry.shape[0], cols = entry.shape[1];
      const int64_t int8_group = convert_options.all_4bit ? 0 : gguf_int8_group_size(tensor.type);
      const quant::RowFormat format =
          int8_group > 0
              ? quant::make_row_format(quant::Format::int8_group, quant::Role::weight, cols, int8_group)
              : quant::make_row_format(quant::Format::int4_asym, quant::Role::weight, cols, kGgufInt4AsymGroup);
      std::vector<uint8_t> codes(static_cast<size_t>(rows * format.code_bytes()));
      std::vector<uint8_t> scales(static_cast<size_t>(rows * format.scale_bytes()));
      const bool exact = gguf_int4_asym_type(tensor.type);
      try {
        if (int8_group > 0) {
          gguf_to_int8_group(tensor.type, tensor.data, rows, cols, codes.data(), scales.data());
        } else if (exact) {
          gguf_to_int4_asym(tensor.type, tensor.data, rows, cols, codes.data(), scales.data());
        } else {
          // Another type (Q4_K_M mixes Q5_0, Q6_K and Q8_0 projections in): the engine's weight set
          // is one 4-bit format, so its values are re-quantized into int4-asym g32 on the grids of
          // least squared error, in the file's row order (permuted below like the kept blocks).
          const std::vector<float> values = file->dequantize(tensor);
          for (int64_t row = 0; row < rows; ++row)
            quant::quantize_row(format, values.data() + row * cols, codes.data() + row * format.code_bytes(),
                                scales.data() + row * format.scale_bytes(), quant::BlockFit::mse);
        }
      } catch (const Error& error) {
        fail(path, ": tensor '", entry.gguf_name, "': ", error.what());
      }
      if (entry.unpermute_heads > 0) {
        auto permute = [&](std::vector<uint8_t>& bytes, int64_t width) {
          std::vector<uint8_t> moved(bytes.size());
          for (int64_t row = 0; row < rows; ++row)
            std::copy_n(bytes.begin() + hf::interleaved_source_row(row, hd) * width, width,
                        moved.begin() + row * width);
          bytes = std::move(moved);
        };
        permute(codes, format.code_bytes());
        permute(scales, format.scale_bytes());
      }
      writer.add(entry.hf_name + ".qcodes", DType::U8, {rows, format.code_bytes()}, codes.data(), codes.size());
      writer.add(entry.hf_name + ".qscales", DType::U8, {rows, format.scale_bytes()}, scales.data(), scales.size());
      if (int8_group > 0) {
        ++kept_8bit_types[ggml_type_name(tensor.type)];
        tensor_formats[entry.hf_name] = {{"format", quant::format_name(quant::Format::int8_group)},
                                         {"group_size", int8_group}};
      } else {
        ++(exact ? kept_types : requantized_types)[ggml_type_name(tensor.type)];
      }
      if (progress) progress(++done, total);
      continue;
    }
    std::vector<float> values = file->dequantize(tensor);
    if (entry.unpermute_heads > 0)
      hf::interleaved_to_half_rows(values.data(), entry.unpermute_heads, hd, entry.shape[1]);
    if (entry.shifted_norm)
      for (float& value : values) value -= 1.0f;
    writer.add(entry.hf_name, DType::F32, entry.shape, values.data(), values.size() * sizeof(float));
    if (progress) progress(++done, total);
  }

  hf::write_model_directory(out_dir, writer, config, tokenizer_json, options, *tokens);
  if (convert_options.keep_4bit) {
    // The manifest of a qspec 4-bit checkpoint (model/quant_checkpoint.h).
    nlohmann::json types = nlohmann::json::object(), requantized = nlohmann::json::object(),
                   kept_8bit = nlohmann::json::object();
    for (const auto& [type, count] : kept_types) types[type] = count;
    for (const auto& [type, count] : requantized_types) requantized[type] = count;
    for (const auto& [type, count] : kept_8bit_types) kept_8bit[type] = count;
    nlohmann::json manifest = {
        {"qspec_quantization", kQuantManifestVersion},
        {"format", quant::format_name(quant::Format::int4_asym)},
        {"group_size", kGgufInt4AsymGroup},
        {"method", "gguf"},
        {"details",
         {{"gguf_types", types}, {"int8_group_types", kept_8bit}, {"requantized_types", requantized},
          {"requantized_fit", "mse"}}},
        {"tool", convert_options.all_4bit ? "qspec convert gguf --keep-4bit --all-4bit" : "qspec convert gguf --keep-4bit"},
        {"source", gguf_path}};
    if (!tensor_formats.empty()) manifest[kQuantTensorFormatsField] = tensor_formats;
    hf::write_json(std::filesystem::path(out_dir) / kQuantManifestFile, manifest);
  }
  if (progress) progress(total, total);
}

}  // namespace qspec
