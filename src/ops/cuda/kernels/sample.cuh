// Sampling the next token from f16 logit rows on the device (cuda::sample_logits_f16, ops.h).
// The CPU twin is Sampler::sample_with_draw (ops/sample.h): the same repetition penalty,
// temperature, top_k / top_p / min_p filters over the candidate order (score descending, lower
// id first on ties), and the same inverse-CDF draw over the kept tokens in id order.
//
// One block a row, and no sort: every filter is a threshold on the score's order key, found by
// a search that splits its key interval 16 ways a pass (15 pivot sums per thread, one block
// reduction), plus a scan in id order for the ties at the threshold and for the draw. Masses are
// fixed point (2^-44 of the top token's weight) in 64-bit integers, so every sum is exact and
// independent of thread order: a seeded request draws the same tokens on every run.
#pragma once
#include <cfloat>
#include <climits>
#include <cstdint>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/argmax.cuh"  // argmax_merge: the (value, id) order of the greedy argmax

namespace qspec::cuda::kernels {

constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kSamplePivots = 15;  // a search pass splits its key interval 16 ways
// Weights w = exp(d), d = score / T - top score / T <= 0, in units of 2^-44. Below d = -20
// (w < 2.1e-9, under 36k units) expf is accurate to well under a unit, so the double exp (the
// CPU's) is kept for the head of the distribution, where the filters' boundaries lie.
constexpr double kSampleMassScale = 0x1.0p44;
constexpr double kSampleDoubleExpFloor = -20.0;

using u64 = unsigned long long;

struct SampleShared {
  u64 sums[kSampleWarps][kSamplePivots];
  u64 totals[kSamplePivots];
  u64 warp_prefix[kSampleWarps];
  float max_value[kSampleWarps];
  int max_id[kSampleWarps];
  uint32_t min_key[kSampleWarps];
  int found_id;
};

// Order-preserving map of a float onto u32 (larger float, larger key); -0 is +0, as `==` has it.
__device__ __forceinline__ uint32_t sample_order_key(float v) {
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// One row as the filters see it.
struct SampleRow {
  const __half* logits;
  int vocab;
  bool vec8;                  // 16-byte loads: vocab % 8 == 0 and the row 16-byte aligned
  const uint32_t* penalised;  // bitmap of the penalised ids (shared memory), or nullptr
  float penalty;
  float temperature;
  double top;  // the top score over the temperature, as the CPU rounds it: double(float(max / T))
  int shift;   // keys are compared >> shift: 13 for unpenalised f16 logits (their low 13 bits are constant)

  __device__ __forceinline__ float score(int i, float logit) const {
    if (penalised != nullptr && ((penalised[i >> 5] >> (i & 31)) & 1u) != 0)
      return logit > 0 ? logit / penalty : logit * penalty;
    return logit;
  }
  __device__ __forceinline__ uint32_t key(float s) const { return sample_order_key(s) >> shift; }
  __device__ __forceinline__ double log_weight(float s) const { return static_cast<double>(s / temperature) - top; }
  __device__ __forceinline__ u64 mass(float s) const {
    const double d = log_weight(s);
    const double w = d >= kSampleDoubleExpFloor ? exp(d) : static_cast<double>(expf(static_cast<float>(d)));
    return __double2ull_rn(w * kSampleMassScale);
  }

  // fn(id, score) for every id of the row, each thread a strided share (coalesced loads).
  template <class Fn>
  __device__ __forceinline__ void visit(const Fn& fn) const {
    if (vec8) {
      const uint4* vectors = reinterpret_cast<const uint4*>(logits);
      const int count = vocab / 8;
#pragma unroll 2
      for (int c = threadIdx.x; c < count; c += blockDim.x) {
        const uint4 raw = vectors[c];
        const __half* h = reinterpret_cast<const __half*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) fn(c * 8 + e, score(c * 8 + e, __half2float(h[e])));
      }
    } else {
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) fn(i, score(i, __half2float(logits[i])));
    }
  }
  // fn(id, score) for ids [begin, end) in order (one thread's contiguous chunk; begin % 8 == 0).
  template <class Fn>
  __device__ __forceinline__ void visit_range(int begin, int end, const Fn& fn) const {
    if (vec8) {
      for (int c = begin; c < end; c += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(logits + c);
        const __half* h = reinterpret_cast<const __half*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (c + e < end) fn(c + e, score(c + e, __half2float(h[e])));
      }
    } else {
      for (int i = begin; i < end; ++i) fn(i, score(i, __half2float(logits[i])));
    }
  }
};

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sums each of N per-thread values over the block into sh.totals[0 .. N).
template <int N>
__device__ __forceinline__ void block_sum_u64(const u64 (&values)[N], SampleShared& sh) {
  static_assert(N <= kSamplePivots, "SampleShared holds kSamplePivots sums");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const u64 v = warp_sum_u64(values[j]);
    if (lane == 0) sh.sums[warp][j] = v;
  }
  __syncthreads();
  if (threadIdx.x < N) {
    u64 total = 0;
    for (int w = 0; w < kSampleWarps; ++w) total += sh.sums[w][threadIdx.x];
    sh.totals[threadIdx.x] = total;
  }
  __syncthreads();
}

// The largest key t in [lo, hi] with F(t) >= need, where F(x) = sum of weight(id, score) over the
// candidates with key >= x; given F(lo) = f_lo >= need and F(hi + 1) = f_above < need. Returns t
// with *f_at = F(t) and *f_next = F(t + 1). Every pass evaluates F at 15 pivots inside (lo, hi]
// and keeps the sub-interval holding t: log16 of the interval's width passes.
template <class Candidate, class Weight>
__device__ uint32_t sample_search(const SampleRow& row, uint32_t lo, uint32_t hi, u64 need, u64 f_lo, u64 f_above,
                                  const Candidate& candidate, const Weight& weight, SampleShared& sh, u64* f_at,
                                  u64* f_next) {
  while (lo < hi) {
    uint32_t pivots[kSamplePivots];
    const u64 span = hi - lo;
#pragma unroll
    for (int j = 0; j < kSamplePivots; ++j) {
      u64 step = span * (j + 1) / (kSamplePivots + 1);
      if (step < static_cast<u64>(j + 1)) step = static_cast<u64>(j + 1) < span ? j + 1 : span;
      pivots[j] = lo + static_cast<uint32_t>(step);
    }
    u64 sums[kSamplePivots];
#pragma unroll
    for (int j = 0; j < kSamplePivots; ++j) sums[j] = 0;
    // Keys above hi add f_above to every pivot; keys below the first pivot add nothing.
    row.visit([&](int id, float s) {
      const uint32_t k = row.key(s);
      if (k < pivots[0] || k > hi || !candidate(id, k)) return;
      const u64 w = weight(s);
#pragma unroll
      for (int j = 0; j < kSamplePivots; ++j)
        if (k >= pivots[j]) sums[j] += w;
    });
    block_sum_u64(sums, sh);
    uint32_t new_lo = lo, new_hi = hi;
    u64 new_f_lo = f_lo, new_f_above = f_above;
    bool cut = false;
#pragma unroll
    for (int j = 0; j < kSamplePivots; ++j) {
      const u64 f = sh.totals[j] + f_above;
      if (f >= need) {
        new_lo = pivots[j];
        new_f_lo = f;
      } else if (!cut) {  // F is non-increasing: the first pivot below need bounds t from above
        cut = true;
        new_hi = pivots[j] - 1;
        new_f_above = f;
      }
    }
    __syncthreads();  // sh.totals is read by every thread before the next pass overwrites it
    lo = new_lo;
    hi = new_hi;
    f_lo = new_f_lo;
    f_above = new_f_above;
  }
  *f_at = f_lo;
  *f_next = f_above;
  return lo;
}

// The first id (ascending) at which the running sum of weight(id, score) reaches target (the
// target, when `draw` >= 0: floor(draw * total) + 1, i.e. the first id whose running sum passes
// draw * total, as Sampler::sample_with_draw walks it). -1 when it never does. Each thread sums a
// contiguous chunk, a block scan orders the chunks, and the thread whose chunk holds the target
// walks it again.
template <class Weight>
__device__ int sample_first_id_reaching(const SampleRow& row, u64 target, double draw, const Weight& weight,
                                        SampleShared& sh) {
  const int chunk = ((row.vocab + kSampleThreads - 1) / kSampleThreads + 7) / 8 * 8;
  const int begin = min(row.vocab, static_cast<int>(threadIdx.x) * chunk), end = min(row.vocab, begin + chunk);
  u64 own = 0;
  row.visit_range(begin, end, [&](int id, float s) { own += weight(id, s); });
  // Inclusive scan over the block: lanes, then warps.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 inclusive = own;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const u64 other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (threadIdx.x == 0) sh.found_id = -1;
  if (lane == 31) sh.warp_prefix[warp] = inclusive;
  __syncthreads();
  u64 before_warp = 0, total = 0;
  for (int w = 0; w < kSampleWarps; ++w) {
    if (w < warp) before_warp += sh.warp_prefix[w];
    total += sh.warp_prefix[w];
  }
  const u64 exclusive = before_warp + inclusive - own;
  if (draw >= 0) {
    const u64 passed = static_cast<u64>(draw * static_cast<double>(total));
    target = passed >= total ? total : passed + 1;
  }
  if (own > 0 && exclusive < target && target <= exclusive + own) {
    u64 running = exclusive;
    int found = -1;
    row.visit_range(begin, end, [&](int id, float s) {
      if (found >= 0) return;
      running += weight(id, s);
      if (running >= target) found = id;
    });
    sh.found_id = found;
  }
  __syncthreads();
  const int found = sh.found_id;
  __syncthreads();  // sh is reused by the caller
  return found;
}

// SampleRowParams: ops.h. grid = rows to sample, block = kSampleThreads; dynamic shared memory:
// the penalty bitmap, bitmap_words u32 (0 when no row is penalised).
template <class Params>
__global__ void __launch_bounds__(kSampleThreads) sample_logits_kernel(const __half* __restrict__ logits, int vocab,
                                                                      const Params* __restrict__ params,
                                                                      const int32_t* __restrict__ penalty_ids,
                                                                      int bitmap_words, int32_t* __restrict__ ids) {
  extern __shared__ uint32_t penalty_bitmap[];
  __shared__ SampleShared sh;
  pdl_prologue();
  const Params p = params[blockIdx.x];
  SampleRow row;
  row.logits = logits + static_cast<int64_t>(p.row) * vocab;
  row.vocab = vocab;
  row.vec8 = vocab % 8 == 0 && (reinterpret_cast<uintptr_t>(row.logits) & 15) == 0;
  row.penalty = p.repetition_penalty;
  row.temperature = p.temperature;
  row.penalised = nullptr;
  const bool penalise = p.repetition_penalty != 1.0f && p.penalty_count > 0 && bitmap_words > 0;
  if (penalise) {
    for (int w = threadIdx.x; w < bitmap_words; w += blockDim.x) penalty_bitmap[w] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < p.penalty_count; i += blockDim.x) {
      const int id = penalty_ids[p.penalty_offset + i];
      if (id >= 0 && id < vocab) atomicOr(&penalty_bitmap[id >> 5], 1u << (id & 31));
    }
    __syncthreads();
    row.penalised = penalty_bitmap;
  }
  row.shift = penalise ? 0 : 13;
  row.top = 0;

  // Pass 1: the maximum (lowest id on ties), the smallest key, NaNs.
  float best = -INFINITY;
  int best_id = INT_MAX;
  uint32_t min_key = UINT32_MAX;
  bool nan = false;
  row.visit([&](int id, float s) {
    if (s != s) {
      nan = true;
      return;
    }
    argmax_merge(best, best_id, s, id);
    min_key = min(min_key, sample_order_key(s));
  });
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    argmax_merge(best, best_id, other, other_id);
    min_key = min(min_key, __shfl_xor_sync(0xffffffffu, min_key, offset));
  }
  if (lane == 0) {
    sh.max_value[warp] = best;
    sh.max_id[warp] = best_id;
    sh.min_key[warp] = min_key;
  }
  nan = __syncthreads_or(nan);
  best = sh.max_value[0];
  best_id = sh.max_id[0];
  min_key = sh.min_key[0];
  for (int w = 1; w < kSampleWarps; ++w) {
    argmax_merge(best, best_id, sh.max_value[w], sh.max_id[w]);
    min_key = min(min_key, sh.min_key[w]);
  }
  __syncthreads();
  const int argmax_id = best_id == INT_MAX ? 0 : best_id;
  if (!(p.temperature > 0.0f) || (!nan && !isfinite(best))) {  // greedy, or no finite maximum
    if (threadIdx.x == 0) ids[blockIdx.x] = argmax_id;
    return;
  }
  if (nan) {  // the CPU sampler refuses the row
    if (threadIdx.x == 0) ids[blockIdx.x] = -1;
    return;
  }
  row.top = static_cast<double>(best / p.temperature);
  if (!isfinite(row.top)) {  // a temperature so small the top score overflows: greedy
    if (threadIdx.x == 0) ids[blockIdx.x] = argmax_id;
    return;
  }
  const uint32_t min_k = min_key >> row.shift, max_k = sample_order_key(best) >> row.shift;

  // top_k: the k-th key t_k by count; of the tokens tied at t_k, the lowest ids fill up to k.
  const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
  uint32_t tk = min_k;
  int tk_id_cut = INT_MAX;  // tokens at key tk with id > tk_id_cut are out
  auto everyone = [](int, uint32_t) { return true; };
  if (use_top_k) {
    u64 at = 0, next = 0;
    tk = sample_search(row, min_k, max_k, static_cast<u64>(p.top_k), static_cast<u64>(vocab), 0, everyone,
                       [](float) { return u64{1}; }, sh, &at, &next);
    if (at != static_cast<u64>(p.top_k)) {
      tk_id_cut = sample_first_id_reaching(
          row, static_cast<u64>(p.top_k) - next, -1.0,
          [&](int, float s) { return row.key(s) == tk ? u64{1} : u64{0}; }, sh);
    }
  }
  auto in_top_k = [&](int id, uint32_t k) { return !use_top_k || k > tk || (k == tk && id <= tk_id_cut); };

  // top_p over the top_k candidates: the shortest prefix of the order whose mass reaches top_p
  // of theirs (at least one token).
  const bool use_top_p = p.top_p < 1.0f;
  uint32_t tp = min_k;
  int tp_id_cut = INT_MAX;
  if (use_top_p) {
    u64 partial[1] = {0};
    row.visit([&](int id, float s) {
      if (in_top_k(id, row.key(s))) partial[0] += row.mass(s);
    });
    block_sum_u64(partial, sh);
    const u64 candidates_mass = sh.totals[0];
    __syncthreads();
    double need_d = ceil(static_cast<double>(p.top_p) * static_cast<double>(candidates_mass));
    u64 need = need_d < 1.0 ? 1 : static_cast<u64>(need_d);
    if (need > candidates_mass) need = candidates_mass;
    u64 at = 0, next = 0;
    tp = sample_search(row, use_top_k ? tk : min_k, max_k, need, candidates_mass, 0, in_top_k,
                       [&](float s) { return row.mass(s); }, sh, &at, &next);
    tp_id_cut = sample_first_id_reaching(
        row, need - next, -1.0,
        [&](int id, float s) {
          const uint32_t k = row.key(s);
          return k == tp && in_top_k(id, k) ? row.mass(s) : u64{0};
        },
        sh);
    if (tp_id_cut < 0) tp_id_cut = INT_MAX;  // (not reached: F(tp) >= need)
  }

  // min_p keeps weights >= min_p (the top token's weight is 1); the draw walks the kept tokens
  // in id order.
  const double log_floor = p.min_p > 0.0f ? log(static_cast<double>(p.min_p)) : -INFINITY;
  const int picked = sample_first_id_reaching(
      row, 0, p.draw,
      [&](int id, float s) {
        const uint32_t k = row.key(s);
        if (!in_top_k(id, k)) return u64{0};
        if (use_top_p && !(k > tp || (k == tp && id <= tp_id_cut))) return u64{0};
        if (row.log_weight(s) < log_floor) return u64{0};
        return row.mass(s);
      },
      sh);
  if (threadIdx.x == 0) ids[blockIdx.x] = picked >= 0 ? picked : argmax_id;
}

}  // namespace qspec::cuda::kernels
