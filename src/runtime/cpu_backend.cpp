// The engine's CPU backend (runtime/backend.h): LlamaModel::forward_batch in f32, the K/V rows
// in the engine's block pool, every mode the loaded weights allow. It gives logit rows only:
// the scheduler samples and accepts from them on the host.
#include <fstream>
#include <string>
#include <utility>

#include "base/thread_pool.h"
#include "runtime/backend.h"

namespace qspec {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const LlamaModel& model) : model_(model) {}

  void check_mode(const RunMode&, const std::string&) const override {}  // the weights' checks suffice
  bool kv_in_pool() const override { return true; }
  std::string device_name() const override { return cpu_device_name(); }

  PassResult forward(const RunMode& mode, std::span<const PassRun> runs) override {
    chunks_.clear();
    PassResult result;
    int64_t rows = 0;
    for (const PassRun& run : runs) {
      SequenceChunk chunk;
      chunk.tokens = run.tokens;
      chunk.start = run.base;
      chunk.kv = run.kv;
      chunk.logits = run.output == PassRun::Output::all    ? SequenceChunk::Logits::all
                     : run.output == PassRun::Output::last ? SequenceChunk::Logits::last
                                                           : SequenceChunk::Logits::none;
      chunks_.push_back(chunk);
      result.first_row.push_back(rows);
      rows += run.output == PassRun::Output::all ? static_cast<int64_t>(run.tokens.size())
              : run.output == PassRun::Output::last ? 1
                                                    : 0;
    }
    model_.forward_batch(chunks_, logits_, mode);
    return result;
  }

  std::vector<float> logits() override { return std::move(logits_); }

 private:
  const LlamaModel& model_;
  std::vector<SequenceChunk> chunks_;
  std::vector<float> logits_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const LlamaModel& model) { return std::make_unique<CpuBackend>(model); }

std::string cpu_device_name() {
  std::string name = "unknown";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    name = line.substr(line.find_first_not_of(" \t", colon + 1));
    break;
  }
  return "cpu: " + name + ", " + std::to_string(ThreadPool::global().size()) + " threads";
}

}  // namespace qspec
