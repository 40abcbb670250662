// Hopper warpgroup mma (wgmma, sm_90a only) for the int8 GEMM at large M: the shared-memory
// operand descriptor of the 128-byte swizzled K-major layout, the fences, and the one shape the
// kernels use (m64n128k32, s8 x s8 -> s32 and e4m3 x e4m3 -> f32).
//
// Why wgmma: on sm_90 mma.sync runs at about half the tensor cores' rate (measured: s8 mma.sync
// 1290 TOP/s on the H100, cuBLAS's int8 GEMM, which uses wgmma, 1590), and a kernel on mma.sync
// spends issue slots on every operand fragment. A wgmma reads both operands straight from shared
// memory, 64 x 128 x 32 a warpgroup an instruction, asynchronously: the warps are free to scale
// the previous group's sums meanwhile.
//
// Layout (PTX ISA "matrix descriptor", 128B swizzle, K-major): an operand tile is R rows x 128
// bytes of k (128 int8 values), rows 128 bytes apart, 8-row blocks 1024 bytes apart (the
// stride byte offset), the tile 1024-byte aligned. Within each 8-row block, the 16-byte piece
// c of row r is stored at piece c ^ (r & 7) (address bits 4..6 xor bits 7..9): swizzled_offset
// below. A k32 step inside the 128-byte row is a 32-byte advance of the start address.
//
// Outside sm_90a (the sm_80 pass of the build) these compile to a trap: the launchers check that
// the sm_90a code is what runs (cuda::w4_s8_wgmma_supports).
#pragma once
#include <cstdint>

#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QSPEC_WGMMA 1
#else
#define QSPEC_WGMMA 0
#endif

// Byte offset of (row, byte) in a 128B-swizzled K-major tile of 128-byte rows.
__host__ __device__ constexpr int swizzled_offset(int row, int byte) {
  return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}

// Descriptor of a 128B-swizzled K-major tile starting at `tile` (1024-byte aligned, plus a
// multiple of 32 bytes to step k inside the row).
// (By shared address: the tile's, or a pointer's through the overload below.)
__device__ __forceinline__ uint64_t wgmma_descriptor_128b(uint32_t address) {
  uint64_t desc = static_cast<uint64_t>((address & 0x3FFFF) >> 4);  // start address, 16-byte units
  desc |= static_cast<uint64_t>(1) << 16;                           // leading byte offset: unused when swizzled
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;                   // stride byte offset: 8 rows x 128 B
  desc |= static_cast<uint64_t>(1) << 62;                           // 128-byte swizzle
  return desc;
}
__device__ __forceinline__ uint64_t wgmma_descriptor_128b(const void* tile) {
  return wgmma_descriptor_128b(smem_address(tile));
}

// Orders this thread's earlier register accesses to the accumulators before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
#if QSPEC_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if QSPEC_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if QSPEC_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy global stores ordered with the copy engine's (TMA's) global reads: the writer's
// side before its release, the reader's after its acquire.
__device__ __forceinline__ void fence_proxy_async_global() {
#if QSPEC_WGMMA
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
// A flag another block releases (store_release_gpu); a __threadfence after observing it
// orders what follows (acquire).
__device__ __forceinline__ int load_relaxed_gpu(const int* address) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(address) : "memory");
  return v;
}
__device__ __forceinline__ void store_release_gpu(int* address, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(address), "r"(v) : "memory");
}

// Shared memory written through the generic proxy (ordinary stores, cp.async) and read next by
// wgmma (the async proxy) needs this fence in each writing thread before the barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if QSPEC_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Pins the registers of an accumulator array at this point of the program: the compiler may not
// move reads or writes of them across it (around the issue and the wait of an asynchronous
// wgmma, whose asm does not name the registers it will still write).
__device__ __forceinline__ void wgmma_fence_operands(int (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- the bulk tensor copy engine (TMA) and the shared-memory barriers it completes ----------

__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int count) {
#if QSPEC_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(barrier)), "r"(count) : "memory");
#endif
}
// Arrives on the barrier and tells it `bytes` more will come from bulk copies (this phase).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
#if QSPEC_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(barrier)), "r"(bytes)
               : "memory");
#endif
}
// Blocks until the barrier's phase `parity` has completed. The overload taking the barrier's
// shared-memory address serves loops that step through a ring of barriers: a generic pointer is
// converted again at every use (~6 instructions).
__device__ __forceinline__ void mbarrier_wait(uint32_t barrier_address, uint32_t parity) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(barrier_address),
      "r"(parity)
      : "memory");
#endif
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  mbarrier_wait(smem_address(barrier), parity);
}
// A 2D box of a tensor map (coordinates: inner element, row) into shared memory; completion
// counts its bytes on `barrier`. Rows or elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, int inner, int row, uint64_t* barrier) {
#if QSPEC_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(smem_address(dst)),
      "l"(tensor_map), "r"(inner), "r"(row), "r"(smem_address(barrier))
      : "memory");
#endif
}

// A 3D box of a tensor map (coordinates: innermost first) into shared memory, as tma_load_2d.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tensor_map, int c0, int c1, int c2,
                                            uint64_t* barrier) {
#if QSPEC_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_address(dst)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(barrier))
      : "memory");
#endif
}

// A 1D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// into shared memory; completion counts the bytes on `barrier`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
#if QSPEC_WGMMA
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(barrier))
               : "memory");
#endif
}
// The same copy with an L2 eviction policy (l2_evict_first_policy): weights streamed once a
// step, marked to leave the L2 before what the step reads again (the KV cache, activations,
// split-K partials).
__device__ __forceinline__ void bulk_copy_to_shared_hinted(void* dst, const void* src, uint32_t bytes,
                                                           uint64_t* barrier, uint64_t policy) {
#if QSPEC_WGMMA
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(barrier)), "l"(policy)
      : "memory");
#endif
}
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy = 0;
#if QSPEC_WGMMA
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}
// A plain arrival (release: this thread's earlier shared-memory accesses happen before the
// phase completes for whoever waits on it).
__device__ __forceinline__ void mbarrier_arrive(uint32_t barrier_address) {
#if QSPEC_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier_address) : "memory");
#endif
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) { mbarrier_arrive(smem_address(barrier)); }
// Hands registers between the warpgroups of a block (every thread of the warpgroup executes
// it): a producer warpgroup that needs few gives them to the mma warpgroups.
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_registers_decrease() {
#if QSPEC_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_registers_increase() {
#if QSPEC_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}
// Shared-memory accesses by 32-bit shared address (ld.shared / st.shared): a pointer the compiler
// cannot prove to be shared (the ring aligned by integer arithmetic) would become generic loads and
// stores, and fence.proxy.async after them a full memory barrier.
__device__ __forceinline__ uint4 load_shared_16(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(address));
  return v;
}
__device__ __forceinline__ void store_shared_8(uint32_t address, uint2 v) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(address), "r"(v.x), "r"(v.y) : "memory");
}
// A barrier among `threads` threads of the block (a multiple of 32) on hardware barrier `id`
// (0 is __syncthreads'): for a subset of warps while the others run on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The 64 accumulator registers of an m64n128 wgmma, for the asm of both operand types (the
// register list of the instruction text, and the operands, C the constraint: "+r" or "+f").
#define QSPEC_WGMMA_D64_TEXT                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
// Outside a Hopper (sm_90a) build each wgmma wrapper compiles to this trap: callers pick the
// wgmma kernels only on sm_90a, so it never runs, but the wrappers still compile everywhere.
template <class... Operands>
__device__ __forceinline__ void wgmma_unavailable(const Operands&...) {
  __trap();
}

#define QSPEC_WGMMA_D64_OPERANDS(C) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]), C(d[11]), \
  C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), \
  C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31]), C(d[32]), C(d[33]), \
  C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), \
  C(d[45]), C(d[46]), C(d[47]), C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
  C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63])

// The accumulators an m64n128 wgmma leaves in one thread (warp w of the warpgroup, lane 4g + t):
// d[4i + e] = row 16w + g + 8 (e >> 1), column 8i + 2t + (e & 1), i = 0..15.
// d = a b^T (+ d when accumulate != 0): a 64 x 32, b 128 x 32, both K-major int8 in shared memory.
__device__ __forceinline__ void wgmma_s8_m64n128k32(int (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
#if QSPEC_WGMMA
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " QSPEC_WGMMA_D64_TEXT "%64, %65, p;\n}\n"
               : QSPEC_WGMMA_D64_OPERANDS("+r")
               : "l"(a_desc), "l"(b_desc), "r"(accumulate));
#else
  wgmma_unavailable(d, a_desc, b_desc, accumulate);
#endif
}

// The same with a from registers (the A fragment of mma.m16n8k32 for each warp's 16 rows: a[0] row
// g k 4t..4t+3, a[1] row g + 8, a[2] / a[3] k 16 + 4t..): the registers must stay unchanged until
// the wgmma is waited for.
__device__ __forceinline__ void wgmma_s8_m64n128k32_rs(int (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                                       int accumulate) {
#if QSPEC_WGMMA
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " QSPEC_WGMMA_D64_TEXT
               "{%64, %65, %66, %67}, %68, p;\n}\n"
               : QSPEC_WGMMA_D64_OPERANDS("+r")
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
#else
  wgmma_unavailable(d, a, b_desc, accumulate);
#endif
}

// The same for e4m3 operands (bytes in the same layout) and f32 accumulators (operand scales +1).
__device__ __forceinline__ void wgmma_e4m3_m64n128k32(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
#if QSPEC_WGMMA
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " QSPEC_WGMMA_D64_TEXT "%64, %65, p, 1, 1;\n}\n"
               : QSPEC_WGMMA_D64_OPERANDS("+f")
               : "l"(a_desc), "l"(b_desc), "r"(accumulate));
#else
  wgmma_unavailable(d, a_desc, b_desc, accumulate);
#endif
}

// f16 x f16 -> f32 at m64n64k16 with A from registers: the A fragment of mma.m16n8k16 for each
// warp's 16 rows (a[0] row g k 2t, 2t + 1; a[1] row g + 8; a[2] / a[3] k 8 + 2t ..) and b a
// K-major f16 tile of 64 rows in shared memory. d[i][e]: row 16w + g + 8 (e >> 1), column
// 8i + 2t + (e & 1), the C fragment of mma.m16n8k16 for n-tile i. Always accumulates; the
// registers of a must stay unchanged until the wgmma is waited for.
__device__ __forceinline__ void wgmma_f16_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b_desc) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
#else
  wgmma_unavailable(d, a, b_desc);
#endif
}
template <int TILES>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[TILES][4]) {
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// The same at n32 and n128 (d[i][e] as above, i = 0 .. n / 8 - 1).
__device__ __forceinline__ void wgmma_f16_m64n32k16_rs(float (&d)[4][4], const uint32_t (&a)[4], uint64_t b_desc) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
#else
  wgmma_unavailable(d, a, b_desc);
#endif
}
__device__ __forceinline__ void wgmma_f16_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b_desc) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
#else
  wgmma_unavailable(d, a, b_desc);
#endif
}

// And at n256 (the prefill tile: 128 accumulators a thread).
__device__ __forceinline__ void wgmma_f16_m64n256k16_rs(float (&d)[32][4], const uint32_t (&a)[4], uint64_t b_desc) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
#else
  wgmma_unavailable(d, a, b_desc);
#endif
}

// The f16 register-A wgmma of width 8 * TILES tokens (32, 64, 128 or 256).
template <int TILES>
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[TILES][4], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(TILES == 4 || TILES == 8 || TILES == 16 || TILES == 32, "wgmma f16 register-A: n 32, 64, 128 or 256");
  if constexpr (TILES == 4) wgmma_f16_m64n32k16_rs(d, a, b_desc);
  else if constexpr (TILES == 8) wgmma_f16_m64n64k16_rs(d, a, b_desc);
  else if constexpr (TILES == 16) wgmma_f16_m64n128k16_rs(d, a, b_desc);
  else wgmma_f16_m64n256k16_rs(d, a, b_desc);
}

}  // namespace qspec::cuda::kernels
