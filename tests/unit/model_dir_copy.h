// A test fixture base: a writable copy of the bundled gsm-synth-llama checkpoint in a fresh
// temporary directory (one per test), with JSON helpers, for tests that break one file of it.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

class ModelDirCopy : public ::testing::Test {
 protected:
  // `tag` names the temporary directory (qspec-TAG-PID-TEST).
  explicit ModelDirCopy(std::string tag) : tag_(std::move(tag)) {}

  void SetUp() override {
    namespace fs = std::filesystem;
    const fs::path source = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";
    dir_ = fs::temp_directory_path() / ("qspec-" + tag_ + "-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const auto& entry : fs::directory_iterator(source)) fs::copy_file(entry.path(), dir_ / entry.path().filename());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  nlohmann::json read_json(const std::string& name) const {
    std::ifstream in(dir_ / name);
    return nlohmann::json::parse(in);
  }
  void write_json(const std::string& name, const nlohmann::json& value) const {
    std::ofstream(dir_ / name) << value.dump(2);
  }

  std::filesystem::path dir_;

 private:
  std::string tag_;
};
