#include "quant/quantized_linear.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "base/dtype.h"
#include "base/thread_pool.h"
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

std::string gemm_activations_name(const RunMode& mode) {
  return mode.activations.kind == ActivationMode::Kind::quantized ? std::string(quant::format_name(mode.activations.format))
                                                                   : "f16";
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
  block_min_values.assign(has_min() ? static_cast<size_t>(rows * blocks) : 0, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row_scales = scales.data() + r * format.scale_bytes();
    for (int64_t b = 0; b < blocks; ++b) block_scale_values[r * blocks + b] = quant::block_scale(format, row_scales, b);
    if (has_min())
      for (int64_t b = 0; b < blocks; ++b) block_min_values[r * blocks + b] = quant::block_min(format, row_scales, b);
    tensor_scale_values[r] = quant::row_tensor_scale(format, row_scales);
  }
  decoded.clear();
  // int8-group rows are read by the int8-block GEMM, never from an f32 copy.
  if (cpu::f32_weight_cache() && format.format != quant::Format::int8_group) {
    decoded.resize(static_cast<size_t>(rows * cols()));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(r, decoded.data() + r * cols());
  }
}

void QuantizedMatrix::dequantize_row(int64_t row, float* out) const {
  const uint8_t* row_codes = codes.data() + row * format.code_bytes();
  if (format.format == quant::Format::int8_group) {  // code * scale (quant/formats.h), one byte a code
    const float* row_block_scales = block_scale_values.data() + row * format.blocks();
    for (int64_t i = 0; i < format.k; ++i)
      out[i] = static_cast<float>(static_cast<int8_t>(row_codes[i])) * row_block_scales[i / format.block];
    return;
  }
  // Otherwise the weights are 4-bit: a 16-entry table per nibble, then the documented order
  // (element * block scale) * tensor scale, so this equals quant::dequantize_row bit for bit
  // (tested) at a fraction of its cost: decode dequantizes every weight once per token.
  float nibble_values[16];
  for (uint8_t code = 0; code < 16; ++code) {
    const uint8_t byte = code;
    nibble_values[code] = quant::element_value(format, &byte, 0);
  }
  const float tensor_scale = tensor_scale_values[row];
  const float* row_block_scales = block_scale_values.data() + row * format.blocks();
  if (has_min()) {  // int4-asym: fma(code, scale, min), tensor scale 1 (quant/formats.h)
    const float* row_block_mins = block_min_values.data() + row * format.blocks();
    for (int64_t b = 0; b < format.blocks(); ++b) {
      const float scale = row_block_scales[b], min = row_block_mins[b];
      const uint8_t* block_codes = row_codes + b * format.block / 2;
      float* block_out = out + b * format.block;
      for (int64_t i = 0; i < format.block / 2; ++i) {
        block_out[2 * i] = std::fma(nibble_values[block_codes[i] & 0xf], scale, min);
        block_out[2 * i + 1] = std::fma(nibble_values[block_codes[i] >> 4], scale, min);
      }
    }
    return;
  }
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

QuantizedMatrix quantize_rtn(const WeightMatrix& weight, quant::Format format, int64_t group_size,
                             quant::BlockFit fit) {
  QSPEC_CHECK(quant::format_supports(format, quant::Role::weight), weight.name, ": '",
              quant::format_name(format), "' is not a weight format (", quant::weight_format_names(", "), ")");
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
                          out.scales.data() + r * scale_bytes, fit);
    } catch (const Error& error) {
      fail(weight.name, " row ", r, ": ", error.what());
    }
  }
  out.prepare();
  return out;
}

}  // namespace qspec
