// Calibration text for the offline quantizers (GPTQ, ARC): a UTF-8 file cut into token
// sequences with the model's tokenizer. The quantizers (model/quantize.h) take the sequences.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qspec {

class Tokenizer;

// The largest calibration file read (WikiText-2's training split is 11 MB; a C4 shard ~300 MB
// of which a few hundred sequences are used).
inline constexpr uint64_t kMaxCalibrationTextBytes = uint64_t{512} << 20;  // 512 MiB

struct CalibrationSet {
  std::vector<std::vector<int32_t>> sequences;
  std::string source;  // file name
  int64_t tokens = 0;
};

// Reads a UTF-8 text file and cuts its tokens into up to `samples` consecutive sequences of
// `sequence_length` tokens (the last may be shorter, at least 2 tokens). Throws naming the
// file when it is missing, not a regular file, over kMaxCalibrationTextBytes, empty, not UTF-8
// text (or holds NUL bytes), or too short.
CalibrationSet load_calibration_text(const std::string& path, const Tokenizer& tokenizer, int64_t samples,
                                     int64_t sequence_length);

}  // namespace qspec
