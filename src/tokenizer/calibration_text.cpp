// Calibration text (tokenizer/calibration_text.h): read capped, checked as UTF-8, tokenized once.
#include "tokenizer/calibration_text.h"

#include <algorithm>
#include <filesystem>

#include "base/files.h"
#include "qspec/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace qspec {

CalibrationSet load_calibration_text(const std::string& path, const Tokenizer& tokenizer, int64_t samples,
                                     int64_t sequence_length) {
  QSPEC_CHECK(samples > 0 && sequence_length >= 2, path, ": need at least one calibration sample of 2+ tokens (got ",
              samples, " samples of ", sequence_length, ")");
  QSPEC_CHECK(!std::filesystem::is_directory(path), path, ": is a directory, not a calibration text file");
  QSPEC_CHECK(std::filesystem::exists(path), path, ": cannot open calibration file");
  const std::string text = read_text_file(path, kMaxCalibrationTextBytes);
  QSPEC_CHECK(!text.empty(), path, ": calibration file is empty");
  QSPEC_CHECK(text.find('\0') == std::string::npos && tok::is_valid_utf8(text), path,
              ": calibration file is not UTF-8 text (binary data?)");
  const std::vector<int32_t> ids = tokenizer.encode(text, /*add_bos=*/false);
  QSPEC_CHECK(ids.size() >= 2, path, ": calibration text has ", ids.size(), " token(s); at least 2 are needed");
  CalibrationSet set;
  set.source = path;
  for (size_t begin = 0; begin + 1 < ids.size() && static_cast<int64_t>(set.sequences.size()) < samples;
       begin += static_cast<size_t>(sequence_length)) {
    const size_t end = std::min(ids.size(), begin + static_cast<size_t>(sequence_length));
    std::vector<int32_t> sequence;
    if (tokenizer.bos_id && tokenizer.add_bos_by_default) sequence.push_back(*tokenizer.bos_id);
    sequence.insert(sequence.end(), ids.begin() + static_cast<std::ptrdiff_t>(begin),
                    ids.begin() + static_cast<std::ptrdiff_t>(end));
    if (sequence.size() < 2) break;
    set.tokens += static_cast<int64_t>(sequence.size());
    set.sequences.push_back(std::move(sequence));
  }
  return set;
}

}  // namespace qspec
