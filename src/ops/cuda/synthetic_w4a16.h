// Random 4-bit weights in the W4A16 layout (ops/w4a16_pack.h), drawn on the GPU: the one recipe
// synthetic models (model/cuda/llama_gpu.cpp), `qspec bench`'s GEMM sums and qspec_gpu_bench use,
// so a benchmark of int4-asym or int4-zp runs those formats' kernels wherever it times a GEMM.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/cuda/device.h"
#include "ops/cuda/gemm_w4a16.h"
#include "quant/formats.h"

namespace qspec::cuda {

struct SyntheticW4A16 {
  DeviceMemory codes;
  DeviceMemory scales;  // the f16 scale pairs, then (int4-asym / int4-zp) the minimums or zero points
  W4A16Weights view;
};

// The bytes the scale buffer of an (n, k) matrix takes: the scales and, for a format with
// minimums, the minimums (int4-asym, f16 pairs in the scales' layout) or the packed zero points
// (int4-zp) right after them.
size_t synthetic_w4a16_scale_bytes(int64_t n, int64_t k, int64_t group, quant::Format format);

// Random codes; scales uniform in [scale_lo, scale_hi]; int4-asym: minimums of -8 to -7.5 mid
// scales (the values centred as int4's), int4-zp: zero points 7 or 8. `format` is int4,
// int4-asym or int4-zp; group 32, 64 or 128 dividing k (qspec::Error otherwise).
SyntheticW4A16 make_synthetic_w4a16(int64_t n, int64_t k, int64_t group, quant::Format format, float scale_lo,
                                    float scale_hi, uint64_t seed, void* stream);

// Enough such matrices (weight_copies_beyond_l2, seeds `seed` + 3 i) that a round robin over them
// streams every launch's weights from device memory, as consecutive layers do in a decode step:
// the GEMM benchmarks' method.
struct SyntheticW4A16Copies {
  std::vector<SyntheticW4A16> weights;
  std::vector<W4A16Weights> views;
};
SyntheticW4A16Copies make_synthetic_w4a16_copies(int64_t n, int64_t k, int64_t group, quant::Format format,
                                                 float scale_lo, float scale_hi, uint64_t seed, void* stream);

}  // namespace qspec::cuda
