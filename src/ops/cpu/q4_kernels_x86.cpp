// Compiles the SIMD 4-bit GEMM kernels (q4_kernels_x86.inc) once per x86 instruction set under
// a target pragma, so the build needs no -m flags and ops/cpu/quantized_linear.cpp picks one
// at run time from cpuid.
#include "ops/cpu/q4_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "quant/formats.h"

namespace qspec::cpu {
namespace q4 {
// The .inc refers to the shared types as q4::...
}

#if defined(__clang__)  // clang takes target attributes, not GCC's target pragma
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define QSPEC_Q4_NS q4_avx2
#define QSPEC_Q4_VNNI 0
#define QSPEC_Q4_TOKENS 2  // 16 registers: 4 rows x 2 tokens of accumulators
#include "ops/cpu/q4_kernels_x86.inc"
#undef QSPEC_Q4_NS
#undef QSPEC_Q4_VNNI
#undef QSPEC_Q4_TOKENS
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)  // clang takes target attributes, not GCC's target pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#endif
#define QSPEC_Q4_NS q4_avx_vnni
#define QSPEC_Q4_VNNI 1
#define QSPEC_Q4_TOKENS 2
#include "ops/cpu/q4_kernels_x86.inc"
#undef QSPEC_Q4_NS
#undef QSPEC_Q4_VNNI
#undef QSPEC_Q4_TOKENS
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)  // clang takes target attributes, not GCC's target pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")
#endif
#define QSPEC_Q4_NS q4_avx512_vnni
#define QSPEC_Q4_VNNI 2
#define QSPEC_Q4_TOKENS 4  // 32 registers
#include "ops/cpu/q4_kernels_x86.inc"
#undef QSPEC_Q4_NS
#undef QSPEC_Q4_VNNI
#undef QSPEC_Q4_TOKENS
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const q4::Kernels& q4::avx2_kernels() { return q4_avx2::kernels(); }
const q4::Kernels& q4::avx_vnni_kernels() { return q4_avx_vnni::kernels(); }
const q4::Kernels& q4::avx512_vnni_kernels() { return q4_avx512_vnni::kernels(); }

}  // namespace qspec::cpu
#endif
