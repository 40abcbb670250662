// Registration of the qspec subcommands (one file each).
#pragma once
#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

namespace qspec::cli {
void register_generate(CLI::App& app);
void register_info(CLI::App& app);
void register_convert(CLI::App& app);
void register_bench(CLI::App& app);
void register_eval(CLI::App& app);

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
