// GPTQ weight quantization (Frantar et al., "GPTQ: Accurate Post-Training Quantization for
// Generative Pre-trained Transformers", ICLR 2023): quantizes a linear layer's weights one input
// channel (column) at a time and spreads each column's rounding error over the columns not yet
// quantized, weighted by the inverse Hessian of the layer's reconstruction error on calibration
// inputs. The result is an ordinary QuantizedMatrix in any weight format of quant/formats.h
// (codes and scales stored exactly as quantize_rtn stores them), so the engine runs it unchanged.
//
// Per row w (one output channel) with H the damped Hessian and U the upper Cholesky factor of
// H^-1 (H^-1 = U^T U), in column order:
//   q_j = Q(w_j)  (the format's element rule under the block's stored scale),
//   e_j = (w_j - q_j) / U_jj,   w_c -= e_j * U_jc for every later column c.
// Lazy batches: the updates inside a batch of block_columns columns are applied at once, the
// rest of the row gets one trailing update per batch (same result, cache-friendly).
//
// Block scales (one per format block: int4 group, 16 nvfp4, 32 mxfp4, the whole row for
// int4-channel):
//   act_order = false: computed by the format's own rule (quant::quantize_block_scale) from the
//     block's current, already-updated values when its first column is reached. Batches are
//     aligned with blocks so that those values have received every earlier column's update.
//   act_order = true: columns are processed by descending H_jj ("static groups"): every block's
//     scale is computed from the original weights before any update, so scales stay in natural
//     block order and no column index (g_idx) has to be stored.
//   nvfp4: the FP32 tensor scale comes from the amax of the whole original matrix, exactly as
//     quantize_rtn computes it.
// Each q_j is quant::quantize_element's value: the stored codes and scales dequantize
// (QuantizedMatrix::dequantize_row) to exactly the q values the error propagation used.
//
// Dead channels (H_jj == 0: never active in the calibration data) get H_jj = 1 and w_j = 0, as
// in the paper's reference. With H = c * I nothing propagates and the result is bit for bit
// quantize_rtn's (tested), act_order or not.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quant/formats.h"
#include "quant/quantized_linear.h"

namespace qspec {

// The GPTQ Hessian of one linear layer, H = (2 / n) * sum over n calibration rows x of x x^T
// (x: the layer's k input channels), accumulated in f64.
class HessianAccumulator {
 public:
  explicit HessianAccumulator(int64_t k);
  // Adds `rows` calibration rows of k values each (row-major). Throws qspec::Error on NaN or
  // infinite values (nothing is added then).
  void add(const float* x, int64_t rows);
  int64_t k() const { return k_; }
  int64_t samples() const { return samples_; }
  // k x k row-major, symmetric; all zeros before the first add.
  std::vector<double> hessian() const;

 private:
  int64_t k_;
  int64_t samples_ = 0;
  std::vector<double> sum_;  // upper triangle of sum x x^T
};

struct GptqOptions {
  // lambda = damp_percent * mean(diag H) is added to the diagonal. When the Cholesky
  // factorization fails, it is retried with max(10 * damp, 0.01), then 10x more, 4 tries in all.
  double damp_percent = 0.01;
  bool act_order = false;       // process columns by descending H_jj (static groups, see above)
  int64_t block_columns = 128;  // lazy-batch width
  quant::BlockFit block_fit = quant::BlockFit::range;  // how each block's scale is chosen (formats.h)
};

// Optional details of one run (for logs and tests).
struct GptqStats {
  double damp_percent = 0.0;  // the damping that factorized (after retries)
  int64_t dead_channels = 0;  // columns with H_jj == 0
  // sum over rows and columns of e_j^2 = sum over rows of (w - q) H_damped (w - q)^T, the
  // layer's reconstruction error proxy (exact arithmetic; f64 here).
  double loss = 0.0;
  // Set record_values before the call to get the rows x k q values GPTQ propagated with.
  bool record_values = false;
  std::vector<float> values;
};

// weight: rows x k f32, row-major (one row per output channel). hessian: k x k, symmetric (the
// upper triangle is read), e.g. HessianAccumulator::hessian(). group_size: int4 groups.
// Throws qspec::Error naming the matrix on: a non-weight format, k not a multiple of the
// format's block, a hessian that is not k x k, NaN or infinity in weight or hessian, a negative
// H_jj, or a hessian that does not factorize even after extra damping.
QuantizedMatrix gptq_quantize(const std::string& name, const float* weight, int64_t rows,
                              int64_t k, std::vector<double> hessian, quant::Format format,
                              int64_t group_size = quant::kDefaultGroupSize,
                              const GptqOptions& options = {}, GptqStats* stats = nullptr);

}  // namespace qspec
