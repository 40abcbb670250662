// The qspec command. Each subcommand is a small function over the library.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "cli/commands.h"
#include "quant/quantized_linear.h"
#include "qspec/error.h"

namespace {

// Prints "qspec: " + `format` (one %s: `what`) on stderr, after what stdout already holds, and
// returns `status`, the exit status of a failed command. No allocation: it also reports
// running out of memory.
int exit_with(int status, const char* format, const char* what) {
  std::fflush(stdout);
  std::fputs("qspec: ", stderr);
  std::fprintf(stderr, format, what);
  std::fputc('\n', stderr);
  return status;
}

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The closest of `names` to `typed`, when it is close enough to be a typo ("" otherwise).
std::string closest(const std::string& typed, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, typed.size() / 3) + 1;
  for (const std::string& name : names)
    if (const size_t d = edit_distance(typed, name); d < best_distance) best = name, best_distance = d;
  if (best.empty())  // a flag cut short: --max-batch for --max-batch-size
    for (const std::string& name : names)
      if (typed.size() >= 4 && name.rfind(typed, 0) == 0) return name;
  return best;
}

// "Did you mean" for a command line CLI11 refused: the subcommand it names (or the closest
// one), then each --flag that neither it nor the top level knows.
std::string suggestion(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) commands.push_back(sub->get_name());
  CLI::App* command = nullptr;
  std::string hint;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') continue;
    if (std::find(commands.begin(), commands.end(), arg) != commands.end()) {
      command = app.get_subcommand(arg);
    } else if (const std::string near = closest(arg, commands); !near.empty()) {
      hint = "did you mean `qspec " + near + "`?";
    }
    break;
  }
  if (!hint.empty() || command == nullptr) return hint.empty() ? "commands: generate, chat, serve, quantize, eval, bench, info, convert, tune" : hint;
  std::vector<std::string> flags;
  for (const CLI::App* scope : {static_cast<const CLI::App*>(&app), static_cast<const CLI::App*>(command)})
    for (const CLI::Option* option : scope->get_options())
      for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
  for (const CLI::App* nested : command->get_subcommands([](CLI::App*) { return true; }))
    for (const CLI::Option* option : nested->get_options())
      for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") continue;
    if (const size_t eq = arg.find('='); eq != std::string::npos) arg.resize(eq);
    if (std::find(flags.begin(), flags.end(), arg) != flags.end()) continue;
    const std::string near = closest(arg, flags);
    hint += (hint.empty() ? "" : "; ") + ("unknown flag " + arg) + (near.empty() ? "" : ": did you mean " + near + "?");
  }
  return hint;
}

}  // namespace

int main(int argc, char** argv) {
  qspec::cli::set_command_line(argc, argv);
  CLI::App app{"qspec: Llama-family inference with 4-bit weights and quantized speculative decoding"};
  app.require_subcommand(1);
  app.fallthrough();  // -t / --cpu-f32-weights also after the subcommand, as llama.cpp users type them
  app.set_version_flag("--version", std::string("qspec ") + QSPEC_VERSION);
  size_t threads = 0;
  app.add_option("-t,--threads", threads, "CPU threads (default: all hardware threads)");
  bool f32_weight_cache = false;
  app.add_flag("--cpu-f32-weights", f32_weight_cache,
               "CPU backend: keep an f32 copy of the 4-bit weights (8x their memory, identical outputs; no "
               "faster since the packed 4-bit kernels: kept for old command lines)");

  qspec::cli::register_generate(app);
  qspec::cli::register_chat(app);
  qspec::cli::register_info(app);
  qspec::cli::register_convert(app);
  qspec::cli::register_bench(app);
  qspec::cli::register_eval(app);
  qspec::cli::register_quantize(app);
  qspec::cli::register_serve(app);
  qspec::cli::register_tune(app);
  qspec::cli::register_tune_draft(app);

  app.parse_complete_callback([&] {
    if (threads > 0) qspec::ThreadPool::set_global_threads(threads);
    qspec::cpu::set_f32_weight_cache(f32_weight_cache);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help, --version
    const std::string hint = suggestion(app, argc, argv);
    std::fflush(stdout);
    std::fprintf(stderr, "qspec: error: %s%s%s\n(qspec --help, or qspec COMMAND --help)\n", error.what(),
                 hint.empty() ? "" : "; ", hint.c_str());
    return error.get_exit_code();
  } catch (const qspec::Error& error) {
    return exit_with(1, "error: %s", error.what());
  } catch (const std::bad_alloc& error) {
    // Loaders name what they were loading (an Error above); this is the last resort.
    return exit_with(1, "error: out of memory (%s)", error.what());
  } catch (const std::length_error& error) {
    return exit_with(1, "error: out of memory: a size too large for this machine (%s)", error.what());
  } catch (const std::exception& error) {
    return exit_with(2, "internal error: %s", error.what());
  }
  return 0;
}
