// Pieces shared by the W4A16 kernels: the packed layout (gemm/w4a16_pack.h) and the lop3 /
// magic-number int4 -> f16 dequantization.
#pragma once
#include "ops/cuda/common.h"

namespace qspec::cuda::kernels {

struct W4A16Layout {
  const uint8_t* codes;     // [row_blocks][k * 8 bytes]
  const uint32_t* scales;   // [row_blocks][groups][8] f16 pairs
  int n, k;
  int row_blocks;           // ceil(n / 16)
  int full_chunks;          // k / 64
  int tail;                 // 1 when k % 64 == 32 (a last chunk of one pair)
  int groups;               // k / group
};

// Programmatic dependent launch (no-ops when the launch did not set the attribute): wait for
// the previous kernel's completion and memory; allow the next kernel to launch.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));  // (a & b) | c
  return d;
}

// One packed word (8 offset-binary nibbles) -> four f16x2 registers of integer values -8..7:
// a[0] = (n0, n4), a[1] = (n1, n5), a[2] = (n2, n6), a[3] = (n3, n7). Exact.
__device__ __forceinline__ void dequant_int4x8(uint32_t q, uint32_t (&a)[4]) {
  constexpr uint32_t kLow = 0x000f000f, kHigh = 0x00f000f0, kExponent = 0x64006400;
  constexpr uint32_t kSub = 0x64086408;  // f16x2 (1032, 1032)
  constexpr uint32_t kMul = 0x2c002c00;  // f16x2 (1/16, 1/16)
  constexpr uint32_t kAdd = 0xd480d480;  // f16x2 (-72, -72)
  const __half2 sub = *reinterpret_cast<const __half2*>(&kSub);
  const __half2 mul = *reinterpret_cast<const __half2*>(&kMul);
  const __half2 add = *reinterpret_cast<const __half2*>(&kAdd);
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    uint32_t lo = lop3_and_or(q, kLow, kExponent);   // 1024 + u
    uint32_t hi = lop3_and_or(q, kHigh, kExponent);  // 1024 + 16 u
    __half2 l = __hsub2(*reinterpret_cast<__half2*>(&lo), sub);
    __half2 h = __hfma2(*reinterpret_cast<__half2*>(&hi), mul, add);
    a[2 * step] = *reinterpret_cast<uint32_t*>(&l);
    a[2 * step + 1] = *reinterpret_cast<uint32_t*>(&h);
    q >>= 8;
  }
}

}  // namespace qspec::cuda::kernels
