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
__device__ __forceinline__ uint64_t wgmma_descriptor_128b(const void* tile) {
  const uint32_t address = smem_address(tile);
  uint64_t desc = static_cast<uint64_t>((address & 0x3FFFF) >> 4);  // start address, 16-byte units
  desc |= static_cast<uint64_t>(1) << 16;                           // leading byte offset: unused when swizzled
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;                   // stride byte offset: 8 rows x 128 B
  desc |= static_cast<uint64_t>(1) << 62;                           // 128-byte swizzle
  return desc;
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
// Blocks until the barrier's phase `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_address(barrier)),
      "r"(parity)
      : "memory");
#endif
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

// The accumulators an m64n128 wgmma leaves in one thread (warp w of the warpgroup, lane 4g + t):
// d[4i + e] = row 16w + g + 8 (e >> 1), column 8i + 2t + (e & 1), i = 0..15.
// d = a b^T (+ d when accumulate != 0): a 64 x 32, b 128 x 32, both K-major int8 in shared memory.
__device__ __forceinline__ void wgmma_s8_m64n128k32(int (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
        "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]),
        "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]),
        "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]),
        "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]),
        "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]),
        "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]),
        "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
#else
  (void)d;
  (void)a_desc;
  (void)b_desc;
  (void)accumulate;
  __trap();
#endif
}

// The same for e4m3 operands (bytes in the same layout) and f32 accumulators (operand scales +1).
__device__ __forceinline__ void wgmma_e4m3_m64n128k32(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
#if QSPEC_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
#else
  (void)d;
  (void)a_desc;
  (void)b_desc;
  (void)accumulate;
  __trap();
#endif
}


}  // namespace qspec::cuda::kernels
