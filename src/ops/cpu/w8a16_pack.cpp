// int8-group weights repacked for the CUDA W8A16 kernel (layout: ops/w8a16_pack.h).
#include "ops/w8a16_pack.h"

#include <cstring>

#include "qspec/error.h"

namespace qspec::gemm {
namespace {

// Byte offset, inside a row block, of lane `lane`'s 8 bytes of k tile j of chunk c.
int64_t tile_offset(int64_t chunk, int64_t j, int64_t lane) { return chunk * 512 + lane * 16 + j * 8; }

}  // namespace

std::string w8a16_unsupported_reason(const QuantizedMatrix& weight) {
  if (weight.format.format != quant::Format::int8_group)
    return "the W8A16 kernel takes int8-group weights (got " + std::string(quant::format_name(weight.format.format)) + ")";
  const int64_t group = weight.format.block, k = weight.cols();
  if (!w8a16_group_supported(group))
    return "the W8A16 kernel takes groups of 16 or a power of two from 32 (got " + std::to_string(group) + ")";
  if (k <= 0 || k % 32 != 0 || k % group != 0)
    return "the W8A16 kernel takes k a multiple of 32 and of the group (got k " + std::to_string(k) + ", group " +
           std::to_string(group) + ")";
  if (weight.block_scale_values.size() != static_cast<size_t>(weight.rows * (k / group)))
    return "its scales are not decoded (QuantizedMatrix::prepare)";
  if (weight.codes.size() != static_cast<size_t>(weight.rows * weight.format.code_bytes()))
    return "its codes do not match its shape";
  return "";
}

W8A16Packed pack_w8a16(const QuantizedMatrix& weight) {
  const std::string reason = w8a16_unsupported_reason(weight);
  QSPEC_CHECK(reason.empty(), weight.name, ": ", reason);
  W8A16Packed out;
  out.n = weight.rows;
  out.k = weight.cols();
  out.group = weight.format.block;
  const int64_t k = out.k, blocks = out.row_blocks(), groups = out.groups();
  out.codes.assign(static_cast<size_t>(blocks * k * 16), 0);
  out.scales.assign(static_cast<size_t>(blocks * groups * 16), 0.0f);
  const int64_t code_bytes = weight.format.code_bytes();
  auto code = [&](int64_t row, int64_t col) -> int8_t {
    if (row >= weight.rows) return 0;
    return static_cast<int8_t>(weight.codes[static_cast<size_t>(row * code_bytes + col)]);
  };
  for (int64_t rb = 0; rb < blocks; ++rb) {
    int8_t* block_codes = out.codes.data() + rb * k * 16;
    for (int64_t chunk = 0; chunk < k / 32; ++chunk)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t lane = 0; lane < 32; ++lane) {
          const int64_t g = lane / 4, t = lane % 4, p = 32 * chunk + 16 * j + 4 * t;
          const int64_t r0 = rb * 16 + g, r1 = r0 + 8;
          const int8_t bytes[8] = {code(r0, p),     code(r0, p + 1), code(r1, p),     code(r1, p + 1),
                                   code(r0, p + 2), code(r0, p + 3), code(r1, p + 2), code(r1, p + 3)};
          std::memcpy(block_codes + tile_offset(chunk, j, lane), bytes, 8);
        }
    for (int64_t q = 0; q < groups; ++q)
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t row = rb * 16 + r;
        const float scale = row < weight.rows ? weight.block_scale_values[static_cast<size_t>(row * groups + q)] : 0.0f;
        out.scales[static_cast<size_t>((rb * groups + q) * 16 + 2 * (r % 8) + r / 8)] = scale;
      }
  }
  return out;
}

float W8A16Packed::value(int64_t row, int64_t col) const {
  QSPEC_CHECK(row >= 0 && row < row_blocks() * 16 && col >= 0 && col < k, "W8A16Packed::value out of range");
  const int64_t rb = row / 16, r = row % 16, g = r % 8, high_row = r / 8;
  const int64_t chunk = col / 32, j = (col % 32) / 16, t = (col % 16) / 4, s = col % 4;
  // s = 0, 1 -> bytes 0, 1 (row g) or 2, 3 (row g + 8); s = 2, 3 -> bytes 4, 5 or 6, 7.
  const int64_t byte = (s / 2) * 4 + high_row * 2 + (s % 2);
  const int8_t code = codes[static_cast<size_t>(rb * k * 16 + tile_offset(chunk, j, 4 * g + t) + byte)];
  const float scale = scales[static_cast<size_t>((rb * groups() + col / group) * 16 + 2 * g + high_row)];
  return static_cast<float>(code) * scale;
}

}  // namespace qspec::gemm
