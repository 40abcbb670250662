// Host-side planning of the small-M W4A16 kernel: variants, split-K and workspace layout
// (plain C++, shared by the launcher and w4a16_workspace_bytes).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace qspec::cuda::detail {

inline constexpr int64_t kW4A16TileRows = 128;    // rows per block for every variant
inline constexpr int64_t kW4A16MaxSliceM = 64;    // tokens per launch (8 mma n-tiles)
inline constexpr int64_t kW4A16MaxSplits = 64;
// The small-M variant `automatic` and variant 0 take for f16 activations (docs/perf-journal/perf-notes-journal-2026.md:
// measured fastest in the decode step): 5, the preload kernel, where it runs (sm_90a, 16-byte
// aligned weights, up to 16 tokens a slice), variant 1 elsewhere.
inline constexpr int kW4A16DefaultVariant = 5;
inline constexpr size_t kW4A16CounterBytes = 256 * 1024;  // counters region, zeroed by w4a16_workspace_init
// Its first half: the split-K arrival counters (32k row tiles), zero between launches. The second
// half: the cooperative wgmma kernel's stage flags, which hold launch epochs (not zero).
inline constexpr size_t kW4A16SplitKCounterBytes = kW4A16CounterBytes / 2;
inline constexpr size_t kW4S8CooperativeFlagsOffset = kW4A16SplitKCounterBytes;

// Upper bound on split-K for this shape: at least 4 chunks (256 k) per split, and the f32
// partials (splits x m x n x 8 bytes of traffic) at most ~1/4 of the weight bytes (n k / 2).
inline int64_t w4a16_max_splits(int64_t m, int64_t k) {
  const int64_t by_chunks = std::max<int64_t>(1, (k / 64) / 4);
  const int64_t by_partials = std::max<int64_t>(1, k / (64 * std::max<int64_t>(m, 1)));
  return std::min({by_chunks, by_partials, kW4A16MaxSplits});
}

// The most split-K partitions, at most `splits`, whose f32 partials (splits x m x n, after the
// counters) the workspace holds; 1 without a workspace.
inline int64_t splits_that_fit(int64_t splits, int64_t m, int64_t n, const void* workspace, size_t workspace_bytes) {
  while (splits > 1 && (workspace == nullptr ||
                        kW4A16CounterBytes + static_cast<size_t>(splits * m * n) * sizeof(float) > workspace_bytes))
    --splits;
  return splits;
}

// Where the split-K partials start in the workspace (after the counters); null for one split.
inline float* splitk_partials(void* workspace, int64_t splits) {
  return splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(workspace) + kW4A16CounterBytes) : nullptr;
}

inline size_t w4a16_small_m_workspace(int64_t m, int64_t n, int64_t k) {
  const int64_t slice = std::min(m, kW4A16MaxSliceM);
  return kW4A16CounterBytes + static_cast<size_t>(w4a16_max_splits(slice, k) * slice * n) * sizeof(float);
}

// ---- the tiled kernel (kernels/w4a16_tiled.cuh) ----

inline constexpr int64_t kW4A16TiledMaxSplits = 16;

// Upper bound on split-K for the tiled kernel: at least 4 chunks (256 k) per split, and the f32
// partials it writes (splits x m x n x 4 bytes, mostly L2-resident) at most the packed weight
// bytes (n k / 2). Splits only pay when the tiles alone leave multiprocessors idle.
inline int64_t w4a16_tiled_max_splits(int64_t m, int64_t k) {
  const int64_t by_chunks = std::max<int64_t>(1, (k / 64) / 4);
  const int64_t by_partials = std::max<int64_t>(1, k / (8 * std::max<int64_t>(m, 1)));
  return std::min({by_chunks, by_partials, kW4A16TiledMaxSplits});
}

inline size_t w4a16_tiled_workspace(int64_t m, int64_t n, int64_t k) {
  const int64_t splits = w4a16_tiled_max_splits(m, k);
  return kW4A16CounterBytes + (splits > 1 ? static_cast<size_t>(splits * m * n) * sizeof(float) : 0);
}

}  // namespace qspec::cuda::detail
