// How activations meet the packed 4-bit weights (ops/w4a16_pack.h) in the small-M and tiled
// kernels: one policy per activation type, so the weight streaming, split-K and fix-up code
// exists once.
//
// Every policy consumes one packed k pair (32 k values, two 32-bit words w0 / w1 per lane) per
// call and reads the same x elements: lane 4g + t's B fragment is the 8 consecutive values of
// token g at k = 32P + 8t (16 bytes of f16, 8 bytes of int8). What differs:
//   f16 elements (ActF16, ActF16Scaled): two mma.m16n8k16 f16 -> f32; nibbles become exact f16
//           integers (lop3).
//   int8 elements (ActS8, ActS8Grouped, and ActE4M3's e4m3 bytes): one mma.m16n8k32 s8 -> s32
//           (e4m3 -> f32); nibbles become int8 (e4m3) bytes.
//           The packed k order maps onto the s8 fragment without reshuffling x: A register j of
//           the s8 mma (rows g / g + 8, k 4t..4t+3 / 16 + 4t..) is, for word w_j>>1, its even /
//           odd nibbles = rows g / g + 8 at physical k p..p+3 (p = 32P + 8t + 4 (j >> 1)), stored
//           in the order p, p+2, p+1, p+3 and put back in order with one byte permute.
// and which scales the activations carry:
//   ActF16        none (W4A16).
//   ActF16Scaled  one f32 scale per token, applied to the finished row: fp8 / nvfp4 / mxfp4
//                 activations emulated exactly on f16 mma (kernels/quantize_activations.cuh
//                 writes element x block scale, exact in f16, and the token's power of two or
//                 tensor scale).
//   ActE4M3       one f32 scale per token (W4A8-fp8 as e4m3 codes, s = amax / 448), applied to
//                 the finished row; each group's sum in f32 on e4m3 mma. On the H100 this runs
//                 slower than fp8 as f16 values on f16 mma (the weights' conversion to e4m3 costs
//                 more issue slots than the faster mma saves; docs/perf-journal/perf-notes-journal-2026.md), so the engine
//                 writes e4m3 codes only for the wgmma kernel (kernels/w4_s8_wgmma.cuh).
//   ActS8         one f32 scale per token (W4A8 int8), applied to the finished row.
//   ActS8Grouped  one f32 scale per token and activation group (W4A4 int4 codes in int8 bytes),
//                 applied with the weight group scale when a group is flushed; an activation
//                 group spans whole weight groups.
// A scale group's integer sum is exact in s32 (128 products of at most 8 x 127), then scaled
// by the weight group scale in f32 like the f16 path's group sums.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "quant/formats.h"

namespace qspec::cuda::kernels {

__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a b + c (every accumulator starts at c): the first mma of a scale group, so the group sums
// need no separate reset.
__device__ __forceinline__ void mma_s8_16832_from(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                  int c) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// Four offset-binary nibbles, one per byte (bits 0..3 of each byte, u = 0..15), to int8 u - 8
// with the bytes reordered (0, 2, 1, 3). Per byte (0x80 | u) - 8 never borrows from the next
// byte, and xor 0x80 turns 0x78 + u into (u - 8) mod 256.
__device__ __forceinline__ uint32_t int4_bytes_to_s8(uint32_t nibble_bytes) {
  const uint32_t biased = lop3_and_or(nibble_bytes, 0x0f0f0f0fu, 0x80808080u);
  return __byte_perm((biased - 0x08080808u) ^ 0x80808080u, 0, 0x3120);
}

// 16 (u - 8) of the low (even) and high (odd) nibble of each byte of w, as int8, in
// int4_bytes_to_s8's byte order (its permute first: bytes move whole, so it commutes with the
// nibble arithmetic): the nibble xor 8 (u - 8 in 4-bit two's complement) at the top of its byte
// is its value times 16. Four instructions for eight weights instead of nine; the sums come out
// 16 x (|sum| <= 2^21, still exact through the float bias), and a scale / 16 (exact) gives the
// same fma.
// flip / keep: 0x88888888 and 0xf0f0f0f0 in registers (one lop3 can take only one immediate, and
// the compiler otherwise splits (x ^ flip) & keep in two).
// int4_words_to_s8_x16: the same for the word byte_perm(a, b, selector) picks (0x3120: a, 0x7564:
// b), which folds a choice between two words into the permute.
__device__ __forceinline__ void int4_words_to_s8_x16(uint32_t a, uint32_t b, uint32_t selector, uint32_t flip,
                                                     uint32_t keep, uint32_t& low, uint32_t& high) {
  const uint32_t permuted = __byte_perm(a, b, selector);
  asm("lop3.b32 %0, %1, %2, %3, 0x28;\n" : "=r"(low) : "r"(permuted << 4), "r"(flip), "r"(keep));  // (a ^ b) & c
  asm("lop3.b32 %0, %1, %2, %3, 0x28;\n" : "=r"(high) : "r"(permuted), "r"(flip), "r"(keep));
}
__device__ __forceinline__ void int4_word_to_s8_x16(uint32_t nibble_bytes, uint32_t flip, uint32_t keep, uint32_t& low,
                                                    uint32_t& high) {
  int4_words_to_s8_x16(nibble_bytes, 0, 0x3120, flip, keep, low, high);
}

struct ActF16 {
  using Elem = __half;
  using Frag = uint4;      // 8 halves
  using GroupAcc = float;  // a scale group's sum
  static constexpr bool kTokenScale = false;
  static constexpr bool kGroupScale = false;
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
  // The first mma of a scale group (the sums were reset by the last flush; the s8 policy folds
  // the reset into the mma instead).
  __device__ static __forceinline__ void mma_first(GroupAcc (&d)[4], const Weights& w, const Frag& x) { mma(d, w, x); }
  __device__ static __forceinline__ GroupAcc group_zero() { return 0.0f; }
  __device__ static __forceinline__ float to_float(GroupAcc v) { return v; }
};

struct ActF16Scaled : ActF16 {
  static constexpr bool kTokenScale = true;
};

// f16 activations on int4-asym weights (zero points, W4A16 only): unsigned codes, and each
// group's scale and minimum folded into the f16 weights before the mma, fma(code, s, m) (one
// hfma2 a register, Marlin-style), so the mma sums finished products straight into the f32
// totals and no group flush (nor a per-group activation sum for the minimum) is needed. The
// weights are rounded to f16 once, as the dequantize + cuBLAS path rounds them (the same bound).
// Kernels ask kActZeroPoints<Act> (compile time) and leave their int4 code as it was.
// (Measured against one more mma a k16 tile with the minimums broadcast along k as its A operand
// and int4's loop and flush otherwise: slower at every batch and group in the preload kernel,
// +2-8 % a step at batch 1-16; bench/results/gpu-decode-int4-asym-ab-llama3-8b-h200-fb62428.log.)
struct ActF16Zp : ActF16 {
  __device__ static __forceinline__ Weights unpack(uint32_t w0, uint32_t w1) {
    Weights w;
    dequant_uint4x8(w0, w.a[0]);
    dequant_uint4x8(w1, w.a[1]);
    return w;
  }
  // scale_word / min_word: the group's f16 pairs (row g low, row g + 8 high, ops/w4a16_pack.h);
  // registers 0 and 2 of a tile hold row g, 1 and 3 row g + 8 (dequant_int4x8's order).
  __device__ static __forceinline__ void fold(Weights& w, uint32_t scale_word, uint32_t min_word) {
    const __half2 s = *reinterpret_cast<const __half2*>(&scale_word), m = *reinterpret_cast<const __half2*>(&min_word);
    const __half2 s_g = __low2half2(s), s_g8 = __high2half2(s), m_g = __low2half2(m), m_g8 = __high2half2(m);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        __half2 v = __hfma2(*reinterpret_cast<const __half2*>(&w.a[j][i]), (i & 1) ? s_g8 : s_g, (i & 1) ? m_g8 : m_g);
        w.a[j][i] = *reinterpret_cast<uint32_t*>(&v);
      }
  }
};
template <class Act>
inline constexpr bool kActZeroPoints = false;
template <>
inline constexpr bool kActZeroPoints<ActF16Zp> = true;

// f16 activations on int4-zp weights (integer zero points, W4A16 only): unsigned codes turned into
// exact f16 u - z with the group's constants (zero_constants, dequant_zero_codes4x8), then int4's
// mma and group flush with the group scale, so the loop costs int4's instructions; the kernels
// read the packed zero points where ActF16Zp's read minimums (kernels::zero_point_mins).
struct ActF16Zc : ActF16 {
  __device__ static __forceinline__ Weights unpack_zero(uint32_t w0, uint32_t w1, const ZeroConstants& zc) {
    Weights w;
    dequant_zero_codes4x8(w0, zc, w.a[0]);
    dequant_zero_codes4x8(w1, zc, w.a[1]);
    return w;
  }
};
template <class Act>
inline constexpr bool kActZeroCodes = false;
template <>
inline constexpr bool kActZeroCodes<ActF16Zc> = true;
// Whether a kernel reads a word a group beside each scale: minimums (ActF16Zp) or zero words (ActF16Zc).
template <class Act>
inline constexpr bool kActGroupWords = kActZeroPoints<Act> || kActZeroCodes<Act>;


struct ActS8 {
  using Elem = int8_t;
  using Frag = uint2;    // 8 int8 values
  using GroupAcc = int;  // exact
  static constexpr bool kTokenScale = true;
  static constexpr bool kGroupScale = false;
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
  // Why the group sums start at a bias instead of 0: converting an s32 sum to f32 (I2F) runs at a
  // quarter of the FP32 rate on sm_90 and was the tiled kernel's limit at large M (one conversion
  // per accumulator per group: 8 pipe cycles a warp, more than the mma it follows). A sum that
  // starts at the bit pattern of 1.5 * 2^23 stays a float of that binade while |sum| < 2^22 (a
  // group sum is at most 128 x 8 x 128 = 2^17), so the float is exactly 1.5 * 2^23 + sum and one
  // full-rate subtraction gives the sum exactly: the same f32 as static_cast<float>(sum).
  static constexpr int kGroupBias = 0x4B400000;       // bits of 12582912.0f = 1.5 * 2^23
  static constexpr float kGroupBiasValue = 12582912.0f;
  __device__ static __forceinline__ GroupAcc group_zero() { return kGroupBias; }
  __device__ static __forceinline__ void mma_first(GroupAcc (&d)[4], const Weights& w, const Frag& x) {
    mma_s8_16832_from(d, w.a, x.x, x.y, kGroupBias);
  }
  __device__ static __forceinline__ float to_float(GroupAcc v) { return __int_as_float(v) - kGroupBiasValue; }
};

struct ActS8Grouped : ActS8 {
  static constexpr bool kTokenScale = false;
  static constexpr bool kGroupScale = true;
};

// W4A8-fp8 (ActE4M3): e4m3 activation codes (the s8 fragment layout: the same bytes as ActS8) on
// mma.m16n8k32 e4m3 -> f32 from sm_89 on. The weight nibbles become exact e4m3 integers -8..7
// through two prmt table lookups (int4_word_to_e4m3), in the bytes ActS8's permute gives. Every
// product of an e4m3 integer and an e4m3 value is exact in f32; the group's sum is f32 (the
// tensor core's accumulation order), scaled by the weight group scale when the group is flushed.
// Before sm_89 (A100: no e4m3 mma) the codes are widened to f16 (exact: an e4m3 value is an f16
// value x 2^8, which the bits of the f16 exponent field absorb) and run on f16 mma like ActF16.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define QSPEC_E4M3_MMA 1
#endif

__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef QSPEC_E4M3_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)d, (void)a, (void)b0, (void)b1;
  __trap();  // never called: ActE4M3 takes the f16 path below sm_89
#endif
}

// PTX prmt in its default mode: byte i of the result is byte (sel_i & 7) of {b, a}, or, when
// bit 3 of sel_i is set, that byte's sign bit replicated (0x00 / 0xff).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// The e4m3 codes of u - 8 for the four offset-binary nibbles u in the low 16 bits of `nibbles`
// (result byte i from nibble i), two 8-entry tables looked up with prmt: u < 8 (bit 3 clear)
// reads e4m3(u - 8) from the first, u >= 8 (bit 3 flipped clear) reads e4m3(u - 8) from the
// second; `high` (0xff where u >= 8) picks per byte. Exact, integer instructions only (14 a
// packed word). In the mma.sync kernels this measured no faster than cvt.e4m3x2.f16x2 after the
// f16 dequantization (perf-notes); the wgmma path's unpack kernel uses it, memory-bound either way.
__device__ __forceinline__ uint32_t nibbles_to_e4m3x4(uint32_t nibbles, uint32_t high) {
  const uint32_t negative = prmt(0xcaccced0u, 0xb8c0c4c8u, nibbles);            // -8 -7 -6 -5 | -4 -3 -2 -1
  const uint32_t positive = prmt(0x44403800u, 0x4e4c4a48u, nibbles ^ 0x8888u);  //  0  1  2  3 |  4  5  6  7
  return (positive & high) | (negative & ~high);
}

// One packed word (8 nibbles: even ones row g, odd ones row g + 8, ops/w4a16_pack.h) -> the two
// e4m3 A registers of one k16 half of the pair, in ActS8's byte order: row g (n0, n4, n2, n6),
// row g + 8 (n1, n5, n3, n7).
__device__ __forceinline__ void int4_word_to_e4m3(uint32_t w, uint32_t& row_g, uint32_t& row_g8) {
  const uint32_t shifted = w << 4;  // nibble i's bit 3 at a byte's sign bit: even nibbles here, odd ones in w
  const uint32_t lo = nibbles_to_e4m3x4(w, prmt(shifted, w, 0xd9c8u));         // n0 n1 n2 n3
  const uint32_t hi = nibbles_to_e4m3x4(w >> 16, prmt(shifted, w, 0xfbeau));   // n4 n5 n6 n7
  row_g = prmt(lo, hi, 0x6240u);
  row_g8 = prmt(lo, hi, 0x7351u);
}

// Two e4m3 bytes (bits 0..7, 8..15 of `bytes` selected by prmt selector `sel`) -> f16x2, exact:
// the byte placed in the high byte of each half, its exponent and mantissa shifted right by one
// into the f16 fields (the sign stays), times 2^8 (e4m3's bias 7 against f16's 15). NaN codes
// never reach a GEMM (a non-finite row has zero codes and a NaN scale).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t bytes, uint32_t sel) {
  const uint32_t placed = __byte_perm(bytes, 0, sel);  // (0, b0, 0, b1)
  const uint32_t bits = ((placed >> 1) & 0x3f803f80u) | (placed & 0x80008000u);
  constexpr uint32_t kTwoTo8 = 0x5c005c00u;  // f16x2 (256, 256)
  const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&bits), *reinterpret_cast<const __half2*>(&kTwoTo8));
  return *reinterpret_cast<const uint32_t*>(&v);
}

struct ActE4M3 {
  using Elem = int8_t;     // e4m3 codes
  using Frag = uint2;      // 8 codes
  using GroupAcc = float;  // a scale group's sum
  static constexpr bool kTokenScale = true;
  static constexpr bool kGroupScale = false;
  struct Weights {
    uint32_t a[2][4];  // e4m3 mma: a[0] (the s8 layout); f16 mma: the two k16 tiles of the pair
  };
  __device__ static __forceinline__ Frag load(const Elem* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
  __device__ static __forceinline__ Frag load_shared(const Elem* p) { return *reinterpret_cast<const uint2*>(p); }
  __device__ static __forceinline__ Weights unpack(uint32_t w0, uint32_t w1) {
    Weights w;
#ifdef QSPEC_E4M3_MMA
    int4_word_to_e4m3(w0, w.a[0][0], w.a[0][1]);  // rows g / g + 8, k 4t..4t+3
    int4_word_to_e4m3(w1, w.a[0][2], w.a[0][3]);  // rows g / g + 8, k 16+4t..16+4t+3
#else
    dequant_int4x8(w0, w.a[0]);
    dequant_int4x8(w1, w.a[1]);
#endif
    return w;
  }
  __device__ static __forceinline__ void mma(GroupAcc (&d)[4], const Weights& w, const Frag& x) {
#ifdef QSPEC_E4M3_MMA
    mma_e4m3_16832(d, w.a[0], x.x, x.y);
#else
    // The 8 codes as ActF16's fragment: halves in k order.
    mma_f16_16816(d, w.a[0], e4m3x2_to_f16x2(x.x, 0x1404), e4m3x2_to_f16x2(x.x, 0x3424));
    mma_f16_16816(d, w.a[1], e4m3x2_to_f16x2(x.y, 0x1404), e4m3x2_to_f16x2(x.y, 0x3424));
#endif
  }
  __device__ static __forceinline__ void mma_first(GroupAcc (&d)[4], const Weights& w, const Frag& x) { mma(d, w, x); }
  __device__ static __forceinline__ GroupAcc group_zero() { return 0.0f; }
  __device__ static __forceinline__ float to_float(GroupAcc v) { return v; }
};

// Split (ADAngel DPR, issue 6): int8 activations partitioned {4, 4}: x = 16 hi + lo with hi the
// signed high nibble and lo the unsigned low one, each promoted to s8 (Hopper has no native s4
// mma), two mma a k pair, reconstructed as 16 P_hi + P_lo when the group is flushed. The integer
// sums are exactly ActS8's (so is the output); the cost is twice the mma work, which is why Split
// is dominated on sm_90 (docs/perf-journal/perf-notes-journal-2026.md measures it).
struct ActS8Split : ActS8 {
  using Frag = uint4;  // hi.x, hi.y, lo.x, lo.y
  struct GroupAcc {
    int hi = 0, lo = 0;
  };
  __device__ static __forceinline__ GroupAcc group_zero() { return GroupAcc{}; }
  __device__ static __forceinline__ void mma_first(GroupAcc (&d)[4], const Weights& w, const Frag& x) { mma(d, w, x); }
  __device__ static __forceinline__ Frag split(uint2 v) {
    // Per byte: hi = sign-extended bits 4..7 ((n ^ 8) - 8 without borrows, as int4_bytes_to_s8),
    // lo = bits 0..3.
    auto high = [](uint32_t q) {
      const uint32_t n = ((q >> 4) & 0x0f0f0f0fu) ^ 0x08080808u;
      return ((n | 0x80808080u) - 0x08080808u) ^ 0x80808080u;
    };
    return make_uint4(high(v.x), high(v.y), v.x & 0x0f0f0f0fu, v.y & 0x0f0f0f0fu);
  }
  __device__ static __forceinline__ Frag load(const Elem* p) { return split(__ldg(reinterpret_cast<const uint2*>(p))); }
  __device__ static __forceinline__ Frag load_shared(const Elem* p) {
    return split(*reinterpret_cast<const uint2*>(p));
  }
  __device__ static __forceinline__ void mma(GroupAcc (&d)[4], const Weights& w, const Frag& x) {
    int hi[4] = {d[0].hi, d[1].hi, d[2].hi, d[3].hi}, lo[4] = {d[0].lo, d[1].lo, d[2].lo, d[3].lo};
    mma_s8_16832(hi, w.a, x.x, x.y);
    mma_s8_16832(lo, w.a, x.z, x.w);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      d[e].hi = hi[e];
      d[e].lo = lo[e];
    }
  }
  __device__ static __forceinline__ float to_float(GroupAcc v) { return static_cast<float>(16 * v.hi + v.lo); }
};

// Where a GEMM's activation rows and scales are (the kernels' parameter structs share these).
struct ActivationRows {
  const void* x;          // f16 values or int8 codes, rows ldx elements apart
  int64_t ldx;
  const float* scales;    // kTokenScale: [m]; kGroupScale: [m][scale_ld]
  int64_t scale_ld;       // kGroupScale: scales a token row
  int group;              // kGroupScale: k values an activation group covers (a multiple of the weight group)
};

template <class Act>
__device__ __forceinline__ const typename Act::Elem* activation_values(const ActivationRows& a) {
  return static_cast<const typename Act::Elem*>(a.x);
}

// Closes scale group `group` (of G k values) of one row set: acc += s_w * s_x * (group sum),
// clears the group sums. s_w: the weight scale pair of rows g / g + 8; s_x (ActS8Grouped only):
// the activation group scale of each token this thread holds (tile tokens from first_token,
// nt * 8 + 2t and + 1, clamped to last_token).
template <class Act, int G, int MT>
__device__ __forceinline__ void flush_group(float (&acc)[MT][4], typename Act::GroupAcc (&gacc)[MT][4],
                                            uint32_t scale_word, const ActivationRows& a, int group,
                                            int first_token, int t, int last_token) {
  const float2 s = unpack_half2(scale_word);
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) {
    float s00 = s.x, s01 = s.x, s10 = s.y, s11 = s.y;
    if constexpr (Act::kGroupScale) {
      const float* column = a.scales + (group * G) / a.group;
      const float x0 = __ldg(column + (first_token + min(nt * 8 + 2 * t, last_token)) * a.scale_ld);
      const float x1 = __ldg(column + (first_token + min(nt * 8 + 2 * t + 1, last_token)) * a.scale_ld);
      s00 = s.x * x0;
      s01 = s.x * x1;
      s10 = s.y * x0;
      s11 = s.y * x1;
    }
    acc[nt][0] = fmaf(s00, Act::to_float(gacc[nt][0]), acc[nt][0]);
    acc[nt][1] = fmaf(s01, Act::to_float(gacc[nt][1]), acc[nt][1]);
    acc[nt][2] = fmaf(s10, Act::to_float(gacc[nt][2]), acc[nt][2]);
    acc[nt][3] = fmaf(s11, Act::to_float(gacc[nt][3]), acc[nt][3]);
#pragma unroll
    for (int e = 0; e < 4; ++e) gacc[nt][e] = Act::group_zero();
  }
}

// Zeroes a kernel's f32 totals and group sums.
template <class Act, int RPW, int MT>
__device__ __forceinline__ void zero_accumulators(float (&acc)[RPW][MT][4], typename Act::GroupAcc (&gacc)[RPW][MT][4]) {
#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int nt = 0; nt < MT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[r][nt][e] = 0.0f;
        gacc[r][nt][e] = Act::group_zero();
      }
}

// The token-scale epilogue: a thread's accumulators (n-tile nt: tokens nt*8 + 2t, + 1, for rows g and
// g + 8) times their tokens' scales: tile tokens from first_token, last_token the tile's last
// valid one (rows past it are clamped, their outputs dropped). No-op without token scales.
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

// A format's name for messages (quant::format_name lives in qspec_core, which links after this
// library).
inline const char* format_label(quant::Format format) {
  switch (format) {
    case quant::Format::int4: return "int4";
    case quant::Format::int4_channel: return "int4-channel";
    case quant::Format::nvfp4: return "nvfp4";
    case quant::Format::mxfp4: return "mxfp4";
    case quant::Format::int8: return "int8";
    case quant::Format::fp8: return "fp8";
    case quant::Format::int4_asym: return "int4-asym";
  }
  return "unknown";
}

// Host side: calls fn(Policy{}) with the policy that reads activations quantized in `format`
// (e4m3: fp8 as e4m3 codes rather than f16 values).
template <class Fn>
void with_activation_policy(quant::Format format, bool e4m3, Fn&& fn) {
  switch (format) {
    case quant::Format::int8: fn(ActS8{}); return;
    case quant::Format::int4: fn(ActS8Grouped{}); return;
    case quant::Format::fp8:
      if (e4m3) fn(ActE4M3{});
      else fn(ActF16Scaled{});
      return;
    case quant::Format::nvfp4:
    case quant::Format::mxfp4: fn(ActF16Scaled{}); return;
    default: break;
  }
  fail("4-bit GEMM: ", format_label(format), " is not an activation format of the quantized GEMMs");
}

}  // namespace qspec::cuda::kernels
