// Test helpers for checking errors and the qspec command line: what an Error says, and one run of
// the qspec binary (QSPEC_BINARY, set by tests/CMakeLists.txt) with its output and exit code.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "qspec/error.h"

namespace qspec_test {

// What an Error from `action` says ("" when nothing was thrown).
template <typename Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const qspec::Error& e) {
    return e.what();
  }
  return "";
}

// The qspec binary's stdout (and stderr unless stdout_only), and its exit code. The output goes
// through a file named after the process, so parallel test processes never share one.
// shell_prefix runs first in the same shell (a ulimit, say); /bin/sh reports a child killed by
// signal N as exit code 128 + N.
inline std::string run_qspec(const std::string& args, int& exit_code, bool stdout_only = false,
                             const std::string& shell_prefix = "") {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("qspec-cli-run-" + std::to_string(::getpid()));
  const std::string redirect = " >'" + out.string() + (stdout_only ? "' 2>/dev/null" : "' 2>&1");
  const int status = std::system((shell_prefix + std::string(QSPEC_BINARY) + " " + args + redirect).c_str());
  exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  fs::remove(out);
  return text.str();
}

}  // namespace qspec_test
