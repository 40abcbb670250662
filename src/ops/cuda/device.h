// Device memory, graphs, streams, events and cuBLAS handles as plain C++ (the CUDA backend's runtime face).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qspec::cuda {

using f16_bits = uint16_t;  // an IEEE binary16 value as stored

// ---- device memory and synchronisation (thin wrappers, for host C++ and tests) ------------

// Owning memory from one allocator: Allocator::allocate(bytes) (throws qspec::Error) and
// Allocator::release(data), defined in runtime.cu. bytes() may be 0 (then get() is nullptr).
// Move-only. DeviceMemory and PinnedMemory below are its two kinds.
template <typename Allocator>
class OwnedMemory {
 public:
  OwnedMemory() = default;
  explicit OwnedMemory(size_t bytes) : data_(bytes == 0 ? nullptr : Allocator::allocate(bytes)), bytes_(bytes) {}
  ~OwnedMemory() { reset(); }
  OwnedMemory(OwnedMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  OwnedMemory& operator=(OwnedMemory&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  OwnedMemory(const OwnedMemory&) = delete;
  OwnedMemory& operator=(const OwnedMemory&) = delete;

  void* get() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void reset() noexcept {
    if (data_ != nullptr) Allocator::release(data_);
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

struct DeviceAllocator {  // cudaMalloc / cudaFree
  static void* allocate(size_t bytes);
  static void release(void* data) noexcept;
};
// Owning device allocation.
using DeviceMemory = OwnedMemory<DeviceAllocator>;

void copy_to_device(void* device_dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes, void* stream = nullptr);
void fill_bytes(void* device_dst, int byte_value, size_t bytes, void* stream = nullptr);
void synchronize();  // the whole device; throws on a pending asynchronous error
void stream_synchronize(void* stream);
int multiprocessor_count();
int compute_capability();  // major * 10 + minor of the current device
size_t l2_cache_bytes();
// How many copies of a weight of `bytes` cover 3x the L2 cache (1 to 32): benchmarks replay a
// GEMM round-robin over them, so each launch streams its weights from device memory as in a
// forward pass instead of finding them in L2.
int weight_copies_beyond_l2(size_t bytes);
// Whether kernels launch with programmatic dependent launch: sm_90+, and QSPEC_NO_PDL unset
// unless set_pdl_enabled overrode it (tests and benchmarks compare both in one process; graphs
// keep the setting they were captured with).
bool pdl_enabled();
void set_pdl_enabled(bool enabled);

// Deterministic pseudo-random device data (synthetic weights for benchmarks): uniform u32
// words, and f16 values uniform in [lo, hi).
void fill_random_u32(uint32_t* dst, size_t count, uint64_t seed, void* stream = nullptr);
void fill_random_f16(f16_bits* dst, size_t count, float lo, float hi, uint64_t seed, void* stream = nullptr);
// int4-zp packed zero points (ops/w4a16_pack.h): `count` words of 8 nibbles, each uniform in [lo, hi]
// (0 <= lo <= hi <= 15).
void fill_random_zero_points(uint32_t* dst, size_t count, int lo, int hi, uint64_t seed, void* stream = nullptr);

// Bandwidth probes for the roofline: a 16-byte-vector copy kernel (bytes read + written), and a
// read-only pass (a checksum to `sink`, a device u32). bytes % 16 == 0, 16-byte aligned.
void copy_kernel(void* dst, const void* src, size_t bytes, void* stream = nullptr);
void read_kernel(const void* src, size_t bytes, uint32_t* sink, void* stream = nullptr);

// Streams and timing for benchmarks. time_replays enqueues `body` (work on the given stream)
// `batch` times into one CUDA graph (captured once, after `warmup` plain runs of body; plain
// stream launches when capture fails, e.g. a library that cannot be captured), replays it
// `reps` times and returns each replay's milliseconds from CUDA events divided by `batch`.
void* create_stream();
void destroy_stream(void* stream);
struct ReplayTimes {
  std::vector<float> ms;  // per body, one entry per replay
  bool graph = false;     // false: timed as plain stream launches
};
ReplayTimes time_replays(const std::function<void(void* stream, int index)>& body, int batch, int warmup, int reps,
                         void* stream);
std::string device_name();

// Brackets the region a profiler started with --profile-from-start off collects (ncu).
void profiler_start();
void profiler_stop();

// Free and total device memory (cudaMemGetInfo) of the current device.
struct MemoryInfo {
  size_t free_bytes = 0, total_bytes = 0;
};
MemoryInfo memory_info();

// A captured CUDA graph: what `body` enqueues on `stream` (thread-local capture), replayed with
// launch(). Kernel parameters are frozen at capture: inputs must live in device buffers that
// the caller rewrites between launches. Move-only.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // Throws qspec::Error when capture or instantiation fails (the stream is usable afterwards).
  static Graph capture(void* stream, const std::function<void()>& body);
  void launch(void* stream) const;
  bool valid() const { return exec_ != nullptr; }

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};

struct PinnedAllocator {  // cudaMallocHost / cudaFreeHost
  static void* allocate(size_t bytes);
  static void release(void* data) noexcept;
};
// Page-locked host memory (async copies from it can overlap and be captured).
using PinnedMemory = OwnedMemory<PinnedAllocator>;
void copy_to_device_async(void* device_dst, const void* host_src, size_t bytes, void* stream);
void copy_to_host_async(void* host_dst, const void* device_src, size_t bytes, void* stream);

// A point of a stream the host can wait for (a CUDA event without timing): what lets the host
// reuse a pinned staging buffer once the copy out of it has run, without waiting for the work
// queued after that copy.
class StreamFence {
 public:
  StreamFence();
  ~StreamFence();
  StreamFence(const StreamFence&) = delete;
  StreamFence& operator=(const StreamFence&) = delete;
  void record(void* stream);
  void wait();  // returns at once before the first record

 private:
  void* event_ = nullptr;
};

// cuBLAS handle (one per thread that issues GEMMs). Opaque: cublas_v2.h stays in ops/cuda.
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  void* handle() const { return handle_; }  // cublasHandle_t

 private:
  void* handle_ = nullptr;
  // Its own workspace, so GEMMs captured into a CUDA graph never allocate.
  void* workspace_ = nullptr;
};

}  // namespace qspec::cuda
