// ADAngel's DPR model (Decomposition / Partial products / Reconstruction) as a CPU reference:
// the integer arithmetic every mixed-precision GEMM strategy (padding, bitwise, split) performs,
// so that the GPU kernels can be checked against it exactly.
//
// Decomposition. An operand of `bits` bits is cut by a partition (slice widths, least
// significant first) into slices: v = sum_i c_i * slice_i(v), c_i = 2^shift_i. Slices below the
// top are unsigned bit fields. The top slice of a signed (two's complement) operand keeps the
// sign: wider than one bit it is sign-extended (v >> shift) with c = +2^shift; one bit wide it
// is the plain sign bit with c = -2^shift, so that it still fits b1. Each slice is then promoted
// (the paper's Hardware-Aware Promotion Principle) to the smallest native integer mma type that
// holds it: b1 (unsigned 1-bit), s4 (sm 80..89 only; Hopper emulates int4) or s8.
// Partial products. Every pair (slice p of X, slice q of W) is one integer mma pass over the
// whole m, n, k: PP_pq[m,n] = sum_k x_p * w_q, an int32 accumulator. A pass needs both operands
// in one type, the wider of the two promotions (b1 < s4 < s8); b1 x b1 is popcount(a AND b).
// Reconstruction. Y = sum_pq c_p c_q PP_pq, exact in int64.
//
// The three W4A8 strategies (x int8, w int4): padding  x {8}, w {4}: 1 s8 x s8 pass;
// bitwise x {1 x 8}, w {1 x 4}: 32 b1 x b1 passes; split x {4,4}, w {4}: 2 passes (s8 x s8 on
// sm 90; on sm 80 the unsigned low half needs s8, the signed high half runs s4 x s4).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quant/quantized_linear.h"

namespace qspec::gemm::dpr {

enum class HwType : uint8_t { b1, s4, s8 };  // ordered by width
std::string_view hw_type_name(HwType type);
// Smallest native type on compute capability `sm` holding a slice of `width` bits (signed: the
// top slice of a signed operand, kept signed). b1 holds only unsigned 1-bit slices, s4 exists
// below sm 90 only. Throws for width < 1 or > 8, and for an unsigned 8-bit slice (no signed
// type holds 0..255: partition it).
HwType promote(int width, bool is_signed, int sm);
bool fits(HwType type, int64_t value);

struct Partition {
  std::vector<int> widths;  // least significant first
};
Partition padding(int bits);                // {bits}
Partition bitwise(int bits);                // {1, 1, ...}
Partition split(int bits, int slice_bits);  // {slice_bits, ...}, a remainder last: split(8,3) = {3,3,2}

struct Slice {
  int shift;
  int width;
  bool is_signed;
  HwType hw;
  int64_t coefficient;
};
// Throws when the widths do not sum to bits, a width is < 1, or bits is outside 1..31.
std::vector<Slice> decompose(const Partition& p, int bits, bool is_signed, int sm);
int32_t slice_value(int32_t v, const Slice& s);  // v within the operand's range

struct Operand {
  int bits;
  bool is_signed;
  Partition partition;
};
struct StrategyDpr {
  std::string name;
  Operand x, w;
  int sm;
};

struct Cost {
  int partial_products = 0;
  // Per pass (x slice outer, w slice inner): the type both operands run in, (x, w).
  std::vector<std::pair<HwType, HwType>> products;
  int64_t mma_ops_per_mac = 0;  // one integer mma pass per partial product
};
Cost cost(const StrategyDpr& s);

// Y [m x n] (int64) = X [m x k] * W [n x k]^T through the strategy's DPR. Values must lie in
// each operand's range (throws naming the element otherwise); a partial product beyond int32
// (the accumulator) throws.
std::vector<int64_t> reference_gemm(const StrategyDpr& s, const int32_t* x, int64_t m, const int32_t* w,
                                    int64_t n, int64_t k);

// The 4-bit-weight GEMM in DPR form: w an int4 (or int4-channel) QuantizedMatrix [n x k] after
// prepare(); x_codes [m x k] integer activation codes with scales x_scales [m x (k / x_group)].
// K is cut into blocks of min(weight group, x_group) (the groups must nest), and
//   y[m,n] = sum over blocks in increasing K of (w_scale * x_scale) * float(DPR integer sum),
// each step one f32 rounding (no FMA). s.w must be a signed 4-bit operand.
std::vector<float> quantized_gemm(const StrategyDpr& s, const int32_t* x_codes, const float* x_scales,
                                  int64_t x_group, int64_t m, const QuantizedMatrix& w);

// "padding", "bitwise" or "split" for W4A8 (activation_bits 8, split {4,4}) or W4A4
// (activation_bits 4, split {2,2}); weights int4 signed, {4} or bitwise.
StrategyDpr w4_strategy(std::string_view name, int activation_bits, int sm = 90);

}  // namespace qspec::gemm::dpr
