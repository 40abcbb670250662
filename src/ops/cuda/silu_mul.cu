// Launchers of the gated MLP activations (SwiGLU, GeGLU) and the logits' soft cap (elementwise.h).
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/elementwise.cuh"
#include "ops/cuda/ops.h"

namespace qspec::cuda {
namespace {

// silu_mul and gelu_tanh_mul: the same kernel, G the gate's activation.
template <kernels::Gate G>
void gated_mul(const char* op, const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride,
               f16_bits* out, void* stream, NextKernel next, int64_t out_stride, bool out_packed = false) {
  if (out_stride == 0) out_stride = cols;
  QSPEC_CHECK(rows >= 0 && cols > 0 && in_stride >= cols && out_stride >= cols, "cuda::", op, ": bad shape rows ",
              rows, " cols ", cols, " in_stride ", in_stride, " out_stride ", out_stride);
  if (rows == 0) return;
  const bool vec = cols % 8 == 0 && in_stride % 8 == 0 && out_stride % 8 == 0 && is_aligned_16(gate) &&
                   is_aligned_16(up) && is_aligned_16(out);
  const int64_t work = rows * (vec ? cols / 8 : cols);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, multiprocessor_count() * 16));
  const auto* g = reinterpret_cast<const __half*>(gate);
  const auto* u = reinterpret_cast<const __half*>(up);
  auto* o = reinterpret_cast<__half*>(out);
  const bool release_first = next == NextKernel::w4a16_gemm;  // pdl_prologue (common.h)
  if (out_packed) {
    QSPEC_CHECK(vec && cols % 32 == 0, "cuda::", op, ": a packed out needs cols % 32 == 0 (cols ", cols,
                ") and 16-byte aligned rows");
    launch_pdl(kernels::silu_mul_kernel<8, G, true>, dim3(grid), dim3(256), 0, as_stream(stream),
        g, u, rows, cols, in_stride, o, out_stride, release_first);
  } else if (vec)
    launch_pdl(kernels::silu_mul_kernel<8, G>, dim3(grid), dim3(256), 0, as_stream(stream),
        g, u, rows, cols, in_stride, o, out_stride, release_first);
  else
    launch_pdl(kernels::silu_mul_kernel<1, G>, dim3(grid), dim3(256), 0, as_stream(stream),
        g, u, rows, cols, in_stride, o, out_stride, release_first);
  QSPEC_CUDA_CHECK_LAUNCH("silu_mul_kernel");
}

}  // namespace

void silu_mul(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride, f16_bits* out,
              void* stream, NextKernel next, int64_t out_stride, bool out_packed) {
  gated_mul<kernels::Gate::silu>("silu_mul", gate, up, rows, cols, in_stride, out, stream, next, out_stride,
                                 out_packed);
}

void gelu_tanh_mul(const f16_bits* gate, const f16_bits* up, int64_t rows, int64_t cols, int64_t in_stride,
                   f16_bits* out, void* stream, NextKernel next, int64_t out_stride) {
  gated_mul<kernels::Gate::gelu_tanh>("gelu_tanh_mul", gate, up, rows, cols, in_stride, out, stream, next, out_stride);
}

void soft_cap(f16_bits* x, int64_t count, float cap, void* stream) {
  QSPEC_CHECK(count >= 0 && cap > 0.0f, "cuda::soft_cap: bad count ", count, " or cap ", cap);
  if (count == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, multiprocessor_count() * 16));
  launch_pdl(kernels::soft_cap_kernel, dim3(grid), dim3(256), 0, as_stream(stream), reinterpret_cast<__half*>(x),
             count, cap);
  QSPEC_CUDA_CHECK_LAUNCH("soft_cap_kernel");
}

}  // namespace qspec::cuda
