// safetensors reader (mmap, every header field validated), sharded checkpoints and the writer.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "base/files.h"
#include "qspec/error.h"

namespace qspec {

namespace {

using nlohmann::json;

// Real headers are a few hundred KB at most; a bigger length field means a corrupt file,
// and refusing it early keeps a bad file from making us parse gigabytes of garbage.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
// A safetensors header nests at most three deep (root -> entry -> shape array); the limit
// leaves slack while keeping hostile nesting from costing stack or time.
constexpr size_t kMaxJsonDepth = 16;
constexpr size_t kLengthPrefixBytes = 8;

std::string errno_text(int error_number) { return std::strerror(error_number); }

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// Parses JSON text, rejecting what nlohmann would otherwise accept silently: a key repeated
// within one object (the last value would win, hiding the first) and absurd nesting.
// `where` prefixes every error message (the file path).
json parse_json_strictly(const char* begin, const char* end, const std::string& where) {
  std::vector<std::set<std::string>> keys_per_open_object;
  size_t open_containers = 0;  // objects and arrays, for the nesting limit
  std::string top_level_key;   // the entry being parsed, for naming it in errors
  auto on_event = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (++open_containers > kMaxJsonDepth)
          fail(where, ": JSON nests deeper than ", kMaxJsonDepth, " levels");
        if (event == json::parse_event_t::object_start) keys_per_open_object.emplace_back();
        break;
      case json::parse_event_t::object_end:
        --open_containers;
        keys_per_open_object.pop_back();
        break;
      case json::parse_event_t::array_end:
        --open_containers;
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (keys_per_open_object.size() == 1) top_level_key = key;
        if (!keys_per_open_object.back().insert(key).second) {
          if (keys_per_open_object.size() == 1) fail(where, ": duplicate key '", key, "'");
          fail(where, ": duplicate key '", key, "' inside entry '", top_level_key, "'");
        }
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, on_event, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& error) {
    fail(where, ": invalid JSON: ", error.what());
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(shape[i]);
  }
  text += ']';
  return text;
}

// One header entry -> TensorView (data left unset). `data_bytes` is the size of the data
// section that follows the header.
TensorView parse_entry(const std::string& path, const std::string& name, const json& entry,
                       uint64_t data_bytes, uint64_t* begin_out) {
  auto bad = [&](auto&&... parts) {
    fail(path, ": tensor '", name, "': ", std::forward<decltype(parts)>(parts)...);
  };
  if (!entry.is_object()) bad("entry is not a JSON object");

  TensorView view;
  view.name = name;
  view.file = path;

  const auto dtype_field = entry.find("dtype");
  if (dtype_field == entry.end()) bad("missing \"dtype\"");
  if (!dtype_field->is_string()) bad("\"dtype\" is not a string");
  const std::string& dtype_text = dtype_field->get_ref<const std::string&>();
  if (!parse_dtype(dtype_text, &view.dtype)) bad("unknown dtype '", dtype_text, "'");

  const auto shape_field = entry.find("shape");
  if (shape_field == entry.end()) bad("missing \"shape\"");
  if (!shape_field->is_array()) bad("\"shape\" is not an array");
  uint64_t numel = 1;
  for (const json& dim : *shape_field) {
    if (dim.is_number_integer() && !dim.is_number_unsigned()) bad("negative shape dimension ", dim.dump());
    if (!dim.is_number_unsigned()) bad("shape dimension ", dim.dump(), " is not an integer");
    const uint64_t extent = dim.get<uint64_t>();
    if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad("shape dimension ", extent, " is too large");
    if (__builtin_mul_overflow(numel, extent, &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad("shape ", shape_field->dump(), " has more elements than fit in 63 bits");
    view.shape.push_back(static_cast<int64_t>(extent));
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(view.dtype)), &expected_bytes))
    bad("shape ", shape_text(view.shape), " x ", dtype_text, " overflows the byte count");

  const auto offsets_field = entry.find("data_offsets");
  if (offsets_field == entry.end()) bad("missing \"data_offsets\"");
  if (!offsets_field->is_array() || offsets_field->size() != 2)
    bad("\"data_offsets\" is not a [begin, end] pair");
  const json& begin_json = (*offsets_field)[0];
  const json& end_json = (*offsets_field)[1];
  if (!begin_json.is_number_unsigned() || !end_json.is_number_unsigned())
    bad("\"data_offsets\" ", offsets_field->dump(), " are not non-negative integers");
  const uint64_t begin = begin_json.get<uint64_t>();
  const uint64_t end = end_json.get<uint64_t>();
  if (begin > end) bad("data_offsets begin ", begin, " is after end ", end);
  if (end > data_bytes)
    bad("data_offsets end ", end, " is beyond the data section (", data_bytes, " bytes)");
  if (end - begin != expected_bytes)
    bad("data_offsets span ", end - begin, " bytes but shape ", shape_text(view.shape), " x ",
        dtype_text, " needs ", expected_bytes);
  // Fits: end <= data_bytes, which is below the file size.
  view.nbytes = static_cast<size_t>(expected_bytes);
  *begin_out = begin;
  return view;
}

// Writes all of `bytes` to fd, retrying short writes and interrupts.
void write_all(int fd, const void* bytes, size_t count, const std::string& path) {
  const auto* cursor = static_cast<const uint8_t*>(bytes);
  while (count > 0) {
    const ssize_t written = ::write(fd, cursor, count);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail(path, ": write failed: ", errno_text(errno));
    }
    cursor += written;
    count -= static_cast<size_t>(written);
  }
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

// ---------------------------------------------------------------------------------------
// SafetensorsFile

void SafetensorsFile::parse_header(const uint8_t* bytes, size_t size, size_t file_size,
                                   const std::string& path, std::vector<TensorView>* tensors,
                                   std::map<std::string, std::string>* metadata) {
  if (size > file_size) fail(path, ": buffer of ", size, " bytes exceeds the file size ", file_size);
  if (file_size < kLengthPrefixBytes || size < kLengthPrefixBytes)
    fail(path, ": file of ", file_size, " bytes is too short for a safetensors header");
  const uint64_t header_bytes = read_u64_le(bytes);
  if (header_bytes > kMaxHeaderBytes)
    fail(path, ": header length ", header_bytes, " is absurd (limit ", kMaxHeaderBytes, ")");
  if (header_bytes > file_size - kLengthPrefixBytes)
    fail(path, ": header length ", header_bytes, " is larger than the file (", file_size,
         " bytes)");
  if (header_bytes > size - kLengthPrefixBytes)
    fail(path, ": header length ", header_bytes, " extends past the ", size, " bytes given");
  const uint64_t data_bytes = file_size - kLengthPrefixBytes - header_bytes;

  const char* text = reinterpret_cast<const char*>(bytes + kLengthPrefixBytes);
  const json header = parse_json_strictly(text, text + header_bytes, path);
  if (!header.is_object()) fail(path, ": header is not a JSON object");

  std::vector<TensorView> parsed;
  std::vector<std::pair<uint64_t, size_t>> begin_and_index;  // for the overlap check
  std::map<std::string, std::string> parsed_metadata;
  // json objects iterate in key order, so `parsed` comes out sorted by name.
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, ": __metadata__ is not a JSON object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          fail(path, ": __metadata__ value of '", key, "' is not a string");
        parsed_metadata[key] = value.get<std::string>();
      }
      continue;
    }
    uint64_t begin = 0;
    TensorView view = parse_entry(path, name, entry, data_bytes, &begin);
    // Only a buffer that holds the tensor's bytes may be pointed into (the fuzz target
    // passes buffers shorter than the file it pretends to be).
    const uint64_t data_start = kLengthPrefixBytes + header_bytes + begin;
    if (data_start + view.nbytes <= size) view.data = bytes + data_start;
    if (view.nbytes > 0) begin_and_index.emplace_back(begin, parsed.size());
    parsed.push_back(std::move(view));
  }

  // Empty tensors occupy no bytes, so only non-empty ranges can collide.
  std::sort(begin_and_index.begin(), begin_and_index.end());
  for (size_t i = 1; i < begin_and_index.size(); ++i) {
    const TensorView& previous = parsed[begin_and_index[i - 1].second];
    const TensorView& current = parsed[begin_and_index[i].second];
    const uint64_t previous_end = begin_and_index[i - 1].first + previous.nbytes;
    if (begin_and_index[i].first < previous_end)
      fail(path, ": tensor '", current.name, "' overlaps tensor '", previous.name,
           "' in the data section");
  }

  if (tensors) *tensors = std::move(parsed);
  if (metadata) *metadata = std::move(parsed_metadata);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;

  // Regular files only, checked before a blocking open (a FIFO shard would hang it).
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);
  const auto file_size = static_cast<size_t>(size);
  if (file_size < kLengthPrefixBytes) {
    ::close(fd);
    fail(path, ": file of ", file_size, " bytes is too short for a safetensors header");
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) fail(path, ": mmap failed: ", errno_text(map_error));
  file->mapping_ = mapping;
  file->mapping_size_ = file_size;

  // On a throw, `file` unmaps in its destructor.
  parse_header(static_cast<const uint8_t*>(mapping), file_size, file_size, path, &file->tensors_,
               &file->metadata_);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapping_size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  // parse_header leaves tensors_ sorted by name.
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& view, const std::string& key) { return view.name < key; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

// ---------------------------------------------------------------------------------------
// Checkpoint

Checkpoint Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";

  std::error_code ignored;
  if (fs::exists(index_path, ignored)) {
    const std::string index_name = index_path.string();
    const std::string text = read_text_file(index_name, kMaxConfigJsonBytes);
    const json index = parse_json_strictly(text.data(), text.data() + text.size(), index_name);
    if (!index.is_object()) fail(index_name, ": not a JSON object");
    const auto weight_map = index.find("weight_map");
    if (weight_map == index.end() || !weight_map->is_object())
      fail(index_name, ": missing \"weight_map\" object");

    std::map<std::string, std::vector<std::string>> tensors_by_shard;
    for (const auto& [tensor, shard] : weight_map->items()) {
      if (!shard.is_string())
        fail(index_name, ": weight_map entry for tensor '", tensor, "' is not a string");
      const std::string& shard_name = shard.get_ref<const std::string&>();
      // Shards live beside the index; anything else is a corrupt or hostile index.
      const fs::path shard_relative(shard_name);
      if (shard_name.empty() || shard_relative.is_absolute() ||
          std::find(shard_relative.begin(), shard_relative.end(), "..") != shard_relative.end())
        fail(index_name, ": tensor '", tensor, "' names shard '", shard_name,
             "' outside the checkpoint directory");
      tensors_by_shard[shard_name].push_back(tensor);
    }
    if (tensors_by_shard.empty()) fail(index_name, ": weight_map is empty");

    std::map<std::string, std::string> shard_of;  // tensor -> shard holding it, for duplicates
    for (const auto& [shard_name, indexed] : tensors_by_shard) {
      const fs::path shard_path = root / shard_name;
      if (!fs::exists(shard_path, ignored))
        fail(index_name, ": shard '", shard_name, "' is missing (", shard_path.string(), ")");
      std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(shard_path.string());
      for (const std::string& tensor : indexed) {
        if (!file->find(tensor))
          fail(index_name, ": tensor '", tensor, "' is indexed in shard '", shard_name,
               "' but that shard does not contain it");
      }
      for (const TensorView& view : file->tensors()) {
        auto [it, inserted] = shard_of.emplace(view.name, shard_name);
        if (!inserted)
          fail(dir, ": tensor '", view.name, "' is present in both shard '", it->second,
               "' and shard '", shard_name, "'");
        checkpoint.by_name_[view.name] = &view;
      }
      if (checkpoint.files_.empty()) checkpoint.metadata_ = file->metadata();
      checkpoint.files_.push_back(std::move(file));
    }
    return checkpoint;
  }

  if (fs::exists(single_path, ignored)) {
    std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(single_path.string());
    for (const TensorView& view : file->tensors()) checkpoint.by_name_[view.name] = &view;
    checkpoint.metadata_ = file->metadata();
    checkpoint.files_.push_back(std::move(file));
    return checkpoint;
  }
  fail("no model.safetensors or model.safetensors.index.json in ", dir);
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  const TensorView* view = find(name);
  if (!view) fail("tensor '", name, "' not found in checkpoint ", dir_);
  return *view;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, view] : by_name_) out.push_back(name);
  return out;
}

// ---------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            const void* data, size_t nbytes) {
  QSPEC_CHECK(!name.empty(), "safetensors writer: empty tensor name");
  QSPEC_CHECK(name != "__metadata__", "safetensors writer: '__metadata__' is reserved");
  for (const Entry& entry : entries_)
    QSPEC_CHECK(entry.name != name, "safetensors writer: tensor '", name, "' added twice");
  uint64_t numel = 1;
  for (int64_t extent : shape) {
    QSPEC_CHECK(extent >= 0, "safetensors writer: tensor '", name, "' has negative dimension ",
                extent);
    QSPEC_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(extent), &numel) &&
                    numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                "safetensors writer: tensor '", name, "' shape ", shape_text(shape),
                " overflows");
  }
  uint64_t expected = 0;
  QSPEC_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &expected) &&
                  expected == nbytes,
              "safetensors writer: tensor '", name, "' shape ", shape_text(shape), " x ",
              dtype_name(dtype), " needs ", expected, " bytes, got ", nbytes);
  QSPEC_CHECK(data != nullptr || nbytes == 0, "safetensors writer: tensor '", name,
              "' has no data");
  Entry entry;
  entry.name = name;
  entry.dtype = dtype;
  entry.shape = std::move(shape);
  const auto* first = static_cast<const uint8_t*>(data);
  if (nbytes > 0) entry.bytes.assign(first, first + nbytes);
  entries_.push_back(std::move(entry));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<const Entry*> ordered;
  ordered.reserve(entries_.size());
  for (const Entry& entry : entries_) ordered.push_back(&entry);
  std::sort(ordered.begin(), ordered.end(),
            [](const Entry* a, const Entry* b) { return a->name < b->name; });

  json header = json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry* entry : ordered) {
    const uint64_t end = offset + entry->bytes.size();
    header[entry->name] = {{"dtype", std::string(dtype_name(entry->dtype))},
                           {"shape", entry->shape},
                           {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& error) {  // e.g. a name that is not valid UTF-8
    fail(path, ": cannot encode header: ", error.what());
  }
  // Padding keeps the data section 8-byte aligned, so mapped tensors can be used in place.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  uint8_t length_prefix[kLengthPrefixBytes];
  uint64_t length = header_text.size();
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) {
    length_prefix[i] = static_cast<uint8_t>(length & 0xff);
    length >>= 8;
  }

  // Write beside the target and rename, so readers never see a half-written file.
  static std::atomic<unsigned> temp_counter{0};
  std::string temp_path;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temp_path = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter++);
    fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) fail(path, ": cannot create ", temp_path, ": ", errno_text(errno));
  }
  if (fd < 0) fail(path, ": cannot create a temporary file beside it");
  try {
    write_all(fd, length_prefix, sizeof length_prefix, path);
    write_all(fd, header_text.data(), header_text.size(), path);
    for (const Entry* entry : ordered) write_all(fd, entry->bytes.data(), entry->bytes.size(), path);
    if (::fsync(fd) != 0) fail(path, ": fsync failed: ", errno_text(errno));
    const int closed = ::close(fd);
    fd = -1;
    if (closed != 0) fail(path, ": close failed: ", errno_text(errno));
    if (::rename(temp_path.c_str(), path.c_str()) != 0)
      fail(path, ": cannot rename ", temp_path, " into place: ", errno_text(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(temp_path.c_str());
    throw;
  }
}

}  // namespace qspec
