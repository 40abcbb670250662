// The DPR reference (see dpr.h). Floats are combined one rounding at a time, as a GPU twin
// written with __fmul_rn / __fadd_rn does.
#include "base/exact_f32.h"  // first: no FMA contraction in this file

#include "gemm/dpr.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "qspec/error.h"

namespace qspec::gemm::dpr {

std::string_view hw_type_name(HwType type) {
  switch (type) {
    case HwType::b1: return "b1";
    case HwType::s4: return "s4";
    case HwType::s8: return "s8";
  }
  return "?";
}

bool fits(HwType type, int64_t value) {
  switch (type) {
    case HwType::b1: return value == 0 || value == 1;
    case HwType::s4: return value >= -8 && value <= 7;
    case HwType::s8: return value >= -128 && value <= 127;
  }
  return false;
}

HwType promote(int width, bool is_signed, int sm) {
  QSPEC_CHECK(width >= 1 && width <= 8, "dpr: slice width ", width, " is outside 1..8");
  if (width == 1 && !is_signed) return HwType::b1;
  const int magnitude_bits = is_signed ? width : width + 1;  // bits of a signed type that holds it
  if (sm < 90 && magnitude_bits <= 4) return HwType::s4;
  QSPEC_CHECK(magnitude_bits <= 8, "dpr: an unsigned ", width, "-bit slice fits no signed mma type; partition it");
  return HwType::s8;
}

Partition padding(int bits) { return {{bits}}; }
Partition bitwise(int bits) {
  QSPEC_CHECK(bits >= 1, "dpr: bitwise partition of ", bits, " bits");
  return {std::vector<int>(static_cast<size_t>(bits), 1)};
}
Partition split(int bits, int slice_bits) {
  QSPEC_CHECK(bits >= 1 && slice_bits >= 1, "dpr: split(", bits, ", ", slice_bits, "): bits and slice_bits must be >= 1");
  Partition p;
  for (int done = 0; done < bits; done += slice_bits) p.widths.push_back(std::min(slice_bits, bits - done));
  return p;
}

std::vector<Slice> decompose(const Partition& p, int bits, bool is_signed, int sm) {
  QSPEC_CHECK(bits >= 1 && bits <= 31, "dpr: operand bits ", bits, " is outside 1..31");
  int sum = 0;
  for (int width : p.widths) {
    QSPEC_CHECK(width >= 1, "dpr: partition width ", width, " is < 1");
    sum += width;
  }
  QSPEC_CHECK(sum == bits, "dpr: partition widths sum to ", sum, ", not to the operand's bits ", bits);
  std::vector<Slice> slices;
  int shift = 0;
  for (size_t i = 0; i < p.widths.size(); ++i) {
    const int width = p.widths[i];
    const bool top_signed = is_signed && i + 1 == p.widths.size() && width > 1;  // 1-bit top: b1, c < 0
    const bool negative = is_signed && i + 1 == p.widths.size() && width == 1;
    const int64_t c = int64_t{1} << shift;
    slices.push_back({shift, width, top_signed, promote(width, top_signed, sm), negative ? -c : c});
    shift += width;
  }
  return slices;
}

int32_t slice_value(int32_t v, const Slice& s) {
  const int32_t shifted = v >> s.shift;  // arithmetic: the sign extends into a signed top slice
  return s.is_signed ? shifted : shifted & static_cast<int32_t>((int64_t{1} << s.width) - 1);
}

namespace {

// One operand cut into slices: per slice its values (rows x k), and for b1 slices the bits
// packed 64 to a word (bit j % 64 of word j / 64 is element j).
struct Sliced {
  std::vector<Slice> slices;
  int64_t k = 0, words = 0;
  std::vector<std::vector<int32_t>> values;
  std::vector<std::vector<uint64_t>> packed;
};

Sliced slice_matrix(const Operand& op, int sm, const int32_t* data, int64_t rows, int64_t k, const char* name) {
  QSPEC_CHECK(rows >= 0 && k >= 0, "dpr: ", name, " has negative size [", rows, " x ", k, "]");
  Sliced out{decompose(op.partition, op.bits, op.is_signed, sm), k, (k + 63) / 64, {}, {}};
  const int64_t lo = op.is_signed ? -(int64_t{1} << (op.bits - 1)) : 0;
  const int64_t hi = op.is_signed ? (int64_t{1} << (op.bits - 1)) - 1 : (int64_t{1} << op.bits) - 1;
  for (int64_t i = 0; i < rows * k; ++i)
    QSPEC_CHECK(data[i] >= lo && data[i] <= hi, "dpr: ", name, "[", i / k, ",", i % k, "] = ", data[i],
                " is outside the ", op.is_signed ? "signed " : "unsigned ", op.bits, "-bit range [", lo, ", ", hi, "]");
  for (const Slice& s : out.slices) {
    std::vector<int32_t> values(static_cast<size_t>(rows * k));
    std::vector<uint64_t> packed(s.hw == HwType::b1 ? static_cast<size_t>(rows * out.words) : 0);
    for (int64_t i = 0; i < rows * k; ++i) {
      values[i] = slice_value(data[i], s);
      QSPEC_CHECK(fits(s.hw, values[i]), "dpr: ", name, " slice at bit ", s.shift, " value ", values[i],
                  " does not fit ", hw_type_name(s.hw));
      if (!packed.empty() && values[i]) packed[(i / k) * out.words + (i % k) / 64] |= uint64_t{1} << (i % k % 64);
    }
    out.values.push_back(std::move(values));
    out.packed.push_back(std::move(packed));
  }
  return out;
}

// sum over k in [k0, k1) of x_p[i,k] * w_q[j,k]: the b1 x b1 pass as popcount(a AND b).
int64_t partial_product(const Sliced& x, size_t p, int64_t i, const Sliced& w, size_t q, int64_t j, int64_t k0,
                        int64_t k1) {
  int64_t sum = 0;
  if (x.slices[p].hw == HwType::b1 && w.slices[q].hw == HwType::b1) {
    const uint64_t* a = x.packed[p].data() + i * x.words;
    const uint64_t* b = w.packed[q].data() + j * w.words;
    for (int64_t word = k0 / 64; word * 64 < k1; ++word) {
      uint64_t mask = ~uint64_t{0};
      if (k0 > word * 64) mask &= mask << (k0 - word * 64);
      if (k1 < word * 64 + 64) mask &= ~uint64_t{0} >> (word * 64 + 64 - k1);
      sum += std::popcount(a[word] & b[word] & mask);
    }
  } else {
    const int32_t* a = x.values[p].data() + i * x.k;
    const int32_t* b = w.values[q].data() + j * w.k;
    for (int64_t kk = k0; kk < k1; ++kk) sum += int64_t{a[kk]} * b[kk];
  }
  QSPEC_CHECK(sum >= std::numeric_limits<int32_t>::min() && sum <= std::numeric_limits<int32_t>::max(),
              "dpr: partial product (", p, ",", q, ") at [", i, ",", j, "] = ", sum, " overflows the int32 accumulator");
  return sum;
}

// Reconstruction: sum_pq c_p c_q PP_pq over k in [k0, k1).
int64_t dpr_sum(const Sliced& x, int64_t i, const Sliced& w, int64_t j, int64_t k0, int64_t k1) {
  int64_t y = 0;
  for (size_t p = 0; p < x.slices.size(); ++p)
    for (size_t q = 0; q < w.slices.size(); ++q)
      y += x.slices[p].coefficient * w.slices[q].coefficient * partial_product(x, p, i, w, q, j, k0, k1);
  return y;
}

}  // namespace

Cost cost(const StrategyDpr& s) {
  Cost c;
  for (const Slice& a : decompose(s.x.partition, s.x.bits, s.x.is_signed, s.sm))
    for (const Slice& b : decompose(s.w.partition, s.w.bits, s.w.is_signed, s.sm)) {
      const HwType pass = std::max(a.hw, b.hw);
      c.products.emplace_back(pass, pass);
      ++c.partial_products;
      ++c.mma_ops_per_mac;
    }
  return c;
}

std::vector<int64_t> reference_gemm(const StrategyDpr& s, const int32_t* x, int64_t m, const int32_t* w,
                                    int64_t n, int64_t k) {
  const Sliced xs = slice_matrix(s.x, s.sm, x, m, k, "x");
  const Sliced ws = slice_matrix(s.w, s.sm, w, n, k, "w");
  std::vector<int64_t> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] = dpr_sum(xs, i, ws, j, 0, k);
  return y;
}

std::vector<float> quantized_gemm(const StrategyDpr& s, const int32_t* x_codes, const float* x_scales,
                                  int64_t x_group, int64_t m, const QuantizedMatrix& w) {
  const quant::Format format = w.format.format;
  QSPEC_CHECK(format == quant::Format::int4 || format == quant::Format::int4_channel, "dpr: weight matrix ", w.name,
              " is ", quant::format_name(format), ", not int4");
  QSPEC_CHECK(s.w.bits == 4 && s.w.is_signed, "dpr: strategy ", s.name, ": w must be a signed 4-bit operand");
  const int64_t n = w.rows, k = w.cols(), w_group = w.format.block;
  QSPEC_CHECK(w.block_scale_values.size() == static_cast<size_t>(n * w.format.blocks()), "dpr: weight matrix ",
              w.name, " has no decoded scales (call prepare())");
  QSPEC_CHECK(x_group > 0 && k % x_group == 0, "dpr: x_group ", x_group, " does not divide k = ", k);
  QSPEC_CHECK(w_group % x_group == 0 || x_group % w_group == 0, "dpr: x_group ", x_group, " and the weight group ",
              w_group, " of ", w.name, " do not nest");
  const int64_t block = std::min(w_group, x_group);

  std::vector<int32_t> w_values(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t kk = 0; kk < k; ++kk)
      w_values[j * k + kk] =
          static_cast<int32_t>(quant::element_value(w.format, w.codes.data() + j * w.format.code_bytes(), kk));
  const Sliced xs = slice_matrix(s.x, s.sm, x_codes, m, k, "x_codes");
  const Sliced ws = slice_matrix(s.w, s.sm, w_values.data(), n, k, w.name.c_str());

  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t k0 = 0; k0 < k; k0 += block) {
        const float scale = w.block_scale_values[j * w.format.blocks() + k0 / w_group] *
                            x_scales[i * (k / x_group) + k0 / x_group];
        acc += scale * static_cast<float>(dpr_sum(xs, i, ws, j, k0, k0 + block));
      }
      y[i * n + j] = acc;
    }
  return y;
}

StrategyDpr w4_strategy(std::string_view name, int activation_bits, int sm) {
  QSPEC_CHECK(activation_bits == 8 || activation_bits == 4, "dpr: activation_bits ", activation_bits,
              " (W4 strategies take 8 or 4)");
  StrategyDpr s{std::string(name), {activation_bits, true, padding(activation_bits)}, {4, true, padding(4)}, sm};
  if (name == "bitwise") {
    s.x.partition = bitwise(activation_bits);
    s.w.partition = bitwise(4);
  } else if (name == "split") {
    s.x.partition = split(activation_bits, activation_bits / 2);
  } else {
    QSPEC_CHECK(name == "padding", "dpr: unknown strategy '", name, "' (known: padding, bitwise, split)");
  }
  return s;
}

}  // namespace qspec::gemm::dpr
