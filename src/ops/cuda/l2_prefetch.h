// Weights a GEMM asks L2 to fetch as its blocks finish: the next GEMM's (its codes and scales,
// two ranges), so HBM keeps streaming through the small latency-bound kernels between the two
// (plain C++: ops.h and the kernels share it; docs/perf-notes.md, "L2 prefetch").
#pragma once
#include <cstddef>

namespace qspec::cuda {

struct L2Prefetch {
  static constexpr int kRanges = 2;
  const void* ptr[kRanges] = {nullptr, nullptr};  // 16-byte aligned
  size_t bytes[kRanges] = {0, 0};
};

}  // namespace qspec::cuda
