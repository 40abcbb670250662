// Offline quantization of a loaded model's projections: round to nearest or GPTQ, optionally
// with ARCQuant's calibration (channel reorder + augmented residual channels), from
// calibration text. The result is installed in the model (every 4-bit mode runs from it) and
// can be saved as a qspec 4-bit checkpoint (LlamaModel::save_quantized).
//
// ARC calibration (ARCQuant, section 3): run the model (W16A16) on the calibration text and
// collect, for each linear site (model/llama.h: the input of q/k/v, of o, of gate/up, of
// down), every input channel's absolute maximum. Channels are sorted ascending (Atom's
// reorder puts the outliers last). With M the site's largest value and tau = 2^-3 M (the
// E5M2 vs E2M1 exponent gap), the channels above tau need compensation; S for a 4-bit
// activation format is that count rounded up to the format's block (16 nvfp4, 32 mxfp4,
// the group size for int4), capped at `arc_max_fraction` of K (rounded down to the block);
// the weights carry tail = max S over the formats, rounded up to the weight block, augmented
// columns. Capped sites are reported.
//
// GPTQ (Frantar et al. 2023) runs layer by layer: the calibration hidden states enter layer l
// through the already quantized layers 0..l-1 (W4A16), the Hessian H = 2/n X^T X of each
// site's input is collected with layer l still in 16 bits, the seven projections are
// quantized, and the states move on through the quantized layer l. With ARC, GPTQ works on
// the reordered columns (H reordered alike); the augmented tail is rounded to nearest.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama.h"
#include "tokenizer/calibration_text.h"  // CalibrationSet, load_calibration_text

namespace qspec {

struct QuantizeOptions {
  quant::Format format = quant::kDefaultWeightFormat;
  int64_t group_size = 0;      // int4 groups; 0: LlamaModel::auto_group_size()
  std::string method = "rtn";  // "rtn" or "gptq"
  // How each group's scale (and int4-asym minimum) is chosen: from its range, or the grid of least
  // squared error (quant::BlockFit), for rtn and gptq alike. mse by default: it lowered WikiText-2
  // perplexity on both real models at every 4-bit format measured (docs/perf-notes.md, "4-bit
  // weight quality"); load-time RTN (--weights) keeps range, being ~40x cheaper.
  quant::BlockFit block_fit = quant::BlockFit::mse;
  double gptq_damp = 0.01;     // lambda = damp * mean(diag H)
  bool gptq_act_order = false;
  bool rotate = false;            // QuaRot-style Hadamard rotation first (LlamaModel::apply_hadamard_rotation)
  uint64_t rotation_seed = 0;
  bool arc = false;
  double arc_tau_factor = 0.125;   // tau = factor * M (2^-3)
  double arc_max_fraction = 0.25;  // S <= this fraction of K
};

// stage: "calibrate", "gptq" or "quantize"; done of total units of that stage.
using QuantizeProgress = std::function<void(const std::string& stage, size_t done, size_t total)>;

// Quantizes every projection of `model` (which must hold its checkpoint weights) and
// installs the result. GPTQ and ARC need `calibration`.
void quantize_model(LlamaModel& model, const QuantizeOptions& options, const CalibrationSet* calibration,
                    const QuantizeProgress& progress = {});

// The S and tail of one site from its per-channel abs maxima (exposed for tests).
ArcSite calibrate_arc_site(const std::vector<float>& channel_abs_max, quant::Format weight_format,
                           int64_t weight_block, int64_t int4_group, double tau_factor, double max_fraction);

}  // namespace qspec
