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

// Each variant: its namespace, its dot-product kind (0 AVX2, 1 AVX-VNNI, 2 AVX-512 VNNI), the
// tokens a W4A16 tile holds, and the instruction sets it is compiled for (QSPEC_Q4_TARGET).
#define QSPEC_Q4_NS q4_avx2
#define QSPEC_Q4_VNNI 0
#define QSPEC_Q4_TOKENS 2  // 16 registers: 4 rows x 2 tokens of accumulators
#define QSPEC_Q4_TARGET "avx2,fma"
#include "ops/cpu/q4_kernels_x86.inc"

#define QSPEC_Q4_NS q4_avx_vnni
#define QSPEC_Q4_VNNI 1
#define QSPEC_Q4_TOKENS 2
#define QSPEC_Q4_TARGET "avx2,fma,avxvnni"
#include "ops/cpu/q4_kernels_x86.inc"

#define QSPEC_Q4_NS q4_avx512_vnni
#define QSPEC_Q4_VNNI 2
#define QSPEC_Q4_TOKENS 4  // 32 registers
#define QSPEC_Q4_TARGET "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni"
#include "ops/cpu/q4_kernels_x86.inc"

const q4::Kernels& q4::avx2_kernels() { return q4_avx2::kernels(); }
const q4::Kernels& q4::avx_vnni_kernels() { return q4_avx_vnni::kernels(); }
const q4::Kernels& q4::avx512_vnni_kernels() { return q4_avx512_vnni::kernels(); }

}  // namespace qspec::cpu
#endif
