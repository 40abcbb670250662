#include "quant/quantized_linear.h"

#include <algorithm>
#include <atomic>

#include "base/dtype.h"
#include "base/thread_pool.h"
#include "ops/linear.h"  // cpu::dot_rows_f32 (an up-arrow: tools/check_layers.py KNOWN)
#include "qspec/error.h"

namespace qspec {

namespace {
RunMode make_mode(std::string name, bool quantized_weights, ActivationMode::Kind kind,
                  quant::Format format = quant::Format::int8, bool arc = false) {
  RunMode mode;
  mode.activations.arc = arc;
  mode.name = std::move(name);
  mode.quantized_weights = quantized_weights;
  mode.activations.kind = kind;
  mode.activations.format = format;
  return mode;
}

const std::vector<RunMode>& all_modes() {
  using Kind = ActivationMode::Kind;
  using quant::Format;
  static const std::vector<RunMode> modes = {
      make_mode("w16a16", false, Kind::f32),
      make_mode("w4a16", true, Kind::f16),
      make_mode("w4a8", true, Kind::quantized, Format::int8),
      make_mode("w4a8-fp8", true, Kind::quantized, Format::fp8),
      make_mode("w4a4-int4", true, Kind::quantized, Format::int4),
      make_mode("w4a4-nvfp4", true, Kind::quantized, Format::nvfp4),
      make_mode("w4a4-mxfp4", true, Kind::quantized, Format::mxfp4),
      make_mode("w4a4-int4-arc", true, Kind::quantized, Format::int4, true),
      make_mode("w4a4-nvfp4-arc", true, Kind::quantized, Format::nvfp4, true),
      make_mode("w4a4-mxfp4-arc", true, Kind::quantized, Format::mxfp4, true),
  };
  return modes;
}
}  // namespace

const std::vector<std::string>& run_mode_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const RunMode& mode : all_modes()) out.push_back(mode.name);
    return out;
  }();
  return names;
}

RunMode parse_run_mode(std::string_view name) {
  const std::string_view canonical = name == "w4a4" ? std::string_view("w4a4-int4") : name;
  for (const RunMode& mode : all_modes())
    if (mode.name == canonical) return mode;
  std::string known;
  for (const std::string& mode : run_mode_names()) known += (known.empty() ? "" : ", ") + mode;
  fail("unknown mode '", name, "' (known: ", known, ", w4a4 = w4a4-int4)");
}

namespace {
std::atomic<bool> f32_weight_cache_enabled{false};
}

void cpu::set_f32_weight_cache(bool enabled) { f32_weight_cache_enabled.store(enabled); }
bool cpu::f32_weight_cache() { return f32_weight_cache_enabled.load(); }

void QuantizedMatrix::prepare() {
  const int64_t blocks = format.blocks();
  block_scale_values.resize(static_cast<size_t>(rows * blocks));
  tensor_scale_values.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row_scales = scales.data() + r * format.scale_bytes();
    for (int64_t b = 0; b < blocks; ++b) block_scale_values[r * blocks + b] = quant::block_scale(format, row_scales, b);
    tensor_scale_values[r] = quant::row_tensor_scale(format, row_scales);
  }
  decoded.clear();
  if (cpu::f32_weight_cache()) {
    decoded.resize(static_cast<size_t>(rows * cols()));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(r, decoded.data() + r * cols());
  }
}

void QuantizedMatrix::dequantize_row(int64_t row, float* out) const {
  const uint8_t* row_codes = codes.data() + row * format.code_bytes();
  // Weights are 4-bit: a 16-entry table per nibble, then the documented order
  // (element * block scale) * tensor scale, so this equals quant::dequantize_row bit for bit
  // (tested) at a fraction of its cost: decode dequantizes every weight once per token.
  float nibble_values[16];
  for (uint8_t code = 0; code < 16; ++code) {
    const uint8_t byte = code;
    nibble_values[code] = quant::element_value(format, &byte, 0);
  }
  const float tensor_scale = tensor_scale_values[row];
  const float* row_block_scales = block_scale_values.data() + row * format.blocks();
  for (int64_t b = 0; b < format.blocks(); ++b) {
    const float scale = row_block_scales[b];
    const uint8_t* block_codes = row_codes + b * format.block / 2;
    float* block_out = out + b * format.block;
    for (int64_t i = 0; i < format.block / 2; ++i) {
      block_out[2 * i] = (nibble_values[block_codes[i] & 0xf] * scale) * tensor_scale;
      block_out[2 * i + 1] = (nibble_values[block_codes[i] >> 4] * scale) * tensor_scale;
    }
  }
}

QuantizedMatrix quantize_rtn(const WeightMatrix& weight, quant::Format format, int64_t group_size) {
  QSPEC_CHECK(quant::format_supports(format, quant::Role::weight), weight.name, ": '",
              quant::format_name(format), "' is not a weight format (int4, int4-channel, nvfp4, mxfp4)");
  QuantizedMatrix out;
  out.name = weight.name;
  out.rows = weight.rows;
  try {
    out.format = quant::make_row_format(format, quant::Role::weight, weight.cols, group_size);
  } catch (const Error& error) {
    fail(weight.name, " [", weight.rows, " x ", weight.cols, "]: cannot quantize: ", error.what());
  }
  std::vector<float> row(static_cast<size_t>(weight.cols));
  if (format == quant::Format::nvfp4) {
    float amax = 0.0f;
    for (int64_t r = 0; r < weight.rows; ++r) {
      weight.row_to_f32(r, row.data());
      amax = std::max(amax, quant::abs_max(row.data(), weight.cols));
    }
    out.format.tensor_scale = quant::nvfp4_tensor_scale(amax);
  }
  const int64_t code_bytes = out.format.code_bytes(), scale_bytes = out.format.scale_bytes();
  out.codes.resize(static_cast<size_t>(weight.rows * code_bytes));
  out.scales.resize(static_cast<size_t>(weight.rows * scale_bytes));
  for (int64_t r = 0; r < weight.rows; ++r) {
    weight.row_to_f32(r, row.data());
    try {
      quant::quantize_row(out.format, row.data(), out.codes.data() + r * code_bytes,
                          out.scales.data() + r * scale_bytes);
    } catch (const Error& error) {
      fail(weight.name, " row ", r, ": ", error.what());
    }
  }
  out.prepare();
  return out;
}

namespace cpu {

void apply_activation_mode(const ActivationMode& mode, float* x, int64_t tokens, int64_t k) {
  switch (mode.kind) {
    case ActivationMode::Kind::f32:
      return;
    case ActivationMode::Kind::f16:
      for (int64_t i = 0; i < tokens * k; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
      return;
    case ActivationMode::Kind::quantized: {
      const quant::RowFormat format =
          quant::make_row_format(mode.format, quant::Role::activation, k, mode.group_size);
      // Each token alone: its quantized values never depend on the rest of the batch.
      ThreadPool::global().parallel_for(static_cast<size_t>(tokens), 1, [&](size_t begin, size_t end) {
        for (size_t t = begin; t < end; ++t) quant::fake_quantize_row(format, x + static_cast<int64_t>(t) * k);
      });
      return;
    }
  }
}

void quantized_linear(const float* x, int64_t tokens, const QuantizedMatrix& weight,
                      const float* bias, float* y) {
  const int64_t n = weight.rows, k = weight.cols();
  const int64_t row_blocks = (n + kLinearRowBlock - 1) / kLinearRowBlock;
  const size_t grain =
      static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, k * tokens * kLinearRowBlock)));
  ThreadPool::global().parallel_for(static_cast<size_t>(row_blocks), grain, [&](size_t begin, size_t end) {
    // The dequantized block of rows stays in L1/L2 while every token streams past it. One
    // buffer per thread, reused: this runs a few hundred times per decoded token.
    thread_local std::vector<float> block;
    block.resize(static_cast<size_t>(kLinearRowBlock * k));
    for (int64_t b = static_cast<int64_t>(begin); b < static_cast<int64_t>(end); ++b) {
      const int64_t row0 = b * kLinearRowBlock;
      const int64_t count = std::min(kLinearRowBlock, n - row0);
      const float* rows[kLinearRowBlock];
      for (int64_t r = 0; r < count; ++r) {
        if (!weight.decoded.empty()) {
          rows[r] = weight.decoded.data() + (row0 + r) * k;
        } else {
          weight.dequantize_row(row0 + r, block.data() + r * k);
          rows[r] = block.data() + r * k;
        }
      }
      for (int64_t r = count; r < kLinearRowBlock; ++r) rows[r] = rows[count - 1];
      for (int64_t t = 0; t < tokens; ++t) {
        float sums[kLinearRowBlock];
        dot_rows_f32(x + t * k, rows, count, k, sums);
        float* out = y + t * n + row0;
        for (int64_t r = 0; r < count; ++r) out[r] = sums[r] + (bias ? bias[row0 + r] : 0.0f);
      }
    }
  });
}

}  // namespace cpu
}  // namespace qspec
