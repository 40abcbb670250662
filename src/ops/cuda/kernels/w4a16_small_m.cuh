// 4-bit-weight GEMM for few tokens: y[m, n] = x[m, k] W[n, k]^T with W int4 (ops/w4a16_pack.h)
// and x f16 (Act = ActF16), emulated fp8 / fp4 in f16 (ActF16Scaled), per-token int8 (ActS8) or
// grouped int4 (ActS8Grouped): kernels/w4_activation.cuh.
// Computed as y^T = W x^T on mma.sync: 16 weight rows are A, 8 tokens are B.
// Each warp streams RPW row blocks of packed weights from global memory straight into
// registers (16-byte loads, DEPTH chunks in flight, no shared memory: each weight is used by
// one warp only), unpacks them into exact f16 (or int8) integers, and accumulates each k
// group in f32 (s32) before scaling it by the group's scale in f32 (so the weights are never
// rounded; int4 activation groups scale there too); rows with a token scale are scaled at the
// end. The warps of a block share a k range, so they read the same x (16-byte loads,
// served by L1). Split-K over blocks when there are few row tiles: partials in f32, and the
// last block of a row tile (atomic counter) sums them in split order and writes y.
// Programmatic dependent launch as in w4a16_stream.cuh: the first weight loads are issued
// before waiting for the previous kernel.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/kernels/w4a16_common.cuh"
#include "ops/cuda/kernels/w4a16_plan.h"

namespace qspec::cuda::kernels {

struct W4A16SmallMParams {
  W4A16Layout w;
  ActivationRows a;
  __half* y;
  int64_t ldy;
  int m;           // tokens, 1 .. 8 * MT
  int splits;
  float* partials;     // [splits][m][n] when splits > 1
  unsigned* counters;  // [row tiles], zero between launches
  // > 0: the block first copies its k range of x (min(m, 8 MT) rows) into dynamic shared memory,
  // rows xs_stride elements apart, so the main loop never waits on a global x load (variant 1/2).
  int xs_stride;
  // Variant 5: its weight copies carry the L2 evict-first hint.
  int evict_first;
};

// A launch's output slice (m tokens into y, rows ldy apart) and its split-K fields (counters and
// partials in `workspace`): the same for every launcher of these params (w4a16_small_m.cu, w4_bitwise.cu).
inline void set_output_slice(W4A16SmallMParams& p, __half* y, int64_t ldy, int64_t m, int64_t splits, void* workspace) {
  p.y = y;
  p.ldy = ldy;
  p.m = static_cast<int>(m);
  p.splits = static_cast<int>(splits);
  p.counters = static_cast<unsigned*>(workspace);
  p.partials = detail::splitk_partials(workspace, splits);
}

template <class Act, int MT, int RPW, int G, int DEPTH, int WARPS>
__global__ __launch_bounds__(WARPS * 32) void w4_small_m_kernel(const W4A16SmallMParams p) {
  using Elem = typename Act::Elem;
  using Frag = typename Act::Frag;
  using GroupAcc = typename Act::GroupAcc;
  constexpr int PPG = G / 32;           // k pairs (32 values) per scale group
  constexpr int SPC = G == 32 ? 2 : 1;  // scale words per chunk
  constexpr int ROWS = WARPS * RPW * 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y;
  const KShare share = k_share(p.w, split, p.splits);
  const int chunk_begin = share.chunk_begin, chunk_end = share.chunk_end, pair_end = share.pair_end;
  const bool do_tail = share.tail;
  const int64_t block_bytes = static_cast<int64_t>(p.w.k) * 8;

  const uint8_t* w_base[RPW];
  const uint32_t* s_base[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int rb = min(tile * WARPS * RPW + warp * RPW + r, p.w.row_blocks - 1);
    w_base[r] = p.w.codes + rb * block_bytes + lane * 16;
    s_base[r] = p.w.scales + static_cast<int64_t>(rb) * p.w.groups * 8 + g;
  }
  const Elem* x = activation_values<Act>(p.a);
  const int64_t ldx = p.a.ldx;
  const Elem* x_row[MT];
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) x_row[nt] = x + static_cast<int64_t>(min(nt * 8 + g, p.m - 1)) * ldx + t * 8;

  float acc[RPW][MT][4];
  GroupAcc gacc[RPW][MT][4];
  zero_accumulators<Act>(acc, gacc);
  // Scale group `group` of row set r into acc, clear the group accumulators.
  auto flush = [&](int r, uint32_t scale_word, int group) {
    flush_group<Act, G>(acc[r], gacc[r], scale_word, p.a, group, 0, t, p.m - 1);
  };
  // One k pair (32 k values) of row set r: words w0, w1.
  auto pair_mma = [&](int r, uint32_t w0, uint32_t w1, const Frag (&xf)[MT]) {
    const typename Act::Weights a = Act::unpack(w0, w1);
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) Act::mma(gacc[r][nt], a, xf[nt]);
  };

  const int chunks = chunk_end - chunk_begin;
  uint4 w_ring[DEPTH][RPW];
  uint32_t s_ring[DEPTH][RPW][SPC];
  auto fetch = [&](int slot, int chunk) {
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      w_ring[slot][r] = load_stream_16(w_base[r] + static_cast<int64_t>(chunk) * 512);
#pragma unroll
      for (int h = 0; h < SPC; ++h) s_ring[slot][r][h] = __ldg(s_base[r] + ((2 * chunk + h) / PPG) * 8);
    }
  };
  grid_launch_dependents();
#pragma unroll
  for (int i = 0; i < DEPTH; ++i)
    if (i < chunks) fetch(i, chunk_begin + i);
  grid_dependency_wait();  // weights are in flight; x and every global write come after this

  extern __shared__ __align__(16) uint8_t x_shared_bytes[];
  Elem* x_shared = reinterpret_cast<Elem*>(x_shared_bytes);
  const bool x_in_smem = p.xs_stride > 0;
  const int k_begin = chunk_begin * 64;
  int xs_row[MT];
  if (x_in_smem) {
    constexpr int kPiece = 16 / sizeof(Elem);  // elements per 16-byte copy
    const int x_rows = min(p.m, MT * 8), pieces_per_row = (pair_end * 32 - k_begin) / kPiece;
    for (int i = threadIdx.x; i < x_rows * pieces_per_row; i += WARPS * 32) {
      const int row = i / pieces_per_row, piece = i % pieces_per_row;
      *reinterpret_cast<uint4*>(x_shared + row * p.xs_stride + piece * kPiece) =
          __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * ldx + k_begin + piece * kPiece));
    }
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) xs_row[nt] = min(nt * 8 + g, x_rows - 1) * p.xs_stride + t * 8 - k_begin;
    __syncthreads();
  }

  for (int c0 = 0; c0 < chunks; c0 += DEPTH) {
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
      const int c = c0 + i;
      if (c < chunks) {
        uint4 w[RPW];
        uint32_t s[RPW][SPC];
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          w[r] = w_ring[i][r];
#pragma unroll
          for (int h = 0; h < SPC; ++h) s[r][h] = s_ring[i][r][h];
        }
        if (c + DEPTH < chunks) fetch(i, chunk_begin + c + DEPTH);
        const int chunk = chunk_begin + c;
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
          const int pair = 2 * chunk + hp;
          Frag xf[MT];
#pragma unroll
          for (int nt = 0; nt < MT; ++nt)
            xf[nt] = x_in_smem ? Act::load_shared(x_shared + xs_row[nt] + pair * 32) : Act::load(x_row[nt] + pair * 32);
#pragma unroll
          for (int r = 0; r < RPW; ++r) pair_mma(r, hp ? w[r].z : w[r].x, hp ? w[r].w : w[r].y, xf);
          if ((pair + 1) % PPG == 0 || pair + 1 == pair_end) {
#pragma unroll
            for (int r = 0; r < RPW; ++r) flush(r, s[r][SPC == 2 ? hp : 0], pair / PPG);
          }
        }
      }
    }
  }
  if (do_tail) {
    const int pair = 2 * p.w.full_chunks;
    Frag xf[MT];
#pragma unroll
    for (int nt = 0; nt < MT; ++nt) xf[nt] = Act::load(x_row[nt] + pair * 32);
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const uint2 w = load_stream_8(w_base[r] - lane * 16 + static_cast<int64_t>(p.w.full_chunks) * 512 + lane * 8);
      pair_mma(r, w.x, w.y, xf);
      flush(r, __ldg(s_base[r] + (pair / PPG) * 8), pair / PPG);
    }
  }

  // Epilogue: thread holds rows (rb*16 + g, + 8) x tokens (nt*8 + 2t, + 1).
  apply_token_scales<Act>(acc, p.a.scales, 0, t, p.m - 1);
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int rb = tile * WARPS * RPW + warp * RPW + r;
    if (rb >= p.w.row_blocks) continue;
    store_fragment<MT>(acc[r], rb, t, g, p.w.n, p.m, p.splits, split, p.y, p.ldy, p.partials);
  }
  if (p.splits == 1) return;

  const int row_begin = tile * ROWS;
  splitk_finish<WARPS * 32>(p.counters, tile, p.splits, p.partials, p.y, p.ldy, p.m, p.w.n, row_begin,
                            min(ROWS, p.w.n - row_begin));
}

}  // namespace qspec::cuda::kernels
