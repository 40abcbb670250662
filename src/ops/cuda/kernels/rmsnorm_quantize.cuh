// The fused activation quantizer in front of a 4-bit GEMM (ops.h rmsnorm_quantize): residual add,
// RMSNorm, ARCQuant's channel reorder, primary and residual quantization in one launch, one block
// a token row. Bit for bit the chain it replaces ([add_]rmsnorm -> gather_columns ->
// quantize_activations), because every step is that chain's own code:
//   1. residual (+ delta, rounded to f16 and stored back) and the sum of squares, with the thread
//      count and per-thread order of rmsnorm_kernel (so the f32 sum, and inverse_rms, are its);
//   2. the normalized row f16((x * inverse_rms) * w), as rmsnorm_kernel writes it, into shared
//      memory instead of global memory (dim halves);
//   3. quantize_block_row / quantize_int8_row over the GEMM's input row, read from shared memory:
//      out[j] = normed[order[j]] for j < dim and zero up to k when reordering (gather_columns),
//      normed[j] otherwise.
// What it saves against the chain: two or three launches and the f16 row's round trips through
// L2 (write, read by the reorder, write, read by the quantizer) per token row.
#pragma once
#include "ops/cuda/common.h"
#include "ops/cuda/kernels/quantize_activations.cuh"
#include "ops/cuda/kernels/quantize_int8.cuh"
#include "ops/cuda/kernels/reduce.cuh"
#include "ops/cuda/kernels/rmsnorm.cuh"

namespace qspec::cuda::kernels {

struct RmsnormQuantizeParams {
  __half* residual;        // [rows][dim], updated in place when delta is set
  const __half* delta;     // [rows][dim] or null
  const float* weight;     // [dim]
  int64_t dim;
  float eps;
  const int32_t* order;    // [dim] or null (REORDER)
  int64_t k;               // output values a row (>= dim when reordering, else dim)
  void* values;            // rows ldv elements apart
  int64_t ldv;
  float* scales;           // [rows] (int4: [rows][scale_ld])
  int64_t scale_ld;
  int64_t arc_k, arc_outliers;
  int64_t ldx = 0;         // gather_quantize_kernel: the input rows' pitch
};

// Step 3 of both kernels below: the GEMM's input row, read from the f16 row staged in shared
// memory (reordered when REORDER, zeros past the row's channels), quantized into row `row`.
template <quant::Format F, int VPB, bool REORDER, bool CODES>
__device__ __forceinline__ void quantize_staged_row(const __half* staged, const RmsnormQuantizeParams& p, int64_t row,
                                                    float* scratch) {
  const int64_t dim = p.dim, vectors = dim / 8;
  // Vector i of the GEMM's input row (zeros past the staged channels).
  auto load = [&](int64_t i, float (&v)[8]) {
    if constexpr (REORDER) {
      const int64_t first = 8 * i;
      if (first + 8 <= dim) {
        const int4 o0 = __ldg(reinterpret_cast<const int4*>(p.order + first));
        const int4 o1 = __ldg(reinterpret_cast<const int4*>(p.order + first + 4));
        const int o[8] = {o0.x, o0.y, o0.z, o0.w, o1.x, o1.y, o1.z, o1.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = __half2float(staged[o[e]]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = first + e < dim ? __half2float(staged[__ldg(p.order + first + e)]) : 0.0f;
      }
    } else {
      if (i < vectors) {
        half8_to_float(reinterpret_cast<const uint4*>(staged)[i], v);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = 0.0f;
      }
    }
  };
  if constexpr (F == quant::Format::int8) {
    quantize_int8_row(load, p.k / 8, static_cast<int8_t*>(p.values) + row * p.ldv, p.scales + row, scratch);
  } else {
    quantize_block_row<F, VPB, CODES>(load, p.k,
                                      static_cast<char*>(p.values) + row * p.ldv * quantized_value_bytes<F, CODES>(),
                                      p.scales + row * (F == quant::Format::int4 ? p.scale_ld : 1), p.arc_k,
                                      p.arc_outliers, scratch);
  }
}

template <quant::Format F, int VPB, bool ADD, bool REORDER, bool CODES>
__global__ void rmsnorm_quantize_kernel(const RmsnormQuantizeParams p) {
  float first_weight[8];
  load_first_weights8(p.weight, p.dim, first_weight);  // constants: before the wait
  pdl_prologue();  // launched with launch_pdl (common.h)
  __shared__ float scratch[32];
  extern __shared__ __align__(16) uint8_t normed_bytes[];
  __half* normed = reinterpret_cast<__half*>(normed_bytes);
  const int64_t row = blockIdx.x, dim = p.dim;
  __half* x = p.residual + row * dim;

  // rmsnorm_kernel's own row pass (so the same f16 values), into shared memory.
  rmsnorm_row8<ADD>(x, ADD ? p.delta + row * dim : nullptr, p.weight, first_weight, dim, p.eps, scratch,
                    [&](int64_t i, uint4 v) { reinterpret_cast<uint4*>(normed)[i] = v; });
  __syncthreads();
  quantize_staged_row<F, VPB, REORDER, CODES>(normed, p, row, scratch);
}

// The same without the norm (ops.h gather_quantize), for the sites an ARC model reorders outside a
// norm (o's and down's inputs): row `row` of p.residual (p.ldx apart, read only) staged as it is,
// then reordered and quantized. Bit for bit gather_columns -> quantize_activations, one launch
// and no reordered f16 row in global memory.
template <quant::Format F, int VPB, bool CODES>
__global__ void gather_quantize_kernel(const RmsnormQuantizeParams p) {
  pdl_prologue();
  __shared__ float scratch[32];
  extern __shared__ __align__(16) uint8_t staged_bytes[];
  __half* staged = reinterpret_cast<__half*>(staged_bytes);
  const int64_t row = blockIdx.x;
  const uint4* x = reinterpret_cast<const uint4*>(p.residual + row * p.ldx);
  // Every load of a pass in flight before its stores: one L2 round trip for rows of up to
  // kInFlight x 8 x blockDim values (a 14336-value down input in one pass of 448 threads).
  constexpr int kInFlight = 4;
  const int64_t vectors = p.dim / 8;
  for (int64_t base = threadIdx.x; base < vectors; base += kInFlight * blockDim.x) {
    uint4 v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j)
      if (base + j * blockDim.x < vectors) v[j] = x[base + j * blockDim.x];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j)
      if (base + j * blockDim.x < vectors) reinterpret_cast<uint4*>(staged)[base + j * blockDim.x] = v[j];
  }
  __syncthreads();
  quantize_staged_row<F, VPB, true, CODES>(staged, p, row, scratch);
}

}  // namespace qspec::cuda::kernels
