// safetensors reader / writer / sharded checkpoint: round trips, every validation the
// reader promises (each must be a qspec::Error naming the file and tensor), and the real
// bundled sharded model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "qspec/error.h"

namespace fs = std::filesystem;
using qspec::Checkpoint;
using qspec::DType;
using qspec::SafetensorsFile;
using qspec::SafetensorsWriter;
using qspec::TensorView;

namespace {

constexpr DType kAllDTypes[] = {
    DType::F64, DType::F32,  DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
    DType::F8_E8M0, DType::I64, DType::I32, DType::I16, DType::I8, DType::U64,
    DType::U32, DType::U16, DType::U8,  DType::BOOL,
};

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "qspec_safetensors_XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string length_prefix(uint64_t length) {
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return prefix;
}

// A raw safetensors file: length prefix, the header text as given, then `data_bytes` bytes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  return length_prefix(header.size()) + header + std::string(data_bytes, '\x5a');
}

// The message of the qspec::Error that fn throws; a test failure when it throws nothing.
// Any other exception type escapes and fails the test too.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const qspec::Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a qspec::Error";
  return "";
}

// Writes `bytes` as a file, expects open() to reject it with a message naming the file and
// containing every one of `needles`.
void expect_rejected(const std::string& bytes, std::initializer_list<std::string> needles) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  EXPECT_THROW(SafetensorsFile::open(path), qspec::Error);
  const std::string message = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  for (const std::string& needle : needles)
    EXPECT_NE(message.find(needle), std::string::npos) << "missing '" << needle << "' in: " << message;
}

void expect_header_rejected(const std::string& header, size_t data_bytes,
                            std::initializer_list<std::string> needles) {
  SCOPED_TRACE(header);
  expect_rejected(raw_file(header, data_bytes), needles);
}

std::vector<uint8_t> pattern_bytes(size_t count, uint8_t seed) {
  std::vector<uint8_t> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 31);
  return bytes;
}

// Writes a small single-tensor-per-name file with F32 data of the given element counts.
void write_f32_file(const std::string& path, const std::vector<std::pair<std::string, int64_t>>& tensors) {
  SafetensorsWriter writer;
  for (const auto& [name, count] : tensors) {
    std::vector<float> values(static_cast<size_t>(count));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) + 0.5f;
    writer.add(name, DType::F32, {count}, values.data(), values.size() * sizeof(float));
  }
  writer.write(path);
}

}  // namespace

// ---- writer -> reader round trips ----

TEST(Safetensors, RoundTripEveryDType) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("note", "round trip");
  std::vector<std::vector<uint8_t>> originals;
  uint8_t seed = 1;
  // Added in reverse so the writer's sort-by-name is exercised.
  for (auto it = std::rbegin(kAllDTypes); it != std::rend(kAllDTypes); ++it) {
    const size_t bytes = 3 * 5 * qspec::dtype_size(*it);
    originals.push_back(pattern_bytes(bytes, seed++));
    writer.add("t_" + std::string(qspec::dtype_name(*it)), *it, {3, 5}, originals.back().data(),
               bytes);
  }
  writer.write(path);

  auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file->tensors().size(), std::size(kAllDTypes));
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "round trip");
  size_t index = 0;
  for (auto it = std::rbegin(kAllDTypes); it != std::rend(kAllDTypes); ++it, ++index) {
    const std::string name = "t_" + std::string(qspec::dtype_name(*it));
    SCOPED_TRACE(name);
    const TensorView* view = file->find(name);
    ASSERT_NE(view, nullptr);
    EXPECT_EQ(view->dtype, *it);
    EXPECT_EQ(view->shape, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(view->numel(), 15);
    EXPECT_EQ(view->file, path);
    ASSERT_EQ(view->nbytes, originals[index].size());
    EXPECT_EQ(std::vector<uint8_t>(view->data, view->data + view->nbytes), originals[index]);
  }
  EXPECT_EQ(file->find("missing"), nullptr);

  // Layout: header padded with spaces to a multiple of 8, tensors sorted by name and
  // contiguous from offset 0 to the end of the file.
  const std::string bytes = read_bytes(path);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_length % 8, 0u);
  const std::string header_text = bytes.substr(8, header_length);
  EXPECT_EQ(header_text.front(), '{');
  EXPECT_EQ(header_text.find_last_not_of(' '), header_text.find_last_of('}'));
  const auto header = nlohmann::json::parse(header_text);
  uint64_t expected_begin = 0;
  std::string previous_name;
  for (const auto& [name, entry] : header.items()) {  // nlohmann iterates in name order
    if (name == "__metadata__") continue;
    EXPECT_LT(previous_name, name);
    previous_name = name;
    EXPECT_EQ(entry["data_offsets"][0].get<uint64_t>(), expected_begin) << name;
    expected_begin = entry["data_offsets"][1].get<uint64_t>();
  }
  EXPECT_EQ(8 + header_length + expected_begin, bytes.size());
  // The data section starts 8-byte aligned in the mapping (the first tensor by name is at
  // offset 0); tensors after it are packed, so their alignment is up to their sizes.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file->tensors().front().data) % 8, 0u);
}

TEST(Safetensors, ZeroSizedScalarAndEmptyFiles) {
  TempDir dir;
  const std::string path = dir.file("edge.safetensors");
  SafetensorsWriter writer;
  const float scalar = 2.5f;
  writer.add("scalar", DType::F32, {}, &scalar, sizeof scalar);
  writer.add("empty", DType::BF16, {0, 7}, nullptr, 0);
  writer.add("also_empty", DType::I8, {3, 0}, nullptr, 0);
  writer.write(path);
  auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->find("scalar")->numel(), 1);
  EXPECT_TRUE(file->find("scalar")->shape.empty());
  float read_back = 0;
  std::memcpy(&read_back, file->find("scalar")->data, sizeof read_back);
  EXPECT_EQ(read_back, 2.5f);
  EXPECT_EQ(file->find("empty")->nbytes, 0u);
  EXPECT_EQ(file->find("empty")->numel(), 0);
  EXPECT_EQ(file->find("also_empty")->shape, (std::vector<int64_t>{3, 0}));

  // A file with no tensors at all is valid too.
  const std::string none = dir.file("none.safetensors");
  SafetensorsWriter().write(none);
  EXPECT_TRUE(SafetensorsFile::open(none)->tensors().empty());
}

TEST(Safetensors, AcceptsLegalHandWrittenHeaders) {
  TempDir dir;
  const std::string path = dir.file("ok.safetensors");
  // Zero-sized tensors at any offset (even inside another's range), unknown extra keys,
  // surrounding whitespace and a gap in the data section are all legal.
  write_bytes(path, raw_file(R"(  {"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8],"extra":1},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[5,5]},)"
                             R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("__metadata__":{}}   )",
                             8));
  auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->tensors()[0].name, "a");  // sorted by name
  EXPECT_EQ(file->tensors()[2].name, "z");
  EXPECT_TRUE(file->metadata().empty());
}

// ---- every validation failure ----

TEST(Safetensors, RejectsShortFilesAndBadHeaderLengths) {
  expect_rejected("", {"too short"});
  expect_rejected("1234567", {"too short"});
  expect_rejected(length_prefix(1000) + "{}", {"larger than the file"});
  expect_rejected(length_prefix(3), {"larger than the file"});
  expect_rejected(length_prefix(200ull * 1000 * 1000) + "{}", {"absurd"});
  expect_rejected(length_prefix(~0ull) + "{}", {"absurd"});
}

TEST(Safetensors, RejectsBadJson) {
  expect_header_rejected("{not json", 0, {"invalid JSON"});
  expect_header_rejected("", 0, {"invalid JSON"});
  expect_header_rejected(R"({"a":{"dtype":"F32"}} trailing)", 0, {"invalid JSON"});
  expect_header_rejected("[1,2]", 0, {"not a JSON object"});
  expect_header_rejected("\"text\"", 0, {"not a JSON object"});
  expect_header_rejected("17", 0, {"not a JSON object"});
  std::string deep = "{\"t\":" + std::string(5000, '[') + std::string(5000, ']') + "}";
  expect_header_rejected(deep, 0, {"nests deeper"});
}

TEST(Safetensors, RejectsMalformedEntries) {
  expect_header_rejected(R"({"w":5})", 0, {"'w'", "not a JSON object"});
  expect_header_rejected(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, {"'w'", "dtype"});
  expect_header_rejected(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4, {"'w'", "shape"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[1]}})", 4, {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", 4,
                         {"'w'", "dtype"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4,
                         {"'w'", "shape"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":{"n":1},"data_offsets":[0,4]}})", 4,
                         {"'w'", "shape"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":{"b":0}}})", 4,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", 4,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})", 4,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]}})", 4,
                         {"'w'", "data_offsets"});
}

TEST(Safetensors, RejectsUnknownDType) {
  expect_header_rejected(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16,
                         {"'w'", "unknown dtype 'F128'"});
  expect_header_rejected(R"({"w":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}})", 2,
                         {"'w'", "unknown dtype"});
}

TEST(Safetensors, RejectsBadShapes) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[-1,2],"data_offsets":[0,0]}})", 0,
                         {"'w'", "negative"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2,
                         {"'w'", "not an integer"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2,
                         {"'w'", "not an integer"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2,
                         {"'w'", "not an integer"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[null],"data_offsets":[0,2]}})", 2,
                         {"'w'", "not an integer"});
  // Products that overflow 64 bits, a single dimension beyond int64, and a numel that fits
  // but whose byte count does not.
  expect_header_rejected(
      R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
      {"'w'", "63 bits"});
  expect_header_rejected(
      R"({"w":{"dtype":"U8","shape":[3,3074457345618258603],"data_offsets":[0,0]}})", 0,
      {"'w'", "63 bits"});
  expect_header_rejected(
      R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0,
      {"'w'", "too large"});
  expect_header_rejected(
      R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}})", 0,
      {"'w'", "not an integer"});
  expect_header_rejected(
      R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
      {"'w'", "overflows"});
}

TEST(Safetensors, RejectsBadDataOffsets) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 8,
                         {"'w'", "after end"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12,
                         {"'w'", "beyond the data section"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}})", 8,
                         {"'w'", "beyond the data section"});
  expect_header_rejected(
      R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})",
      8, {"'w'", "beyond the data section"});
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16,
                         {"'w'", "needs 16"});
  expect_header_rejected(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", 16,
                         {"'w'", "needs 4"});
}

TEST(Safetensors, RejectsOverlappingTensors) {
  expect_header_rejected(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                         12, {"'b'", "overlaps", "'a'"});
  // Identical ranges, and one range inside another.
  expect_header_rejected(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                         4, {"overlaps"});
  expect_header_rejected(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                         R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},)"
                         R"("c":{"dtype":"U8","shape":[2],"data_offsets":[16,18]}})",
                         18, {"'b'", "overlaps", "'a'"});
}

TEST(Safetensors, RejectsDuplicateNames) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                         8, {"duplicate", "'w'"});
  expect_header_rejected(R"({"w":{"dtype":"U8","dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4,
                         {"duplicate key 'dtype'", "'w'"});
  expect_header_rejected(R"({"__metadata__":{"k":"a","k":"b"}})", 0, {"duplicate key 'k'"});
}

TEST(Safetensors, RejectsBadMetadata) {
  expect_header_rejected(R"({"__metadata__":["format","pt"]})", 0, {"__metadata__"});
  expect_header_rejected(R"({"__metadata__":"pt"})", 0, {"__metadata__"});
  expect_header_rejected(R"({"__metadata__":{"format":1}})", 0, {"__metadata__", "'format'"});
  expect_header_rejected(R"({"__metadata__":{"format":{"a":"b"}}})", 0, {"__metadata__"});
}

TEST(Safetensors, OpenReportsMissingAndUnreadablePaths) {
  TempDir dir;
  const std::string missing = dir.file("nope.safetensors");
  const std::string message = error_of([&] { SafetensorsFile::open(missing); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  const std::string directory_message = error_of([&] { SafetensorsFile::open(dir.str()); });
  EXPECT_NE(directory_message.find(dir.str()), std::string::npos) << directory_message;
}

TEST(Safetensors, ParseHeaderOnPartialBuffer) {
  // The fuzz target's view: the header alone, claiming a longer file. Tensors past the buffer
  // parse but get no data pointer.
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string bytes = length_prefix(header.size()) + header;
  std::vector<TensorView> tensors;
  std::map<std::string, std::string> metadata;
  SafetensorsFile::parse_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                bytes.size() + 8, "mem", &tensors, &metadata);
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].data, nullptr);
  EXPECT_EQ(tensors[0].nbytes, 8u);
  // The data section it needs is missing from a buffer that is the whole file.
  const std::string message = error_of([&] {
    SafetensorsFile::parse_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  bytes.size(), "mem", nullptr, nullptr);
  });
  EXPECT_NE(message.find("mem: tensor 'w'"), std::string::npos) << message;
  EXPECT_THROW(SafetensorsFile::parse_header(reinterpret_cast<const uint8_t*>(bytes.data()),
                                             bytes.size(), 8, "mem", nullptr, nullptr),
               qspec::Error);
}

// ---- writer errors ----

TEST(Safetensors, WriterRejectsBadTensors) {
  SafetensorsWriter writer;
  const std::vector<uint8_t> bytes(16);
  writer.add("w", DType::F32, {4}, bytes.data(), 16);
  std::string message = error_of([&] { writer.add("w", DType::F32, {4}, bytes.data(), 16); });
  EXPECT_NE(message.find("'w'"), std::string::npos) << message;
  message = error_of([&] { writer.add("x", DType::F32, {2, 3}, bytes.data(), 16); });
  EXPECT_NE(message.find("'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("24"), std::string::npos) << message;
  EXPECT_THROW(writer.add("y", DType::U8, {-1}, bytes.data(), 0), qspec::Error);
  EXPECT_THROW(writer.add("y", DType::U8, {4}, nullptr, 4), qspec::Error);
  EXPECT_THROW(writer.add("__metadata__", DType::U8, {1}, bytes.data(), 1), qspec::Error);
  EXPECT_THROW(writer.add("", DType::U8, {1}, bytes.data(), 1), qspec::Error);
  EXPECT_THROW(writer.add("z", DType::U64, {INT64_MAX / 4, 4}, bytes.data(), 0), qspec::Error);
}

TEST(Safetensors, WriterReportsIoErrorsAndReplacesAtomically) {
  TempDir dir;
  const std::string unwritable = dir.file("no_such_dir/out.safetensors");
  SafetensorsWriter writer;
  const uint8_t byte = 7;
  writer.add("b", DType::U8, {1}, &byte, 1);
  const std::string message = error_of([&] { writer.write(unwritable); });
  EXPECT_NE(message.find(unwritable), std::string::npos) << message;

  // Writing over an existing file replaces it and leaves no temporary files behind.
  const std::string path = dir.file("out.safetensors");
  write_bytes(path, "old contents");
  writer.write(path);
  EXPECT_EQ(SafetensorsFile::open(path)->find("b")->data[0], 7);
  size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.str())) {
    ++entries;
    EXPECT_EQ(entry.path().filename(), "out.safetensors");
  }
  EXPECT_EQ(entries, 1u);

  // A name that is not UTF-8 cannot go in a JSON header.
  SafetensorsWriter bad_name;
  bad_name.add("\xff\xfe", DType::U8, {1}, &byte, 1);
  EXPECT_THROW(bad_name.write(dir.file("bad.safetensors")), qspec::Error);
}

// ---- checkpoints ----

TEST(Safetensors, CheckpointSingleFile) {
  TempDir dir;
  write_f32_file(dir.file("model.safetensors"), {{"a", 3}, {"b", 5}});
  Checkpoint checkpoint = Checkpoint::open(dir.str());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(checkpoint.get("b").numel(), 5);
  EXPECT_EQ(checkpoint.find("c"), nullptr);
  EXPECT_EQ(checkpoint.dir(), dir.str());
  const std::string message = error_of([&] { checkpoint.get("c"); });
  EXPECT_NE(message.find("'c'"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.str()), std::string::npos) << message;
}

TEST(Safetensors, CheckpointMissingFiles) {
  TempDir dir;
  const std::string message = error_of([&] { Checkpoint::open(dir.str()); });
  EXPECT_EQ(message, "no model.safetensors or model.safetensors.index.json in " + dir.str());
}

namespace {

void write_index(const TempDir& dir, const nlohmann::json& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  write_bytes(dir.file("model.safetensors.index.json"), index.dump(2));
}

}  // namespace

TEST(Safetensors, ShardedCheckpointRoundTrip) {
  TempDir dir;
  SafetensorsWriter first;
  first.set_metadata("format", "pt");
  const std::vector<float> embed = {1, 2, 3, 4, 5, 6};
  first.add("embed", DType::F32, {2, 3}, embed.data(), embed.size() * 4);
  first.write(dir.file("model-00001-of-00002.safetensors"));
  SafetensorsWriter second;
  const std::vector<uint16_t> head = {0x3f80, 0x4000};
  second.add("head", DType::BF16, {2}, head.data(), 4);
  second.add("norm", DType::BF16, {1}, head.data(), 2);
  second.write(dir.file("model-00002-of-00002.safetensors"));
  write_index(dir, {{"embed", "model-00001-of-00002.safetensors"},
                    {"head", "model-00002-of-00002.safetensors"},
                    {"norm", "model-00002-of-00002.safetensors"}});

  Checkpoint checkpoint = Checkpoint::open(dir.str());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"embed", "head", "norm"}));
  EXPECT_EQ(checkpoint.metadata().at("format"), "pt");
  const TensorView& embed_view = checkpoint.get("embed");
  EXPECT_EQ(embed_view.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_NE(embed_view.file.find("model-00001-of-00002"), std::string::npos);
  float last = 0;
  std::memcpy(&last, embed_view.data + 5 * 4, 4);
  EXPECT_EQ(last, 6.0f);
  EXPECT_EQ(checkpoint.get("head").dtype, DType::BF16);
  EXPECT_NE(checkpoint.get("head").file.find("model-00002-of-00002"), std::string::npos);

  // Views outlive moves and copies of the Checkpoint (the files are shared).
  Checkpoint moved = std::move(checkpoint);
  Checkpoint copy = moved;
  uint16_t bits = 0;
  std::memcpy(&bits, copy.get("head").data + 2, 2);
  EXPECT_EQ(bits, 0x4000);
}

TEST(Safetensors, ShardedCheckpointErrors) {
  {  // a shard the index names does not exist
    TempDir dir;
    write_f32_file(dir.file("s1.safetensors"), {{"a", 1}});
    write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    const std::string message = error_of([&] { Checkpoint::open(dir.str()); });
    EXPECT_NE(message.find("s2.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find("missing"), std::string::npos) << message;
  }
  {  // an indexed tensor is not in the shard the index names
    TempDir dir;
    write_f32_file(dir.file("s1.safetensors"), {{"a", 1}});
    write_f32_file(dir.file("s2.safetensors"), {{"b", 1}});
    write_index(dir, {{"a", "s2.safetensors"}, {"b", "s2.safetensors"}});
    const std::string message = error_of([&] { Checkpoint::open(dir.str()); });
    EXPECT_NE(message.find("'a'"), std::string::npos) << message;
    EXPECT_NE(message.find("s2.safetensors"), std::string::npos) << message;
  }
  {  // one tensor in two shards
    TempDir dir;
    write_f32_file(dir.file("s1.safetensors"), {{"a", 1}, {"b", 2}});
    write_f32_file(dir.file("s2.safetensors"), {{"b", 2}});
    write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    const std::string message = error_of([&] { Checkpoint::open(dir.str()); });
    EXPECT_NE(message.find("'b'"), std::string::npos) << message;
    EXPECT_NE(message.find("s1.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find("s2.safetensors"), std::string::npos) << message;
  }
  {  // a corrupt shard is reported with its own path
    TempDir dir;
    write_bytes(dir.file("s1.safetensors"), "junk");
    write_index(dir, {{"a", "s1.safetensors"}});
    const std::string message = error_of([&] { Checkpoint::open(dir.str()); });
    EXPECT_NE(message.find(dir.file("s1.safetensors")), std::string::npos) << message;
  }
  {  // malformed indexes
    TempDir dir;
    const std::string index_path = dir.file("model.safetensors.index.json");
    write_bytes(index_path, "{oops");
    EXPECT_NE(error_of([&] { Checkpoint::open(dir.str()); }).find(index_path), std::string::npos);
    write_bytes(index_path, R"({"metadata":{}})");
    EXPECT_NE(error_of([&] { Checkpoint::open(dir.str()); }).find("weight_map"), std::string::npos);
    write_bytes(index_path, R"({"weight_map":{"a":3}})");
    EXPECT_NE(error_of([&] { Checkpoint::open(dir.str()); }).find("'a'"), std::string::npos);
    write_bytes(index_path, R"({"weight_map":{"a":"s.safetensors","a":"t.safetensors"}})");
    EXPECT_NE(error_of([&] { Checkpoint::open(dir.str()); }).find("duplicate key 'a'"),
              std::string::npos);
    write_bytes(index_path, R"({"weight_map":{"a":"../elsewhere.safetensors"}})");
    EXPECT_NE(error_of([&] { Checkpoint::open(dir.str()); }).find("outside"), std::string::npos);
  }
}

// ---- the bundled sharded model ----

TEST(Safetensors, BundledShardedModel) {
  const std::string dir = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
  Checkpoint checkpoint = Checkpoint::open(dir);
  // embed + final norm + lm_head, and 9 tensors in each of 8 layers.
  EXPECT_EQ(checkpoint.names().size(), 3u + 8u * 9u);
  for (int layer = 0; layer < 8; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    EXPECT_NE(checkpoint.find(prefix + "self_attn.q_proj.weight"), nullptr) << layer;
    EXPECT_NE(checkpoint.find(prefix + "mlp.down_proj.weight"), nullptr) << layer;
  }
  EXPECT_EQ(checkpoint.find("model.layers.8.self_attn.q_proj.weight"), nullptr);

  const TensorView& embed = checkpoint.get("model.embed_tokens.weight");
  EXPECT_EQ(embed.dtype, DType::BF16);
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{477, 256}));
  EXPECT_EQ(embed.nbytes, 477u * 256u * 2u);
  EXPECT_EQ(checkpoint.get("lm_head.weight").shape, (std::vector<int64_t>{477, 256}));
  EXPECT_EQ(checkpoint.get("model.norm.weight").shape, (std::vector<int64_t>{256}));
  // 8 query heads and 4 key/value heads of 32, intermediate size 704.
  EXPECT_EQ(checkpoint.get("model.layers.3.self_attn.q_proj.weight").shape,
            (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(checkpoint.get("model.layers.3.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(checkpoint.get("model.layers.7.mlp.gate_proj.weight").shape,
            (std::vector<int64_t>{704, 256}));
  EXPECT_EQ(checkpoint.get("model.layers.7.mlp.down_proj.weight").shape,
            (std::vector<int64_t>{256, 704}));
  for (const std::string& name : checkpoint.names())
    EXPECT_EQ(checkpoint.get(name).dtype, DType::BF16) << name;

  // The weights are real numbers, not all zero.
  bool any_nonzero = false;
  for (size_t i = 0; i < embed.nbytes / 2; ++i) {
    uint16_t bits;
    std::memcpy(&bits, embed.data + 2 * i, 2);
    const float value = qspec::bf16_to_f32(bits);
    ASSERT_TRUE(std::isfinite(value)) << i;
    any_nonzero |= value != 0.0f;
  }
  EXPECT_TRUE(any_nonzero);
  const std::string message = error_of([&] { checkpoint.get("model.layers.9.mlp.up_proj.weight"); });
  EXPECT_NE(message.find("model.layers.9.mlp.up_proj.weight"), std::string::npos);
  EXPECT_NE(message.find(dir), std::string::npos);
}
