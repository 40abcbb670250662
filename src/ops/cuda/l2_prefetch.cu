#include <algorithm>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/l2_prefetch.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

void l2_prefetch(const std::vector<L2PrefetchRange>& ranges, int mode, void* stream) {
  using kernels::kL2Line;
  QSPEC_CHECK(ranges.size() <= static_cast<size_t>(kernels::kL2PrefetchRanges), "cuda::l2_prefetch: ",
              ranges.size(), " ranges (at most ", kernels::kL2PrefetchRanges, ")");
  QSPEC_CHECK(mode >= 0 && mode <= 2, "cuda::l2_prefetch: mode ", mode, " is not 0 (lines), 1 (lines, evict-last) or 2 (bulk)");
  const bool bulk = mode == static_cast<int>(kernels::L2PrefetchMode::bulk);
  if (bulk) QSPEC_CHECK(compute_capability() >= 90, "cuda::l2_prefetch: bulk prefetches need sm_90");
  kernels::L2PrefetchPlan plan{};
  plan.first_piece[0] = 0;
  for (size_t r = 0; r < ranges.size(); ++r) {
    const L2PrefetchRange& range = ranges[r];
    const size_t period = range.period == 0 ? range.bytes : range.period;
    const size_t run = range.period == 0 ? range.bytes : range.run;
    QSPEC_CHECK(range.base != nullptr || range.bytes == 0, "cuda::l2_prefetch: range ", r, " has no base");
    QSPEC_CHECK(range.period == 0 || (period % kL2Line == 0 && run % kL2Line == 0 && run > 0 && run <= period),
                "cuda::l2_prefetch: range ", r, ": run ", run, " of period ", period,
                " must be positive multiples of 128 bytes, run <= period");
    const size_t line_run = (run + kL2Line - 1) / kL2Line * kL2Line;  // a whole range: its lines
    // Bulk pieces are runs of at most 64 KB (a whole range is cut into such runs).
    const size_t bulk_run = std::min<size_t>(run, 65536), bulk_period = range.period == 0 ? bulk_run : period;
    plan.base[r] = static_cast<const char*>(range.base);
    plan.bytes[r] = range.bytes;
    plan.period[r] = static_cast<uint32_t>(bulk ? bulk_period : (range.period == 0 ? line_run : period));
    plan.run[r] = static_cast<uint32_t>(bulk ? bulk_run : line_run);
    QSPEC_CHECK(std::max(period, line_run) <= UINT32_MAX, "cuda::l2_prefetch: range ", r, " of ", range.bytes,
                " bytes: period or run past 4 GB");
    QSPEC_CHECK(!bulk || (range.bytes % 16 == 0 && reinterpret_cast<uintptr_t>(range.base) % 16 == 0),
                "cuda::l2_prefetch: bulk prefetches take 16-byte aligned ranges (range ", r, ")");
    const uint64_t periods = range.bytes == 0 ? 0 : (range.bytes + plan.period[r] - 1) / plan.period[r];
    plan.first_piece[r + 1] = plan.first_piece[r] + periods * (bulk ? 1 : plan.run[r] / kL2Line);
  }
  plan.count = static_cast<int>(ranges.size());
  const uint64_t pieces = plan.first_piece[plan.count];
  if (pieces == 0) return;
  const unsigned grid = static_cast<unsigned>(
      std::min<uint64_t>((pieces + 255) / 256, static_cast<uint64_t>(multiprocessor_count())));
  const cudaStream_t s = as_stream(stream);
  switch (static_cast<kernels::L2PrefetchMode>(mode)) {
    case kernels::L2PrefetchMode::line:
      kernels::l2_prefetch_kernel<kernels::L2PrefetchMode::line><<<grid, 256, 0, s>>>(plan);
      break;
    case kernels::L2PrefetchMode::line_evict_last:
      kernels::l2_prefetch_kernel<kernels::L2PrefetchMode::line_evict_last><<<grid, 256, 0, s>>>(plan);
      break;
    case kernels::L2PrefetchMode::bulk:
      kernels::l2_prefetch_kernel<kernels::L2PrefetchMode::bulk><<<grid, 256, 0, s>>>(plan);
      break;
  }
  QSPEC_CUDA_CHECK_LAUNCH("l2_prefetch_kernel");
}

SideStream::SideStream() : stream_(create_stream()) {
  cudaEvent_t fork = nullptr, join = nullptr;
  QSPEC_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  QSPEC_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  fork_ = fork;
  join_ = join;
}
SideStream::~SideStream() {
  if (fork_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(fork_));
  if (join_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(join_));
  destroy_stream(stream_);
}
void SideStream::fork(void* main) {
  QSPEC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(fork_), as_stream(main)));
  QSPEC_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), static_cast<cudaEvent_t>(fork_), 0));
}
void SideStream::join(void* main) {
  QSPEC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(join_), as_stream(stream_)));
  QSPEC_CUDA_CHECK(cudaStreamWaitEvent(as_stream(main), static_cast<cudaEvent_t>(join_), 0));
}

}  // namespace qspec::cuda
