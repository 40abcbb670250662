// Device memory, copies, device properties, the cuBLAS handle and random fills behind the
// plain C++ facade of ops/cuda/ops.h.
#include <cuda_profiler_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "ops/cuda/common.h"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

const cudaDeviceProp& current_device_properties() {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<cudaDeviceProp>> cache;
  int device = 0;
  QSPEC_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() <= static_cast<size_t>(device)) cache.resize(static_cast<size_t>(device) + 1);
  if (!cache[device]) {
    auto props = std::make_unique<cudaDeviceProp>();
    QSPEC_CUDA_CHECK(cudaGetDeviceProperties(props.get(), device));
    cache[device] = std::move(props);
  }
  return *cache[device];
}

namespace {
// -1: follow QSPEC_NO_PDL; 0 / 1: set by set_pdl_enabled.
std::atomic<int> pdl_override{-1};
}  // namespace

bool pdl_enabled() {
  static const bool disabled_by_env = [] {
    const char* value = std::getenv("QSPEC_NO_PDL");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  const int forced = pdl_override.load(std::memory_order_relaxed);
  const bool wanted = forced >= 0 ? forced == 1 : !disabled_by_env;
  return wanted && current_device_properties().major >= 9;
}
int env_int(const char* name, int fallback, int lo, int hi) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  QSPEC_CHECK(end != value && *end == '\0' && parsed >= lo && parsed <= hi, name, "=", value, ": expected an integer in [",
              lo, ", ", hi, "]");
  return static_cast<int>(parsed);
}
int smem_carveout_percent() {
  static const int percent = env_int("QSPEC_SMEM_CARVEOUT", -1, 0, 100);  // -1: unset
  return percent;
}
void set_pdl_enabled(bool enabled) { pdl_override.store(enabled ? 1 : 0, std::memory_order_relaxed); }

void* DeviceAllocator::allocate(size_t bytes) {
  void* data = nullptr;
  QSPEC_CUDA_CHECK(cudaMalloc(&data, bytes));
  return data;
}
void DeviceAllocator::release(void* data) noexcept { cudaFree(data); }

void copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  QSPEC_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
}
void copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return;
  QSPEC_CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
}
void copy_device_to_device(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  QSPEC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
}
void fill_bytes(void* device_dst, int byte_value, size_t bytes, void* stream) {
  if (bytes == 0) return;
  QSPEC_CUDA_CHECK(cudaMemsetAsync(device_dst, byte_value, bytes, as_stream(stream)));
}
void synchronize() { QSPEC_CUDA_CHECK(cudaDeviceSynchronize()); }
void stream_synchronize(void* stream) { QSPEC_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream))); }
int multiprocessor_count() { return current_device_properties().multiProcessorCount; }
int compute_capability() {
  const cudaDeviceProp& props = current_device_properties();
  return props.major * 10 + props.minor;
}
size_t l2_cache_bytes() { return static_cast<size_t>(current_device_properties().l2CacheSize); }
int weight_copies_beyond_l2(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((3 * l2_cache_bytes() + bytes - 1) / std::max<size_t>(bytes, 1), 1, 32));
}

void* create_stream() {
  cudaStream_t stream = nullptr;
  QSPEC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}
void destroy_stream(void* stream) {
  if (stream != nullptr) cudaStreamDestroy(as_stream(stream));
}
std::string device_name() { return current_device_properties().name; }

ReplayTimes time_replays(const std::function<void(void* stream, int index)>& body, int batch, int warmup, int reps,
                         void* stream) {
  QSPEC_CHECK(stream != nullptr && batch > 0 && reps > 0, "time_replays: needs a stream, batch > 0, reps > 0");
  cudaStream_t s = as_stream(stream);
  for (int i = 0; i < warmup; ++i) body(stream, i % batch);
  QSPEC_CUDA_CHECK(cudaStreamSynchronize(s));
  ReplayTimes times;
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    bool captured = true;
    try {
      for (int i = 0; i < batch; ++i) body(stream, i);
    } catch (const Error&) {
      captured = false;
    }
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (captured && end == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) times.graph = true;
    cudaGetLastError();  // clear a capture failure; the plain path below reports real errors
  } else {
    cudaGetLastError();
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  QSPEC_CUDA_CHECK(cudaEventCreate(&start));
  QSPEC_CUDA_CHECK(cudaEventCreate(&stop));
  auto run_batch = [&] {
    if (times.graph) {
      QSPEC_CUDA_CHECK(cudaGraphLaunch(exec, s));
    } else {
      for (int i = 0; i < batch; ++i) body(stream, i);
    }
  };
  run_batch();  // warm the graph
  for (int r = 0; r < reps; ++r) {
    QSPEC_CUDA_CHECK(cudaEventRecord(start, s));
    run_batch();
    QSPEC_CUDA_CHECK(cudaEventRecord(stop, s));
    QSPEC_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    QSPEC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.ms.push_back(ms / static_cast<float>(batch));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return times;
}

void profiler_start() { QSPEC_CUDA_CHECK(cudaProfilerStart()); }
void profiler_stop() { QSPEC_CUDA_CHECK(cudaProfilerStop()); }

MemoryInfo memory_info() {
  MemoryInfo info;
  QSPEC_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

Graph::~Graph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}
Graph::Graph(Graph&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}
Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}
Graph Graph::capture(void* stream, const std::function<void()>& body) {
  cudaStream_t s = as_stream(stream);
  QSPEC_CHECK(s != nullptr, "cuda::Graph::capture: needs a created stream");
  QSPEC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(s, &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  QSPEC_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  QSPEC_CUDA_CHECK(status);
  Graph out;
  out.exec_ = exec;
  return out;
}
void Graph::launch(void* stream) const {
  QSPEC_CHECK(exec_ != nullptr, "cuda::Graph::launch: empty graph");
  QSPEC_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), as_stream(stream)));
}

void* PinnedAllocator::allocate(size_t bytes) {
  void* data = nullptr;
  QSPEC_CUDA_CHECK(cudaMallocHost(&data, bytes));
  return data;
}
void PinnedAllocator::release(void* data) noexcept { cudaFreeHost(data); }
void copy_to_device_async(void* device_dst, const void* host_src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  QSPEC_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
}
void copy_to_host_async(void* host_dst, const void* device_src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  QSPEC_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
}

StreamFence::StreamFence() {
  cudaEvent_t event = nullptr;
  QSPEC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  event_ = event;
}
StreamFence::~StreamFence() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}
void StreamFence::record(void* stream) {
  QSPEC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), as_stream(stream)));
}
void StreamFence::wait() { QSPEC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_))); }

Blas::Blas() {
  cublasHandle_t handle = nullptr;
  QSPEC_CUBLAS_CHECK(cublasCreate(&handle));
  handle_ = handle;
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
  QSPEC_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  QSPEC_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace_, kWorkspaceBytes));
}
Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_ != nullptr) cudaFree(workspace_);
}

namespace {
__device__ __forceinline__ uint32_t mix(uint64_t seed, uint64_t index) {
  // splitmix64 of (seed, index)
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + index + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 16);
}

__global__ void fill_random_u32_kernel(uint32_t* dst, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = mix(seed, i);
}
__global__ void fill_random_f16_kernel(__half* dst, size_t count, float lo, float hi, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(mix(seed, i) >> 8) * (1.0f / 16777216.0f);
    dst[i] = __float2half_rn(lo + (hi - lo) * u);
  }
}
__global__ void fill_random_zero_points_kernel(uint32_t* dst, size_t count, int lo, int span, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t r = mix(seed, i);
    uint32_t word = 0;
    for (int nibble = 0; nibble < 8; ++nibble)
      word |= static_cast<uint32_t>(lo + static_cast<int>((r >> (4 * nibble)) % span)) << (4 * nibble);
    dst[i] = word;
  }
}
// Bandwidth probes: 16-byte loads and stores, four in flight per thread, grid-stride.
__global__ void copy16_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
                d = __ldcs(src + i + 3 * stride);
    __stcs(dst + i, a);
    __stcs(dst + i + stride, b);
    __stcs(dst + i + 2 * stride, c);
    __stcs(dst + i + 3 * stride, d);
  }
  for (; i < count; i += stride) __stcs(dst + i, __ldcs(src + i));
}
__global__ void read16_kernel(const uint4* __restrict__ src, size_t count, uint32_t* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  uint32_t x = 0;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
                d = __ldcs(src + i + 3 * stride);
    x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < count; i += stride) {
    const uint4 a = __ldcs(src + i);
    x ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (x == 0x9e3779b9u) *sink = x;  // keeps the loads alive; practically never stores
}
int fill_grid(size_t count) {
  return static_cast<int>(std::min<size_t>((count + 255) / 256, static_cast<size_t>(multiprocessor_count()) * 32));
}
}  // namespace

void copy_kernel(void* dst, const void* src, size_t bytes, void* stream) {
  QSPEC_CHECK(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0,
              "cuda::copy_kernel: needs 16-byte aligned pointers and sizes");
  if (bytes == 0) return;
  copy16_kernel<<<multiprocessor_count() * 8, 256, 0, as_stream(stream)>>>(static_cast<uint4*>(dst),
                                                                        static_cast<const uint4*>(src), bytes / 16);
  QSPEC_CUDA_CHECK_LAUNCH("copy16_kernel");
}
void read_kernel(const void* src, size_t bytes, uint32_t* sink, void* stream) {
  QSPEC_CHECK(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0,
              "cuda::read_kernel: needs a 16-byte aligned pointer and size");
  if (bytes == 0) return;
  read16_kernel<<<multiprocessor_count() * 8, 256, 0, as_stream(stream)>>>(static_cast<const uint4*>(src), bytes / 16,
                                                                          sink);
  QSPEC_CUDA_CHECK_LAUNCH("read16_kernel");
}

void fill_random_u32(uint32_t* dst, size_t count, uint64_t seed, void* stream) {
  if (count == 0) return;
  fill_random_u32_kernel<<<fill_grid(count), 256, 0, as_stream(stream)>>>(dst, count, seed);
  QSPEC_CUDA_CHECK_LAUNCH("fill_random_u32");
}
void fill_random_zero_points(uint32_t* dst, size_t count, int lo, int hi, uint64_t seed, void* stream) {
  QSPEC_CHECK(0 <= lo && lo <= hi && hi <= 15, "cuda::fill_random_zero_points: zero points ", lo, "..", hi, " (0..15)");
  if (count == 0) return;
  fill_random_zero_points_kernel<<<fill_grid(count), 256, 0, as_stream(stream)>>>(dst, count, lo, hi - lo + 1, seed);
  QSPEC_CUDA_CHECK_LAUNCH("fill_random_zero_points");
}
void fill_random_f16(f16_bits* dst, size_t count, float lo, float hi, uint64_t seed, void* stream) {
  if (count == 0) return;
  fill_random_f16_kernel<<<fill_grid(count), 256, 0, as_stream(stream)>>>(reinterpret_cast<__half*>(dst), count, lo,
                                                                          hi, seed);
  QSPEC_CUDA_CHECK_LAUNCH("fill_random_f16");
}

}  // namespace qspec::cuda
