// The CUDA backend's plain C++ face: launchers that take raw device pointers and a stream
// (a cudaStream_t passed as void*; nullptr is the default stream), so code compiled by the host
// compiler calls GPU ops without seeing a CUDA type. Every launcher checks its arguments
// (qspec::Error naming the argument) and the launch (QSPEC_CUDA_CHECK_LAUNCH); kernels run
// asynchronously on the stream. Tensors are row-major; f16 and bf16 tensors are passed as
// uint16_t bit patterns. Activations are f16, accumulation and statistics f32.
//
// Each op has a CPU twin (ops/*.h, quant/quantized_linear.h) that tests/gpu compares it with.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/attention.h"  // AttentionShape, shared with cpu::attention
#include "quant/formats.h"  // quant::Format of quantized activations

namespace qspec::cuda {

using f16_bits = uint16_t;  // an IEEE binary16 value as stored

// ---- device memory and synchronisation (thin wrappers, for host C++ and tests) ------------

// Owning device allocation (cudaMalloc); bytes() may be 0 (then get() is nullptr).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

void copy_to_device(void* device_dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes, void* stream = nullptr);
void fill_bytes(void* device_dst, int byte_value, size_t bytes, void* stream = nullptr);
void synchronize();  // the whole device; throws on a pending asynchronous error
void stream_synchronize(void* stream);
int multiprocessor_count();
int compute_capability();  // major * 10 + minor of the current device
size_t l2_cache_bytes();
// How many copies of a weight of `bytes` cover 3x the L2 cache (1 to 32): benchmarks replay a
// GEMM round-robin over them, so each launch streams its weights from device memory as in a
// forward pass instead of finding them in L2.
int weight_copies_beyond_l2(size_t bytes);
// Whether kernels launch with programmatic dependent launch: sm_90+, and QSPEC_NO_PDL unset
// unless set_pdl_enabled overrode it (tests and benchmarks compare both in one process; graphs
// keep the setting they were captured with).
bool pdl_enabled();
void set_pdl_enabled(bool enabled);

// Deterministic pseudo-random device data (synthetic weights for benchmarks): uniform u32
// words, and f16 values uniform in [lo, hi).
void fill_random_u32(uint32_t* dst, size_t count, uint64_t seed, void* stream = nullptr);
void fill_random_f16(f16_bits* dst, size_t count, float lo, float hi, uint64_t seed, void* stream = nullptr);

// Bandwidth probes for the roofline: a 16-byte-vector copy kernel (bytes read + written), and a
// read-only pass (a checksum to `sink`, a device u32). bytes % 16 == 0, 16-byte aligned.
void copy_kernel(void* dst, const void* src, size_t bytes, void* stream = nullptr);
void read_kernel(const void* src, size_t bytes, uint32_t* sink, void* stream = nullptr);

// Streams and timing for benchmarks. time_replays enqueues `body` (work on the given stream)
// `batch` times into one CUDA graph (captured once, after `warmup` plain runs of body; plain
// stream launches when capture fails, e.g. a library that cannot be captured), replays it
// `reps` times and returns each replay's milliseconds from CUDA events divided by `batch`.
void* create_stream();
void destroy_stream(void* stream);
struct ReplayTimes {
  std::vector<float> ms;  // per body, one entry per replay
  bool graph = false;     // false: timed as plain stream launches
};
ReplayTimes time_replays(const std::function<void(void* stream, int index)>& body, int batch, int warmup, int reps,
                         void* stream);
std::string device_name();

// Brackets the region a profiler started with --profile-from-start off collects (ncu).
void profiler_start();
void profiler_stop();

// Free and total device memory (cudaMemGetInfo) of the current device.
struct MemoryInfo {
  size_t free_bytes = 0, total_bytes = 0;
};
MemoryInfo memory_info();

// A captured CUDA graph: what `body` enqueues on `stream` (thread-local capture), replayed with
// launch(). Kernel parameters are frozen at capture: inputs must live in device buffers that
// the caller rewrites between launches. Move-only.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // Throws qspec::Error when capture or instantiation fails (the stream is usable afterwards).
  static Graph capture(void* stream, const std::function<void()>& body);
  void launch(void* stream) const;
  bool valid() const { return exec_ != nullptr; }

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};

// Page-locked host memory (async copies from it can overlap and be captured). Move-only.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(size_t bytes);
  ~PinnedMemory();
  PinnedMemory(PinnedMemory&& other) noexcept;
  PinnedMemory& operator=(PinnedMemory&& other) noexcept;
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};
void copy_to_device_async(void* device_dst, const void* host_src, size_t bytes, void* stream);
void copy_to_host_async(void* host_dst, const void* device_src, size_t bytes, void* stream);

// A point of a stream the host can wait for (a CUDA event without timing): what lets the host
// reuse a pinned staging buffer once the copy out of it has run, without waiting for the work
// queued after that copy.
class StreamFence {
 public:
  StreamFence();
  ~StreamFence();
  StreamFence(const StreamFence&) = delete;
  StreamFence& operator=(const StreamFence&) = delete;
  void record(void* stream);
  void wait();  // returns at once before the first record

 private:
  void* event_ = nullptr;
};

// Elapsed device time between two points of a stream (CUDA events), for benchmarks.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(void* stream);
  float stop_ms(void* stream);  // records the end, waits for it, returns milliseconds

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

// cuBLAS handle (one per thread that issues GEMMs). Opaque: cublas_v2.h stays in ops/cuda.
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  void* handle() const { return handle_; }  // cublasHandle_t

 private:
  void* handle_ = nullptr;
  // Its own workspace, so GEMMs captured into a CUDA graph never allocate.
  void* workspace_ = nullptr;
};

// ---- elementwise ops ------------------------------------------------------------------

// out[t, :] = table[ids[t], :], table [vocab, dim] f16. An id outside [0, vocab) gives a row
// of zeros (the host validates token ids; the kernel never reads out of bounds).
void embedding(const int32_t* ids, int64_t tokens, const f16_bits* table, int64_t vocab, int64_t dim,
               f16_bits* out, void* stream);

// y = x / sqrt(mean(x^2) + eps) * weight per row: x, y f16 [rows, dim]; weight f32 [dim];
// statistics in f32 (cpu::rmsnorm). y may alias x.
void rmsnorm(const f16_bits* x, const float* weight, int64_t rows, int64_t dim, float eps, f16_bits* y,
             void* stream);
// Fused residual add + RMSNorm: residual = f16(residual + delta) (stored back), then
// y = rmsnorm(residual). One pass over both inputs.
void add_rmsnorm(f16_bits* residual, const f16_bits* delta, const float* weight, int64_t rows, int64_t dim,
                 float eps, f16_bits* y, void* stream);

// Rotary embedding in place, cpu::rope's convention (rotate_half: pair (i, i + head_dim/2)
// rotated by positions[t] * inv_freq[i], cos and sin times attention_scaling). x: f16
// [tokens, row_stride] holding `heads` heads of head_dim from its start (row_stride lets q and
// k be rotated inside a fused qkv row). inv_freq: f32 [head_dim / 2], device.
void rope(f16_bits* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
          const int32_t* positions, const float* inv_freq, float attention_scaling, void* stream);

// What the caller launches next on the stream, when that changes how a small kernel is best
// launched: before a W4A16 GEMM it lets the GEMM launch before it waits on its own predecessor
// (pdl_prologue in common.h), so the GEMM's weight loads start earlier. Outputs are the same.
enum class NextKernel { other, w4a16_gemm };

// out[r, i] = silu(gate[r, i]) * up[r, i] for i < cols, gate/up rows `in_stride` apart (a fused
// gate_up row: gate = row, up = row + cols, in_stride = 2 * cols); out rows `out_stride` apart
// (0: cols; columns cols .. out_stride - 1 are not written), f16.
void silu_mul(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride,
              f16_bits* out, void* stream, NextKernel next = NextKernel::other, int64_t out_stride = 0);

// out = a + b elementwise (f16, f32 add, one rounding). out may alias a or b.
void add(const f16_bits* a, const f16_bits* b, int64_t count, f16_bits* out, void* stream);

// ids[r] = argmax over logits row r (lowest id wins ties, as Sampler::argmax). NaNs are never
// chosen (the sampler rejects NaN logits); a row with no finite maximum gives 0.
void argmax_f32(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, void* stream);
void argmax_f16(const f16_bits* logits, int64_t rows, int64_t vocab, int32_t* ids, void* stream);

// Sampling on the device: one logit row's parameters (SamplingParams as plain numbers, plus the
// request generator's uniform draw in [0, 1), Sampler::next_draw).
struct SampleRowParams {
  int32_t row = 0;                 // which row of `logits`
  int32_t top_k = 0;               // 0 (or >= vocab): off
  float temperature = 0.0f;        // <= 0: greedy (argmax of the penalised scores)
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // 1: off
  double draw = 0.0;
  int32_t penalty_offset = 0;      // the row's penalised ids: penalty_ids[offset .. offset + count),
  int32_t penalty_count = 0;       // in [0, vocab); repeats allowed (a bitmap applies each id once)
};
static_assert(sizeof(SampleRowParams) == 40, "SampleRowParams is copied to the device as is");
// ids[i] = the token Sampler::sample_with_draw picks from row params[i].row of `logits` (f16
// [rows, vocab]) with the params' draw: the repetition penalty, temperature, top_k, top_p and
// min_p filters and the draw over the kept tokens in id order, with ties ranked by lower id.
// Masses are summed in 2^-44 fixed point (deterministic, whatever the thread order), so a token
// can differ from the CPU's only where the draw or a filter falls within ~1e-9 of a boundary.
// A row holding a NaN (not greedy) gives -1, as the CPU sampler refuses it; a row whose maximum
// is not finite gives its argmax. params, penalty_ids, ids: device. One block a row.
void sample_logits_f16(const f16_bits* logits, int64_t vocab, const SampleRowParams* params, int64_t count,
                       const int32_t* penalty_ids, int32_t* ids, void* stream);

// A chained greedy decode step's inputs from the last one's outputs, on the device (QSpec drafts
// without a host round trip): for r < runs, chain_ids[r] = out_ids[r]; with `advance` also
// ids[r] = out_ids[r], positions[r] += 1, context_lens[r] += 1 (one token a run).
void advance_decode_inputs(const int32_t* out_ids, int64_t runs, int32_t* ids, int32_t* positions,
                           int32_t* context_lens, int32_t* chain_ids, bool advance, void* stream);
// A verify step's draft tokens from the device (QSpec without a host read between drafting and
// verifying): for each of `count` entries (first, offset, stride, n) of `entries` (int32 x 4, on
// the device), ids[first + i] = chain[offset + i * stride] for i < n.
void scatter_chain_drafts(const int32_t* chain, const int32_t* entries, int64_t count, int32_t* ids, void* stream);

// ---- paged attention ------------------------------------------------------------------

// K/V pool of one layer: f16 [num_blocks, kKvBlockSize, num_kv_heads * head_dim]. Position p
// of sequence s lives in block block_tables[s * max_blocks_per_seq + p / kKvBlockSize], row
// p % kKvBlockSize.
inline constexpr int kKvBlockSize = 16;

struct PagedKv {
  f16_bits* k_pool = nullptr;
  f16_bits* v_pool = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], device
  int64_t max_blocks_per_seq = 0;
};

// A batch of query runs: sequence s owns tokens query_start[s] .. query_start[s + 1] - 1 of
// q / out (device arrays), token t sits at positions[t] and attends causally to positions
// 0..positions[t] of its sequence's cache (within the sliding window when set). The host
// values size the grid: num_tokens = query_start[num_seqs], max_query_len >= every run's
// length, max_context > every position.
struct QueryBatch {
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  const int32_t* query_start = nullptr;  // [num_seqs + 1]
  const int32_t* positions = nullptr;    // [tokens]
  int64_t max_query_len = 0;
  int64_t max_context = 0;
};

// Writes new K/V rows (after RoPE) of every token of the batch into the pool at the token's
// position (overwriting what was there: QSpec's verify overwrites its drafts' entries).
// k / v: f16 [tokens, *] with rows row_stride apart, num_kv_heads * head_dim values each.
void paged_kv_write(const f16_bits* k, const f16_bits* v, int64_t row_stride, const QueryBatch& batch,
                    const PagedKv& kv, int64_t num_kv_heads, int64_t head_dim, void* stream);

// rope on the q and k heads of fused qkv rows ([tokens, row_stride]: num_heads q heads, then
// num_kv_heads k heads, then the v heads), then paged_kv_write of the rotated k and the v: one
// launch where the two ops take two, bitwise the same results (the model's per-layer path).
void rope_kv_write(f16_bits* qkv, int64_t row_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                   const QueryBatch& batch, const float* inv_freq, float attention_scaling, const PagedKv& kv,
                   void* stream);

// Scratch for split-K attention (partial outputs + softmax statistics), bytes for `rows`
// = tokens * num_heads query rows. The launchers need at least this much workspace when they
// split (they decide; pass the size from here for the largest batch you run).
size_t attention_workspace_bytes(int64_t tokens, int64_t num_heads, int64_t head_dim, int64_t max_context);
// Zeroes the workspace's arrival counters: once after allocating it (the launches leave them
// zero), before the first attention launch that uses it.
void attention_workspace_init(void* workspace, size_t bytes, void* stream);

// Which decode attention kernel paged_attention_decode launches: mma (the tiles kernel with its
// scores and P V on tensor cores, head_dim 64 and 128; tiles at head_dim 32), tiles (each
// block's keys and values of two tiles in flight at once, scores and P V in f32 FMAs), chunked
// (the earlier kernel: keys, then values, 32 at a time) or automatic (the default: mma, which
// runs the f32 tiles at head_dim 32).
// QSPEC_DECODE_ATTENTION=automatic|mma|tiles|chunked picks it for a process; set_decode_attention
// overrides both (tests and benchmarks compare them in one run).
enum class DecodeAttention { tiles, chunked, mma, automatic };
DecodeAttention decode_attention();
void set_decode_attention(DecodeAttention kernel);

// Decode: one query per sequence (q, out: [num_seqs, num_heads * head_dim] rows q_stride /
// out_stride apart), sequence s attends to its context_lens[s] cached positions (the query
// sits at position context_lens[s] - 1). GQA, head_dim 32/64/128, flash-decoding split-K over
// the context when the batch alone does not fill the GPU. Scores scaled by 1/sqrt(head_dim).
void paged_attention_decode(const f16_bits* q, int64_t q_stride, int64_t num_seqs, const int32_t* context_lens,
                            int64_t max_context, const PagedKv& kv, const cpu::AttentionShape& shape,
                            f16_bits* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                            void* stream);

// Decode with RoPE and the new token's K/V write folded in: bitwise rope_kv_write, then
// paged_attention_decode on the rotated rows. qkv: each sequence's token as unrotated [q heads,
// k heads, v heads] rows qkv_stride apart; batch: one token a sequence (query_start[s] = s), at
// batch.positions[s] = context_lens[s] - 1, batch.max_context the largest context. The tiles
// kernel does it in one launch and leaves qkv as it was; with the chunked kernel, or
// QSPEC_DECODE_ROPE=separate, it runs the two launches, which rotate qkv in place. The one
// launch reads context_lens, the block tables and the cache's earlier positions before its
// grid-dependency wait (PDL, common.h): the kernel before it on the stream must not write them
// (in a decode step the host or the draft chain's input update does, before the first layer).
void paged_attention_decode_rope(f16_bits* qkv, int64_t qkv_stride, const QueryBatch& batch,
                                 const int32_t* context_lens, const float* inv_freq, float attention_scaling,
                                 const PagedKv& kv, const cpu::AttentionShape& shape, f16_bits* out,
                                 int64_t out_stride, void* workspace, size_t workspace_bytes, void* stream);
// Whether paged_attention_decode_rope runs one launch: QSPEC_DECODE_ROPE (folded, the default,
// or separate) and the tiles kernel selected.
bool decode_rope_folded();

// Multi-query (prefill, QSpec verify): every token of the batch attends causally to its
// sequence's cache, which must already hold positions 0..max position of the run (write the
// run's own K/V first with paged_kv_write). FlashAttention-2 tiling on f16 mma.sync; query
// rows of one KV head (tokens x GQA group) share each K/V tile; split-K over the context for
// short runs over long caches. q / out: [tokens, num_heads * head_dim], rows q_stride / out_stride apart.
void paged_attention_prefill(const f16_bits* q, int64_t q_stride, const QueryBatch& batch, const PagedKv& kv,
                             const cpu::AttentionShape& shape, f16_bits* out, int64_t out_stride,
                             void* workspace, size_t workspace_bytes, void* stream);

// ---- GEMMs ----------------------------------------------------------------------------

// 4-bit weights on the device in the layout of ops/w4a16_pack.h (see there), viewed.
struct W4A16Weights {
  const void* codes = nullptr;   // packed codes, ceil(n/16) * k * 8 bytes
  const void* scales = nullptr;  // packed f16 scale pairs, ceil(n/16) * (k/group) * 8 * 4 bytes
  int64_t n = 0, k = 0;
  int64_t group = 0;  // 32, 64 or 128
  // Optional bit-plane copy of the codes (ops/w4_bitplanes.h) for the Bitwise strategy.
  const void* bitplanes = nullptr;
};

// small_m: kernels/w4a16_small_m.cuh (few tokens); tiled: kernels/w4a16_tiled.cuh (tens to
// hundreds of tokens); dequant_cublas: dequantize to f16 scratch, then cuBLAS.
enum class W4A16Path { automatic, small_m, dequant_cublas, tiled };

// Workspace a W4A16 GEMM of this size may use: split-K partials and counters for the small-M
// and tiled kernels, or the dequantized f16 weights for the cuBLAS path (n * k * 2 bytes). The counters
// must start zeroed: allocate, then call w4a16_workspace_init once (each launch leaves them zero).
size_t w4a16_workspace_bytes(int64_t m, int64_t n, int64_t k, W4A16Path path = W4A16Path::automatic);
void w4a16_workspace_init(void* workspace, size_t bytes, void* stream);
// The path `automatic` takes for m tokens (small_m up to a measured M threshold: 16 tokens where
// the preload kernel runs, 8 elsewhere; tiled, then dequantize + cuBLAS).
W4A16Path w4a16_choose_path(int64_t m, int64_t n, int64_t k);

// y[m, n] = x[m, k] (f16, rows ldx apart, ldx % 8 == 0, 16-byte aligned) * W^T, f16 out
// (rows ldy apart), f32 accumulation.
void w4a16_gemm(const Blas& blas, const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y,
                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                W4A16Path path = W4A16Path::automatic);

// Tuning knob for benchmarks: the small-M kernel variant (0 = the default: 5 where it runs, else 1; 1 = 4 warps
// x 2 row blocks, depth 4 register ring; 2 = 8 warps x 1 row block, depth 8; 3 / 4 = the
// shared-memory cp.async ring, 8 stages of 2 chunks / 4 stages of 4, for m <= 32 a launch) and
// the split-K override (0 = heuristic); 5 = the bulk-copy preload kernel (sm_90a, slices of up to
// 16 tokens; beyond, variant 1): each warp's weights through a shared-memory ring of one slot (two
// at one token; QSPEC_W4A16_PRELOAD_KB), the first slots requested before the programmatic-launch wait.
// docs/perf-journal/perf-notes-journal-2026.md has the timings.
// x_staging (variants 1 / 2): 0 = the default (shared memory beyond 8 tokens a launch slice,
// docs/perf-journal/perf-notes-journal-2026.md), 1 = the block copies its k range of x into shared memory first, 2 = x
// straight from global memory (through L1).
struct W4A16SmallMConfig {
  int variant = 0;
  int splits = 0;
  int x_staging = 0;
  // int8 activations only: ADAngel's Split strategy (kernels/w4_activation.cuh ActS8Split), the
  // same output at twice the mma work.
  bool split_activations = false;
  // Variant 5 only: warps of a block that share a row block, each a part of its k range, summed
  // in shared memory (1, 2, 4 or 8; 0: planned, kernels/w4a16_preload.cuh). Bitwise the
  // register-ring kernel with k_slices x splits splits when splits is 1.
  int k_slices = 0;
};
// Whether small-M variant 5 (preload) can run these weights on this device and build.
bool w4a16_preload_supported(const W4A16Weights& w);
// Whether the preload kernel runs on this device and build at all (sm_90a).
bool w4a16_preload_runs_here();
// SwiGLU in the gate_up GEMM's epilogue (kernels/w4a16_preload.cuh, SWIGLU): w holds gate's rows
// [0, n / 2) then up's [n / 2, n); act[t, i] = silu(y[t, i]) * y[t, n / 2 + i] for i < n / 2, act
// rows ld_act apart (columns past n / 2 untouched), with y = x w^T rounded to f16 as w4a16_gemm
// stores it: the bits of w4a16_gemm_small_m (variant 5, one split, the k slices of
// w4a16_swiglu_k_slices: the planned ones, at most 4) then silu_mul, one launch and no y. It runs
// 1-16 tokens with n % 32 == 0 where the preload kernel does (sm_90a, w4a16_swiglu_runs); it
// throws elsewhere. Whether a GEMM's dispatcher would run that same partition anyway:
// w4a16_small_m_swiglu_partition, or qspec::w4_gemm_takes_swiglu_epilogue.
bool w4a16_swiglu_runs(const W4A16Weights& w, int64_t m);
// The k slices a block of w4a16_gemm_swiglu's launch has (1, 2 or 4) for these weights and tokens.
int w4a16_swiglu_k_slices(const W4A16Weights& w, int64_t m, const void* workspace, size_t workspace_bytes);
// Whether w4a16_gemm_small_m(config) would run these m tokens (at most 16) as one preload launch
// of one split and at most 4 k slices, the partition w4a16_gemm_swiglu runs: the same variant
// choice and the same plan as the launch itself.
bool w4a16_small_m_swiglu_partition(const W4A16Weights& w, int64_t m, const W4A16SmallMConfig& config,
                                    const void* workspace, size_t workspace_bytes);
void w4a16_gemm_swiglu(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* act, int64_t ld_act,
                       void* workspace, size_t workspace_bytes, void* stream);
void w4a16_gemm_small_m(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y,
                        int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                        const W4A16SmallMConfig& config = {});
// Tuning knob for benchmarks: the tiled kernel's tile (0 = chosen by m; 1 = 256 weight rows x
// 64 tokens, 8 warps; 2 = 128 x 64, 4 warps; 3 = 256 x 32, 8 warps; 4 = 128 x 128, 8 warps;
// 5 = 128 x 64 on wgmma, 2 warpgroups, f16 activation values on sm_90a only
// (w4a16_wgmma_tile_runs_here), the others' bits; 6 = 128 x 32, 4 warps, two blocks a
// multiprocessor; any m runs, in M tiles) and the split-K
// override (0 = heuristic: fill the GPU once). Tiles 2 and 6 run f16 activations of at most 32
// tokens with at most 2048 k a split as 8 warps of 16 rows instead of 4 of 32 (the same bits).
struct W4A16TiledConfig {
  int tile = 0;
  int splits = 0;
};
inline constexpr int kW4A16TiledTiles = 6;  // tiles 1 .. kW4A16TiledTiles
inline constexpr int kW4A16WgmmaTile = 5;
inline constexpr int kW4A16Tile128x32 = 6;  // the default at 17-32 tokens where two blocks fit a multiprocessor
bool w4a16_wgmma_tile_runs_here();
std::string w4a16_tiled_tile_name(int tile);  // "256x64" (rows x tokens) for tile 1, ...
// The warps a block of the kernel w4a16_gemm_tiled(config) runs for these m >= 1 tokens (tests:
// the 8-warp forms of tiles 2 and 6).
int w4a16_tiled_warps(const W4A16Weights& w, int64_t m, const W4A16TiledConfig& config, const void* workspace,
                      size_t workspace_bytes);
void w4a16_gemm_tiled(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                      void* workspace, size_t workspace_bytes, void* stream, const W4A16TiledConfig& config = {});
// SwiGLU in the tiled kernel's epilogue (kernels/w4a16_tiled.cuh, SWIGLU), for gate_up weights as
// in w4a16_gemm_swiglu: act[t, i] = silu(y[t, i]) * y[t, n / 2 + i] for i < n / 2 (act rows ld_act
// apart, columns past n / 2 untouched), the bits of w4a16_gemm_tiled with config's tile (0: the
// one it would choose) in one split then silu_mul, one launch and no y. Any m, n % 32 == 0, tiles
// 1, 2, 3 and 6 (each warp takes row blocks in gate / up pairs; not 128x128 or the wgmma tile 5);
// config.splits must be 0 or 1.
void w4a16_gemm_tiled_swiglu(const f16_bits* x, int64_t m, int64_t ldx, const W4A16Weights& w, f16_bits* act,
                             int64_t ld_act, void* stream, const W4A16TiledConfig& config = {});
// Whether w4a16_gemm_tiled(config) would run these m f16 tokens on a tile with a SwiGLU epilogue in one split
// (the same plan as the launch itself), n % 32 == 0: then w4a16_gemm_tiled_swiglu gives its bits.
bool w4a16_tiled_swiglu_partition(const W4A16Weights& w, int64_t m, const W4A16TiledConfig& config,
                                  const void* workspace, size_t workspace_bytes);
// The packed weights dequantized to f16 [n, k] row-major (the cuBLAS path's first half).
void w4a16_dequantize(const W4A16Weights& w, f16_bits* out, void* stream);

// ---- tensor-core ceilings (benchmarks) ----------------------------------------------------

// The measured mma.sync throughput of one operand type over the whole GPU, TOP/s (s8:
// m16n8k32 s8 -> s32; f16: m16n8k16 f16 -> f32), from a kernel that keeps 8 independent mma
// chains a warp and 8 blocks of 256 threads a multiprocessor busy; median of 9 timed launches.
enum class MmaType { s8, f16, e4m3 };  // e4m3: m16n8k32 e4m3 -> f32, compute capability 8.9+
double mma_sync_peak_tops(MmaType type, void* stream);
// The same for Hopper's warpgroup mma (m64n128k32 s8 -> s32, operands in shared memory, two
// warpgroups a block, two blocks a multiprocessor). sm_90a builds on compute capability 9.0 only.
double wgmma_s8_peak_tops(void* stream);

// cuBLAS's int8 GEMM, c[m, n] = a[m, k] b[n, k]^T in int32 (row-major, k % 4 == 0): the library
// baseline of the W4A8 GEMM at large M (it has no group scales, so it bounds what an int8
// tensor-core GEMM of the shape costs on this GPU).
void gemm_s8_cublas(const Blas& blas, const int8_t* a, int64_t m, int64_t k, const int8_t* b, int64_t n, int32_t* c,
                    void* stream);

// ---- low-precision activations (W4A8) --------------------------------------------------

// Per-token int8 quantization of f16 rows: quant::quantize_row(int8, activation) bit for bit on
// the f32 value of each element (scale = amax / 127 in f32, codes clamp(rint(x / scale)) in
// [-127, 127]; a zero row: scale 0, codes 0). codes: [rows, k] int8, rows ldc bytes apart;
// scales: f32 [rows]. k, ldx, ldc multiples of 8. A row holding a NaN or an infinity gets a NaN
// scale (no throw from inside a graph; its GEMM outputs are then NaN, never argmax's pick).
void quantize_int8_rows(const f16_bits* x, int64_t rows, int64_t k, int64_t ldx, int8_t* codes, int64_t ldc,
                        float* scales, void* stream);

// rmsnorm / add_rmsnorm whose f16 output goes straight into quantize_int8_rows (the f16 row is
// never written): bitwise the two ops in sequence. dim, ldc multiples of 8.
void rmsnorm_int8(const f16_bits* x, const float* weight, int64_t rows, int64_t dim, float eps, int8_t* codes,
                  int64_t ldc, float* scales, void* stream);
void add_rmsnorm_int8(f16_bits* residual, const f16_bits* delta, const float* weight, int64_t rows, int64_t dim,
                      float eps, int8_t* codes, int64_t ldc, float* scales, void* stream);

// Quantized activations as the 4-bit-weight GEMMs read them (quantize_activations writes them):
//   int8          int8 codes, one f32 scale per token (W4A8).
//   int4          int4 codes in int8 bytes, one f32 scale per token and group of `group` k values
//                 (scales [rows][scale_ld]); group must be a multiple of the weight group (W4A4).
//   fp8 / nvfp4 / mxfp4  f16 values that are exactly element x block scale (divided by a power
//                 of two for mxfp4), one f32 scale per token that makes them the CPU's
//                 dequantized values: fp8 amax / 448, nvfp4 the token's tensor scale, mxfp4 a
//                 power of two (W4A8-fp8, W4A4-nvfp4 / mxfp4 emulated on f16 mma).
// values: rows ldx elements apart, 16-byte aligned, ldx % 16 == 0 (int8 bytes) or % 8 == 0 (f16).
struct QuantizedActivations {
  quant::Format format = quant::Format::int8;
  const void* values = nullptr;
  int64_t ldx = 0;
  const float* scales = nullptr;
  int64_t scale_ld = 0;  // int4: scales a token row
  int64_t group = 0;     // int4: k values a scale covers
  // fp8 only: the values are e4m3 codes (1 byte; what the wgmma kernel reads) instead of their
  // f16 values (exact; what the f16-mma kernels read fastest: decode and verify sizes).
  bool e4m3 = false;
};
bool quantized_activations_use_f16(quant::Format format);  // fp8 (unless e4m3 codes), nvfp4, mxfp4
// Whether x's values are f16 (else one byte each: int8 / int4 codes, e4m3 codes).
inline bool quantized_values_are_f16(const QuantizedActivations& x) {
  return quantized_activations_use_f16(x.format) && !x.e4m3;
}

// Per-token quantization of f16 rows [rows, k] (ldx apart) in `format` (int8, int4 with groups of
// `group`, fp8, nvfp4, mxfp4): quant::quantize_row(format, activation) bit for bit on the f32 value
// of each element, written as QuantizedActivations (values rows ldv elements apart, scales for int4
// rows scale_ld apart; the result's fields are filled in out). A row holding a NaN or an infinity
// gets NaN scales (no throw inside a graph; its outputs are then NaN, never argmax's pick).
// Exactness note for mxfp4: a value is exact in f16 when its block's shared exponent is at most 36
// below the row's largest (smaller blocks round in f16; they lie below f32 resolution of the row).
// ARCQuant (arc.outliers = S > 0; int4, nvfp4, mxfp4): x holds reordered rows of arc.k channels
// (gather_columns), k is the augmented width, and the last S values of each output row are the
// quantized residuals of channels arc.k - S .. arc.k - 1: quant::arc_quantize_row (concatenated
// layout) with zeros between, bit for bit.
struct ArcResidual {
  int64_t k = 0;
  int64_t outliers = 0;
};
// e4m3_codes (fp8 only): write e4m3 codes, one byte each, instead of f16 values.
QuantizedActivations quantize_activations(quant::Format format, int64_t group, const f16_bits* x, int64_t rows,
                                          int64_t k, int64_t ldx, void* values, int64_t ldv, float* scales,
                                          int64_t scale_ld, void* stream, const ArcResidual& arc = {},
                                          bool e4m3_codes = false);

// ARCQuant's channel reorder: out[r, j] = x[r, order[j]] for j < k, 0 for k <= j < width (the
// augmented columns a site's weights carry), f16 rows (x ldx, out ldo apart). order: k device int32.
void gather_columns(const f16_bits* x, int64_t rows, int64_t k, int64_t ldx, const int32_t* order, int64_t width,
                    f16_bits* out, int64_t ldo, void* stream);

// gather_columns then quantize_activations in one launch (kernels/rmsnorm_quantize.cuh): row r of
// the GEMM's input is x[r, order[j]] for j < dim and zero up to k, quantized in `format` with the
// ARC residuals (arc.k = dim); no reordered f16 row is written. Bit for bit the two ops. For an
// ARC model's sites outside a norm (o's and down's inputs). dim % 8 == 0, dim <= 24576.
QuantizedActivations gather_quantize(quant::Format format, int64_t group, const f16_bits* x, int64_t rows, int64_t dim,
                                     int64_t ldx, const int32_t* order, int64_t k, void* values, int64_t ldv,
                                     float* scales, int64_t scale_ld, void* stream, const ArcResidual& arc = {},
                                     bool e4m3_codes = false);

// The fused activation quantizer of a 4-bit GEMM's input (kernels/rmsnorm_quantize.cuh): residual
// += delta (when delta is not null; stored back), RMSNorm with `weight` rounded to f16, ARCQuant's
// channel reorder (when order is not null: the GEMM's input row is out[j] = normed[order[j]] for
// j < dim, zeros up to k), and the quantization of that row in `format` with the ARC residuals
// (arc.outliers > 0, arc.k = dim), in one launch that writes no f16 row. Bit for bit
// [add_]rmsnorm, then gather_columns, then quantize_activations (every format of the latter, int8
// included; ARC as there). dim % 8 == 0, dim <= 24576 (the normalized row is staged in shared
// memory). rows x k values ldv elements apart; the result as quantize_activations returns it.
QuantizedActivations rmsnorm_quantize(quant::Format format, int64_t group, f16_bits* residual, const f16_bits* delta,
                                      const float* weight, int64_t rows, int64_t dim, float eps, const int32_t* order,
                                      int64_t k, void* values, int64_t ldv, float* scales, int64_t scale_ld,
                                      void* stream, const ArcResidual& arc = {}, bool e4m3_codes = false);

// y[m, n] = f16(sum over groups of s_w[n, group] * s_x * (sum over the group of x[m, k] q_w[n, k]))
// with the W4A16 packed weights (one 4-bit weight set for every mode) and quantized activations:
// each group's sum exact on s8 mma (s32) for int8 / int4 codes, f32 on f16 mma for the f16
// values (fp8, nvfp4, mxfp4), f32 on e4m3 mma for fp8's e4m3 codes (f16 mma before sm_89; on
// Hopper the weights' e4m3 conversion makes this slower than the f16 values: docs/perf-journal/perf-notes-journal-2026.md);
// s_x the token or group scale. The kernels of the W4A16 paths: automatic takes small_m
// up to 8 tokens and tiled beyond (there is no dequantize + cuBLAS path); the workspace is the
// W4A16 path's (w4a16_workspace_bytes with that path).
void w4_quantized_gemm(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                       void* workspace, size_t workspace_bytes, void* stream, W4A16Path path = W4A16Path::automatic);
// The small-M kernel (variants 1 / 2 of W4A16SmallMConfig), in slices of 64 tokens.
void w4_quantized_gemm_small_m(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                               int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                               const W4A16SmallMConfig& config = {});
// The tiled kernel (every tile of W4A16TiledConfig), any m.
void w4_quantized_gemm_tiled(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                             int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                             const W4A16TiledConfig& config = {});

// ADAngel's Bitwise strategy (kernels/w4_bitwise.cuh): int8 or int4 activations, weight groups of
// 128, k % 128 == 0 (w4_bitwise_supports), over the weights' bit-plane copy (ops/w4_bitplanes.h;
// gemm::bitplane_bytes(n, k) bytes, made by w4_bitplanes_from_packed). Any m, in slices of 8 tokens;
// the workspace is the small-M path's.
bool w4_bitwise_supports(const W4A16Weights& w, quant::Format format);
void w4_bitplanes_from_packed(const W4A16Weights& w, void* bitplanes, void* stream);
void w4_quantized_gemm_bitwise(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, const void* bitplanes,
                               f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream);

// W4A8 for many tokens (kernels/w4_s8_wide.cuh): int8 activations, k % 128 == 0, weight groups
// of 32 / 64 / 128 (w4_s8_wide_supports); the weights unpacked once per block into shared
// memory. tile 1: 128 rows x 128 tokens a block; 2: 128 x 64, two blocks a multiprocessor. Any m
// (no split-K, no workspace); bitwise the tiled kernel without split-K.
bool w4_s8_wide_supports(const W4A16Weights& w, quant::Format format);
void w4_quantized_gemm_s8_wide(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                               int64_t ldy, void* stream, int tile = 1);

// W4A8 for many tokens on Hopper's warpgroup mma, 128 x 128 tiles. int8: the register-A kernel
// (w4_s8_gemm_registers below: the packed weights unpacked in the mma threads' registers; 1.15-1.24x
// the unpack kernel + GEMM at 1024 tokens, docs/perf-journal/perf-notes-journal-2026.md), or with QSPEC_W4S8_REGISTERS=0
// (a benchmark knob) and for fp8 (kernels/w4_s8_wgmma.cuh): the packed weights unpacked to 8 bits
// in the workspace (w4_s8_wgmma_workspace_bytes: the split-K counters, then n x k bytes), then the
// GEMM on them. The workspace is required either way. Needs the sm_90a build on a compute
// capability 9.0 GPU, int8 or fp8 activations, k % 128 == 0 and weight groups of 128
// (w4_s8_wgmma_supports). int8: bit for bit the tiled kernel's output without split-K. fp8
// (W4A8-fp8, as e4m3 codes: QuantizedActivations::e4m3): the weights unpacked to e4m3 codes and
// e4m3 wgmma with f32 group sums (equal to the tiled kernel's up to the tensor cores' f32
// summation order).
bool w4_s8_wgmma_supports(const W4A16Weights& w, quant::Format format);
size_t w4_s8_wgmma_workspace_bytes(int64_t n, int64_t k);
void w4_quantized_gemm_s8_wgmma(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream);
// Its two halves (benchmarks time the GEMM alone): the weights as int8 u - 8, [ceil(n / 16) * 16][k]
// row-major; the GEMM on them. variant (benchmarks): 0 = the default, (5 ring stages, 2 groups an
// unrolled iteration, 3 of every 8 group sums converted by I2F); 1..kW4S8WgmmaVariants = (5, 2, no
// I2F), (5, 4, none), (5, 2, 2 of 8), (5, 2, 3 of 8). The unroll of 4 spills (255 registers) and runs 10-15 % slower
// (docs/perf-journal/perf-notes-journal-2026.md); (5, 8) serialized the wgmma. 5: the fused kernel's warp-specialized loop (a
// producer warpgroup for the copies, no block barrier a stage) on these weights: measured equal.
inline constexpr int kW4S8WgmmaVariants = 5;
void w4_unpack_s8(const W4A16Weights& w, int8_t* out, void* stream);
// The same as e4m3 codes of u - 8 (for fp8 activations; same layout).
void w4_unpack_e4m3(const W4A16Weights& w, uint8_t* out, void* stream);
// w8: w4_unpack_s8's output for int8 activations, w4_unpack_e4m3's for fp8 (variant 0 only).
void w4_s8_gemm_unpacked(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, const int8_t* w8, f16_bits* y,
                         int64_t ldy, void* stream, int variant = 0);
// The same GEMM with the unpack inside (kernels/w4_s8_wgmma_fused.cuh: a producer warpgroup turns
// the packed weights into the int8 / e4m3 tile in shared memory): no scratch buffer, the same bits;
// measured slower than the unpack kernel + GEMM, so w4_quantized_gemm_s8_wgmma runs it only with
// QSPEC_W4S8_FUSED=1.
// variant (benchmarks): 0 = (4 operand slots, 8 packed-weight slots, 2 groups an iteration, 3 of 8
// sums by I2F, 4 pieces a producer lane in flight); 1 = 2 pieces in flight; 2 = the mma
// warpgroups a stage out of step (int8 only); 3 = 5 operand slots (int8 only).
inline constexpr int kW4S8FusedVariants = 3;
void w4_s8_gemm_fused(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                      void* stream, int variant = 0);
// The same GEMM with the weights' A fragments built in registers (kernels/w4_s8_wgmma_rs.cuh: the
// packed weights by TMA into shared memory, each mma thread unpacks its own fragment, wgmma with
// A from registers): no scratch buffer, no int8 weight tile, the same bits; int8 activations only.
// variant (benchmarks): 0 = (4 ring stages of 24 KB, 2 groups an iteration, 3 of 8 sums by I2F);
// 1 / 2 / 3 = 3 / 5 / 6 stages; 4 / 5 / 6 = 4 / 2 / 0 of 8 sums by I2F (4 groups an iteration
// spills: 255 registers).
inline constexpr int kW4S8RegisterVariants = 6;
void w4_s8_gemm_registers(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                          void* stream, int variant = 0);
// The same GEMM with the unpack spread over the GEMM's own blocks: the blocks of a row tile unpack
// its weights into the workspace (w4_s8_wgmma_workspace_bytes, as the unpack kernel's) once,
// stage by stage, each stage by the first block to claim it, and read them by TMA when its flag
// says it is there (kernels/w4_s8_wgmma_fused.cuh, kSourceCooperative): the same bits, no separate
// unpack launch, the unpack overlapped with the mma. The flags live in the second half of the
// workspace's counter region and hold launch epochs (w4_s8_cooperative_supports: ceil(n / 128)
// (k / 128) flags must fit). Measured slower than
// the unpack kernel + GEMM (each block waits for its row tile's first stages; perf-notes), so
// w4_quantized_gemm_s8_wgmma runs it only with QSPEC_W4S8_COOPERATIVE=1.
bool w4_s8_cooperative_supports(const W4A16Weights& w);
void w4_s8_gemm_cooperative(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                            void* workspace, size_t workspace_bytes, void* stream);

// W4A8 (int8 codes rows ldx bytes apart, token scales): w4_quantized_gemm* with format int8.
inline QuantizedActivations int8_activations(const int8_t* xq, const float* x_scales, int64_t ldx) {
  return QuantizedActivations{quant::Format::int8, xq, ldx, x_scales, 0, 0};
}
inline void w4a8_gemm(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx, const W4A16Weights& w,
                      f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                      W4A16Path path = W4A16Path::automatic) {
  w4_quantized_gemm(int8_activations(xq, x_scales, ldx), m, w, y, ldy, workspace, workspace_bytes, stream, path);
}
inline void w4a8_gemm_small_m(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx, const W4A16Weights& w,
                              f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                              const W4A16SmallMConfig& config = {}) {
  w4_quantized_gemm_small_m(int8_activations(xq, x_scales, ldx), m, w, y, ldy, workspace, workspace_bytes, stream,
                            config);
}
inline void w4a8_gemm_tiled(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx, const W4A16Weights& w,
                            f16_bits* y, int64_t ldy, void* workspace, size_t workspace_bytes, void* stream,
                            const W4A16TiledConfig& config = {}) {
  w4_quantized_gemm_tiled(int8_activations(xq, x_scales, ldx), m, w, y, ldy, workspace, workspace_bytes, stream,
                          config);
}

enum class Dtype16 { f16, bf16 };
// Which kernel runs a W16A16 linear. automatic: the small-M kernel where it takes the shape
// (linear_w16_small_m_takes) unless QSPEC_W16_SMALL_M=0, else cuBLAS. small_m: that kernel or an
// error naming why not. cublas: cublasGemmEx always (the benchmarks' baseline).
enum class W16Kernel { automatic, small_m, cublas };
// W16A16: y[m, n] = x[m, k] * W[n, k]^T with f32 accumulation, x, W and y all in `dtype`, rows
// k / k / n apart.
void linear_w16(const Blas& blas, const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                uint16_t* y, Dtype16 dtype, void* stream, W16Kernel kernel = W16Kernel::automatic);
// The small-M kernel (kernels/linear_w16_small_m.cuh) takes 1-8 rows, k a multiple of 8 and
// 16-byte aligned x and W, on sm_80+.
bool linear_w16_small_m_takes(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, const uint16_t* y);
// Whether automatic picks it (QSPEC_W16_SMALL_M, default 1; read once).
bool linear_w16_small_m_default();
// Warps a 16-row block shares (1, 2, 4 or 8; QSPEC_W16_KSLICES forces one, for sweeps).
int linear_w16_small_m_k_slices(int64_t k);
// The small-M kernel itself (an error where it does not take the shape); k_slices 0: the
// launcher's choice.
void linear_w16_small_m(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, uint16_t* y,
                        Dtype16 dtype, void* stream, int k_slices = 0);

}  // namespace qspec::cuda
