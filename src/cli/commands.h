// Registration of the qspec subcommands (one file each).
#pragma once
#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "ops/kv_int8.h"
#include "qspec/decode_plan.h"
#include "qspec/sampling.h"
#include "quant/quantized_linear.h"

namespace qspec {
class LlamaModel;
}

namespace qspec::cli {
void register_generate(CLI::App& app);
void register_chat(CLI::App& app);
void register_info(CLI::App& app);
void register_convert(CLI::App& app);
void register_bench(CLI::App& app);
void register_eval(CLI::App& app);
void register_quantize(CLI::App& app);
void register_serve(CLI::App& app);
void register_tune(CLI::App& app);
void register_tune_draft(CLI::App& app);

// Makes a loaded model ready to run `modes`: when a mode needs 4-bit weights and the
// checkpoint has none, quantizes them now (RTN, `weights` format, "" = int4); a qspec 4-bit
// checkpoint keeps its own (an explicit `weights` that differs is an error). Sets each mode's
// int4 activation group to the weights' group (or the model's automatic one). Returns a
// description of the 4-bit weights ("-" when no mode uses them).
std::string prepare_model_for_modes(LlamaModel& model, std::vector<RunMode>& modes, const std::string& weights,
                                    int64_t group_size);

// The model directory every command that loads one takes, positional or as -m / --model (the
// spelling of llama.cpp and vLLM alike), required.
void add_model_argument(CLI::App* command, std::string& model_dir);
// --mode of the commands that decode (generate, chat, serve): auto (decode_rules::kCommandMode,
// the default), a run mode, or qspec; `what` opens the help line.
void add_mode_option(CLI::App* command, std::string& mode, const std::string& what);
// The sampling flags `generate` and `chat` share, in llama.cpp's spellings: --temperature /
// --temp, --top-k, --top-p, --min-p, --repeat-penalty, and --seed (which sets seed_given).
void add_sampling_options(CLI::App* command, SamplingParams& sampling, bool& seed_given);
// The QSpec flags of the commands that decode (generate, chat, serve): --draft (auto, the
// planner, by default), --gamma, --max-gamma, the n-gram draft's --ngram-max / --ngram-min, the
// draft's sparse KV view --draft-window / --draft-sinks, its vocabulary subset --draft-vocab, its
// skipped layers --draft-skip, its 4-bit KV view --draft-kv4, --qspec-costs (the planner's step-cost
// table, into `qspec_costs`), and with `adaptive` --adaptive-gamma. `what` prefixes each help
// line ("--mode qspec: ", or serve's "Default QSpec ").
void add_qspec_options(CLI::App* command, DecodePlan& plan, bool adaptive, const std::string& what,
                       std::string& qspec_costs);
// --kv-cache f16|int8 (EngineOptions::kv_cache) of the commands that hold a KV cache: the
// value is checked by parse_kv_cache_format as the flags are read.
void add_kv_cache_option(CLI::App* command, std::string& kv_cache);
// The format --kv-cache names (throws naming the flag on anything else).
KvCacheFormat kv_cache_flag(const std::string& kv_cache);
// Before a model loads: a QSpec plan's draft with --draft-kv4 (`/k4`) needs --kv-cache int8.
void check_plan_kv_cache(const DecodePlan& plan, const std::string& kv_cache);
// Without --seed a sampled run draws a new seed each time (as llama.cpp and vLLM do) and prints
// it on stderr, so the run can be repeated.
void choose_seed(SamplingParams& sampling, bool seed_given);

// The command line as typed (for benchmark records).
void set_command_line(int argc, char** argv);
const std::string& command_line();
// The first line a shell command prints ("" if it fails), and the checkout's short commit.
std::string shell_line(const char* command);
std::string git_commit();

// A one-line progress bar on stderr, shown only when the work takes over a second.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void update(size_t done, size_t total);

 private:
  std::string label_;
  double start_;
  bool terminal_;
  bool shown_ = false;
  int last_percent_ = -1;
};
}  // namespace qspec::cli
