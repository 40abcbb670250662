// What the qspec subcommands share (cli/commands.h): the progress bar, the command line, the flags of
// the commands that decode (--mode, sampling, QSpec), the seed and commit they record, and preparing a
// model for its modes.
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <unistd.h>

#include "cli/commands.h"
#include "model/llama.h"
#include "ops/sample.h"
#include "runtime/draft_mode.h"
#include "qspec/error.h"

namespace qspec::cli {
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), start_(now_seconds()), terminal_(isatty(STDERR_FILENO) != 0) {}

ProgressBar::~ProgressBar() {
  if (shown_ && terminal_) std::fprintf(stderr, "\n");
}

void ProgressBar::update(size_t done, size_t total) {
  if (total == 0) return;
  const int percent = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
  const double elapsed = now_seconds() - start_;
  if (!shown_ && elapsed < 1.0 && done < total) return;
  if (percent == last_percent_) return;
  // A log file (stderr not a terminal) gets one line per 10%, not a redrawn bar.
  if (!terminal_ && percent / 10 == last_percent_ / 10 && done < total) return;
  last_percent_ = percent;
  shown_ = true;
  const int width = 30, filled = percent * width / 100;
  std::fprintf(stderr, "%s%s [%.*s%*s] %3d%% (%zu/%zu) %.1fs%s", terminal_ ? "\r" : "", label_.c_str(), filled,
               "##############################", width - filled, "", percent, done, total, elapsed,
               terminal_ ? "" : "\n");
  std::fflush(stderr);
}
}  // namespace qspec::cli

namespace qspec::cli {
namespace {
std::string& stored_command_line() {
  static std::string line;
  return line;
}
}  // namespace

void set_command_line(int argc, char** argv) {
  std::string line = "qspec";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const bool needs_quotes = arg.empty() || arg.find_first_of(" \t\"'") != std::string::npos;
    line += needs_quotes ? " '" + arg + "'" : " " + arg;
  }
  stored_command_line() = line;
}

const std::string& command_line() { return stored_command_line(); }
}  // namespace qspec::cli

namespace qspec::cli {
std::string shell_line(const char* command) {
  std::string out;
  if (FILE* pipe = popen(command, "r")) {
    char buffer[256];
    while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
    pclose(pipe);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// QSPEC_COMMIT names the commit where the sources travel without .git (the GPU machine).
void add_model_argument(CLI::App* command, std::string& model_dir) {
  command->add_option("model,-m,--model", model_dir, "Model directory (Hugging Face layout)")->required();
}

void add_mode_option(CLI::App* command, std::string& mode, const std::string& what) {
  std::string modes;
  for (const std::string& name : run_mode_names()) modes += name + "|";
  command->add_option("--mode", mode,
                      what + ": auto (on a 4-bit checkpoint qspec with the planner: plain w4a16 steps but where a "
                             "draft is predicted faster, w4a16's output; on a 16-bit one w16a16)|" + modes +
                          "qspec (verify in w4a16; drafts as --draft says, by default the planner: never predicted "
                          "slower than w4a16)")
      ->capture_default_str();
}

void add_sampling_options(CLI::App* command, SamplingParams& sampling, bool& seed_given) {
  command->add_option("--temperature,--temp", sampling.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  command->add_option("--top-k", sampling.top_k, "Keep the k most likely tokens (0: off)");
  command->add_option("--top-p", sampling.top_p, "Nucleus sampling mass (1: off)");
  command->add_option("--min-p", sampling.min_p, "Drop tokens below min_p x the top probability");
  command->add_option("--repeat-penalty", sampling.repetition_penalty, "Repetition penalty (1: off)");
  command->add_option("--seed", sampling.seed, "Random seed for sampling (default: a new one each run, printed)")
      ->each([&seed_given](const std::string&) { seed_given = true; });
}

void add_qspec_options(CLI::App* command, DecodePlan& plan, bool adaptive, const std::string& what,
                       std::string& qspec_costs) {
  command->add_option("--draft", plan.draft,
                      what + "draft: auto (the planner: each step plain w4a16 or the draft and gamma its measured "
                             "step costs and each sequence's acceptance predict to be faster, see --qspec-costs), "
                             "a mode (w4a8, w4a8-fp8, w4a4-int4, ...), ngram (prompt lookup: the "
                             "continuation of the last n-gram's earlier occurrence, no weights read), or with "
                             "--draft-window / --draft-vocab / --draft-skip the verify's mode w4a16")
      ->capture_default_str();
  command->add_option("--gamma", plan.gamma, what + "draft tokens per cycle (a named draft)")->capture_default_str();
  command->add_option("--max-gamma", plan.max_gamma,
                      what + "the largest gamma --draft auto may pick" +
                          (adaptive ? std::string(", and adaptive gamma's bound") : std::string()))
      ->capture_default_str();
  command->add_option("--qspec-costs", qspec_costs,
                      what + "--draft auto's step costs: a table from `qspec bench --qspec-costs-out`; auto: the one "
                             "in bench/policies (or $QSPEC_GEMM_POLICY_DIR) for this device and model, if any; none: "
                             "no table (n-gram drafts where a sequence's probed acceptance pays, else plain w4a16)")
      ->check(CLI::IsMember({"auto", "none"}) | CLI::ExistingFile)
      ->capture_default_str();
  command->add_option("--ngram-max", plan.ngram_max, "--draft ngram: the longest n-gram matched")->capture_default_str();
  command->add_option("--ngram-min", plan.ngram_min, "--draft ngram: the shortest n-gram matched")->capture_default_str();
  command->add_option("--ngram-corpus", plan.ngram_corpus,
                      "--draft ngram / auto: where a sequence's own text has no match, look up the text of earlier "
                      "requests (on), or its own only (off)")
      ->transform(CLI::IsMember({"on", "off"}))
      ->default_str("on");
  command->add_option("--draft-window", plan.draft_window,
                      what + "draft steps attend to the last N cached positions (and the --draft-sinks first) "
                             "only: a bounded K/V read at long contexts; the verify reads all (0: the whole cache)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--draft-sinks", plan.draft_sinks, "--draft-window: the first positions the draft also sees")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--draft-vocab", plan.draft_vocab,
                      what + "draft steps score only the N most frequent token ids of the model's draft vocabulary "
                             "table (made by `qspec tune-draft`): a smaller lm_head read; the verify scores all "
                             "(0: the whole vocabulary)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--draft-skip", plan.draft_skip,
                      what + "draft steps skip the first N layers of the model's draft skip table (made by `qspec "
                             "tune-draft`): fewer layers read; the verify runs all (0: every layer; CPU only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_flag("--draft-kv4", plan.draft_kv4,
                    what + "draft steps read only the high 4 bits of each code of the 8-bit KV cache (needs "
                           "--kv-cache int8): half its code bytes; the verify reads all 8 bits");
  if (!adaptive) return;
  command->add_flag("--adaptive-gamma", plan.adaptive_gamma, what + "move gamma with the recent acceptance (1..--max-gamma)");
}

void add_kv_cache_option(CLI::App* command, std::string& kv_cache) {
  const CLI::Validator format(
      [](std::string& text) {
        return parse_kv_cache_format(text) ? std::string() : "must be f16 or int8, got '" + text + "'";
      },
      "f16|int8");
  command->add_option("--kv-cache", kv_cache,
                      "What the KV cache stores: f16 (full precision: f32 rows on the CPU, f16 on the GPU) or int8 "
                      "(8-bit codes per position and KV head with an f16 scale, for every mode: ~3.8x the CPU's "
                      "positions in the same memory, ~1.97x the GPU's; needed by --draft-kv4 / /k4 drafts)")
      ->check(format)
      ->capture_default_str();
}

KvCacheFormat kv_cache_flag(const std::string& kv_cache) {
  const std::optional<KvCacheFormat> format = parse_kv_cache_format(kv_cache);
  QSPEC_CHECK(format, "--kv-cache must be f16 or int8, got '", kv_cache, "'");
  return *format;
}

void check_plan_kv_cache(const DecodePlan& plan, const std::string& kv_cache) {
  if (plan.qspec() && !plan.auto_draft() && !plan.ngram_draft())
    check_draft_kv_cache(with_draft_diets(RunMode{}, plan), kv_cache_flag(kv_cache));
}

void choose_seed(SamplingParams& sampling, bool seed_given) {
  if (seed_given || sampling.greedy()) return;
  sampling.seed = Sampler::random_seed();
  std::fprintf(stderr, "[qspec] seed %llu\n", static_cast<unsigned long long>(sampling.seed));
}

std::string git_commit() {
  if (const char* commit = std::getenv("QSPEC_COMMIT"); commit != nullptr && *commit != '\0') return commit;
  return shell_line("git rev-parse --short HEAD 2>/dev/null");
}
}  // namespace qspec::cli

namespace qspec::cli {
std::string prepare_model_for_modes(LlamaModel& model, std::vector<RunMode>& modes, const std::string& weights,
                                    int64_t group_size) {
  bool needs_quantized = false;
  for (const RunMode& mode : modes) needs_quantized |= mode.quantized_weights;
  std::string description = "-";
  if (model.has_quantized_weights()) {
    const QuantizationInfo& info = model.quantization();
    QSPEC_CHECK(weights.empty() || quant::parse_format(weights) == info.format, model.dir(), " holds ",
                model.quantized_format(), " weights; --weights ", weights, " would need the original checkpoint");
    const bool grouped = quant::format_has_groups(info.format);
    QSPEC_CHECK(group_size <= 0 || !grouped || group_size == info.group_size, model.dir(), " holds ",
                quant::format_name(info.format), " weights in groups of ", info.group_size, "; --group-size ",
                group_size, " does not match");
    if (grouped) group_size = info.group_size;
    description = model.quantized_format();
  } else if (needs_quantized) {
    model.quantize_weights(weights.empty() ? quant::kDefaultWeightFormat : quant::parse_format(weights), group_size);
    description = model.quantized_format();
  }
  if (group_size <= 0) {
    try {
      group_size = model.auto_group_size();
    } catch (const Error&) {
      group_size = quant::kDefaultGroupSize;  // only int4 activation modes need it; they will say so
    }
  }
  for (RunMode& mode : modes) mode.activations.group_size = group_size;
  return needs_quantized ? description : "-";
}
}  // namespace qspec::cli
