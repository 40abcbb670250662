// Safe reads of model-directory files: regular files only, text read whole up to a size cap.
// A FIFO, device or directory is an Error, never a hang or an endless read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qspec {

// Caps on the JSON/text files of a model directory. tokenizer.json holds the whole vocabulary
// and merges (tens of MB for 256K-token vocabularies); the config files are a few KB (a
// tokenizer_config.json with chat templates, or a safetensors index, some hundred KB).
inline constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{64} << 20;  // 64 MiB
inline constexpr uint64_t kMaxConfigJsonBytes = uint64_t{16} << 20;     // 16 MiB

// Opens `path` read-only and returns the descriptor, or throws qspec::Error naming the path:
// cannot open, or "<path>: not a regular file". The path is checked with stat() first and
// opened with O_NONBLOCK (then fstat'ed again), so a FIFO never blocks the open. *size_out
// receives the file size.
int open_regular_file(const std::string& path, uint64_t* size_out);

// The whole content of the regular file `path`; an Error names the path when it is not a
// regular file, cannot be read, or holds more than max_bytes.
std::string read_text_file(const std::string& path, uint64_t max_bytes);

// The paths of the .json files directly in `dir`, sorted (the order a search over them takes);
// none when `dir` is not a directory. The GEMM policy maps and the QSpec cost tables are found
// this way.
std::vector<std::string> sorted_json_files(const std::string& dir);

// `text` as part of a file name: lower case, each run of anything but letters and digits one '-',
// none at the ends ("NVIDIA H200" -> "nvidia-h200"). Records, policy maps and cost tables are
// named with it.
std::string file_name_slug(const std::string& text);

}  // namespace qspec
