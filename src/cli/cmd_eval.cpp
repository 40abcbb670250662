// qspec eval: GSM8K-style exact match (greedy) and perplexity on the problem text of a model in one or
// more run modes, all from one loaded weight set. Problems are JSON lines with "question"
// and "answer" (the answer ends in "#### N", as GSM8K and the bundled eval_problems.jsonl).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli/commands.h"
#include "model/llama.h"
#include "qspec/error.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

struct EvalArgs {
  std::string model_dir;
  std::string problems_file;
  std::vector<std::string> modes = {"w16a16", "w4a16"};
  std::string weights;
  int64_t group_size = 0;
  int64_t limit = 0;
  int64_t max_tokens = 160;
  std::string out_file;
};

struct Problem {
  std::string question, answer;
};

std::vector<Problem> read_problems(const std::string& path, int64_t limit) {
  std::ifstream file(path);
  QSPEC_CHECK(file.good(), path, ": cannot open problems file");
  std::vector<Problem> problems;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(file, line)) {
    ++line_number;
    if (line.empty()) continue;
    nlohmann::json parsed;
    try {
      parsed = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      fail(path, ":", line_number, ": not JSON: ", error.what());
    }
    QSPEC_CHECK(parsed.is_object() && parsed.contains("question") && parsed["question"].is_string() &&
                    parsed.contains("answer") && parsed["answer"].is_string(),
                path, ":", line_number, ": expected an object with string fields \"question\" and \"answer\"");
    problems.push_back({parsed["question"], parsed["answer"]});
    if (limit > 0 && static_cast<int64_t>(problems.size()) == limit) break;
  }
  QSPEC_CHECK(!problems.empty(), path, ": no problems");
  return problems;
}

std::string final_answer(const std::string& text) {
  static const std::regex pattern("#### *(-?[0-9][0-9,]*)");
  std::smatch match;
  return std::regex_search(text, match, pattern) ? match[1].str() : "";
}

struct ModeResult {
  std::string mode;
  int64_t solved = 0, problems = 0;
  double text_nll = 0.0;  // summed over the problem text's tokens
  int64_t text_tokens = 0;
  double seconds = 0.0;
};

ModeResult evaluate(const LlamaModel& model, const Tokenizer& tokenizer, const RunMode& mode,
                    const std::vector<Problem>& problems, int64_t max_tokens, ProgressBar& progress,
                    size_t& done, size_t total) {
  ModeResult result;
  result.mode = mode.name;
  const auto start = std::chrono::steady_clock::now();
  GenerationOptions options;
  options.max_new_tokens = max_tokens;
  options.eos_ids = tokenizer.eos_ids;
  options.mode = mode;
  std::vector<float> logits;
  for (const Problem& problem : problems) {
    const std::string prompt = "Question: " + problem.question + "\nAnswer:";
    const std::vector<int32_t> prompt_ids = tokenizer.encode(prompt);
    const GenerationResult generated = generate(model, prompt_ids, options);
    const std::string text = tokenizer.decode(generated.ids, /*skip_special=*/true);
    const std::string answer = final_answer(text);
    result.solved += !answer.empty() && answer == final_answer(problem.answer);
    ++result.problems;

    // Perplexity of the whole problem text (question and reference answer) under teacher
    // forcing: every token after the first.
    const std::vector<int32_t> full = tokenizer.encode(prompt + " " + problem.answer);
    const size_t first_scored = 1;
    if (full.size() > first_scored && static_cast<int64_t>(full.size()) <= model.config().max_position_embeddings) {
      KvCache cache = model.new_cache(static_cast<int64_t>(full.size()));
      model.forward(full, cache, logits, /*all_logits=*/true, mode);
      const int64_t vocab = model.config().vocab_size;
      for (size_t position = first_scored; position < full.size(); ++position) {
        const float* row = logits.data() + (position - 1) * vocab;
        double max_logit = row[0];
        for (int64_t v = 1; v < vocab; ++v) max_logit = std::max<double>(max_logit, row[v]);
        double sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max_logit);
        result.text_nll += -(row[full[position]] - max_logit - std::log(sum));
        ++result.text_tokens;
      }
    }
    progress.update(++done, total);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void run_eval(const EvalArgs& args) {
  std::vector<RunMode> modes;
  for (const std::string& name : args.modes) modes.push_back(parse_run_mode(name));
  const std::vector<Problem> problems = read_problems(args.problems_file, args.limit);
  auto model = LlamaModel::load(args.model_dir);
  auto tokenizer = Tokenizer::load(args.model_dir);
  const std::string weights = prepare_model_for_modes(*model, modes, args.weights, args.group_size);

  ProgressBar progress("eval");
  size_t done = 0;
  const size_t total = problems.size() * modes.size();
  std::vector<ModeResult> results;
  for (const RunMode& mode : modes)
    results.push_back(evaluate(*model, *tokenizer, mode, problems, args.max_tokens, progress, done, total));

  std::printf("model %s, %zu problems, greedy, 4-bit weights: %s\n", args.model_dir.c_str(), problems.size(),
              weights.c_str());
  std::printf("%-12s %12s %18s %10s\n", "mode", "exact match", "text perplexity", "seconds");
  nlohmann::json rows = nlohmann::json::array();
  for (const ModeResult& r : results) {
    const double exact = 100.0 * static_cast<double>(r.solved) / static_cast<double>(r.problems);
    const double perplexity = r.text_tokens ? std::exp(r.text_nll / static_cast<double>(r.text_tokens)) : NAN;
    std::printf("%-12s %11.2f%% %18.5f %10.1f\n", r.mode.c_str(), exact, perplexity, r.seconds);
    rows.push_back({{"mode", r.mode}, {"solved", r.solved}, {"problems", r.problems}, {"exact_match", exact / 100.0},
                    {"text_perplexity", perplexity}, {"text_tokens", r.text_tokens}, {"seconds", r.seconds}});
  }
  if (!args.out_file.empty()) {
    const std::filesystem::path out_path(args.out_file);
    if (out_path.has_parent_path()) std::filesystem::create_directories(out_path.parent_path());
    nlohmann::json record = {{"benchmark", "eval_exact_match"},
                             {"model", args.model_dir},
                             {"problems_file", args.problems_file},
                             {"problems", problems.size()},
                             {"weights", weights},
                             {"commit", git_commit()},
                             {"command", command_line()},
                             {"results", rows}};
    std::ofstream out(args.out_file);
    QSPEC_CHECK(out.good(), args.out_file, ": cannot write");
    out << record.dump(2) << "\n";
    std::printf("wrote %s\n", args.out_file.c_str());
  }
}

}  // namespace

void register_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* command = app.add_subcommand("eval", "Exact match and text perplexity on GSM8K-style problems, per mode");
  command->add_option("model", args->model_dir, "Model directory")->required();
  command->add_option("--problems", args->problems_file, "JSON lines with question/answer (default: MODEL/eval_problems.jsonl)");
  command->add_option("--modes", args->modes, "Run modes to compare")->capture_default_str()->delimiter(',');
  command->add_option("--weights", args->weights, "4-bit weight format, RTN at load (default int4; a 4-bit checkpoint uses its own): int4|int4-channel|nvfp4|mxfp4");
  command->add_option("--group-size", args->group_size, "int4 group size (0: auto)")->capture_default_str();
  command->add_option("--limit", args->limit, "Evaluate only the first N problems (0: all)")->capture_default_str();
  command->add_option("-n,--max-tokens", args->max_tokens, "Maximum new tokens per answer")->capture_default_str();
  command->add_option("-o,--out", args->out_file, "Write the results as JSON here");
  command->callback([args] {
    if (args->problems_file.empty()) args->problems_file = args->model_dir + "/eval_problems.jsonl";
    run_eval(*args);
  });
}

}  // namespace qspec::cli
