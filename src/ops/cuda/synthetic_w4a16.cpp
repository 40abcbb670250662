// Random 4-bit W4A16 weights on the GPU (ops/cuda/synthetic_w4a16.h).
#include "ops/cuda/synthetic_w4a16.h"

#include <algorithm>

#include "ops/w4a16_pack.h"
#include "qspec/error.h"

namespace qspec::cuda {
namespace {

void check_format(int64_t k, int64_t group, quant::Format format) {
  QSPEC_CHECK(format == quant::Format::int4 || format == quant::Format::int4_asym || format == quant::Format::int4_zp,
              "synthetic 4-bit weights: format ", quant::format_name(format), " (int4, int4-asym or int4-zp)");
  QSPEC_CHECK((group == 32 || group == 64 || group == 128) && k % group == 0, "synthetic 4-bit weights: group ", group,
              " (32, 64 or 128) must divide k ", k);
}

}  // namespace

size_t synthetic_w4a16_scale_bytes(int64_t n, int64_t k, int64_t group, quant::Format format) {
  check_format(k, group, format);
  const int64_t row_blocks = (n + 15) / 16, groups = k / group;
  const size_t scale_bytes = static_cast<size_t>(row_blocks * groups * 8) * 4;
  if (format == quant::Format::int4_asym) return 2 * scale_bytes;
  if (format == quant::Format::int4_zp)
    return scale_bytes + static_cast<size_t>(row_blocks * gemm::zero_point_bytes_per_row_block(groups));
  return scale_bytes;
}

SyntheticW4A16 make_synthetic_w4a16(int64_t n, int64_t k, int64_t group, quant::Format format, float scale_lo,
                                    float scale_hi, uint64_t seed, void* stream) {
  const size_t buffer_bytes = synthetic_w4a16_scale_bytes(n, k, group, format);
  const int64_t row_blocks = (n + 15) / 16;
  const size_t code_bytes = static_cast<size_t>(row_blocks * k * 8);
  const size_t scale_halves = static_cast<size_t>(row_blocks * (k / group) * 16);
  SyntheticW4A16 w{DeviceMemory(code_bytes), DeviceMemory(std::max<size_t>(buffer_bytes, 16)), {}};
  fill_random_u32(w.codes.as<uint32_t>(), code_bytes / 4, seed, stream);
  fill_random_f16(w.scales.as<f16_bits>(), scale_halves, scale_lo, scale_hi, seed + 1, stream);
  w.view = {w.codes.get(), w.scales.get(), n, k, group};
  if (format == quant::Format::int4) return w;
  // The minimums or zero points right after the scales, in their buffer (W4A16Weights::mins).
  f16_bits* mins = w.scales.as<f16_bits>() + scale_halves;
  if (format == quant::Format::int4_zp) {
    fill_random_zero_points(reinterpret_cast<uint32_t*>(mins), (buffer_bytes - scale_halves * 2) / 4, 7, 8, seed + 2,
                            stream);
    w.view.zero_codes = true;
  } else {
    const float mid = 0.5f * (scale_lo + scale_hi);
    fill_random_f16(mins, scale_halves, -8.0f * mid, -7.5f * mid, seed + 2, stream);
  }
  w.view.mins = mins;
  return w;
}

SyntheticW4A16Copies make_synthetic_w4a16_copies(int64_t n, int64_t k, int64_t group, quant::Format format,
                                                 float scale_lo, float scale_hi, uint64_t seed, void* stream) {
  const size_t bytes = static_cast<size_t>((n + 15) / 16 * k * 8) + synthetic_w4a16_scale_bytes(n, k, group, format);
  const int copies = weight_copies_beyond_l2(bytes);
  SyntheticW4A16Copies out;
  for (int i = 0; i < copies; ++i) {
    out.weights.push_back(make_synthetic_w4a16(n, k, group, format, scale_lo, scale_hi, seed + 3 * i, stream));
    out.views.push_back(out.weights.back().view);
  }
  return out;
}

}  // namespace qspec::cuda
