// Included first by the f32 reference code that CUDA twins match bit for bit (quant/formats,
// quant/hadamard, gemm/dpr, their tests): from here on every f32 operation rounds on its own.
// A contracted x - c * s (one FMA) can differ in the last bit from a kernel's __fmul_rn /
// __fsub_rn, and GCC contracts across statements by default even in ISO C++ mode.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
