#include <cstdlib>
#include <type_traits>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/kernels/w4a16_preload.cuh"
#include "ops/cuda/kernels/w4a16_small_m.cuh"
#include "ops/cuda/kernels/w4a16_stream.cuh"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {

namespace {

// Variants (all 128 rows per block): 1 = 4 warps x 2 row blocks, 4 chunks in flight per
// warp; 2 = 8 warps x 1 row block, 8 chunks in flight (4 for 8 n-tiles, to stay in registers).
// Variant 5 (the default where it runs, up to 16 tokens a slice) is the preload kernel below:
// 8 warps x 1 row block, weights through per-warp shared-memory rings filled by bulk copies.
// Launched with programmatic stream serialization (launch_pdl, common.h): the kernel may start
// while the previous kernel on the stream drains (it waits for it before reading x).

// Largest x slice variants 1/2 stage in shared memory (beyond: x from global memory).
constexpr size_t kXSharedMax = 96 * 1024;
// Whether x_staging 0 stages x in shared memory: for slices of more than 8 tokens (ncu: the loop
// then waited on an L2 load of x every k pair); up to 8 tokens x comes from global memory through
// L1, 1-5 % faster (H100 GEMM bench, m = 1..8: the staging adds a round trip and a barrier before
// the first mma). QSPEC_W4A16_STAGE_X=0/1 at build time forces one way, for sweeps.
bool stage_x_by_default(int64_t slice) {
#ifdef QSPEC_W4A16_STAGE_X
  (void)slice;
  return QSPEC_W4A16_STAGE_X != 0;
#else
  return slice > 8;
#endif
}

template <class Act, int MT, int RPW, int G, int DEPTH, int WARPS>
void launch(const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream) {
  auto* kernel = kernels::w4_small_m_kernel<Act, MT, RPW, G, DEPTH, WARPS>;
  static const bool configured = [&] {
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kXSharedMax));
    return true;
  }();
  (void)configured;
  size_t smem = 0;
  if (params.xs_stride > 0)
    smem = static_cast<size_t>(std::min(params.m, MT * 8)) * params.xs_stride * sizeof(typename Act::Elem);
  launch_pdl(kernel, grid, dim3(WARPS * 32), smem, stream, params);
  QSPEC_CUDA_CHECK_LAUNCH("w4_small_m_kernel");
}

template <class Act, int MT, int G>
void launch_variant(int variant, const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream) {
  if constexpr (MT == 8) {
    launch<Act, 8, 1, G, 4, 8>(params, grid, stream);  // 8 n-tiles: one row block per warp only
  } else {
    if (variant == 1) launch<Act, MT, 2, G, 4, 4>(params, grid, stream);
    else launch<Act, MT, 1, G, 8, 8>(params, grid, stream);
  }
}

template <class Act, int G>
void launch_group(int mt, int variant, const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream) {
  switch (mt) {
    case 1: launch_variant<Act, 1, G>(variant, params, grid, stream); break;
    case 2: launch_variant<Act, 2, G>(variant, params, grid, stream); break;
    case 4: launch_variant<Act, 4, G>(variant, params, grid, stream); break;
    default: launch_variant<Act, 8, G>(variant, params, grid, stream); break;
  }
}

// One launch of the register-ring kernel (variants 1 / 2) for a slice of at most 64 tokens:
// split-K and x staging planned here for every activation policy. params: w, a, y, ldy, m set by
// the caller.
template <class Act>
void launch_register_ring(kernels::W4A16SmallMParams params, int variant, const W4A16SmallMConfig& config,
                          void* workspace, size_t workspace_bytes, cudaStream_t s) {
  const kernels::W4A16Layout& layout = params.w;
  const int64_t row_tiles = (layout.n + detail::kW4A16TileRows - 1) / detail::kW4A16TileRows;
  QSPEC_CHECK(row_tiles * 4 <= static_cast<int64_t>(detail::kW4A16SplitKCounterBytes), "cuda::w4a16_gemm: n ", layout.n,
              " too large");
  const int64_t slice = params.m;
  const int mt = slice <= 8 ? 1 : slice <= 16 ? 2 : slice <= 32 ? 4 : 8;
  const int sms = multiprocessor_count();
  // Split-K: enough blocks for ~3 per multiprocessor, within the traffic bound, the chunk
  // count and the workspace.
  int64_t splits = config.splits > 0
                       ? config.splits
                       : std::min<int64_t>((3 * sms + row_tiles - 1) / row_tiles,
                                           detail::w4a16_max_splits(slice, layout.k));
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, layout.full_chunks));
  splits = detail::splits_that_fit(splits, slice, layout.n, workspace, workspace_bytes);
  params.splits = static_cast<int>(splits);
  params.counters = static_cast<unsigned*>(workspace);
  params.partials = detail::splitk_partials(workspace, splits);
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(splits));
  // Variant 5 runs here beyond 16 tokens a slice, as the default variant 1.
  const int v = mt == 8 || (variant > 2 && variant != 5) ? 2 : variant == 5 ? 1 : variant;
  QSPEC_CHECK(config.x_staging >= 0 && config.x_staging <= 2, "cuda::w4a16_gemm: unknown x staging ",
              config.x_staging);
  const bool stage_x = config.x_staging == 1 || (config.x_staging == 0 && stage_x_by_default(slice));
  if (stage_x) {
    // x in shared memory: the longest k range of a split (+ the tail pair), 16 bytes of padding.
    constexpr int64_t kElem = sizeof(typename Act::Elem);
    const int64_t range = ((layout.full_chunks + splits - 1) / splits) * 64 + (layout.tail ? 32 : 0);
    const int64_t stride = range + 16 / kElem;
    const int64_t rows = std::min<int64_t>(slice, mt * 8);
    params.xs_stride = static_cast<size_t>(rows * stride * kElem) <= kXSharedMax ? static_cast<int>(stride) : 0;
  }
  switch (layout.k / layout.groups) {
    case 32: launch_group<Act, 32>(mt, v, params, grid, s); break;
    case 64: launch_group<Act, 64>(mt, v, params, grid, s); break;
    default: launch_group<Act, 128>(mt, v, params, grid, s); break;
  }
}

// ---- variants 3 and 4: the cp.async ring kernel (kernels/w4a16_stream.cuh), m <= 32 a launch ----

template <int MT, int WARPS, int CH, int STAGES, int G>
struct StreamLauncher {
  using Shape = kernels::W4A16StreamShape<MT, WARPS, CH, STAGES, G>;
  static void launch(const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream) {
    auto* kernel = kernels::w4a16_stream_kernel<MT, WARPS, CH, STAGES, G>;
    static const bool configured = [&] {
      QSPEC_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
      return true;
    }();
    (void)configured;
    launch_pdl(kernel, grid, dim3(WARPS * 32), Shape::kSmemBytes, stream, params);
    QSPEC_CUDA_CHECK_LAUNCH("w4a16_stream_kernel");
  }
  // Blocks of this kernel one multiprocessor holds at once (shared memory bound, at most 4).
  static int blocks_per_sm() {
    const cudaDeviceProp& props = current_device_properties();
    const size_t per_block = Shape::kSmemBytes + 1024;  // + the runtime's reserve
    return static_cast<int>(std::clamp<size_t>(props.sharedMemPerMultiprocessor / per_block, 1, 4));
  }
};

template <int MT, int G>
void stream_dispatch(int variant, const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream,
                     int* blocks_per_sm) {
  constexpr int kStages = MT <= 2 ? 8 : 6;
  if (variant == 3) {
    using L = StreamLauncher<MT, 4, 2, kStages, G>;
    if (blocks_per_sm) *blocks_per_sm = L::blocks_per_sm();
    else L::launch(params, grid, stream);
  } else {
    using L = StreamLauncher<MT, 4, 4, kStages / 2, G>;
    if (blocks_per_sm) *blocks_per_sm = L::blocks_per_sm();
    else L::launch(params, grid, stream);
  }
}

template <int G>
void stream_group(int mt, int variant, const kernels::W4A16SmallMParams& params, dim3 grid, cudaStream_t stream,
                  int* blocks_per_sm) {
  switch (mt) {
    case 1: stream_dispatch<1, G>(variant, params, grid, stream, blocks_per_sm); break;
    case 2: stream_dispatch<2, G>(variant, params, grid, stream, blocks_per_sm); break;
    default: stream_dispatch<4, G>(variant, params, grid, stream, blocks_per_sm); break;
  }
}

void stream_launch(int group, int mt, int variant, const kernels::W4A16SmallMParams& params, dim3 grid,
                   cudaStream_t stream, int* blocks_per_sm = nullptr) {
  switch (group) {
    case 32: stream_group<32>(mt, variant, params, grid, stream, blocks_per_sm); break;
    case 64: stream_group<64>(mt, variant, params, grid, stream, blocks_per_sm); break;
    default: stream_group<128>(mt, variant, params, grid, stream, blocks_per_sm); break;
  }
}

// ---- variant 5: the bulk-copy preload kernel (kernels/w4a16_preload.cuh), m <= 16 a launch ----

// Shared memory a preload block may take for its rings: 24 KB is one slot (4 chunks, 2 KB) a
// warp. Measured in the Llama-3-8B decode step (docs/perf-journal/perf-notes-journal-2026.md): every deeper ring (2, 3,
// 4, 5 and 11 slots) was slower at every batch of 1-8, 11 slots by 30 %, and so were smaller
// slots; larger ones cost registers (8-chunk slots: 123 instead of 98) and more than they gave.
// One token is the exception, measured later on the H100 at c1b74cd: two slots a warp (48 KB) made
// batch-1 steps 1.5 % shorter and batch 2-8 steps 0.6-1.1 % longer
// (bench/results/gpu-decode-preload-kb-ab-llama3-8b-h100-c1b74cd.log). QSPEC_W4A16_PRELOAD_KB
// overrides both (sweeps; 0 or unset: these defaults).
constexpr size_t kPreloadBlockBytesDefault = 24 * 1024;
constexpr size_t kPreloadBlockBytesOneToken = 48 * 1024;

// Benchmark knobs read once from the environment (as QSPEC_NO_PDL), so one build can time the
// alternatives in one run: QSPEC_W4A16_VARIANT (the small-M variant `automatic` and variant 0
// take), QSPEC_W4A16_PRELOAD_KB (variant 5's ring budget a block) and
// QSPEC_W4A16_PRELOAD_SLOT_CHUNKS (chunks a ring slot carries, 1-4), QSPEC_W4A16_PRELOAD_BLOCKS
// (blocks a multiprocessor the split count plans for). Unset: the defaults.
int default_variant() {
  static const int variant = env_int("QSPEC_W4A16_VARIANT", detail::kW4A16DefaultVariant, 1, 5);
  return variant;
}
int preload_slot_chunks() {
  static const int chunks = env_int("QSPEC_W4A16_PRELOAD_SLOT_CHUNKS", kernels::W4A16PreloadShape<128>::kSlotChunks, 1,
                            kernels::W4A16PreloadShape<128>::kSlotChunks);
  return chunks;
}
// Blocks a multiprocessor the split-K heuristic plans for (the split count; 2 fit by registers).
int preload_blocks_per_sm() {
  static const int blocks = env_int("QSPEC_W4A16_PRELOAD_BLOCKS", 2, 1, 8);
  return blocks;
}
// The k slices a preload block can have: its 8 warps in equal groups.
bool valid_k_slices(int slices) { return slices == 1 || slices == 2 || slices == 4 || slices == 8; }
// K slices a block for the preload kernel (QSPEC_W4A16_PRELOAD_KSLICES: 1, 2, 4 or 8 forces it;
// 0 or unset: plan_k_slices).
int preload_k_slices_override() {
  static const int slices = [] {
    const int v = env_int("QSPEC_W4A16_PRELOAD_KSLICES", 0, 0, 8);
    QSPEC_CHECK(v == 0 || valid_k_slices(v), "QSPEC_W4A16_PRELOAD_KSLICES must be 0, 1, 2, 4 or 8, not ", v);
    return v;
  }();
  return slices;
}
// Whether the preload kernel's weight copies carry the L2 evict-first hint (QSPEC_W4A16_EVICT_FIRST
// 0 / 1; default on: docs/perf-journal/perf-notes-journal-2026.md, "K slices inside the W4A16 GEMM's blocks, L2 prefetch,
// evict-first").
bool preload_evict_first() {
  static const bool on = env_int("QSPEC_W4A16_EVICT_FIRST", 1, 0, 1) != 0;
  return on;
}
// One-split launches of the plain preload GEMM at one token tile (1-8 tokens) on the instance
// without the split-K fix-up (kernels/w4a16_preload.cuh, ONE_SPLIT; the same bits): 102 registers
// instead of 114 at groups of 128. At two tiles (9-16 tokens) with a whole slot of x ahead that
// instance spilled more than the general one (44 against 16 bytes); one_split_two_tiles_on below.
// QSPEC_W4A16_ONE_SPLIT_KERNEL=0: the general instance at 1-8 tokens (A/B runs).
bool one_split_kernel_on() {
  static const bool on = env_int("QSPEC_W4A16_ONE_SPLIT_KERNEL", 1, 0, 1) == 1;
  return on;
}
// One-split plain launches at two token tiles (9-16 tokens) on the one-split instance with half a
// slot of x ahead, as SwiGLU's there: 119 registers and no spills against the general instance's
// 128 and 16 bytes. H100 steps at batch 9 / 12 / 16: Llama-3-8B −1.8 / −1.8 / −1.9 %, Qwen2.5-7B
// −0.7 / −1.1 / −1.7 %, Llama-2-7B +0.8 / −1.9 / −2.4 % (docs/perf-journal/perf-notes-journal-2026.md, "The one-split instance
// at 9-16 tokens"). QSPEC_W4A16_ONE_SPLIT_TWO_TILES=0: the general instance there (A/B runs).
bool one_split_two_tiles_on() {
  static const bool on = env_int("QSPEC_W4A16_ONE_SPLIT_TWO_TILES", 1, 0, 1) == 1;
  return on;
}
size_t preload_block_bytes(int64_t m) {
  static const int forced_kb = [] {
    const int kb = env_int("QSPEC_W4A16_PRELOAD_KB", 0, 0, 227);
    QSPEC_CHECK(kb == 0 || kb >= 8, "QSPEC_W4A16_PRELOAD_KB=", kb, ": 0 (the defaults) or 8-227");
    return kb;
  }();
  if (forced_kb > 0) return static_cast<size_t>(forced_kb) * 1024;
  return m == 1 ? kPreloadBlockBytesOneToken : kPreloadBlockBytesDefault;
}

// Whether the preload kernel that would run here is the sm_90a build (elsewhere it is a trap).
bool preload_kernel_runs_here() {
  static const bool runs = detail::sm90a_build_runs(kernels::w4_preload_kernel<kernels::ActF16, 1, 128>);
  return runs;
}

template <class Act, int MT, int G, bool SWIGLU, int X_AHEAD = 0, bool ONE_SPLIT = SWIGLU>
void preload_launch(const kernels::W4A16SmallMParams& params, dim3 grid, int ring_slots, int k_slices,
                    cudaStream_t stream) {
  using Shape = kernels::W4A16PreloadShape<G, kernels::kActZeroPoints<Act>>;
  auto* kernel = kernels::w4_preload_kernel<Act, MT, G, SWIGLU, X_AHEAD, ONE_SPLIT>;
  // int4-zp: each warp's zero points for its whole part after the rings (kernels/w4a16_preload.cuh).
  size_t smem_bytes = Shape::smem_bytes(ring_slots);
  if constexpr (kernels::kActZeroCodes<Act>)
    smem_bytes = kernels::preload_zero_offset(smem_bytes, Shape::kWarps) +
                 static_cast<size_t>(Shape::kWarps) *
                     kernels::preload_zero_bytes(G, params.w.full_chunks, params.splits * k_slices);
  static const bool configured = [&] {
    // The opt-in limit less the kernel's static shared memory (the split-K flag).
    cudaFuncAttributes attributes{};
    QSPEC_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(current_device_properties().sharedMemPerBlockOptin - attributes.sharedSizeBytes)));
    return true;
  }();
  (void)configured;
  launch_pdl(kernel, grid, dim3(Shape::kWarps * 32), smem_bytes, stream, params, ring_slots,
             preload_slot_chunks(), k_slices);
  QSPEC_CUDA_CHECK_LAUNCH("w4_preload_kernel");
}

template <int G, bool GW>
int preload_ring_slots(int64_t chunks_per_split, int64_t m) {
  using Shape = kernels::W4A16PreloadShape<G, GW>;
  const int64_t chunks = preload_slot_chunks();
  const int64_t wanted = std::max<int64_t>(1, (chunks_per_split + chunks - 1) / chunks);
  const int64_t room = std::max<size_t>(1, preload_block_bytes(m) / Shape::smem_bytes(1));
  return static_cast<int>(std::min(wanted, room));
}

// K slices a block (kernels/w4a16_preload.cuh): the most (8, 4, 2) whose blocks still fit in one
// wave of `block_slots` and leave every warp at least 4 chunks (256 k); 1 where none does (then
// split-K across blocks fills the GPU, as before). Except where one k slice is more than one wave
// but at most two: the second wave is then a tail of whole blocks on a few multiprocessors, and
// 2 slices (half-length blocks) halve it. Measured on the H100 (docs/perf-journal/perf-notes-journal-2026.md, "The preload
// kernel at 9-16 tokens"): Qwen2.5-7B's gate_up (296 blocks of one slice for 264 slots) 11-15 %
// faster alone at 1-16 tokens with 2 slices (its step 3.2-5.0 % shorter at batch 1-16); 4 slices
// gained less, 8 lost.
// QSPEC_W4A16_TAIL_SLICES=0 turns that exception off (A/B runs).
bool tail_slices_on() {
  static const bool on = env_int("QSPEC_W4A16_TAIL_SLICES", 1, 0, 1) == 1;
  return on;
}
int plan_k_slices(int64_t row_blocks, int64_t full_chunks, int64_t block_slots) {
  constexpr int kWarps = kernels::W4A16PreloadShape<128>::kWarps;
  for (int slices : {8, 4, 2}) {
    const int64_t tiles = (row_blocks * slices + kWarps - 1) / kWarps;
    if (tiles <= block_slots && full_chunks >= 4 * slices) return slices;
  }
  const int64_t tiles = (row_blocks + kWarps - 1) / kWarps;
  if (tail_slices_on() && tiles > block_slots && tiles <= 2 * block_slots && full_chunks >= 8) return 2;
  return 1;
}

// A preload launch's parameters for m f16 rows of x (ldx apart) into y (ldy apart); the launcher
// fills the partition's fields.
kernels::W4A16SmallMParams preload_params(const kernels::W4A16Layout& layout, const __half* x, int64_t ldx, __half* y,
                                          int64_t ldy, int64_t m) {
  kernels::W4A16SmallMParams params{};
  params.w = layout;
  params.a = kernels::ActivationRows{x, ldx, nullptr, 0, 0};
  params.y = y;
  params.ldy = ldy;
  params.m = static_cast<int>(m);
  params.evict_first = preload_evict_first() ? 1 : 0;
  return params;
}

// The preload kernel's partition of one launch: one wave of blocks (two a multiprocessor), k cut
// into slices inside a block where row blocks are few (plan_k_slices), split-K across blocks over
// the rest.
struct PreloadPlan {
  int k_slices;
  int64_t row_tiles, splits;
};
PreloadPlan plan_preload(const kernels::W4A16Layout& layout, int64_t slice, const W4A16SmallMConfig& config,
                         const void* workspace, size_t workspace_bytes) {
  const int sms = multiprocessor_count();
  const int64_t per_sm = std::clamp<int64_t>(
      static_cast<int64_t>(current_device_properties().sharedMemPerMultiprocessor / (preload_block_bytes(slice) + 1024)), 1,
      preload_blocks_per_sm());
  QSPEC_CHECK(config.k_slices == 0 || valid_k_slices(config.k_slices),
              "cuda::w4a16_gemm: k slices must be 1, 2, 4 or 8, not ", config.k_slices);
  PreloadPlan plan{};
  plan.k_slices = config.k_slices > 0               ? config.k_slices
                  : preload_k_slices_override() > 0 ? preload_k_slices_override()
                                                    : plan_k_slices(layout.row_blocks, layout.full_chunks, per_sm * sms);
  const int64_t tile_rows = 16 * (kernels::W4A16PreloadShape<128>::kWarps / plan.k_slices);
  plan.row_tiles = (layout.n + tile_rows - 1) / tile_rows;
  QSPEC_CHECK(plan.row_tiles * 4 <= static_cast<int64_t>(detail::kW4A16SplitKCounterBytes), "cuda::w4a16_gemm: n ",
              layout.n, " too large");
  int64_t splits = config.splits > 0
                       ? config.splits
                       : std::min<int64_t>(std::max<int64_t>(1, per_sm * sms / plan.row_tiles),
                                           std::max<int64_t>(1, detail::w4a16_max_splits(slice, layout.k) / plan.k_slices));
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, layout.full_chunks / plan.k_slices));
  plan.splits = detail::splits_that_fit(splits, slice, layout.n, workspace, workspace_bytes);
  return plan;
}

// Whether gate_up with SwiGLU at two token tiles (9-16 tokens) holds half a slot of x ahead
// instead of a whole one (w4_preload_kernel's X_AHEAD). A whole slot is 64 registers of x there,
// and the kernel spills at the 128-register cap; half a slot does not. Measured on the H100
// (docs/perf-journal/perf-notes-journal-2026.md, "The preload kernel at 9-16 tokens"): steps at batch 9-16 2.4-5.2 % shorter on
// Llama-3-8B (0.5-2.5 % in a rerun on another H100) and 3.1-4.8 % on Llama-2-7B (one slice, one
// wave), 0.3-2.6 % on Qwen2.5-7B (two slices, plan_k_slices). The one loss measured was Qwen2.5-7B's gate_up in one slice and more than
// one wave (+1.2-1.6 %), a partition the planner no longer makes (QSPEC_W4A16_TAIL_SLICES=0 does).
// QSPEC_W4A16_PRELOAD_X_HALF=0 / 1 forces it (A/B runs; unset: half).
bool swiglu_x_half_slot() {
  static const bool half = env_int("QSPEC_W4A16_PRELOAD_X_HALF", 1, 0, 1) == 1;
  return half;
}

// The activation policies of quantized activations that run on the preload kernel: W4A8's int8
// codes with a scale a token (ActS8), at one token tile (1-8 tokens, the small-M path's range
// for quantized activations: gemm_w4_lowbit.h).
template <class Act>
inline constexpr bool kQuantizedPreload = std::is_same_v<Act, kernels::ActS8>;

// One launch of the preload kernel for a slice of at most 16 tokens (kQuantizedPreload: 8), each
// warp's ring as deep as its part of k or the budget. SWIGLU: gate_up's weights, y = silu(gate) *
// up (the plan has one split and at most 4 k slices: plan_swiglu).
template <class Act, bool SWIGLU = false>
void launch_preload(kernels::W4A16SmallMParams params, const PreloadPlan& plan, void* workspace, cudaStream_t s) {
  const kernels::W4A16Layout& layout = params.w;
  params.splits = static_cast<int>(plan.splits);
  params.counters = static_cast<unsigned*>(workspace);
  params.partials = detail::splitk_partials(workspace, plan.splits);
  params.xs_stride = 0;
  const dim3 grid(static_cast<unsigned>(plan.row_tiles), static_cast<unsigned>(plan.splits));
  const int64_t chunks_per_part = (layout.full_chunks + plan.splits * plan.k_slices - 1) / (plan.splits * plan.k_slices);
  const bool two_tiles = params.m > 8;
  auto run = [&](auto group) {
    constexpr int G = decltype(group)::value;
    const int ring = preload_ring_slots<G, kernels::kActZeroPoints<Act>>(chunks_per_part, params.m);
    if constexpr (kQuantizedPreload<Act>) {  // one token tile: the one-split kernel or the general one
      static_assert(!SWIGLU, "the SwiGLU epilogue is W4A16's");
      QSPEC_CHECK(!two_tiles, "cuda::w4_quantized_gemm_small_m: the preload kernel takes up to 8 tokens of ",
                  "quantized activations a slice, not ", params.m);
      if (plan.splits == 1 && one_split_kernel_on()) preload_launch<Act, 1, G, false, 0, true>(params, grid, ring, plan.k_slices, s);
      else preload_launch<Act, 1, G, false>(params, grid, ring, plan.k_slices, s);
    } else if constexpr (SWIGLU) {  // one split; only SwiGLU instantiates the half-slot kernels
      if (!two_tiles) preload_launch<Act, 1, G, true>(params, grid, ring, plan.k_slices, s);
      else if (swiglu_x_half_slot())
        preload_launch<Act, 2, G, true, kernels::W4A16PreloadShape<G>::kSlotChunks>(params, grid, ring, plan.k_slices, s);
      else preload_launch<Act, 2, G, true>(params, grid, ring, plan.k_slices, s);
    } else if (plan.splits == 1 && !two_tiles && one_split_kernel_on()) {
      preload_launch<Act, 1, G, false, 0, true>(params, grid, ring, plan.k_slices, s);
    } else if (plan.splits == 1 && two_tiles && one_split_two_tiles_on()) {
      preload_launch<Act, 2, G, false, kernels::W4A16PreloadShape<G>::kSlotChunks, true>(params, grid, ring,
                                                                                         plan.k_slices, s);
    } else {
      if (!two_tiles) preload_launch<Act, 1, G, false>(params, grid, ring, plan.k_slices, s);
      else preload_launch<Act, 2, G, false>(params, grid, ring, plan.k_slices, s);
    }
  };
  switch (layout.k / layout.groups) {
    case 32: run(std::integral_constant<int, 32>{}); break;
    case 64: run(std::integral_constant<int, 64>{}); break;
    default: run(std::integral_constant<int, 128>{}); break;
  }
}

// The small-M variant a launch with `config` runs: config.variant, else the default variant
// where the scales are 16-byte aligned (variant 1 elsewhere, and where the preload kernel
// cannot run).
int small_m_variant(const W4A16Weights& w, const W4A16SmallMConfig& config) {
  if (w.has_min()) return 5;  // int4-asym: the one small-M kernel with zero points (w4a16_runs_zero_points)
  if (config.variant != 0) return config.variant;
  if (reinterpret_cast<uintptr_t>(w.scales) % 16 != 0) return 1;
  const int variant = default_variant();
  return variant == 5 && !w4a16_preload_supported(w) ? 1 : variant;
}

// The SwiGLU epilogue's partition: one split, the planned k slices up to 4 (a block pairs gate and
// up row blocks, so it needs two of them).
constexpr int kSwigluMaxKSlices = 4;
PreloadPlan plan_swiglu(const kernels::W4A16Layout& layout, int64_t m, const void* workspace, size_t workspace_bytes) {
  W4A16SmallMConfig config{5, 1, 0, false, 0};
  PreloadPlan plan = plan_preload(layout, m, config, workspace, workspace_bytes);
  if (plan.k_slices > kSwigluMaxKSlices) {
    config.k_slices = kSwigluMaxKSlices;
    plan = plan_preload(layout, m, config, workspace, workspace_bytes);
  }
  return plan;
}
}  // namespace

bool w4a16_preload_runs_here() { return preload_kernel_runs_here(); }

bool w4a16_preload_supported(const W4A16Weights& w) {
  return reinterpret_cast<uintptr_t>(w.scales) % 16 == 0 && reinterpret_cast<uintptr_t>(w.codes) % 16 == 0 &&
         preload_kernel_runs_here();
}

bool w4a16_swiglu_runs(const W4A16Weights& w, int64_t m) {
  // int4-asym too: its zero-point instance folds scale and minimum into acc, which the epilogue reads.
  return m >= 1 && m <= 16 && w.n % 32 == 0 && w4a16_preload_supported(w);
}

bool w4a16_small_m_swiglu_partition(const W4A16Weights& w, int64_t m, const W4A16SmallMConfig& config,
                                    const void* workspace, size_t workspace_bytes) {
  if (m < 1 || m > 16 || small_m_variant(w, config) != 5) return false;
  const PreloadPlan plan =
      plan_preload(detail::w4a16_layout(w, /*zero_points=*/true), m, config, workspace, workspace_bytes);
  return plan.splits == 1 && plan.k_slices <= kSwigluMaxKSlices;
}

int w4a16_swiglu_k_slices(const W4A16Weights& w, int64_t m, const void* workspace, size_t workspace_bytes) {
  QSPEC_CHECK(w4a16_swiglu_runs(w, m), "cuda::w4a16_swiglu_k_slices: the SwiGLU GEMM does not run these weights / ", m,
              " tokens here");
  return plan_swiglu(detail::w4a16_layout(w, /*zero_points=*/true), m, workspace, workspace_bytes).k_slices;
}

void w4a16_gemm_swiglu(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* act, int64_t ld_act,
                       void* workspace, size_t workspace_bytes, void* stream) {
  QSPEC_CHECK(w4a16_swiglu_runs(w, m), "cuda::w4a16_gemm_swiglu: needs 1-16 tokens (got ", m, "), n % 32 == 0 (got ", w.n,
              ") and the preload kernel (sm_90a, 16-byte aligned weights)");
  QSPEC_CHECK(ldx >= w.k && ldx % 8 == 0 && ld_act >= w.n / 2 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "cuda::w4a16_gemm_swiglu: x must be 16-byte aligned with ldx >= k and ldx % 8 == 0, ld_act >= n / 2 (ldx ",
              ldx, ", ld_act ", ld_act, ")");
  const kernels::W4A16Layout layout = detail::w4a16_layout(w, /*zero_points=*/true);
  const kernels::W4A16SmallMParams params =
      preload_params(layout, reinterpret_cast<const __half*>(x), ldx, reinterpret_cast<__half*>(act), ld_act, m);
  const PreloadPlan plan = plan_swiglu(layout, m, workspace, workspace_bytes);
  if (w.zero_codes) launch_preload<kernels::ActF16Zc, true>(params, plan, workspace, as_stream(stream));  // int4-zp
  else if (w.has_min()) launch_preload<kernels::ActF16Zp, true>(params, plan, workspace, as_stream(stream));  // int4-asym
  else launch_preload<kernels::ActF16, true>(params, plan, workspace, as_stream(stream));
}

void w4a16_gemm_small_m(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                        void* workspace, size_t workspace_bytes, void* stream, const W4A16SmallMConfig& config) {
  const kernels::W4A16Layout layout = detail::w4a16_layout(w, /*zero_points=*/true);
  QSPEC_CHECK(!w.has_min() || w4a16_runs_zero_points(W4A16Path::small_m, m),
              "cuda::w4a16_gemm: int4-asym weights (zero points) run the small-M path only on the preload kernel "
              "(sm_90a, up to 16 tokens; got ", m, "); cuda::w4a16_gemm's automatic path routes them");
  QSPEC_CHECK(m >= 0 && ldx >= w.k && ldx % 8 == 0 && ldy >= w.n && reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "cuda::w4a16_gemm: x must be 16-byte aligned with ldx >= k and ldx % 8 == 0, ldy >= n (m ", m,
              ", ldx ", ldx, ", ldy ", ldy, ")");
  if (m == 0) return;
  const bool scales_16 = reinterpret_cast<uintptr_t>(w.scales) % 16 == 0;
  const int variant = small_m_variant(w, config);
  QSPEC_CHECK(variant >= 1 && variant <= 5, "cuda::w4a16_gemm: unknown small-M variant ", variant);
  QSPEC_CHECK(variant < 3 || variant == 5 || scales_16,
              "cuda::w4a16_gemm: variants 3 and 4 need 16-byte aligned scales");
  QSPEC_CHECK(variant != 5 || w4a16_preload_supported(w),
              "cuda::w4a16_gemm: variant 5 (preload) needs an sm_90a GPU and build and 16-byte aligned weights");
  const int sms = multiprocessor_count();
  cudaStream_t s = as_stream(stream);
  const auto* xh = reinterpret_cast<const __half*>(x);
  auto* yh = reinterpret_cast<__half*>(y);
  for (int64_t m0 = 0; m0 < m; m0 += detail::kW4A16MaxSliceM) {
    const int64_t slice = std::min(detail::kW4A16MaxSliceM, m - m0);
    const int mt = slice <= 8 ? 1 : slice <= 16 ? 2 : slice <= 32 ? 4 : 8;
    if (variant == 5 && mt <= 2) {
      const kernels::W4A16SmallMParams params = preload_params(layout, xh + m0 * ldx, ldx, yh + m0 * ldy, ldy, slice);
      const PreloadPlan plan = plan_preload(layout, slice, config, workspace, workspace_bytes);
      if (w.zero_codes) launch_preload<kernels::ActF16Zc>(params, plan, workspace, s);  // int4-zp
      else if (w.has_min()) launch_preload<kernels::ActF16Zp>(params, plan, workspace, s);  // int4-asym
      else launch_preload<kernels::ActF16>(params, plan, workspace, s);
      continue;
    }
    if (variant >= 3 && variant <= 4 && mt <= 4) {
      // The ring kernel: 64 rows a block; enough blocks to fill every multiprocessor's slots.
      const int64_t tiles = (w.n + 63) / 64;
      QSPEC_CHECK(tiles * 4 <= static_cast<int64_t>(detail::kW4A16CounterBytes), "cuda::w4a16_gemm: n too large");
      kernels::W4A16SmallMParams params{};
      int per_sm = 1;
      stream_launch(static_cast<int>(w.group), mt, variant, params, dim3(), nullptr, &per_sm);
      // One wave: tiles x splits <= the blocks the GPU holds at once (dependents launch early).
      int64_t splits = config.splits > 0 ? config.splits
                                         : std::min<int64_t>(static_cast<int64_t>(per_sm) * sms / tiles,
                                                             detail::w4a16_max_splits(slice, w.k));
      splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, layout.full_chunks));
      splits = detail::splits_that_fit(splits, slice, w.n, workspace, workspace_bytes);
      params.w = layout;
      params.a = kernels::ActivationRows{xh + m0 * ldx, ldx, nullptr, 0, 0};
      kernels::set_output_slice(params, yh + m0 * ldy, ldy, slice, splits, workspace);
      stream_launch(static_cast<int>(w.group), mt, variant, params,
                    dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), s);
      continue;
    }
    kernels::W4A16SmallMParams params{};
    params.w = layout;
    params.a = kernels::ActivationRows{xh + m0 * ldx, ldx, nullptr, 0, 0};
    params.y = yh + m0 * ldy;
    params.ldy = ldy;
    params.m = static_cast<int>(slice);
    launch_register_ring<kernels::ActF16>(params, variant, config, workspace, workspace_bytes, s);
  }
}

void w4_quantized_gemm_small_m(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                               int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                               const W4A16SmallMConfig& config) {
  const kernels::W4A16Layout layout = detail::w4a16_layout(w);
  const kernels::ActivationRows rows = detail::activation_rows(x, m, w, "cuda::w4_quantized_gemm_small_m");
  QSPEC_CHECK(ldy >= w.n, "cuda::w4_quantized_gemm_small_m: ldy ", ldy, " < n ", w.n);
  if (m == 0) return;
  // W4A8 (int8 codes, a scale a token) takes the preload kernel by default where it runs, as
  // W4A16 does (small_m_variant); the other activation formats the register-ring kernel.
  const bool preload_runs = x.format == quant::Format::int8 && !config.split_activations && w4a16_preload_supported(w);
  const int variant = config.variant != 0 ? config.variant : preload_runs && default_variant() == 5 ? 5 : 1;
  QSPEC_CHECK(variant == 1 || variant == 2 || variant == 5, "cuda::w4_quantized_gemm_small_m: small-M variant ",
              variant, " does not exist for quantized activations (1, 2, or 5 for int8)");
  QSPEC_CHECK(variant != 5 || preload_runs, "cuda::w4_quantized_gemm_small_m: variant 5 (preload) takes int8 ",
              "activations without the Split strategy, on an sm_90a GPU and build with 16-byte aligned weights (got ",
              kernels::format_label(x.format), ")");
  QSPEC_CHECK(!config.split_activations || x.format == quant::Format::int8,
              "cuda::w4_quantized_gemm_small_m: the Split strategy takes int8 activations, not ",
              kernels::format_label(x.format));
  auto* yh = reinterpret_cast<__half*>(y);
  auto run = [&](auto policy) {
    using Act = decltype(policy);
    for (int64_t m0 = 0; m0 < m; m0 += detail::kW4A16MaxSliceM) {
      kernels::W4A16SmallMParams params{};
      params.w = layout;
      params.a = detail::activation_rows_from(rows, x, m0);
      params.y = yh + m0 * ldy;
      params.ldy = ldy;
      params.m = static_cast<int>(std::min(detail::kW4A16MaxSliceM, m - m0));
      if constexpr (kQuantizedPreload<Act>) {
        if (variant == 5 && params.m <= 8) {  // (beyond 8 tokens a slice: the register ring)
          params.evict_first = preload_evict_first() ? 1 : 0;
          const PreloadPlan plan = plan_preload(layout, params.m, config, workspace, workspace_bytes);
          launch_preload<Act>(params, plan, workspace, as_stream(stream));
          continue;
        }
      }
      launch_register_ring<Act>(params, variant, config, workspace, workspace_bytes, as_stream(stream));
    }
  };
  if (config.split_activations) run(kernels::ActS8Split{});
  else kernels::with_activation_policy(x.format, x.e4m3, run);
}

}  // namespace qspec::cuda
