// The CPU int8 KV rows (ops/kv8_rows.h): writing a row's codes into the two nibble planes, and
// reading a head back in a view, with an AVX2 path that gives the same floats as the scalar one.
#include "ops/kv8_rows.h"

#include <algorithm>
#include <cmath>

#include "base/dtype.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace qspec::cpu {
namespace {
// The int8 byte a view reads of a code given its two stored nibbles (each 0..15): the code
// itself, or for the high-nibble view the code with its low nibble replaced by 8, whose value is
// kv8::decode_high's 16 * hi + 8.
inline int8_t view_code(unsigned high, unsigned low, KvView view) {
  const unsigned byte = (high << 4) | (view == KvView::high_nibble ? 8u : low);
  return static_cast<int8_t>(static_cast<uint8_t>(byte));
}
}  // namespace

void kv8_write_row(const Kv8Rows& rows, int64_t row, const float* x, int64_t heads, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* in = x + h * head_dim;
    float amax = 0.0f;
    for (int64_t e = 0; e < head_dim; ++e) amax = std::max(amax, std::fabs(in[e]));
    const float scale = kv8::row_scale_f32(amax);
    rows.scales[row * heads + h] = f32_to_f16(scale);
    uint8_t* high = rows.high + (row * heads + h) * half;
    uint8_t* low = rows.low + (row * heads + h) * half;
    for (int64_t j = 0; j < half; ++j) {
      const uint8_t first = static_cast<uint8_t>(kv8::encode(in[j], scale));
      const uint8_t second = static_cast<uint8_t>(kv8::encode(in[j + half], scale));
      high[j] = static_cast<uint8_t>((first >> 4) | (second & 0xF0));
      low[j] = static_cast<uint8_t>((first & 0x0F) | (second << 4));
    }
  }
}

int8_t kv8_code(const Kv8Rows& rows, int64_t row, int64_t head, int64_t e, int64_t heads, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t byte = (row * heads + head) * half + e % half;
  const unsigned shift = e < half ? 0 : 4;
  return kv8::join_nibbles(static_cast<int8_t>(static_cast<int8_t>(rows.high[byte] << (4 - shift)) >> 4),
                           (rows.low[byte] >> shift) & 15);
}

float kv8_scale(const Kv8Rows& rows, int64_t row, int64_t head, int64_t heads) {
  return f16_to_f32(rows.scales[row * heads + head]);
}

void kv8_read_head(const Kv8Rows& rows, int64_t row, int64_t head, int64_t heads, int64_t head_dim, KvView view,
                   float* out) {
  const int64_t half = head_dim / 2;
  const float scale = kv8_scale(rows, row, head, heads);
  const uint8_t* high = rows.high + (row * heads + head) * half;
  const uint8_t* low = rows.low + (row * heads + head) * half;
  int64_t j = 0;
#if defined(__AVX2__)
  // 16 bytes of each plane give 16 codes of each half: the byte (high << 4) | low (or | 8).
  const __m128i nibble = _mm_set1_epi8(0x0F), top = _mm_set1_epi8(static_cast<char>(0xF0));
  const __m128i eight = _mm_set1_epi8(8);
  const __m256 scales = _mm256_set1_ps(scale);
  auto store = [&](__m128i codes, float* to) {
    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
    const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8)));
    _mm256_storeu_ps(to, _mm256_mul_ps(a, scales));
    _mm256_storeu_ps(to + 8, _mm256_mul_ps(b, scales));
  };
  for (; j + 16 <= half; j += 16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(high + j));
    __m128i first = _mm_slli_epi16(_mm_and_si128(h, nibble), 4);  // bits 0..3 -> 4..7 within each byte
    __m128i second = _mm_and_si128(h, top);
    if (view == KvView::high_nibble) {
      first = _mm_or_si128(first, eight);
      second = _mm_or_si128(second, eight);
    } else {
      const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(low + j));
      first = _mm_or_si128(first, _mm_and_si128(l, nibble));
      second = _mm_or_si128(second, _mm_and_si128(_mm_srli_epi16(l, 4), nibble));
    }
    store(first, out + j);
    store(second, out + half + j);
  }
#endif
  for (; j < half; ++j) {
    const unsigned l = view == KvView::high_nibble ? 0u : low[j];
    out[j] = static_cast<float>(view_code(high[j] & 15u, l & 15u, view)) * scale;
    out[half + j] = static_cast<float>(view_code(high[j] >> 4, l >> 4, view)) * scale;
  }
}

void kv8_dequantize_rows(const Kv8Rows& rows, int64_t first, int64_t count, int64_t heads, int64_t head_dim,
                         KvView view, float* out) {
  for (int64_t r = 0; r < count; ++r)
    for (int64_t h = 0; h < heads; ++h)
      kv8_read_head(rows, first + r, h, heads, head_dim, view, out + (r * heads + h) * head_dim);
}

}  // namespace qspec::cpu
