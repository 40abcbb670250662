// The qspec command. Each subcommand is a small function over the library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>
#include <stdexcept>

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
               "CPU backend: decode 4-bit weights to f32 once at load (faster small-batch decoding, "
               "8x the weight memory; identical outputs)");

  qspec::cli::register_generate(app);
  qspec::cli::register_info(app);
  qspec::cli::register_convert(app);
  qspec::cli::register_bench(app);
  qspec::cli::register_eval(app);
  qspec::cli::register_quantize(app);
  qspec::cli::register_serve(app);
  qspec::cli::register_tune(app);

  app.parse_complete_callback([&] {
    if (threads > 0) qspec::ThreadPool::set_global_threads(threads);
    qspec::cpu::set_f32_weight_cache(f32_weight_cache);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
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
