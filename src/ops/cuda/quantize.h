// Activation quantization on the GPU: int8 / fp8 / int4 / NVFP4 / MXFP4 codes, fused with RMSNorm,
// the ARC residual columns (CPU twin: quant/formats.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/device.h"
#include "quant/formats.h"

namespace qspec::cuda {

// ---- low-precision activations (W4A8) --------------------------------------------------

// Per-token int8 quantization of f16 rows: quant::quantize_row(int8, activation) bit for bit on
// the f32 value of each element (scale = amax / 127 in f32, codes clamp(rint(x / scale)) in
// [-127, 127]; a zero row: scale 0, codes 0). codes: [rows, k] int8, rows ldc bytes apart;
// scales: f32 [rows]. k, ldx, ldc multiples of 8. A row holding a NaN or an infinity gets a NaN
// scale (no throw from inside a graph; its GEMM outputs are then NaN, never argmax's pick).
void quantize_int8_rows(const f16_bits* x, int64_t rows, int64_t k, int64_t ldx, int8_t* codes, int64_t ldc,
                        float* scales, void* stream);

// rmsnorm / add_rmsnorm whose f16 output goes straight into quantize_int8_rows (the f16 row is
// never written): bitwise the two ops in sequence. dim, ldc multiples of 8.
void rmsnorm_int8(const f16_bits* x, const float* weight, int64_t rows, int64_t dim, float eps, int8_t* codes,
                  int64_t ldc, float* scales, void* stream);
void add_rmsnorm_int8(f16_bits* residual, const f16_bits* delta, const float* weight, int64_t rows, int64_t dim,
                      float eps, int8_t* codes, int64_t ldc, float* scales, void* stream);

// Quantized activations as the 4-bit-weight GEMMs read them (quantize_activations writes them):
//   int8          int8 codes, one f32 scale per token (W4A8).
//   int4          int4 codes in int8 bytes, one f32 scale per token and group of `group` k values
//                 (scales [rows][scale_ld]); group must be a multiple of the weight group (W4A4).
//   fp8 / nvfp4 / mxfp4  f16 values that are exactly element x block scale (divided by a power
//                 of two for mxfp4), one f32 scale per token that makes them the CPU's
//                 dequantized values: fp8 amax / 448, nvfp4 the token's tensor scale, mxfp4 a
//                 power of two (W4A8-fp8, W4A4-nvfp4 / mxfp4 emulated on f16 mma).
// values: rows ldx elements apart, 16-byte aligned, ldx % 16 == 0 (int8 bytes) or % 8 == 0 (f16).
struct QuantizedActivations {
  quant::Format format = quant::Format::int8;
  const void* values = nullptr;
  int64_t ldx = 0;
  const float* scales = nullptr;
  int64_t scale_ld = 0;  // int4: scales a token row
  int64_t group = 0;     // int4: k values a scale covers
  // fp8 only: the values are e4m3 codes (1 byte; what the wgmma kernel reads) instead of their
  // f16 values (exact; what the f16-mma kernels read fastest: decode and verify sizes).
  bool e4m3 = false;
};
bool quantized_activations_use_f16(quant::Format format);  // fp8 (unless e4m3 codes), nvfp4, mxfp4
// Whether x's values are f16 (else one byte each: int8 / int4 codes, e4m3 codes).
inline bool quantized_values_are_f16(const QuantizedActivations& x) {
  return quantized_activations_use_f16(x.format) && !x.e4m3;
}

// Per-token quantization of f16 rows [rows, k] (ldx apart) in `format` (int8, int4 with groups of
// `group`, fp8, nvfp4, mxfp4): quant::quantize_row(format, activation) bit for bit on the f32 value
// of each element, written as QuantizedActivations (values rows ldv elements apart, scales for int4
// rows scale_ld apart; the result's fields are filled in out). A row holding a NaN or an infinity
// gets NaN scales (no throw inside a graph; its outputs are then NaN, never argmax's pick).
// Exactness note for mxfp4: a value is exact in f16 when its block's shared exponent is at most 36
// below the row's largest (smaller blocks round in f16; they lie below f32 resolution of the row).
// ARCQuant (arc.outliers = S > 0; int4, nvfp4, mxfp4): x holds reordered rows of arc.k channels
// (gather_columns), k is the augmented width, and the last S values of each output row are the
// quantized residuals of channels arc.k - S .. arc.k - 1: quant::arc_quantize_row (concatenated
// layout) with zeros between, bit for bit.
struct ArcResidual {
  int64_t k = 0;
  int64_t outliers = 0;
};
// e4m3_codes (fp8 only): write e4m3 codes, one byte each, instead of f16 values.
QuantizedActivations quantize_activations(quant::Format format, int64_t group, const f16_bits* x, int64_t rows,
                                          int64_t k, int64_t ldx, void* values, int64_t ldv, float* scales,
                                          int64_t scale_ld, void* stream, const ArcResidual& arc = {},
                                          bool e4m3_codes = false);

// ARCQuant's channel reorder: out[r, j] = x[r, order[j]] for j < k, 0 for k <= j < width (the
// augmented columns a site's weights carry), f16 rows (x ldx, out ldo apart). order: k device int32.
void gather_columns(const f16_bits* x, int64_t rows, int64_t k, int64_t ldx, const int32_t* order, int64_t width,
                    f16_bits* out, int64_t ldo, void* stream);

// gather_columns then quantize_activations in one launch (kernels/rmsnorm_quantize.cuh): row r of
// the GEMM's input is x[r, order[j]] for j < dim and zero up to k, quantized in `format` with the
// ARC residuals (arc.k = dim); no reordered f16 row is written. Bit for bit the two ops. For an
// ARC model's sites outside a norm (o's and down's inputs). dim % 8 == 0, dim <= 24576.
QuantizedActivations gather_quantize(quant::Format format, int64_t group, const f16_bits* x, int64_t rows, int64_t dim,
                                     int64_t ldx, const int32_t* order, int64_t k, void* values, int64_t ldv,
                                     float* scales, int64_t scale_ld, void* stream, const ArcResidual& arc = {},
                                     bool e4m3_codes = false);

// The fused activation quantizer of a 4-bit GEMM's input (kernels/rmsnorm_quantize.cuh): residual
// += delta (when delta is not null; stored back), RMSNorm with `weight` rounded to f16, ARCQuant's
// channel reorder (when order is not null: the GEMM's input row is out[j] = normed[order[j]] for
// j < dim, zeros up to k), and the quantization of that row in `format` with the ARC residuals
// (arc.outliers > 0, arc.k = dim), in one launch that writes no f16 row. Bit for bit
// [add_]rmsnorm, then gather_columns, then quantize_activations (every format of the latter, int8
// included; ARC as there). dim % 8 == 0, dim <= 24576 (the normalized row is staged in shared
// memory). rows x k values ldv elements apart; the result as quantize_activations returns it.
QuantizedActivations rmsnorm_quantize(quant::Format format, int64_t group, f16_bits* residual, const f16_bits* delta,
                                      const float* weight, int64_t rows, int64_t dim, float eps, const int32_t* order,
                                      int64_t k, void* values, int64_t ldv, float* scales, int64_t scale_ld,
                                      void* stream, const ArcResidual& arc = {}, bool e4m3_codes = false);

}  // namespace qspec::cuda
