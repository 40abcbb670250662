// W4A16 GEMM for tens of tokens on Hopper's wgmma, with the weights' A fragments from registers:
// tile 5 of the tiled kernel (w4a16_tiled.cuh), the same parameters, split-K and fix-up, and the
// same bits.
//
// Why: at 32-64 tokens the mma.sync tiled kernel runs the Llama-3-8B layer GEMMs in ~3x their
// bytes' time (perf-notes), although neither the bytes nor the f16 mma rate explain it: every
// mma.sync costs issue slots for its operands (a B fragment a token tile and a k16 step from
// shared memory) and its accumulators' dependences. A wgmma reads the tokens (B) straight from
// shared memory, 64 rows x 64 tokens x 16 k a warpgroup an instruction, asynchronously.
//
// The A fragments are the tiled kernel's: each lane unpacks its own 16 bytes of a chunk of the
// packed layout (ops/w4a16_pack.h) with ActF16::unpack into exact f16 integers, which are the
// mma.m16n8k16 A fragments of the two k16 steps of each pair in its permuted k order. A wgmma's
// A register fragment is that same layout for each warp's 16 rows. So the tokens in shared memory
// must be in that permuted k order too: the k16 step s of a 32-k pair holds, at logical k 8h + 2t + e,
// the physical k 8t + 4s + 2h + e. That is, with the pair's 64 bytes of a token as four 16-byte
// pieces t of four 4-byte words j, logical piece j = (word j of pieces 0, 1, 2, 3): a 4 x 4
// transpose of words, done in shared memory after the copy (below).
// Then every wgmma multiplies the same products as the tiled kernel's mma.sync pair, in the same
// k order and the same scale groups (f32 group sums, scaled into f32 totals at each group's end),
// so the output is the tiled kernel's bit for bit (the gpu tests check it).
//
// The block: 2 warpgroups x 64 weight rows (128 rows, 8 row blocks), 64 tokens (n64), stages
// of 2 chunks (128 k, 8 wgmma a warpgroup). Weights: bulk copies (1 KB and the scales a row block
// a stage, each warp its own) into a kWStages ring, an mbarrier a slot, the first ones before
// griddepcontrol.wait.
// Tokens: a kXStages ring of 18-KB slots, filled kXStages - 1 stages ahead by one bulk copy a
// token row (an mbarrier a slot); each stage, every thread moves one (token, pair) in place into
// the two 128-byte-swizzled boxes of 64 tokens x 64 k the wgmma read, transposed. (The first
// version scattered 4-byte cp.async copies straight to the transposed places: 11-18 % slower at
// 32 tokens, 0-7 % at 64.)
// Each warpgroup waits for its own wgmma at the end of each scale group (the group sums are then
// scaled); the other warpgroup's wgmma and unpacking overlap it.
#pragma once
#include "ops/cuda/kernels/w4a16_tiled.cuh"
#include "ops/cuda/kernels/wgmma.cuh"

namespace qspec::cuda::kernels {

struct W4A16WgmmaTile {
  static constexpr int kRows = 128, kTokens = 64, kThreads = 256;
  static constexpr int kChunks = 2;                                // 64-k chunks a stage
  static constexpr int kPairs = 2 * kChunks;                       // 32-k pairs a stage
  static constexpr int kWStages = 5;                               // weight ring slots
  static constexpr int kXStages = 3;                               // token ring slots
  static constexpr int kCodeBytes = kChunks * 512;                 // a row block's packed weights a stage
  static constexpr int kScaleBytes = kPairs * 32;                  // its scales: at most a group a pair (G = 32)
  static constexpr int kRowBlockBytes = kCodeBytes + kScaleBytes;
  static constexpr int kWStageBytes = kRows / 16 * kRowBlockBytes;  // 9 KB
  static constexpr int kBoxBytes = kTokens * 128;                  // 64 tokens x 64 k, 128B-swizzled
  // A token slot holds the stage's rows as copied (kStagedRowBytes apart: 16 bytes of padding
  // spread a quarter warp's reads over all banks), then, in place, the two boxes the wgmma read.
  static constexpr int kStagedRowBytes = kPairs * 64 + 16;
  static constexpr int kXStageBytes = (kTokens * kStagedRowBytes + 1023) / 1024 * 1024;  // 18 KB
  static constexpr int kSmemBytes = kXStages * kXStageBytes + kWStages * kWStageBytes + 1024;
  static_assert(kChunks * kBoxBytes <= kXStageBytes && kThreads == kTokens * kPairs,
                "x: one (token, pair) a thread a stage");
  static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "two blocks a multiprocessor");
};

template <class Act, int G>
__global__ __launch_bounds__(W4A16WgmmaTile::kThreads, 2) void w4a16_wgmma_kernel(const W4A16TiledParams p) {
#if QSPEC_WGMMA
  using T = W4A16WgmmaTile;
  static_assert(sizeof(typename Act::Elem) == 2, "f16 activations");
  constexpr int PPG = G / 32;               // pairs a scale group
  constexpr int GC = G >= 64 ? G / 64 : 1;  // chunks a group (a group of 32 is half a chunk)
  static_assert(T::kPairs % PPG == 0 && T::kChunks % GC == 0, "a stage holds whole scale groups");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const x_ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* const w_ring = x_ring + T::kXStages * T::kXStageBytes;
  __shared__ uint64_t w_full[T::kWStages];
  __shared__ uint64_t x_full[T::kXStages];

  const int tid = threadIdx.x, lane = tid & 31, warp_in_block = tid >> 5;  // warpgroup warp_in_block / 4
  const int g = lane >> 2, t = lane & 3;
  const int m_tile = blockIdx.x, row_tile = blockIdx.y, split = blockIdx.z;
  const int m0 = m_tile * T::kTokens, tile_m = min(T::kTokens, p.m - m0);
  // Splits start and end at scale-group boundaries (as the tiled kernel's), so every stage does.
  const int group_units = p.w.full_chunks / GC;
  const int chunk_begin = static_cast<int>(static_cast<int64_t>(split) * group_units / p.splits) * GC;
  const int chunk_end = static_cast<int>(static_cast<int64_t>(split + 1) * group_units / p.splits) * GC;
  const bool do_tail = p.w.tail && split == p.splits - 1;  // k % 64 == 32: a last stage of one pair
  const int full_stages = (chunk_end - chunk_begin + T::kChunks - 1) / T::kChunks;
  const int stages = full_stages + (do_tail ? 1 : 0);
  // Stage st: its first pair (of the whole k) and how many it has.
  auto stage_pair0 = [&](int st) { return st < full_stages ? 2 * (chunk_begin + st * T::kChunks) : 2 * p.w.full_chunks; };
  auto stage_pairs = [&](int st) {
    return st < full_stages ? 2 * min(T::kChunks, chunk_end - chunk_begin - st * T::kChunks) : 1;
  };

  // Weights and their scales: each warp's lane 0 copies its own row block (past the matrix: the
  // last one again, outputs dropped) and arrives on the slot's barrier (8 arrivals a phase): one
  // thread issuing all 16 copies of a stage held its warpgroup's wgmma back. The scales ride with
  // the codes: a load from global memory at the flush would wait out DRAM's latency every stage.
  const int own_row_block = min(row_tile * (T::kRows / 16) + warp_in_block, p.w.row_blocks - 1);
  const uint8_t* const own_codes = p.w.codes + static_cast<int64_t>(own_row_block) * p.w.k * 8;
  const uint32_t* const own_scales = p.w.scales + static_cast<int64_t>(own_row_block) * p.w.groups * 8;
  auto load_weights = [&](int st) {  // lane 0 of each warp
    const int slot = st % T::kWStages, pairs = stage_pairs(st), pair0 = stage_pair0(st);
    const int groups = pairs / PPG;  // whole groups: stages start and end at group boundaries
    uint8_t* const dst = w_ring + slot * T::kWStageBytes + warp_in_block * T::kRowBlockBytes;
    mbarrier_arrive_expect_tx(&w_full[slot], static_cast<uint32_t>(pairs * 256 + groups * 32));
    bulk_copy_to_shared(dst, own_codes + static_cast<int64_t>(pair0) * 256, pairs * 256, &w_full[slot]);
    bulk_copy_to_shared(dst + T::kCodeBytes, own_scales + (pair0 / PPG) * 8, groups * 32, &w_full[slot]);
  };
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < T::kWStages; ++i) mbarrier_init(&w_full[i], T::kRows / 16);
#pragma unroll
    for (int i = 0; i < T::kXStages; ++i) mbarrier_init(&x_full[i], T::kThreads / 32);
    fence_proxy_async_shared();
  }
  __syncthreads();
  // The weights are no earlier kernel's output: their first copies go out before the wait.
  if (lane == 0)
    for (int st = 0; st < T::kWStages && st < stages; ++st) load_weights(st);
  grid_launch_dependents();

  const uint32_t w_lane = smem_address(w_ring) + warp_in_block * T::kRowBlockBytes;

  // x: lanes 0-7 of each warp copy one token row each of the stage (pairs x 64 bytes, one bulk
  // copy; rows past the tile's tokens are skipped: their columns are never stored); lane 0 arrives
  // with the warp's bytes (8 arrivals a phase).
  const int copy_row = warp_in_block * 8 + lane;  // lanes 0-7
  const char* const copy_src = static_cast<const char*>(p.a.x) + static_cast<int64_t>(m0 + copy_row) * p.a.ldx * 2;
  const int warp_rows = max(0, min(8, tile_m - warp_in_block * 8));
  auto load_x = [&](int st) {  // the whole warp
    const int pairs = stage_pairs(st), slot = st % T::kXStages;
    if (lane == 0)
      mbarrier_arrive_expect_tx(&x_full[slot], static_cast<uint32_t>(warp_rows * pairs * 64));
    __syncwarp();
    if (lane < warp_rows)
      bulk_copy_to_shared(x_ring + slot * T::kXStageBytes + copy_row * T::kStagedRowBytes,
                          copy_src + static_cast<int64_t>(stage_pair0(st)) * 64, pairs * 64, &x_full[slot]);
  };
  // Then each thread moves its (token, pair): four 16-byte pieces in, the 4 x 4 word transpose by
  // naming, four pieces out to box pair / 2, bytes 64 (pair % 2) + 16 j of the token's row. A
  // quarter warp is 8 tokens of one pair: conflict-free both ways.
  const int x_token = tid % T::kTokens, x_pair = tid / T::kTokens;
  const uint32_t x_staged = x_token * T::kStagedRowBytes + x_pair * 64;
  const uint32_t x_box = (x_pair / 2) * T::kBoxBytes;

  float acc[1][8][4];
  float gacc[1][8][4];
  zero_accumulators<Act>(acc, gacc);
  uint32_t a[T::kPairs][2][4];  // the stage's A fragments: live until its wgmma are waited for

  grid_dependency_wait();  // x comes from the previous kernel
  for (int st = 0; st < T::kXStages - 1 && st < stages; ++st) load_x(st);

  for (int st = 0; st < stages; ++st) {
    const uint32_t x_stage = smem_address(x_ring) + (st % T::kXStages) * T::kXStageBytes;
    mbarrier_wait(&x_full[st % T::kXStages], (st / T::kXStages) & 1);
    const int pairs = stage_pairs(st), pair0 = stage_pair0(st), w_slot = st % T::kWStages;
    uint4 piece[4];
    const bool moves = x_pair < pairs;
    if (moves)
#pragma unroll
      for (int j = 0; j < 4; ++j) piece[j] = load_shared_16(x_stage + x_staged + 16 * j);
    __syncthreads();  // every staged row is read (and every warpgroup is done with stage st - 1)
    if (moves) {
      const uint4 logical[4] = {
          make_uint4(piece[0].x, piece[1].x, piece[2].x, piece[3].x),
          make_uint4(piece[0].y, piece[1].y, piece[2].y, piece[3].y),
          make_uint4(piece[0].z, piece[1].z, piece[2].z, piece[3].z),
          make_uint4(piece[0].w, piece[1].w, piece[2].w, piece[3].w),
      };
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t address = x_stage + x_box + swizzled_offset(x_token, ((x_pair % 2) * 4 + j) * 16);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(logical[j].x),
                     "r"(logical[j].y), "r"(logical[j].z), "r"(logical[j].w)
                     : "memory");
      }
    }
    fence_proxy_async_shared();  // the stores (generic proxy) are read next by wgmma (the async proxy)
    __syncthreads();  // the boxes of stage st are complete
    if (st + T::kXStages - 1 < stages) load_x(st + T::kXStages - 1);  // into stage st - 1's slot
    if (lane == 0 && st >= 1 && st - 1 + T::kWStages < stages) load_weights(st - 1 + T::kWStages);
    mbarrier_wait(&w_full[w_slot], (st / T::kWStages) & 1);
    const uint32_t w_stage = w_lane + w_slot * T::kWStageBytes;
    const bool tail_stage = st >= full_stages;
#pragma unroll
    for (int group = 0; group < T::kPairs / PPG; ++group) {
      if (group * PPG >= pairs) break;  // uniform: a short last stage
#pragma unroll
      for (int q = group * PPG; q < (group + 1) * PPG; ++q) {
        // Pair q's two words of this lane: chunk q / 2, half q % 2 of its 16 bytes (the tail's
        // half chunk: 8 bytes a lane).
        const uint32_t address = tail_stage ? w_stage + lane * 8 : w_stage + (q / 2) * 512 + lane * 16 + (q % 2) * 8;
        uint32_t w0, w1;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w0), "=r"(w1) : "r"(address));
        const typename Act::Weights unpacked = Act::unpack(w0, w1);
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int r = 0; r < 4; ++r) a[q][s][r] = unpacked.a[s][r];
      }
      wgmma_fence();
      wgmma_fence_operands(gacc[0]);
#pragma unroll
      for (int q = group * PPG; q < (group + 1) * PPG; ++q)
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          // Pair q of the stage: box q / 2, bytes 64 (q % 2) + 32 s of each token row.
          const uint64_t b_desc = wgmma_descriptor_128b(x_stage + (q / 2) * T::kBoxBytes + (q % 2) * 64 + s * 32);
          wgmma_f16_m64n64k16_rs(gacc[0], a[q][s], b_desc);
        }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(gacc[0]);
#pragma unroll
      for (int q = group * PPG; q < (group + 1) * PPG; ++q)
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[q][s][r])::"memory");
      uint32_t scale_word;  // rows g / g + 8 of the group
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(scale_word) : "r"(w_stage + T::kCodeBytes + group * 32 + g * 4));
      flush_group<Act, G>(acc[0], gacc[0], scale_word, p.a, pair0 / PPG + group, m0, t, tile_m - 1);
    }
  }

  tiled_epilogue<Act, T::kThreads, T::kRows>(acc, p, row_tile * (T::kRows / 16) + warp_in_block, m_tile,
                                              row_tile, split, t, g);
#else
  (void)p;
  __trap();
#endif
}

}  // namespace qspec::cuda::kernels
