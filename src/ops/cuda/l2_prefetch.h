// What a small kernel asks L2 to fetch while it runs (plain C++: ops.h and the kernels share it).
// At small batch the norm / RoPE / SiLU kernels between the GEMMs leave HBM idle for several
// microseconds each; handing them the next GEMM's weights (its codes and scales: two ranges)
// turns that idle time into weight streaming (docs/perf-notes.md, "L2 prefetch").
#pragma once
#include <cstddef>

namespace qspec::cuda {

struct L2Prefetch {
  static constexpr int kRanges = 2;
  const void* ptr[kRanges] = {nullptr, nullptr};  // 16-byte aligned
  size_t bytes[kRanges] = {0, 0};
};

}  // namespace qspec::cuda
