// One 4-bit weight set, several activation precisions: a linear layer's weights quantized
// once (RTN per output row, in one of the weight formats of quant/formats.h), and the CPU
// reference GEMM that runs it with activations in any mode. The mode is an argument of each
// call, never a second copy of the weights: this is what QSpec's draft and verify share.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/weight_matrix.h"
#include "quant/formats.h"

namespace qspec {

// How activations enter a linear layer.
struct ActivationMode {
  enum class Kind : uint8_t {
    f32,        // unquantized f32 (the W16A16 baseline: weights too stay in the checkpoint dtype)
    f16,        // A16: rounded to f16, as the GPU W4A16 kernels consume them
    quantized,  // A8 / A4: per-token quantization in `format`, dequantized exactly
  };
  Kind kind = Kind::f32;
  quant::Format format = quant::Format::int8;  // kind == quantized
  int64_t group_size = quant::kDefaultGroupSize;  // int4 activations
  // ARCQuant: 4-bit activations (int4, nvfp4, mxfp4) get residual channels for the outlier
  // channels that calibration found (needs an ARC-calibrated model, see model/quantize.h).
  bool arc = false;
};

// A model run mode: which weights (checkpoint or 4-bit), which activations, and how much of the
// KV cache the attention reads.
struct RunMode {
  bool quantized_weights = false;
  ActivationMode activations;
  std::string name = "w16a16";
  // A QSpec draft's sparse view of the shared KV cache (DecodePlan::draft_window): > 0, every
  // layer attends to the last kv_window positions and the first kv_sinks (attention sinks)
  // only, so a draft step reads a bounded slice of the K/V at any context. 0: the whole cache
  // (or the model's own sliding window).
  int64_t kv_window = 0;
  int64_t kv_sinks = 0;
  bool sparse_kv() const { return kv_window > 0; }
  // A QSpec draft's vocabulary subset (DecodePlan::draft_vocab): > 0, the lm_head scores only the
  // first vocab_subset ids of the model's draft vocabulary table and every other logit is -inf
  // (LlamaModel::draft_head). 0: the whole vocabulary.
  int64_t vocab_subset = 0;
  // A QSpec draft's layer skipping (DecodePlan::draft_skip): > 0, the pass skips the first
  // skip_layers layers of the model's draft skip table (LlamaModel::skipped_layers): each is the
  // identity on the residual stream and writes no K/V. 0: every layer.
  int64_t skip_layers = 0;
  // A QSpec draft's 4-bit view of an 8-bit KV cache (DecodePlan::draft_kv4, `/k4`): true, the
  // attention reads only the high nibble of each code (KvView::high_nibble, ops/kv_int8.h; a bool
  // here because quant/ sits below ops/). Every other pass reads every bit; an f16 cache has no
  // other view.
  bool kv_high_nibble = false;
  // Names the mode with its view, its vocabulary, its skipped layers and its KV bits: passes that
  // share a key run together.
  std::string key() const {
    std::string key = name;
    if (sparse_kv()) key += "/kv" + std::to_string(kv_window) + "+" + std::to_string(kv_sinks);
    if (vocab_subset > 0) key += "/v" + std::to_string(vocab_subset);
    if (skip_layers > 0) key += "/s" + std::to_string(skip_layers);
    if (kv_high_nibble) key += "/k4";
    return key;
  }
};

// "w16a16", "w4a16", "w4a8" (int8), "w4a8-fp8", "w4a4" (= w4a4-int4), "w4a4-int4",
// "w4a4-nvfp4", "w4a4-mxfp4", and the ARC variants "w4a4-int4-arc", "w4a4-nvfp4-arc",
// "w4a4-mxfp4-arc". Unknown names throw qspec::Error listing these.
RunMode parse_run_mode(std::string_view name);
const std::vector<std::string>& run_mode_names();
// The activations name a mode's 4-bit GEMMs take in a GEMM policy map: "f16", or the format of
// its quantized activations ("int8", "fp8", "nvfp4", ...).
std::string gemm_activations_name(const RunMode& mode);

// A [rows x cols] weight matrix quantized row by row (a row is one output channel, so the
// blocks run along K, the reduction dimension).
struct QuantizedMatrix {
  std::string name;
  quant::RowFormat format{quant::Format::int4, quant::Role::weight, 0, 0};
  int64_t rows = 0;
  std::vector<uint8_t> codes;   // rows x format.code_bytes()
  std::vector<uint8_t> scales;  // rows x format.scale_bytes()
  // Decoded from `scales` by prepare(): rows x blocks block scales, rows tensor scales, and
  // for int4-asym rows x blocks block minimums (empty for the other formats).
  std::vector<float> block_scale_values, tensor_scale_values, block_min_values;

  // Optional: every row already dequantized (rows x cols f32), filled by prepare() when the
  // process-wide f32 weight cache is on (cpu::set_f32_weight_cache). It trades 8x the weight
  // memory for skipping the per-pass decode; results are bit-identical either way.
  std::vector<float> decoded;

  // Decodes the scales for dequantize_row; call after filling codes and scales.
  void prepare();

  int64_t cols() const { return format.k; }
  bool has_min() const { return quant::format_has_min(format.format); }
  size_t bytes() const { return codes.size() + scales.size(); }
  // Row `row` dequantized to f32 into out[cols].
  void dequantize_row(int64_t row, float* out) const;
};

// Round-to-nearest quantization of a checkpoint matrix (nvfp4 gets its tensor scale from the
// whole matrix), on grids chosen by `fit` (formats.h). Errors name the matrix when its K is not
// a multiple of the format's block.
QuantizedMatrix quantize_rtn(const WeightMatrix& weight, quant::Format format,
                             int64_t group_size = quant::kDefaultGroupSize,
                             quant::BlockFit fit = quant::BlockFit::range);

namespace cpu {
// CPU backend option: keep a dequantized f32 copy of each 4-bit matrix prepared after this
// call (off by default: memory then holds only the 4-bit codes). Decoding every weight on
// every forward pass dominates small-batch CPU time; the cache removes it.
void set_f32_weight_cache(bool enabled);
bool f32_weight_cache();

}  // namespace cpu

}  // namespace qspec
