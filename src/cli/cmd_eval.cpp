// qspec eval: accuracy and perplexity of a model in one or more run modes, all from one
// loaded weight set.
//   qspec eval gsm MODEL [FILE]   GSM8K-style problems (JSON lines with "question" and
//                                 "answer", the answer ending in "#### N"): greedy answers,
//                                 strict and flexible exact match, text perplexity.
//   qspec eval ppl MODEL          sliding-window perplexity of a text (default WikiText-2 test).
//   qspec eval qspec MODEL [FILE] QSpec acceptance per draft mode and gamma (greedy, verify
//                                 w4a16), with/without KV overwrite, tokens/s against plain
//                                 w4a16 and whether every output equals w4a16's.
//   qspec eval MODEL              = qspec eval gsm MODEL (the original form).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli/commands.h"
#include "quant/formats.h"
#include "model/llama.h"
#include "qspec/engine.h"
#include "qspec/error.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"
#include "runtime/qspec.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

namespace fs = std::filesystem;

// ---- arguments ----

struct CommonArgs {
  std::string model_dir;
  std::vector<std::string> modes = {std::string(decode_rules::kAutoMode)};
  std::string weights;  // "" = int4, or a 4-bit checkpoint's own
  int64_t group_size = 0;
  int64_t limit = 0;
  std::string out_file;
  std::string kv_cache = "f16";  // --kv-cache: every mode's cache
};

struct GsmArgs : CommonArgs {
  std::string problems_file;
  int64_t max_tokens = 160;
  int64_t few_shot = 0;
  std::string shots_file;
  bool chat = false;  // prompt = the model's chat template over one user message (the question)
};

struct PplArgs : CommonArgs {
  std::string data_file;
  int64_t context = 0;
  int64_t stride = 0;
  int64_t max_windows = 0;
};

void add_common_options(CLI::App* command, CommonArgs& args, const char* limit_help) {
  command->add_option("--modes", args.modes,
                      "Run modes to compare (auto: w16a16,w4a16 on a 16-bit checkpoint, w4a16 on a 4-bit one)")
      ->capture_default_str()
      ->delimiter(',');
  command->add_option("--weights", args.weights,
                      "4-bit weight format, RTN at load (default int4; a qspec 4-bit checkpoint uses its own): " +
                          quant::weight_format_names());
  command->add_option("--group-size", args.group_size, "int4 group size (0: auto)")->capture_default_str();
  command->add_option("--limit", args.limit, limit_help)->capture_default_str();
  command->add_option("-o,--out", args.out_file, "Write the results as JSON here");
  add_kv_cache_option(command, args.kv_cache);
}

// ---- the model, once for every mode ----

struct PreparedModel {
  std::unique_ptr<LlamaModel> model;
  std::vector<RunMode> modes;
  int64_t group_size = 0;
  std::string weights;  // "int4 g64 rtn", or "-" when no mode uses 4-bit weights
};

// Parses the mode names (before any loading, so a typo fails fast), loads MODEL and makes it
// ready for every mode (cli/commands.h: prepare_model_for_modes).
PreparedModel load_model_for_modes(const std::string& model_dir, const std::vector<std::string>& mode_names,
                                   const std::string& weights, int64_t group_size) {
  PreparedModel prepared;
  QSPEC_CHECK(!mode_names.empty(), "--modes: no run mode given");
  for (const std::string& name : mode_names)
    QSPEC_CHECK(name != decode_rules::kQSpecMode, "--modes qspec: QSpec's greedy output is W4A16's token for token, so "
                "its accuracy is the w4a16 row; `qspec eval qspec MODEL` measures its acceptance and speed");
  const bool has_auto = std::find(mode_names.begin(), mode_names.end(), decode_rules::kAutoMode) != mode_names.end();
  for (const std::string& name : mode_names)
    if (name != decode_rules::kAutoMode) prepared.modes.push_back(parse_run_mode(name));
  if (!weights.empty()) quant::parse_format(weights);
  prepared.model = LlamaModel::load(model_dir);
  if (has_auto) {  // "auto": w16a16 and w4a16 on a 16-bit checkpoint, w4a16 on a 4-bit one
    std::vector<RunMode> modes;
    for (const std::string& name : mode_names) {
      if (name != decode_rules::kAutoMode) {
        modes.push_back(parse_run_mode(name));
        continue;
      }
      if (!prepared.model->has_quantized_weights()) modes.push_back(parse_run_mode("w16a16"));
      modes.push_back(parse_run_mode("w4a16"));
    }
    prepared.modes = modes;
  }
  prepared.weights = prepare_model_for_modes(*prepared.model, prepared.modes, weights, group_size);
  prepared.group_size = prepared.modes.front().activations.group_size;
  return prepared;
}

// ---- input files ----

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t invalid_utf8_offset(const std::string& text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  for (size_t i = 0; i < size;) {
    const unsigned char lead = bytes[i];
    size_t length = 0;
    uint32_t minimum = 0;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xE0) == 0xC0) {
      length = 2, minimum = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, minimum = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, minimum = 0x10000;
    } else {
      return i;
    }
    if (i + length > size) return i;
    uint32_t code = lead & (0x7F >> length);
    for (size_t k = 1; k < length; ++k) {
      if ((bytes[i + k] & 0xC0) != 0x80) return i;
      code = (code << 6) | (bytes[i + k] & 0x3F);
    }
    if (code < minimum || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += length;
  }
  return std::string::npos;
}

// The whole file as text: it must exist, be non-empty and be UTF-8 without NUL bytes.
std::string read_text_file(const std::string& path, const char* what) {
  std::error_code error;
  QSPEC_CHECK(fs::exists(path, error), path, ": no such ", what);
  QSPEC_CHECK(!fs::is_directory(path, error), path, ": is a directory, expected a ", what);
  std::ifstream file(path, std::ios::binary);
  QSPEC_CHECK(file.good(), path, ": cannot open ", what);
  std::stringstream buffer;
  buffer << file.rdbuf();
  std::string text = buffer.str();
  QSPEC_CHECK(!text.empty(), path, ": empty ", what);
  const size_t nul = text.find('\0');
  QSPEC_CHECK(nul == std::string::npos, path, ": binary data (a NUL byte at offset ", nul, "), expected UTF-8 text");
  const size_t bad = invalid_utf8_offset(text);
  QSPEC_CHECK(bad == std::string::npos, path, ": not UTF-8 text (an invalid byte sequence at offset ", bad, ")");
  return text;
}

struct Problem {
  std::string question, answer;
};

// JSON lines with string fields "question" and "answer"; blank lines are skipped. limit > 0
// keeps the first `limit` problems.
std::vector<Problem> read_problems(const std::string& path, int64_t limit, const char* what = "problems file") {
  const std::string text = read_text_file(path, what);
  std::istringstream lines(text);
  std::vector<Problem> problems;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
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

// Writes an eval's JSON report: `fields` plus what every report names first (the benchmark,
// the commit and command line that made it, the model directory).
void write_report(const std::string& out_file, const char* benchmark, const std::string& model,
                  const nlohmann::json& fields) {
  nlohmann::json record = {
      {"benchmark", benchmark}, {"commit", git_commit()}, {"command", command_line()}, {"model", model}};
  record.update(fields);
  const fs::path out_path(out_file);
  if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path());
  std::ofstream out(out_file);
  QSPEC_CHECK(out.good(), out_file, ": cannot write");
  out << record.dump(2) << "\n";
  std::printf("wrote %s\n", out_file.c_str());
}

// The fields of a report on greedy answers to a problems file (eval gsm, eval qspec): the
// problems, and the parameters both runs have; `parameters` brings the run's own.
nlohmann::json problems_report(const std::string& problems_file, size_t problems, int64_t max_tokens, int64_t limit,
                               const std::string& weights, int64_t group_size, nlohmann::json parameters) {
  parameters.update({{"max_tokens", max_tokens},
                     {"limit", limit},
                     {"decoding", "greedy"},
                     {"weights", weights},
                     {"group_size", group_size}});
  return {{"problems_file", problems_file}, {"problems", problems}, {"parameters", std::move(parameters)}};
}

// ---- eval gsm ----

// A number as GSM8K writes it, normalized: no "$" or thousands commas, no trailing "." or
// fractional zeros ("1,000.50" -> "1000.5", "18." -> "18").
std::string normalize_number(std::string number) {
  std::erase_if(number, [](char c) { return c == ',' || c == '$'; });
  if (number.find('.') != std::string::npos) {
    while (!number.empty() && number.back() == '0') number.pop_back();
  }
  while (!number.empty() && number.back() == '.') number.pop_back();
  if (number == "-0") number = "0";
  return number;
}

// Strict: the number after "#### " (the GSM8K answer format); "" if none.
std::string strict_answer(const std::string& text) {
  static const std::regex pattern("#### *(-?\\$?[0-9][0-9.,]*)");
  std::smatch match;
  return std::regex_search(text, match, pattern) ? normalize_number(match[1].str()) : "";
}

// Flexible: the last number anywhere in the text; "" if none.
std::string flexible_answer(const std::string& text) {
  static const std::regex pattern("-?\\$?[0-9][0-9,]*(\\.[0-9]+)?");
  std::string last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern); it != std::sregex_iterator(); ++it)
    last = it->str();
  return last.empty() ? "" : normalize_number(last);
}

const std::string kStop = "\nQuestion:";

std::string format_problem(const Problem& problem) { return "Question: " + problem.question + "\nAnswer:"; }

// A problem's prompt tokens: the model's chat template over one user message (the question; the
// template writes any start token itself), or `prefix` (few-shot examples) and "Question: ...
// Answer:" after the tokenizer's default start token. eval gsm and eval qspec prompt alike.
std::vector<int32_t> problem_prompt(const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                                    const std::string& prefix, const Problem& problem) {
  if (chat_template != nullptr)
    return tokenizer.encode(chat_template->render({{"user", problem.question}}, /*add_generation_prompt=*/true), false);
  return tokenizer.encode(prefix + format_problem(problem), tokenizer.add_bos_by_default);
}

struct GsmResult {
  std::string mode;
  int64_t strict = 0, flexible = 0, problems = 0;
  int64_t generated_tokens = 0;
  double text_nll = 0.0;  // summed over the problem text's tokens
  int64_t text_tokens = 0;
  double seconds = 0.0;
};

// chat_template: prompt with it (one user message, the question) instead of "Question: ...
// Answer:" after the shots; the answer is then the model's free text up to its end of turn, which
// the flexible match (the last number) scores. The text perplexity stays on the plain format.
GsmResult evaluate_gsm(const LlamaModel& model, const Tokenizer& tokenizer, const RunMode& mode,
                       KvCacheFormat kv_cache, const std::vector<Problem>& problems, const std::string& shots_prefix,
                       const ChatTemplate* chat_template, int64_t max_tokens, ProgressBar& progress, size_t& done,
                       size_t total) {
  GsmResult result;
  result.mode = mode.name;
  const auto start = std::chrono::steady_clock::now();
  GenerationOptions options;
  options.max_new_tokens = max_tokens;
  options.eos_ids = tokenizer.eos_ids;
  options.mode = mode;
  options.kv_cache = kv_cache;
  const int64_t model_context = model.config().max_position_embeddings;
  for (const Problem& problem : problems) {
    const std::vector<int32_t> prompt_ids = problem_prompt(tokenizer, chat_template, shots_prefix, problem);
    QSPEC_CHECK(static_cast<int64_t>(prompt_ids.size()) < model_context, "eval gsm: a prompt of ", prompt_ids.size(),
                " tokens does not fit the model's context of ", model_context, " (fewer --few-shot examples?)");
    // Greedy until EOS, max_tokens, or the model starts the next "Question:".
    std::vector<int32_t> ids;
    const GenerationResult generated = generate(model, prompt_ids, options, [&](int32_t id) {
      ids.push_back(id);
      return tokenizer.decode(ids, /*skip_special=*/true).find(kStop) == std::string::npos;
    });
    result.generated_tokens += static_cast<int64_t>(generated.ids.size());
    std::string text = tokenizer.decode(generated.ids, /*skip_special=*/true);
    if (const size_t stop = text.find(kStop); stop != std::string::npos) text.resize(stop);
    const std::string reference = strict_answer(problem.answer);
    const std::string strict = strict_answer(text), flexible = flexible_answer(text);
    result.strict += !strict.empty() && strict == reference;
    result.flexible += !flexible.empty() && flexible == reference;
    ++result.problems;

    // Perplexity of the whole problem text (zero-shot question and reference answer) under
    // teacher forcing: every token after the first, in one window.
    const std::vector<int32_t> full =
        tokenizer.encode(format_problem(problem) + " " + problem.answer, tokenizer.add_bos_by_default);
    const int64_t n = static_cast<int64_t>(full.size());
    if (n >= 2 && n <= model_context) {
      PerplexityOptions ppl;
      ppl.context = n;
      ppl.stride = n - 1;
      ppl.mode = mode;
      ppl.kv_cache = kv_cache;
      const PerplexityResult scored = sliding_window_perplexity(model, full, ppl);
      result.text_nll += scored.nll_sum;
      result.text_tokens += scored.tokens;
    }
    progress.update(++done, total);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void run_gsm(const GsmArgs& args) {
  QSPEC_CHECK(args.limit >= 0, "--limit must be >= 0");
  QSPEC_CHECK(args.max_tokens > 0, "--max-tokens must be > 0");
  QSPEC_CHECK(args.few_shot >= 0, "--few-shot must be >= 0");
  QSPEC_CHECK(args.few_shot == 0 || !args.shots_file.empty(),
              "--few-shot ", args.few_shot, " needs --shots FILE (worked examples, e.g. GSM8K train JSON lines)");
  QSPEC_CHECK(!(args.chat && args.few_shot > 0), "--chat prompts with the question alone: no --few-shot");
  const std::vector<Problem> problems = read_problems(args.problems_file, args.limit);
  std::optional<ChatTemplate> chat_template;
  if (args.chat) chat_template = load_chat_template(args.model_dir);
  std::string shots_prefix;
  if (args.few_shot > 0) {
    const std::vector<Problem> shots = read_problems(args.shots_file, args.few_shot, "shots file");
    QSPEC_CHECK(static_cast<int64_t>(shots.size()) == args.few_shot, args.shots_file, ": ", shots.size(),
                " problems, fewer than --few-shot ", args.few_shot);
    for (const Problem& shot : shots) shots_prefix += format_problem(shot) + " " + shot.answer + "\n\n";
  }
  PreparedModel prepared = load_model_for_modes(args.model_dir, args.modes, args.weights, args.group_size);
  auto tokenizer = Tokenizer::load(args.model_dir);
  tokenizer->check_model_vocab(prepared.model->config().vocab_size, args.model_dir);

  ProgressBar progress("eval gsm");
  size_t done = 0;
  const size_t total = problems.size() * prepared.modes.size();
  std::vector<GsmResult> results;
  for (const RunMode& mode : prepared.modes)
    results.push_back(evaluate_gsm(*prepared.model, *tokenizer, mode, kv_cache_flag(args.kv_cache), problems,
                                   shots_prefix, chat_template ? &*chat_template : nullptr, args.max_tokens, progress,
                                   done, total));

  std::printf("model %s, %s: %zu problems, %lld-shot%s, greedy, 4-bit weights: %s, KV cache %s\n",
              args.model_dir.c_str(), args.problems_file.c_str(), problems.size(),
              static_cast<long long>(args.few_shot), args.chat ? ", chat template" : "", prepared.weights.c_str(),
              args.kv_cache.c_str());
  std::printf("%-12s %12s %12s %18s %10s\n", "mode", "strict", "flexible", "text perplexity", "seconds");
  nlohmann::json rows = nlohmann::json::array();
  for (const GsmResult& r : results) {
    const double problems_count = static_cast<double>(r.problems);
    const double strict = static_cast<double>(r.strict) / problems_count;
    const double flexible = static_cast<double>(r.flexible) / problems_count;
    const double perplexity = r.text_tokens ? std::exp(r.text_nll / static_cast<double>(r.text_tokens)) : NAN;
    std::printf("%-12s %11.2f%% %11.2f%% %18.5f %10.1f\n", r.mode.c_str(), 100 * strict, 100 * flexible, perplexity,
                r.seconds);
    rows.push_back({{"mode", r.mode},
                    {"problems", r.problems},
                    {"solved", r.strict},
                    {"exact_match", strict},
                    {"solved_flexible", r.flexible},
                    {"flexible_match", flexible},
                    {"generated_tokens", r.generated_tokens},
                    {"text_perplexity", perplexity},
                    {"text_tokens", r.text_tokens},
                    {"seconds", r.seconds}});
  }
  if (args.out_file.empty()) return;
  nlohmann::json report =
      problems_report(args.problems_file, problems.size(), args.max_tokens, args.limit, prepared.weights,
                      prepared.group_size,
                      {{"few_shot", args.few_shot},
                       {"shots_file", args.shots_file},
                       {"prompt", args.chat ? "chat template, user: {question}" : "Question: {question}\\nAnswer:"},
                       {"stop", {"\\nQuestion:", "eos"}},
                       {"kv_cache", args.kv_cache}});
  report["results"] = rows;
  write_report(args.out_file, "eval_gsm", args.model_dir, report);
}

void add_gsm_options(CLI::App* command, GsmArgs& args) {
  add_common_options(command, args, "Evaluate only the first N problems (0: all)");
  command->add_option("--problems", args.problems_file, "The problems file (as FILE of eval gsm)");
  command->add_option("-n,--max-tokens", args.max_tokens, "Maximum new tokens per answer")->capture_default_str();
  command->add_option("--few-shot", args.few_shot, "Worked examples before each question (needs --shots)")
      ->capture_default_str();
  command->add_option("--shots", args.shots_file, "JSON lines whose first N problems are the --few-shot examples");
  command->add_flag("--chat", args.chat,
                    "Prompt with the model's chat template (one user message: the question); score the flexible match");
}

// ---- eval ppl ----

std::string default_ppl_data() {
  const std::string relative = "data/wikitext-2/wiki.test.raw";
  const std::string in_repository = std::string(QSPEC_SOURCE_DIR) + "/" + relative;
  std::error_code error;
  if (fs::exists(in_repository, error) || !fs::exists(relative, error)) return in_repository;
  return relative;
}

void run_ppl(const PplArgs& args) {
  QSPEC_CHECK(args.limit >= 0, "--limit must be >= 0");
  QSPEC_CHECK(args.context >= 0 && args.stride >= 0 && args.max_windows >= 0,
              "--context, --stride and --max-windows must be >= 0");
  const std::string text = read_text_file(args.data_file, "data file");
  PreparedModel prepared = load_model_for_modes(args.model_dir, args.modes, args.weights, args.group_size);
  auto tokenizer = Tokenizer::load(args.model_dir);
  tokenizer->check_model_vocab(prepared.model->config().vocab_size, args.model_dir);
  const auto tokenize_start = std::chrono::steady_clock::now();
  std::vector<int32_t> tokens = tokenizer->encode(text, tokenizer->add_bos_by_default);
  const double tokenize_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - tokenize_start).count();
  const size_t file_tokens = tokens.size();
  if (args.limit > 0 && static_cast<int64_t>(tokens.size()) > args.limit) tokens.resize(static_cast<size_t>(args.limit));
  QSPEC_CHECK(tokens.size() >= 2, args.data_file, ": ", tokens.size(), " token", tokens.size() == 1 ? "" : "s",
              " after tokenizing; perplexity needs at least 2");

  PerplexityOptions options;
  const int64_t model_context = prepared.model->config().max_position_embeddings;
  options.context = args.context > 0 ? args.context : std::min<int64_t>(2048, model_context);
  options.stride = args.stride > 0 ? args.stride : options.context / 2;
  options.max_windows = args.max_windows;
  options.kv_cache = kv_cache_flag(args.kv_cache);
  const int64_t total_windows =
      perplexity_window_count(static_cast<int64_t>(tokens.size()), options.context, std::max<int64_t>(options.stride, 1));
  const int64_t windows_per_mode = args.max_windows > 0 ? std::min(args.max_windows, total_windows) : total_windows;

  ProgressBar progress("eval ppl");
  const size_t total = static_cast<size_t>(windows_per_mode) * prepared.modes.size();
  size_t done_before = 0;
  std::vector<std::pair<std::string, PerplexityResult>> results;
  for (const RunMode& mode : prepared.modes) {
    options.mode = mode;
    options.on_window = [&](int64_t done, int64_t) { progress.update(done_before + static_cast<size_t>(done), total); };
    results.emplace_back(mode.name, sliding_window_perplexity(*prepared.model, tokens, options));
    done_before += static_cast<size_t>(results.back().second.windows);
  }

  const PerplexityResult& first = results.front().second;
  std::printf("model %s, %s: %zu tokens (%.1fs to tokenize), context %lld, stride %lld, %lld of %lld windows, "
              "4-bit weights: %s, KV cache %s\n",
              args.model_dir.c_str(), args.data_file.c_str(), tokens.size(), tokenize_seconds,
              static_cast<long long>(first.context), static_cast<long long>(first.stride),
              static_cast<long long>(first.windows), static_cast<long long>(first.total_windows),
              prepared.weights.c_str(), args.kv_cache.c_str());
  std::printf("%-12s %12s %10s %8s %10s %10s\n", "mode", "perplexity", "tokens", "windows", "seconds", "tokens/s");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [mode, r] : results) {
    const double tokens_per_second = r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0;
    std::printf("%-12s %12.4f %10lld %8lld %10.1f %10.1f\n", mode.c_str(), r.perplexity,
                static_cast<long long>(r.tokens), static_cast<long long>(r.windows), r.seconds, tokens_per_second);
    rows.push_back({{"mode", mode},
                    {"perplexity", r.perplexity},
                    {"nll_sum", r.nll_sum},
                    {"tokens_scored", r.tokens},
                    {"windows", r.windows},
                    {"seconds", r.seconds},
                    {"scored_tokens_per_second", tokens_per_second}});
  }
  if (!args.out_file.empty())
    write_report(args.out_file, "eval_ppl", args.model_dir,
                 {{"data_file", args.data_file},
                  {"data_tokens", file_tokens},
                  {"parameters",
                   {{"method", "sliding window (each token scored once)"},
                    {"context", first.context},
                    {"stride", first.stride},
                    {"max_windows", args.max_windows},
                    {"windows_total", first.total_windows},
                    {"limit", args.limit},
                    {"tokens", tokens.size()},
                    {"bos", tokenizer->add_bos_by_default},
                    {"weights", prepared.weights},
                    {"group_size", prepared.group_size},
                    {"kv_cache", args.kv_cache}}},
                  {"results", rows}});
}


// ---- eval qspec ----
// Every configuration runs all problems through the continuous-batching engine with
// staggered arrivals (one or two new requests a step), and every output is compared with
// plain greedy W4A16 decoding of the same problem. A difference is reported as an exact
// logit tie when the W4A16 logits at the first differing position hold the two tokens at
// exactly the same value; anything else is a mismatch (and a bug).

struct QSpecEvalArgs {
  std::string model_dir;
  std::string problems_file;
  std::vector<std::string> drafts = {"w4a8", "w4a8-fp8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4"};
  std::vector<int64_t> gammas = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> batch_sizes = {16};
  std::string kv_overwrite;  // "": both on the CPU, on on the GPU (the ablation needs host K/V rows)
  std::string device = "cpu";
  std::string weights;
  int64_t group_size = 0;
  int64_t limit = 100;
  int64_t max_tokens = 160;
  std::string out_file;
  bool chat = false;  // prompt = the model's chat template over one user message
  std::string reference_file;       // load the W4A16 reference outputs instead of running them
  std::string save_reference_file;  // write the W4A16 reference outputs here
  std::string qspec_costs = "auto";  // --drafts auto: the planner's step-cost table
  std::string kv_cache = "f16";      // --kv-cache: the engine's cache, W4A16's reference runs included
};

struct EngineRun {
  std::vector<std::vector<int32_t>> outputs;
  QSpecMetrics qspec;
  double seconds = 0;
  int64_t tokens = 0;
  int64_t steps = 0;
  // Each request's decode (its first token to its last: prefill and queueing left out), summed:
  // decode_tokens / decode_seconds is the per-sequence decode speed, what speculation speeds up
  // (at batch 1 llama-bench's tg; at larger batches the sequences' windows overlap).
  double decode_seconds = 0;
  int64_t decode_tokens = 0;
  double decode_tokens_per_second() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0; }
};

EngineRun run_through_engine(const LlamaModel& model, const Tokenizer& tokenizer,
                             const std::vector<std::vector<int32_t>>& prompts, const Request& base, int64_t batch,
                             const std::string& device, const std::string& kv_cache,
                             const std::function<void()>& on_done, const std::string& qspec_costs = "") {
  EngineOptions options;
  options.max_batch_size = batch;
  options.device = device;
  options.qspec_costs = qspec_costs;
  options.kv_cache = kv_cache;
  Engine engine(model, &tokenizer, options);
  EngineRun run;
  run.outputs.resize(prompts.size());
  std::map<RequestId, size_t> index;
  auto callback = [&](const TokenEvent& event) {
    auto& out = run.outputs[index.at(event.id)];
    out.insert(out.end(), event.tokens.begin(), event.tokens.end());
    if (event.finished) {
      if (event.finish_reason == "error") fail("eval qspec: request failed: ", event.error);
      if (event.metrics) {
        run.qspec.add(event.metrics->qspec);
        if (event.metrics->generated_tokens > 1) {
          run.decode_seconds += event.metrics->total_seconds - event.metrics->time_to_first_token;
          run.decode_tokens += event.metrics->generated_tokens - 1;
        }
      }
      on_done();
    }
  };
  const auto start = std::chrono::steady_clock::now();
  size_t next = 0;
  for (int64_t step = 0; next < prompts.size() || engine.metrics().running + engine.metrics().waiting > 0; ++step) {
    for (int arrivals = 1 + static_cast<int>(step % 2); arrivals > 0 && next < prompts.size(); --arrivals, ++next) {
      Request request = base;
      request.prompt = prompts[next];
      index[engine.submit(std::move(request), callback)] = next;
    }
    engine.step();
  }
  engine.run_until_idle();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.steps = engine.metrics().steps;
  for (const auto& out : run.outputs) run.tokens += static_cast<int64_t>(out.size());
  return run;
}

// "identical", "tie" (the W4A16 logits of the two tokens at the first difference are exactly
// equal) or "mismatch".
std::string compare_with_reference(const LlamaModel& model, const RunMode& verify, KvCacheFormat kv_cache,
                                   const std::vector<int32_t>& prompt, const std::vector<int32_t>& got,
                                   const std::vector<int32_t>& want) {
  if (got == want) return "identical";
  size_t first = 0;
  while (first < got.size() && first < want.size() && got[first] == want[first]) ++first;
  if (first == got.size() || first == want.size()) return "mismatch";  // one stopped early
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), want.begin(), want.begin() + static_cast<long>(first));
  KvCache cache = model.new_cache(static_cast<int64_t>(context.size()), kv_cache);
  std::vector<float> logits;
  model.forward(context, cache, logits, false, verify);
  return logits[static_cast<size_t>(got[first])] == logits[static_cast<size_t>(want[first])] ? "tie" : "mismatch";
}

// A reference file pins what it was made from (prompt ids, max tokens), so a shard cannot
// compare against outputs of other problems or another length budget.
void save_reference(const std::string& path, const QSpecEvalArgs& args,
                    const std::vector<std::vector<int32_t>>& prompts,
                    const std::vector<std::vector<int32_t>>& outputs) {
  write_report(path, "eval_qspec_reference", args.model_dir,
               {{"max_tokens", args.max_tokens},
                {"prompts", prompts},
                {"outputs", outputs}});
}

std::vector<std::vector<int32_t>> load_reference(const std::string& path, const QSpecEvalArgs& args,
                                                 const std::vector<std::vector<int32_t>>& prompts) {
  std::ifstream file(path);
  QSPEC_CHECK(file.good(), path, ": cannot open the reference file");
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(file);
    QSPEC_CHECK(data.at("max_tokens").get<int64_t>() == args.max_tokens, path, ": made with max_tokens ",
                data.at("max_tokens").get<int64_t>(), ", this run uses ", args.max_tokens);
    QSPEC_CHECK(data.at("prompts").get<std::vector<std::vector<int32_t>>>() == prompts, path,
                ": its prompts are not this run's problems (file, --limit, --chat or tokenizer differ)");
    return data.at("outputs").get<std::vector<std::vector<int32_t>>>();
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": not a reference file of eval qspec --save-reference: ", error.what());
  }
}

void run_qspec_eval(QSpecEvalArgs args) {
  QSPEC_CHECK(args.limit >= 0, "--limit must be >= 0");
  QSPEC_CHECK(args.max_tokens > 0, "--max-tokens must be > 0");
  for (int64_t gamma : args.gammas)
    QSPEC_CHECK(gamma >= 1 && gamma <= decode_rules::kMaxGamma, "--gammas: gamma must be in 1..", decode_rules::kMaxGamma,
                ", got ", gamma);
  for (int64_t batch : args.batch_sizes) QSPEC_CHECK(batch >= 1, "--batch-sizes: must be >= 1, got ", batch);
  QSPEC_CHECK(args.device == "cpu" || args.device == "cuda", "--device must be cpu or cuda, got ", args.device);
  if (args.kv_overwrite.empty()) args.kv_overwrite = args.device == "cpu" ? "both" : "on";
  QSPEC_CHECK(args.kv_overwrite == "on" || args.kv_overwrite == "off" || args.kv_overwrite == "both",
              "--kv-overwrite must be on, off or both, got ", args.kv_overwrite);
  QSPEC_CHECK(args.device == "cpu" || args.kv_overwrite == "on",
              "--kv-overwrite ", args.kv_overwrite, ": the no-overwrite ablation runs on the CPU only (device cuda keeps "
              "the K/V rows on the GPU)");
  const std::vector<Problem> problems = read_problems(args.problems_file, args.limit);
  std::vector<std::string> names = {std::string(decode_rules::kVerifyMode)};  // the modes to prepare
  for (const std::string& draft : args.drafts) {
    DecodePlan plan;
    try {
      set_draft_spec(plan, draft);  // "MODE" or "MODE@WINDOW[+SINKS]", optionally "/vN"
    } catch (const DecodePlanError& e) {
      fail("--drafts: ", e.what());
    }
    plan.mode = decode_rules::kQSpecMode;
    try {
      check_plan_kv_cache(plan, args.kv_cache);  // a /k4 draft needs --kv-cache int8: before any run
    } catch (const Error& e) {
      fail("--drafts ", draft, ": ", e.what());
    }
    // n-gram drafts run no mode, nor does the planner (its drafts are its table's, checked by the
    // engine); the verify's mode (a sparse-view draft) is prepared already
    if (plan.draft != decode_rules::kNgramDraft && plan.draft != decode_rules::kAutoDraft &&
        std::find(names.begin(), names.end(), plan.draft) == names.end())
      names.push_back(plan.draft);
  }
  PreparedModel prepared = load_model_for_modes(args.model_dir, names, args.weights, args.group_size);
  for (size_t i = 1; i < prepared.modes.size(); ++i)
    QSPEC_CHECK(prepared.modes[i].quantized_weights, "--drafts ", prepared.modes[i].name,
                ": a draft mode must run the 4-bit weights");
  auto tokenizer = Tokenizer::load(args.model_dir);
  const LlamaModel& model = *prepared.model;
  tokenizer->check_model_vocab(model.config().vocab_size, args.model_dir);
  std::vector<bool> overwrites;
  if (args.kv_overwrite != "off") overwrites.push_back(true);
  if (args.kv_overwrite != "on") overwrites.push_back(false);

  std::vector<std::vector<int32_t>> prompts;
  std::optional<ChatTemplate> chat_template;
  if (args.chat) chat_template = load_chat_template(args.model_dir);
  for (const Problem& problem : problems)
    prompts.push_back(problem_prompt(*tokenizer, chat_template ? &*chat_template : nullptr, "", problem));

  const size_t runs = args.batch_sizes.size() * ((args.reference_file.empty() ? 1 : 0) +
                                                 args.drafts.size() * args.gammas.size() * overwrites.size());
  const size_t total = problems.size() * runs;
  ProgressBar progress("eval qspec");
  size_t done = 0;
  auto tick = [&] { progress.update(++done, total); };

  Request base;
  base.max_new_tokens = args.max_tokens;
  nlohmann::json rows = nlohmann::json::array(), baselines = nlohmann::json::array();
  std::vector<std::string> lines;
  std::vector<std::vector<int32_t>> references;
  int64_t mismatches = 0, ties = 0;
  for (int64_t batch : args.batch_sizes) {
    // Plain W4A16 through the engine: the reference outputs (first batch size; the others
    // are checked against it) and the baseline speed. A saved reference skips these runs:
    // grid shards (tools/qspec_grid.py) share one.
    if (references.empty() && !args.reference_file.empty()) {
      references = load_reference(args.reference_file, args, prompts);
    }
    if (args.reference_file.empty()) {
      Request plain = base;
      plain.plan.mode = prepared.modes[0].name;
      const EngineRun baseline =
          run_through_engine(model, *tokenizer, prompts, plain, batch, args.device, args.kv_cache, tick);
      int64_t baseline_differs = 0;
      if (references.empty()) references = baseline.outputs;
      for (size_t i = 0; i < prompts.size(); ++i) baseline_differs += baseline.outputs[i] != references[i];
      mismatches += baseline_differs;
      baselines.push_back({{"batch_size", batch},
                           {"generated_tokens", baseline.tokens},
                           {"seconds", baseline.seconds},
                           {"tokens_per_second", baseline.tokens / std::max(baseline.seconds, 1e-9)},
                           {"decode_tokens_per_second", baseline.decode_tokens_per_second()},
                           {"differs_from_first_batch_size", baseline_differs}});
      if (!args.save_reference_file.empty() && baselines.size() == 1)
        save_reference(args.save_reference_file, args, prompts, references);
    }
    for (const std::string& draft : args.drafts)
      for (int64_t gamma : args.gammas)
        for (bool overwrite : overwrites) {
          // The n-gram draft has no draft rows to keep, a skipping draft none in the layers it
          // skips; the planner picks its own gamma (up to the largest of --gammas: one run).
          const bool planner = draft == decode_rules::kAutoDraft;
          DecodePlan spelled;
          set_draft_spec(spelled, draft);
          if ((!overwrite && (draft == decode_rules::kNgramDraft || planner || spelled.draft_skip > 0)) ||
              (planner && gamma != *std::max_element(args.gammas.begin(), args.gammas.end()))) {
            for (size_t i = 0; i < prompts.size(); ++i) tick();
            continue;
          }
          Request request = base;
          DecodePlan& plan = request.plan;
          plan.mode = decode_rules::kQSpecMode;
          plan.verify = prepared.modes[0].name;
          set_draft_spec(plan, draft);
          plan.gamma = gamma;
          if (planner) plan.max_gamma = gamma;
          plan.kv_overwrite = overwrite;
          validate(plan, "eval qspec: ");
          const EngineRun run = run_through_engine(model, *tokenizer, prompts, request, batch, args.device,
                                                   args.kv_cache, tick, args.qspec_costs);
          int64_t identical = 0, tie = 0, mismatch = 0;
          for (size_t i = 0; i < prompts.size(); ++i) {
            const std::string verdict =
                compare_with_reference(model, prepared.modes[0], kv_cache_flag(args.kv_cache), prompts[i],
                                       run.outputs[i], references[i]);
            identical += verdict == "identical", tie += verdict == "tie", mismatch += verdict == "mismatch";
          }
          if (overwrite) mismatches += mismatch, ties += tie;  // no-overwrite may legitimately differ
          const QSpecMetrics& sum = run.qspec;
          const double rate = run.tokens / std::max(run.seconds, 1e-9);
          char line[256];
          std::snprintf(line, sizeof line, "%5lld %-12s %5lld %9s %10.1f%% %12.2f %10.1f %10.1f %9lld/%zu %4lld %8lld",
                        static_cast<long long>(batch), draft_spec(plan).c_str(), static_cast<long long>(gamma),
                        overwrite ? "on" : "off", 100 * sum.acceptance_rate(), sum.mean_accepted_length(), rate,
                        run.decode_tokens_per_second(), static_cast<long long>(identical), prompts.size(),
                        static_cast<long long>(tie), static_cast<long long>(mismatch));
          lines.push_back(line);
          nlohmann::json row = qspec_counters_json(sum);
          row.update({{"batch_size", batch},
                      {"draft", draft_spec(plan)},
                      {"verify", plan.verify},
                      {"gamma", gamma},
                      {"kv_overwrite", overwrite},
                      {"draft_steps", sum.draft_steps},
                      {"mean_accepted_per_cycle", sum.mean_accepted_length()},
                      {"generated_tokens", run.tokens},
                      {"seconds", run.seconds},
                      {"engine_steps", run.steps},
                      {"tokens_per_second", rate},
                      {"decode_tokens_per_second", run.decode_tokens_per_second()},
                      {"identical_to_w4a16", identical},
                      {"exact_logit_ties", tie},
                      {"mismatches", mismatch}});
          if (planner) row["planner"] = qspec_planner_json(sum);
          rows.push_back(row);
        }
  }

  std::printf("model %s, %zu problems, greedy, max %lld tokens, 4-bit weights: %s; KV cache %s; verify w4a16; "
              "engine with staggered arrivals\n",
              args.model_dir.c_str(), problems.size(), static_cast<long long>(args.max_tokens),
              prepared.weights.c_str(), args.kv_cache.c_str());
  for (const auto& b : baselines)
    std::printf("plain w4a16, batch %lld: %lld tokens, %.1f tok/s (prefill included), %.1f decode tok/s a sequence\n",
                static_cast<long long>(b["batch_size"].get<int64_t>()),
                static_cast<long long>(b["generated_tokens"].get<int64_t>()), b["tokens_per_second"].get<double>(),
                b["decode_tokens_per_second"].get<double>());
  std::printf("%5s %-12s %5s %9s %11s %12s %10s %10s %13s %4s %8s\n", "batch", "draft", "gamma", "kv-ovwr",
              "acceptance", "mean acc/cyc", "tok/s", "decode t/s", "== w4a16", "ties", "mismatch");
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  std::printf("greedy QSpec (kv overwrite on) vs W4A16: %lld exact logit ties, %lld mismatches\n",
              static_cast<long long>(ties), static_cast<long long>(mismatches));
  if (!args.out_file.empty()) {
    nlohmann::json report = problems_report(
        args.problems_file, problems.size(), args.max_tokens, args.limit, prepared.weights,
        prepared.modes[0].activations.group_size,
        {{"prompt", args.chat ? "chat template, user: {question}" : "Question: {question}\\nAnswer:"},
         {"stop", "eos"},
         {"arrivals", "1 or 2 new requests per engine step"},
         {"reference", args.reference_file.empty() ? "plain greedy w4a16 through the engine at the first batch size"
                                                   : "plain greedy w4a16 outputs from " + args.reference_file},
         {"device", args.device},
         {"kv_cache", args.kv_cache},
         {"rates",
          "tokens_per_second: generated tokens over the whole run (prefill included); decode_tokens_per_second: each "
          "request's tokens after its first over its first-to-last-token time, summed over requests (prefill and "
          "queueing left out)"}});
    report.update({{"baseline_w4a16", baselines}, {"exact_logit_ties", ties}, {"mismatches", mismatches}, {"results", rows}});
    write_report(args.out_file, "eval_qspec", args.model_dir, report);
  }
  QSPEC_CHECK(mismatches == 0, "eval qspec: ", mismatches, " outputs differ from W4A16 without an exact logit tie");
}

}  // namespace

void register_eval(CLI::App& app) {
  // `qspec eval MODEL ...` (no subcommand) is `qspec eval gsm MODEL ...`: the options of
  // `eval gsm` sit on `eval` too.
  auto alias = std::make_shared<GsmArgs>();
  CLI::App* eval = app.add_subcommand(
      "eval", "Accuracy and perplexity per run mode: eval gsm (exact match), eval ppl (WikiText-2 perplexity)");
  eval->require_subcommand(0, 1);
  eval->add_option("model", alias->model_dir, "Model directory (eval MODEL = eval gsm MODEL)");
  add_gsm_options(eval, *alias);

  auto gsm = std::make_shared<GsmArgs>();
  CLI::App* gsm_command =
      eval->add_subcommand("gsm", "Greedy GSM8K-style strict/flexible exact match and text perplexity, per mode");
  add_model_argument(gsm_command, gsm->model_dir);
  gsm_command->add_option("file", gsm->problems_file,
                          "GSM8K JSON lines: question/answer (default: MODEL/eval_problems.jsonl)");
  add_gsm_options(gsm_command, *gsm);
  gsm_command->callback([gsm] {
    if (gsm->problems_file.empty()) gsm->problems_file = gsm->model_dir + "/eval_problems.jsonl";
    run_gsm(*gsm);
  });

  auto ppl = std::make_shared<PplArgs>();
  CLI::App* ppl_command = eval->add_subcommand("ppl", "Sliding-window perplexity of a text (WikiText-2), per mode");
  add_model_argument(ppl_command, ppl->model_dir);
  ppl_command->add_option("--data", ppl->data_file, "UTF-8 text (default: data/wikitext-2/wiki.test.raw)");
  ppl_command->add_option("--context", ppl->context, "Window length in tokens (0: min(2048, model context))")
      ->capture_default_str();
  ppl_command->add_option("--stride", ppl->stride, "Window step in tokens, < context (0: context / 2)")
      ->capture_default_str();
  ppl_command->add_option("--max-windows", ppl->max_windows, "Stop after W windows per mode (0: all)")
      ->capture_default_str();
  add_common_options(ppl_command, *ppl, "Use only the first N tokens of the data (0: all)");
  ppl_command->callback([ppl] {
    if (ppl->data_file.empty()) ppl->data_file = default_ppl_data();
    run_ppl(*ppl);
  });

  auto qspec_args = std::make_shared<QSpecEvalArgs>();
  CLI::App* qspec_command = eval->add_subcommand(
      "qspec", "QSpec acceptance per draft mode and gamma (greedy, verify w4a16), tokens/s vs plain w4a16");
  add_model_argument(qspec_command, qspec_args->model_dir);
  qspec_command->add_option("file", qspec_args->problems_file,
                            "GSM8K JSON lines: question/answer (default: MODEL/eval_problems.jsonl)");
  qspec_command->add_option("--drafts", qspec_args->drafts, "Drafts: modes (w4a8, w4a4-nvfp4, ...), ngram (prompt lookup), MODE@WINDOW[+SINKS] (a sparse view of the cache: w4a16@256+16), either with /vN (a vocabulary subset: the model's N most frequent ids, qspec tune-draft: w4a8/v8192), then /sN (N skipped layers from the model's skip table, qspec tune-draft: w4a8/s6, w4a16/v8192/s8), then /k4 (the high 4 bits of the 8-bit KV cache, --kv-cache int8: w4a8/k4, w4a16/k4), auto (the planner, gamma up to the largest of --gammas: one run)")->capture_default_str()->delimiter(',');
  qspec_command->add_option("--qspec-costs", qspec_args->qspec_costs,
                            "--drafts auto: the step-cost table (auto: bench/policies' for this device and model; "
                            "none: the planner's fallback; or a file)")
      ->check(CLI::IsMember({"auto", "none"}) | CLI::ExistingFile)
      ->capture_default_str();
  qspec_command->add_option("--gammas", qspec_args->gammas, "Draft lengths")->capture_default_str()->delimiter(',');
  qspec_command->add_option("--batch-sizes", qspec_args->batch_sizes, "Engine batch sizes")
      ->capture_default_str()
      ->delimiter(',');
  qspec_command->add_option("--kv-overwrite", qspec_args->kv_overwrite, "on|off|both (default: both on the CPU, on on the GPU)")
      ->check(CLI::IsMember({"on", "off", "both"}));
  qspec_command->add_option("--device", qspec_args->device,
                            "cpu, or cuda: the engine on the GPU (w4a16 target, drafts beside it; tokens/s of both)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  qspec_command->add_option("--weights", qspec_args->weights, "4-bit weight format, RTN at load (default int4)");
  qspec_command->add_option("--group-size", qspec_args->group_size, "int4 group size (0: auto)")
      ->capture_default_str();
  qspec_command->add_option("--limit", qspec_args->limit, "First N problems (0: all)")->capture_default_str();
  qspec_command->add_option("-n,--max-tokens", qspec_args->max_tokens, "Maximum new tokens (eos stops)")
      ->capture_default_str();
  qspec_command->add_option("--reference", qspec_args->reference_file,
                            "Compare against W4A16 outputs saved by --save-reference (skips the plain runs)");
  qspec_command->add_option("--save-reference", qspec_args->save_reference_file,
                            "Save the plain W4A16 outputs (first batch size) for later --reference runs");
  qspec_command->add_flag("--chat", qspec_args->chat,
                          "Prompt with the model's chat template (one user message: the question)");
  qspec_command->add_option("-o,--out", qspec_args->out_file, "Write the results as JSON here");
  add_kv_cache_option(qspec_command, qspec_args->kv_cache);
  qspec_command->callback([qspec_args] {
    if (qspec_args->problems_file.empty()) qspec_args->problems_file = qspec_args->model_dir + "/eval_problems.jsonl";
    run_qspec_eval(*qspec_args);
  });

  eval->callback([eval, alias] {
    if (!eval->get_subcommands().empty()) {
      QSPEC_CHECK(alias->model_dir.empty(), "eval: MODEL goes after the subcommand (eval gsm MODEL, eval ppl MODEL)");
      return;
    }
    QSPEC_CHECK(!alias->model_dir.empty(), "eval: expected `eval gsm MODEL [FILE]`, `eval ppl MODEL` or `eval MODEL`");
    if (alias->problems_file.empty()) alias->problems_file = alias->model_dir + "/eval_problems.jsonl";
    run_gsm(*alias);
  });
}

}  // namespace qspec::cli
