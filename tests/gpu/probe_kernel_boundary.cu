// Probe: what one kernel boundary costs on the GPU, and what a flag in global memory would cost
// instead (issue 4: the W4A16 decode step at batch 1 spends ~22 µs a layer over its weight bytes,
// most of it in the chain of seven dependent kernels; docs/perf-journal/perf-notes-journal-2026.md, "Kernel boundaries").
//
// A chain of `links` kernels, each reading the whole row its predecessor wrote (from L2), summing
// it (block reduction) and writing its slice of the next row: the shape of the decode step's
// small kernels (a norm is one block, a GEMM 132-264). Captured as one CUDA graph, replayed and
// timed with events; the time a link is the median replay over `links`. Three orders:
//   stream: plain stream order (the launch waits for the previous grid to complete);
//   pdl:    programmatic dependent launch, launch_dependents then griddepcontrol.wait (what the
//           engine's kernels do);
//   flags:  programmatic dependent launch with no griddepcontrol.wait: each block's thread 0 spins
//           on its predecessor's arrival counter (ld.acquire.gpu) until every block of it arrived,
//           and arrives on its own after its stores (red.release.gpu). A launch still needs every
//           block of its predecessor to have started, so a spinning block never holds a slot its
//           predecessor needs.
//   block_flags: as flags, but each block of a link sets its own flag word (st.release.gpu) and
//           the next link's threads poll one word each (no single counter that every block's
//           arrival serializes on);
//   persistent: one launch of `blocks` blocks runs every link in a loop, with block_flags'
//           arrival between links (a grid-wide barrier: the megakernel's sync, no launches).
// Every order must give the same final row, bit for bit (checked; the arithmetic is the same).
//
// usage: qspec_gpu_boundary_probe [OUT.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define PROBE_CHECK(call)                                                                         \
  do {                                                                                            \
    const cudaError_t status_ = (call);                                                           \
    if (status_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(status_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

enum class Order { stream, pdl, flags, block_flags, persistent };
const char* order_name(Order order) {
  switch (order) {
    case Order::stream: return "stream";
    case Order::pdl: return "pdl";
    case Order::flags: return "flags";
    case Order::block_flags: return "block_flags";
    case Order::persistent: return "persistent";
  }
  return "?";
}

constexpr int kThreads = 256;

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* address) {
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ void add_release_gpu(unsigned* address, unsigned value) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(address), "r"(value) : "memory");
}

__device__ __forceinline__ void store_release_gpu(unsigned* address, unsigned value) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(address), "r"(value) : "memory");
}
// Every one of `blocks` flag words set: each thread polls its words, then the block barrier.
__device__ __forceinline__ void wait_block_flags(const unsigned* flags, int blocks) {
  for (int b = threadIdx.x; b < blocks; b += blockDim.x)
    while (load_acquire_gpu(flags + b) == 0) {
    }
  __syncthreads();
}
// Until `arrivals` blocks have added to counter: thread 0 spins on it (acquire), then the block
// barrier hands the acquire to every thread's loads after it.
__device__ __forceinline__ void wait_counter(const unsigned* counter, unsigned arrivals) {
  if (threadIdx.x == 0)
    while (load_acquire_gpu(counter) < arrivals) {
    }
  __syncthreads();
}
// One link's work: the sum of what it reads, this block's slice of the next row. fan_in: the
// predecessor blocks whose slices a block reads (gridDim.x: the whole row; fewer: the slices of
// blocks [g * fan_in, (g + 1) * fan_in) for block group g, a partial dependency like a GEMM
// split's on the rows that feed it).
__device__ __forceinline__ void link_work(const float* in, float* out, int n, int fan_in, float* partial) {
  const int group = blockIdx.x / fan_in;
  const int read_begin = static_cast<int>(static_cast<long long>(group) * fan_in * n / gridDim.x);
  const int read_end = static_cast<int>(static_cast<long long>(group + 1) * fan_in * n / gridDim.x);
  float sum = 0.0f;
  for (int i = read_begin + threadIdx.x; i < read_end; i += kThreads) sum += __ldcg(in + i);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  const int begin = static_cast<int>(static_cast<long long>(blockIdx.x) * n / gridDim.x);
  const int end = static_cast<int>(static_cast<long long>(blockIdx.x + 1) * n / gridDim.x);
  for (int i = begin + threadIdx.x; i < end; i += kThreads) out[i] = 0.5f * __ldcg(in + i) + 1e-6f * total;
  __syncthreads();  // partial is reused by the next link; every store before the arrival
}
// in: the row its predecessor wrote; out: this link's row, a slice a block. flags order:
// wait_on / arrive_on are the predecessor's and this link's counters, one a block group (null
// wait_on for the first link); a group's counter reaches fan_in when its blocks have arrived.
__global__ void __launch_bounds__(kThreads) link_kernel(const float* in, float* out, int n, int flags_order,
                                                        int fan_in, const unsigned* wait_on, unsigned* arrive_on) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  if (!flags_order) asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int group = blockIdx.x / fan_in;
  if (flags_order && wait_on != nullptr) wait_counter(wait_on + group, static_cast<unsigned>(fan_in));
  __shared__ float partial[kThreads / 32];
  link_work(in, out, n, fan_in, partial);
  if (flags_order && threadIdx.x == 0) add_release_gpu(arrive_on + group, 1u);
}

// block_flags: wait_on / arrive_on are the predecessor's and this link's flag words.
__global__ void __launch_bounds__(kThreads) block_flags_link_kernel(const float* in, float* out, int n,
                                                                    const unsigned* wait_on, unsigned* arrive_on) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
  __shared__ float partial[kThreads / 32];
  if (wait_on != nullptr) wait_block_flags(wait_on, gridDim.x);
  link_work(in, out, n, gridDim.x, partial);
  if (threadIdx.x == 0) store_release_gpu(arrive_on + blockIdx.x, 1u);
}
// persistent: every link in one launch; flags holds links x gridDim.x words. fan_in gridDim.x:
// block_flags' barrier between links; fewer: link_kernel's group counters.
__global__ void __launch_bounds__(kThreads) persistent_chain_kernel(float* rows, int n, int links, int fan_in,
                                                                    unsigned* flags) {
  __shared__ float partial[kThreads / 32];
  const bool whole_row = fan_in == static_cast<int>(gridDim.x);
  const int group = blockIdx.x / fan_in;
  for (int i = 0; i < links; ++i) {
    unsigned* previous = flags + static_cast<size_t>(i > 0 ? i - 1 : 0) * gridDim.x;  // read from link 1 on
    unsigned* own = flags + static_cast<size_t>(i) * gridDim.x;
    if (i > 0 && whole_row) wait_block_flags(previous, gridDim.x);
    if (i > 0 && !whole_row) wait_counter(previous + group, static_cast<unsigned>(fan_in));
    link_work(rows + static_cast<size_t>(i % 2) * n, rows + static_cast<size_t>((i + 1) % 2) * n, n, fan_in, partial);
    if (threadIdx.x == 0) {
      if (whole_row) store_release_gpu(own + blockIdx.x, 1u);
      else add_release_gpu(own + group, 1u);
    }
  }
}

struct Result {
  Order order;
  int blocks;
  int fan_in;
  int links;
  double us_per_link;
  bool same_bits;
};

void enqueue_chain(Order order, int blocks, int fan_in, int links, int n, float* rows, unsigned* counters,
                   cudaStream_t stream) {
  PROBE_CHECK(cudaMemsetAsync(counters, 0, sizeof(unsigned) * links * blocks, stream));
  if (order == Order::persistent) {
    persistent_chain_kernel<<<blocks, kThreads, 0, stream>>>(rows, n, links, fan_in, counters);
    PROBE_CHECK(cudaGetLastError());
    return;
  }
  for (int i = 0; i < links; ++i) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    // The first link follows the memset (not a kernel): plain order.
    config.attrs = &attribute;
    config.numAttrs = order != Order::stream && i > 0 ? 1 : 0;
    const float* in = rows + static_cast<size_t>(i % 2) * n;
    float* out = rows + static_cast<size_t>((i + 1) % 2) * n;
    if (order == Order::block_flags) {
      const unsigned* wait_on = i > 0 ? counters + static_cast<size_t>(i - 1) * blocks : nullptr;
      PROBE_CHECK(cudaLaunchKernelEx(&config, block_flags_link_kernel, in, out, n, wait_on,
                                     counters + static_cast<size_t>(i) * blocks));
      continue;
    }
    const unsigned* wait_on = i > 0 ? counters + static_cast<size_t>(i - 1) * blocks : nullptr;
    PROBE_CHECK(cudaLaunchKernelEx(&config, link_kernel, in, out, n, order == Order::flags ? 1 : 0, fan_in, wait_on,
                                   counters + static_cast<size_t>(i) * blocks));
  }
}

Result run(Order order, int blocks, int fan_in, int links, int n, const std::vector<float>& first_row,
           std::vector<float>& reference) {
  float* rows = nullptr;
  unsigned* counters = nullptr;
  PROBE_CHECK(cudaMalloc(&rows, sizeof(float) * 2 * n));
  PROBE_CHECK(cudaMalloc(&counters, sizeof(unsigned) * links * blocks));
  cudaStream_t stream;
  PROBE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  PROBE_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue_chain(order, blocks, fan_in, links, n, rows, counters, stream);
  PROBE_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  PROBE_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  // The correctness replay: from the first row, every order must end on the same bits.
  PROBE_CHECK(cudaMemcpyAsync(rows, first_row.data(), sizeof(float) * n, cudaMemcpyHostToDevice, stream));
  PROBE_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> last(n);
  PROBE_CHECK(cudaMemcpyAsync(last.data(), rows + static_cast<size_t>(links % 2) * n, sizeof(float) * n,
                              cudaMemcpyDeviceToHost, stream));
  PROBE_CHECK(cudaStreamSynchronize(stream));
  bool same_bits = true;
  if (reference.empty()) reference = last;
  else same_bits = std::memcmp(reference.data(), last.data(), sizeof(float) * n) == 0;

  cudaEvent_t start, stop;
  PROBE_CHECK(cudaEventCreate(&start));
  PROBE_CHECK(cudaEventCreate(&stop));
  for (int warm = 0; warm < 3; ++warm) PROBE_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<double> times;
  for (int replay = 0; replay < 25; ++replay) {
    PROBE_CHECK(cudaEventRecord(start, stream));
    PROBE_CHECK(cudaGraphLaunch(exec, stream));
    PROBE_CHECK(cudaEventRecord(stop, stream));
    PROBE_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0);
  }
  std::sort(times.begin(), times.end());
  PROBE_CHECK(cudaEventDestroy(start));
  PROBE_CHECK(cudaEventDestroy(stop));
  PROBE_CHECK(cudaGraphExecDestroy(exec));
  PROBE_CHECK(cudaGraphDestroy(graph));
  PROBE_CHECK(cudaStreamDestroy(stream));
  PROBE_CHECK(cudaFree(rows));
  PROBE_CHECK(cudaFree(counters));
  return {order, blocks, fan_in, links, times[times.size() / 2] / links, same_bits};
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::fprintf(stderr, "qspec_gpu_boundary_probe: needs sm_90 or newer (programmatic dependent launch), found sm_%d%d\n",
                 prop.major, prop.minor);
    return 1;
  }
  const int n = 4096;  // one f32 row of Llama-3-8B's hidden size: 16 KB read by every block
  const int links = 64;
  std::vector<float> first_row(n);
  for (int i = 0; i < n; ++i) first_row[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  std::vector<Result> results;
  bool all_same = true;
  std::printf("%s, %d multiprocessors; %d links a chain, one row of %d f32 a link\n", prop.name,
              prop.multiProcessorCount, links, n);
  std::printf("%-11s %7s %7s %12s %10s\n", "order", "blocks", "fan_in", "us_per_link", "same_bits");
  auto measure = [&](Order order, int blocks, int fan_in, std::vector<float>& reference) {
    const Result result = run(order, blocks, fan_in, links, n, first_row, reference);
    std::printf("%-11s %7d %7d %12.3f %10s\n", order_name(order), blocks, fan_in, result.us_per_link,
                result.same_bits ? "yes" : "NO");
    all_same = all_same && result.same_bits;
    results.push_back(result);
  };
  for (int blocks : {1, prop.multiProcessorCount, 2 * prop.multiProcessorCount}) {
    // Every block reads the whole row. persistent needs every block resident at once (a grid
    // barrier): two 256-thread blocks a multiprocessor fit.
    std::vector<float> reference;
    for (Order order : {Order::stream, Order::pdl, Order::flags, Order::block_flags, Order::persistent})
      measure(order, blocks, blocks, reference);
    // A block reads the slices of 4 blocks before it (its own arithmetic, so its own reference).
    if (blocks % 4 == 0) {
      std::vector<float> partial_reference;
      for (Order order : {Order::stream, Order::pdl, Order::flags, Order::persistent})
        measure(order, blocks, 4, partial_reference);
    }
  }
  if (argc > 1) {
    FILE* file = std::fopen(argv[1], "w");
    if (file == nullptr) {
      std::fprintf(stderr, "qspec_gpu_boundary_probe: cannot write %s\n", argv[1]);
      return 1;
    }
    std::fprintf(file, "{\n  \"gpu\": \"%s\",\n  \"links\": %d,\n  \"row_floats\": %d,\n  \"results\": [\n", prop.name,
                 links, n);
    for (size_t i = 0; i < results.size(); ++i)
      std::fprintf(file,
                   "    {\"order\": \"%s\", \"blocks\": %d, \"fan_in\": %d, \"us_per_link\": %.4f, \"same_bits\": %s}%s\n",
                   order_name(results[i].order), results[i].blocks, results[i].fan_in, results[i].us_per_link,
                   results[i].same_bits ? "true" : "false", i + 1 < results.size() ? "," : "");
    std::fprintf(file, "  ]\n}\n");
    std::fclose(file);
  }
  if (!all_same) std::fprintf(stderr, "qspec_gpu_boundary_probe: the orders disagree\n");
  return all_same ? 0 : 1;
}
