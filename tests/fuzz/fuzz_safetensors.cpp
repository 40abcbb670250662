// libFuzzer target for the safetensors header parser. The input is treated as a whole file
// (length prefix, header JSON, data section). Rejecting the input with qspec::Error is the
// expected outcome for most inputs; any other exception, a crash or a sanitizer report is a
// bug. Accepted inputs are checked against the promises parse_header makes to its callers.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "qspec/error.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();  // a broken promise: let libFuzzer record the input
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<qspec::TensorView> tensors;
  std::map<std::string, std::string> metadata;
  try {
    qspec::SafetensorsFile::parse_header(data, size, size, "fuzz-input", &tensors, &metadata);
  } catch (const qspec::Error&) {
    return 0;
  }
  // Accepted: every tensor's bytes lie inside the input, sizes agree with shape x dtype,
  // names are sorted and unique, and non-empty ranges do not overlap.
  std::vector<std::pair<const uint8_t*, size_t>> ranges;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const qspec::TensorView& tensor = tensors[i];
    if (i > 0) check(tensors[i - 1].name < tensor.name);
    check(tensor.numel() >= 0);
    check(static_cast<uint64_t>(tensor.numel()) * qspec::dtype_size(tensor.dtype) == tensor.nbytes);
    check(tensor.data != nullptr);
    check(tensor.data >= data && tensor.data + tensor.nbytes <= data + size);
    if (tensor.nbytes > 0) {
      // Touch the first and last byte so ASan would flag a bad pointer.
      volatile uint8_t first = tensor.data[0];
      volatile uint8_t last = tensor.data[tensor.nbytes - 1];
      (void)first;
      (void)last;
      ranges.emplace_back(tensor.data, tensor.nbytes);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    check(ranges[i - 1].first + ranges[i - 1].second <= ranges[i].first);
  return 0;
}
