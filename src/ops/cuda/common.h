// Shared pieces of the CUDA backend: error checks that throw qspec::Error with file:line and
// the CUDA error string, f16/bf16 helpers and the inline PTX the kernels share (mma.sync,
// ldmatrix, cp.async). Include from .cu / .cuh files only: this is the one header that
// brings CUDA types in; plain C++ code includes ops/cuda/ops.h instead.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "qspec/error.h"

namespace qspec::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  fail(file, ":", line, ": CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") in ", what);
}
[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* what, const char* file, int line) {
  fail(file, ":", line, ": cuBLAS error ", cublasGetStatusName(status), " (", cublasGetStatusString(status),
       ") in ", what);
}

}  // namespace qspec::cuda

// QSPEC_CUDA_CHECK(cudaMalloc(...)): throws qspec::Error("file:line: CUDA error ...").
#define QSPEC_CUDA_CHECK(call)                                                          \
  do {                                                                                  \
    const cudaError_t qspec_status_ = (call);                                           \
    if (qspec_status_ != cudaSuccess)                                                   \
      ::qspec::cuda::throw_cuda_error(qspec_status_, #call, __FILE__, __LINE__);        \
  } while (0)

// After a <<<...>>> launch: configuration errors (bad grid, too much shared memory) surface
// here. Asynchronous faults surface at the next synchronizing call.
#define QSPEC_CUDA_CHECK_LAUNCH(name)                                                   \
  do {                                                                                  \
    const cudaError_t qspec_status_ = cudaGetLastError();                               \
    if (qspec_status_ != cudaSuccess)                                                   \
      ::qspec::cuda::throw_cuda_error(qspec_status_, "launch of " name, __FILE__, __LINE__); \
  } while (0)

#define QSPEC_CUBLAS_CHECK(call)                                                        \
  do {                                                                                  \
    const cublasStatus_t qspec_status_ = (call);                                        \
    if (qspec_status_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::qspec::cuda::throw_cublas_error(qspec_status_, #call, __FILE__, __LINE__);      \
  } while (0)

namespace qspec::cuda {

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Properties of the current device, read once per device.
const cudaDeviceProp& current_device_properties();

// ---- f16 / bf16 helpers ----------------------------------------------------------------

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ float2 unpack_half2(uint32_t bits) {
  __half2 h = *reinterpret_cast<__half2*>(&bits);
  return __half22float2(h);
}
// 8 halves of a 16-byte vector to floats.
__device__ __forceinline__ void half8_to_float(const uint4& v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = unpack_half2(words[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ uint4 float8_to_half(const float (&in)[8]) {
  uint4 v;
  v.x = pack_half2(in[0], in[1]);
  v.y = pack_half2(in[2], in[3]);
  v.z = pack_half2(in[4], in[5]);
  v.w = pack_half2(in[6], in[7]);
  return v;
}

// ---- inline PTX shared by the matrix kernels --------------------------------------------

// One LOP3 each: C's `(a & b) | c` or `(a & b) ^ c` with two constants compiles to two (a LOP3
// takes one immediate), unless the constants come in registers, as here.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));  // (a & b) | c
  return d;
}
__device__ __forceinline__ uint32_t lop3_and_xor(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));  // (a & b) ^ c
  return d;
}

// D = A * B + D, m16n8k16, f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Split-K arrival: thread 0 adds to a counter with release and acquire at GPU scope. After a
// block barrier, its release covers every thread's earlier stores (release is cumulative through
// bar.sync); a barrier after it extends its acquire to the block. Two fence.sc.gpu around a
// relaxed atomicAdd did the same at ~2x the cost (the decode attention's merge, H100 probe).
__device__ __forceinline__ unsigned atomic_add_acq_rel_gpu(unsigned* address, unsigned value) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(address), "r"(value) : "memory");
  return old;
}

// A split-K arrival (the GEMMs' split fix-up, the decode attention's split merge): every thread
// of the block calls it after its partial stores; true in the last of `arrivals` blocks to arrive
// on counter (block-uniform), which then sees every block's partials and finds the counter reset
// to zero for the next launch (a later launch touches it only after this grid has completed).
// One acq_rel atomic by thread 0 between two barriers: the barrier before orders the block's
// stores ahead of the release, the one after spreads the acquire to every thread's reads.
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, unsigned arrivals) {
  __shared__ unsigned last_block;
  __syncthreads();
  if (threadIdx.x == 0) {
    last_block = atomic_add_acq_rel_gpu(counter, 1u) == arrivals - 1;
    if (last_block) *counter = 0;
  }
  __syncthreads();
  return last_block != 0;
}

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// 16-byte global -> shared copy; src_bytes 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// cp_async_16 issued only where `issue` holds: a predicated instruction, not a branch, so the
// compiler can schedule it among the code around it.
__device__ __forceinline__ void cp_async_16_if(bool issue, uint32_t dst, const void* src, int src_bytes) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(dst),
      "l"(src), "r"(src_bytes), "r"(static_cast<int>(issue)));
}
// 8-byte global -> shared copy (both 8-byte aligned), zero fill as cp_async_16; predicated on `issue`.
__device__ __forceinline__ void cp_async_8_if(bool issue, uint32_t dst, const void* src, int src_bytes) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p cp.async.ca.shared.global [%0], [%1], 8, %2;\n}\n" ::"r"(dst),
      "l"(src), "r"(src_bytes), "r"(static_cast<int>(issue)));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Whether a pointer allows 16-byte vector loads and stores (the launchers' test for the VEC = 8
// kernel variants).
inline bool is_aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// A hint: the 128-byte line holding `address` is fetched into L2 (no register waits for it).
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

// Programmatic dependent launch (PDL, sm_90+). A kernel launched with launch_pdl may start
// while the previous kernel on the stream drains: it must call grid_dependency_wait() before it
// reads that kernel's outputs or writes global memory (loads of constant data, such as weights,
// may come first). grid_launch_dependents() lets the next kernel launch early; every kernel
// launched with launch_pdl calls both, so the chain stays ordered: a kernel's wait returns when
// its predecessor has completed, which that predecessor only did after its own wait. Both are
// no-ops when the launch did not set the attribute (and on sm_80, which has no PDL).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}
// The prologue of a small kernel that reads its predecessor's output from its first instruction.
// release_first: let the next kernel launch before waiting instead of after. When the next
// kernel is a W4A16 GEMM, its blocks then become resident while this kernel still waits, and
// issue their first weight loads (which need nothing from either kernel) during the previous
// kernel's drain: the W4A16 decode step at batch 1-8 is 4 % shorter with it on the RMSNorm and
// SiLU kernels (H100, docs/perf-journal/perf-notes-journal-2026.md). It stays off elsewhere: on every small kernel it cost
// up to 3 % (W4A8) and 7.5 % (W4A4-nvfp4) in the low-precision steps, whose activation
// quantizers sit between these kernels and their GEMMs. Either order is correct: every kernel
// waits before it reads its predecessor's output or writes global memory, and a wait returns
// only when the predecessor has completed, which it did only after its own wait.
__device__ __forceinline__ void pdl_prologue(bool release_first = false) {
  if (release_first) grid_launch_dependents();
  grid_dependency_wait();
  if (!release_first) grid_launch_dependents();
}

// Whether launch_pdl sets the attribute: sm_90 or newer, and QSPEC_NO_PDL unset (the switch the
// benchmarks use to measure what PDL is worth in the same run). Read once (runtime.cu).
bool pdl_enabled();
// The shared-memory carveout (percent of the maximum, cudaLaunchAttributePreferredSharedMemoryCarveout)
// launch_pdl asks for, from QSPEC_SMEM_CARVEOUT; -1 (unset): no preference, the driver's choice.
// A benchmark knob: a multiprocessor changes its L1 / shared split only when idle, so kernels
// that want different splits may not overlap under programmatic dependent launch.
int smem_carveout_percent();
// A benchmark knob read from the environment (the caller keeps it in a static): `fallback` when
// unset or empty, else an integer in [lo, hi], or an error naming the variable (runtime.cu).
int env_int(const char* name, int fallback, int lo, int hi);

template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (pdl_enabled()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (const int carveout = smem_carveout_percent(); carveout >= 0) {
    attributes[count].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attributes[count++].val.sharedMemCarveout = static_cast<unsigned>(carveout);
  }
  config.attrs = attributes;
  config.numAttrs = count;
  QSPEC_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Streaming 16-byte load for data read exactly once (packed weights): not kept in L1.
__device__ __forceinline__ uint4 load_stream_16(const void* pointer) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(pointer));
  return v;
}
__device__ __forceinline__ uint2 load_stream_8(const void* pointer) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(pointer));
  return v;
}

}  // namespace qspec::cuda
