// Offline quantization of a model's weights (model/quantize.h): RTN, GPTQ over calibration sequences, ARC.
#include "model/quantize.h"

#include <algorithm>
#include <numeric>

#include "qspec/error.h"
#include "quant/gptq.h"

namespace qspec {

namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }
int64_t round_down(int64_t value, int64_t multiple) { return value / multiple * multiple; }

// Per-channel abs max of every site's input, over all calibration tokens.
class AbsMaxObserver : public ForwardObserver {
 public:
  explicit AbsMaxObserver(int64_t layers) : abs_max_(static_cast<size_t>(layers * kLinearSites)) {}
  void observe(int64_t layer, LinearSite site, const float* input, int64_t tokens, int64_t k) override {
    std::vector<float>& channels = abs_max_[static_cast<size_t>(layer * kLinearSites + static_cast<int>(site))];
    channels.resize(static_cast<size_t>(k), 0.0f);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < k; ++j) channels[j] = std::max(channels[j], std::fabs(input[t * k + j]));
  }
  const std::vector<float>& site(int64_t layer, int s) const { return abs_max_[static_cast<size_t>(layer * kLinearSites + s)]; }

 private:
  std::vector<std::vector<float>> abs_max_;
};

// GPTQ Hessians of one layer's four sites.
class HessianObserver : public ForwardObserver {
 public:
  HessianObserver(int64_t layer, const int64_t (&site_k)[kLinearSites]) : layer_(layer) {
    for (int s = 0; s < kLinearSites; ++s) accumulators_.emplace_back(site_k[s]);
  }
  void observe(int64_t layer, LinearSite site, const float* input, int64_t tokens, int64_t) override {
    if (layer == layer_) accumulators_[static_cast<size_t>(site)].add(input, tokens);
  }
  const HessianAccumulator& site(int s) const { return accumulators_[static_cast<size_t>(s)]; }

 private:
  int64_t layer_;
  std::vector<HessianAccumulator> accumulators_;
};

// The weight rows as f32, reordered and augmented for the site: [W_perm | W_perm[:, K-tail:]].
std::vector<float> augmented_rows(const WeightMatrix& weight, const ArcSite& site) {
  const int64_t k = weight.cols, width = k + site.tail;
  std::vector<float> row(static_cast<size_t>(k)), out(static_cast<size_t>(weight.rows * width));
  for (int64_t r = 0; r < weight.rows; ++r) {
    weight.row_to_f32(r, row.data());
    float* dst = out.data() + r * width;
    if (!site.calibrated()) {
      std::copy(row.begin(), row.end(), dst);
      continue;
    }
    for (int64_t j = 0; j < k; ++j) dst[j] = row[static_cast<size_t>(site.order[j])];
    for (int64_t i = 0; i < site.tail; ++i) dst[k + i] = dst[k - site.tail + i];
  }
  return out;
}

WeightMatrix f32_view(const std::string& name, const float* data, int64_t rows, int64_t cols) {
  WeightMatrix m;
  m.name = name;
  m.dtype = DType::F32;
  m.rows = rows;
  m.cols = cols;
  m.data = data;
  return m;
}

// GPTQ on the first K (reordered) columns, round to nearest on the augmented tail, joined row
// by row into one matrix of K + tail columns (blocks never straddle K: K and tail are
// multiples of the weight block).
QuantizedMatrix quantize_gptq(const WeightMatrix& weight, const ArcSite& site, const HessianAccumulator& hessian,
                              const QuantizeOptions& options, int64_t group_size) {
  const int64_t k = weight.cols, width = k + site.tail;
  const std::vector<float> rows = augmented_rows(weight, site);
  std::vector<float> main(static_cast<size_t>(weight.rows * k));
  for (int64_t r = 0; r < weight.rows; ++r)
    std::copy(rows.begin() + r * width, rows.begin() + r * width + k, main.begin() + r * k);
  std::vector<double> h = hessian.hessian();
  if (site.calibrated()) {
    std::vector<double> reordered(h.size());
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) reordered[i * k + j] = h[site.order[i] * k + site.order[j]];
    h = std::move(reordered);
  }
  GptqOptions gptq;
  gptq.damp_percent = options.gptq_damp;
  gptq.act_order = options.gptq_act_order;
  gptq.block_fit = options.block_fit;
  QuantizedMatrix out = gptq_quantize(weight.name, main.data(), weight.rows, k, std::move(h), options.format,
                                      group_size, gptq);
  if (site.tail == 0) return out;
  // The tail under the same row format (nvfp4: the same tensor scale, which is the whole
  // matrix's: the tail duplicates columns, so the amax is unchanged).
  quant::RowFormat tail_format = quant::make_row_format(options.format, quant::Role::weight, site.tail, group_size);
  tail_format.tensor_scale = out.format.tensor_scale;
  quant::RowFormat joined = quant::make_row_format(options.format, quant::Role::weight, width, group_size);
  joined.tensor_scale = out.format.tensor_scale;
  std::vector<uint8_t> codes(static_cast<size_t>(weight.rows * joined.code_bytes()));
  std::vector<uint8_t> scales(static_cast<size_t>(weight.rows * joined.scale_bytes()));
  for (int64_t r = 0; r < weight.rows; ++r) {
    uint8_t* row_codes = codes.data() + r * joined.code_bytes();
    uint8_t* row_scales = scales.data() + r * joined.scale_bytes();
    std::copy_n(out.codes.data() + r * out.format.code_bytes(), out.format.code_bytes(), row_codes);
    std::copy_n(out.scales.data() + r * out.format.scale_bytes(), out.format.scale_bytes(), row_scales);
    quant::quantize_row(tail_format, rows.data() + r * width + k, row_codes + out.format.code_bytes(),
                        row_scales + out.format.scale_bytes());
  }
  out.format = joined;
  out.codes = std::move(codes);
  out.scales = std::move(scales);
  out.prepare();
  return out;
}

struct ProjectionRef {
  const WeightMatrix LayerWeights::*weight;
  QuantizedMatrix QuantizedLayerWeights::*quantized;
  LinearSite site;
};
constexpr ProjectionRef kProjections[] = {
    {&LayerWeights::q_proj, &QuantizedLayerWeights::q_proj, LinearSite::attention_in},
    {&LayerWeights::k_proj, &QuantizedLayerWeights::k_proj, LinearSite::attention_in},
    {&LayerWeights::v_proj, &QuantizedLayerWeights::v_proj, LinearSite::attention_in},
    {&LayerWeights::o_proj, &QuantizedLayerWeights::o_proj, LinearSite::attention_out},
    {&LayerWeights::gate_proj, &QuantizedLayerWeights::gate_proj, LinearSite::mlp_in},
    {&LayerWeights::up_proj, &QuantizedLayerWeights::up_proj, LinearSite::mlp_in},
    {&LayerWeights::down_proj, &QuantizedLayerWeights::down_proj, LinearSite::mlp_out},
};

}  // namespace

ArcSite calibrate_arc_site(const std::vector<float>& channel_abs_max, quant::Format weight_format, int64_t weight_block,
                           int64_t int4_group, double tau_factor, double max_fraction) {
  (void)weight_format;
  const int64_t k = static_cast<int64_t>(channel_abs_max.size());
  QSPEC_CHECK(k > 0, "ARC calibration: a site saw no tokens");
  ArcSite site;
  site.order.resize(static_cast<size_t>(k));
  std::iota(site.order.begin(), site.order.end(), 0);
  // Ascending abs max, ties by channel index (deterministic): the outliers end up last.
  std::stable_sort(site.order.begin(), site.order.end(),
                   [&](int32_t a, int32_t b) { return channel_abs_max[a] < channel_abs_max[b]; });
  site.max_abs = *std::max_element(channel_abs_max.begin(), channel_abs_max.end());
  const float tau = static_cast<float>(tau_factor) * site.max_abs;
  for (float value : channel_abs_max) site.above_tau += value > tau;
  const int64_t cap = static_cast<int64_t>(max_fraction * static_cast<double>(k));
  auto outliers_for = [&](int64_t block) {
    const int64_t wanted = round_up(site.above_tau, block), allowed = round_down(cap, block);
    if (wanted > allowed) site.capped = true;
    return std::min(wanted, allowed);
  };
  site.outliers_int4 = k % int4_group == 0 ? outliers_for(int4_group) : 0;
  site.outliers_nvfp4 = outliers_for(16);
  site.outliers_mxfp4 = outliers_for(32);
  const int64_t widest = std::max({site.outliers_int4, site.outliers_nvfp4, site.outliers_mxfp4});
  site.tail = std::min(round_up(widest, weight_block), round_down(k, weight_block));
  return site;
}

void quantize_model(LlamaModel& model, const QuantizeOptions& options, const CalibrationSet* calibration,
                    const QuantizeProgress& progress) {
  const ModelConfig& c = model.config();
  QSPEC_CHECK(model.has_checkpoint_weights(), model.dir(), " holds 4-bit weights already (", model.quantized_format(),
              "); quantize the original checkpoint");
  QSPEC_CHECK(quant::format_supports(options.format, quant::Role::weight), "'", quant::format_name(options.format),
              "' is not a weight format (int4, int4-channel, nvfp4, mxfp4)");
  QSPEC_CHECK(options.method == "rtn" || options.method == "gptq", "unknown quantization method '", options.method,
              "' (known: rtn, gptq)");
  const bool gptq = options.method == "gptq";
  QSPEC_CHECK(!(gptq || options.arc) || (calibration && !calibration->sequences.empty()),
              gptq ? "GPTQ" : "ARC calibration", " needs calibration text (--calib FILE)");
  QSPEC_CHECK(!options.arc || options.format != quant::Format::int4_channel,
              "ARC augments whole weight blocks; int4-channel has one scale per row (use int4, nvfp4 or mxfp4)");
  QSPEC_CHECK(options.arc_tau_factor > 0.0 && options.arc_tau_factor <= 1.0, "ARC tau factor ", options.arc_tau_factor,
              " must be in (0, 1]");
  QSPEC_CHECK(options.arc_max_fraction >= 0.0 && options.arc_max_fraction <= 1.0, "ARC max fraction ",
              options.arc_max_fraction, " must be in [0, 1]");
  const int64_t group_size = options.group_size > 0 ? options.group_size : model.auto_group_size();
  const int64_t site_k[kLinearSites] = {c.hidden_size, c.q_dim(), c.hidden_size, c.intermediate_size};
  for (int64_t k : site_k)  // every shape is checked before any work starts
    quant::make_row_format(options.format, quant::Role::weight, k, group_size);
  const int64_t weight_block = quant::block_size(options.format, c.hidden_size, group_size);
  if (options.rotate) model.apply_hadamard_rotation(options.rotation_seed);

  std::vector<QuantizedLayerWeights> layers(static_cast<size_t>(c.num_layers));
  const size_t sequences = calibration ? calibration->sequences.size() : 0;
  const RunMode w16a16 = parse_run_mode("w16a16");
  if (options.arc) {
    AbsMaxObserver observer(c.num_layers);
    std::vector<float> logits;
    for (size_t s = 0; s < sequences; ++s) {
      const std::vector<int32_t>& sequence = calibration->sequences[s];
      KvCache cache = model.new_cache(static_cast<int64_t>(sequence.size()));
      model.forward(sequence, cache, logits, false, w16a16, &observer);
      if (progress) progress("calibrate", s + 1, sequences);
    }
    for (int64_t l = 0; l < c.num_layers; ++l)
      for (int s = 0; s < kLinearSites; ++s)
        layers[static_cast<size_t>(l)].sites[s] = calibrate_arc_site(
            observer.site(l, s), options.format, weight_block, group_size, options.arc_tau_factor, options.arc_max_fraction);
  }

  auto quantize_rtn_layer = [&](int64_t l) {
    QuantizedLayerWeights& out = layers[static_cast<size_t>(l)];
    const LayerWeights& weights = model.layer_weights(l);
    for (const ProjectionRef& p : kProjections) {
      const WeightMatrix& weight = weights.*p.weight;
      const ArcSite& site = out.sites[static_cast<int>(p.site)];
      const std::vector<float> rows = augmented_rows(weight, site);
      out.*p.quantized =
          quantize_rtn(f32_view(weight.name, rows.data(), weight.rows, weight.cols + site.tail), options.format, group_size,
                       options.block_fit);
    }
  };

  if (!gptq) {
    for (int64_t l = 0; l < c.num_layers; ++l) {
      quantize_rtn_layer(l);
      if (progress) progress("quantize", static_cast<size_t>(l + 1), static_cast<size_t>(c.num_layers));
    }
  } else {
    // Layer by layer: hidden states of every calibration sequence enter layer l through the
    // quantized layers before it.
    std::vector<std::vector<float>> states(sequences);
    int64_t longest = 0;
    for (size_t s = 0; s < sequences; ++s) {
      const std::vector<int32_t>& sequence = calibration->sequences[s];
      longest = std::max<int64_t>(longest, static_cast<int64_t>(sequence.size()));
      states[s].resize(sequence.size() * static_cast<size_t>(c.hidden_size));
      for (size_t t = 0; t < sequence.size(); ++t) {
        QSPEC_CHECK(sequence[t] >= 0 && sequence[t] < c.vocab_size, "calibration token ", sequence[t],
                    " outside the vocabulary");
        model.embedding().row_to_f32(sequence[t], states[s].data() + t * static_cast<size_t>(c.hidden_size));
      }
    }
    std::vector<int32_t> positions(static_cast<size_t>(longest));
    std::iota(positions.begin(), positions.end(), 0);
    KvCache cache = model.new_cache(longest);
    LlamaModel::Workspace workspace = model.make_workspace(longest);
    RunMode w4a16 = parse_run_mode("w4a16");
    std::vector<float> scratch;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      HessianObserver observer(l, site_k);
      for (size_t s = 0; s < sequences; ++s) {
        scratch = states[s];
        const int64_t count = static_cast<int64_t>(calibration->sequences[s].size());
        model.run_layer(l, scratch.data(), count, positions.data(), cache, w16a16, &observer, workspace);
      }
      QuantizedLayerWeights& out = layers[static_cast<size_t>(l)];
      const LayerWeights& weights = model.layer_weights(l);
      for (const ProjectionRef& p : kProjections) {
        const WeightMatrix& weight = weights.*p.weight;
        out.*p.quantized = quantize_gptq(weight, out.sites[static_cast<int>(p.site)],
                                         observer.site(static_cast<int>(p.site)), options, group_size);
      }
      model.set_quantized_layer_for_calibration(l, out);
      for (size_t s = 0; s < sequences; ++s) {
        const int64_t count = static_cast<int64_t>(calibration->sequences[s].size());
        model.run_layer(l, states[s].data(), count, positions.data(), cache, w4a16, nullptr, workspace);
      }
      if (progress) progress("gptq", static_cast<size_t>(l + 1), static_cast<size_t>(c.num_layers));
    }
  }

  QuantizationInfo info;
  info.format = options.format;
  info.group_size = quant::format_has_groups(options.format) ? group_size : 0;
  info.method = options.method;
  info.details = nlohmann::json::object();
  info.details["block_fit"] = quant::block_fit_name(options.block_fit);
  if (gptq)
    info.details["gptq"] = {{"damp_percent", options.gptq_damp}, {"act_order", options.gptq_act_order},
                            {"static_groups", options.gptq_act_order}, {"sequential", "layer"}};
  if (calibration)
    info.details["calibration"] = {{"source", calibration->source},
                                   {"sequences", calibration->sequences.size()},
                                   {"tokens", calibration->tokens}};
  if (model.rotated())
    info.details["rotation"] = {{"enabled", true},
                                {"seed", model.rotation_seed()},
                                {"kind", "randomized Hadamard, quant/hadamard.h"},
                                {"hidden_block", quant::hadamard_block_size(c.hidden_size)},
                                {"intermediate_block", quant::hadamard_block_size(c.intermediate_size)},
                                {"online", "mlp_out (seed + 1)"}};
  if (options.arc) {
    int64_t capped = 0, augmented = 0, total_k = 0;
    for (const QuantizedLayerWeights& layer : layers)
      for (int s = 0; s < kLinearSites; ++s) {
        capped += layer.sites[s].capped;
        augmented += layer.sites[s].tail;
        total_k += site_k[s];
      }
    info.details["arc"] = {{"enabled", true},
                           {"tau_factor", options.arc_tau_factor},
                           {"max_fraction", options.arc_max_fraction},
                           {"capped_sites", capped},
                           {"augmented_columns", augmented},
                           {"augmented_fraction", static_cast<double>(augmented) / static_cast<double>(total_k)}};
  }
  model.set_quantized_weights(std::move(layers), std::move(info));
}

}  // namespace qspec
