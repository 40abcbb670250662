// Device memory pulled into the L2 ahead of the kernel that reads it, by a kernel on a side
// stream that runs while the step's own kernels leave the HBM idle (cuda::l2_prefetch, ops.h).
// A range is taken whole, or as `run` bytes out of every `period` (both multiples of 128): a
// fraction spread evenly over the range, so that every block of the reading GEMM finds the same
// share of its stream in the L2.
#pragma once
#include <cstdint>

#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

inline constexpr int kL2PrefetchRanges = 6;
inline constexpr int kL2Line = 128;

struct L2PrefetchPlan {
  const char* base[kL2PrefetchRanges];
  uint64_t bytes[kL2PrefetchRanges];
  uint32_t period[kL2PrefetchRanges], run[kL2PrefetchRanges];
  // Prefix sums of the ranges' pieces (lines, or runs for bulk prefetches): range r holds pieces
  // [first_piece[r], first_piece[r + 1]).
  uint64_t first_piece[kL2PrefetchRanges + 1];
  int count;
};

enum class L2PrefetchMode : int { line = 0, line_evict_last = 1, bulk = 2 };

// One thread a piece, grid-stride in range order (the first range is asked for first). Line
// modes: piece = one 128-byte line; bulk: piece = one run (cp.async.bulk.prefetch.L2).
template <L2PrefetchMode MODE>
__global__ void l2_prefetch_kernel(L2PrefetchPlan plan) {
  const uint64_t total = plan.first_piece[plan.count];
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t piece = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; piece < total;
       piece += stride) {
    int r = 0;
    while (piece >= plan.first_piece[r + 1]) ++r;
    const uint64_t j = piece - plan.first_piece[r];
    if constexpr (MODE == L2PrefetchMode::bulk) {
      const uint64_t offset = j * plan.period[r];
      const uint64_t size = min(static_cast<uint64_t>(plan.run[r]), plan.bytes[r] - offset);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(plan.base[r] + offset),
                   "r"(static_cast<uint32_t>(size))
                   : "memory");
#endif
    } else {
      const uint32_t lines_a_run = plan.run[r] / kL2Line;
      const uint64_t offset = j / lines_a_run * plan.period[r] + j % lines_a_run * kL2Line;
      if (offset >= plan.bytes[r]) continue;
      if constexpr (MODE == L2PrefetchMode::line_evict_last) {
        asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(plan.base[r] + offset));
      } else {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(plan.base[r] + offset));
      }
    }
  }
}

}  // namespace qspec::cuda::kernels
