// How activations meet the packed 4-bit weights (gemm/w4a16_pack.h) in the small-M kernel: one
// policy per activation type, so the weight streaming, split-K and fix-up code exists once.
//
// Both policies consume one packed k pair (32 k values, two 32-bit words w0 / w1 per lane) per
// call and read the same x elements: lane 4g + t's B fragment is the 8 consecutive values of
// token g at k = 32P + 8t (16 bytes of f16, 8 bytes of int8). What differs:
//   ActF16  (W4A16) two mma.m16n8k16 f16 -> f32; nibbles become exact f16 integers (lop3).
//   ActS8   (W4A8)  one mma.m16n8k32 s8 -> s32; nibbles become int8 bytes. The packed k order
//           maps onto the s8 fragment without reshuffling x: A register j of the s8 mma
//           (rows g / g + 8, k 4t..4t+3 / 16 + 4t..) is, for word w_j>>1, its even / odd
//           nibbles = rows g / g + 8 at physical k p..p+3 (p = 32P + 8t + 4 (j >> 1)), stored
//           in the order p, p+2, p+1, p+3 and put back in order with one byte permute.
// A scale group's integer sum is exact in s32 (128 products of at most 8 x 127), then scaled
// by the weight group scale in f32 like the f16 path's group sums; the token scale multiplies
// the finished row (epilogue).
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_common.cuh"

namespace qspec::cuda::kernels {

__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four offset-binary nibbles, one per byte (bits 0..3 of each byte, u = 0..15), to int8 u - 8
// with the bytes reordered (0, 2, 1, 3). Per byte (0x80 | u) - 8 never borrows from the next
// byte, and xor 0x80 turns 0x78 + u into (u - 8) mod 256.
__device__ __forceinline__ uint32_t int4_bytes_to_s8(uint32_t nibble_bytes) {
  const uint32_t biased = lop3_and_or(nibble_bytes, 0x0f0f0f0fu, 0x80808080u);
  return __byte_perm((biased - 0x08080808u) ^ 0x80808080u, 0, 0x3120);
}

struct ActF16 {
  using Elem = __half;
  using Frag = uint4;      // 8 halves
  using GroupAcc = float;  // a scale group's sum
  static constexpr bool kTokenScale = false;
  struct Weights {
    uint32_t a[2][4];  // the two k16 tiles of the pair
  };
  __device__ static __forceinline__ Frag load(const Elem* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ static __forceinline__ Frag load_shared(const Elem* p) { return *reinterpret_cast<const uint4*>(p); }
  __device__ static __forceinline__ Weights unpack(uint32_t w0, uint32_t w1) {
    Weights w;
    dequant_int4x8(w0, w.a[0]);
    dequant_int4x8(w1, w.a[1]);
    return w;
  }
  __device__ static __forceinline__ void mma(GroupAcc (&d)[4], const Weights& w, const Frag& x) {
    mma_f16_16816(d, w.a[0], x.x, x.y);
    mma_f16_16816(d, w.a[1], x.z, x.w);
  }
  __device__ static __forceinline__ float to_float(GroupAcc v) { return v; }
};

struct ActS8 {
  using Elem = int8_t;
  using Frag = uint2;    // 8 int8 values
  using GroupAcc = int;  // exact
  static constexpr bool kTokenScale = true;
  struct Weights {
    uint32_t a[4];
  };
  __device__ static __forceinline__ Frag load(const Elem* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
  __device__ static __forceinline__ Frag load_shared(const Elem* p) { return *reinterpret_cast<const uint2*>(p); }
  __device__ static __forceinline__ Weights unpack(uint32_t w0, uint32_t w1) {
    Weights w;
    w.a[0] = int4_bytes_to_s8(w0);       // row g,     k 4t..4t+3      (word 0, even nibbles)
    w.a[1] = int4_bytes_to_s8(w0 >> 4);  // row g + 8, k 4t..4t+3      (word 0, odd nibbles)
    w.a[2] = int4_bytes_to_s8(w1);       // row g,     k 16+4t..16+4t+3 (word 1)
    w.a[3] = int4_bytes_to_s8(w1 >> 4);  // row g + 8
    return w;
  }
  __device__ static __forceinline__ void mma(GroupAcc (&d)[4], const Weights& w, const Frag& x) {
    mma_s8_16832(d, w.a, x.x, x.y);
  }
  __device__ static __forceinline__ float to_float(GroupAcc v) { return static_cast<float>(v); }
};

// The W4A8 epilogue: a thread's accumulators (n-tile nt: tokens nt*8 + 2t, + 1, for rows g and
// g + 8) times their tokens' scales: tile tokens from first_token, last_token the tile's last
// valid one (rows past it are clamped, their outputs dropped). No-op for f16.
template <class Act, int RPW, int MT>
__device__ __forceinline__ void apply_token_scales(float (&acc)[RPW][MT][4], const float* __restrict__ x_scales,
                                                   int first_token, int t, int last_token) {
  if constexpr (Act::kTokenScale) {
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) {
      const float s0 = __ldg(x_scales + first_token + min(nt * 8 + 2 * t, last_token));
      const float s1 = __ldg(x_scales + first_token + min(nt * 8 + 2 * t + 1, last_token));
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        acc[r][nt][0] *= s0;
        acc[r][nt][1] *= s1;
        acc[r][nt][2] *= s0;
        acc[r][nt][3] *= s1;
      }
    }
  }
}

}  // namespace qspec::cuda::kernels
