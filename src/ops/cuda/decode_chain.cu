// The device-side input update of a chained greedy decode (QSpec drafts): each run's next input
// is its own argmax id of the step before, at the next position, without a host round trip.
#include <algorithm>

#include "ops/cuda/common.h"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace {

__global__ void advance_decode_inputs_kernel(const int32_t* __restrict__ out_ids, int runs, int32_t* ids,
                                             int32_t* positions, int32_t* context_lens, int32_t* chain_ids,
                                             bool advance) {
  pdl_prologue();
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < runs; r += gridDim.x * blockDim.x) {
    const int32_t id = out_ids[r];
    chain_ids[r] = id;
    if (advance) {
      ids[r] = id;
      positions[r] += 1;
      context_lens[r] += 1;
    }
  }
}

// Entry e = (first token, chain offset, chain stride, count): ids[first + i] = chain[offset + i
// stride] for i < count. A block an entry.
__global__ void scatter_chain_drafts_kernel(const int32_t* __restrict__ chain, const int32_t* __restrict__ entries,
                                            int32_t* ids) {
  pdl_prologue();
  const int32_t* e = entries + 4 * blockIdx.x;
  const int32_t first = e[0], offset = e[1], stride = e[2], count = e[3];
  for (int i = threadIdx.x; i < count; i += blockDim.x) ids[first + i] = chain[offset + i * stride];
}

}  // namespace

void scatter_chain_drafts(const int32_t* chain, const int32_t* entries, int64_t count, int32_t* ids, void* stream) {
  QSPEC_CHECK(count >= 0 && count < (1ll << 31), "cuda::scatter_chain_drafts: bad entry count ", count);
  if (count == 0) return;
  launch_pdl(scatter_chain_drafts_kernel, dim3(static_cast<unsigned>(count)), dim3(32), 0, as_stream(stream), chain,
             entries, ids);
  QSPEC_CUDA_CHECK_LAUNCH("scatter_chain_drafts_kernel");
}

void advance_decode_inputs(const int32_t* out_ids, int64_t runs, int32_t* ids, int32_t* positions,
                           int32_t* context_lens, int32_t* chain_ids, bool advance, void* stream) {
  QSPEC_CHECK(runs >= 0 && runs < (1ll << 31), "cuda::advance_decode_inputs: bad run count ", runs);
  if (runs == 0) return;
  const int threads = 128;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((runs + threads - 1) / threads, 1024));
  launch_pdl(advance_decode_inputs_kernel, dim3(blocks), dim3(threads), 0, as_stream(stream), out_ids,
             static_cast<int>(runs), ids, positions, context_lens, chain_ids, advance);
  QSPEC_CUDA_CHECK_LAUNCH("advance_decode_inputs_kernel");
}

}  // namespace qspec::cuda
