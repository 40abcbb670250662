// GPTQ (see gptq.h). The quantized values themselves come from quant::quantize_block_scale /
// quant::quantize_element (formats.cpp, the bit-exact reference); this file only chooses what
// to quantize: f64 Hessian algebra and error propagation.
#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/thread_pool.h"
#include "qspec/error.h"

namespace qspec {

namespace {

// Rows of the weight matrix one task works on together: the U row a column update reads stays
// in L1 while it is applied to every row of the tile.
constexpr int64_t kRowTile = 16;

// Work items of at least this many multiply-adds are worth a parallel region.
constexpr int64_t kParallelWork = 1 << 15;

size_t grain_for(int64_t work_per_item) {
  return static_cast<size_t>(std::max<int64_t>(1, kParallelWork / std::max<int64_t>(1, work_per_item)));
}

// Eight independent partial sums: the compiler may vectorize them (one running sum would be a
// serial dependency chain under strict IEEE semantics).
double dot(const double* a, const double* b, int64_t count) {
  double partial[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int lane = 0; lane < 8; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  double sum = 0.0;
  for (; i < count; ++i) sum += a[i] * b[i];
  for (int lane = 0; lane < 8; ++lane) sum += partial[lane];
  return sum;
}

// Upper triangular R with a = R R^T (a symmetric positive definite, upper triangle read; a
// "reversed" Cholesky). Returns false when a is not numerically positive definite.
bool reversed_cholesky(const std::vector<double>& a, int64_t k, std::vector<double>& r) {
  r.assign(static_cast<size_t>(k * k), 0.0);
  for (int64_t j = k - 1; j >= 0; --j) {
    const double* rj = r.data() + j * k + j + 1;  // R[j][j+1..k)
    const int64_t tail = k - 1 - j;
    const double pivot = a[static_cast<size_t>(j * k + j)] - dot(rj, rj, tail);
    if (!(pivot > 0.0) || !std::isfinite(pivot)) return false;
    const double diagonal = std::sqrt(pivot);
    r[static_cast<size_t>(j * k + j)] = diagonal;
    ThreadPool::global().parallel_for(static_cast<size_t>(j), grain_for(tail + 1), [&](size_t begin, size_t end) {
      for (int64_t i = static_cast<int64_t>(begin); i < static_cast<int64_t>(end); ++i) {
        const double* ri = r.data() + i * k + j + 1;
        r[static_cast<size_t>(i * k + j)] = (a[static_cast<size_t>(i * k + j)] - dot(ri, rj, tail)) / diagonal;
      }
    });
  }
  return true;
}

// U = R^-1 for upper triangular R (then H^-1 = R^-T R^-1 = U^T U: U is the upper Cholesky
// factor of H^-1, the matrix GPTQ's updates use). Column j solves R u = e_j by back substitution.
std::vector<double> upper_inverse(const std::vector<double>& r, int64_t k) {
  std::vector<double> u(static_cast<size_t>(k * k), 0.0);
  ThreadPool::global().parallel_for(static_cast<size_t>(k), grain_for(k * k / 4), [&](size_t begin, size_t end) {
    std::vector<double> column(static_cast<size_t>(k));
    for (int64_t j = static_cast<int64_t>(begin); j < static_cast<int64_t>(end); ++j) {
      column[static_cast<size_t>(j)] = 1.0 / r[static_cast<size_t>(j * k + j)];
      for (int64_t i = j - 1; i >= 0; --i) {
        const double sum = dot(r.data() + i * k + i + 1, column.data() + i + 1, j - i);
        column[static_cast<size_t>(i)] = -sum / r[static_cast<size_t>(i * k + i)];
      }
      for (int64_t i = 0; i <= j; ++i) u[static_cast<size_t>(i * k + j)] = column[static_cast<size_t>(i)];
    }
  });
  return u;
}

// Lazy-batch width. Without act_order a block's scale is computed from its values when its
// first column is reached; they must have had every earlier column's update by then, so a
// block may not straddle a batch boundary.
int64_t batch_width(const quant::RowFormat& format, const GptqOptions& options) {
  const int64_t requested = std::min(options.block_columns, format.k);
  if (options.act_order || format.blocks() == 1) return requested;
  if (format.block <= requested) return requested - requested % format.block;
  return format.block % requested == 0 ? requested : format.block;
}

}  // namespace

// ---- HessianAccumulator ----

HessianAccumulator::HessianAccumulator(int64_t k) : k_(k) {
  QSPEC_CHECK(k > 0, "HessianAccumulator: k must be positive, got ", k);
  sum_.assign(static_cast<size_t>(k * k), 0.0);
}

void HessianAccumulator::add(const float* x, int64_t rows) {
  QSPEC_CHECK(rows >= 0, "HessianAccumulator: negative row count ", rows);
  for (int64_t i = 0; i < rows * k_; ++i)
    if (!std::isfinite(x[i]))
      fail("HessianAccumulator: calibration row ", i / k_, " channel ", i % k_, " is ", x[i],
           "; expected finite values");
  const int64_t k = k_;
  // Row i of the upper triangle: sum over samples of x_i * x[i..k).
  ThreadPool::global().parallel_for(static_cast<size_t>(k), grain_for(rows * k / 2), [&](size_t begin, size_t end) {
    for (int64_t i = static_cast<int64_t>(begin); i < static_cast<int64_t>(end); ++i) {
      double* out = sum_.data() + i * k;
      for (int64_t s = 0; s < rows; ++s) {
        const float* sample = x + s * k;
        const double xi = sample[i];
        if (xi == 0.0) continue;
        for (int64_t j = i; j < k; ++j) out[j] += xi * static_cast<double>(sample[j]);
      }
    }
  });
  samples_ += rows;
}

std::vector<double> HessianAccumulator::hessian() const {
  std::vector<double> h(static_cast<size_t>(k_ * k_), 0.0);
  if (samples_ == 0) return h;
  const double factor = 2.0 / static_cast<double>(samples_);
  for (int64_t i = 0; i < k_; ++i)
    for (int64_t j = i; j < k_; ++j) {
      const double value = factor * sum_[static_cast<size_t>(i * k_ + j)];
      h[static_cast<size_t>(i * k_ + j)] = value;
      h[static_cast<size_t>(j * k_ + i)] = value;
    }
  return h;
}

// ---- gptq_quantize ----

QuantizedMatrix gptq_quantize(const std::string& name, const float* weight, int64_t rows, int64_t k,
                              std::vector<double> hessian, quant::Format format, int64_t group_size,
                              const GptqOptions& options, GptqStats* stats) {
  QSPEC_CHECK(quant::format_supports(format, quant::Role::weight), name, ": '", quant::format_name(format),
              "' is not a weight format (int4, int4-channel, nvfp4, mxfp4)");
  QSPEC_CHECK(rows > 0 && k > 0, name, ": GPTQ needs a non-empty matrix, got ", rows, " x ", k);
  QSPEC_CHECK(options.block_columns > 0, name, ": GPTQ block_columns must be positive, got ",
              options.block_columns);
  QSPEC_CHECK(std::isfinite(options.damp_percent) && options.damp_percent >= 0.0, name,
              ": GPTQ damp_percent must be finite and >= 0, got ", options.damp_percent);
  QuantizedMatrix out;
  out.name = name;
  out.rows = rows;
  try {
    out.format = quant::make_row_format(format, quant::Role::weight, k, group_size);
  } catch (const Error& error) {
    fail(name, " [", rows, " x ", k, "]: cannot quantize: ", error.what());
  }
  const quant::RowFormat& row_format = out.format;
  QSPEC_CHECK(static_cast<int64_t>(hessian.size()) == k * k, name, " [", rows, " x ", k, "]: GPTQ Hessian has ",
              hessian.size(), " values, expected k * k = ", k * k);
  for (int64_t i = 0; i < rows * k; ++i)
    if (!std::isfinite(weight[i]))
      fail(name, ": weight row ", i / k, " column ", i % k, " is ", weight[i], "; refusing to quantize NaN or infinity");
  for (int64_t i = 0; i < k * k; ++i)
    if (!std::isfinite(hessian[static_cast<size_t>(i)]))
      fail(name, ": GPTQ Hessian entry (", i / k, ", ", i % k, ") is ", hessian[static_cast<size_t>(i)],
           "; expected finite values");

  // Dead channels: never active in the calibration data, so their weights cannot matter there.
  std::vector<char> dead(static_cast<size_t>(k), 0);
  int64_t dead_channels = 0;
  for (int64_t j = 0; j < k; ++j) {
    double& diagonal = hessian[static_cast<size_t>(j * k + j)];
    QSPEC_CHECK(diagonal >= 0.0, name, ": GPTQ Hessian diagonal entry ", j, " is negative (", diagonal,
                "); a Hessian 2/n X^T X is positive semidefinite");
    if (diagonal == 0.0) {
      diagonal = 1.0;
      dead[static_cast<size_t>(j)] = 1;
      ++dead_channels;
    }
  }

  // nvfp4: the tensor scale from the whole original matrix, as quantize_rtn.
  if (format == quant::Format::nvfp4) out.format.tensor_scale = quant::nvfp4_tensor_scale(quant::abs_max(weight, rows * k));

  // Processing order: natural, or descending H_jj (stable, so ties keep natural order).
  std::vector<int64_t> order(static_cast<size_t>(k));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options.act_order)
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return hessian[static_cast<size_t>(a * k + a)] > hessian[static_cast<size_t>(b * k + b)];
    });

  // Damped, permuted Hessian -> U, the upper Cholesky factor of its inverse.
  double mean_diagonal = 0.0;
  for (int64_t j = 0; j < k; ++j) mean_diagonal += hessian[static_cast<size_t>(j * k + j)];
  mean_diagonal /= static_cast<double>(k);
  std::vector<double> permuted(static_cast<size_t>(k * k)), factor;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = i; j < k; ++j) {
      // Upper triangle of the permuted matrix from whichever triangle of H holds the pair.
      const int64_t a = std::min(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
      const int64_t b = std::max(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
      permuted[static_cast<size_t>(i * k + j)] = hessian[static_cast<size_t>(a * k + b)];
    }
  hessian.clear();
  hessian.shrink_to_fit();
  double damp = options.damp_percent;
  bool factorized = false;
  std::vector<double> damped;
  for (int attempt = 0; attempt < 4 && !factorized; ++attempt) {
    if (attempt > 0) damp = std::max(damp * 10.0, 0.01);
    damped = permuted;
    for (int64_t j = 0; j < k; ++j) damped[static_cast<size_t>(j * k + j)] += damp * mean_diagonal;
    factorized = reversed_cholesky(damped, k, factor);
  }
  if (!factorized)
    fail(name, " [", rows, " x ", k, "]: GPTQ Hessian is not positive definite even with damping ", damp,
         " * mean(diag H); check the calibration statistics");
  damped.clear();
  permuted.clear();
  const std::vector<double> inverse_factor = upper_inverse(factor, k);
  factor.clear();
  factor.shrink_to_fit();

  const int64_t code_bytes = row_format.code_bytes(), scale_bytes = row_format.scale_bytes();
  const int64_t block = row_format.block;
  out.codes.assign(static_cast<size_t>(rows * code_bytes), 0);
  out.scales.assign(static_cast<size_t>(rows * scale_bytes), 0);
  const bool record = stats != nullptr && stats->record_values;
  std::vector<float> values;
  if (record) values.assign(static_cast<size_t>(rows * k), 0.0f);

  const int64_t width = batch_width(row_format, options);
  const int64_t tiles = (rows + kRowTile - 1) / kRowTile;
  std::vector<double> tile_loss(static_cast<size_t>(tiles), 0.0);
  try {
    ThreadPool::global().parallel_for(static_cast<size_t>(tiles), 1, [&](size_t begin, size_t end) {
      std::vector<double> w(static_cast<size_t>(kRowTile * k));
      std::vector<double> errors(static_cast<size_t>(kRowTile * width));
      std::vector<float> scratch(static_cast<size_t>(std::max(block, k)));
      std::vector<uint8_t> scratch_codes(static_cast<size_t>(code_bytes));
      for (int64_t tile = static_cast<int64_t>(begin); tile < static_cast<int64_t>(end); ++tile) {
        const int64_t row0 = tile * kRowTile;
        const int64_t count = std::min(kRowTile, rows - row0);
        double loss = 0.0;
        // The tile's rows in processing order, dead channels zeroed.
        for (int64_t r = 0; r < count; ++r) {
          const float* source = weight + (row0 + r) * k;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t c = order[static_cast<size_t>(j)];
            w[static_cast<size_t>(r * k + j)] = dead[static_cast<size_t>(c)] ? 0.0 : static_cast<double>(source[c]);
          }
          if (options.act_order) {
            // Static groups: every scale from the original (dead-zeroed) row, before any update.
            for (int64_t c = 0; c < k; ++c) scratch[static_cast<size_t>(c)] = dead[static_cast<size_t>(c)] ? 0.0f : source[c];
            quant::quantize_row(row_format, scratch.data(), scratch_codes.data(),
                                out.scales.data() + (row0 + r) * scale_bytes, options.block_fit);
          }
        }
        for (int64_t b0 = 0; b0 < k; b0 += width) {
          const int64_t b1 = std::min(k, b0 + width);
          for (int64_t j = b0; j < b1; ++j) {
            const int64_t c = order[static_cast<size_t>(j)];
            const int64_t c_block = c / block;
            const double* u = inverse_factor.data() + j * k;
            const double d = u[j];
            for (int64_t r = 0; r < count; ++r) {
              const int64_t row = row0 + r;
              double* wr = w.data() + r * k;
              uint8_t* row_scales = out.scales.data() + row * scale_bytes;
              if (!options.act_order && c % block == 0) {
                // Natural order: c == j, and the block's columns [j, j + block) are up to date.
                for (int64_t i = 0; i < block; ++i) scratch[static_cast<size_t>(i)] = static_cast<float>(wr[j + i]);
                quant::quantize_block_scale(row_format, scratch.data(), c_block, row_scales, options.block_fit);
              }
              const double current = wr[j];
              const quant::QuantizedElement q =
                  quant::quantize_element(row_format, row_scales, c_block, static_cast<float>(current));
              out.codes[static_cast<size_t>(row * code_bytes + c / 2)] |= static_cast<uint8_t>(q.code << (4 * (c % 2)));
              if (record) values[static_cast<size_t>(row * k + c)] = q.value;
              const double e = (current - static_cast<double>(q.value)) / d;
              loss += e * e;
              errors[static_cast<size_t>(r * width + (j - b0))] = e;
              for (int64_t i = j + 1; i < b1; ++i) wr[i] -= e * u[i];
            }
          }
          // Trailing update of the columns after the batch.
          if (b1 < k) {
            for (int64_t j = b0; j < b1; ++j) {
              const double* u = inverse_factor.data() + j * k;
              for (int64_t r = 0; r < count; ++r) {
                const double e = errors[static_cast<size_t>(r * width + (j - b0))];
                double* wr = w.data() + r * k;
                for (int64_t i = b1; i < k; ++i) wr[i] -= e * u[i];
              }
            }
          }
        }
        tile_loss[static_cast<size_t>(tile)] = loss;
      }
    });
  } catch (const Error& error) {
    fail(name, " [", rows, " x ", k, "]: GPTQ with ", quant::format_name(format), ": ", error.what());
  }
  out.prepare();
  if (stats != nullptr) {
    stats->damp_percent = damp;
    stats->dead_channels = dead_channels;
    stats->loss = std::accumulate(tile_loss.begin(), tile_loss.end(), 0.0);
    stats->values = std::move(values);
  }
  return out;
}

}  // namespace qspec
