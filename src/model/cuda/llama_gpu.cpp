#include "model/cuda/llama_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <tuple>

#include "base/dtype.h"
#include "base/env.h"
#include "ops/w4a16_pack.h"
#include "ops/w8a16_pack.h"
#include "gemm/cuda/gemm_dispatch.h"
#include "ops/cuda/device_info.h"
#include "ops/cuda/ops.h"
#include "ops/cuda/synthetic_w4a16.h"
#include "qspec/error.h"
#include "ops/sample.h"

namespace qspec {
namespace {

using cuda::DeviceMemory;
using cuda::f16_bits;

DeviceMemory allocate(size_t bytes, const std::string& what) {
  try {
    return DeviceMemory(std::max<size_t>(bytes, 16));
  } catch (const Error& error) {
    fail("GPU model: allocating ", what, " (", bytes, " bytes): ", error.what());
  }
}

template <typename T>
DeviceMemory upload(const std::vector<T>& host, const std::string& what) {
  DeviceMemory memory = allocate(host.size() * sizeof(T), what);
  cuda::copy_to_device(memory.get(), host.data(), host.size() * sizeof(T));
  return memory;
}

// A checkpoint matrix (bf16 or f32) as f16 rows appended to `out`. Values beyond the f16 range
// saturate (a checkpoint that needs them does not run in f16; the W16A16 greedy test would show it).
void append_f16(const WeightMatrix& weight, std::vector<f16_bits>& out) {
  std::vector<float> row(static_cast<size_t>(weight.cols));
  for (int64_t r = 0; r < weight.rows; ++r) {
    weight.row_to_f32(r, row.data());
    for (int64_t c = 0; c < weight.cols; ++c) out.push_back(f32_to_f16(row[c]));
  }
}

// ARCQuant's activations (reordered channels plus augmented residual columns).
bool is_arc(GpuActivations activations) {
  return activations == GpuActivations::int4_arc || activations == GpuActivations::nvfp4_arc ||
         activations == GpuActivations::mxfp4_arc;
}

// One projection on the device: f16 weights (cuBLAS) or packed 4-bit weights. Fused
// projections (q|k|v, gate|up) are their parts' rows stacked.
// On an ARC-calibrated model a 4-bit projection's input is reordered (site.order) and k counts
// the augmented columns too: the input has in_k = k - site.tail channels.
struct Linear {
  int64_t n = 0, k = 0, in_k = 0;
  DeviceMemory w16;            // f16 [n, k] (W16A16)
  DeviceMemory codes, scales;  // ops/w4a16_pack.h layout (W4A16); int4-asym: the f16 group minimums after the scales
  DeviceMemory bitplanes;      // ops/w4_bitplanes.h copy, only where the GEMM policy runs Bitwise
  cuda::W4A16Weights view{};
  bool quantized = false;
  ArcSite site;         // the input's ARC calibration (uncalibrated: no reorder, no tail)
  DeviceMemory order;   // site.order on the device (int32 [in_k])
  // The site's order is folded into the projection before it (down's into gate_up's rows: SwiGLU
  // is elementwise), so the input arrives reordered, rows k wide with zeros past in_k: no gather.
  bool input_ordered = false;
  bool reordered() const { return site.calibrated(); }
  // int8-group weights (the 8-bit tensors a GGUF keeps, ops/w8a16_pack.h) in codes / scales,
  // viewed by view8. They run W8A16 in every mode: their bytes are the same at any activation
  // precision, and a draft's cheaper activations pay off on the 4-bit weights.
  bool int8 = false;
  cuda::W8A16Weights view8{};
  // A fused projection whose parts differ in format (a GGUF's q / k at 4 bits beside its v at 8):
  // one Linear a run of same-format parts, each writing rows [part_row0[i], + parts[i].n) of the
  // output.
  std::vector<Linear> parts;
  std::vector<int64_t> part_row0;
  bool split() const { return !parts.empty(); }
  // Run whole by the 4-bit kernels (one W4A16Weights view: the GEMM policy, SwiGLU and packed-x
  // epilogues, the bit planes apply).
  bool four_bit() const { return quantized && !int8 && !split(); }

  size_t bytes() const {  // what a step reads
    size_t total = w16.bytes() + codes.bytes() + scales.bytes();
    for (const Linear& part : parts) total += part.bytes();
    return total;
  }
  bool has_min() const { return view.has_min(); }
};

// Calls fn on every Linear the 4-bit kernels run whole: the linear itself, or a split one's 4-bit parts.
template <typename L, typename Fn>
void for_each_four_bit(L& linear, Fn&& fn) {
  if (linear.four_bit()) fn(linear);
  for (auto& part : linear.parts)
    if (part.four_bit()) fn(part);
}
// The same for int8-group weights.
template <typename L, typename Fn>
void for_each_int8(L& linear, Fn&& fn) {
  if (linear.int8) fn(linear);
  for (auto& part : linear.parts)
    if (part.int8) fn(part);
}

Linear make_linear(std::initializer_list<const WeightMatrix*> parts, const std::string& name) {
  Linear linear;
  linear.k = (*parts.begin())->cols;
  std::vector<f16_bits> host;
  for (const WeightMatrix* part : parts) {
    QSPEC_CHECK(part->cols == linear.k, "GPU model: ", name, ": parts with different input sizes");
    linear.n += part->rows;
  }
  host.reserve(static_cast<size_t>(linear.n * linear.k));
  for (const WeightMatrix* part : parts) append_f16(*part, host);
  linear.w16 = upload(host, name);
  linear.in_k = linear.k;
  return linear;
}

// Rows order[0], order[1], ... of m (each row is quantized on its own, so this is exact).
QuantizedMatrix permute_rows(const QuantizedMatrix& m, const std::vector<int32_t>& order) {
  QSPEC_CHECK(static_cast<int64_t>(order.size()) == m.rows, "GPU model: ", m.name, ": a row order of ", order.size(),
              " for ", m.rows, " rows");
  QuantizedMatrix out = m;
  auto permute = [&](const auto& from, auto& to) {
    if (from.empty()) return;
    const size_t width = from.size() / static_cast<size_t>(m.rows);
    for (size_t j = 0; j < order.size(); ++j)
      std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(order[j]) * width), width,
                  to.begin() + static_cast<std::ptrdiff_t>(j * width));
  };
  permute(m.codes, out.codes);
  permute(m.scales, out.scales);
  permute(m.block_scale_values, out.block_scale_values);
  permute(m.block_min_values, out.block_min_values);
  permute(m.tensor_scale_values, out.tensor_scale_values);
  permute(m.decoded, out.decoded);
  return out;
}

// int8-group parts (ops/w8a16_pack.h) stacked as make_linear stacks 4-bit ones.
Linear make_int8_linear(std::span<const QuantizedMatrix* const> parts, const std::string& name) {
  Linear linear;
  linear.quantized = true;
  linear.int8 = true;
  std::vector<int8_t> codes;
  std::vector<float> scales;
  int64_t group = 0;
  for (const QuantizedMatrix* part : parts) {
    const gemm::W8A16Packed packed = gemm::pack_w8a16(*part);
    if (linear.n == 0) {
      linear.k = packed.k;
      group = packed.group;
    }
    QSPEC_CHECK(packed.k == linear.k && packed.group == group, "GPU model: ", name,
                ": 8-bit parts with different input sizes or groups");
    QSPEC_CHECK(parts.size() == 1 || packed.n % 16 == 0, "GPU model: ", name, ": ", part->name, " has ", packed.n,
                " rows; fused projections need multiples of 16");
    linear.n += packed.n;
    codes.insert(codes.end(), packed.codes.begin(), packed.codes.end());
    scales.insert(scales.end(), packed.scales.begin(), packed.scales.end());
  }
  linear.codes = upload(codes, name + " codes");
  linear.scales = upload(scales, name + " scales");
  linear.view8 = {linear.codes.get(), linear.scales.as<float>(), linear.n, linear.k, group};
  linear.in_k = linear.k;
  return linear;
}

Linear make_linear(std::span<const QuantizedMatrix* const> parts, const std::string& name, const ArcSite& site = {});
Linear make_linear(std::initializer_list<const QuantizedMatrix*> parts, const std::string& name,
                   const ArcSite& site = {}) {
  return make_linear(std::span<const QuantizedMatrix* const>(parts.begin(), parts.size()), name, site);
}

// A projection with int8-group parts: one Linear a run of same-format parts (split when the
// formats mix), each run's rows at their offset of the output.
Linear make_mixed_linear(std::span<const QuantizedMatrix* const> parts, const std::string& name,
                         const ArcSite& site) {
  QSPEC_CHECK(!site.calibrated(), "GPU model: ", name,
              ": ARC calibration of a projection with int8-group (8-bit) weights is not on the GPU");
  auto is_int8 = [](const QuantizedMatrix* m) { return m->format.format == quant::Format::int8_group; };
  std::vector<Linear> runs;
  std::vector<int64_t> row0;
  int64_t rows = 0;
  for (size_t begin = 0; begin < parts.size();) {
    size_t end = begin + 1;
    while (end < parts.size() && is_int8(parts[end]) == is_int8(parts[begin])) ++end;
    const auto run = parts.subspan(begin, end - begin);
    QSPEC_CHECK(parts.size() == 1 || std::all_of(run.begin(), run.end(), [](auto* m) { return m->rows % 16 == 0; }),
                "GPU model: ", name, ": fused projections need multiples of 16 rows");
    runs.push_back(is_int8(parts[begin]) ? make_int8_linear(run, name) : make_linear(run, name));
    row0.push_back(rows);
    rows += runs.back().n;
    begin = end;
  }
  if (runs.size() == 1) return std::move(runs.front());
  Linear linear;
  linear.quantized = true;
  linear.n = rows;
  linear.k = linear.in_k = runs.front().k;
  for (const Linear& run : runs)
    QSPEC_CHECK(run.k == linear.k, "GPU model: ", name, ": parts with different input sizes");
  linear.parts = std::move(runs);
  linear.part_row0 = std::move(row0);
  return linear;
}

// Packed rows come in blocks of 16, so parts stack by concatenating their packed bytes when
// each has a multiple of 16 rows (true of every Llama/Qwen/Mistral shape).
Linear make_linear(std::span<const QuantizedMatrix* const> parts, const std::string& name, const ArcSite& site) {
  if (std::any_of(parts.begin(), parts.end(),
                  [](const QuantizedMatrix* m) { return m->format.format == quant::Format::int8_group; }))
    return make_mixed_linear(parts, name, site);
  Linear linear;
  linear.quantized = true;
  std::vector<uint8_t> codes;
  std::vector<uint32_t> scales, mins;
  int64_t group = 0;
  bool has_min = false, zero_codes = false;
  for (const QuantizedMatrix* part : parts) {
    const gemm::W4A16Packed packed = gemm::pack_w4a16(*part);
    if (linear.n == 0) {
      linear.k = packed.k;
      group = packed.group;
      has_min = packed.has_min();
      zero_codes = packed.zero_codes;
    }
    QSPEC_CHECK(packed.k == linear.k && packed.group == group && packed.has_min() == has_min &&
                    packed.zero_codes == zero_codes,
                "GPU model: ", name,
                ": parts with different input sizes, groups or weight formats");
    QSPEC_CHECK(parts.size() == 1 || packed.n % 16 == 0, "GPU model: ", name, ": ", part->name, " has ", packed.n,
                " rows; fused projections need multiples of 16");
    linear.n += packed.n;
    codes.insert(codes.end(), packed.codes.begin(), packed.codes.end());
    scales.insert(scales.end(), packed.scales.begin(), packed.scales.end());
    mins.insert(mins.end(), packed.mins.begin(), packed.mins.end());
  }
  const size_t scale_words = scales.size();
  scales.insert(scales.end(), mins.begin(), mins.end());  // int4-asym / int4-zp: minimums / zero words follow the scales
  linear.codes = upload(codes, name + " codes");
  linear.scales = upload(scales, name + " scales");
  linear.view = {linear.codes.get(), linear.scales.get(), linear.n, linear.k, group};
  if (has_min) linear.view.mins = linear.scales.as<uint32_t>() + scale_words;
  linear.view.zero_codes = zero_codes;
  linear.in_k = linear.k - site.tail;
  if (site.calibrated()) {
    QSPEC_CHECK(static_cast<int64_t>(site.order.size()) == linear.in_k && linear.in_k % 8 == 0, "GPU model: ", name,
                ": ARC channel order of ", site.order.size(), " for ", linear.in_k, " input channels (a multiple of 8)");
    linear.site = site;
    linear.order = upload(site.order, name + " channel order");
  }
  return linear;
}

// From how many rows the reorder and quantizer of an ARC site run as one launch
// (cuda::gather_quantize) instead of two: measured 6 % faster TTFT at 1024 tokens, and -4 to +3 %
// on decode steps of 1-64 rows, where one block a row is a longer chain than the two launches
// PDL overlaps (docs/perf-journal/perf-notes-journal-2026.md). QSPEC_GATHER_QUANTIZE_MIN_ROWS, a benchmark knob.
int64_t gather_quantize_min_rows() {
  static const int64_t rows = [] {
    const char* text = std::getenv("QSPEC_GATHER_QUANTIZE_MIN_ROWS");
    if (text == nullptr || *text == '\0') return int64_t{128};
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    QSPEC_CHECK(end != text && *end == '\0' && value >= 1, "QSPEC_GATHER_QUANTIZE_MIN_ROWS: '", text,
                "' is not a positive integer");
    return static_cast<int64_t>(value);
  }();
  return rows;
}

// Random weights of the same layout, drawn on the GPU (cuda::make_synthetic_w4a16). Scales /
// values keep each output near unit size for unit-size inputs (k terms of ~4.6 scale or ~0.017),
// so 32+ layers stay finite. int4-asym / int4-zp: the same codes read as unsigned, with minimums or
// zero points that keep the values centred as int4's (a benchmark of those kernels on the same bytes).
Linear make_synthetic_linear(int64_t n, int64_t k, bool quantized, uint64_t seed, void* stream,
                             quant::Format format = quant::Format::int4, int64_t group = 128) {
  Linear linear;
  linear.n = n;
  linear.k = k;
  linear.in_k = k;
  linear.quantized = quantized;
  if (!quantized) {
    linear.w16 = allocate(static_cast<size_t>(n * k) * 2, "synthetic weights");
    cuda::fill_random_f16(linear.w16.as<f16_bits>(), static_cast<size_t>(n * k), -0.03f, 0.03f, seed, stream);
    return linear;
  }
  const float scale = 1.0f / (4.6f * static_cast<float>(std::max<int64_t>(1, static_cast<int64_t>(std::sqrt(k)))));
  try {
    cuda::SyntheticW4A16 w = cuda::make_synthetic_w4a16(n, k, group, format, 0.5f * scale, 1.5f * scale, seed, stream);
    linear.codes = std::move(w.codes);
    linear.scales = std::move(w.scales);
    linear.view = w.view;
  } catch (const Error& error) {
    fail("GPU model: synthetic weights (", n, " x ", k, "): ", error.what());
  }
  return linear;
}

// A synthetic ARC calibration of a site with k input channels: a random channel order (the
// reorder's gather pattern of a real calibration) and `outliers` residual channels for every
// 4-bit format, in a tail rounded up to the weight group.
ArcSite synthetic_arc_site(int64_t k, int64_t outliers, int64_t weight_group, uint64_t seed) {
  QSPEC_CHECK(outliers > 0 && outliers % 32 == 0 && outliers <= k / 4, "GPU model: synthetic ARC channels ", outliers,
              " must be a positive multiple of 32 (the mxfp4 block) and at most k / 4 (k ", k, ")");
  ArcSite site;
  site.order.resize(static_cast<size_t>(k));
  std::iota(site.order.begin(), site.order.end(), 0);
  std::shuffle(site.order.begin(), site.order.end(), std::mt19937_64(seed));
  site.tail = (outliers + weight_group - 1) / weight_group * weight_group;
  site.outliers_int4 = site.outliers_nvfp4 = site.outliers_mxfp4 = outliers;
  return site;
}

// make_synthetic_linear with that calibration: k + tail packed columns, the order on the device.
Linear make_synthetic_arc_linear(int64_t n, const ArcSite& site, uint64_t seed, void* stream,
                                 quant::Format format = quant::Format::int4) {
  const int64_t in_k = static_cast<int64_t>(site.order.size());
  Linear linear = make_synthetic_linear(n, in_k + site.tail, true, seed, stream, format);
  linear.in_k = in_k;
  linear.site = site;
  linear.order = upload(site.order, "synthetic channel order");
  return linear;
}

struct Layer {
  DeviceMemory attention_norm, mlp_norm;  // f32
  // What rope_kv_write (or the decode attention) does to the qkv rows before RoPE, f32 where the
  // model has them: q|k|v biases (Qwen2), per-head q and k norms (Qwen3).
  DeviceMemory qkv_bias, q_norm, k_norm;
  // RMSNorm of the attention and MLP outputs before each residual add (Gemma 3), f32; empty: none.
  DeviceMemory attention_out_norm, mlp_out_norm;
  // The layer's RoPE (Gemma 3's sliding and full layers differ): f32 [head_dim / 2], and the scale
  // of cos / sin.
  DeviceMemory inv_freq;
  float rope_scaling = 1.0f;
  Linear qkv, o, gate_up, down;
};

// A layer's RoPE tables on the device.
void set_layer_rope(Layer& layer, const RopeTables& rope) {
  layer.inv_freq = upload(rope.inv_freq, "rope inv_freq");
  layer.rope_scaling = rope.attention_scaling;
}

// Decode graphs are captured for a context bucket: the attention launch sizes its split-K grid
// from the largest context, so one graph serves every context up to its bucket.
int64_t context_bucket(int64_t context, int64_t max_context) {
  int64_t bucket = 256;
  while (bucket < context) bucket *= 2;
  return std::min(bucket, max_context);
}

// QSPEC_VERIFY_GRAPHS=0 / 1 turns verify graphs off / on for every model, whatever
// GpuLlamaOptions::verify_graphs says (the A/B benchmark's switch); unset, the option decides.
std::optional<bool> verify_graphs_override() {
  static const std::optional<bool> override_value = env_switch("QSPEC_VERIFY_GRAPHS");
  return override_value;
}

// QSPEC_W4A16_PACKED_X=0: the kernels that make a W4A16 GEMM's x never write it in the packed k
// order (GpuLlama's reads_packed_x; A/B runs); unset or 1: where the GEMM reads it so.
bool packed_x_allowed() {
  static const bool allowed = env_switch("QSPEC_W4A16_PACKED_X").value_or(true);
  return allowed;
}

// A verify step's graph key holds its tokens a run: QSpec verifies at most kMaxChainSteps + 1
// (a longer uniform multi-token step, such as a perplexity window, runs its kernels directly).
constexpr int64_t kMaxVerifyGraphTokens = 17;

}  // namespace

struct GpuLlama::State {
  ModelConfig config;
  bool quantized = false;
  GpuActivations activations = GpuActivations::f16;
  // The attention's view of the cache in the following steps (GpuLlama::set_kv_view).
  int64_t kv_window = 0, kv_sinks = 0;
  // The cache's format (GpuLlamaOptions::kv_cache) and what the following steps read of it
  // (GpuLlama::set_kv_cache_view).
  KvCacheFormat kv_format = KvCacheFormat::f16;
  KvView kv_read = KvView::full;
  // The lm_head's vocabulary subset in the following steps (GpuLlama::set_vocab_subset; 0: all of
  // it), over draft_head: the lm_head rows of the draft vocabulary's ids (set_draft_vocab), f16
  // [draft_ids rows, hidden] like the lm_head, scored into subset_logits [max_logit_rows, rows].
  int64_t vocab_subset = 0;
  DeviceMemory draft_head, draft_ids, subset_logits;
  int64_t draft_rows = 0;
  int64_t max_seqs = 1, max_context = 0, blocks_per_seq = 0, max_step_tokens = 0, max_logit_rows = 0;
  bool cuda_graphs = true, verify_graphs = false;
  GpuLlamaOptions::Swiglu swiglu = GpuLlamaOptions::Swiglu::automatic;
  int64_t swiglu_epilogue_layers = 0;
  void* stream = nullptr;
  std::unique_ptr<cuda::Blas> blas;
  DeviceMemory embedding, final_norm;  // f16 [vocab, hidden] (LlamaModel::input_embedding rows), f32
  Linear lm_head;
  std::vector<Layer> layers;
  std::vector<DeviceMemory> k_pools, v_pools;  // a layer's K / V pool: f16 rows, or int8 planes + scales
  std::vector<cuda::Kv8Planes> k8, v8;         // int8: the planes and scales inside k_pools / v_pools
  // Layer l's cache as the kernels take it, with the view of the following steps.
  cuda::PagedKv paged_kv(size_t l, const int32_t* tables) const {
    cuda::PagedKv kv{k_pools[l].as<f16_bits>(), v_pools[l].as<f16_bits>(), tables, blocks_per_seq};
    kv.format = kv_format;
    if (kv_format == KvCacheFormat::int8) {
      kv.k_pool = kv.v_pool = nullptr;  // the f16 pointers are not rows of an int8 pool
      kv.k8 = k8[l];
      kv.v8 = v8[l];
    }
    kv.view = kv_read;
    return kv;
  }
  DeviceMemory block_tables;  // [max_seqs, blocks_per_seq]: sequence s owns blocks s * blocks_per_seq ...
  // Step inputs, one device buffer filled by one copy: ids | positions | query_start | context_lens |
  // logit_rows | run tables. The run tables ([runs, blocks_per_seq], the block-table rows of the
  // step's runs in run order) are sent only when run r is not sequence r.
  DeviceMemory inputs;
  cuda::PinnedMemory host_inputs, host_ids, host_chain_ids, host_chain_scatter;
  DeviceMemory chain_ids;      // this engine step's draft chains: chain c's ids [step][run] from its offset
  DeviceMemory chain_scatter;  // a verify step's (first token, offset, stride, count) per run
  int64_t chain_used = 0;
  cuda::StreamFence inputs_copied;  // the last copy out of host_inputs / host_chain_scatter has run
  DeviceMemory x, normed, qkv, attn, proj, gate_up, act, gathered, logits, out_ids, gemm_workspace,
      attention_workspace;
  // Quantized activations of a 4-bit GEMM's input (int8 codes or f16 values, rows x_codes_stride
  // elements apart) and their token or group scales (rows x_scales_stride apart): low-precision
  // steps only.
  DeviceMemory x_codes, x_scales;
  int64_t x_codes_stride = 0, x_scales_stride = 1;
  // ARC-calibrated models: a projection's input reordered, augmented columns zero (f16, rows
  // x_codes_stride apart).
  DeviceMemory x_reordered;
  int64_t activation_group = 0;  // int4 activations: k values a scale covers
  size_t gemm_workspace_bytes = 0, attention_workspace_bytes = 0;
  int64_t last_logit_rows = 0;
  // sample_rows: the rows' parameters, their penalised ids and the drawn ids (grown on demand).
  DeviceMemory sample_params, sample_penalty_ids, sample_ids;
  // (batch, context bucket, whether run r is sequence r, activations, kv view): graphs read the
  // block tables there.
  // A draft's diet: its KV view (window, sinks) and its vocabulary subset.
  using KvViewKey = std::tuple<int64_t, int64_t, int64_t, KvView>;
  std::map<std::tuple<int64_t, int64_t, bool, GpuActivations, KvViewKey>, cuda::Graph> decode_graphs;
  // (runs, tokens a run, context bucket, whether run r is sequence r, activations, kv view): verify steps.
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, GpuActivations, KvViewKey>, cuda::Graph> verify_graphs_by_shape;

  ~State() {
    decode_graphs.clear();
    verify_graphs_by_shape.clear();
    if (stream != nullptr) cuda::destroy_stream(stream);
  }

  int64_t qkv_width() const { return config.q_dim() + 2 * config.kv_dim(); }
  int32_t* input_ids() const { return inputs.as<int32_t>(); }
  int32_t* input_positions() const { return input_ids() + max_step_tokens; }
  int32_t* input_query_start() const { return input_positions() + max_step_tokens; }
  int32_t* input_context_lens() const { return input_query_start() + max_step_tokens + 1; }
  int32_t* input_logit_rows() const { return input_context_lens() + max_step_tokens; }
  int32_t* input_tables() const { return input_logit_rows() + max_logit_rows; }
  size_t table_offset_words() const { return static_cast<size_t>(4 * max_step_tokens + 1 + max_logit_rows); }
  int64_t max_runs() const { return std::min(max_seqs, max_step_tokens); }
  size_t input_words() const { return table_offset_words() + static_cast<size_t>(max_runs() * blocks_per_seq); }

  bool int8_step() const { return quantized && activations == GpuActivations::int8; }
  bool arc_step() const { return is_arc(activations); }
  quant::Format activation_format() const {
    switch (activations) {
      case GpuActivations::int8: return quant::Format::int8;
      case GpuActivations::int4:
      case GpuActivations::int4_arc: return quant::Format::int4;
      case GpuActivations::fp8: return quant::Format::fp8;
      case GpuActivations::nvfp4:
      case GpuActivations::nvfp4_arc: return quant::Format::nvfp4;
      case GpuActivations::mxfp4:
      case GpuActivations::mxfp4_arc: return quant::Format::mxfp4;
      case GpuActivations::f16: break;
    }
    fail("GPU model: f16 activations are not quantized");
  }
  std::shared_ptr<const gemm::PolicyMap> gemm_policy;  // null: the kernels' own crossovers
  std::string gemm_policy_source;
  // Installs a policy map: checks its GPU, makes the bit-plane weight copy of each shape whose
  // entries run Bitwise (frees the others), drops captured graphs (they baked in the old picks).
  void apply_gemm_policy(std::shared_ptr<const gemm::PolicyMap> policy) {
    if (policy && !policy->gpu.empty())
      QSPEC_CHECK(policy->gpu == cuda::device_name(), "GPU model: the GEMM policy map was tuned on ", policy->gpu,
                  ", this GPU is ", cuda::device_name(), " (run qspec tune here)");
    decode_graphs.clear();
    verify_graphs_by_shape.clear();
    gemm_policy = std::move(policy);
    for (Layer& layer : layers)
      for (Linear* whole : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
        for_each_four_bit(*whole, [&](Linear& linear) {
          const bool wanted = gemm_policy && gemm_policy->uses(gemm::Strategy::bitwise_b1, linear.n, linear.k) &&
                              cuda::w4_bitwise_supports(linear.view, quant::Format::int8);
          if (!wanted) {
            linear.bitplanes = DeviceMemory();
          } else if (linear.bitplanes.get() == nullptr) {
            linear.bitplanes = allocate(linear.codes.bytes(), "bit-plane weights (GEMM policy: Bitwise)");
            cuda::w4_bitplanes_from_packed(linear.view, linear.bitplanes.get(), stream);
          }
          linear.view.bitplanes = linear.bitplanes.get();
        });
    cuda::stream_synchronize(stream);
  }
  void w4_gemm(const W4GemmInput& input, const Linear& linear, int64_t m, f16_bits* y, int64_t ldy) {
    dispatch_w4_gemm(gemm_policy.get(), *blas, input, m, linear.view, y, ldy, gemm_workspace.get(),
                     gemm_workspace_bytes, stream);
  }
  // The ARC residual channels a calibrated site's quantized input carries in an ARC step (none
  // otherwise: the augmented columns stay zero).
  cuda::ArcResidual arc_residual(const Linear& linear) const {
    if (!linear.reordered() || !arc_step()) return {};
    return {linear.in_k, linear.site.outliers(activation_format())};
  }
  // fp8 activations go to the wgmma kernel as e4m3 codes, to every other kernel as f16 values.
  bool fp8_codes_for(const Linear& linear, int64_t m) const {
    return activations == GpuActivations::fp8 &&
           w4_fp8_gemm_takes_e4m3(gemm_policy.get(), linear.view, m, gemm_workspace_bytes);
  }
  void quantized_gemm(const cuda::QuantizedActivations& xq, const Linear& linear, int64_t m, f16_bits* y,
                      int64_t ldy = 0) {
    w4_gemm(W4GemmInput{nullptr, 0, &xq}, linear, m, y, ldy > 0 ? ldy : linear.n);
  }
  // Whether the GEMM of `linear` over m tokens reads its x in the W4A16 packed k order, so the
  // kernel making x writes it so (rmsnorm's y_packed, silu_mul's out_packed): f16 activations on
  // int4 weights in their own order, the built-in choice (no policy map, or the map names builtin
  // there) on a wgmma tile (w4_gemm_reads_packed_x). QSPEC_W4A16_PACKED_X=0: never (A/B runs).
  bool reads_packed_x(const Linear& linear, int64_t m) const {
    return packed_x_allowed() && linear.four_bit() && activations == GpuActivations::f16 && !linear.reordered() &&
           !linear.input_ordered && linear.k == linear.in_k && w4_gemm_reads_packed_x(gemm_policy.get(), linear.view, m);
  }
  // x_in: m rows of linear.in_k values, x_ld apart (0: contiguous); an input_ordered linear's rows
  // hold its k values (zeros past in_k). x_packed: x_in in the packed k order (reads_packed_x).
  // y_ld: y's row pitch (0: linear.n; a split projection's parts write their rows of a wider y).
  void gemm(const Linear& linear, const f16_bits* x_in, int64_t m, f16_bits* y, int64_t x_ld = 0,
            bool x_packed = false, int64_t y_ld = 0) {
    QSPEC_CHECK(!x_packed || reads_packed_x(linear, m), "GPU model: x in the packed order for a GEMM that reads it so only");
    if (y_ld == 0) y_ld = linear.n;
    if (linear.split()) {  // formats mixed: one GEMM a part, quantizing x (if at all) each
      for (size_t i = 0; i < linear.parts.size(); ++i)
        gemm(linear.parts[i], x_in, m, y + linear.part_row0[i], x_ld, false, y_ld);
      return;
    }
    if (linear.int8) {
      cuda::w8a16_gemm(*blas, x_in, m, x_ld > 0 ? x_ld : linear.k, linear.view8, y, y_ld, gemm_workspace.get(),
                       gemm_workspace_bytes, stream);
      return;
    }
    if (linear.input_ordered) {  // already reordered, zero tail: straight to the GEMM or its quantizer
      QSPEC_CHECK(x_ld >= linear.k, "GPU model: an input-ordered projection needs rows of ", linear.k, " values");
      if (activations == GpuActivations::f16) {
        w4_gemm(W4GemmInput{x_in, x_ld, nullptr}, linear, m, y, y_ld);
      } else {
        quantized_gemm(cuda::quantize_activations(activation_format(), activation_group, x_in, m, linear.k, x_ld,
                                                  x_codes.get(), x_codes_stride, x_scales.as<float>(),
                                                  x_scales_stride, stream, arc_residual(linear),
                                                  fp8_codes_for(linear, m)),
                       linear, m, y, y_ld);
      }
      return;
    }
    if (x_ld == 0) x_ld = linear.in_k;
    if (!linear.quantized) {
      QSPEC_CHECK(x_ld == linear.k && y_ld == linear.n, "GPU model: f16 projections take contiguous rows");
      cuda::linear_w16(*blas, x_in, m, linear.k, linear.w16.as<uint16_t>(), linear.n, y, cuda::Dtype16::f16, stream);
      return;
    }
    if (linear.reordered() && activations != GpuActivations::f16 && m >= gather_quantize_min_rows()) {
      // ARC: reorder and quantize in one launch
      quantized_gemm(cuda::gather_quantize(activation_format(), activation_group, x_in, m, linear.in_k, x_ld,
                                           linear.order.as<int32_t>(), linear.k, x_codes.get(), x_codes_stride,
                                           x_scales.as<float>(), x_scales_stride, stream, arc_residual(linear),
                                           fp8_codes_for(linear, m)),
                     linear, m, y, y_ld);
      return;
    }
    int64_t ldx = x_ld;
    if (linear.reordered()) {  // ARC (f16 activations, or few rows): reorder, augmented columns zero
      cuda::gather_columns(x_in, m, linear.in_k, x_ld, linear.order.as<int32_t>(), linear.k,
                           x_reordered.as<f16_bits>(), x_codes_stride, stream);
      x_in = x_reordered.as<f16_bits>();
      ldx = x_codes_stride;
    }
    if (activations == GpuActivations::f16) {
      w4_gemm(W4GemmInput{x_in, ldx, nullptr, x_packed}, linear, m, y, y_ld);
      return;
    }
    const cuda::QuantizedActivations xq =
        cuda::quantize_activations(activation_format(), activation_group, x_in, m, linear.k, ldx, x_codes.get(),
                                   x_codes_stride, x_scales.as<float>(), x_scales_stride, stream, arc_residual(linear),
                                   fp8_codes_for(linear, m));
    quantized_gemm(xq, linear, m, y, y_ld);
  }
  // residual += delta (when there is one), normed = rmsnorm(residual) (f16 into normed_out), then
  // the GEMM; steps with quantized activations quantize inside the norm (the f16 row is never
  // written): the reorder and ARC residuals of a calibrated site included (cuda::rmsnorm_quantize).
  void norm_then_gemm(f16_bits* residual, const f16_bits* delta, const DeviceMemory& norm, const Linear& linear,
                      int64_t tokens, f16_bits* normed_out, f16_bits* y) {
    const int64_t hidden = config.hidden_size;
    const float eps = static_cast<float>(config.rms_norm_eps);
    if (int8_step() && linear.four_bit() && !linear.reordered()) {
      auto* codes = x_codes.as<int8_t>();
      auto* scales = x_scales.as<float>();
      if (delta == nullptr)
        cuda::rmsnorm_int8(residual, norm.as<float>(), tokens, hidden, eps, codes, x_codes_stride, scales, stream);
      else
        cuda::add_rmsnorm_int8(residual, delta, norm.as<float>(), tokens, hidden, eps, codes, x_codes_stride, scales,
                               stream);
      quantized_gemm(cuda::int8_activations(codes, scales, x_codes_stride), linear, tokens, y);
      return;
    }
    if (linear.four_bit() && activations != GpuActivations::f16) {  // every other format, and ARC sites
      const cuda::QuantizedActivations xq = cuda::rmsnorm_quantize(
          activation_format(), activation_group, residual, delta, norm.as<float>(), tokens, hidden, eps,
          linear.reordered() ? linear.order.as<int32_t>() : nullptr, linear.reordered() ? linear.k : hidden,
          x_codes.get(), x_codes_stride, x_scales.as<float>(), x_scales_stride, stream, arc_residual(linear),
          fp8_codes_for(linear, tokens));
      quantized_gemm(xq, linear, tokens, y);
      return;
    }
    const bool packed = reads_packed_x(linear, tokens);
    if (delta == nullptr) cuda::rmsnorm(residual, norm.as<float>(), tokens, hidden, eps, normed_out, stream, packed);
    else cuda::add_rmsnorm(residual, delta, norm.as<float>(), tokens, hidden, eps, normed_out, stream, packed);
    gemm(linear, normed_out, tokens, y, 0, packed);
  }

  // Whether gate_up's GEMM of m tokens writes silu(gate) * up itself, and on which kernel: f16
  // activations on 4-bit weights in their own order, and (automatic) the GEMM the dispatcher would
  // run anyway is the preload kernel in one split and at most 4 k slices, or a tile of
  // the tiled kernel in one split (w4_gemm_swiglu_epilogue). `always` takes the preload kernel's
  // epilogue wherever it runs (1-16 tokens), the automatic choice elsewhere. QSPEC_SWIGLU=separate:
  // never (A/B runs).
  SwigluGemm swiglu_in_gemm(const Linear& gate_up, int64_t m) const {
    using Swiglu = GpuLlamaOptions::Swiglu;
    static const bool separate_by_env = [] {
      const char* text = std::getenv("QSPEC_SWIGLU");
      if (text == nullptr || *text == '\0') return false;
      const std::string value(text);
      QSPEC_CHECK(value == "fused" || value == "separate", "QSPEC_SWIGLU: '", value, "' is not fused or separate");
      return value == "separate";
    }();
    if (swiglu == Swiglu::never || (swiglu == Swiglu::automatic && separate_by_env)) return {};
    if (!gate_up.four_bit() || activations != GpuActivations::f16 || gate_up.reordered() || gate_up.input_ordered ||
        gate_up.in_k != config.hidden_size || config.recipe().activation != MlpActivation::silu)
      return {};  // (the GEMM epilogues compute SwiGLU only: GeGLU runs gelu_tanh_mul after the GEMM)
    if (swiglu == Swiglu::always && cuda::w4a16_swiglu_runs(gate_up.view, m))
      return SwigluGemm{SwigluGemm::Kernel::preload, {}};
    return w4_gemm_swiglu_epilogue(gemm_policy.get(), gate_up.view, m, gemm_workspace.get(), gemm_workspace_bytes);
  }

  // The layer's biases and q/k norms as the RoPE step takes them (none: an empty prologue).
  cuda::QkvPrologue prologue(const Layer& layer) const {
    cuda::QkvPrologue p;
    p.bias = layer.qkv_bias.as<float>();
    p.q_norm = layer.q_norm.as<float>();
    p.k_norm = layer.k_norm.as<float>();
    p.eps = static_cast<float>(config.rms_norm_eps);
    return p;
  }
  // The constructor's mode: weights, first activation precision, int4 activation group.
  void set_mode(const RunMode& mode) {
    quantized = mode.quantized_weights;
    activations = gpu_activations(mode);
    activation_group = quantized ? mode.activations.group_size : 0;
  }
  void allocate_runtime(const GpuLlamaOptions& options);
  // Row pitch of the SwiGLU output: the widest down k where down's ARC order is folded into
  // gate_up (the rows' zero tails are its augmented columns), else the intermediate size.
  int64_t act_stride() const {
    int64_t stride = config.intermediate_size;
    for (const Layer& layer : layers)
      if (layer.down.input_ordered) stride = std::max(stride, layer.down.k);
    return stride;
  }
  // A decode step (one token a run, inputs on the device): the graph of this batch size and
  // context bucket, captured on first use, or the kernels themselves without graphs.
  void enqueue_decode(int64_t runs, int64_t max_context_in_step, bool identity_tables, const int32_t* tables) {
    if (!cuda_graphs) {
      enqueue_forward(runs, runs, 1, max_context_in_step, true, tables, runs, false);
      return;
    }
    const int64_t bucket = context_bucket(max_context_in_step, max_context);
    auto key = std::make_tuple(runs, bucket, identity_tables, activations, KvViewKey{kv_window, kv_sinks, vocab_subset, kv_read});
    auto found = decode_graphs.find(key);
    if (found == decode_graphs.end()) {
      cuda::Graph graph =
          cuda::Graph::capture(stream, [&] { enqueue_forward(runs, runs, 1, bucket, true, tables, runs, false); });
      found = decode_graphs.emplace(key, std::move(graph)).first;
    }
    found->second.launch(stream);
  }
  // A QSpec verify step (runs of run_tokens tokens each, every token's logits, inputs on the
  // device): the graph of this shape and context bucket, captured on first use, or the kernels
  // themselves. The prefill attention takes its split count from the bucket and each query's
  // keys from its position, as the decode graphs do.
  void enqueue_verify(int64_t runs, int64_t run_tokens, int64_t max_context_in_step, bool identity_tables,
                      const int32_t* tables) {
    const int64_t tokens = runs * run_tokens;
    if (!verify_graphs || run_tokens > kMaxVerifyGraphTokens) {
      enqueue_forward(tokens, runs, run_tokens, max_context_in_step, false, tables, tokens, false);
      return;
    }
    const int64_t bucket = context_bucket(max_context_in_step, max_context);
    auto key = std::make_tuple(runs, run_tokens, bucket, identity_tables, activations, KvViewKey{kv_window, kv_sinks, vocab_subset, kv_read});
    auto found = verify_graphs_by_shape.find(key);
    if (found == verify_graphs_by_shape.end()) {
      cuda::Graph graph = cuda::Graph::capture(
          stream, [&] { enqueue_forward(tokens, runs, run_tokens, bucket, false, tables, tokens, false); });
      found = verify_graphs_by_shape.emplace(key, std::move(graph)).first;
    }
    found->second.launch(stream);
  }
  // Enqueues the forward pass of a step whose inputs are on the device. `tables`: the runs'
  // block-table rows. logit_rows: how many rows get logits (gathered at input_logit_rows unless
  // they are every token). Ends with the argmax ids in out_ids.
  void enqueue_forward(int64_t tokens, int64_t runs, int64_t max_query_len, int64_t max_context_in_step,
                       bool decode, const int32_t* tables, int64_t logit_rows, bool gather);
};

// ---- construction ----------------------------------------------------------------------

namespace {

void check_supported(const ModelConfig& c, const RunMode& mode) {
  QSPEC_CHECK(cuda::device_count() > 0, "GPU model: no CUDA GPU is visible");
  QSPEC_CHECK(cuda::compute_capability() >= 80, "GPU model: ", cuda::device_name(), " is sm_",
              cuda::compute_capability(), "; the CUDA backend needs sm_80 or newer");
  (void)gpu_activations(mode);  // throws for modes the GPU does not run
  QSPEC_CHECK(cuda::attention_head_dim_supported(c.head_dim), "GPU model: head_dim ", c.head_dim,
              " (the attention kernels take ", cuda::attention_head_dims_text(), ")");
  cuda::check_attention_runs_here(c.head_dim);  // head_dim 256's prefill needs 160 KB a block
  QSPEC_CHECK(c.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0 && c.q_dim() % 8 == 0 && c.kv_dim() % 8 == 0,
              "GPU model: hidden, intermediate and head sizes must be multiples of 8");
}

}  // namespace

GpuActivations gpu_activations(const RunMode& mode) {
  const ActivationMode& a = mode.activations;
  if (!mode.quantized_weights || a.kind != ActivationMode::Kind::quantized) {
    QSPEC_CHECK(mode.name == "w16a16" || mode.name == "w4a16", "GPU model: mode ", mode.name, " is not on the GPU");
    return GpuActivations::f16;
  }
  switch (a.format) {
    case quant::Format::int8: return GpuActivations::int8;
    case quant::Format::int4: return a.arc ? GpuActivations::int4_arc : GpuActivations::int4;
    case quant::Format::fp8: return GpuActivations::fp8;
    case quant::Format::nvfp4: return a.arc ? GpuActivations::nvfp4_arc : GpuActivations::nvfp4;
    case quant::Format::mxfp4: return a.arc ? GpuActivations::mxfp4_arc : GpuActivations::mxfp4;
    default: break;
  }
  fail("GPU model: mode ", mode.name, " has no GPU activation path");
}

void GpuLlama::State::allocate_runtime(const GpuLlamaOptions& options) {
  const ModelConfig& c = config;
  max_seqs = options.max_seqs;
  max_context = options.max_context > 0 ? options.max_context : c.max_position_embeddings;
  QSPEC_CHECK(max_seqs >= 1 && max_seqs <= 4096, "GPU model: max_seqs ", max_seqs, " outside 1..4096");
  QSPEC_CHECK(max_context >= 1 && max_context <= c.max_position_embeddings, "GPU model: max_context ", max_context,
              " outside 1..", c.max_position_embeddings);
  max_step_tokens = options.max_step_tokens > 0 ? options.max_step_tokens : std::max(max_context, max_seqs);
  max_logit_rows = options.max_logit_rows > 0 ? options.max_logit_rows : std::max<int64_t>(max_seqs * 8, 16);
  max_logit_rows = std::min(max_logit_rows, max_step_tokens);
  max_logit_rows = std::max(max_logit_rows, std::min(max_seqs, max_step_tokens));
  cuda_graphs = options.cuda_graphs;
  verify_graphs = cuda_graphs && verify_graphs_override().value_or(options.verify_graphs);
  swiglu = options.swiglu;
  if (options.gemm_policy && !options.gemm_policy->gpu.empty())
    QSPEC_CHECK(options.gemm_policy->gpu == cuda::device_name(), "GPU model: the GEMM policy map was tuned on ",
                options.gemm_policy->gpu, ", this GPU is ", cuda::device_name(), " (run qspec tune here)");
  blocks_per_seq = (max_context + cuda::kKvBlockSize - 1) / cuda::kKvBlockSize;

  // Everything below must fit next to the weights: check before allocating (a clear error at
  // load time instead of a failed allocation half way through).
  kv_format = options.kv_cache;
  const int64_t pool_blocks = max_seqs * blocks_per_seq;
  if (kv_format == KvCacheFormat::int8)
    QSPEC_CHECK(cuda::attention_head_dim_supported(c.head_dim), "GPU model: an int8 KV cache at head_dim ", c.head_dim);
  const size_t pool_bytes =
      kv_format == KvCacheFormat::int8
          ? cuda::kv8_pool_bytes(pool_blocks, c.num_kv_heads, c.head_dim)
          : static_cast<size_t>(pool_blocks * cuda::kKvBlockSize) * static_cast<size_t>(c.kv_dim()) * 2;
  const size_t t = static_cast<size_t>(max_step_tokens);
  const size_t activation_bytes =
      t * 2 * static_cast<size_t>(2 * c.hidden_size + qkv_width() + c.q_dim() + c.hidden_size + 2 * c.intermediate_size +
                                  act_stride());
  const size_t logit_bytes = static_cast<size_t>(max_logit_rows) * static_cast<size_t>(c.vocab_size + c.hidden_size) * 2;
  // The widest 4-bit GEMM input (int8 codes or f16 values), rows padded to 16 elements; int4
  // group scales for the widest input.
  int64_t widest = std::max(c.hidden_size, c.intermediate_size);
  bool reordered_inputs = false;  // an ARC-calibrated model: inputs are gathered into x_reordered
  for (const Layer& layer : layers)
    for (const Linear* linear : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) {
      widest = std::max(widest, linear->k);
      reordered_inputs = reordered_inputs || linear->reordered();
    }
  if (quantized) {
    x_codes_stride = (widest + 15) / 16 * 16;
    x_scales_stride = activation_group > 0 ? std::max<int64_t>(1, widest / activation_group) : 1;
  }
  const size_t code_bytes =
      t * static_cast<size_t>((reordered_inputs ? 4 : 2) * x_codes_stride + 4 * x_scales_stride);
  for (const Layer& layer : layers)
    for (const Linear* whole : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
      for_each_four_bit(*whole, [&](const Linear& four_bit) {
        const Linear* linear = &four_bit;  // (the 8-bit parts' workspace: below)
        for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}, int64_t{256},
                          int64_t{512}, max_step_tokens})
          if (m <= max_step_tokens) {
            for (auto path : {cuda::W4A16Path::automatic, cuda::W4A16Path::small_m, cuda::W4A16Path::tiled,
                              cuda::W4A16Path::dequant_cublas})
              // A policy map (set now or later) may pick any kernel: the small-M and tiled ones up to
              // 512 tokens, and dequantize + cuBLAS (its f16 copy of the weights) past 256, where the
              // automatic path took it before the wgmma prefill tile and the shipped maps name it.
              if (path == cuda::W4A16Path::automatic ||
                  (path == cuda::W4A16Path::dequant_cublas ? m > 256 : m <= 512))
                gemm_workspace_bytes =
                    std::max(gemm_workspace_bytes, cuda::w4a16_workspace_bytes(m, linear->n, linear->k, path));
            // int4-asym: the path its weights take (cuda::w4a16_choose_path), dequantize + cuBLAS where no
            // zero-point kernel runs.
            if (linear->has_min())
              gemm_workspace_bytes = std::max(
                  gemm_workspace_bytes,
                  cuda::w4a16_workspace_bytes(m, linear->n, linear->k, cuda::w4a16_choose_path(m, linear->view)));
          }
      });
  // int8-group weights: the dequantized f16 copy of their prefill path.
  for (const Layer& layer : layers)
    for (const Linear* whole : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
      for_each_int8(*whole, [&](const Linear& linear) {
        gemm_workspace_bytes =
            std::max(gemm_workspace_bytes, cuda::w8a16_workspace_bytes(max_step_tokens, linear.n, linear.k));
      });
  // Zero points under quantized activations (drafts too): the tokens' group sums of the
  // correction, when it makes them once (cuda::ZeroPointSums).
  for (const Layer& layer : layers)
    for (const Linear* whole : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
      for_each_four_bit(*whole, [&](const Linear& linear) {
        if (linear.has_min())
          gemm_workspace_bytes = std::max(gemm_workspace_bytes,
                                          cuda::w4_zero_point_correction_workspace_bytes(max_step_tokens, linear.view));
      });
  // Split-K attention partials for decode and verify batches; a long prefill plans fewer splits
  // to fit (it fills the GPU without them).
  attention_workspace_bytes = cuda::attention_workspace_bytes(
      std::min<int64_t>(max_step_tokens, std::max<int64_t>(max_seqs * 8, 256)), c.num_heads, c.head_dim, max_context);
  const size_t needed = 2 * static_cast<size_t>(c.num_layers) * pool_bytes + activation_bytes + logit_bytes + code_bytes +
                        gemm_workspace_bytes + attention_workspace_bytes +
                        static_cast<size_t>(max_seqs + max_step_tokens) * static_cast<size_t>(blocks_per_seq) * 4;
  const cuda::MemoryInfo memory = cuda::memory_info();
  QSPEC_CHECK(needed + (size_t{256} << 20) <= memory.free_bytes, "GPU model: the KV cache (", max_seqs,
              " sequences x ", max_context, " positions) and scratch need ", needed / (1 << 20), " MiB but only ",
              memory.free_bytes / (1 << 20), " MiB of ", memory.total_bytes / (1 << 20),
              " MiB are free after the weights; lower --max-seqs or --max-context");

  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_pools.push_back(allocate(pool_bytes, "K cache"));
    v_pools.push_back(allocate(pool_bytes, "V cache"));
    if (kv_format == KvCacheFormat::int8) {
      k8.push_back(cuda::kv8_planes_in(k_pools.back().get(), pool_blocks, c.num_kv_heads, c.head_dim));
      v8.push_back(cuda::kv8_planes_in(v_pools.back().get(), pool_blocks, c.num_kv_heads, c.head_dim));
    }
  }
  std::vector<int32_t> table(static_cast<size_t>(max_seqs * blocks_per_seq));
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  block_tables = upload(table, "block tables");
  inputs = allocate(input_words() * 4, "step inputs");
  host_inputs = cuda::PinnedMemory(input_words() * 4);
  host_ids = cuda::PinnedMemory(static_cast<size_t>(max_logit_rows) * 4);
  host_chain_ids = cuda::PinnedMemory(static_cast<size_t>(max_runs() * GpuLlama::kMaxChainSteps) * 4);
  chain_ids = allocate(static_cast<size_t>(max_runs() * GpuLlama::kMaxChainSteps) * 4, "draft chain ids");
  host_chain_scatter = cuda::PinnedMemory(static_cast<size_t>(max_runs()) * 16);
  chain_scatter = allocate(static_cast<size_t>(max_runs()) * 16, "draft chain scatter");

  x = allocate(t * c.hidden_size * 2, "activations");
  normed = allocate(t * c.hidden_size * 2, "activations");
  qkv = allocate(t * qkv_width() * 2, "activations");
  attn = allocate(t * c.q_dim() * 2, "activations");
  proj = allocate(t * c.hidden_size * 2, "activations");
  gate_up = allocate(t * 2 * c.intermediate_size * 2, "activations");
  act = allocate(t * static_cast<size_t>(act_stride()) * 2, "activations");
  if (act_stride() > c.intermediate_size) cuda::fill_bytes(act.get(), 0, act.bytes(), stream);  // zero tails
  gathered = allocate(static_cast<size_t>(max_logit_rows * c.hidden_size) * 2, "activations");
  logits = allocate(static_cast<size_t>(max_logit_rows * c.vocab_size) * 2, "logits");
  out_ids = allocate(static_cast<size_t>(max_logit_rows) * 4, "ids");
  if (quantized) {
    x_codes = allocate(t * static_cast<size_t>(2 * x_codes_stride), "quantized activations");
    x_scales = allocate(t * static_cast<size_t>(4 * x_scales_stride), "activation scales");
    if (reordered_inputs) x_reordered = allocate(t * static_cast<size_t>(2 * x_codes_stride), "reordered activations");
  }
  if (gemm_workspace_bytes > 0) {
    gemm_workspace = allocate(gemm_workspace_bytes, "GEMM workspace");
    cuda::w4a16_workspace_init(gemm_workspace.get(), gemm_workspace_bytes, stream);
  }
  attention_workspace = allocate(attention_workspace_bytes, "attention workspace");
  cuda::attention_workspace_init(attention_workspace.get(), attention_workspace_bytes, stream);
  cuda::stream_synchronize(stream);
  std::shared_ptr<const gemm::PolicyMap> policy = options.gemm_policy;
  gemm_policy_source = policy ? "given" : "";
  if (!policy && options.auto_gemm_policy && quantized) {
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (const Layer& layer : layers)
      for (const Linear* whole : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
        for_each_four_bit(*whole, [&](const Linear& linear) { shapes.emplace_back(linear.n, linear.k); });
    const std::string found = gemm::find_policy_map(gemm::default_policy_dirs(), cuda::device_name(), shapes);
    if (!found.empty()) {
      policy = std::make_shared<const gemm::PolicyMap>(gemm::PolicyMap::load(found));
      gemm_policy_source = found;
    }
  }
  apply_gemm_policy(std::move(policy));
}

GpuLlama::GpuLlama(const LlamaModel& model, const RunMode& mode, int64_t max_tokens)
    : GpuLlama(model, mode, [&] {
        GpuLlamaOptions options;
        options.max_context = max_tokens;
        return options;
      }()) {}

GpuLlama::GpuLlama(const LlamaModel& model, const RunMode& mode, const GpuLlamaOptions& options)
    : state_(std::make_unique<State>()) {
  const ModelConfig& c = model.config();
  // Every LayerRecipe (io/model_config.h) runs here: (1 + w) norms arrive folded into the weights
  // (LlamaModel stores the factor), scaled embeddings in the uploaded table, the rest in
  // enqueue_forward. Per-layer windows, RoPE and the attention scale too.
  const LayerRecipe recipe = c.recipe();
  check_supported(c, mode);
  // q/k/v biases (Qwen2) are on the GPU (the RoPE step adds them); o_proj and MLP biases are not.
  QSPEC_CHECK(!c.attention_output_bias && !c.mlp_bias, "GPU model: ", c.architecture_name,
              ": o_proj / MLP biases (Llama attention_bias, mlp_bias) are not on the GPU yet; run it with --device cpu");
  QSPEC_CHECK(!model.rotated(), "GPU model: Hadamard-rotated models are not on the GPU yet");
  QSPEC_CHECK(options.max_context <= c.max_position_embeddings, "GPU model: max_context ", options.max_context,
              " outside 1..", c.max_position_embeddings);
  State& s = *state_;
  s.config = c;
  s.set_mode(mode);
  if (s.quantized) {
    QSPEC_CHECK(model.has_quantized_weights(), "GPU model: mode ", mode.name, " needs 4-bit weights (quantize the model first)");
    // Zero points (issue 55) under quantized activations, ARC's included: the symmetric kernels
    // over K + S, then the zero points' term over every group of the augmented row
    // (cuda::w4_zero_point_correction sums the quantized values as the GEMM read them: the
    // reordered channels, the zeros between and the residuals alike).
  } else {
    QSPEC_CHECK(model.has_checkpoint_weights(), "GPU model: mode w16a16 needs the checkpoint's 16-bit weights");
  }
  // The weights alone must fit: say so before uploading gigabytes.
  const size_t weight_estimate = static_cast<size_t>(c.parameter_count()) * (s.quantized ? 1 : 2);
  const cuda::MemoryInfo memory = cuda::memory_info();
  QSPEC_CHECK(weight_estimate <= memory.free_bytes, "GPU model: the ", mode.name, " weights need about ",
              weight_estimate / (1 << 20), " MiB but the GPU (", cuda::device_name(), ") has ",
              memory.free_bytes / (1 << 20), " MiB free");
  s.stream = cuda::create_stream();
  s.blas = std::make_unique<cuda::Blas>();

  {
    // The rows the forward pass starts from (Gemma's scaled by sqrt(hidden), rounded as on the
    // CPU); the tied lm_head keeps the unscaled matrix.
    std::vector<f16_bits> table;
    table.reserve(static_cast<size_t>(c.vocab_size * c.hidden_size));
    std::vector<float> row(static_cast<size_t>(c.hidden_size));
    for (int64_t id = 0; id < c.vocab_size; ++id) {
      model.input_embedding(static_cast<int32_t>(id), row.data());
      for (float v : row) table.push_back(f32_to_f16(v));
    }
    s.embedding = upload(table, "embedding");
  }
  s.final_norm = upload(model.final_norm(), "final norm");
  s.lm_head = make_linear({&model.lm_head()}, "lm_head");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model.layer_weights(l);
    Layer layer;
    layer.attention_norm = upload(w.attention_norm, "layer norm");
    layer.mlp_norm = upload(w.mlp_norm, "layer norm");
    if (c.attention_bias) {
      std::vector<float> bias = w.q_bias;
      bias.insert(bias.end(), w.k_bias.begin(), w.k_bias.end());
      bias.insert(bias.end(), w.v_bias.begin(), w.v_bias.end());
      layer.qkv_bias = upload(bias, "qkv biases");
    }
    if (recipe.qk_norm) {
      layer.q_norm = upload(w.q_norm, "q norm");
      layer.k_norm = upload(w.k_norm, "k norm");
    }
    if (recipe.output_norms) {
      layer.attention_out_norm = upload(w.attention_out_norm, "attention output norm");
      layer.mlp_out_norm = upload(w.mlp_out_norm, "MLP output norm");
    }
    set_layer_rope(layer, rope_tables(c, c.layer_rope(l)));
    if (s.quantized) {
      const QuantizedLayerWeights& qw = model.quantized_layers()[static_cast<size_t>(l)];
      auto site = [&](LinearSite s) -> const ArcSite& { return qw.sites[static_cast<int>(s)]; };
      layer.qkv = make_linear({&qw.q_proj, &qw.k_proj, &qw.v_proj}, "qkv_proj", site(LinearSite::attention_in));
      layer.o = make_linear({&qw.o_proj}, "o_proj", site(LinearSite::attention_out));
      const ArcSite& down_site = site(LinearSite::mlp_out);
      if (down_site.calibrated()) {
        // down's channel order folded into gate_proj / up_proj's rows: SwiGLU then yields the
        // reordered input itself (bit for bit the gather of the unpermuted one).
        const QuantizedMatrix gate = permute_rows(qw.gate_proj, down_site.order);
        const QuantizedMatrix up = permute_rows(qw.up_proj, down_site.order);
        layer.gate_up = make_linear({&gate, &up}, "gate_up_proj", site(LinearSite::mlp_in));
      } else {
        layer.gate_up = make_linear({&qw.gate_proj, &qw.up_proj}, "gate_up_proj", site(LinearSite::mlp_in));
      }
      layer.down = make_linear({&qw.down_proj}, "down_proj", down_site);
      layer.down.input_ordered = down_site.calibrated();
    } else {
      layer.qkv = make_linear({&w.q_proj, &w.k_proj, &w.v_proj}, "qkv_proj");
      layer.o = make_linear({&w.o_proj}, "o_proj");
      layer.gate_up = make_linear({&w.gate_proj, &w.up_proj}, "gate_up_proj");
      layer.down = make_linear({&w.down_proj}, "down_proj");
    }
    s.layers.push_back(std::move(layer));
  }
  s.allocate_runtime(options);
  lengths_.assign(static_cast<size_t>(s.max_seqs), 0);
  set_activations(s.activations);  // validates an int4 group against the weights
}

std::unique_ptr<GpuLlama> GpuLlama::synthetic(const ModelConfig& config, const RunMode& mode,
                                              const GpuLlamaOptions& options, uint64_t seed) {
  const ModelConfig& c = config;
  check_supported(c, mode);
  std::unique_ptr<GpuLlama> gpu(new GpuLlama());
  gpu->state_ = std::make_unique<State>();
  State& s = *gpu->state_;
  s.config = c;
  s.set_mode(mode);
  QSPEC_CHECK(!c.attention_output_bias && !c.mlp_bias, "GPU model: synthetic ", c.architecture_name,
              ": o_proj / MLP biases are not on the GPU yet");
  const LayerRecipe recipe = c.recipe();
  QSPEC_CHECK(!recipe.qk_norm && !recipe.output_norms && recipe.activation == MlpActivation::silu,
              "GPU model: synthetic models are Llama / Qwen2 shapes (no q/k or output norms, SwiGLU)");
  QSPEC_CHECK(options.synthetic_weights == quant::Format::int4 || quant::format_has_min(options.synthetic_weights),
              "GPU model: synthetic_weights ", quant::format_name(options.synthetic_weights),
              ": synthetic models have int4, int4-asym or int4-zp weights");
  const quant::Format wformat = options.synthetic_weights;
  const int64_t wgroup = options.synthetic_group;
  QSPEC_CHECK(wgroup == 32 || wgroup == 64 || wgroup == 128, "GPU model: synthetic_group ", wgroup,
              " (the synthetic 4-bit weights take groups of 32, 64 or 128)");
  const size_t weight_estimate = static_cast<size_t>(c.parameter_count()) * (s.quantized ? 1 : 2);
  const cuda::MemoryInfo memory = cuda::memory_info();
  QSPEC_CHECK(weight_estimate <= memory.free_bytes, "GPU model: synthetic ", mode.name, " weights need about ",
              weight_estimate / (1 << 20), " MiB but the GPU has ", memory.free_bytes / (1 << 20), " MiB free");
  s.stream = cuda::create_stream();
  s.blas = std::make_unique<cuda::Blas>();
  const int64_t hidden = c.hidden_size;
  s.embedding = allocate(static_cast<size_t>(c.vocab_size * hidden) * 2, "embedding");
  cuda::fill_random_f16(s.embedding.as<f16_bits>(), static_cast<size_t>(c.vocab_size * hidden), -1.0f, 1.0f, seed,
                        s.stream);
  const std::vector<float> ones(static_cast<size_t>(hidden), 1.0f);
  s.final_norm = upload(ones, "final norm");
  // The lm_head stays f16 in both modes, as for real checkpoints (LlamaModel::lm_head()).
  s.lm_head = make_synthetic_linear(c.vocab_size, hidden, false, seed + 7, s.stream);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const uint64_t layer_seed = seed + 1000 * static_cast<uint64_t>(l + 1);
    Layer layer;
    layer.attention_norm = upload(ones, "layer norm");
    layer.mlp_norm = upload(ones, "layer norm");
    set_layer_rope(layer, rope_tables(c, c.layer_rope(l)));
    if (c.attention_bias) {  // q/k/v biases (qwen2.5-7b), so a benchmark step pays for them
      std::vector<float> bias(static_cast<size_t>(c.q_dim() + 2 * c.kv_dim()));
      std::mt19937_64 random(layer_seed + 9);
      std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
      for (float& b : bias) b = uniform(random);
      layer.qkv_bias = upload(bias, "synthetic qkv biases");
    }
    if (s.quantized && options.synthetic_arc_channels > 0) {
      // One calibration a site, shared by the projections it feeds (qkv, gate_up), as in a checkpoint.
      const int64_t arc = options.synthetic_arc_channels, group = 128;
      layer.qkv = make_synthetic_arc_linear(c.q_dim() + 2 * c.kv_dim(),
                                            synthetic_arc_site(hidden, arc, group, layer_seed + 5), layer_seed + 1,
                                            s.stream, wformat);
      layer.o = make_synthetic_arc_linear(hidden, synthetic_arc_site(c.q_dim(), arc, group, layer_seed + 6),
                                          layer_seed + 2, s.stream, wformat);
      layer.gate_up = make_synthetic_arc_linear(2 * c.intermediate_size,
                                                synthetic_arc_site(hidden, arc, group, layer_seed + 7), layer_seed + 3,
                                                s.stream, wformat);
      layer.down = make_synthetic_arc_linear(hidden, synthetic_arc_site(c.intermediate_size, arc, group, layer_seed + 8),
                                             layer_seed + 4, s.stream, wformat);
      layer.down.input_ordered = true;  // as GpuLlama's constructor folds it into gate_up's (random) rows
    } else {
      layer.qkv = make_synthetic_linear(c.q_dim() + 2 * c.kv_dim(), hidden, s.quantized, layer_seed + 1, s.stream,
                                        wformat, wgroup);
      layer.o = make_synthetic_linear(hidden, c.q_dim(), s.quantized, layer_seed + 2, s.stream, wformat, wgroup);
      layer.gate_up = make_synthetic_linear(2 * c.intermediate_size, hidden, s.quantized, layer_seed + 3, s.stream,
                                            wformat, wgroup);
      layer.down = make_synthetic_linear(hidden, c.intermediate_size, s.quantized, layer_seed + 4, s.stream,
                                         wformat, wgroup);
    }
    s.layers.push_back(std::move(layer));
  }
  s.allocate_runtime(options);
  // The cache holds random values too (benchmarks attend to contexts they never prefilled).
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const size_t li = static_cast<size_t>(l);
    if (s.kv_format == KvCacheFormat::int8) {
      // Random plane bytes (any byte is two valid nibbles) and scales of rows of values in [-1, 1].
      for (const cuda::Kv8Planes* planes : {&s.k8[li], &s.v8[li]}) {
        const size_t plane_halves = static_cast<size_t>(planes->low - planes->high);  // 2 planes' bytes / 2
        const uint64_t salt = planes == &s.k8[li] ? 11 : 13;
        cuda::fill_random_f16(reinterpret_cast<f16_bits*>(planes->high), plane_halves, -1.0f, 1.0f, seed + salt + l,
                              s.stream);
        const size_t scales = static_cast<size_t>(s.max_seqs * s.blocks_per_seq * cuda::kKvBlockSize * c.num_kv_heads);
        cuda::fill_random_f16(planes->scales, scales, 0.5f / 127, 1.0f / 127, seed + salt + 2 + l, s.stream);
      }
      continue;
    }
    const size_t halves = s.k_pools[li].bytes() / 2;
    cuda::fill_random_f16(s.k_pools[li].as<f16_bits>(), halves, -1.0f, 1.0f, seed + 11 + l, s.stream);
    cuda::fill_random_f16(s.v_pools[li].as<f16_bits>(), halves, -1.0f, 1.0f, seed + 13 + l, s.stream);
  }
  cuda::stream_synchronize(s.stream);
  gpu->lengths_.assign(static_cast<size_t>(s.max_seqs), 0);
  gpu->set_activations(s.activations);
  return gpu;
}

GpuLlama::~GpuLlama() = default;

// ---- the forward pass ------------------------------------------------------------------

void GpuLlama::State::enqueue_forward(int64_t tokens, int64_t runs, int64_t max_query_len, int64_t max_context_in_step,
                                      bool decode, const int32_t* tables, int64_t logit_rows, bool gather) {
  const ModelConfig& c = config;
  const int64_t hidden = c.hidden_size, q_dim = c.q_dim(), inter = c.intermediate_size,
                width = qkv_width();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool geglu = c.recipe().activation == MlpActivation::gelu_tanh;
  cuda::QueryBatch batch;
  batch.num_seqs = runs;
  batch.num_tokens = tokens;
  batch.query_start = input_query_start();
  batch.positions = input_positions();
  batch.max_query_len = max_query_len;
  batch.max_context = max_context_in_step;
  auto* xs = x.as<f16_bits>();
  auto* norm_out = normed.as<f16_bits>();
  auto* qkv_out = qkv.as<f16_bits>();
  auto* attn_out = attn.as<f16_bits>();
  auto* proj_out = proj.as<f16_bits>();
  auto* gate_up_out = gate_up.as<f16_bits>();
  auto* act_out = act.as<f16_bits>();

  cuda::embedding(input_ids(), tokens, embedding.as<f16_bits>(), c.vocab_size, hidden, xs, stream);
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& layer = layers[l];
    const cuda::PagedKv kv = paged_kv(l, tables);
    // The layer's window (Gemma 3's sliding layers) narrowed by a draft's view, and its scale.
    const cpu::AttentionShape shape = attention_shape(c, static_cast<int64_t>(l), kv_window, kv_sinks);
    const float* inv_freq = layer.inv_freq.as<float>();
    const float rope_scaling = layer.rope_scaling;
    // Attention block; the previous layer's MLP residual is added in the same pass as this norm.
    norm_then_gemm(xs, l == 0 ? nullptr : proj_out, layer.attention_norm, layer.qkv, tokens, norm_out, qkv_out);
    // RoPE on the q and k heads of the qkv rows, the rotated k with v into the cache, attention:
    // one launch in decode steps, two in the others.
    // The q/k/v biases and q/k norms go in the same launch as RoPE (cuda::QkvPrologue).
    const cuda::QkvPrologue qkv_prologue = prologue(layer);
    if (decode) {
      cuda::paged_attention_decode_rope(qkv_out, width, batch, input_context_lens(), inv_freq, rope_scaling,
                                        kv, shape, attn_out, q_dim, attention_workspace.get(),
                                        attention_workspace_bytes, stream, qkv_prologue);
    } else {
      cuda::rope_kv_write(qkv_out, width, c.num_heads, c.num_kv_heads, c.head_dim, batch, inv_freq, rope_scaling, kv,
                          stream, qkv_prologue);
      cuda::paged_attention_prefill(qkv_out, width, batch, kv, shape, attn_out, q_dim, attention_workspace.get(),
                                    attention_workspace_bytes, stream);
    }
    gemm(layer.o, attn_out, tokens, proj_out);
    // Gemma 3's output norms: in place (each thread of a row reads its values before it writes them).
    if (layer.attention_out_norm.get() != nullptr)
      cuda::rmsnorm(proj_out, layer.attention_out_norm.as<float>(), tokens, hidden, eps, proj_out, stream);
    // MLP block: residual += o, normed = rmsnorm(residual) in one pass.
    // SwiGLU in the gate_up GEMM's epilogue where its kernel has one, else silu_mul after it
    // (which writes down's x in the packed k order where down reads it so).
    bool down_packed = false;
    if (const SwigluGemm swiglu_gemm = swiglu_in_gemm(layer.gate_up, tokens);
        swiglu_gemm.kernel != SwigluGemm::Kernel::none) {
      ++swiglu_epilogue_layers;
      cuda::add_rmsnorm(xs, proj_out, layer.mlp_norm.as<float>(), tokens, hidden, eps, norm_out, stream);
      run_w4_gemm_swiglu(swiglu_gemm, norm_out, tokens, hidden, layer.gate_up.view, act_out, act_stride(),
                         gemm_workspace.get(), gemm_workspace_bytes, stream);
    } else {
      norm_then_gemm(xs, proj_out, layer.mlp_norm, layer.gate_up, tokens, norm_out, gate_up_out);
      const bool down_reads_f16 = layer.down.quantized && activations == GpuActivations::f16 &&
                                  (!layer.down.reordered() || layer.down.input_ordered);
      const cuda::NextKernel next = down_reads_f16 ? cuda::NextKernel::w4a16_gemm : cuda::NextKernel::other;
      if (geglu) {
        cuda::gelu_tanh_mul(gate_up_out, gate_up_out + inter, tokens, inter, 2 * inter, act_out, stream, next, act_stride());
      } else {
        down_packed = reads_packed_x(layer.down, tokens);
        cuda::silu_mul(gate_up_out, gate_up_out + inter, tokens, inter, 2 * inter, act_out, stream, next, act_stride(),
                       down_packed);
      }
    }
    gemm(layer.down, act_out, tokens, proj_out, act_stride(), down_packed);
    if (layer.mlp_out_norm.get() != nullptr)
      cuda::rmsnorm(proj_out, layer.mlp_out_norm.as<float>(), tokens, hidden, eps, proj_out, stream);
  }
  // Logits: the last MLP residual and the final norm in one pass, then the rows that need them.
  cuda::add_rmsnorm(xs, proj_out, final_norm.as<float>(), tokens, hidden, eps, norm_out, stream);
  const f16_bits* rows = norm_out;
  if (gather) {
    // The embedding gather with the normed activations as its table picks the runs' last rows.
    cuda::embedding(input_logit_rows(), logit_rows, norm_out, tokens, hidden, gathered.as<f16_bits>(), stream);
    rows = gathered.as<f16_bits>();
  }
  if (vocab_subset > 0) {
    // A draft's vocabulary subset: the first vocab_subset rows of the draft head (the most
    // frequent ids), scattered into whole rows with -inf elsewhere, so the argmax, the sampler
    // and the host's logits see the subset's softmax (cuda::scatter_subset_logits).
    cuda::linear_w16(*blas, rows, logit_rows, hidden, draft_head.as<uint16_t>(), vocab_subset,
                     subset_logits.as<f16_bits>(), cuda::Dtype16::f16, stream);
    cuda::scatter_subset_logits(subset_logits.as<f16_bits>(), logit_rows, vocab_subset, draft_ids.as<int32_t>(),
                                c.vocab_size, logits.as<f16_bits>(), stream);
  } else {
    gemm(lm_head, rows, logit_rows, logits.as<f16_bits>());
  }
  cuda::argmax_f16(logits.as<f16_bits>(), logit_rows, c.vocab_size, out_ids.as<int32_t>(), stream);
  // Gemma's soft cap after the argmax, which it cannot change (tanh is increasing) but could tie: in
  // f16 the squeezed top logits may round together where the CPU's f32 ones stay apart. The logits
  // a sampler reads are capped.
  if (c.final_logit_softcapping)
    cuda::soft_cap(logits.as<f16_bits>(), logit_rows * c.vocab_size, static_cast<float>(*c.final_logit_softcapping),
                   stream);
}

std::vector<int32_t> GpuLlama::step(std::span<const Run> runs, bool all_tokens) {
  State& s = *state_;
  const int64_t logit_rows = enqueue_step(runs, all_tokens);
  cuda::copy_to_host_async(s.host_ids.as<void>(), s.out_ids.get(), static_cast<size_t>(logit_rows) * 4, s.stream);
  bool verifies_chain = false;
  for (const Run& run : runs) verifies_chain = verifies_chain || run.chain_offset >= 0;
  if (verifies_chain)  // the drafts come back with the verify ids: one read a QSpec cycle
    cuda::copy_to_host_async(s.host_chain_ids.as<void>(), s.chain_ids.get(), static_cast<size_t>(s.chain_used) * 4,
                             s.stream);
  cuda::stream_synchronize(s.stream);
  if (verifies_chain) {
    const int32_t* chain = s.host_chain_ids.as<int32_t>();
    last_chain_ids_.assign(chain, chain + s.chain_used);
  }
  s.last_logit_rows = logit_rows;
  const int32_t* out = s.host_ids.as<int32_t>();
  return std::vector<int32_t>(out, out + logit_rows);
}

void GpuLlama::begin_chains() { state_->chain_used = 0; }

std::vector<int32_t> GpuLlama::draft_chain(std::span<const Run> runs, int64_t steps) {
  State& s = *state_;
  begin_chains();
  const int64_t offset = draft_chain_async(runs, steps);
  const size_t count = static_cast<size_t>(steps) * runs.size();
  cuda::copy_to_host_async(s.host_chain_ids.as<void>(), s.chain_ids.as<int32_t>() + offset, count * 4, s.stream);
  cuda::stream_synchronize(s.stream);
  const int32_t* out = s.host_chain_ids.as<int32_t>();
  return std::vector<int32_t>(out, out + count);
}

int64_t GpuLlama::draft_chain_async(std::span<const Run> runs, int64_t steps) {
  State& s = *state_;
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  QSPEC_CHECK(steps >= 1 && steps <= kMaxChainSteps, "GPU draft chain: ", steps, " steps outside 1..", kMaxChainSteps);
  QSPEC_CHECK(num_runs > 0 && num_runs <= s.max_runs(), "GPU draft chain: ", num_runs, " runs outside 1..",
              s.max_runs());
  for (const Run& run : runs) {
    QSPEC_CHECK(run.tokens.size() == 1 && !run.all_logits && run.chain_offset < 0,
                "GPU draft chain: a run starts from exactly one token");
    QSPEC_CHECK(run.seq >= 0 && run.seq < s.max_seqs && lengths_[static_cast<size_t>(run.seq)] + steps <= s.max_context,
                "GPU draft chain: sequence ", run.seq, " cannot hold ", steps, " more positions");
  }
  const int64_t offset = s.chain_used;
  QSPEC_CHECK(offset + steps * num_runs <= s.max_runs() * kMaxChainSteps, "GPU draft chain: this engine step's chains ",
              "exceed ", s.max_runs() * kMaxChainSteps, " ids");
  // Step 0 from the host's tokens; each later one from the step before, on the device.
  enqueue_step(runs, false);
  bool identity_tables = true;
  int64_t max_length = 0;
  for (int64_t r = 0; r < num_runs; ++r) {
    identity_tables = identity_tables && runs[static_cast<size_t>(r)].seq == r;
    max_length = std::max(max_length, lengths_[static_cast<size_t>(runs[static_cast<size_t>(r)].seq)]);
  }
  const int32_t* tables = identity_tables ? s.block_tables.as<int32_t>() : s.input_tables();
  int32_t* chain = s.chain_ids.as<int32_t>() + offset;
  for (int64_t i = 1; i < steps; ++i) {
    cuda::advance_decode_inputs(s.out_ids.as<int32_t>(), num_runs, s.input_ids(), s.input_positions(),
                                s.input_context_lens(), chain + (i - 1) * num_runs, true, s.stream);
    s.enqueue_decode(num_runs, max_length + 1, identity_tables, tables);
    for (const Run& run : runs) ++lengths_[static_cast<size_t>(run.seq)];
    ++max_length;
  }
  cuda::advance_decode_inputs(s.out_ids.as<int32_t>(), num_runs, s.input_ids(), s.input_positions(),
                              s.input_context_lens(), chain + (steps - 1) * num_runs, false, s.stream);
  s.last_logit_rows = num_runs;  // the last step's logit rows
  s.chain_used = offset + steps * num_runs;
  return offset;
}

int64_t GpuLlama::enqueue_step(std::span<const Run> runs, bool all_tokens) {
  State& s = *state_;
  const ModelConfig& c = s.config;
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  QSPEC_CHECK(num_runs > 0, "GPU step: no runs");
  int64_t tokens = 0, max_query_len = 0, max_context_in_step = 0;
  bool decode = true, identity_tables = true;
  std::vector<bool> seen(static_cast<size_t>(s.max_seqs), false);
  for (int64_t r = 0; r < num_runs; ++r) {
    const Run& run = runs[static_cast<size_t>(r)];
    QSPEC_CHECK(run.seq >= 0 && run.seq < s.max_seqs, "GPU step: sequence ", run.seq, " outside 0..", s.max_seqs - 1);
    QSPEC_CHECK(!seen[static_cast<size_t>(run.seq)], "GPU step: sequence ", run.seq, " appears twice in one step");
    seen[static_cast<size_t>(run.seq)] = true;
    const int64_t count = static_cast<int64_t>(run.tokens.size());
    const int64_t length = lengths_[static_cast<size_t>(run.seq)];
    QSPEC_CHECK(count > 0, "GPU step: sequence ", run.seq, " has no tokens");
    QSPEC_CHECK(length + count <= s.max_context, "GPU step: sequence ", run.seq, " would hold ", length + count,
                " positions; the GPU cache holds ", s.max_context);
    for (int32_t id : run.tokens)
      QSPEC_CHECK(id >= 0 && id < c.vocab_size, "GPU step: token id ", id, " outside the vocabulary [0, ",
                  c.vocab_size, ")");
    tokens += count;
    max_query_len = std::max(max_query_len, count);
    max_context_in_step = std::max(max_context_in_step, length + count);
    decode = decode && count == 1;
    identity_tables = identity_tables && run.seq == r;
  }
  QSPEC_CHECK(tokens <= s.max_step_tokens, "GPU step: ", tokens, " tokens exceed the step capacity of ",
              s.max_step_tokens, " (split the prefill into chunks)");
  int64_t logit_rows = 0;
  for (const Run& run : runs)
    logit_rows += all_tokens || run.all_logits || decode ? static_cast<int64_t>(run.tokens.size()) : 1;
  QSPEC_CHECK(logit_rows <= s.max_logit_rows, "GPU step: ", logit_rows, " rows of logits exceed the capacity of ",
              s.max_logit_rows);

  // Inputs: one pinned buffer, one copy. A draft chain queues steps without waiting for them:
  // the buffer is rewritten only once the last copy out of it has run.
  s.inputs_copied.wait();
  int32_t* host = s.host_inputs.as<int32_t>();
  int32_t* ids = host;
  int32_t* positions = host + s.max_step_tokens;
  int32_t* query_start = positions + s.max_step_tokens;
  int32_t* context_lens = query_start + s.max_step_tokens + 1;
  int32_t* logit_row_ids = context_lens + s.max_step_tokens;
  int64_t t = 0, logit_row = 0;
  query_start[0] = 0;
  for (int64_t r = 0; r < num_runs; ++r) {
    const Run& run = runs[static_cast<size_t>(r)];
    const int64_t length = lengths_[static_cast<size_t>(run.seq)];
    const bool every_token = all_tokens || run.all_logits;
    for (size_t i = 0; i < run.tokens.size(); ++i, ++t) {
      ids[t] = run.tokens[i];
      positions[t] = static_cast<int32_t>(length + static_cast<int64_t>(i));
      if (every_token || i + 1 == run.tokens.size()) logit_row_ids[logit_row++] = static_cast<int32_t>(t);
    }
    query_start[r + 1] = static_cast<int32_t>(t);
    context_lens[r] = static_cast<int32_t>(length + static_cast<int64_t>(run.tokens.size()));
  }
  const bool gather = logit_rows != tokens;
  size_t input_words = s.table_offset_words();
  const int32_t* tables = s.block_tables.as<int32_t>();
  if (!identity_tables) {
    // Sequence s owns blocks s * blocks_per_seq ...: run r's table row follows from its sequence.
    int32_t* run_tables = host + s.table_offset_words();
    for (int64_t r = 0; r < num_runs; ++r)
      for (int64_t b = 0; b < s.blocks_per_seq; ++b)
        run_tables[r * s.blocks_per_seq + b] = static_cast<int32_t>(runs[static_cast<size_t>(r)].seq * s.blocks_per_seq + b);
    input_words += static_cast<size_t>(num_runs * s.blocks_per_seq);
    tables = s.input_tables();
  }
  cuda::copy_to_device_async(s.inputs.get(), host, input_words * 4, s.stream);
  // Verify runs whose drafts are still on the device: their placeholders are overwritten there.
  int32_t* scatter = s.host_chain_scatter.as<int32_t>();
  int64_t entries = 0;
  for (int64_t r = 0; r < num_runs; ++r) {
    const Run& run = runs[static_cast<size_t>(r)];
    if (run.chain_offset < 0) continue;
    const int64_t drafts = static_cast<int64_t>(run.tokens.size()) - 1;
    QSPEC_CHECK(drafts >= 1 && run.chain_stride >= 1 && run.chain_offset + (drafts - 1) * run.chain_stride < s.chain_used,
                "GPU step: run ", r, " reads drafts outside this engine step's chains");
    scatter[4 * entries + 0] = query_start[r] + 1;
    scatter[4 * entries + 1] = static_cast<int32_t>(run.chain_offset);
    scatter[4 * entries + 2] = static_cast<int32_t>(run.chain_stride);
    scatter[4 * entries + 3] = static_cast<int32_t>(drafts);
    ++entries;
  }
  if (entries > 0) {
    cuda::copy_to_device_async(s.chain_scatter.get(), scatter, static_cast<size_t>(entries) * 16, s.stream);
    cuda::scatter_chain_drafts(s.chain_ids.as<int32_t>(), s.chain_scatter.as<int32_t>(), entries, s.input_ids(),
                               s.stream);
  }
  s.inputs_copied.record(s.stream);

  // A QSpec verify step: every run the same number of tokens, all of their logits.
  bool verify = !decode;
  for (const Run& run : runs)
    verify = verify && run.all_logits && static_cast<int64_t>(run.tokens.size()) == max_query_len;
  if (decode) s.enqueue_decode(num_runs, max_context_in_step, identity_tables, tables);
  else if (verify) s.enqueue_verify(num_runs, max_query_len, max_context_in_step, identity_tables, tables);
  else s.enqueue_forward(tokens, num_runs, max_query_len, max_context_in_step, decode, tables, logit_rows, gather);
  for (const Run& run : runs) lengths_[static_cast<size_t>(run.seq)] += static_cast<int64_t>(run.tokens.size());
  return logit_rows;
}

int32_t GpuLlama::forward(std::span<const int32_t> tokens) {
  const Run run{0, tokens};
  return step(std::span<const Run>(&run, 1)).front();
}

namespace {
// The first `rows` logit rows of the last step, f16 on the device, as f32.
std::vector<float> copy_logit_rows(const DeviceMemory& logits, int64_t rows, int64_t vocab) {
  const size_t count = static_cast<size_t>(rows * vocab);
  std::vector<f16_bits> bits(count);
  if (count > 0) cuda::copy_to_host(bits.data(), logits.get(), count * 2);
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = f16_to_f32(bits[i]);
  return out;
}
}  // namespace

std::vector<float> GpuLlama::logits() const {
  return copy_logit_rows(state_->logits, 1, state_->config.vocab_size);
}

std::vector<float> GpuLlama::step_logits() const {
  return copy_logit_rows(state_->logits, state_->last_logit_rows, state_->config.vocab_size);
}

std::vector<int32_t> GpuLlama::sample_rows(std::span<const RowSample> rows) {
  State& s = *state_;
  const int64_t vocab = s.config.vocab_size;
  std::vector<cuda::SampleRowParams> params;
  std::vector<int32_t> penalty_ids;
  params.reserve(rows.size());
  for (const RowSample& r : rows) {
    QSPEC_CHECK(r.row >= 0 && r.row < s.last_logit_rows, "GPU sampling: row ", r.row, " of a step with ",
                s.last_logit_rows, " logit rows");
    const SamplingParams& p = r.params;
    Sampler::check(p);
    QSPEC_CHECK(p.greedy() || (r.draw >= 0 && r.draw < 1), "GPU sampling: draw ", r.draw, " outside [0, 1)");
    cuda::SampleRowParams row;
    row.row = static_cast<int32_t>(r.row);
    row.top_k = p.top_k;
    row.temperature = p.temperature;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    row.repetition_penalty = p.repetition_penalty;
    row.draw = r.draw;
    row.penalty_offset = static_cast<int32_t>(penalty_ids.size());
    if (p.repetition_penalty != 1.0f)
      for (int32_t id : r.penalised_ids)
        if (id >= 0 && id < vocab) penalty_ids.push_back(id);
    row.penalty_count = static_cast<int32_t>(penalty_ids.size()) - row.penalty_offset;
    params.push_back(row);
  }
  if (params.empty()) return {};
  auto fit = [](DeviceMemory& buffer, size_t bytes, const char* name) {
    if (buffer.bytes() < bytes) buffer = allocate(std::max<size_t>(bytes, 4096), name);
  };
  fit(s.sample_params, params.size() * sizeof(cuda::SampleRowParams), "sampling parameters");
  fit(s.sample_ids, params.size() * 4, "sampled ids");
  // On the step's stream (non-blocking): ordered before the kernel; the host vectors outlive the
  // synchronisation below.
  cuda::copy_to_device_async(s.sample_params.get(), params.data(), params.size() * sizeof(cuda::SampleRowParams),
                             s.stream);
  if (!penalty_ids.empty()) {
    fit(s.sample_penalty_ids, penalty_ids.size() * 4, "penalised ids");
    cuda::copy_to_device_async(s.sample_penalty_ids.get(), penalty_ids.data(), penalty_ids.size() * 4, s.stream);
  }
  cuda::sample_logits_f16(s.logits.as<f16_bits>(), vocab, s.sample_params.as<cuda::SampleRowParams>(),
                          static_cast<int64_t>(params.size()),
                          penalty_ids.empty() ? nullptr : s.sample_penalty_ids.as<int32_t>(), s.sample_ids.as<int32_t>(),
                          s.stream);
  std::vector<int32_t> ids(params.size());
  cuda::copy_to_host_async(ids.data(), s.sample_ids.get(), ids.size() * 4, s.stream);
  cuda::stream_synchronize(s.stream);
  for (int32_t id : ids) QSPEC_CHECK(id >= 0, "sampler: NaN in logits");
  return ids;
}

void GpuLlama::set_activations(GpuActivations activations) {
  check_activations(activations);  // before any change: a refused switch leaves the model as it was
  state_->activations = activations;
}

void GpuLlama::check_activations(GpuActivations activations) const {
  const State& s = *state_;
  if (activations == GpuActivations::f16) return;
  QSPEC_CHECK(s.quantized, "GPU model: quantized activations need 4-bit weights (this model runs w16a16)");
  const bool int4 = activations == GpuActivations::int4 || activations == GpuActivations::int4_arc;
  for (const Layer& layer : s.layers)
    for (const Linear* whole : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) {
      QSPEC_CHECK(!is_arc(activations) || whole->reordered(),
                  "GPU model: ARC activations need an ARC-calibrated checkpoint (qspec quantize --arc)");
      for_each_four_bit(*whole, [&](const Linear& linear) {  // the 8-bit parts take f16 activations
        QSPEC_CHECK(!int4 || (s.activation_group > 0 && s.activation_group % linear.view.group == 0 &&
                              linear.k % s.activation_group == 0 && linear.in_k % s.activation_group == 0),
                    "GPU model: int4 activation groups of ", s.activation_group,
                    " must be a multiple of the weight group ", linear.view.group, " and divide k ", linear.in_k,
                    " (and ", linear.k, " with augmented columns)");
      });
    }
}

GpuActivations GpuLlama::activations() const { return state_->activations; }

void GpuLlama::set_kv_view(int64_t window, int64_t sinks) {
  QSPEC_CHECK(window >= 0 && sinks >= 0 && (window > 0 || sinks == 0), "GPU model: kv view window ", window,
              " sinks ", sinks, " (sinks need a window)");
  state_->kv_window = window;
  state_->kv_sinks = window > 0 ? sinks : 0;
}

void GpuLlama::set_kv_cache_view(KvView view) {
  QSPEC_CHECK(view == KvView::full || state_->kv_format == KvCacheFormat::int8,
              "GPU model: the 4-bit KV view (a /k4 draft) reads an int8 KV cache; this model's cache is ",
              kv_cache_format_name(state_->kv_format), " (--kv-cache int8)");
  state_->kv_read = view;
}

KvCacheFormat GpuLlama::kv_cache_format() const { return state_->kv_format; }

void GpuLlama::set_draft_vocab(std::span<const int32_t> ids) {
  State& s = *state_;
  const ModelConfig& c = s.config;
  const int64_t rows = static_cast<int64_t>(ids.size());
  QSPEC_CHECK(rows >= 1 && rows <= c.vocab_size, "GPU model: a draft vocabulary of ", rows, " ids outside 1..",
              c.vocab_size);
  std::vector<bool> seen(static_cast<size_t>(c.vocab_size), false);
  for (int32_t id : ids) {
    QSPEC_CHECK(id >= 0 && id < c.vocab_size && !seen[static_cast<size_t>(id)], "GPU model: draft vocabulary id ", id,
                " is outside [0, ", c.vocab_size, ") or repeated");
    seen[static_cast<size_t>(id)] = true;
  }
  QSPEC_CHECK(!s.lm_head.quantized, "GPU model: the lm_head is not f16");
  s.vocab_subset = 0;
  s.draft_ids = upload(std::vector<int32_t>(ids.begin(), ids.end()), "draft vocabulary ids");
  // The rows gathered on the device from the lm_head itself (the embedding gather, with the
  // lm_head as its table): the same f16 values, for real and synthetic weights alike.
  s.draft_head = allocate(static_cast<size_t>(rows * c.hidden_size) * 2, "draft lm_head");
  cuda::embedding(s.draft_ids.as<int32_t>(), rows, s.lm_head.w16.as<f16_bits>(), c.vocab_size, c.hidden_size,
                  s.draft_head.as<f16_bits>(), s.stream);
  s.subset_logits = allocate(static_cast<size_t>(s.max_logit_rows * rows) * 2, "draft subset logits");
  cuda::stream_synchronize(s.stream);
  s.draft_rows = rows;
  // Captured graphs read the old buffers.
  s.decode_graphs.clear();
  s.verify_graphs_by_shape.clear();
}

int64_t GpuLlama::draft_vocab_rows() const { return state_->draft_rows; }

void GpuLlama::set_vocab_subset(int64_t n) {
  QSPEC_CHECK(n >= 0 && n <= state_->draft_rows, "GPU model: a vocabulary subset of ", n, " ids, but the draft "
              "vocabulary holds ", state_->draft_rows, " (GpuLlama::set_draft_vocab)");
  state_->vocab_subset = n;
}

int64_t GpuLlama::length(int64_t seq) const {
  QSPEC_CHECK(seq >= 0 && seq < max_seqs(), "GPU model: sequence ", seq, " outside 0..", max_seqs() - 1);
  return lengths_[static_cast<size_t>(seq)];
}

void GpuLlama::truncate(int64_t seq, int64_t new_length) {
  QSPEC_CHECK(seq >= 0 && seq < max_seqs(), "GPU model: sequence ", seq, " outside 0..", max_seqs() - 1);
  QSPEC_CHECK(new_length >= 0 && new_length <= state_->max_context, "GPU model: length ", new_length, " outside 0..",
              state_->max_context);
  // Growing is allowed too: benchmarks attend to a cache they filled with random values.
  lengths_[static_cast<size_t>(seq)] = new_length;
}

const ModelConfig& GpuLlama::config() const { return state_->config; }
int64_t GpuLlama::max_context() const { return state_->max_context; }
void GpuLlama::set_gemm_policy(std::shared_ptr<const gemm::PolicyMap> policy) {
  state_->gemm_policy_source = policy ? "given" : "";
  state_->apply_gemm_policy(std::move(policy));
}

const std::string& GpuLlama::gemm_policy_source() const { return state_->gemm_policy_source; }

int64_t GpuLlama::swiglu_epilogue_layers() const { return state_->swiglu_epilogue_layers; }

int64_t GpuLlama::graphs_captured() const {
  return static_cast<int64_t>(state_->decode_graphs.size() + state_->verify_graphs_by_shape.size());
}

size_t GpuLlama::weight_bytes() const {
  const State& s = *state_;
  size_t total = s.lm_head.bytes() + s.final_norm.bytes();
  for (const Layer& layer : s.layers)
    total += layer.qkv.bytes() + layer.o.bytes() + layer.gate_up.bytes() + layer.down.bytes() +
             layer.attention_norm.bytes() + layer.mlp_norm.bytes();
  return total;
}

size_t GpuLlama::kv_bytes_per_position() const {
  const ModelConfig& c = state_->config;
  return static_cast<size_t>(c.num_layers) * 2 *
         cuda::kv_pool_bytes_per_position(state_->kv_format, c.num_kv_heads, c.head_dim);
}

size_t GpuLlama::device_bytes() const {
  const State& s = *state_;
  size_t total = weight_bytes() + s.embedding.bytes();
  for (const Layer& layer : s.layers) total += layer.inv_freq.bytes();
  for (const DeviceMemory* m : {&s.block_tables, &s.inputs, &s.x, &s.normed, &s.qkv, &s.attn, &s.proj,
                                &s.gate_up, &s.act, &s.gathered, &s.logits, &s.out_ids, &s.gemm_workspace,
                                &s.attention_workspace})
    total += m->bytes();
  for (const DeviceMemory& m : s.k_pools) total += m.bytes();
  for (const DeviceMemory& m : s.v_pools) total += m.bytes();
  return total;
}

std::vector<int32_t> gpu_greedy_generate(GpuLlama& gpu, std::span<const int32_t> prompt, int64_t max_new_tokens,
                                         const std::vector<int32_t>& eos_ids) {
  gpu.reset(0);
  std::vector<int32_t> ids;
  if (max_new_tokens <= 0) return ids;
  int32_t next = gpu.forward(prompt);
  while (true) {
    ids.push_back(next);
    if (std::find(eos_ids.begin(), eos_ids.end(), next) != eos_ids.end()) break;
    if (static_cast<int64_t>(ids.size()) >= max_new_tokens) break;
    next = gpu.forward(std::span<const int32_t>(&next, 1));
  }
  return ids;
}

// ---- synthetic shapes ------------------------------------------------------------------

namespace {

struct SyntheticShape {
  const char* name;
  const char* architecture;  // config.json's architectures and model_type
  const char* shape;         // the rest of its fields: shapes and RoPE
};

constexpr const char* kLlamaArchitecture = R"("architectures": ["LlamaForCausalLM"], "model_type": "llama")";
constexpr const char* kQwen2Architecture = R"("architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2")";
constexpr const char* kQwen25_7bShape =
    R"("hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
       "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
       "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false)";

// config.json fields of the published checkpoints (shapes and RoPE only).
const SyntheticShape kSyntheticShapes[] = {
    {"llama3-8b", kLlamaArchitecture,
     R"("hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false)"},
    {"llama2-7b", kLlamaArchitecture,
     R"("hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false)"},
    {"qwen2.5-7b", kQwen2Architecture, kQwen25_7bShape},
    // The same shapes as a Llama layout, without the q/k/v biases: what the biases cost, in an
    // A/B of two bench runs.
    {"qwen2.5-7b-nobias", kLlamaArchitecture, kQwen25_7bShape},
};

}  // namespace

ModelConfig synthetic_model_config(const std::string& name) {
  for (const SyntheticShape& shape : kSyntheticShapes)
    if (name == shape.name)
      return parse_model_config(std::string("{") + shape.architecture + ", " + shape.shape + "}",
                                std::string("synthetic ") + shape.name);
  std::string names;
  for (const SyntheticShape& shape : kSyntheticShapes) names += std::string(names.empty() ? "" : ", ") + shape.name;
  fail("unknown synthetic model '", name, "' (known: ", names, ")");
}

std::vector<std::string> synthetic_model_names() {
  std::vector<std::string> names;
  for (const SyntheticShape& shape : kSyntheticShapes) names.emplace_back(shape.name);
  return names;
}

}  // namespace qspec
