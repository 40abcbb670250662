// GGUF (v2 / v3) reader and ggml dequantization, as llama.cpp's gguf and ggml define them.
// Every structural violation (truncation, counts larger than the file could hold, unknown
// value or tensor types, misaligned or out-of-range tensor data) is a qspec::Error that
// names the file and the key or tensor at fault.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qspec {

namespace hf {
class MappedFile;
}

enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);

// One metadata value. Scalars live in the field their type uses; arrays hold scalars or
// strings (arrays of arrays are rejected).
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  GgufValueType element_type = GgufValueType::U8;  // for ARRAY
  uint64_t u = 0;      // U8..U64 and BOOL
  int64_t i = 0;       // I8..I64
  double f = 0;        // F32, F64
  std::string str;     // STRING
  // ARRAY: numbers widened as above, one vector in use depending on element_type.
  std::vector<uint64_t> array_u;
  std::vector<int64_t> array_i;
  std::vector<double> array_f;
  std::vector<std::string> array_str;

  bool is_integer() const;
  bool is_number() const;  // integer or float
  size_t array_size() const;
};

// ggml tensor types (the values of ggml_type).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeInfo {
  const char* name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
  bool dequantizable;   // supported by gguf_dequantize
};
// nullptr for a type id this reader does not know.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
std::string ggml_type_name(uint32_t type);  // "Q4_K", or "type 123"

struct GgufTensor {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] varies fastest (columns)
  uint32_t type = 0;
  uint64_t offset = 0;  // from the start of the data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  uint64_t numel = 0;
  // Shape in row-major (PyTorch / safetensors) order: dims reversed.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses and validates a whole file image (used by open() and by tests / fuzzing). The
  // tensors point into `bytes`, which must outlive the result.
  static std::unique_ptr<GgufFile> parse(const uint8_t* bytes, size_t size, const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;

  // Metadata accessors; all throw qspec::Error naming the file and key on a wrong type.
  const GgufValue* find(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;  // float or integer
  std::optional<bool> get_bool(const std::string& key) const;
  const std::vector<std::string>* get_string_array(const std::string& key) const;

  // The tensor's values as float32 (dequantized exactly as ggml does).
  std::vector<float> dequantize(const GgufTensor& tensor) const;

 private:
  GgufFile() = default;
  std::string path_;
  std::unique_ptr<hf::MappedFile> mapping_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

// Dequantizes `count` elements (a multiple of the type's block size) of `type` from `src`
// (count / block_size * type_size bytes) into `dst`. Throws for unsupported types.
void gguf_dequantize(uint32_t type, const uint8_t* src, size_t count, float* dst);

// GGUF 4-bit blocks as int4-asym rows (quant/formats.h), group kGgufInt4AsymGroup:
//   Q4_0  d * (q - 8)        -> scale d, minimum -8 d
//   Q4_1  d * q + m          -> scale d, minimum m
//   Q4_K  each 32-value sub-block j of a 256-value super-block: (d * sc_j) * q - dmin * m_j
//         (sc_j, m_j the 6-bit scale and minimum)   -> scale d * sc_j, minimum -(dmin * m_j)
// with d, m, dmin f16 widened to f32 and the 4-bit q moved into the engine's nibble order
// (element 2i low, 2i + 1 high). Every product above is exact in f32 (at most 11 + 6 + 4
// significant bits), so fma(q, scale, minimum) is exactly what gguf_dequantize and the gguf
// Python package compute, bit for bit, with one exception: Q4_0's zero (q = 8) under a negative
// d is +0 here (the exact sum 8d - 8d) where ggml's d * 0 is -0; the two compare equal and only
// the sign of a zero result can follow it. A scale may be negative (ggml's Q4_0 stores
// d = max / -8).
// src: `rows` rows of `cols` values (cols a multiple of the type's block); codes: rows x cols / 2
// bytes; scales: rows x (cols / 32) x kInt4AsymScaleBytes. Throws for other types and for
// non-finite scales or minimums (naming the row and block).
inline constexpr int64_t kGgufInt4AsymGroup = 32;
bool gguf_int4_asym_type(uint32_t type);  // Q4_0, Q4_1, Q4_K
void gguf_to_int4_asym(uint32_t type, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* codes,
                       uint8_t* scales);

// GGUF 5-, 6- and 8-bit blocks as int8-group rows (quant/formats.h), value = code * scale:
//   Q8_0  d * q                 -> group 32, scale d, code q (-128..127)
//   Q5_0  d * (q - 16)          -> group 32, scale d, code q - 16 (-16..15)
//   Q6_K  (d * sc_j) * (q - 32) for each 16-value sub-block j (sc_j an int8)
//                               -> group 16, scale d * sc_j (exact in f32: 19 bits), code q - 32
// with d f16 widened to f32: code * scale rounds as ggml's own dequantization does (the same
// product of the same two numbers), so the values are gguf_dequantize's bit for bit.
// gguf_int8_group_size: the group of a type that has this form (32, 32, 16), else 0.
// src: `rows` rows of `cols` values; codes: rows x cols bytes; scales: rows x (cols / group) x 4
// bytes. Throws for other types and for non-finite scales (naming the row).
int64_t gguf_int8_group_size(uint32_t type);
void gguf_to_int8_group(uint32_t type, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* codes,
                        uint8_t* scales);

}  // namespace qspec
