#include <algorithm>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/quantize_activations.cuh"
#include "ops/cuda/kernels/w4_activation.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {

namespace {

struct RowsLaunch {
  const f16_bits* x;
  int64_t rows, k, ldx;
  void* values;
  int64_t ldv;
  float* scales;
  int64_t scale_ld;
  ArcResidual arc;
  void* stream;
};

template <quant::Format F, int VPB>
void launch_rows(const RowsLaunch& l) {
  const int threads = static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(32, (l.k / 8 + 31) / 32 * 32)));
  launch_pdl(kernels::quantize_block_rows_kernel<F, VPB>, dim3(static_cast<unsigned>(l.rows)), dim3(threads), 0,
             as_stream(l.stream), reinterpret_cast<const __half*>(l.x), l.ldx, l.k, l.values, l.ldv, l.scales,
             l.scale_ld, l.arc.k, l.arc.outliers);
  QSPEC_CUDA_CHECK_LAUNCH("quantize_block_rows_kernel");
}

}  // namespace

QuantizedActivations quantize_activations(quant::Format format, int64_t group, const f16_bits* x, int64_t rows,
                                          int64_t k, int64_t ldx, void* values, int64_t ldv, float* scales,
                                          int64_t scale_ld, void* stream, const ArcResidual& arc) {
  const char* who = "cuda::quantize_activations";
  const bool f16 = quantized_activations_use_f16(format);
  QSPEC_CHECK(f16 || format == quant::Format::int8 || format == quant::Format::int4, who, ": ",
              kernels::format_label(format), " is not an activation format (int8, int4, fp8, nvfp4, mxfp4)");
  const int64_t block = format == quant::Format::int4 ? group : format == quant::Format::nvfp4 ? 16
                        : format == quant::Format::mxfp4                                       ? 32
                                                                                               : k;
  QSPEC_CHECK(rows >= 0 && rows < (1ll << 31) && k > 0 && k % 8 == 0 && ldx >= k && ldx % 8 == 0 && ldv >= k &&
                  ldv % (f16 ? 8 : 16) == 0,
              who, ": bad shape rows ", rows, " k ", k, " ldx ", ldx, " ldv ", ldv);
  QSPEC_CHECK(block > 0 && k % block == 0, who, ": k ", k, " is not a multiple of the ", kernels::format_label(format),
              " block ", block);
  QSPEC_CHECK(is_aligned_16(x) && is_aligned_16(values), who, ": x and values must be 16-byte aligned");
  if (arc.outliers > 0)
    QSPEC_CHECK((format == quant::Format::int4 || format == quant::Format::nvfp4 || format == quant::Format::mxfp4) &&
                    arc.outliers % block == 0 && arc.k % block == 0 && arc.outliers <= arc.k &&
                    arc.k + arc.outliers <= k,
                who, ": ARC residual channels S ", arc.outliers, " of ", arc.k, " input channels in a row of ", k,
                " (", kernels::format_label(format), ", block ", block,
                "): S and the channels must be multiples of the block and the residuals fit after them");
  QuantizedActivations out{format, values, ldv, scales, 0, 0};
  if (format == quant::Format::int4) {
    QSPEC_CHECK(group >= 8 && group <= 256 && (group & (group - 1)) == 0 && scale_ld >= k / group, who,
                ": int4 groups of ", group, " (a power of two, 8..256) with ", scale_ld, " scales a row for k ", k);
    out.scale_ld = scale_ld;
    out.group = group;
  }
  if (rows == 0) return out;
  const RowsLaunch l{x, rows, k, ldx, values, ldv, scales, scale_ld, arc, stream};
  using quant::Format;
  switch (format) {
    case Format::int8: quantize_int8_rows(x, rows, k, ldx, static_cast<int8_t*>(values), ldv, scales, stream); break;
    case Format::fp8: launch_rows<Format::fp8, 1>(l); break;
    case Format::nvfp4: launch_rows<Format::nvfp4, 2>(l); break;
    case Format::mxfp4: launch_rows<Format::mxfp4, 4>(l); break;
    default:
      switch (group) {
        case 8: launch_rows<Format::int4, 1>(l); break;
        case 16: launch_rows<Format::int4, 2>(l); break;
        case 32: launch_rows<Format::int4, 4>(l); break;
        case 64: launch_rows<Format::int4, 8>(l); break;
        case 128: launch_rows<Format::int4, 16>(l); break;
        default: launch_rows<Format::int4, 32>(l); break;
      }
  }
  return out;
}

}  // namespace qspec::cuda
