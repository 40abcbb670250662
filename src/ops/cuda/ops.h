// The CUDA backend's plain C++ face: launchers that take raw device pointers and a stream
// (a cudaStream_t passed as void*; nullptr is the default stream), so code compiled by the host
// compiler calls GPU ops without seeing a CUDA type. Every launcher checks its arguments
// (qspec::Error naming the argument) and the launch (QSPEC_CUDA_CHECK_LAUNCH); kernels run
// asynchronously on the stream. Tensors are row-major; f16 and bf16 tensors are passed as
// uint16_t bit patterns. Activations are f16, accumulation and statistics f32.
//
// Each op has a CPU twin (ops/*.h) that tests/gpu compares it with.
#pragma once
// One header per op family; this one includes them all (host C++ that uses several).
#include "ops/cuda/device.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/sample.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm_w4a16.h"
#include "ops/cuda/gemm_w8a16.h"
#include "ops/cuda/mma_peak.h"
#include "ops/cuda/quantize.h"
#include "ops/cuda/gemm_w4_lowbit.h"
#include "ops/cuda/linear_w16.h"
