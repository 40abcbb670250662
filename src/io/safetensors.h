// safetensors: memory-mapped reader (single file, or sharded with model.safetensors.index.json)
// and a writer. Every structural violation is a qspec::Error naming the file and tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace qspec {

// A tensor inside a mapped file: a view, valid while its SafetensorsFile / Checkpoint lives.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the file it lives in (for error messages)

  int64_t numel() const;
};

// One .safetensors file, mmap'ed read-only and fully validated at open().
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Validates a header buffer as if it were the start of a file of file_size bytes
  // (used by open() and by the fuzz target). Throws qspec::Error on any violation.
  static void parse_header(const uint8_t* bytes, size_t size, size_t file_size,
                           const std::string& path, std::vector<TensorView>* tensors,
                           std::map<std::string, std::string>* metadata);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards named by
// model.safetensors.index.json (every shard must exist; every indexed tensor must be in
// the shard the index names; no tensor may appear twice across shards).
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);
  const TensorView& get(const std::string& name) const;  // throws naming the tensor
  const TensorView* find(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> by_name_;
  std::map<std::string, std::string> metadata_;  // from the first file
};

// Collects tensors and writes one .safetensors file (header padded to 8 bytes).
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
           size_t nbytes);  // copies data; checks shape x dtype == nbytes and unique name
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;  // throws qspec::Error on I/O failure

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace qspec
