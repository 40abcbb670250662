#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace qspec {

namespace {
std::unique_ptr<ThreadPool>& global_pool() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
std::mutex global_pool_mutex;
constexpr uint64_t pack_work(uint32_t region, size_t chunk_count) {
  return (static_cast<uint64_t>(region) << 32) | (static_cast<uint64_t>(chunk_count) << 16);
}
size_t default_thread_count() {
  size_t hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : hardware;
}
}  // namespace

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = default_thread_count();
  for (size_t index = 1; index < threads; ++index)
    workers_.emplace_back([this, index] { worker_loop(index); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
    work_.store(pack_work(static_cast<uint32_t>(work_.load() >> 32) + 1, 0), std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(global_pool_mutex);
  auto& pool = global_pool();
  if (!pool) pool = std::make_unique<ThreadPool>(0);
  return *pool;
}

void ThreadPool::set_global_threads(size_t threads) {
  std::lock_guard<std::mutex> lock(global_pool_mutex);
  global_pool() = std::make_unique<ThreadPool>(threads);
}

void ThreadPool::run_chunks(uint32_t region) {
  for (;;) {
    uint64_t work = work_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(work >> 32) != region) return;
    const size_t chunk = work & 0xffff, chunk_count = (work >> 16) & 0xffff;
    if (chunk >= chunk_count) return;
    if (!work_.compare_exchange_weak(work, work + 1, std::memory_order_acq_rel)) continue;
    // The chunk is ours, so its region is not finished and its parameters (written before
    // the region was published) stay as they are until we report it done.
    const size_t begin = chunk * chunk_size_;
    const size_t end = std::min(count_, begin + chunk_size_);
    try {
      (*body_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!first_error_) first_error_ = std::current_exception();
    }
    done_chunks_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop(size_t) {
  uint32_t seen_region = 0;
  auto current_region = [&] { return static_cast<uint32_t>(work_.load(std::memory_order_acquire) >> 32); };
  for (;;) {
    // Spin for a short while (cheap wake-up between back-to-back regions), then sleep.
    auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    while (current_region() == seen_region && std::chrono::steady_clock::now() < spin_until)
      std::this_thread::yield();
    if (current_region() == seen_region) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return current_region() != seen_region; });
    }
    seen_region = current_region();
    if (stopping_.load()) return;
    run_chunks(seen_region);
  }
}

void ThreadPool::parallel_for(size_t count, size_t grain,
                              const std::function<void(size_t, size_t)>& body) {
  if (count == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t threads = size();
  if (threads == 1 || count <= grain) {
    body(0, count);
    return;
  }
  // A few chunks per thread balances uneven work without many atomics (at most 65535: the
  // count has 16 bits in work_).
  size_t chunks = std::min({(count + grain - 1) / grain, threads * 4, size_t{0xffff}});
  body_ = &body;
  count_ = count;
  chunk_size_ = (count + chunks - 1) / chunks;
  chunk_count_ = (count + chunk_size_ - 1) / chunk_size_;
  first_error_ = nullptr;
  done_chunks_.store(0, std::memory_order_relaxed);
  const uint32_t region = static_cast<uint32_t>(work_.load() >> 32) + 1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work_.store(pack_work(region, chunk_count_), std::memory_order_release);
  }
  wake_.notify_all();
  run_chunks(region);
  while (done_chunks_.load(std::memory_order_acquire) != chunk_count_) std::this_thread::yield();
  body_ = nullptr;
  if (first_error_) std::rethrow_exception(first_error_);
}

}  // namespace qspec
