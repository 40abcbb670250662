// A small fork-join pool for the CPU backend. A forward pass issues dozens of parallel
// regions per token, so workers spin briefly before sleeping: a condition-variable wake per
// region (~10 us) would cost more than the work at decode sizes. The caller claims chunks
// too and waits only for chunks that were claimed, never for a worker that has not woken
// up: on an oversubscribed machine (more runnable threads than cores) waiting for every
// worker cost a scheduler time slice per region, 80x slower decoding.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qspec {

class ThreadPool {
 public:
  // threads = 0: one per hardware thread.
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Splits [0, count) into contiguous chunks of at least `grain` items and runs
  // body(begin, end) on them, the calling thread included. Returns when all are done.
  // Exceptions thrown by body are rethrown here (the first one).
  void parallel_for(size_t count, size_t grain, const std::function<void(size_t, size_t)>& body);

  // The process-wide pool the CPU ops use (sized by set_global_threads or hardware).
  static ThreadPool& global();
  static void set_global_threads(size_t threads);

 private:
  void worker_loop(size_t worker_index);
  // Claims and runs chunks of `region` until none is left (or another region has begun).
  void run_chunks(uint32_t region);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  // One word: region (bits 32..63, bumped per parallel_for), its chunk count (bits 16..31)
  // and the next chunk to claim (bits 0..15). A claim checks all three and takes the chunk
  // in one compare-exchange, so a worker that is late from an earlier region can never take
  // a chunk of a region whose start it did not see (an earlier version kept the count in a
  // plain field, and a late worker could pair an old region with a new count: a hang).
  std::atomic<uint64_t> work_{0};
  std::atomic<size_t> done_chunks_{0};
  std::atomic<bool> stopping_{false};
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t count_ = 0;
  size_t chunk_size_ = 0;
  size_t chunk_count_ = 0;
  std::mutex error_mutex_;
  std::exception_ptr first_error_;
};

}  // namespace qspec
