// qspec quantize: a 16-bit checkpoint in, a qspec 4-bit checkpoint out (RTN or GPTQ, optional
// ARCQuant calibration). The input directory is only read; the output appears complete or
// not at all.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "quant/formats.h"
#include "model/llama.h"
#include "model/quant_checkpoint.h"
#include "model/quantize.h"
#include "qspec/error.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

struct QuantizeArgs {
  std::string in_dir, out_dir;
  std::string format{quant::format_name(quant::kDefaultWeightFormat)};
  int64_t group_size = 0;
  std::string method = "rtn";
  std::string fit{quant::block_fit_name(QuantizeOptions{}.block_fit)};
  std::string calib_file;
  int64_t calib_samples = 128;
  int64_t calib_length = 512;
  double damp = 0.01;
  bool act_order = false;
  bool rotate = false;
  uint64_t rotation_seed = 0;
  bool arc = false;
  double arc_tau = 0.125;
  double arc_max_fraction = 0.25;
};

void run_quantize(const QuantizeArgs& args) {
  namespace fs = std::filesystem;
  // Everything that can be checked cheaply is checked before the model is touched.
  QSPEC_CHECK(!fs::exists(args.out_dir), args.out_dir, ": already exists; choose a new output directory");
  QSPEC_CHECK(fs::weakly_canonical(args.in_dir) != fs::weakly_canonical(args.out_dir), args.out_dir,
              ": the output must not be the input directory");
  QuantizeOptions options;
  options.format = quant::parse_format(args.format);
  QSPEC_CHECK(quant::format_supports(options.format, quant::Role::weight), "--format ", args.format,
              " is not a weight format (", quant::weight_format_names(", "), ")");
  options.group_size = args.group_size;
  options.method = args.method;
  options.block_fit = quant::parse_block_fit(args.fit);
  options.gptq_damp = args.damp;
  options.gptq_act_order = args.act_order;
  options.rotate = args.rotate;
  options.rotation_seed = args.rotation_seed;
  options.arc = args.arc;
  options.arc_tau_factor = args.arc_tau;
  options.arc_max_fraction = args.arc_max_fraction;
  const bool needs_calibration = args.method == "gptq" || args.arc;
  QSPEC_CHECK(!needs_calibration || !args.calib_file.empty(), args.method == "gptq" ? "--method gptq" : "--arc",
              " needs calibration text: --calib FILE");
  QSPEC_CHECK(args.damp > 0.0 && args.damp < 1.0, "--damp ", args.damp, " must be in (0, 1)");

  const auto start = std::chrono::steady_clock::now();
  auto model = LlamaModel::load(args.in_dir);
  CalibrationSet calibration;
  if (!args.calib_file.empty()) {  // only calibration needs the tokenizer (RTN works without one)
    auto tokenizer = Tokenizer::load(args.in_dir);
    tokenizer->check_model_vocab(model->config().vocab_size, args.in_dir);
    const int64_t length = std::min(args.calib_length, model->config().max_position_embeddings);
    calibration = load_calibration_text(args.calib_file, *tokenizer, args.calib_samples, length);
    std::fprintf(stderr, "[qspec] calibration: %zu sequences, %lld tokens from %s\n", calibration.sequences.size(),
                 static_cast<long long>(calibration.tokens), args.calib_file.c_str());
  }
  std::optional<ProgressBar> bar;  // one per stage, so each shows its own time
  std::string bar_stage;
  quantize_model(*model, options, args.calib_file.empty() ? nullptr : &calibration,
                 [&](const std::string& stage, size_t done, size_t total) {
                   if (stage != bar_stage) {
                     bar.reset();
                     bar.emplace(stage);
                     bar_stage = stage;
                   }
                   bar->update(done, total);
                 });
  bar.reset();
  model->save_quantized(args.out_dir, {{"tool", std::string("qspec ") + QSPEC_VERSION + " (" + git_commit() + ")"},
                                       {"command", command_line()}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("quantized %s -> %s: %s, %.2f MiB of quantized projections, %.1f s\n", args.in_dir.c_str(),
              args.out_dir.c_str(), model->quantized_format().c_str(),
              static_cast<double>(model->quantized_weight_bytes()) / (1 << 20), seconds);
  if (args.arc) {
    int64_t sites = 0, capped = 0, tail = 0, total_k = 0;
    for (const QuantizedLayerWeights& layer : model->quantized_layers())
      for (const ArcSite& site : layer.sites) {
        ++sites;
        capped += site.capped;
        tail += site.tail;
        total_k += static_cast<int64_t>(site.order.size());
      }
    std::printf("ARC: %lld sites, %lld augmented columns (%.1f%% of K), %lld sites capped at %.0f%% of K\n",
                static_cast<long long>(sites), static_cast<long long>(tail),
                100.0 * static_cast<double>(tail) / static_cast<double>(total_k), static_cast<long long>(capped),
                100.0 * args.arc_max_fraction);
  }
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* command = app.add_subcommand("quantize", "Quantize a checkpoint to 4-bit weights (RTN or GPTQ, optional ARC)");
  command->add_option("in_dir", args->in_dir, "Input model directory (16-bit weights)")->required();
  command->add_option("out_dir", args->out_dir, "Output directory (must not exist)")->required();
  command->add_option("--format", args->format, "Weight format: " + quant::weight_format_names())->capture_default_str();
  command->add_option("--group-size", args->group_size, "int4 / int4-asym / int4-zp group size along K (0: 128, or 64/32 when 128 does not divide every K)")
      ->capture_default_str();
  command->add_option("--method", args->method, "rtn (round to nearest) or gptq")
      ->check(CLI::IsMember({"rtn", "gptq"}))
      ->capture_default_str();
  command->add_option("--fit", args->fit,
                      "How each group's scale (and int4-asym minimum, int4-zp zero point) is chosen: range (from the group's extremes) or "
                      "mse (the clipped grid of least squared error), for rtn and gptq")
      ->check(CLI::IsMember({"range", "mse"}))
      ->capture_default_str();
  command->add_option("--calib", args->calib_file, "Calibration text file (UTF-8), for gptq and --arc");
  command->add_option("--calib-samples", args->calib_samples, "Calibration sequences")->capture_default_str();
  command->add_option("--calib-length", args->calib_length, "Tokens per calibration sequence")->capture_default_str();
  command->add_option("--damp", args->damp, "GPTQ dampening, a fraction of the mean Hessian diagonal")->capture_default_str();
  command->add_flag("--act-order", args->act_order, "GPTQ: process columns by decreasing Hessian diagonal (static groups)");
  command->add_flag("--rotate", args->rotate,
                    "QuaRot-style randomized Hadamard rotation of the residual stream and down_proj input "
                    "(for 4-bit activations with int4-channel weights)");
  command->add_option("--rotate-seed", args->rotation_seed, "Seed of the rotation's random signs")->capture_default_str();
  command->add_flag("--arc", args->arc, "ARCQuant: calibrate channel reorder and residual channels for 4-bit activations");
  command->add_option("--arc-tau", args->arc_tau, "ARC outlier threshold as a fraction of the site's max (2^-3)")
      ->capture_default_str();
  command->add_option("--arc-max-fraction", args->arc_max_fraction, "ARC: at most this fraction of K gets residual channels")
      ->capture_default_str();
  command->callback([args] { run_quantize(*args); });
}

}  // namespace qspec::cli
