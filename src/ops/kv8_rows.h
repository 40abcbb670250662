// The CPU layout of the 8-bit KV cache (`--kv-cache int8`; the values are ops/kv_int8.h's, one
// rule for both backends): one layer's K or V rows as two nibble planes and one f16 scale per
// (row, KV head), so that a `/k4` draft (KvView::high_nibble) reads only the high plane and the
// scales, half the code bytes of the verify's full view.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/kv_int8.h"

namespace qspec::cpu {

// Row r of kv_dim = heads * head_dim values (head_dim even), KV head h, element e of the head,
// half = head_dim / 2: bits 4..7 of e's int8 code (its high nibble, two's complement) are in
// byte high[r * kv_dim / 2 + h * half + e % half], in that byte's bits 0..3 for e < half and
// bits 4..7 for the rest, so one load of a head's bytes splits into its two halves with one mask
// or shift each; low holds bits 0..3 of the codes alike; scales[r * heads + h] holds the f16 bits
// of the row's kv8::row_scale_f32 (exactly an f16 value, as the GPU stores it).
struct Kv8Rows {
  uint8_t* high = nullptr;
  uint8_t* low = nullptr;
  uint16_t* scales = nullptr;
};

// Bytes of one row of K (or V): both planes and the scales.
constexpr size_t kv8_row_bytes(int64_t heads, int64_t head_dim) {
  return static_cast<size_t>(heads * head_dim) + static_cast<size_t>(heads) * sizeof(uint16_t);
}
// Bytes a pass in `view` reads of one row.
constexpr size_t kv8_view_bytes(int64_t heads, int64_t head_dim, KvView view) {
  return view == KvView::high_nibble ? static_cast<size_t>(heads * head_dim / 2) + static_cast<size_t>(heads) * sizeof(uint16_t)
                                     : kv8_row_bytes(heads, head_dim);
}

// Quantizes x [heads * head_dim] into row `row`: per head kv8::row_scale_f32 of its largest |x|
// and kv8::encode of every value.
void kv8_write_row(const Kv8Rows& rows, int64_t row, const float* x, int64_t heads, int64_t head_dim);
// The int8 code and the scale of element e of head h in row `row` (the layout's reference).
int8_t kv8_code(const Kv8Rows& rows, int64_t row, int64_t head, int64_t e, int64_t heads, int64_t head_dim);
float kv8_scale(const Kv8Rows& rows, int64_t row, int64_t head, int64_t heads);
// Head h of row `row` as a pass in `view` reads it, into out [head_dim]: kv8::decode (full) or
// kv8::decode_high (high_nibble) of every code. The attention reads rows through this.
void kv8_read_head(const Kv8Rows& rows, int64_t row, int64_t head, int64_t heads, int64_t head_dim, KvView view,
                   float* out);
// Rows first .. first + count - 1 dequantized in `view` into out [count, heads * head_dim]: the f32
// rows the int8 attention equals f32 attention over (the CPU twin the GPU kernels are tested
// against).
void kv8_dequantize_rows(const Kv8Rows& rows, int64_t first, int64_t count, int64_t heads, int64_t head_dim,
                         KvView view, float* out);

}  // namespace qspec::cpu
