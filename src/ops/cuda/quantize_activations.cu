#include <algorithm>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/quantize_activations.cuh"
#include "ops/cuda/kernels/rmsnorm_quantize.cuh"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

namespace {

using quant::Format;

// The checks both quantizers share (the values, scales and ARC side); returns what the GEMMs read.
QuantizedActivations plan_quantized_rows(const char* who, Format format, int64_t group, int64_t rows, int64_t k,
                                         void* values, int64_t ldv, float* scales, int64_t scale_ld,
                                         const ArcResidual& arc, bool e4m3_codes) {
  QSPEC_CHECK(quantized_activations_use_f16(format) || format == Format::int8 || format == Format::int4, who, ": ",
              kernels::format_label(format), " is not an activation format (int8, int4, fp8, nvfp4, mxfp4)");
  QSPEC_CHECK(!e4m3_codes || format == Format::fp8, who, ": e4m3 codes are fp8's, not ",
              kernels::format_label(format), "'s");
  const bool f16 = quantized_activations_use_f16(format) && !e4m3_codes;
  const int64_t block = format == Format::int4 ? group : format == Format::nvfp4 ? 16 : format == Format::mxfp4 ? 32 : k;
  QSPEC_CHECK(rows >= 0 && rows < (1ll << 31) && k > 0 && k % 8 == 0 && ldv >= k && ldv % (f16 ? 8 : 16) == 0, who,
              ": bad shape rows ", rows, " k ", k, " ldv ", ldv);
  QSPEC_CHECK(block > 0 && k % block == 0, who, ": k ", k, " is not a multiple of the ", kernels::format_label(format),
              " block ", block);
  QSPEC_CHECK(is_aligned_16(values), who, ": values must be 16-byte aligned");
  if (arc.outliers > 0)
    QSPEC_CHECK((format == Format::int4 || format == Format::nvfp4 || format == Format::mxfp4) &&
                    arc.outliers % block == 0 && arc.k % block == 0 && arc.outliers <= arc.k &&
                    arc.k + arc.outliers <= k,
                who, ": ARC residual channels S ", arc.outliers, " of ", arc.k, " input channels in a row of ", k,
                " (", kernels::format_label(format), ", block ", block,
                "): S and the channels must be multiples of the block and the residuals fit after them");
  QuantizedActivations out{format, values, ldv, scales, 0, 0, e4m3_codes};
  if (format == Format::int4) {
    QSPEC_CHECK(group >= 8 && group <= 256 && (group & (group - 1)) == 0 && scale_ld >= k / group, who,
                ": int4 groups of ", group, " (a power of two, 8..256) with ", scale_ld, " scales a row for k ", k);
    out.scale_ld = scale_ld;
    out.group = group;
  }
  return out;
}

// launch.template run<F, VPB, CODES>() for the format's kernel instance (VPB: 8-value vectors a
// block; CODES: fp8 as e4m3 codes).
template <class Launch>
void with_quantized_format(Format format, int64_t group, bool e4m3_codes, const Launch& launch) {
  switch (format) {
    case Format::int8: launch.template run<Format::int8, 1, false>(); break;
    case Format::fp8:
      if (e4m3_codes) launch.template run<Format::fp8, 1, true>();
      else launch.template run<Format::fp8, 1, false>();
      break;
    case Format::nvfp4: launch.template run<Format::nvfp4, 2, false>(); break;
    case Format::mxfp4: launch.template run<Format::mxfp4, 4, false>(); break;
    default:
      switch (group) {
        case 8: launch.template run<Format::int4, 1, false>(); break;
        case 16: launch.template run<Format::int4, 2, false>(); break;
        case 32: launch.template run<Format::int4, 4, false>(); break;
        case 64: launch.template run<Format::int4, 8, false>(); break;
        case 128: launch.template run<Format::int4, 16, false>(); break;
        default: launch.template run<Format::int4, 32, false>(); break;
      }
  }
}

struct RowsLaunch {
  const f16_bits* x;
  int64_t rows, k, ldx;
  void* values;
  int64_t ldv;
  float* scales;
  int64_t scale_ld;
  ArcResidual arc;
  void* stream;

  template <Format F, int VPB, bool CODES>
  void run() const {
    if constexpr (F == Format::int8) {
      quantize_int8_rows(x, rows, k, ldx, static_cast<int8_t*>(values), ldv, scales, stream);
    } else {
      const int threads = static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(32, (k / 8 + 31) / 32 * 32)));
      launch_pdl(kernels::quantize_block_rows_kernel<F, VPB, CODES>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0,
                 as_stream(stream), reinterpret_cast<const __half*>(x), ldx, k, values, ldv, scales, scale_ld, arc.k,
                 arc.outliers);
      QSPEC_CUDA_CHECK_LAUNCH("quantize_block_rows_kernel");
    }
  }
};

// Largest row the fused kernel stages in shared memory (48 KB, no opt-in needed).
constexpr int64_t kFusedMaxDim = 24576;

struct FusedLaunch {
  kernels::RmsnormQuantizeParams params;
  int64_t rows;
  void* stream;

  template <Format F, int VPB, bool ADD, bool REORDER, bool CODES>
  void launch() const {
    // rmsnorm_kernel's thread count, so the sum of squares is its sum.
    const int threads = kernels::rmsnorm_block_threads(params.dim / 8);
    launch_pdl(kernels::rmsnorm_quantize_kernel<F, VPB, ADD, REORDER, CODES>, dim3(static_cast<unsigned>(rows)),
               dim3(threads), static_cast<size_t>(params.dim) * 2, as_stream(stream), params);
    QSPEC_CUDA_CHECK_LAUNCH("rmsnorm_quantize_kernel");
  }
  template <Format F, int VPB, bool CODES>
  void run() const {
    const bool add = params.delta != nullptr, reorder = params.order != nullptr;
    if (add && reorder) launch<F, VPB, true, true, CODES>();
    else if (add) launch<F, VPB, true, false, CODES>();
    else if (reorder) launch<F, VPB, false, true, CODES>();
    else launch<F, VPB, false, false, CODES>();
  }
};

struct GatherLaunch {
  kernels::RmsnormQuantizeParams params;
  int64_t rows;
  void* stream;

  template <Format F, int VPB, bool CODES>
  void run() const {
    const int threads = static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(32, (params.k / 8 + 31) / 32 * 32)));
    launch_pdl(kernels::gather_quantize_kernel<F, VPB, CODES>, dim3(static_cast<unsigned>(rows)), dim3(threads),
               static_cast<size_t>(params.dim) * 2, as_stream(stream), params);
    QSPEC_CUDA_CHECK_LAUNCH("gather_quantize_kernel");
  }
};

}  // namespace

QuantizedActivations quantize_activations(quant::Format format, int64_t group, const f16_bits* x, int64_t rows,
                                          int64_t k, int64_t ldx, void* values, int64_t ldv, float* scales,
                                          int64_t scale_ld, void* stream, const ArcResidual& arc, bool e4m3_codes) {
  const char* who = "cuda::quantize_activations";
  const QuantizedActivations out =
      plan_quantized_rows(who, format, group, rows, k, values, ldv, scales, scale_ld, arc, e4m3_codes);
  QSPEC_CHECK(ldx >= k && ldx % 8 == 0 && is_aligned_16(x), who, ": x must be 16-byte aligned with ldx >= k (", ldx,
              ") and ldx % 8 == 0");
  if (rows == 0) return out;
  with_quantized_format(format, group, e4m3_codes,
                        RowsLaunch{x, rows, k, ldx, values, ldv, scales, scale_ld, arc, stream});
  return out;
}

QuantizedActivations rmsnorm_quantize(quant::Format format, int64_t group, f16_bits* residual, const f16_bits* delta,
                                      const float* weight, int64_t rows, int64_t dim, float eps, const int32_t* order,
                                      int64_t k, void* values, int64_t ldv, float* scales, int64_t scale_ld,
                                      void* stream, const ArcResidual& arc, bool e4m3_codes) {
  const char* who = "cuda::rmsnorm_quantize";
  const QuantizedActivations out =
      plan_quantized_rows(who, format, group, rows, k, values, ldv, scales, scale_ld, arc, e4m3_codes);
  QSPEC_CHECK(dim > 0 && dim % 8 == 0 && dim <= kFusedMaxDim && (order != nullptr ? k >= dim : k == dim), who,
              ": dim ", dim, " (a multiple of 8, at most ", kFusedMaxDim, ") with ", k,
              " output values a row (= dim, or >= dim with a channel order)");
  QSPEC_CHECK(arc.outliers == 0 || (order != nullptr && arc.k == dim), who,
              ": ARC residuals need the channel order of the site (arc.k ", arc.k, ", dim ", dim, ")");
  QSPEC_CHECK(is_aligned_16(residual) && is_aligned_16(weight) && (delta == nullptr || is_aligned_16(delta)) &&
                  (order == nullptr || is_aligned_16(order)),
              who, ": residual, delta, weight and order must be 16-byte aligned");
  QSPEC_CHECK(static_cast<const void*>(values) != static_cast<const void*>(residual) &&
                  (delta == nullptr || static_cast<const void*>(values) != static_cast<const void*>(delta)),
              who, ": values must not alias residual or delta");
  if (rows == 0) return out;
  kernels::RmsnormQuantizeParams params{reinterpret_cast<__half*>(residual), reinterpret_cast<const __half*>(delta),
                                        weight, dim, eps, order, k, values, ldv, scales, scale_ld, arc.k,
                                        arc.outliers};
  with_quantized_format(format, group, e4m3_codes, FusedLaunch{params, rows, stream});
  return out;
}

QuantizedActivations gather_quantize(quant::Format format, int64_t group, const f16_bits* x, int64_t rows, int64_t dim,
                                     int64_t ldx, const int32_t* order, int64_t k, void* values, int64_t ldv,
                                     float* scales, int64_t scale_ld, void* stream, const ArcResidual& arc,
                                     bool e4m3_codes) {
  const char* who = "cuda::gather_quantize";
  const QuantizedActivations out =
      plan_quantized_rows(who, format, group, rows, k, values, ldv, scales, scale_ld, arc, e4m3_codes);
  QSPEC_CHECK(dim > 0 && dim % 8 == 0 && dim <= kFusedMaxDim && k >= dim && ldx >= dim && ldx % 8 == 0, who, ": dim ",
              dim, " (a multiple of 8, at most ", kFusedMaxDim, "), ldx ", ldx, " (>= dim, a multiple of 8) and ", k,
              " output values a row (>= dim)");
  QSPEC_CHECK(order != nullptr && is_aligned_16(order) && is_aligned_16(x), who,
              ": needs a 16-byte aligned channel order and x");
  QSPEC_CHECK(arc.outliers == 0 || arc.k == dim, who, ": ARC residuals of ", arc.k, " channels for a row of ", dim);
  QSPEC_CHECK(static_cast<const void*>(values) != static_cast<const void*>(x), who, ": values must not alias x");
  if (rows == 0) return out;
  kernels::RmsnormQuantizeParams params{const_cast<__half*>(reinterpret_cast<const __half*>(x)), nullptr, nullptr, dim,
                                        0.0f, order, k, values, ldv, scales, scale_ld, arc.k, arc.outliers, ldx};
  with_quantized_format(format, group, e4m3_codes, GatherLaunch{params, rows, stream});
  return out;
}

}  // namespace qspec::cuda
