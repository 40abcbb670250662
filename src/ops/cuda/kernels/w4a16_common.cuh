// Pieces shared by the W4A16 kernels: the packed layout (ops/w4a16_pack.h) and the lop3 /
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

// int4-asym: the group minimums, [row_blocks][groups][8] f16 pairs laid out as the scales and
// stored right after them in one buffer (W4A16Weights::mins, checked by w4a16_layout). The layout
// has no field for them, so the int4 kernels' parameters (and code) stay as they were; only
// kernels instantiated with zero points call this.
__device__ __forceinline__ const uint32_t* zero_point_mins(const W4A16Layout& w) {
  return w.scales + static_cast<int64_t>(w.row_blocks) * w.groups * 8;
}

// One packed word (8 nibbles) -> four f16x2 registers of integer values: a[0] = (n0, n4),
// a[1] = (n1, n5), a[2] = (n2, n6), a[3] = (n3, n7). Exact. kUnsigned: the codes 0..15 of
// int4-asym (ops/w4a16_pack.h, for fma(code, scale, minimum)), else int4's offset-binary -8..7.
// (1024 + u) - 1032 or - 1024; (1024 + 16 u) / 16 - 72 or - 64.
template <bool kUnsigned>
__device__ __forceinline__ void dequant_nibbles4x8(uint32_t q, uint32_t (&a)[4]) {
  constexpr uint32_t kLow = 0x000f000f, kHigh = 0x00f000f0, kExponent = 0x64006400;
  constexpr uint32_t kSub = kUnsigned ? 0x64006400 : 0x64086408;  // f16x2 (1024, 1024) or (1032, 1032)
  constexpr uint32_t kMul = 0x2c002c00;                            // f16x2 (1/16, 1/16)
  constexpr uint32_t kAdd = kUnsigned ? 0xd400d400 : 0xd480d480;  // f16x2 (-64, -64) or (-72, -72)
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
__device__ __forceinline__ void dequant_int4x8(uint32_t q, uint32_t (&a)[4]) { dequant_nibbles4x8<false>(q, a); }
__device__ __forceinline__ void dequant_uint4x8(uint32_t q, uint32_t (&a)[4]) { dequant_nibbles4x8<true>(q, a); }

// int4-zp (ops/w4a16_pack.h): a row block's packed zero points, 8 bytes a group, groups padded to
// an even count, right after the scales (kernels::zero_point_mins).
__device__ __forceinline__ const uint8_t* zero_point_bytes(const W4A16Layout& w, int rb) {
  return reinterpret_cast<const uint8_t*>(zero_point_mins(w)) + static_cast<int64_t>(rb) * 8 * (w.groups + (w.groups & 1));
}
// The dequantization's constants of lane 4g + t for one group: sub = f16x2 1024 + z[g], add = f16x2
// -(64 + z[g + 8]), where int4's are 1032 and -72.
struct ZeroConstants {
  uint32_t sub, add;
};
// The __byte_perm selector that puts byte g % 4 of a word into bytes 0 and 2 (zeros in 1 and 3).
__device__ __forceinline__ uint32_t zero_byte_selector(int g) {
  const uint32_t b = static_cast<uint32_t>(g) & 3u;
  return b | 0x40u | (b << 8) | 0x4000u;
}
// From the 4 zero-point bytes of the group that hold byte g (its word g / 4): a byte permute and
// two lop3, (byte & 0xf) | 0x6400 and (byte & 0xf0) | 0xd400 in each half.
__device__ __forceinline__ ZeroConstants zero_constants(uint32_t four_bytes, uint32_t selector) {
  const uint32_t both = __byte_perm(four_bytes, 0, selector);
  return {lop3_and_or(both, 0x000f000fu, 0x64006400u), lop3_and_or(both, 0x00f000f0u, 0xd400d400u)};
}
// The word of group `group` (row block bytes `rb_bytes`) that holds lane g's byte, from global memory.
__device__ __forceinline__ uint32_t zero_point_word(const uint8_t* rb_bytes, int group, int g) {
  return __ldg(reinterpret_cast<const uint32_t*>(rb_bytes + group * 8) + (g >> 2));
}

// int4-zp: one packed word -> four f16x2 registers of u - z, exact, with each row's zero point in
// the group's constants (zero_constants): dequant_int4x8's instructions with them where it has
// 1032 and -72 (a word's low nibbles are row g's, its high ones row g + 8's).
__device__ __forceinline__ void dequant_zero_codes4x8(uint32_t q, const ZeroConstants& zc, uint32_t (&a)[4]) {
  constexpr uint32_t kLow = 0x000f000f, kHigh = 0x00f000f0, kExponent = 0x64006400;
  constexpr uint32_t kMul = 0x2c002c00;  // f16x2 (1/16, 1/16)
  const __half2 sub = *reinterpret_cast<const __half2*>(&zc.sub);
  const __half2 add = *reinterpret_cast<const __half2*>(&zc.add);
  const __half2 mul = *reinterpret_cast<const __half2*>(&kMul);
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    uint32_t lo = lop3_and_or(q, kLow, kExponent);   // 1024 + u (row g)
    uint32_t hi = lop3_and_or(q, kHigh, kExponent);  // 1024 + 16 u (row g + 8)
    __half2 l = __hsub2(*reinterpret_cast<__half2*>(&lo), sub);
    __half2 h = __hfma2(*reinterpret_cast<__half2*>(&hi), mul, add);
    a[2 * step] = *reinterpret_cast<uint32_t*>(&l);
    a[2 * step + 1] = *reinterpret_cast<uint32_t*>(&h);
    q >>= 8;
  }
}

// The codes of one packed word as f16 values (kernels templated on kHasMin: int4-asym's unsigned
// codes, else int4's signed ones); the weight is then code * s (int4) or fma(code, s, m).
template <bool kHasMin>
__device__ __forceinline__ void dequant_codes4x8(uint32_t q, uint32_t (&a)[4]) {
  dequant_nibbles4x8<kHasMin>(q, a);
}

// The split-K tail every 4-bit kernel shares, called by all threads of a block once it has
// written its partials: the last block of output tile `counter` to arrive (atomic counter) sums
// every split's partials in split order into y (splitk_fixup) and resets the counter for the
// next launch; the other blocks return.
template <int THREADS>
__device__ __forceinline__ void splitk_finish(unsigned* counters, int counter, int splits, const float* partials,
                                              __half* y, int64_t ldy, int m, int n, int row_begin, int tile_rows);

// Split-K fix-up by the last block of a row tile: y[token, row] = f16(sum over splits, in
// split order) of partials[(split * m + token) * n + row] for rows row_begin .. + tile_rows.
// Latency-bound (every partial is an L2 read), so each thread keeps 2 items x 4 splits of
// loads in flight, 4 rows a load (float4) when n and the tile are multiples of 4.
template <int THREADS>
__device__ __forceinline__ void splitk_fixup(const float* __restrict__ partials, __half* __restrict__ y, int64_t ldy,
                                             int m, int n, int splits, int row_begin, int tile_rows) {
  const int64_t split_stride = static_cast<int64_t>(m) * n;
  if ((n & 3) == 0 && (row_begin & 3) == 0 && (tile_rows & 3) == 0) {
    const int quads = tile_rows / 4, items = m * quads;
    for (int base = threadIdx.x; base < items; base += 2 * THREADS) {
      const float4* src[2];
      bool ok[2];
      float4 sum[2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int item = min(base + b * THREADS, items - 1);
        ok[b] = base + b * THREADS < items;
        const int token = item / quads, row = row_begin + 4 * (item % quads);
        src[b] = reinterpret_cast<const float4*>(partials + static_cast<int64_t>(token) * n + row);
        sum[b] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
      const int64_t stride4 = split_stride / 4;
      int s = 0;
      for (; s + 4 <= splits; s += 4) {
        float4 v[2][4];
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int j = 0; j < 4; ++j) v[b][j] = __ldcg(src[b] + (s + j) * stride4);
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            sum[b].x += v[b][j].x;
            sum[b].y += v[b][j].y;
            sum[b].z += v[b][j].z;
            sum[b].w += v[b][j].w;
          }
      }
      for (; s < splits; ++s)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const float4 v = __ldcg(src[b] + s * stride4);
          sum[b].x += v.x;
          sum[b].y += v.y;
          sum[b].z += v.z;
          sum[b].w += v.w;
        }
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if (!ok[b]) continue;
        const int item = base + b * THREADS, token = item / quads, row = row_begin + 4 * (item % quads);
        __half* out = y + static_cast<int64_t>(token) * ldy + row;
        out[0] = __float2half_rn(sum[b].x);
        out[1] = __float2half_rn(sum[b].y);
        out[2] = __float2half_rn(sum[b].z);
        out[3] = __float2half_rn(sum[b].w);
      }
    }
    return;
  }
  const int items = m * tile_rows;
  for (int base = threadIdx.x; base < items; base += 2 * THREADS) {
    const float* src[2];
    bool ok[2];
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int item = min(base + b * THREADS, items - 1);
      ok[b] = base + b * THREADS < items;
      src[b] = partials + static_cast<int64_t>(item / tile_rows) * n + row_begin + item % tile_rows;
    }
    int s = 0;
    for (; s + 4 <= splits; s += 4) {
      float v[2][4];
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j) v[b][j] = __ldcg(src[b] + (s + j) * split_stride);
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j) sum[b] += v[b][j];
    }
    for (; s < splits; ++s)
#pragma unroll
      for (int b = 0; b < 2; ++b) sum[b] += __ldcg(src[b] + s * split_stride);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      if (!ok[b]) continue;
      const int item = base + b * THREADS;
      y[static_cast<int64_t>(item / tile_rows) * ldy + row_begin + item % tile_rows] = __float2half_rn(sum[b]);
    }
  }
}

template <int THREADS>
__device__ __forceinline__ void splitk_finish(unsigned* counters, int counter, int splits, const float* partials,
                                              __half* y, int64_t ldy, int m, int n, int row_begin, int tile_rows) {
  // The last block to arrive (common.h) sees every block's partials.
  if (!last_to_arrive(&counters[counter], static_cast<unsigned>(splits))) return;
  splitk_fixup<THREADS>(partials, y, ldy, m, n, splits, row_begin, tile_rows);
}

// A cp.async pipeline's start: the weights of its first STAGES - 1 stages (they do not depend on
// the previous kernel), one commit group each, then the wait for the previous kernel (whose
// outputs are this one's activations).
template <int STAGES, class LoadW>
__device__ __forceinline__ void prefetch_weights_then_wait(int stages, LoadW&& load_w) {
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < stages) load_w(st, st);
    cp_async_commit();
  }
  grid_dependency_wait();
}

// Part `part` of `parts` of a row block's k (split-K, or a block's k slices): its 64-value
// chunks chunk_begin .. chunk_end (an even share of the full chunks) and, for the last part when
// k % 64 == 32, the tail pair; pair_end is one past its last 32-value pair.
struct KShare {
  int chunk_begin, chunk_end;
  bool tail;
  int pair_end;
};
__device__ __forceinline__ KShare k_share(const W4A16Layout& w, int part, int parts) {
  KShare share;
  share.chunk_begin = static_cast<int>(static_cast<int64_t>(part) * w.full_chunks / parts);
  share.chunk_end = static_cast<int>(static_cast<int64_t>(part + 1) * w.full_chunks / parts);
  share.tail = w.tail && part == parts - 1;
  share.pair_end = 2 * share.chunk_end + (share.tail ? 1 : 0);
  return share;
}

// The mma.sync m16n8 accumulator fragment of one 16-row block over MT 8-token tiles: lane
// 4 g + t holds rows rb * 16 + g (and + 8) for tokens nt * 8 + 2t (and + 1), element e of tile nt
// at row + (e >= 2 ? 8 : 0), token + (e & 1). Calls f(nt, e, row, token) for each, unrolled; the
// bounds are the caller's. Every 4-bit kernel's epilogue walks its accumulators this way.
template <int MT, class F>
__device__ __forceinline__ void for_each_fragment_element(int rb, int t, int g, F&& f) {
#pragma unroll
  for (int nt = 0; nt < MT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(nt, e, rb * 16 + g + (e >= 2 ? 8 : 0), nt * 8 + 2 * t + (e & 1));
}

// A row block's fragment, rows < n and tokens < m: into y as f16 when the GEMM runs one split,
// else into this split's f32 partials [split][m][n] for splitk_finish.
template <int MT>
__device__ __forceinline__ void store_fragment(const float (&acc)[MT][4], int rb, int t, int g, int n, int m,
                                               int splits, int split, __half* y, int64_t ldy, float* partials) {
  for_each_fragment_element<MT>(rb, t, g, [&](int nt, int e, int row, int token) {
    if (row >= n || token >= m) return;
    if (splits == 1)
      y[static_cast<int64_t>(token) * ldy + row] = __float2half_rn(acc[nt][e]);
    else
      partials[(static_cast<int64_t>(split) * m + token) * n + row] = acc[nt][e];
  });
}

}  // namespace qspec::cuda::kernels
