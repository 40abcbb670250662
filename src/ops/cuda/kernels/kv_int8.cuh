// Device pieces of the 8-bit KV cache (attention.h Kv8Planes, ops/kv_int8.h's numbers): quantizing
// a row's 8-element chunks into the two nibble planes, and turning plane words back into f16
// operands for the attention's tensor-core and f32 paths.
#pragma once
#include "ops/cuda/attention.h"
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/reduce.cuh"  // block_abs_max8
#include "ops/kv_int8.h"

namespace qspec::cuda::kernels {

// 4-byte global -> shared copy (cp.async.ca: .cg takes 16 bytes only); src_bytes 0 zero-fills.
// The attention copies a row's scale this way: the 4-byte word of its (even, odd) pair of slots.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// A chunk of 8 consecutive elements of a row in the planes: one 4-byte word of each.
struct Kv8Chunk {
  uint32_t high, low;
};

// The codes of 8 elements under `scale` (kv8::row_scale_f32 of the row's amax), kv8::encode's,
// split into their nibbles in the planes' order (attention.h kv8_nibble_index): element e in
// nibble (e / 2) + 4 (e % 2) of each word.
__device__ __forceinline__ Kv8Chunk kv8_quantize_chunk(const float (&x)[8], float scale) {
  Kv8Chunk chunk{0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint32_t code = static_cast<uint8_t>(kv8::encode(x[e], scale));
    const int shift = 4 * ((e >> 1) + 4 * (e & 1));
    chunk.high |= (code >> 4) << shift;
    chunk.low |= (code & 15u) << shift;
  }
  return chunk;
}

// Stores a lane's chunk `li` of row `row` (attention.h kv8_row) of a pool, head_dim D, and from
// lane li == 0 the row's scale (as f16: the value row_scale_f32 gave is one).
template <int D>
__device__ __forceinline__ void kv8_store_chunk(const Kv8Planes& pool, int64_t row, int li, const Kv8Chunk& chunk,
                                                float scale) {
  reinterpret_cast<uint32_t*>(pool.high + row * (D / 2))[li] = chunk.high;
  reinterpret_cast<uint32_t*>(pool.low + row * (D / 2))[li] = chunk.low;
  if (li == 0) reinterpret_cast<__half*>(pool.scales)[row] = __float2half_rn(scale);
}

// Quantizes a row held as 8-element f16 chunks, one a lane, by groups of D / 8 lanes (the whole
// warp calls it: a group that holds no row passes zeros), and where `store`, stores the lane's
// chunk. Returns the chunk and the scale (the decode attention keeps them for its tile).
template <int D>
__device__ __forceinline__ Kv8Chunk kv8_quantize_store(const uint4& values, bool store, const Kv8Planes& pool,
                                                       int64_t row, int li, float& scale) {
  float x[8];
  half8_to_float(values, x);
  scale = kv8::row_scale_f32(block_abs_max8<D / 8>(x));
  const Kv8Chunk chunk = kv8_quantize_chunk(x, scale);
  if (store) kv8_store_chunk<D>(pool, row, li, chunk, scale);
  return chunk;
}

// 8 elements as f16 for an mma or an f32 dot product, unscaled: the codes (full view) or the
// middles of their high-nibble bins, 16 hi + 8 (high_only), all integers of at most 128 in
// magnitude, so exact in f16. Per f16x2 pair: h = 1024 + (hi + 8) from the high nibble by one
// LOP3 (mask, flip the sign bit into offset binary, or in f16's 1024 exponent), t = 16 h - 17536
// = 16 hi - 1024 by one HFMA2 (exact: an integer of magnitude <= 1152), then t + (1024 + lo) = the
// code, or t + 1032 = 16 hi + 8, by one HADD2 (exact). No plane word of `low` is read for high_only.
__device__ __forceinline__ uint4 kv8_chunk_to_half(const Kv8Chunk& chunk, bool high_only) {
  const __half2 sixteen = __half2half2(__ushort_as_half(0x4c00));    // 16
  const __half2 offset = __half2half2(__ushort_as_half(0xf448));     // -17536
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t h_bits = ((chunk.high >> (4 * i)) & 0x000f000fu) ^ 0x64086408u;
    const uint32_t l_bits = high_only ? 0x64086408u : (((chunk.low >> (4 * i)) & 0x000f000fu) | 0x64006400u);
    const __half2 t = __hfma2(*reinterpret_cast<const __half2*>(&h_bits), sixteen, offset);
    const __half2 v = __hadd2(t, *reinterpret_cast<const __half2*>(&l_bits));
    out[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// kv8_chunk_to_half's values times the row's f16 scale, rounded to f16 once (the V operand:
// value * scale, as the f16 cache would hold it; see paged_attention_decode_tiles.cuh on why V is
// scaled here and K's scale goes into the scores).
__device__ __forceinline__ uint4 kv8_scale_half8(const uint4& values, __half scale) {
  const __half2 s = __half2half2(scale);
  uint4 out = values;
  uint32_t* words = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&words[i]), s);
    words[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return out;
}

// The f16 scale of a slot from the 4-byte word of its (even, odd) slot pair that cp_async_4 copied.
__device__ __forceinline__ __half kv8_scale_of(uint32_t pair, int slot) {
  return __ushort_as_half(static_cast<unsigned short>(slot & 1 ? pair >> 16 : pair & 0xffffu));
}

// ---- plane words straight into mma fragments (the decode attention's tensor-core path) ------
// An f16x2 fragment register is two 4-bit fields of a high-plane word and the same two fields of
// a low-plane word, each field in bits 0-3 and 16-19 (NIBBLE 0) or 4-7 and 20-23 (NIBBLE 1) of
// the words as given (the caller shifts or permutes them there). Per register: one LOP3 a plane
// and two f16 operations, all exact (kv8_chunk_to_half's argument):
//   NIBBLE 0: H = 1024 + (hi + 8), L = 1024 + lo: code = (16 H - 17536) + L;
//   NIBBLE 1: H = 1024 + 16 (hi + 8), L = 1024 + 16 lo: code = L / 16 + (H - 1216);
// high_only (the draft's view): the middle of the high nibble's bin, 16 hi + 8, with no low word.
template <int NIBBLE, bool HIGH_ONLY>
__device__ __forceinline__ uint32_t kv8_fragment(uint32_t high, uint32_t low) {
  static_assert(NIBBLE == 0 || NIBBLE == 1, "a field in the low or high half of its byte");
  __half2 code;
  if constexpr (NIBBLE == 0) {
    const uint32_t h_bits = lop3_and_xor(high, 0x000f000fu, 0x64086408u);
    const uint32_t l_bits = HIGH_ONLY ? 0x64086408u : lop3_and_or(low, 0x000f000fu, 0x64006400u);
    const __half2 t = __hfma2(*reinterpret_cast<const __half2*>(&h_bits), __half2half2(__ushort_as_half(0x4c00)),
                              __half2half2(__ushort_as_half(0xf448)));  // 16 H - 17536
    code = __hadd2(t, *reinterpret_cast<const __half2*>(&l_bits));
  } else {
    const uint32_t h_bits = lop3_and_xor(high, 0x00f000f0u, 0x64806480u);
    const __half2 h = *reinterpret_cast<const __half2*>(&h_bits);
    if constexpr (HIGH_ONLY) {
      code = __hadd2(h, __half2half2(__ushort_as_half(0xe478)));  // H - 1144 = 16 hi + 8
    } else {
      const uint32_t l_bits = lop3_and_or(low, 0x00f000f0u, 0x64006400u);
      code = __hfma2(*reinterpret_cast<const __half2*>(&l_bits), __half2half2(__ushort_as_half(0x2c00)),
                     __hadd2(h, __half2half2(__ushort_as_half(0xe4c0))));  // L / 16 + (H - 1216)
    }
  }
  return *reinterpret_cast<const uint32_t*>(&code);
}

// The decode's int8 stage under MMA holds a tile's rows plane by plane (K high, K low, V high,
// V low; TILE rows of head_dim / 2 bytes each), as the cache holds a block's 16 rows of one plane:
// so a block's rows arrive in one bulk copy a plane (paged_attention_decode_tiles.cuh). Byte
// offset of key `key`'s row of `plane`:
template <int D, int TILE>
__device__ __forceinline__ int kv8_stage_row(int plane, int key) {
  return (plane * TILE + key) * (D / 2);
}

// The scores' operands. Lane in_group i of a score warp holds head_dim / 32 words of each K plane
// of its two keys (rows g and g + 8 of the 16-key row tile): 16-byte pieces i, i + 4, ... of the
// plane (at 64, bytes 8i .. 8i + 7). k step s takes the lane's word s / 2: pairs 0 and 1 (s even)
// or 2 and 3 (s odd) of it, one register each (a0 / a1, a2 / a3 of the mma's A), so the k order
// is permuted; the query's B fragments follow it (kv8_score_word).
template <int D>
__device__ __forceinline__ int kv8_score_word(int in_group, int u) {  // plane word of lane word u
  if constexpr (D == 64) return in_group * 2 + u;
  else return ((u / 4) * 4 + in_group) * 4 + u % 4;
}
// Loads the lane words 4q .. 4q + 3 (at 64: all two) of `plane` of key `key` from a stage.
template <int D, int TILE>
__device__ __forceinline__ void kv8_load_score_words(const uint8_t* stage, int key, int plane, int in_group, int q,
                                                     uint32_t (&words)[4]) {
  const uint8_t* row = stage + kv8_stage_row<D, TILE>(plane, key);
  if constexpr (D == 64) {
    const uint2 v = *reinterpret_cast<const uint2*>(row + in_group * 8);
    words[0] = v.x;
    words[1] = v.y;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(row + (q * 4 + in_group) * 16);
    words[0] = v.x;
    words[1] = v.y;
    words[2] = v.z;
    words[3] = v.w;
  }
}

// The values' operands (V^T, dims x keys). Lane g of a warp takes head_dim / 64 bytes of each V
// plane row, bytes warp * (D / 8) + g * (D / 64) + b: its mt tile b's row g from the byte's low
// field and row g + 8 from its high field, the fields of two keys packed into one register by a
// byte permute. kv8_value_dim says which dimension that is (the P V output's rows).
template <int D>
__device__ __forceinline__ int kv8_value_byte(int warp, int group_id, int b) {
  return warp * (D / 8) + group_id * (D / 64) + b;
}
template <int D>
__device__ __forceinline__ int kv8_value_dim(int warp, int group_id, int b, int high_field) {
  const int byte = kv8_value_byte<D>(warp, group_id, b);
  const int nibble = 2 * (byte % 4) + high_field;  // element e sits in nibble e / 2 + 4 (e % 2)
  return (byte / 4) * 8 + (nibble < 4 ? 2 * nibble : 2 * (nibble - 4) + 1);
}
// Two keys' words of one plane permuted so that byte `byte` (0..3) of each lands where
// kv8_fragment reads: key a's in bits 0-7, key b's in bits 16-23.
__device__ __forceinline__ uint32_t kv8_pair_bytes(uint32_t a, uint32_t b, int byte) {
  return __byte_perm(a, b, static_cast<unsigned>(byte | (byte + 4) << 8));
}

}  // namespace qspec::cuda::kernels

namespace qspec::cuda::detail {
// paged_kv_write into an int8 cache (paged_kv_write.cu; rope_kv_write's int8 path calls it too).
void paged_kv_write_int8(const f16_bits* k, const f16_bits* v, int64_t row_stride, const QueryBatch& batch,
                         const PagedKv& kv, int64_t num_kv_heads, int64_t head_dim, cudaStream_t stream);
}  // namespace qspec::cuda::detail
