#include "ops/w4_bitplanes.h"

#include <cstring>

#include "ops/w4a16_pack.h"
#include "qspec/error.h"

namespace qspec::gemm {

std::vector<uint8_t> pack_w4_bitplanes(const W4A16Packed& packed) {
  QSPEC_CHECK(packed.k % kBitplaneGroup == 0 && packed.group == kBitplaneGroup,
              "pack_w4_bitplanes: the Bitwise strategy needs k % 128 == 0 and weight groups of 128 (k ", packed.k,
              ", group ", packed.group, ")");
  const int64_t k = packed.k, groups = k / kBitplaneGroup;
  std::vector<uint8_t> out(static_cast<size_t>(bitplane_bytes(packed.n, k)));
  for (int64_t rb = 0; rb < packed.row_blocks(); ++rb) {
    const uint8_t* block = packed.codes.data() + rb * k * 8;
    for (int64_t group = 0; group < groups; ++group)
      for (int h = 0; h < 2; ++h)
        for (int lane = 0; lane < 32; ++lane)
          for (int e = 0; e < 4; ++e) {
            const uint32_t word = bitplane_word(block, k, group, h, lane, e);
            std::memcpy(out.data() + rb * k * 8 + group * 1024 + h * 512 + lane * 16 + e * 4, &word, 4);
          }
  }
  return out;
}

int bitplane_bit(const std::vector<uint8_t>& planes, int64_t k, int64_t row, int64_t col, int plane) {
  const int64_t rb = row / 16, r16 = row % 16, quad = r16 / 4, within = r16 % 4;
  const int64_t group = col / kBitplaneGroup, t = (col % kBitplaneGroup) / 32, b = col % 32;
  // within = g / 4 (word e even) or 2 + g / 4 (e odd); g % 4 = plane.
  const int64_t g = 4 * (within % 2) + plane, e = 2 * (quad % 2) + within / 2, h = quad / 2;
  const int64_t lane = 4 * g + t;
  uint32_t word;
  std::memcpy(&word, planes.data() + rb * k * 8 + group * 1024 + h * 512 + lane * 16 + e * 4, 4);
  return static_cast<int>((word >> b) & 1u);
}

}  // namespace qspec::gemm
