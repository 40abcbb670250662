#include "ops/w4a16_pack.h"

#include <cmath>
#include <cstring>

#include "base/dtype.h"
#include "qspec/error.h"

namespace qspec::gemm {
namespace {

// The packed nibble of W[row][col]: offset binary (code + 8) for int4, the unsigned code itself
// for int4-asym / int4-zp; 8 (int4 value 0) past the last row, whose scales (and minimums) are zero.
uint32_t packed_nibble(const QuantizedMatrix& weight, int64_t row, int64_t col) {
  if (row >= weight.rows) return 8;
  const uint8_t byte = weight.codes[static_cast<size_t>(row * weight.format.code_bytes() + col / 2)];
  const uint32_t code = (col & 1) ? (byte >> 4) : (byte & 0xf);  // two's complement nibble (int4), unsigned (asym)
  return weight.has_min() ? code : code ^ 0x8u;
}

// An int4-asym / int4-zp group's f32 scale or minimum as the kernels' f16, refused where f16 cannot hold it.
uint16_t asym_f16(const QuantizedMatrix& weight, float value, const char* what, int64_t row, int64_t block) {
  const uint16_t bits = f32_to_f16(value);
  QSPEC_CHECK(std::isfinite(f16_to_f32(bits)), weight.name, ": ", quant::format_name(weight.format.format), " ", what, " ", value, " of row ", row,
              " group ", block, " overflows the GPU's f16");
  return bits;
}

uint16_t scale_bits(const QuantizedMatrix& weight, int64_t row, int64_t col) {
  if (row >= weight.rows) return 0;
  const int64_t block = col / weight.format.block;
  const uint8_t* row_scales = weight.scales.data() + row * weight.format.scale_bytes();
  if (weight.has_min()) return asym_f16(weight, quant::block_scale(weight.format, row_scales, block), "scale", row, block);
  const uint8_t* scales = row_scales + block * 2;
  return static_cast<uint16_t>(scales[0] | (scales[1] << 8));  // little-endian f16
}

uint16_t min_bits(const QuantizedMatrix& weight, int64_t row, int64_t col) {
  if (row >= weight.rows) return 0;
  const int64_t block = col / weight.format.block;
  const uint8_t* row_scales = weight.scales.data() + row * weight.format.scale_bytes();
  return asym_f16(weight, quant::block_min(weight.format, row_scales, block), "minimum", row, block);
}

// Byte offset, inside a row block, of the word of (pair, tile j, lane).
int64_t word_offset(int64_t k, int64_t pair, int64_t j, int64_t lane) {
  const int64_t chunk = pair / 2;
  const bool tail = (k % 64 == 32) && chunk == k / 64;
  if (tail) return chunk * 512 + lane * 8 + j * 4;
  return chunk * 512 + lane * 16 + ((pair & 1) * 2 + j) * 4;
}

// int4-zp: the zero-point byte of rows (row, row + 8) at column col (ops/w4a16_pack.h); rows past
// the matrix have zero point 0 (their scales are zero).
uint8_t zero_byte(const QuantizedMatrix& weight, int64_t row, int64_t col) {
  auto zero_of = [&](int64_t r) {
    if (r >= weight.rows) return 0;
    return quant::block_zero_point(weight.format, weight.scales.data() + r * weight.format.scale_bytes(),
                                   col / weight.format.block);
  };
  return static_cast<uint8_t>(zero_of(row) | (zero_of(row + 8) << 4));
}

}  // namespace

int64_t w4a16_kernel_group(const QuantizedMatrix& weight) {
  const quant::Format format = weight.format.format;
  if (format != quant::Format::int4 && format != quant::Format::int4_channel && !quant::format_has_min(format))
    return 0;
  for (int64_t group : {128, 64, 32})
    if (weight.format.block % group == 0) return group;
  return 0;
}

W4A16Packed pack_w4a16(const QuantizedMatrix& weight) {
  const int64_t group = w4a16_kernel_group(weight);
  QSPEC_CHECK(weight.format.format != quant::Format::int8_group, weight.name,
              ": int8-group (8-bit) weights take the W8A16 kernel (gemm::pack_w8a16), not the 4-bit ones");
  QSPEC_CHECK(group != 0, weight.name, ": the W4A16 GPU kernels take int4 / int4-channel / int4-asym weights with "
              "groups of a multiple of 32 (got ", quant::format_name(weight.format.format), ", block ",
              weight.format.block, ")");
  QSPEC_CHECK(weight.codes.size() == static_cast<size_t>(weight.rows * weight.format.code_bytes()) &&
                  weight.scales.size() == static_cast<size_t>(weight.rows * weight.format.scale_bytes()),
              weight.name, ": codes / scales do not match its shape");
  W4A16Packed out;
  out.n = weight.rows;
  out.k = weight.cols();
  out.group = group;
  const int64_t k = out.k, blocks = out.row_blocks(), pairs = k / 32;
  out.codes.assign(static_cast<size_t>(blocks * k * 8), 0);
  out.scales.assign(static_cast<size_t>(blocks * out.groups() * 8), 0);
  out.zero_codes = weight.format.format == quant::Format::int4_zp;
  const int64_t zero_bytes = zero_point_bytes_per_row_block(out.groups());
  if (out.zero_codes) out.mins.assign(static_cast<size_t>(blocks * zero_bytes / 4), 0);
  else if (weight.has_min()) out.mins.assign(out.scales.size(), 0);
  for (int64_t rb = 0; rb < blocks; ++rb) {
    uint8_t* block_codes = out.codes.data() + rb * k * 8;
    for (int64_t pair = 0; pair < pairs; ++pair)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t lane = 0; lane < 32; ++lane) {
          const int64_t g = lane / 4, t = lane % 4;
          const int64_t p = 32 * pair + 8 * t + 4 * j;
          const int64_t r0 = rb * 16 + g, r1 = r0 + 8;
          const uint32_t nibbles[8] = {
              packed_nibble(weight, r0, p),     packed_nibble(weight, r1, p),
              packed_nibble(weight, r0, p + 2), packed_nibble(weight, r1, p + 2),
              packed_nibble(weight, r0, p + 1), packed_nibble(weight, r1, p + 1),
              packed_nibble(weight, r0, p + 3), packed_nibble(weight, r1, p + 3)};
          uint32_t word = 0;
          for (int i = 0; i < 8; ++i) word |= nibbles[i] << (4 * i);
          std::memcpy(block_codes + word_offset(k, pair, j, lane), &word, 4);
        }
    for (int64_t q = 0; q < out.groups(); ++q)
      for (int64_t r = 0; r < 8; ++r) {
        const int64_t col = q * group;
        const uint32_t lo = scale_bits(weight, rb * 16 + r, col), hi = scale_bits(weight, rb * 16 + r + 8, col);
        out.scales[static_cast<size_t>((rb * out.groups() + q) * 8 + r)] = lo | (hi << 16);
        if (out.zero_codes)
          reinterpret_cast<uint8_t*>(out.mins.data())[rb * zero_bytes + q * 8 + r] = zero_byte(weight, rb * 16 + r, col);
        else if (weight.has_min())
          out.mins[static_cast<size_t>((rb * out.groups() + q) * 8 + r)] =
              min_bits(weight, rb * 16 + r, col) | (static_cast<uint32_t>(min_bits(weight, rb * 16 + r + 8, col)) << 16);
      }
  }
  return out;
}

void round_zero_point_blocks_to_f16(QuantizedMatrix& weight) {
  if (weight.format.format != quant::Format::int4_asym) return;
  const int64_t blocks = weight.cols() / weight.format.block;
  for (int64_t row = 0; row < weight.rows; ++row) {
    uint8_t* row_scales = weight.scales.data() + row * weight.format.scale_bytes();
    for (int64_t block = 0; block < blocks; ++block) {
      const float scale = f16_to_f32(asym_f16(weight, quant::block_scale(weight.format, row_scales, block), "scale",
                                              row, block));
      const float min = f16_to_f32(asym_f16(weight, quant::block_min(weight.format, row_scales, block), "minimum",
                                            row, block));
      quant::store_asym_block(weight.format, row_scales, block, scale, min);
    }
  }
  weight.prepare();  // the decoded block values (and a cached f32 decode) from the new scales
}

float W4A16Packed::value(int64_t row, int64_t col) const {
  QSPEC_CHECK(row >= 0 && row < row_blocks() * 16 && col >= 0 && col < k, "W4A16Packed::value out of range");
  const int64_t rb = row / 16, r = row % 16, g = r % 8, high_row = r / 8;
  const int64_t pair = col / 32, within = col % 32, t = within / 8, j = (within % 8) / 4, s = within % 4;
  const int64_t lane = 4 * g + t;
  uint32_t word;
  std::memcpy(&word, codes.data() + rb * k * 8 + word_offset(k, pair, j, lane), 4);
  // s = 0, 1, 2, 3 -> nibbles (n0, n4, n2, n6) for row g, (n1, n5, n3, n7) for row g + 8.
  static constexpr int kNibble[4] = {0, 4, 2, 6};
  const int nibble = kNibble[s] + static_cast<int>(high_row);
  const int nibble_value = static_cast<int>((word >> (4 * nibble)) & 0xf);
  const size_t group_word = static_cast<size_t>((rb * groups() + col / group) * 8 + g);
  auto half_of = [&](uint32_t pair_bits) {
    return f16_to_f32(static_cast<uint16_t>(high_row ? pair_bits >> 16 : pair_bits & 0xffff));
  };
  const float scale = half_of(scales[group_word]);
  // int4-zp: s * (u - z), z this row's nibble of its zero-point byte (exact, as the CPU decodes).
  if (zero_codes) {
    const uint8_t byte = reinterpret_cast<const uint8_t*>(
        mins.data())[rb * zero_point_bytes_per_row_block(groups()) + (col / group) * 8 + g];
    const int zero = high_row ? byte >> 4 : byte & 0xf;
    return scale * static_cast<float>(nibble_value - zero);
  }
  // int4-asym: fma(code, s, m), as the CPU format decodes (exact for f16 s, m of nearby exponents).
  if (has_min()) return std::fma(static_cast<float>(nibble_value), scale, half_of(mins[group_word]));
  return static_cast<float>(nibble_value - 8) * scale;
}

std::vector<uint16_t> w4a16_pack_x_order(const uint16_t* x, int64_t m, int64_t k, int64_t ldx) {
  QSPEC_CHECK(k % 32 == 0 && ldx >= k, "w4a16_pack_x_order: k ", k, " must be a multiple of 32 and ldx ", ldx,
              " >= k");
  std::vector<uint16_t> out(static_cast<size_t>(m * ldx));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(r * ldx + w4a16_packed_x_index(i))] = x[r * ldx + i];
    for (int64_t i = k; i < ldx; ++i) out[static_cast<size_t>(r * ldx + i)] = x[r * ldx + i];
  }
  return out;
}

}  // namespace qspec::gemm
